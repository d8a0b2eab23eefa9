"""The node agent: samples every available probe on a drift-free schedule and writes each
registered run's slice of the samples into that run's directory.

One agent per node serves several runs at once (a shared node pays the sampling cost once).
Runs register and unregister over a Unix socket (``<spool>/agent.sock``, one JSON object per
line, see docs/internals.md) or, while the agent is still starting, by dropping a registration
file into ``<spool>/pending/``.  Peer credentials decide who may do what.  Collection never
depends on consumers: a failing probe, sink or disk only costs its own part.
"""
from __future__ import annotations

import argparse
import dataclasses
import fcntl
import logging
import logging.handlers
import os
import select
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import __version__
from ..hooks import call_safely, get_plugin_manager
from ..types import ChannelMeta, RunInfo
from . import pending, protocol, store
from .probe import Probe
from .server import AgentServer

log = logging.getLogger("reveal.agent")

MAX_REQUEST = protocol.MAX_REQUEST


@dataclass(frozen=True)
class RunLimits:
    """What one run's senders may write (docs/protocol.md): beyond these, events are dropped
    and counted (``events_dropped`` in meta.json), never written."""
    event_bytes: int = 64 * 1024          # one event, as stored
    events: int = 100_000                 # events per run
    events_total_bytes: int = 64 << 20    # events.jsonl per run
    steps: int = 1024                     # distinct step ids per run


def _create_run_dir(path: str, uid: int | None, gid: int | None, spool: str) -> str:
    """Create the run directory through the hardened helper (as root: no symlinks followed,
    only inside the spool for other users' runs, readable by the run's user alone)."""
    from .rundir import create_run_dir
    path, spool = os.path.abspath(path), os.path.abspath(spool)
    inside = os.path.commonpath([path, spool]) == spool
    return create_run_dir(path, uid=uid, gid=gid, spool=spool if inside else None)


@dataclass
class RunState:
    run: RunInfo
    writer: store.SegmentWriter
    host_idx: np.ndarray              # columns of the host row this run receives
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


class Agent:
    def __init__(self, spool: str, interval_s: float = 0.1, segment_s: float = 10.0,
                 exit_when_idle: bool = False, idle_grace_s: float = 30.0, live: bool = False,
                 config: dict[str, Any] | None = None):
        if not (0.001 <= interval_s <= 60):
            raise ValueError(f"interval_s={interval_s!r}: must be between 0.001 and 60 seconds")
        self.spool = spool
        self.interval_s = float(interval_s)
        self.segment_s = float(segment_s)
        self.exit_when_idle = exit_when_idle
        self.idle_grace_s = idle_grace_s
        self.live = live
        self.config = dict(config or {}, interval_s=self.interval_s)
        self.host = socket.gethostname().split(".")[0]
        self.uid = os.geteuid()
        self._lock = threading.RLock()
        self._reg_lock = threading.Lock()
        self._stop_lock = threading.Lock()   # one registration at a time: no duplicate RunState
        self.limits = RunLimits()
        self._runs: dict[str, RunState] = {}
        self._stop = threading.Event()
        self._latest: tuple[float, np.ndarray] | None = None
        self._failed_probes: set[str] = set()
        self.ticks = 0
        self.missed_ticks = 0
        self.sample_cpu_s = 0.0
        self._open_probes()

    # -- probes ---------------------------------------------------------------------------
    def _open_probes(self) -> None:
        pm = get_plugin_manager()
        probes: list[Probe] = []
        for batch in call_safely("reveal_register_probes", config=self.config):
            probes.extend(batch)
        self.all_probes = probes
        self.probes: list[Probe] = []
        slices = []
        every = []
        channels: list[ChannelMeta] = []
        for p in probes:
            try:
                p.open()
            except Exception as e:  # a probe must not raise from open(); if it does, skip it
                p.available, p.reason = False, f"open() failed: {type(e).__name__}: {e}"
            if p.available and p.channels:
                slices.append((len(channels), len(channels) + len(p.channels)))
                n = max(1, round((p.interval_s or 0) / self.interval_s))
                every.append(n)
                chans = p.channels
                if n > 1:
                    chans = [dataclasses.replace(c, sample_every_s=n * self.interval_s)
                             for c in chans]
                channels.extend(chans)
                self.probes.append(p)
        self.slices = slices
        self.every = every
        self.channels = channels
        self.channel_names = [c.name for c in channels]
        slow = np.zeros(len(channels), bool)
        for (a, b), n in zip(slices, every):
            slow[a:b] = n > 1
        self._slow_mask = slow if slow.any() else None
        self._held = np.full(len(channels), np.nan)
        self._read_all = True
        del pm

    def probe_table(self) -> list[dict[str, Any]]:
        return [p.describe() for p in self.all_probes]

    def _sample_host(self) -> tuple[np.ndarray, np.ndarray]:
        """Read the probes due on this tick.  Returns ``(row, held)``: ``row`` has NaN for the
        slow probes not read this tick (what is stored), ``held`` repeats their last values
        (what live consumers see)."""
        row = np.full(len(self.channels), np.nan)
        tick = self.ticks
        read_all, self._read_all = self._read_all, False
        for p, (a, b), n in zip(self.probes, self.slices, self.every):
            if n > 1 and tick % n and not read_all:
                continue
            try:
                vals = p.sample()
                if len(vals) != b - a:
                    raise ValueError(f"returned {len(vals)} values for {b - a} channels")
                row[a:b] = vals
            except Exception as e:
                self._probe_failed(p.name, e)
        if self._slow_mask is None:
            return row, row
        held = np.where(self._slow_mask & np.isnan(row), self._held, row)
        self._held = held
        return row, held

    def _probe_failed(self, name: str, e: Exception) -> None:
        if name in self._failed_probes:
            return
        self._failed_probes.add(name)  # logged once; the others go on
        msg = f"{type(e).__name__}: {e}"
        log.warning("probe %s failed (further errors not logged): %s", name, msg)
        with self._lock:
            for st in self._runs.values():
                self._event(st, "probe_error", probe=name, error=msg)

    # -- public accessors (live exporters) -----------------------------------------------
    def latest(self) -> tuple[float, dict[str, float]] | None:
        snap = self._latest
        if snap is None:
            return None
        return snap[0], dict(zip(self.channel_names, snap[1].tolist()))

    def runs(self) -> list[RunInfo]:
        with self._lock:
            return [st.run for st in self._runs.values()]

    # -- run registry ---------------------------------------------------------------------
    def prune_old_jobs(self, now: float | None = None) -> list[str]:
        """Remove ``<spool>/jobs/<job>`` once every run in it ended more than
        ``retention_days`` ago (config, default 30; 0 keeps everything).  ``shutil.rmtree``
        works on directory descriptors here and never follows a planted symlink."""
        import shutil
        days = float(self.config.get("retention_days", 30))
        if days <= 0:
            return []
        cutoff = (time.time() if now is None else now) - days * 86400
        jobs = os.path.join(self.spool, "jobs")
        removed = []
        try:
            names = os.listdir(jobs)
        except OSError:
            return removed
        open_ids = {st.run.job_id for st in self._runs.values()}
        for job in names:
            d = os.path.join(jobs, job)
            if job in open_ids or os.path.islink(d) or not os.path.isdir(d):
                continue
            try:
                ends = [store.read_meta(os.path.join(d, h)).get("end") for h in os.listdir(d)]
            except Exception:
                continue  # unreadable or torn: an operator should look, not the agent delete
            if ends and all(e is not None and e < cutoff for e in ends):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(job)
        if removed:
            log.info("removed %d job directories older than %g days", len(removed), days)
        return removed

    def adopt_open_runs(self) -> list[str]:
        """Resume the runs a dead agent of this spool left open (``<spool>/jobs/<job>/<host>``
        with ``end`` unset): sampling goes on into the same directory, start and steps kept,
        an ``agent_restart`` event marks the gap.  Called once the spool lock is ours, so no
        other agent can be writing them."""
        adopted = []
        jobs = os.path.join(self.spool, "jobs")
        try:
            job_dirs = sorted(os.listdir(jobs))
        except OSError:
            return adopted
        for job in job_dirs:
            try:
                hosts = os.listdir(os.path.join(jobs, job))
            except OSError:
                continue
            for host in hosts:
                d = os.path.join(jobs, job, host)
                try:
                    if os.path.islink(d) or not os.path.isdir(d):
                        continue
                    meta = store.read_meta(d)
                    if meta.get("end") is not None or host != self.host and \
                            meta.get("host") not in (None, self.host):
                        continue
                    run = RunInfo.from_dict(meta["run"])
                    run.run_dir = d
                    with self._reg_lock:
                        if run.run_id in self._runs:
                            continue
                        self._register(run, None, previous=meta)
                    adopted.append(run.run_id)
                except Exception as e:
                    log.warning("open run in %s not adopted: %s: %s", d, type(e).__name__, e)
        if adopted:
            log.warning("adopted %d run(s) a previous agent left open: %s", len(adopted),
                        ", ".join(adopted[:10]))
        return adopted

    def register(self, run: RunInfo, owner_pid: int | None = None) -> str:
        """Start recording ``run``; idempotent per run id.  With ``owner_pid`` the run is closed
        by the agent itself when that process dies (a ``reveal record`` killed with SIGKILL)."""
        if not run.run_id or "/" in run.run_id or run.run_id.startswith("."):
            raise ValueError(f"run_id {run.run_id!r}: must be a non-empty name without '/'")
        # The whole registration under one lock: a socket registration racing the SPANK
        # plugin's queued copy of the same run must find the first one, not make a second.
        with self._reg_lock:
            with self._lock:
                if run.run_id in self._runs:
                    return self._runs[run.run_id].run.run_dir
            return self._register(run, owner_pid)

    def _register(self, run: RunInfo, owner_pid: int | None,
                  previous: dict[str, Any] | None = None) -> str:
        run.host = run.host or self.host
        run_dir = _create_run_dir(run.run_dir, run.uid, run.gid, self.spool)
        run.run_dir = run_dir
        idx = [i for i, c in enumerate(self.channels) if self._wanted(c, run)]
        rprobes: list[Probe] = []
        owner_fd = None
        try:
            for batch in call_safely("reveal_register_run_probes", run=run, config=self.config):
                for p in batch:
                    try:
                        p.open()
                    except Exception as e:
                        p.available, p.reason = False, f"open() failed: {e}"
                    if p.available:
                        rprobes.append(p)
            if owner_pid:
                owner_fd = os.pidfd_open(owner_pid)
            channels = [self.channels[i] for i in idx] + [c for p in rprobes for c in p.channels]
            now = time.time()
            meta = {
                "schema": store.META_SCHEMA, "run": run.to_dict(), "host": run.host,
                "interval_s": self.interval_s, "segment_s": self.segment_s,
                "probes": self.probe_table() + [p.describe() for p in rprobes],
                "channels": [c.to_dict() for c in channels], "start": now, "end": None,
                "exit_code": None, "steps": [],
                "agent": {"pid": os.getpid(), "version": __version__, "uid": self.uid},
            }
            if self.config.get("cpus"):   # the node's CPU set (cpuset.py): what cpu.all.* sums
                meta["cpus"] = list(self.config["cpus"])
            if previous is not None:  # adopted: the run started with the dead agent
                meta.update(start=previous.get("start", now), steps=previous.get("steps", []),
                            restarts=int(previous.get("restarts", 0)) + 1)
            store.write_meta(run_dir, meta)
            writer = store.SegmentWriter(run_dir, channels, self.segment_s, file_mode=0o640)
        except BaseException:
            for p in rprobes:  # nothing opened for a run that never starts stays open
                p.close()
            if owner_fd is not None:
                os.close(owner_fd)
            raise
        st = RunState(run, writer, np.array(idx, dtype=np.intp), rprobes, channels, meta,
                      meta["start"], owner_fd=owner_fd)
        if previous is not None:  # the open steps are in the events the dead agent wrote
            for e in store.read_events(run_dir):
                sid = str(e.get("step_id"))
                if e.get("event") == "step_start":
                    st.steps[sid] = {"step_id": sid, "start": e.get("t"), "end": None,
                                     "exit_code": None}
                elif e.get("event") == "step_end" and sid in st.steps:
                    st.steps[sid].update(end=e.get("t"), exit_code=e.get("exit_code"))
        if self.live or run.extra.get("live"):
            st.live = self._make_live(channels)
        if previous is not None:
            self._event(st, "agent_restart", previous_pid=(previous.get("agent") or {}).get("pid"))
        else:
            self._event(st, "run_start", run_id=run.run_id, source=run.source)
        with self._lock:
            # Runs sharing the node learn of each other (ids only): a finding of foreign load
            # can then say "another registered run" rather than "a process in no run".
            for other in self._runs.values():
                self._event(other, "neighbour_start", run_id=run.run_id, job_id=run.job_id)
                self._event(st, "neighbour_start", run_id=other.run.run_id,
                            job_id=other.run.job_id)
            self._runs[run.run_id] = st
            self._read_all = True  # a new run starts with every channel read
        call_safely("reveal_run_start", run=run)
        return run_dir

    @staticmethod
    def _wanted(c: ChannelMeta, run: RunInfo) -> bool:
        if run.gpus is not None and c.name.startswith("gpu."):
            idx = c.name.split(".")[1]
            return idx.isdigit() and int(idx) in run.gpus
        return True

    def _make_live(self, channels: list[ChannelMeta]):
        try:
            from ..detect.live import LiveAnalyzer
        except ImportError as e:
            log.warning("live mode unavailable: %s", e)
            return None
        try:
            return LiveAnalyzer(channels, self.interval_s, self.config)
        except Exception as e:
            log.warning("live mode unavailable: %s: %s", type(e).__name__, e)
            return None

    def _event(self, st: RunState, event: str, t: float | None = None, **fields: Any) -> None:
        try:
            rec = store.append_event(st.run.run_dir, event, t, **fields)
        except OSError as e:
            self._write_failed(st, f"events.jsonl: {e}")
            return
        if event == "step_start":
            sid = str(fields.get("step_id"))
            st.steps[sid] = {"step_id": sid, "start": rec["t"], "end": None, "exit_code": None}
        elif event == "step_end":
            sid = str(fields.get("step_id"))
            s = st.steps.setdefault(sid, {"step_id": sid, "start": st.start, "end": None,
                                          "exit_code": None})
            s["end"], s["exit_code"] = rec["t"], fields.get("exit_code")
        if event == "pids" and isinstance(fields.get("pids"), list):
            for p in st.probes:
                if hasattr(p, "add_pids"):
                    try:
                        p.add_pids([x for x in fields["pids"] if isinstance(x, int)])
                    except Exception as e:
                        self._probe_failed(p.name, e)
        if event in ("step_start", "step_end"):
            call_safely("reveal_" + event, run=st.run, step_id=str(fields.get("step_id")),
                        t=rec["t"], **({"exit_code": fields.get("exit_code")}
                                       if event == "step_end" else {}))

    def _write_failed(self, st: RunState, msg: str) -> None:
        if st.write_error is None:
            st.write_error = msg
            log.error("run %s: cannot write telemetry to %s: %s (sampling goes on)",
                      st.run.run_id, st.run.run_dir, msg)

    def event(self, run_id: str, event: str, t: float | None = None, **fields: Any) -> bool:
        """A sender's event, within the run's limits; False when it was dropped."""
        with self._lock:
            st = self._runs.get(run_id)
            if st is None:
                raise KeyError(f"run_id {run_id!r} is not registered")
            size = len(protocol.encode(fields)) + len(event) + 32
            lim = self.limits
            new_step = event in ("step_start", "step_end") and \
                str(fields.get("step_id")) not in st.steps
            why = ("event larger than %d bytes" % lim.event_bytes if size > lim.event_bytes
                   else "more than %d events" % lim.events if st.events_written >= lim.events
                   else "events.jsonl over %d bytes" % lim.events_total_bytes
                   if st.events_bytes + size > lim.events_total_bytes
                   else "more than %d steps" % lim.steps if new_step and len(st.steps) >= lim.steps
                   else None)
            if why:
                if not st.events_dropped:
                    log.warning("run %s: dropping events (%s); counted in meta.json",
                                run_id, why)
                st.events_dropped += 1
                return False
            st.events_written += 1
            st.events_bytes += size
            self._event(st, event, t, **fields)
            return True

    def unregister(self, run_id: str, exit_code: int | None = None) -> str:
        with self._lock:
            st = self._runs.pop(run_id, None)
            for other in (self._runs.values() if st is not None else ()):
                self._event(other, "neighbour_end", run_id=run_id, job_id=st.run.job_id)
        if st is None:
            raise KeyError(f"run_id {run_id!r} is not registered")
        self._finish(st, exit_code)
        return st.run.run_dir

    def _finish(self, st: RunState, exit_code: int | None) -> None:
        try:
            st.writer.flush()
        except Exception as e:
            self._write_failed(st, f"segment: {e}")
        now = time.time()
        for s in st.steps.values():
            if s["end"] is None:
                s["end"] = now
        self._event(st, "run_end", exit_code=exit_code)
        # run probes say at the end how they measured (a job's cgroup appears after start)
        st.meta["probes"] = self.probe_table() + [p.describe() for p in st.probes]
        st.meta.update(end=now, exit_code=exit_code, steps=list(st.steps.values()),
                       samples=st.writer.samples_written, bytes_stored=st.writer.bytes_written,
                       write_error=st.write_error, live_findings=st.live_findings,
                       events_dropped=st.events_dropped)
        try:
            store.write_meta(st.run.run_dir, st.meta)
        except OSError as e:
            self._write_failed(st, f"meta.json: {e}")
        for p in st.probes:
            p.close()
        if st.owner_fd is not None:
            os.close(st.owner_fd)
            st.owner_fd = None
        call_safely("reveal_run_end", run=st.run, exit_code=exit_code)

    # -- sampling loop --------------------------------------------------------------------
    def sample_once(self) -> None:
        c0 = time.thread_time()
        t, mono = time.time(), time.monotonic()  # wall clock labels, monotonic schedules
        row, held = self._sample_host()
        self._latest = (t, held)
        with self._lock:
            for st in self._runs.values():
                extra = []
                for p in st.probes:
                    try:
                        vals = p.sample()
                        if len(vals) != len(p.channels):
                            raise ValueError(f"returned {len(vals)} values for "
                                             f"{len(p.channels)} channels")
                        extra.extend(vals)
                    except Exception as e:
                        self._probe_failed(p.name, e)
                        extra.extend([np.nan] * len(p.channels))
                rrow = row[st.host_idx]
                if extra:
                    rrow = np.concatenate([rrow, np.asarray(extra, dtype=float)])
                try:
                    st.writer.add(t, rrow, mono)
                except Exception as e:  # disk full, directory removed: keep sampling
                    self._write_failed(st, f"segment: {type(e).__name__}: {e}")
                if st.live is not None:
                    lrow = held[st.host_idx]
                    if extra:
                        lrow = np.concatenate([lrow, rrow[len(st.host_idx):]])
                    st.live_t.append(t)
                    st.live_rows.append(lrow)
        self.ticks += 1
        self.sample_cpu_s += time.thread_time() - c0

    def _sampling_loop(self) -> None:
        t0 = time.monotonic()
        k = 0
        while not self._stop.is_set():
            k += 1
            target = t0 + k * self.interval_s
            delay = target - time.monotonic()
            if delay < 0:  # fell behind (suspended, overloaded): skip the missed ticks
                missed = int(-delay // self.interval_s) + 1
                self.missed_ticks += missed - 1 if missed > 1 else 0
                k += missed - 1
                target = t0 + k * self.interval_s
                delay = max(0.0, target - time.monotonic())
            # time.sleep is one syscall; Event.wait with a timeout costs several times more
            # per tick, which matters at 10 Hz.  Stop latency stays below one interval.
            time.sleep(delay)
            if self._stop.is_set():
                break
            try:
                self.sample_once()
            except Exception as e:  # never let the loop die
                log.exception("sampling failed: %s", e)

    def _live_loop(self, every_s: float = 2.0) -> None:
        while not self._stop.wait(every_s):
            with self._lock:
                work = []
                for st in self._runs.values():
                    if st.live is not None and st.live_t:
                        work.append((st, np.asarray(st.live_t), np.vstack(st.live_rows)))
                        st.live_t, st.live_rows = [], []
            for st, t, rows in work:
                try:
                    findings = st.live.update(t, rows) or []
                except Exception as e:
                    log.warning("live analysis of %s failed: %s: %s", st.run.run_id,
                                type(e).__name__, e)
                    st.live = None
                    continue
                for a in findings:
                    st.live_findings += 1
                    with self._lock:
                        self._event(st, "live_finding", anomaly=a)
                    call_safely("reveal_live_finding", run=st.run, anomaly=a)

    def _pending_loop(self) -> None:
        pend = os.path.join(self.spool, "pending")
        while not self._stop.is_set():
            self.take_pending(pend)
            try:
                self._reap_owners()
                if time.monotonic() >= self._next_prune:
                    self._next_prune = time.monotonic() + 3600
                    self.prune_old_jobs()
            except Exception as e:
                log.warning("housekeeping failed: %s: %s", type(e).__name__, e)
            if self._stop.wait(0.5):
                break
            if self.exit_when_idle and not self._runs and \
                    time.monotonic() - self._idle_since > self.idle_grace_s:
                log.info("no runs left; exiting")
                self._stop.set()
            if self._runs:
                self._idle_since = time.monotonic()

    def take_pending(self, pend: str) -> None:
        """Register runs queued as files while the socket was not up (root/own-uid files only).

        A registration whose unregister is queued too (the job ended while no agent ran) is
        finalized at once, so the Epilog's analysis finds a closed run and no sampling starts
        for a job that is gone."""
        reqs = pending.take(pend, (0, self.uid))
        ended = {r.get("run_id") for _, r in reqs if r.get("op") == "unregister"}
        for path, req in reqs:
            try:
                op = req.get("op", "register")
                if op == "register":
                    run = RunInfo.from_dict(req["run"])
                    if self._already_closed(run):
                        log.info("pending registration %s: run %s was closed while no agent "
                                 "ran (its job ended); not reopened", path, run.run_id)
                        continue
                    self.register(run)
                    if run.run_id in ended:
                        self.event(run.run_id, "registered_after_end", source="pending")
                elif op == "unregister":
                    self.unregister(req["run_id"], req.get("exit_code"))
                elif op == "event":
                    self.event(req.pop("run_id"), req.pop("event"), req.pop("t", None),
                               **{k: v for k, v in req.items() if k not in ("op", "v")})
            except Exception as e:
                log.warning("pending request %s ignored: %s: %s", path, type(e).__name__, e)

    @staticmethod
    def _already_closed(run: RunInfo) -> bool:
        """The run directory holds a finished run (the Epilog finalized it from disk)."""
        if not run.run_dir:
            return False
        try:
            return store.read_meta(run.run_dir).get("end") is not None
        except Exception:  # absent or unreadable: nothing to protect
            return False

    def _reap_owners(self) -> None:
        """Close runs whose owning process died (pidfd readable = the process exited)."""
        with self._lock:
            watched = [(st.run.run_id, st.owner_fd) for st in self._runs.values()
                       if st.owner_fd is not None]
        if not watched:
            return
        ready, _, _ = select.select([fd for _, fd in watched], [], [], 0)
        for run_id, fd in watched:
            if fd in ready:
                log.warning("run %s: its owner process died without closing it; closing it",
                            run_id)
                try:
                    with self._lock:
                        st = self._runs.get(run_id)
                        if st is not None:
                            self._event(st, "owner_gone")
                    self.unregister(run_id, None)
                except KeyError:
                    pass

    # -- socket server --------------------------------------------------------------------
    def privileged(self, uid: int) -> bool:
        return uid in (0, self.uid)

    def handle(self, req: dict[str, Any], peer_uid: int, peer_pid: int = 0) -> dict[str, Any]:
        op = req.get("op")
        privileged = self.privileged(peer_uid)
        if op == "ping":
            return {"ok": True, "pid": os.getpid(), "interval_s": self.interval_s,
                    "uid": self.uid, "host": self.host, "version": __version__,
                    "protocol": protocol.VERSION}
        if op == "status":
            with self._lock:
                runs = [st.run.to_dict() for st in self._runs.values()
                        if privileged or st.run.uid == peer_uid]
            out = {"ok": True, "runs": runs, "probes": self.probe_table(),
                   "ticks": self.ticks, "missed_ticks": self.missed_ticks,
                   "sample_cpu_s": self.sample_cpu_s}
            if privileged and getattr(self, "_server", None) is not None:
                out["server"] = dict(self._server.stats, connections=len(self._server._conns))
            return out
        if op == "register":
            if not privileged:
                return {"ok": False, "error": f"uid {peer_uid} may not register runs with an "
                                              f"agent of uid {self.uid}"}
            run = RunInfo.from_dict(req.get("run") or {})
            owner = peer_pid if req.get("watch") is True and peer_pid > 0 else None
            return {"ok": True, "run_dir": self.register(run, owner_pid=owner)}
        if op in ("event", "unregister"):
            run_id = req.get("run_id")
            with self._lock:
                st = self._runs.get(run_id)
            if st is None:
                return {"ok": False, "error": f"run_id {str(run_id)[:80]!r} is not registered"}
            if not privileged and st.run.uid != peer_uid:
                return {"ok": False, "error": f"uid {peer_uid} may not act on run {run_id!r}"}
            if op == "unregister":
                if not privileged:
                    return {"ok": False, "error": "only root or the agent's user may unregister"}
                err = st.write_error
                run_dir = self.unregister(run_id, req.get("exit_code"))
                return {"ok": True, "run_dir": run_dir, "write_error": st.write_error or err}
            event = req.get("event")
            if not isinstance(event, str) or not event or len(event) > 64 or \
                    event in ("run_start", "run_end", "owner_gone"):
                return {"ok": False, "error": f"event {str(event)[:80]!r}: not a valid event name"}
            fields = {k: v for k, v in req.items() if k not in ("op", "run_id", "event", "t", "v")}
            t = req.get("t")
            if t is not None and (not isinstance(t, (int, float)) or isinstance(t, bool)):
                return {"ok": False, "error": f"t={str(t)[:40]!r}: must be a number (seconds)"}
            if not self.event(run_id, event, t, **fields):
                return {"ok": False, "error": f"run {run_id!r}: event dropped, over the run's "
                                              "limits (docs/protocol.md)"}
            return {"ok": True}
        if op == "shutdown":
            if not privileged:
                return {"ok": False, "error": "only root or the agent's user may shut it down"}
            # A non-daemon thread: the interpreter waits for it, so the runs are finished
            # (last segment, run_end, meta.json) even when the process is exiting.
            threading.Thread(target=self._stop_soon, name="reveal-shutdown").start()
            return {"ok": True}
        return {"ok": False, "error": f"unknown op {str(op)[:40]!r}"}

    def _stop_soon(self) -> None:
        time.sleep(0.2)  # let the reply go out first
        self.stop()

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Start serving; raises RuntimeError when another agent already serves this spool.

        One agent per spool is enforced by an exclusive lock on ``<spool>/agent.lock``, held
        for the agent's life, not by trying the socket: a busy agent (full backlog) must not
        be taken for a dead one and have its socket unlinked by a second agent."""
        os.makedirs(self.spool, mode=0o755, exist_ok=True)
        self.sock_path = os.path.join(self.spool, "agent.sock")
        lock = os.open(os.path.join(self.spool, "agent.lock"),
                       os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            other = os.read(lock, 32).decode(errors="replace").strip() or "?"
            os.close(lock)
            raise RuntimeError(f"another agent (pid {other}) already serves {self.spool}; "
                               "not starting a second one") from None
        os.ftruncate(lock, 0)
        os.pwrite(lock, str(os.getpid()).encode(), 0)
        self._lock_fd = lock
        try:
            os.unlink(self.sock_path)  # the lock is ours: any socket here is a dead agent's
        except FileNotFoundError:
            pass
        pending.prepare_dir(os.path.join(self.spool, "pending"), self.uid)
        self.adopt_open_runs()
        gid = self.config.get("socket_gid")
        # Root agents accept any local user unless a group is named: job users send events
        # (iteration markers, steps); peer credentials decide per request.
        mode = (0o660 if gid is not None else 0o666) if self.uid == 0 else 0o600
        self._server = AgentServer(self.sock_path, self.handle, self.privileged, mode=mode,
                                   gid=gid)
        self._idle_since = self._next_prune = time.monotonic()
        self._threads = [threading.Thread(target=self._server.serve_forever,
                                          name="reveal-socket", daemon=True),
                         threading.Thread(target=self._sampling_loop, name="reveal-sampler",
                                          daemon=True),
                         threading.Thread(target=self._pending_loop, name="reveal-pending",
                                          daemon=True),
                         threading.Thread(target=self._live_loop, name="reveal-live",
                                          daemon=True)]
        for th in self._threads:
            th.start()
        call_safely("reveal_agent_started", agent=self)

    def stop(self) -> None:
        with self._stop_lock:  # a second caller waits until the runs are finished
            if getattr(self, "_stopped", False):
                return
            self._stopped = True
            self._stop.set()
            self._stop_now()

    def _stop_now(self) -> None:
        call_safely("reveal_agent_stopping", agent=self)
        with self._lock:
            states = list(self._runs.values())
            self._runs.clear()
        for st in states:  # finalize what is open: an agent stop must not lose data
            self._finish(st, None)
        srv = getattr(self, "_server", None)
        if srv is not None:
            srv.shutdown()
            try:
                os.unlink(self.sock_path)
            except OSError:
                pass
        if getattr(self, "_lock_fd", None) is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        for p in self.probes:
            p.close()

    def wait(self) -> None:
        while not self._stop.wait(0.5):
            pass
        self.stop()


def main(argv: list[str] | None = None) -> int:
    from ..spool import spool_root
    ap = argparse.ArgumentParser(prog="reveal agent", description="Run the node agent.")
    ap.add_argument("--spool", default=None, help="spool directory (default $REVEAL_SPOOL or "
                    "/var/spool/reveal)")
    ap.add_argument("--interval", type=float, default=0.1, help="sampling interval, seconds")
    ap.add_argument("--segment", type=float, default=10.0, help="segment length, seconds")
    ap.add_argument("--exit-when-idle", action="store_true",
                    help="exit once no run has been registered for --idle-grace seconds")
    ap.add_argument("--idle-grace", type=float, default=30.0)
    ap.add_argument("--live", action="store_true",
                    default=os.environ.get("REVEAL_LIVE", "").lower() in ("1", "true", "yes"),
                    help="run live detection for every run (default: on when $REVEAL_LIVE=1, "
                    "so private agents of reveal record / reveal-torchrun can be made live)")
    ap.add_argument("--log-level", default="INFO")
    ap.add_argument("--log-file", default=None,
                    help="log here, rotated at 10 MiB (3 files kept), instead of to stderr")
    ap.add_argument("--retention-days", type=float, default=30.0,
                    help="remove <spool>/jobs/<job> this long after its runs ended (0: never)")
    ap.add_argument("--cpus", default=os.environ.get("REVEAL_CPUS") or None,
                    help="the node's CPU set, e.g. 0-3,8 (default $REVEAL_CPUS, else all "
                    "online cores): per-core probes read only these, cpu.all.* is their sum")
    ap.add_argument("--socket-group", default=None,
                    help="root agent: only this group (and root) may connect (socket 0660)")
    args = ap.parse_args(argv)
    fmt = "%(asctime)s reveal-agent[%(process)d] %(levelname)s %(message)s"
    if args.log_file:
        h = logging.handlers.RotatingFileHandler(args.log_file, maxBytes=10 << 20,
                                                 backupCount=2)
        h.setFormatter(logging.Formatter(fmt))
        logging.basicConfig(level=args.log_level.upper(), handlers=[h])
    else:
        logging.basicConfig(level=args.log_level.upper(), format=fmt)
    if not (0 <= args.retention_days < 1e5):
        ap.error(f"--retention-days {args.retention_days}: must be between 0 and 100000")
    config: dict[str, Any] = {"retention_days": args.retention_days}
    if args.socket_group is not None:
        import grp
        try:
            config["socket_gid"] = grp.getgrnam(args.socket_group).gr_gid
        except KeyError:
            ap.error(f"--socket-group {args.socket_group!r}: no such group")
    if args.cpus:
        from .cpuset import resolve
        try:
            config["cpus"] = resolve(args.cpus, "--cpus")
        except ValueError as e:
            ap.error(str(e))
    if not (0.001 <= args.interval <= 60):
        ap.error(f"--interval {args.interval}: must be between 0.001 and 60 seconds")
    if not (1 <= args.segment <= 10):
        ap.error(f"--segment {args.segment}: must be between 1 and 10 seconds")
    agent = Agent(args.spool or spool_root(), args.interval, args.segment,
                  exit_when_idle=args.exit_when_idle, idle_grace_s=args.idle_grace,
                  live=args.live, config=config)
    signal.signal(signal.SIGTERM, lambda *a: agent._stop.set())
    signal.signal(signal.SIGINT, lambda *a: agent._stop.set())
    try:
        agent.start()
    except RuntimeError as e:
        log.error("%s", e)
        return 3
    log.info("sampling %d channels from %d probes every %.3f s; socket %s",
             len(agent.channels), len(agent.probes), agent.interval_s, agent.sock_path)
    agent.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
