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
import json
import logging
import os
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import __version__
from ..hooks import call_safely, get_plugin_manager
from ..types import ChannelMeta, RunInfo
from . import store
from .probe import Probe

log = logging.getLogger("reveal.agent")

MAX_REQUEST = 1 << 20


def _peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


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
    def register(self, run: RunInfo) -> str:
        if not run.run_id or "/" in run.run_id or run.run_id.startswith("."):
            raise ValueError(f"run_id {run.run_id!r}: must be a non-empty name without '/'")
        with self._lock:
            if run.run_id in self._runs:
                return self._runs[run.run_id].run.run_dir
        run.host = run.host or self.host
        run_dir = _create_run_dir(run.run_dir, run.uid, run.gid, self.spool)
        run.run_dir = run_dir
        idx = [i for i, c in enumerate(self.channels) if self._wanted(c, run)]
        rprobes: list[Probe] = []
        for batch in call_safely("reveal_register_run_probes", run=run, config=self.config):
            for p in batch:
                try:
                    p.open()
                except Exception as e:
                    p.available, p.reason = False, f"open() failed: {e}"
                if p.available:
                    rprobes.append(p)
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
        file_mode = 0o640
        store.write_meta(run_dir, meta)
        writer = store.SegmentWriter(run_dir, channels, self.segment_s, file_mode=file_mode)
        st = RunState(run, writer, np.array(idx, dtype=np.intp), rprobes, channels, meta, now)
        if self.live or run.extra.get("live"):
            st.live = self._make_live(channels)
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

    def event(self, run_id: str, event: str, t: float | None = None, **fields: Any) -> None:
        with self._lock:
            st = self._runs.get(run_id)
            if st is None:
                raise KeyError(f"run_id {run_id!r} is not registered")
            self._event(st, event, t, **fields)

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
                       write_error=st.write_error, live_findings=st.live_findings)
        try:
            store.write_meta(st.run.run_dir, st.meta)
        except OSError as e:
            self._write_failed(st, f"meta.json: {e}")
        for p in st.probes:
            p.close()
        call_safely("reveal_run_end", run=st.run, exit_code=exit_code)

    # -- sampling loop --------------------------------------------------------------------
    def sample_once(self) -> None:
        c0 = time.thread_time()
        t = time.time()
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
                    st.writer.add(t, rrow)
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
            if self._stop.wait(0.5):
                break
            if self.exit_when_idle and not self._runs and \
                    time.monotonic() - self._idle_since > self.idle_grace_s:
                log.info("no runs left; exiting")
                self._stop.set()
            if self._runs:
                self._idle_since = time.monotonic()

    def take_pending(self, pend: str) -> None:
        """Register runs queued as files while the socket was not up (root/own-uid files only)."""
        try:
            names = sorted(os.listdir(pend))
        except OSError:
            return
        for n in names:
            if not n.endswith(".json"):
                continue
            path = os.path.join(pend, n)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
                with os.fdopen(fd) as f:
                    st = os.fstat(f.fileno())
                    if st.st_uid not in (0, self.uid):
                        raise PermissionError(f"owned by uid {st.st_uid}")
                    req = json.load(f)
                os.unlink(path)
                op = req.get("op", "register")
                if op == "register":
                    self.register(RunInfo.from_dict(req["run"]))
                elif op == "unregister":
                    self.unregister(req["run_id"], req.get("exit_code"))
                elif op == "event":
                    self.event(req.pop("run_id"), req.pop("event"), req.pop("t", None),
                               **{k: v for k, v in req.items() if k != "op"})
            except Exception as e:
                log.warning("pending request %s ignored: %s: %s", path, type(e).__name__, e)
                try:
                    os.unlink(path)
                except OSError:
                    pass

    # -- socket server --------------------------------------------------------------------
    def handle(self, req: dict[str, Any], peer_uid: int) -> dict[str, Any]:
        op = req.get("op")
        privileged = peer_uid in (0, self.uid)
        if op == "ping":
            return {"ok": True, "pid": os.getpid(), "interval_s": self.interval_s,
                    "uid": self.uid, "host": self.host, "version": __version__}
        if op == "status":
            with self._lock:
                runs = [st.run.to_dict() for st in self._runs.values()
                        if privileged or st.run.uid == peer_uid]
            return {"ok": True, "runs": runs, "probes": self.probe_table(),
                    "ticks": self.ticks, "missed_ticks": self.missed_ticks,
                    "sample_cpu_s": self.sample_cpu_s}
        if op == "register":
            if not privileged:
                return {"ok": False, "error": f"uid {peer_uid} may not register runs with an "
                                              f"agent of uid {self.uid}"}
            run = RunInfo.from_dict(req.get("run") or {})
            return {"ok": True, "run_dir": self.register(run)}
        if op in ("event", "unregister"):
            run_id = req.get("run_id")
            with self._lock:
                st = self._runs.get(run_id)
            if st is None:
                return {"ok": False, "error": f"run_id {run_id!r} is not registered"}
            if not privileged and st.run.uid != peer_uid:
                return {"ok": False, "error": f"uid {peer_uid} may not act on run {run_id!r}"}
            if op == "unregister":
                if not privileged:
                    return {"ok": False, "error": "only root or the agent's user may unregister"}
                err = st.write_error
                run_dir = self.unregister(run_id, req.get("exit_code"))
                return {"ok": True, "run_dir": run_dir, "write_error": st.write_error or err}
            event = req.get("event")
            if not isinstance(event, str) or not event or event in ("run_start", "run_end"):
                return {"ok": False, "error": f"event {event!r}: not a valid event name"}
            fields = {k: v for k, v in req.items() if k not in ("op", "run_id", "event", "t")}
            self.event(run_id, event, req.get("t"), **fields)
            return {"ok": True}
        if op == "shutdown":
            if not privileged:
                return {"ok": False, "error": "only root or the agent's user may shut it down"}
            threading.Timer(0.2, self.stop).start()  # after the reply is sent
            return {"ok": True}
        return {"ok": False, "error": f"unknown op {op!r}"}

    def _serve(self, sock_path: str) -> None:
        agent = self

        class Handler(socketserver.StreamRequestHandler):
            timeout = 5

            def handle(self) -> None:
                try:
                    uid = _peer_uid(self.connection)
                except OSError:
                    return
                for line in self.rfile:
                    if len(line) > MAX_REQUEST:
                        reply = {"ok": False, "error": "request too large"}
                    else:
                        try:
                            req = json.loads(line)
                            if not isinstance(req, dict):
                                raise ValueError("request must be a JSON object")
                            reply = agent.handle(req, uid)
                        except Exception as e:
                            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
                    self.wfile.write((json.dumps(reply, default=str) + "\n").encode())
                    self.wfile.flush()

        class Server(socketserver.ThreadingUnixStreamServer):
            daemon_threads = True

        self._server = Server(sock_path, Handler)
        # Root agents accept any local user (peer credentials decide per request).
        os.chmod(sock_path, 0o666 if self.uid == 0 else 0o600)
        self._server.serve_forever(poll_interval=0.2)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Start serving; raises RuntimeError when another agent already serves this spool."""
        os.makedirs(self.spool, mode=0o755, exist_ok=True)
        sock_path = os.path.join(self.spool, "agent.sock")
        if os.path.exists(sock_path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            probe.settimeout(1.0)
            try:
                probe.connect(sock_path)
                raise RuntimeError(f"another agent already serves {sock_path}; not starting a "
                                   "second one")
            except OSError:
                os.unlink(sock_path)  # stale socket of a dead agent
            finally:
                probe.close()
        os.makedirs(os.path.join(self.spool, "pending"), mode=0o1733 if self.uid == 0 else 0o700,
                    exist_ok=True)
        self._idle_since = time.monotonic()
        self.sock_path = os.path.join(self.spool, "agent.sock")
        self._threads = [threading.Thread(target=self._serve, args=(self.sock_path,),
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
        if getattr(self, "_stopped", False):
            return
        self._stopped = True
        self._stop.set()
        call_safely("reveal_agent_stopping", agent=self)
        with self._lock:
            states = list(self._runs.values())
            self._runs.clear()
        for st in states:  # finalize what is open: an agent stop must not lose data
            self._finish(st, None)
        srv = getattr(self, "_server", None)
        if srv is not None:
            srv.shutdown()
            srv.server_close()
        try:
            os.unlink(self.sock_path)
        except (OSError, AttributeError):
            pass
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
    ap.add_argument("--live", action="store_true", help="run live detection for every run")
    ap.add_argument("--log-level", default="INFO")
    args = ap.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s reveal-agent[%(process)d] %(levelname)s %(message)s")
    if not (0.001 <= args.interval <= 60):
        ap.error(f"--interval {args.interval}: must be between 0.001 and 60 seconds")
    if not (1 <= args.segment <= 10):
        ap.error(f"--segment {args.segment}: must be between 1 and 10 seconds")
    agent = Agent(args.spool or spool_root(), args.interval, args.segment,
                  exit_when_idle=args.exit_when_idle, idle_grace_s=args.idle_grace,
                  live=args.live)
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
