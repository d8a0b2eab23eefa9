"""Prolog, Epilog, TaskProlog and TaskEpilog: Slurm's job lifecycle turned into agent requests.

Slurm DRAINS a node whose Prolog/Epilog fails or times out, so :func:`run_hook` wraps each hook:
it catches everything, logs the cause, enforces a wall-time budget (a timer that abandons the
work, plus a watchdog thread that exits the process if the work cannot be interrupted) and
always returns 0.  The hooks import nothing heavy (no numpy): they speak the agent's one-line
JSON protocol (docs/internals.md) directly, and leave slow work (starting an agent, analysis)
to detached processes in their own session, which survive Slurm killing the hook's process group.
"""
from __future__ import annotations

import fcntl
import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Callable

from ..spool import JOB_ID_RE
from ..probes import gpu_ids
from ..agent import pending, protocol
from ..agent.client import AgentBusy, AgentClient, AgentUnreachable, queue_request
from .config import ConfigError, SlurmConfig, load_config

DEFAULT_LOG = "/var/log/reveal/slurm-hooks.log"
BATCH, EXTERN = "batch", "extern"


class BudgetExceeded(Exception):
    pass


# -- logging -----------------------------------------------------------------------------------

def log_path() -> str:
    return os.environ.get("REVEAL_SLURM_LOG") or DEFAULT_LOG


def log(hook: str, level: str, msg: str, job: str | None = None) -> None:
    """Append one line to the hook log (root hooks) or stderr (user hooks); never raises."""
    job = job if job is not None else os.environ.get("SLURM_JOB_ID", "-")
    line = (f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime())}Z reveal-slurm {hook} "
            f"job={job} pid={os.getpid()} {level} {msg}\n")
    if os.geteuid() == 0:
        try:
            path = log_path()
            os.makedirs(os.path.dirname(path), mode=0o750, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o640)
            try:
                os.write(fd, line.encode(errors="replace"))
            finally:
                os.close(fd)
            return
        except OSError:
            pass
    elif level == "INFO":
        return  # user-side hooks: only problems go to the job's stderr
    try:
        sys.stderr.write(line)
        sys.stderr.flush()
    except Exception:
        pass


# -- the never-drain wrapper --------------------------------------------------------------------

def run_hook(name: str, budget_s: float, fn: Callable[[], None]) -> int:
    """Run ``fn`` within ``budget_s`` seconds; log any failure; always return 0."""
    t0 = time.monotonic()

    def on_alarm(signum, frame):
        raise BudgetExceeded()

    done = threading.Event()

    def watchdog():
        # The timer cannot interrupt a blocked C call that retries on EINTR; this can.
        if done.wait(budget_s + 0.25):
            return
        log(name, "ERROR", f"still running after its {budget_s:g} s budget; exiting 0 "
                           "(watchdog)")
        os._exit(0)

    threading.Thread(target=watchdog, daemon=True).start()
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, budget_s)
    try:
        fn()
    except BudgetExceeded:
        log(name, "ERROR", f"gave up after its {budget_s:g} s budget (the job is not held up; "
                           "its telemetry may be incomplete)")
    except ConfigError as e:
        log(name, "ERROR", f"configuration error, hook skipped: {e}")
    except BaseException as e:  # noqa: BLE001 -- a hook must never fail a job or drain a node
        tb = traceback.extract_tb(e.__traceback__)
        where = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""
        log(name, "ERROR", f"failed: {type(e).__name__}: {e}{where}")
    finally:
        done.set()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    if os.environ.get("REVEAL_SLURM_TIMING"):
        log(name, "INFO", f"done {process_age() * 1000:.0f} ms after process start "
                          f"(hook body {(time.monotonic() - t0) * 1000:.1f} ms)")
    return 0


# -- agent protocol (docs/protocol.md, through the one client) -------------------------------------

def agent_request(sock_path: str, req: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One request; the reply, ``ok`` or not.  Raises AgentUnreachable (start an agent) or
    AgentBusy (one is there: do not start another)."""
    return AgentClient(sock_path).request(req, timeout, check=False)


queue_pending = queue_request


def _registration_pending(spool: str, run_id: str) -> bool:
    """True when a queued registration of ``run_id`` waits in ``<spool>/pending/`` (root's:
    the Prolog's or the SPANK plugin's), read by the queue's own parser."""
    return pending.registration_queued(spool, run_id, (0,))


def _is_agent(pid: str, proc: str = "/proc") -> bool:
    """True when ``pid`` is an agent a root hook started: root's (every uid 0 in
    ``/proc/PID/status``) and running the agent module.  A command line alone proves
    nothing: any user can ``exec -a`` one containing the module name, and the PID a hook
    recorded may have been reused by anyone's process since."""
    if not pid.isdigit():
        return False
    try:
        with open(f"{proc}/{pid}/status", "rb") as f:
            uids = next((ln.split()[1:] for ln in f.read(4096).splitlines()
                         if ln.startswith(b"Uid:")), [])
        if len(uids) != 4 or any(u != b"0" for u in uids):
            return False
        with open(f"{proc}/{pid}/cmdline", "rb") as f:
            return b"reveal_plugins.agent.daemon" in f.read(4096)
    except OSError:
        return False


def _agent_starting(spool: str) -> bool:
    """True when the agent a hook started for ``spool`` is alive (but not answering yet)."""
    try:
        with open(os.path.join(spool, ".agent-starter")) as f:
            pid = f.read(64).strip()
    except (OSError, ValueError):
        return False
    return _is_agent(pid)


def start_agent_detached(spool: str, interval_s: float) -> int | None:
    """Start ``reveal agent`` for ``spool`` in its own session unless one is being started.

    Returns the new PID, or None when another hook started one moments ago (its PID, kept in
    ``<spool>/.agent-starter``, is still alive).
    """
    os.makedirs(spool, mode=0o755, exist_ok=True)
    lock = os.path.join(spool, ".agent-starter")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        old = os.read(fd, 64).decode(errors="replace").strip()
        if _is_agent(old):
            return None
        try:
            logf = os.open(os.path.join(spool, "agent.log"),
                           os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o640)
        except OSError:
            logf = subprocess.DEVNULL
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
        from .install import package_parent
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_parent(), os.environ.get("PYTHONPATH", "")) if p)
        try:
            p = subprocess.Popen([sys.executable, "-P", "-m", "reveal_plugins.agent.daemon",
                                  "--spool", spool, "--interval", repr(float(interval_s))],
                                 stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                 start_new_session=True, close_fds=True, cwd="/", env=env)
        finally:
            if logf is not subprocess.DEVNULL:
                os.close(logf)
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, str(p.pid).encode())
        return p.pid
    finally:
        os.close(fd)


# -- job identity from the hook environment -----------------------------------------------------

def job_id_from_env(env: dict[str, str]) -> str:
    job = env.get("SLURM_JOB_ID", "")
    if not JOB_ID_RE.match(job):
        raise ValueError(f"SLURM_JOB_ID={job!r}: not a Slurm job id (is this running as a "
                         "Slurm Prolog/Epilog?)")
    return job


def node_name(env: dict[str, str]) -> str:
    name = env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    if "/" in name or name.startswith("."):
        raise ValueError(f"SLURMD_NODENAME={name!r}: not a usable node name")
    return name


def parse_gpus(env: dict[str, str]) -> list[int] | None:
    """Host GPU indices of the job: SLURM_JOB_GPUS, else CUDA_VISIBLE_DEVICES; None = unknown."""
    for key in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        v = env.get(key, "").strip()
        if v and all(p.strip().isdigit() for p in v.split(",")):
            return [int(p) for p in v.split(",")]
    return None


def find_cgroup(job: str, uid: int) -> str | None:
    """The job's cgroup if Slurm has created it already (proctrack/task cgroup), else None."""
    base = "/sys/fs/cgroup"
    candidates = [os.path.join(base, "system.slice", "slurmstepd.scope", f"job_{job}")]
    for ctrl in ("memory", "cpuacct", "cpu,cpuacct", "pids"):
        candidates.append(os.path.join(base, ctrl, "slurm", f"uid_{uid}", f"job_{job}"))
    for c in candidates:
        if os.path.isdir(c):
            return c
    return None


def run_info(env: dict[str, str], cfg: SlurmConfig) -> dict[str, Any]:
    """The RunInfo dict the Prolog registers (Prolog environment only: no slurmctld query)."""
    job = job_id_from_env(env)
    host = node_name(env)
    uid = int(env["SLURM_JOB_UID"])
    user = env.get("SLURM_JOB_USER")
    gid = int(env["SLURM_JOB_GID"]) if env.get("SLURM_JOB_GID", "").isdigit() else None
    if gid is None or not user:
        try:
            pw = pwd.getpwuid(uid)
            gid = pw.pw_gid if gid is None else gid
            user = user or pw.pw_name
        except KeyError:
            pass
    extra = {k: env[e] for k, e in (("partition", "SLURM_JOB_PARTITION"),
                                    ("nodelist", "SLURM_JOB_NODELIST"),
                                    ("account", "SLURM_JOB_ACCOUNT"),
                                    ("job_name", "SLURM_JOB_NAME"),
                                    ("cluster", "SLURM_CLUSTER_NAME"),
                                    ("cpus_on_node", "SLURM_CPUS_ON_NODE")) if env.get(e)}
    if cfg.default_mode == "live":
        extra["live"] = True
    spec = gpu_ids.spec_from_env(env)  # the agent resolves it to NVML devices
    if spec:
        extra["gpu_spec"] = spec
    return {"run_id": f"slurm-{job}", "source": "slurm", "host": host, "job_id": job,
            "run_dir": os.path.join(cfg.spool_dir(), "jobs", job, host),
            "user": user, "uid": uid, "gid": gid, "gpus": parse_gpus(env),
            "cgroup": find_cgroup(job, uid), "extra": extra}


# -- the hooks -----------------------------------------------------------------------------------

def _remaining(deadline: float) -> float:
    return max(0.01, deadline - time.monotonic())


def prolog(cfg: SlurmConfig, env: dict[str, str], deadline: float) -> None:
    """Register the job with the node agent; start the agent (detached) if none answers."""
    run = run_info(env, cfg)
    spool = cfg.spool_dir()
    sock = os.path.join(spool, "agent.sock")
    req = protocol.register_request(run)
    try:
        reply = agent_request(sock, req, _remaining(deadline) * 0.8)
    except AgentBusy as e:
        if e.sent:
            log("prolog", "WARNING", f"{e}; the registration reached the agent (delivered, no "
                                     "reply yet): it registers the job when it gets to it",
                run["job_id"])
            return
        # Nothing reached the agent (full backlog): queued, or the job is never recorded.
        path = "by the SPANK plugin" if env.get("REVEAL_SPANK_QUEUED") else \
            queue_pending(spool, req)
        log("prolog", "WARNING", f"{e}; queued the registration ({path}): the agent takes it "
                                 "from its queue", run["job_id"])
        return
    except AgentUnreachable as e:
        pid = start_agent_detached(spool, cfg.interval_s)
        path = "by the SPANK plugin" if env.get("REVEAL_SPANK_QUEUED") else \
            queue_pending(spool, req)
        log("prolog", "WARNING", f"{e}; " + (f"started an agent (pid {pid})" if pid else
                                             "an agent is starting") +
            f" and queued the registration ({path})", run["job_id"])
        return
    if not reply.get("ok"):
        raise RuntimeError(f"agent refused the registration of {run['run_id']}: "
                           f"{reply.get('error')}")


def epilog(cfg: SlurmConfig, env: dict[str, str], deadline: float) -> None:
    """Close the job's run (the agent flushes it), then start the detached analysis."""
    job = job_id_from_env(env)
    host = node_name(env)
    spool = cfg.spool_dir()
    run_dir = os.path.join(spool, "jobs", job, host)
    ec = env.get("SLURM_JOB_EXIT_CODE2", "")
    exit_code = int(ec.split(":")[0]) if ec.split(":")[0].isdigit() else None
    req = protocol.unregister_request(f"slurm-{job}", exit_code)
    wait_closed = False
    orphan = False  # the agent died: the analysis closes the run from what is on disk
    by_spank = env.get("REVEAL_SPANK_UNREGISTERED")
    try:
        if by_spank:  # the SPANK job_epilog already sent the unregister (and ran us detached)
            reply = {"ok": True} if by_spank == "ok" else None
            if by_spank == "unreachable":
                raise AgentUnreachable(f"agent socket {spool}/agent.sock: no answer to the "
                                          "SPANK plugin's unregister")
            if by_spank in ("sent", "busy"):     # written, no reply / backlog full at connect
                raise AgentBusy(f"agent socket {spool}/agent.sock: the SPANK plugin's "
                                "unregister " + ("was written, no reply" if by_spank == "sent"
                                                 else "found the agent busy at connect"),
                                sent=by_spank == "sent")
            if reply is None:
                reply = {"ok": False, "error": "run_id is not registered" if by_spank == "notreg"
                         else "refused (see the slurmd log)"}
        else:
            reply = agent_request(os.path.join(spool, "agent.sock"), req,
                                  _remaining(deadline) * 0.7)
        if reply.get("ok"):
            run_dir = reply.get("run_dir") or run_dir
        elif "not registered" in str(reply.get("error")) and \
                _registration_pending(spool, f"slurm-{job}"):
            # The agent came up but has not read the queued registration yet: queue behind it.
            queue_pending(spool, req)
            wait_closed = True
            log("epilog", "WARNING", f"job {job}: registration still queued; queued the "
                                     "unregister behind it, the analysis waits for it", job)
        else:
            log("epilog", "ERROR", f"agent refused to close run slurm-{job}: "
                                   f"{reply.get('error')}", job)
    except AgentBusy as e:
        wait_closed = True
        if e.sent:
            log("epilog", "WARNING", f"{e}; the unregister reached the agent (delivered, no "
                                     "reply yet): the analysis waits for it to close the run",
                job)
        else:
            # Nothing reached the agent (full backlog): queue the unregister, or no one ever
            # asks it to close the run and it samples a finished job.
            path = queue_pending(spool, req)
            log("epilog", "WARNING", f"{e}; queued the unregister ({path}): the analysis waits "
                                     "for the agent to take it and close the run", job)
    except AgentUnreachable as e:
        if _agent_starting(spool):
            # Cold start: the agent is still coming up with this job's queued registration.
            queue_pending(spool, req)
            wait_closed = True
            log("epilog", "WARNING", f"{e}; the agent is still starting: queued the unregister, "
                                     "the analysis waits for it", job)
        else:
            orphan = True
            # A later agent adopts the runs left open in the spool; the queued unregister
            # then closes this one instead of sampling a finished job.
            queue_pending(spool, req)
            log("epilog", "ERROR", f"{e}: the agent died or never ran for this job; closing "
                                   f"the run and analysing what is on disk in {run_dir}", job)
    if cfg.analysis == "off":
        return
    if not wait_closed and not os.path.isfile(os.path.join(run_dir, "meta.json")):
        log("epilog", "ERROR", f"no telemetry for job {job}: {run_dir}/meta.json is missing",
            job)
        return
    env2 = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env2["REVEAL_SLURM_JOB_ID"] = job
    if cfg.path:
        env2["REVEAL_SLURM_CONFIG"] = cfg.path
    # The hook may run under ``python -S``: give the analysis our package path explicitly.
    from .install import package_parent
    env2["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_parent(), os.environ.get("PYTHONPATH", "")) if p)
    argv = [sys.executable, "-P", "-m", "reveal_plugins.slurm.cli", "_analyze"]
    argv += ["--wait-closed"] if wait_closed else []
    argv += ["--finalize", str(exit_code)] if orphan else []
    subprocess.Popen(argv + [run_dir],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True, cwd="/",
                     env=env2)


def _step_name(env: dict[str, str]) -> str:
    sid = env.get("SLURM_STEP_ID")
    if sid is None or sid == "":
        return BATCH
    return {"4294967291": BATCH, "4294967292": EXTERN}.get(sid, sid)


def task_hook(event: str, cfg: SlurmConfig, env: dict[str, str], deadline: float) -> None:
    """TaskProlog/TaskEpilog (job user, per task): mark the step once per node (local task 0)."""
    job = job_id_from_env(env)
    if event == "step_start":
        # TaskProlog stdout is parsed by Slurm: "export K=V" edits the task's environment.
        print(f"export REVEAL_RUN_ID=slurm-{job}", flush=True)
    if env.get("SLURM_LOCALID", "0") != "0":
        return
    fields: dict[str, Any] = {"step_id": _step_name(env), "source": "task-hook"}
    if event == "step_end":
        fields["exit_code"] = None
    req = protocol.event_request(f"slurm-{job}", event, time.time(), **fields)
    sock = os.path.join(cfg.spool_dir(), "agent.sock")
    # The task hooks run as the job's user, who cannot queue into root's pending/: a request
    # that did not reach the agent (full backlog) is tried again while the budget lasts, and
    # the log says when the step marker was lost.
    while True:
        try:
            reply = agent_request(sock, req, _remaining(deadline) * 0.8)
            break
        except AgentBusy as e:
            if e.sent:
                log(name_of(event), "INFO", f"{event} of step {fields['step_id']} delivered "
                                            f"(no reply in time: {e})", job)
                return
            if _remaining(deadline) < 0.1:
                log(name_of(event), "WARNING", f"{event} of step {fields['step_id']} not "
                                               f"recorded: {e}, until the hook's budget ran out",
                    job)
                return
            time.sleep(0.02)
        except AgentUnreachable as e:
            log(name_of(event), "WARNING", f"{event} of step {fields['step_id']} not recorded: "
                                           f"{e}", job)
            return
    if not reply.get("ok"):
        raise RuntimeError(f"agent refused {event} of job {job}: {reply.get('error')}")


def name_of(event: str) -> str:
    """The hook that sends ``event``."""
    return "task-prolog" if event == "step_start" else "task-epilog"


def _log_to_hook_log(hook: str, job: str) -> None:
    """Route warnings of the analysis and sinks (Python logging) into the hook log."""
    import logging

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            log(hook, record.levelname, f"{record.name}: {record.getMessage()}", job)

    root = logging.getLogger()
    root.addHandler(Handler(logging.WARNING))
    root.setLevel(logging.WARNING)


def _wait_closed(run_dir: str, timeout: float) -> bool:
    """Wait until the agent has written the final meta.json (``end`` set) of the run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(os.path.join(run_dir, "meta.json")) as f:
                if json.load(f).get("end") is not None:
                    return True
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    return False


def analysis_timeout(cfg: SlurmConfig, run_dir: str) -> tuple[float, float]:
    """``(timeout, run hours)``: ``analysis_timeout_s`` plus ``analysis_timeout_per_hour_s``
    per hour of run, at most ``analysis_timeout_max_s`` (a week-long job needs longer than a
    short one, even streamed)."""
    hours = 0.0
    try:
        with open(os.path.join(run_dir, "meta.json")) as f:
            meta = json.load(f)
        a, b = meta.get("start"), meta.get("end")
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > a:
            hours = (b - a) / 3600.0
    except (OSError, ValueError):
        pass
    t = cfg.analysis_timeout_s + cfg.analysis_timeout_per_hour_s * hours
    return max(cfg.analysis_timeout_s, min(t, cfg.analysis_timeout_max_s)), hours


#: What the supervisor grants the sinks of its own 'stopped' report (its alarm leaves it 120 s).
STOPPED_SINK_BUDGET_S = 60.0


def detached_analysis_config(cfg: SlurmConfig, sink_budget_s: float) -> dict[str, Any]:
    """The config the detached analysis hands the analyzer and the sinks: nobody waits on it,
    so it grants each sink ``sink_budget_s`` instead of the job-end budget."""
    from ..analysis import SINK_BUDGET_KEY
    return {**cfg.as_analysis_config(), SINK_BUDGET_KEY: float(sink_budget_s)}


def analyze_job(run_dir: str, wait_closed: bool = False, finalize: int | None | bool = False
                ) -> int:
    """The detached analysis after the Epilog: closes an orphaned run, then runs the analyzer
    in a child inside a memory/CPU cap (:mod:`.capped`) for at most :func:`analysis_timeout`;
    when the cap or the timeout stops it, the run's report says ``status: partial`` and why.
    Logs; always exit 0."""
    job = os.environ.get("REVEAL_SLURM_JOB_ID", "-")
    try:
        cfg = load_config()
    except ConfigError as e:
        log("analysis", "ERROR", f"configuration error, analysis skipped: {e}", job)
        return 0
    try:
        os.nice(cfg.analysis_nice)
    except OSError:
        pass
    from . import analysis_slots as slots
    t0 = time.monotonic()
    cap = None
    lock = slot = None
    try:
        if job != "-":
            try:
                lock = slots.JobLock(cfg.spool_dir(), job).__enter__()
            except slots.Busy as e:
                log("analysis", "INFO", f"{run_dir}: {e}; this one is skipped", job)
                return 0
            except OSError as e:   # no lock: analyse anyway (never lose a report for it)
                log("analysis", "WARNING", f"{run_dir}: no analysis lock ({e})", job)
            if lock is not None and lock.done == os.path.abspath(run_dir):
                log("analysis", "INFO", f"{run_dir}: already analysed by an earlier Epilog of "
                                        "this job; skipped", job)
                return 0
        if wait_closed and not _wait_closed(run_dir, min(30.0, cfg.analysis_timeout_s / 2)):
            log("analysis", "WARNING", f"{run_dir}: the agent did not close the run in time; "
                                       "analysing what is on disk", job)
        if finalize is not False:
            from ..store.finalize import finalize_orphan
            if finalize_orphan(run_dir, finalize, "epilog") is not None:
                log("analysis", "WARNING", f"{run_dir}: closed the run its agent left open "
                                           "(end = last stored sample)", job)
        timeout, hours = analysis_timeout(cfg, run_dir)
        try:
            slot = slots.acquire_slot(cfg.spool_dir(), cfg.analysis_max_concurrent, timeout)
        except OSError as e:
            log("analysis", "WARNING", f"{run_dir}: no analysis slot lock ({e})", job)
        else:
            if slot is None:
                reason = (f"{cfg.analysis_max_concurrent} other analyses "
                          f"(analysis_max_concurrent) ran for all of its {timeout:.0f} s")
                log("analysis", "ERROR", f"{run_dir}: not analysed: {reason}", job)
                from ..analysis import publish_stopped
                publish_stopped(run_dir, reason,
                                detached_analysis_config(cfg, STOPPED_SINK_BUDGET_S))
                return 0
        # the supervisor itself can never outlive its child by much
        signal.alarm(int(timeout) + 120)
        from .capped import make_cap
        notes: list[str] = []
        cap = make_cap(cfg.analysis_cap, cfg.analysis_memory_max_mb, cfg.analysis_cpu_pct,
                       cfg.analysis_nice, f"job{job}-{os.getpid()}", notes)
        for n in notes:
            log("analysis", "WARNING", f"{run_dir}: {n}", job)
        reason = _run_capped(cap, run_dir, timeout, hours, cfg, job)
        if reason:
            log("analysis", "ERROR", f"{run_dir}: analysis stopped: {reason}; report status "
                                     "partial", job)
            from ..analysis import publish_stopped
            publish_stopped(run_dir, reason,
                            detached_analysis_config(cfg, STOPPED_SINK_BUDGET_S))
        else:
            log("analysis", "INFO", f"{run_dir}: analysed in {time.monotonic() - t0:.1f} s "
                                    f"(cap: {cap.describe()})", job)
        if lock is not None:
            lock.mark_done(os.path.abspath(run_dir))
    except BaseException as e:  # noqa: BLE001
        tb = traceback.extract_tb(e.__traceback__)
        where = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""
        log("analysis", "ERROR", f"{run_dir}: analysis supervisor failed: "
                                 f"{type(e).__name__}: {e}{where}", job)
    finally:
        if cap is not None:
            cap.cleanup()
        signal.alarm(0)
        if slot is not None:
            os.close(slot)
        if lock is not None:
            lock.__exit__(None, None, None)
    return 0


#: Exit status of the analysis child that ran out of memory (MemoryError under an rlimit).
NO_MEMORY = 75


def _run_capped(cap, run_dir: str, timeout: float, hours: float, cfg: SlurmConfig,
                job: str) -> str | None:
    """Run the analysis child under ``cap``; the reason it was stopped, or None."""
    import tempfile
    argv = cap.wrap([sys.executable, "-P", "-m", "reveal_plugins.slurm.cli", "_analyze", "--child",
                     run_dir])
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=err, preexec_fn=cap.preexec(), close_fds=True, cwd="/")
        try:
            rc = p.wait(timeout)
        except subprocess.TimeoutExpired:
            cap.kill(p.pid)
            p.wait()
            return (f"analysis exceeded analysis_timeout_s={cfg.analysis_timeout_s:g} s "
                    f"(+ {cfg.analysis_timeout_per_hour_s:g} s per hour x {hours:.2f} h, at "
                    f"most {cfg.analysis_timeout_max_s:g} s: {timeout:.0f} s) and was stopped")
        err.seek(0)
        tail = err.read()[-600:].decode(errors="replace").strip()
    if rc == 0:
        return None
    if rc == NO_MEMORY or cap.memory_killed(rc):
        return (f"memory cap of {cfg.analysis_memory_max_mb} MB reached "
                f"(analysis_memory_max_mb, {cap.kind})")
    what = f"signal {-rc}" if rc < 0 else f"exit code {rc}"
    return f"analysis process ended with {what}" + (f": {tail.splitlines()[-1]}" if tail else "")


def analyze_child(run_dir: str) -> int:
    """The analysis itself, inside the cap (``_analyze --child``): 0 when it finished (a
    report was written, or the analyzer's failure is logged), :data:`NO_MEMORY` when it ran
    out of memory."""
    job = os.environ.get("REVEAL_SLURM_JOB_ID", "-")
    _log_to_hook_log("analysis", job)
    try:
        cfg = load_config()
    except ConfigError as e:
        log("analysis", "ERROR", f"configuration error, analysis skipped: {e}", job)
        return 0
    try:
        mod, func = cfg.analyzer.split(":", 1)
        import importlib

        from ..trust import require_trusted_module
        require_trusted_module(mod, "analyzer")  # root imports only root-owned code
        fn = getattr(importlib.import_module(mod), func)
        fn(run_dir, detached_analysis_config(cfg, analysis_timeout(cfg, run_dir)[0]))
        if _ran_out_of_memory(run_dir):
            return NO_MEMORY
    except MemoryError:
        return NO_MEMORY
    except BaseException as e:  # noqa: BLE001
        tb = traceback.extract_tb(e.__traceback__)
        where = f" at {tb[-1].filename}:{tb[-1].lineno}" if tb else ""
        log("analysis", "ERROR", f"{run_dir}: analysis failed ({cfg.analyzer}): "
                                 f"{type(e).__name__}: {e}{where}", job)
    return 0


def _ran_out_of_memory(run_dir: str) -> bool:
    """The analysis caught a MemoryError itself (report ``failed``): the cap stopped it."""
    try:
        fd = os.open(os.path.join(run_dir, "report.json"), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd) as f:
            rep = json.load(f)
    except (OSError, ValueError):
        return False
    return rep.get("status") == "failed" and "MemoryError" in str(rep.get("status_reason"))


def process_age() -> float:
    """Seconds since this process (or the wrapper script that exec'ed it) started.

    The budget is what slurmd waits for, so it counts from process start, interpreter
    start-up included (10 ms resolution)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return min(5.0, max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK")))
    except (OSError, ValueError, IndexError):
        return 0.0


def dispatch(name: str, env: dict[str, str] | None = None) -> int:
    """Entry point of ``reveal slurm prolog|epilog|task-prolog|task-epilog``."""
    env = dict(os.environ if env is None else env)
    t0 = time.monotonic() - process_age()
    budget = {"prolog": 0.5, "epilog": 1.0}.get(name, 0.5)
    try:
        cfg = load_config()
    except ConfigError as e:
        log(name, "ERROR", f"configuration error, hook skipped: {e}")
        return 0
    except BaseException as e:  # noqa: BLE001
        log(name, "ERROR", f"cannot load the configuration: {type(e).__name__}: {e}")
        return 0
    if not cfg.enabled:
        return 0
    budget = {"prolog": cfg.prolog_budget_s, "epilog": cfg.epilog_budget_s}.get(name, budget)
    # Keep a margin for the exit itself (interpreter shutdown, wrapper).
    deadline = t0 + budget - min(0.08, budget * 0.15)
    fns = {"prolog": lambda: prolog(cfg, env, deadline),
           "epilog": lambda: epilog(cfg, env, deadline),
           "task-prolog": lambda: task_hook("step_start", cfg, env, deadline),
           "task-epilog": lambda: task_hook("step_end", cfg, env, deadline)}
    # Even when the interpreter start ate the budget, do the (fast) work: the watchdog bounds it.
    return run_hook(name, max(deadline - time.monotonic(), 0.25 * budget), fns[name])
