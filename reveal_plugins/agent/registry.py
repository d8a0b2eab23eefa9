"""The agent's run registry: registering a run (directory, run probes, meta.json), its events
within the run's limits, closing it, and adopting the runs a dead agent left open."""
from __future__ import annotations

import logging
import math
import os
import socket
import time
from typing import Any


from .. import __version__
from ..hooks import hook
from ..types import ChannelMeta, RunInfo
from ..probes import gpu_ids
from . import protocol
from ..store import store
from ..probes.probe import Probe
from .runstate import RunState, create_run_dir, host_picker

log = logging.getLogger("reveal.agent")



def _finite_or_none(t: Any) -> bool:
    """An event's ``t``: None (now) or a finite number (meta.json stays standard JSON)."""
    if t is None:
        return True
    if isinstance(t, bool) or not isinstance(t, (int, float)):
        return False
    try:
        return math.isfinite(float(t))
    except OverflowError:
        return False

class RunRegistry:
    """Mixin of :class:`~reveal_plugins.agent.daemon.Agent`: the registered runs."""

    def adopt_open_runs(self) -> list[str]:
        """Resume the runs a dead agent of this machine left open (``<spool>/jobs/<job>/<host>``
        with ``end`` unset and its ``.running`` marker present): sampling goes on into the
        same directory, start and steps kept, an ``agent_restart`` event marks the gap.  A run
        whose marker is gone was closed by its agent, which could not rewrite ``meta.json``
        (a full disk): it is closed now (or as soon as there is room), never sampled again.
        Called once the spool lock is ours, so no other agent can be writing them."""
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
                    if meta.get("end") is not None or not self._recorded_here(host, meta):
                        continue
                    if meta.get("running_marker") and not store.is_running(d):
                        log.warning("run in %s was closed by its agent but its meta.json "
                                    "could not be rewritten; closing it now", d)
                        self._unfinished.setdefault(d, None)
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
        self.close_unfinished()
        return adopted

    def _recorded_here(self, host_dir: str, meta: dict[str, Any]) -> bool:
        """The run was recorded by an agent of this machine.  Its meta.json names the machine
        (``agent.hostname``, the host name of the agent that wrote it), which need not be the
        Slurm NodeName of the directory and of ``host``; older runs are matched by name."""
        agent = meta.get("agent") if isinstance(meta.get("agent"), dict) else {}
        if agent.get("hostname"):
            return agent["hostname"] == socket.gethostname()
        names = {self.host, socket.gethostname(), os.environ.get("SLURMD_NODENAME"),
                 self.config.get("node_name")} - {None, ""}
        return host_dir in names or meta.get("host") in names | {None}

    @property
    def _unfinished(self) -> dict[str, dict[str, Any] | None]:
        """Runs closed but not yet written as closed (run dir -> the final meta, or None to
        close from what the directory holds); retried by the housekeeping loop."""
        u = self.__dict__.get("_unfinished_runs")
        if u is None:
            u = self.__dict__["_unfinished_runs"] = {}
        return u

    def close_unfinished(self) -> list[str]:
        """Write the runs closed while their ``meta.json`` could not be written; returns the
        run directories closed now.  Called at start and by the housekeeping loop."""
        from ..store.finalize import exit_code_of, finalize_orphan
        done = []
        for d, meta in list(self._unfinished.items()):
            try:
                if meta is not None:
                    store.write_meta(d, meta)
                else:
                    finalize_orphan(d, exit_code_of(d), "agent")
            except OSError as e:
                log.debug("run %s still cannot be closed: %s", d, e)
                continue
            except Exception as e:   # gone or unreadable: nothing more the agent can do
                log.warning("run %s not closed: %s: %s", d, type(e).__name__, e)
            self._unfinished.pop(d, None)
            done.append(d)
        if done:
            log.warning("closed %d run(s) whose end could not be written before: %s",
                        len(done), ", ".join(done[:10]))
        return done

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
        run_dir = create_run_dir(run.run_dir, run.uid, run.gid, self.spool)
        run.run_dir = run_dir
        gpu_meta = self._resolve_gpus(run) if previous is None else {}
        idx = [i for i, c in enumerate(self.channels) if self._wanted(c, run)]
        rprobes: list[Probe] = []
        owner_fd = None
        try:
            for batch in hook().reveal_register_run_probes(run=run, config=self.config):
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
                "agent": {"pid": os.getpid(), "version": __version__, "uid": self.uid,
                          "hostname": socket.gethostname()},
                "running_marker": True,
            }
            meta.update(gpu_meta)
            if self.config.get("cpus"):   # the node's CPU set (cpuset.py): what cpu.all.* sums
                meta["cpus"] = list(self.config["cpus"])
            if previous is not None:  # adopted: the run started with the dead agent
                meta.update(start=previous.get("start", now), steps=previous.get("steps", []),
                            restarts=int(previous.get("restarts", 0)) + 1)
            store.write_meta(run_dir, meta)
            store.mark_running(run_dir)
            writer = store.SegmentWriter(run_dir, channels, self.segment_s, file_mode=0o640)
            writer.on_segment = _features(run_dir, channels, self.interval_s, self.config)
        except BaseException:
            for p in rprobes:  # nothing opened for a run that never starts stays open
                p.close()
            if owner_fd is not None:
                os.close(owner_fd)
            raise
        st = RunState(run, writer, host_picker(idx, len(self.channels)), rprobes, channels,
                      meta, meta["start"], owner_fd=owner_fd)
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
        hook().reveal_run_start(run=run)
        return run_dir

    def _resolve_gpus(self, run: RunInfo) -> dict[str, Any]:
        """Turn the GPUs a run says it was given into NVML indices (``run.gpus``) and record
        their identities; a run whose GPUs cannot be resolved gets no GPU channels, never
        another job's.  Nothing to do on a node without NVML."""
        if not any(c.name.startswith("gpu.") for c in self.channels):
            return {}
        spec = gpu_ids.spec_of(run.gpus, run.source, run.extra)
        if spec is None:
            return {}
        try:
            res = gpu_ids.resolve_with_nvml(spec)
        except Exception as e:  # never fail a registration over it: record no GPU channels
            log.warning("run %s: GPUs %r not resolved: %s", run.run_id, spec, e)
            run.gpus = []
            return {"gpu_source": spec["source"], "gpus": [], "gpu_note": f"not resolved: {e}"}
        if res is None:
            return {}
        run.gpus = res.indices
        out: dict[str, Any] = {"gpu_source": f"{spec['source']}={spec['value']}",
                               "gpus": res.identities}
        if res.note:
            out["gpu_note"] = res.note
            log.warning("run %s: %s", run.run_id, res.note)
        return out

    @staticmethod
    def _wanted(c: ChannelMeta, run: RunInfo) -> bool:
        if run.gpus is not None and c.name.startswith("gpu."):
            idx = c.name.split(".")[1]
            return idx.isdigit() and int(idx) in run.gpus
        return True

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
            code = fields.get("exit_code")
            # meta.json keeps every step: an exit code is a small integer or nothing
            s["end"], s["exit_code"] = rec["t"], (code if isinstance(code, int) and
                                                  not isinstance(code, bool) and
                                                  -2**31 <= code < 2**32 else None)
        if event == "pids" and isinstance(fields.get("pids"), list):
            for p in st.probes:
                if hasattr(p, "add_pids"):
                    try:
                        p.add_pids([x for x in fields["pids"] if isinstance(x, int)])
                    except Exception as e:
                        self._probe_failed(p.name, e)
        if event in ("step_start", "step_end"):
            getattr(hook(), "reveal_" + event)(
                run=st.run, step_id=str(fields.get("step_id")), t=rec["t"],
                **({"exit_code": fields.get("exit_code")} if event == "step_end" else {}))

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
            is_step = event in ("step_start", "step_end")
            new_step = is_step and str(fields.get("step_id")) not in st.steps
            why = ("t is not a finite number" if not _finite_or_none(t)
                   else "a step id longer than %d characters" % lim.step_id_chars
                   if is_step and len(str(fields.get("step_id"))) > lim.step_id_chars
                   else "event larger than %d bytes" % lim.event_bytes if size > lim.event_bytes
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
            self._drain()             # the ticks read so far are the run's too
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
        st.writer.close()
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
        # The marker goes first: unlinking needs no free space, so even when meta.json cannot
        # be rewritten below (ENOSPC) the next agent knows this run is over.
        try:
            store.clear_running(st.run.run_dir)
        except OSError as e:
            log.error("run %s: cannot remove %s: %s", st.run.run_id, store.RUNNING, e)
        try:
            store.write_meta(st.run.run_dir, st.meta)
        except OSError as e:
            self._write_failed(st, f"meta.json: {e}")
            log.error("run %s: its end is not written yet (%s); retried until it is",
                      st.run.run_id, e)
            self._unfinished[st.run.run_dir] = dict(st.meta)
        for p in st.probes:
            p.close()
        if st.owner_fd is not None:
            os.close(st.owner_fd)
            st.owner_fd = None
        hook().reveal_run_end(run=st.run, exit_code=exit_code)


def _features(run_dir: str, channels: list, interval_s: float, config: dict):
    """Incremental featurization of the run's segments (the ``reveal_run_features`` hook);
    None (detection absent, turned off or failing): the job-end analysis featurizes."""
    return hook().reveal_run_features(run_dir=run_dir, channels=channels,
                                      interval_s=interval_s, config=config)
