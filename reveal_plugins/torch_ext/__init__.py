"""torchrun integration: ``reveal-torchrun`` (launcher.py), torchelastic event capture
(elastic.py) and opt-in iteration markers (markers.py: ``instrument()`` in the worker)."""
from .markers import instrument, uninstrument

__all__ = ["instrument", "uninstrument"]
