"""The node agent: samples every available probe on a drift-free schedule and writes each
registered run's slice of the samples into that run's directory.

One agent per node serves several runs at once (a shared node pays the sampling cost once).
Runs register and unregister over a Unix socket (``<spool>/agent.sock``, one JSON object per
line, see docs/protocol.md) or, while the agent is still starting, by dropping a registration
file into ``<spool>/pending/``.  Peer credentials decide who may do what.  Collection never
depends on consumers: a failing probe, sink or disk only costs its own part.
"""
from __future__ import annotations

import argparse
import fcntl
import logging
import logging.handlers
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

import numpy as np

from ..cli_options import EXIT_OK, EXIT_PROBLEM
from ..hooks import hook
from ..types import RunInfo
from . import pending, protocol
from .housekeeping import Housekeeping
from .live_loop import LiveLoop
from .registry import RunRegistry
from .requests import RequestHandler
from .runstate import RunLimits, RunState
from .sampler import Sampler
from .server import AgentServer

log = logging.getLogger("reveal.agent")

MAX_REQUEST = protocol.MAX_REQUEST
__all__ = ["Agent", "RunLimits", "RunState", "main"]


class Agent(Sampler, RunRegistry, LiveLoop, Housekeeping, RequestHandler):
    """One node's agent.  Its parts live in their own modules: :mod:`.sampler` (probes, the
    sampling schedule), :mod:`.registry` (runs, events, adoption), :mod:`.live_loop`,
    :mod:`.housekeeping` (pending queue, dead owners, retention), :mod:`.requests` (the
    protocol) and :mod:`.server` (the bounded socket server); this class holds the shared
    state and the lifecycle."""

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
        self._reg_lock = threading.Lock()    # one registration at a time: no duplicate RunState
        self._stop_lock = threading.Lock()
        self.limits = RunLimits()
        self._runs: dict[str, RunState] = {}
        self._stop = threading.Event()
        self._latest: tuple[float, np.ndarray] | None = None
        self._failed_probes: set[str] = set()
        self.ticks = 0
        self.missed_ticks = 0
        self.sample_cpu_s = 0.0
        self._open_probes()

    def runs(self) -> list[RunInfo]:
        with self._lock:
            return [st.run for st in self._runs.values()]

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
        try:   # the pid is for people; a full disk must not keep the agent from starting
            os.pwrite(lock, str(os.getpid()).encode(), 0)
        except OSError as e:
            log.warning("%s: cannot record the agent's pid: %s", self.spool, e)
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
        hook().reveal_agent_started(agent=self)

    def stop(self) -> None:
        with self._stop_lock:  # a second caller waits until the runs are finished
            if getattr(self, "_stopped", False):
                return
            self._stopped = True
            self._stop.set()
            self._stop_now()

    def _stop_now(self) -> None:
        hook().reveal_agent_stopping(agent=self)
        with self._lock:
            self._drain()
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
        # The signal handlers set _stop, which ends this wait at once: the timeout only
        # bounds how long a missed wake-up could go unseen, and each wake costs CPU.
        while not self._stop.wait(5.0):
            pass
        self.stop()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="reveal agent", description="Run the node agent.")
    ap.add_argument("--spool", metavar="DIR", default=None, help="spool directory (default $REVEAL_SPOOL or "
                    "/var/spool/reveal)")
    ap.add_argument("--interval", type=float, metavar="S", default=0.1,
                    help="sampling interval, seconds (default 0.1)")
    ap.add_argument("--segment", type=float, metavar="S", default=10.0,
                    help="segment file length, seconds (default 10)")
    ap.add_argument("--exit-when-idle", action="store_true",
                    help="exit once no run has been registered for --idle-grace seconds")
    ap.add_argument("--idle-grace", type=float, metavar="S", default=30.0,
                    help="with --exit-when-idle: seconds without a run before exiting "
                         "(default 30)")
    ap.add_argument("--live", action="store_true",
                    default=os.environ.get("REVEAL_LIVE", "").lower() in ("1", "true", "yes"),
                    help="run live detection for every run (default: on when $REVEAL_LIVE=1, "
                    "so private agents of reveal record / reveal-torchrun can be made live)")
    ap.add_argument("--log-level", default="INFO",
                    choices=("DEBUG", "INFO", "WARNING", "ERROR", "debug", "info", "warning",
                             "error"), metavar="LEVEL",
                    help="DEBUG, INFO (default), WARNING or ERROR")
    ap.add_argument("--log-file", metavar="FILE", default=None,
                    help="log here, rotated at 10 MiB (3 files kept), instead of to stderr")
    ap.add_argument("--retention-days", type=float, metavar="DAYS", default=30.0,
                    help="remove <spool>/jobs/<job> this long after its runs ended (0: never)")
    ap.add_argument("--cpus", metavar="LIST", default=os.environ.get("REVEAL_CPUS") or None,
                    help="the node's CPU set, e.g. 0-3,8 (default $REVEAL_CPUS, else all "
                    "online cores): per-core probes read only these, cpu.all.* is their sum")
    ap.add_argument("--host-proc", metavar="DIR", default=os.environ.get("REVEAL_HOST_PROC") or None,
                    help="the machine's /proc, mounted here, when this agent runs in a PID "
                    "namespace of the node's (default $REVEAL_HOST_PROC): the node's processes "
                    "started from outside it count as the node's (probes/nodeprocs.py)")
    ap.add_argument("--socket-group", metavar="GROUP", default=None,
                    help="root agent: only this group (and root) may connect (socket 0660)")
    return ap


class _WithholdPandas:
    """``import pandas`` fails in the agent process (see :func:`withhold_pandas`)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(
                "the reveal agent runs without pandas (43 MB of RSS, 0.3 s at the first run's "
                "registration); agent-side plugins read data with pyarrow or numpy, or the "
                "agent is started with REVEAL_AGENT_PANDAS=1", name=name)
        return None


def withhold_pandas() -> bool:
    """Keep pandas out of the agent process; True when it is withheld.

    pyarrow and scikit-learn import pandas whenever it is installed (pyarrow on its first
    array, to recognise pandas objects) and work without it.  The agent never holds a pandas
    object, and the import cost the first run's registration 0.3 s and the node 43 MB of
    memory for the agent's life.  ``REVEAL_AGENT_PANDAS=1`` lets it load (a site plugin that
    needs it)."""
    if os.environ.get("REVEAL_AGENT_PANDAS") == "1" or "pandas" in sys.modules:
        return False
    sys.meta_path.insert(0, _WithholdPandas())
    return True


def main(argv: list[str] | None = None) -> int:
    from .. import site_config
    from ..spool import spool_root
    from .settings import ENV_OF, OPTION_OF, AgentConfig
    withhold_pandas()
    ap = build_parser()
    try:     # [agent] of the site configuration: below the options, above the defaults
        table, _ = site_config.table("agent", AgentConfig)
    except site_config.SiteConfigError as e:
        ap.error(str(e))
    given = table.model_dump(exclude_unset=True)
    ap.set_defaults(**{OPTION_OF[k]: v for k, v in given.items()
                       if k in OPTION_OF and not os.environ.get(ENV_OF.get(k, "-"))})
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
    config: dict[str, Any] = {"retention_days": args.retention_days,
                              "features": table.features}
    if args.socket_group:
        import grp
        try:
            config["socket_gid"] = grp.getgrnam(args.socket_group).gr_gid
        except KeyError:
            ap.error(f"--socket-group {args.socket_group!r}: no such group")
    if args.cpus:
        from ..probes.cpuset import resolve
        try:
            config["cpus"] = resolve(args.cpus, "--cpus")
        except ValueError as e:
            ap.error(str(e))
    if args.host_proc:
        hp = os.path.abspath(args.host_proc)
        if not (os.path.isfile(os.path.join(hp, "stat")) and os.path.isdir(os.path.join(hp, "1"))):
            ap.error(f"--host-proc {args.host_proc!r}: not a proc file system (no stat, no 1/)")
        config["host_proc"] = hp
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
        return EXIT_PROBLEM
    log.info("sampling %d channels from %d probes every %.3f s; socket %s",
             len(agent.channels), len(agent.probes), agent.interval_s, agent.sock_path)
    agent.wait()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
