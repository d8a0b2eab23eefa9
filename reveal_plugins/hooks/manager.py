"""The plugin manager: built-in plugins first, then third parties from entry points."""
from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
from typing import Any, Callable

import pluggy

from .hookspec import PROJECT, PROPAGATING

log = logging.getLogger(__name__)

# Built-in plugins, registered exactly like a site plugin would be.  A module that fails to
# import (an optional dependency missing) is skipped with a debug message.
BUILTIN_PLUGINS = (
    "reveal_plugins.probes.builtin_probes",
    "reveal_plugins.detect.plugin",
    "reveal_plugins.detect.evidence.hints",
    "reveal_plugins.otel.sink",
    "reveal_plugins.slurm.sink",
)

_pm: "IsolatingPluginManager | None" = None


def get_plugin_manager() -> "IsolatingPluginManager":
    """Return the process-wide plugin manager, creating it on first use.

    ``REVEAL_DISABLE_PLUGINS`` (comma-separated plugin names) keeps named plugins out, which
    is how a site turns off a built-in or a broken third-party plugin without uninstalling it.
    """
    global _pm
    if _pm is None:
        pm = IsolatingPluginManager(PROJECT)
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


class IsolatingPluginManager(pluggy.PluginManager):
    """A plugin manager where one plugin's exception never costs the other plugins.

    Callers use ``pm.hook.<name>(...)``, so ``firstresult``, other plugins' hook wrappers and
    pluggy's tracing (``add_hookcall_monitoring``) all run.  Isolation cannot be a hook wrapper:
    pluggy stops calling implementations at the first exception and hands it to the
    wrappers, so every plugin after the failing one would be lost.  Instead each plain
    implementation is guarded as it is registered: an exception is logged with the plugin's
    name and the implementation counts as having returned ``None`` (left out of the results,
    and a ``firstresult`` call goes on to the next plugin).  Wrappers are not guarded: a broken
    wrapper is the site's own tracing code and should be seen; nor are the hooks in
    :data:`~.hookspec.PROPAGATING`, whose errors the caller reports.
    """

    def register(self, plugin: object, name: str | None = None) -> str | None:
        plugin_name = super().register(plugin, name)
        if plugin_name is None:
            return None
        for caller in self.get_hookcallers(plugin) or ():
            if caller.name in PROPAGATING:
                continue
            for impl in caller.get_hookimpls():
                if impl.plugin is plugin and not (impl.wrapper or impl.hookwrapper):
                    impl.function = _isolated(impl.function, plugin_name, caller.name)
        return plugin_name


def _isolated(func: Callable[..., Any], plugin_name: str, hook_name: str) -> Callable[..., Any]:
    @functools.wraps(func)
    def guard(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except Exception as e:
            log.warning("plugin %s failed in %s: %s: %s", plugin_name, hook_name,
                        type(e).__name__, e)
            return None
    return guard


def hook() -> Any:
    """The process-wide manager's hook relay: ``hook().reveal_run_start(run=...)``."""
    return get_plugin_manager().hook


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
