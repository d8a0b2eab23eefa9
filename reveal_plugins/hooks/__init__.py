"""Hook specifications and the plugin manager (see :mod:`.hookspec`)."""
from .hookspec import hookimpl, hookspec, PROJECT
from .manager import get_plugin_manager, reset_plugin_manager, hook

__all__ = ["hookimpl", "hookspec", "PROJECT", "get_plugin_manager", "reset_plugin_manager",
           "hook"]
