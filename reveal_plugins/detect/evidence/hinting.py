"""Collect the hints of one anomaly from every ``reveal_hints`` rule (built-in or a site's)."""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)

_SEV = {"critical": 0, "warning": 1, "info": 2}


def hints_for(anomaly: dict, context: dict) -> list[dict]:
    """Ask every ``reveal_hints`` implementation; drop fallbacks when a specific rule fired;
    the rule about the anomaly's own subsystem first, then by severity."""
    try:
        from ...hooks.manager import hook

        res = hook().reveal_hints(anomaly=anomaly, context=context)
    except Exception as e:
        log.warning("hint plugins unavailable: %s", e)
        res = []
    hints, seen = [], set()
    for lst in res:
        for h in lst or []:
            if not isinstance(h, dict) or not {"title", "action", "severity"} <= set(h):
                continue
            if h["severity"] not in _SEV or h["title"] in seen:
                continue
            seen.add(h["title"])
            hints.append(h)
    specific = [h for h in hints if not h.get("fallback")]
    hints = specific or hints
    sub = anomaly.get("subsystem")
    hints.sort(key=lambda h: (h.get("subsystem", sub) != sub, _SEV[h["severity"]]))
    return hints
