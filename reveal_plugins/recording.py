"""A recording session: what ``reveal record`` and ``reveal-torchrun`` share.

``Recording`` joins the node agent of the Slurm job it runs in (then the job's Prolog/Epilog
own the run; this process only adds events), or starts a private agent for a local run
directory, registers the run, and at the end unregisters, analyses and prints the summary.
Telemetry problems never stop the user's command: they are reported on stderr and the
command runs on without telemetry.
"""
from __future__ import annotations

import logging
import os
import pwd
import socket
import sys
import tempfile
import time
from typing import Any, TextIO

from . import spool as spool_mod
from .probes import gpu_ids
from .store import store
from .agent.client import AgentClient, AgentError, ensure_agent
from .types import RunInfo

log = logging.getLogger(__name__)


def default_out_dir() -> str:
    host = socket.gethostname().split(".")[0]
    return os.path.join("reveal-runs", time.strftime("%Y%m%d-%H%M%S") + f"-{host}-{os.getpid()}")


def validate_interval(value: Any) -> float:
    """Parse a sampling interval in seconds; raise ValueError naming the value when bad."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"interval {value!r}: not a number of seconds") from None
    if not (0.01 <= v <= 60) or v != v:
        raise ValueError(f"interval {value!r}: must be between 0.01 and 60 seconds")
    return v


class Recording:
    """Context manager around one recorded run; see the module docstring."""

    def __init__(self, out: str | None = None, interval_s: float = 0.1, source: str = "local",
                 command: list[str] | str | None = None, live: bool = False,
                 analyze: bool = True, stream: TextIO | None = None,
                 config: dict[str, Any] | None = None, run_id: str | None = None,
                 extra: dict[str, Any] | None = None):
        self.out = out
        self.run_id = run_id          # shared identity (e.g. a multi-node torchrun launch)
        self.extra = dict(extra or {})
        self.interval_s = validate_interval(interval_s)
        self.source = source
        self.command = command
        self.live = live
        self.analyze = analyze
        self.stream = stream if stream is not None else sys.stderr
        self.config = dict(config or {})
        self.client: AgentClient | None = None
        self.run: RunInfo | None = None
        self.joined = False          # True when inside a Slurm job whose agent owns the run
        self.exit_code: int | None = None
        self.report: dict[str, Any] | None = None
        self.error: str | None = None
        self._private_spool: str | None = None

    # -- start ----------------------------------------------------------------------------
    def __enter__(self) -> "Recording":
        try:
            if not self._join_slurm_job():
                self._start_private()
        except Exception as e:
            self._fail(f"telemetry disabled: {e}")
        return self

    def _join_slurm_job(self) -> bool:
        job = os.environ.get("SLURM_JOB_ID")
        if not job:
            return False
        client = AgentClient(spool_mod.agent_socket(), timeout=1.0)
        try:
            runs = client.status()["runs"]
        except AgentError:
            return False
        mine = [r for r in runs if r.get("job_id") == job]
        if not mine:
            return False
        self.client, self.run, self.joined = client, RunInfo.from_dict(mine[0]), True
        step = os.environ.get("SLURM_STEP_ID")
        self.event("note", message=f"{self.source} joined job {job}"
                   + (f" step {step}" if step else ""), command=self.command)
        return True

    def _start_private(self) -> None:
        out = os.path.abspath(self.out or default_out_dir())
        try:
            os.makedirs(out, mode=0o750, exist_ok=True)
            if not os.access(out, os.W_OK):
                raise PermissionError(13, "Permission denied")
        except OSError as e:
            raise RuntimeError(f"cannot write run directory {out}: {e.strerror or e}") from None
        self._private_spool = tempfile.mkdtemp(prefix="reveal-agent-")
        # REVEAL_SEGMENT_S (1-10) shortens segments: tests and very crash-prone hosts.
        seg = os.environ.get("REVEAL_SEGMENT_S")
        self.client = ensure_agent(self._private_spool, self.interval_s, wait_s=10.0,
                                   exit_when_idle=True, idle_grace_s=5.0, live=self.live,
                                   segment_s=float(seg) if seg else None)
        try:   # the account, not $USER/$LOGNAME (which anyone sets to anything)
            user = pwd.getpwuid(os.getuid()).pw_name
        except KeyError:
            user = None
        run = RunInfo(run_id=self.run_id or os.path.basename(out.rstrip("/")) or "run",
                      run_dir=out,
                      source=self.source, user=user, uid=os.getuid(), gid=os.getgid(),
                      command=self.command, pids=[os.getpid()],
                      extra={**self.extra, **({"live": True} if self.live else {}),
                             **self._gpu_spec()})
        # watch: if this process is killed (SIGKILL, OOM), the agent closes the run itself
        # and, idle, exits; nothing samples on for a recording nobody will finish.
        run.run_dir = self.client.register(run, watch=True)
        self.run = run

    @staticmethod
    def _gpu_spec() -> dict:
        """The GPUs this command was given (the agent resolves them to NVML devices)."""
        spec = gpu_ids.spec_from_env(dict(os.environ))
        return {"gpu_spec": spec} if spec else {}

    def _fail(self, msg: str, running: bool = True) -> None:
        if self.error is None:
            self.error = msg
            tail = "; the command runs on without it" if running else ""
            print(f"reveal: {msg}{tail}", file=self.stream)

    @property
    def run_dir(self) -> str | None:
        return self.run.run_dir if self.run else None

    # -- during the run -------------------------------------------------------------------
    def event(self, event: str, t: float | None = None, **fields: Any) -> None:
        """Add a lifecycle event (elastic, iteration, note ...) to the run; never raises."""
        if self.client is None or self.run is None:
            return
        try:
            self.client.event(self.run.run_id, event, t, **fields)
        except AgentError as e:
            if self.joined or self.run_dir is None:
                log.debug("event %s lost: %s", event, e)
                return
            try:  # private agent gone: the run directory is ours, write directly
                store.append_event(self.run_dir, event, t, **fields)
            except OSError as e2:
                log.debug("event %s lost: %s", event, e2)

    def add_pids(self, pids: list[int], **fields: Any) -> None:
        self.event("pids", pids=list(pids), **fields)

    # -- end ------------------------------------------------------------------------------
    def __exit__(self, exc_type, exc, tb) -> None:
        if self.exit_code is None and exc_type is not None:
            self.exit_code = 130 if exc_type is KeyboardInterrupt else 1
        if self.run is None or self.joined:
            return
        try:
            self.client.unregister(self.run.run_id, self.exit_code, timeout=15)
            werr = self.client.last_reply.get("write_error")
            if werr:
                self._fail(f"telemetry incomplete in {self.run_dir}: {werr}", running=False)
        except (AgentError, AttributeError) as e:
            self._fail(f"agent lost before the end of the run ({e}); finalizing the finished "
                       "segments", running=False)
            self._finalize_locally()
        finally:
            self._cleanup_spool()
        if self.analyze:
            self._analyze()

    def _finalize_locally(self) -> None:
        d = self.run_dir
        try:
            meta = store.read_meta(d)
            now = time.time()
            store.append_event(d, "run_end", now, exit_code=self.exit_code,
                               note="agent lost; finalized by the recorder")
            meta.update(end=now, exit_code=self.exit_code)
            steps = meta.get("steps") or []
            meta["steps"] = steps
            store.write_meta(d, meta)
        except Exception as e:
            print(f"reveal: cannot finalize {d}: {e}", file=self.stream)

    def _cleanup_spool(self) -> None:
        sp = self._private_spool
        if not sp:
            return
        for name in ("agent.log",):
            p = os.path.join(sp, name)
            try:
                if os.path.getsize(p) and self.error:
                    print(f"reveal: agent log kept at {p}", file=self.stream)
                    return
            except OSError:
                pass
        # The idle agent removes its socket when it exits; the rest is ours to clean.
        import shutil
        shutil.rmtree(sp, ignore_errors=True)

    def _analyze(self) -> None:
        from .analysis import AnalysisUnavailable, analyze_and_publish, summary_text
        try:
            self.report = analyze_and_publish(self.run_dir, self.config)
        except AnalysisUnavailable:
            print(f"reveal: telemetry in {self.run_dir} (no analysis plugin installed)",
                  file=self.stream)
            return
        except Exception as e:
            print(f"reveal: analysis of {self.run_dir} failed: {type(e).__name__}: {e}",
                  file=self.stream)
            return
        color = self.stream.isatty() and not os.environ.get("NO_COLOR")
        print(summary_text(self.report, self.run_dir, color=color),
              file=self.stream)
        if self.report.get("status") == "not_analysed":
            print(f"reveal: NOT ANALYSED ({self.report.get('status_reason')}); the telemetry "
                  f"is kept in {self.run_dir}", file=self.stream)
        if self.report.get("status") == "failed":
            print(f"reveal: analysis FAILED ({self.report.get('status_reason')}); the telemetry "
                  f"is kept: retry with `reveal analyze {self.run_dir}`", file=self.stream)
        print(f"reveal: run directory {self.run_dir}", file=self.stream)
