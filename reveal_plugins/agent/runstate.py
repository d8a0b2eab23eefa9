"""What the agent keeps per registered run, and the limits on what its senders may write."""
from __future__ import annotations

import operator
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..types import ChannelMeta, RunInfo
from ..store import store
from ..probes.probe import Probe


@dataclass(frozen=True)
class RunLimits:
    """What one run's senders may write (docs/protocol.md): beyond these, events are dropped
    and counted (``events_dropped`` in meta.json), never written."""
    event_bytes: int = 64 * 1024          # one event, as stored
    events: int = 100_000                 # events per run
    events_total_bytes: int = 64 << 20    # events.jsonl per run
    steps: int = 1024                     # distinct step ids per run
    step_id_chars: int = 128              # one step id (meta.json keeps every step)


def create_run_dir(path: str, uid: int | None, gid: int | None, spool: str) -> str:
    """Create the run directory through the hardened helper (as root: no symlinks followed,
    only inside the spool for other users' runs, readable by the run's user alone)."""
    from ..store.rundir import create_run_dir
    path, spool = os.path.abspath(path), os.path.abspath(spool)
    inside = os.path.commonpath([path, spool]) == spool
    return create_run_dir(path, uid=uid, gid=gid, spool=spool if inside else None)


def host_picker(idx: list[int], n: int) -> Callable[[list[float]], Sequence[float]] | None:
    """What picks columns ``idx`` out of an ``n``-channel host row (None: all of them, in
    order, which is the common case of one run per agent)."""
    if list(idx) == list(range(n)):
        return None
    if len(idx) > 1:
        return operator.itemgetter(*idx)
    return lambda row, i=tuple(idx): [row[j] for j in i]


@dataclass
class RunState:
    run: RunInfo
    writer: store.SegmentWriter
    # the columns of the host row (a list) this run receives; None: the whole row, as is
    host_pick: Callable[[list[float]], Sequence[float]] | None
    probes: list[Probe]               # run-scoped probes (cgroup, ...)
    channels: list[ChannelMeta]
    meta: dict[str, Any]
    start: float
    steps: dict[str, dict[str, Any]] = field(default_factory=dict)
    write_error: str | None = None
    live: Any = None
    live_t: list[float] = field(default_factory=list)
    live_rows: list[np.ndarray] = field(default_factory=list)
    live_findings: int = 0
    events_written: int = 0
    events_bytes: int = 0
    events_dropped: int = 0
    owner_fd: int | None = None           # pidfd of the process whose death closes the run
    # rows start at the first tick that read every probe: a run registered while a tick was
    # being sampled would otherwise begin with NaN in its slow channels
    awaiting_full_read: bool = True
