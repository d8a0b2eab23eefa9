"""The plugin manager: built-in plugins first, then third parties from entry points."""
from __future__ import annotations

import importlib
import logging
import os
from typing import Any

import pluggy

import sys

from .hookspec import PROJECT

log = logging.getLogger(__name__)

# Built-in plugins, registered exactly like a site plugin would be.  A module that fails to
# import (an optional dependency missing) is skipped with a debug message.
BUILTIN_PLUGINS = (
    "reveal_plugins.probes.builtin_probes",
    "reveal_plugins.detect.plugin",
    "reveal_plugins.detect.hints",
    "reveal_plugins.otel.sink",
    "reveal_plugins.slurm.sink",
)

_pm: pluggy.PluginManager | None = None


def get_plugin_manager() -> pluggy.PluginManager:
    """Return the process-wide plugin manager, creating it on first use.

    ``REVEAL_DISABLE_PLUGINS`` (comma-separated plugin names) keeps named plugins out, which
    is how a site turns off a built-in or a broken third-party plugin without uninstalling it.
    """
    global _pm
    if _pm is None:
        pm = pluggy.PluginManager(PROJECT)
        # The package re-exports the ``hookspec`` marker under the module's name, so take the
        # module itself from sys.modules.
        pm.add_hookspecs(sys.modules["reveal_plugins.hooks.hookspec"])
        disabled = {s.strip() for s in os.environ.get("REVEAL_DISABLE_PLUGINS", "").split(",")
                    if s.strip()}
        for name in BUILTIN_PLUGINS:
            if name in disabled:
                continue
            try:
                mod = importlib.import_module(name)
            except ImportError as e:
                log.debug("built-in plugin %s not loaded: %s", name, e)
                continue
            pm.register(mod, name=name)
        for name in disabled:
            pm.set_blocked(name)
        _load_entry_points(pm)
        _pm = pm
    return _pm


def reset_plugin_manager() -> None:
    """Forget the manager (tests, or after installing a plugin in-process)."""
    global _pm
    _pm = None


def call_safely(hook_name: str, **kwargs: Any) -> list[Any]:
    """Call every implementation of a hook, isolating failures (logged, then skipped).

    Used for lifecycle and sink hooks, where one plugin's bug must never cost the others.
    """
    pm = get_plugin_manager()
    results = []
    for impl in reversed(getattr(pm.hook, hook_name).get_hookimpls()):
        argnames = impl.argnames
        try:
            r = impl.function(*[kwargs[a] for a in argnames])
        except Exception as e:
            log.warning("plugin %s failed in %s: %s: %s", impl.plugin_name, hook_name,
                        type(e).__name__, e)
            continue
        if r is not None:
            results.append(r)
    return results


def _load_entry_points(pm: pluggy.PluginManager) -> None:
    """Third-party plugins from entry points; as root, only those whose code is root-owned
    and writable by no one else (:mod:`reveal_plugins.trust`), each failure logged alone."""
    from importlib.metadata import entry_points

    from ..trust import require_trusted_module
    try:
        eps = list(entry_points(group=PROJECT))
    except Exception as e:  # a broken distribution's metadata must not break recording
        log.warning("could not list third-party plugins (entry points %r): %s", PROJECT, e)
        return
    for ep in eps:
        if pm.is_blocked(ep.name) or pm.has_plugin(ep.name):
            continue
        try:
            require_trusted_module(ep.module, f"plugin {ep.name!r}")
            pm.register(ep.load(), name=ep.name)
        except Exception as e:  # a broken third-party plugin must not break recording
            log.warning("third-party plugin %r (%s) not loaded: %s: %s", ep.name, ep.value,
                        type(e).__name__, e)
