"""A real one-node Slurm for tests (session-scoped), with the Reveal hooks wired in.

``slurm_cluster`` installs Slurm if missing (apt, root only), writes a one-node configuration
under a fresh temporary directory (own ports, own munge socket, own spool), starts munged,
slurmctld and slurmd, waits (bounded) for the node to be idle, and stops exactly the daemons
it started -- by PID -- at the end.  Prolog/Epilog run ``reveal slurm prolog|epilog`` through
wrapper scripts that point at the session's hook configuration, hook log and spool; the SPANK
plugin is built from the package source and listed ``optional`` in plugstack.conf.

Other areas use it like::

    def test_x(slurm_cluster):
        job = slurm_cluster.run_batch("#!/bin/sh\\nsrun true\\n")
        assert job.state == "COMPLETED"
        run_dir = slurm_cluster.run_dir(job.job_id)

Test users: ``slurm_users`` gives two non-root accounts (sharing one primary group) that can
submit jobs (``user=`` argument).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

SLURM_PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge", "libslurm-dev"]
TEST_GROUP = "reveal-tg"
TEST_USERS = ("reveal-ta", "reveal-tb")
REPO = pathlib.Path(__file__).resolve().parent.parent


@dataclasses.dataclass
class JobResult:
    job_id: str
    state: str
    exit_code: str
    info: dict


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(pred, timeout: float, what: str, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def _read_pid(path: str) -> int | None:
    try:
        return int(open(path).read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _stop_pid(pid: int | None, timeout: float = 10.0) -> None:
    if not pid:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _ensure_installed() -> str | None:
    """Install the Slurm packages if a binary is missing; return a skip reason or None."""
    need = ("slurmctld", "slurmd", "sbatch", "munged", "gcc")
    if all(shutil.which(b) or os.path.exists(f"/usr/sbin/{b}") for b in need) and \
            os.path.exists("/usr/include/slurm/spank.h"):
        return None
    if shutil.which("apt-get") is None:
        return "Slurm is not installed and apt-get is unavailable"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    pkgs = SLURM_PACKAGES + ([] if shutil.which("gcc") else ["gcc", "libc6-dev"])
    cmd = ["apt-get", "install", "-y", "--no-install-recommends", *pkgs]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        subprocess.run(["apt-get", "update"], capture_output=True, env=env, timeout=600)
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        return f"could not install Slurm ({' '.join(cmd)}): {r.stderr.strip()[-300:]}"
    return None


class SlurmCluster:
    """One running test Slurm; attributes are paths of this session's setup."""

    def __init__(self, base: str):
        self.base = base
        self.conf = os.path.join(base, "etc", "slurm.conf")
        self.spool = os.path.join(base, "spool")
        self.hook_log = os.path.join(base, "log", "reveal-hooks.log")
        self.hook_config_path = os.path.join(base, "etc", "reveal-slurm.toml")
        self.hook_times = os.path.join(base, "log", "hook-times.log")  # "hook job usec rc"
        self.spank_so = os.path.join(base, "lib", "reveal_spank.so")
        self.munge_socket = os.path.join(base, "munge-run", "munge.socket")
        self.node = socket.gethostname().split(".")[0]
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self._pidfiles = {n: os.path.join(base, "run", f"{n}.pid")
                          for n in ("munged", "slurmctld", "slurmd")}
        self.default_hook_config = f'spool = "{self.spool}"\n'
        self.mode = "spank"

    # -- jobs ------------------------------------------------------------------------------
    def _cmd(self, argv: list[str], user: str | None) -> list[str]:
        if user is None:
            return argv
        return ["runuser", "-u", user, "--", "env", f"SLURM_CONF={self.conf}", *argv]

    def workdir(self, user: str | None = None) -> str:
        """A job working directory writable by ``user`` (job output goes there)."""
        d = os.path.join(self.base, "work", user or "root")
        if not os.path.isdir(d):
            os.makedirs(d, mode=0o700)
            if user:
                pw = pwd.getpwnam(user)
                os.chown(d, pw.pw_uid, pw.pw_gid)
        return d

    def sbatch(self, script: str, user: str | None = None, args: tuple[str, ...] = (),
               check: bool = True) -> subprocess.CompletedProcess:
        wd = self.workdir(user)
        path = os.path.join(wd, f"job-{time.time_ns()}.sh")
        with open(path, "w") as f:
            f.write(script)
        if user:
            pw = pwd.getpwnam(user)
            os.chown(path, pw.pw_uid, pw.pw_gid)
        r = subprocess.run(self._cmd(["sbatch", "--parsable", f"--chdir={wd}",
                                      f"--output={wd}/slurm-%j.out", *args, path], user),
                           capture_output=True, text=True, env=self.env, timeout=60)
        if check and r.returncode != 0:
            raise RuntimeError(f"sbatch failed ({r.returncode}): {r.stderr.strip()}")
        return r

    def job_state(self, job_id: str) -> dict:
        r = subprocess.run(["scontrol", "-o", "show", "job", str(job_id)], capture_output=True,
                           text=True, env=self.env, timeout=30)
        out = {}
        for tok in r.stdout.split():
            if "=" in tok:
                k, v = tok.split("=", 1)
                out.setdefault(k, v)
        return out

    def wait(self, job_id: str, timeout: float = 90.0) -> JobResult:
        """Wait until the job has ended and its Epilog has run (node no longer completing)."""
        final = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                 "PREEMPTED", "BOOT_FAIL", "DEADLINE")

        def done():
            st = self.job_state(job_id)
            return st if st.get("JobState") in final and "COMPLETING" not in \
                self.node_state().upper() else None

        st = _wait(done, timeout, f"job {job_id} to finish", 0.2)
        return JobResult(str(job_id), st["JobState"], st.get("ExitCode", ""), st)

    def run_batch(self, script: str, user: str | None = None, args: tuple[str, ...] = (),
                  timeout: float = 90.0) -> JobResult:
        job = self.sbatch(script, user, args).stdout.strip().split(";")[0]
        return self.wait(job, timeout)

    def job_output(self, job: JobResult, user: str | None = None) -> str:
        try:
            return open(os.path.join(self.workdir(user), f"slurm-{job.job_id}.out")).read()
        except OSError:
            return ""

    def srun(self, args: list[str], user: str | None = None,
             timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(self._cmd(["srun", *args], user), capture_output=True, text=True,
                              env=self.env, timeout=timeout, cwd=self.workdir(user))

    def run_dir(self, job_id: str, spool: str | None = None) -> str:
        return os.path.join(spool or self.spool, "jobs", str(job_id), self.node)

    # -- node and hooks --------------------------------------------------------------------
    def node_state(self) -> str:
        r = subprocess.run(["sinfo", "-h", "-N", "-n", self.node, "-o", "%T"],
                           capture_output=True, text=True, env=self.env, timeout=30)
        return r.stdout.strip()

    def resume_node(self) -> None:
        subprocess.run(["scontrol", "update", f"nodename={self.node}", "state=resume"],
                       capture_output=True, env=self.env, timeout=30)

    def hook_wall_times(self, hook: str) -> dict[str, float]:
        """{job_id: seconds} of ``hook`` (prolog/epilog) as measured by its wrapper script."""
        out = {}
        try:
            for line in open(self.hook_times):
                h, job, usec, _rc = line.split()
                if h == hook:
                    out[job] = int(usec) / 1e6
        except OSError:
            pass
        return out

    def log_offset(self) -> int:
        try:
            return os.path.getsize(self.hook_log)
        except OSError:
            return 0

    def hook_log_since(self, offset: int) -> str:
        try:
            with open(self.hook_log, "rb") as f:
                f.seek(offset)
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    @contextlib.contextmanager
    def hook_config(self, text: str | None = None, *, path_override: str | None = None):
        """Use ``text`` as the hooks' TOML configuration for the duration of the block."""
        with open(self.hook_config_path, "w") as f:
            f.write(self.default_hook_config if text is None else text)
        try:
            yield self.hook_config_path
        finally:
            with open(self.hook_config_path, "w") as f:
                f.write(self.default_hook_config)

    def agent_pid(self, spool: str | None = None) -> int | None:
        sock = os.path.join(spool or self.spool, "agent.sock")
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(2)
                s.connect(sock)
                s.sendall(b'{"op": "ping"}\n')
                return json.loads(s.makefile().readline()).get("pid")
        except (OSError, ValueError):
            return None

    def stop_agent(self, spool: str | None = None) -> None:
        """Stop the agent the Prolog started for ``spool`` (by its PID)."""
        spool = spool or self.spool
        pid = self.agent_pid(spool) or _read_pid(os.path.join(spool, ".agent-starter"))
        if pid:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if b"reveal_plugins.agent.daemon" not in f.read():
                        return
            except OSError:
                return
            _stop_pid(pid, 10)

    # -- lifecycle -------------------------------------------------------------------------
    def _write_config(self) -> None:
        b = self.base
        for d in ("etc", "state", "slurmd", "log", "run", "lib", "hooks", "munge", "munge-run",
                  "work", "spool"):
            os.makedirs(os.path.join(b, d), mode=0o755, exist_ok=True)
        hw = subprocess.run(["slurmd", "-C"], capture_output=True, text=True,
                            timeout=30).stdout.splitlines()[0]
        hw = " ".join(t for t in hw.split() if not t.startswith("NodeName="))
        py = sys.executable
        from reveal_plugins.slurm.install import hook_command
        for hook in ("prolog", "epilog", "task-prolog", "task-epilog"):
            p = os.path.join(b, "hooks", hook)
            with open(p, "w") as f:
                f.write("#!/bin/sh\n"
                        f"export REVEAL_SLURM_CONFIG={self.hook_config_path}\n"
                        f"export REVEAL_SLURM_LOG={self.hook_log}\n"
                        f"export PYTHONPATH={REPO}\n"
                        "export REVEAL_SLURM_TIMING=1\n"
                        # Wall time as Slurm sees it (interpreter start included).
                        "t0=$(date +%s%N)\n"
                        f"{hook_command(hook, py)}\n"
                        "rc=$?\n"
                        "t1=$(date +%s%N)\n"
                        f'{{ echo "${{REVEAL_SPANK_DETACHED:+detached-}}{hook} $SLURM_JOB_ID '
                        f'$(( (t1 - t0) / 1000 )) $rc" >> '
                        f"{self.hook_times}; }} 2>/dev/null\n"
                        "exit $rc\n")
            os.chmod(p, 0o755)
        with open(self.hook_config_path, "w") as f:
            f.write(self.default_hook_config)
        os.chmod(self.hook_config_path, 0o644)
        conf = f"""\
ClusterName=revealtest
SlurmctldHost=localhost
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={b}/state
SlurmdSpoolDir={b}/slurmd
SlurmctldPidFile={self._pidfiles['slurmctld']}
SlurmdPidFile={self._pidfiles['slurmd']}
SlurmctldLogFile={b}/log/slurmctld.log
SlurmdLogFile={b}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MailProg=/bin/true
ReturnToService=2
MinJobAge=3600
PrologFlags=Alloc,Contain
{{hook_lines}}PrologEpilogTimeout=30
PlugStackConfig={b}/etc/plugstack.conf
NodeName={self.node} NodeAddr=127.0.0.1 {hw} State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""
        self._conf_template = conf
        self._write_mode_files(self.mode)
        with open(os.path.join(b, "etc", "cgroup.conf"), "w") as f:
            f.write("")
        from reveal_plugins.slurm.spank_build import build
        build(self.spank_so)

    def _write_mode_files(self, mode: str, spank_args: str | None = None) -> None:
        """slurm.conf and plugstack.conf for a hook mode (see :meth:`hook_mode`)."""
        b = self.base
        hook_lines = (f"Prolog={b}/hooks/prolog\nEpilog={b}/hooks/epilog\n"
                      if mode in ("scripts", "tasks") else "")
        if mode == "tasks":
            hook_lines += f"TaskProlog={b}/hooks/task-prolog\nTaskEpilog={b}/hooks/task-epilog\n"
        with open(self.conf, "w") as f:
            f.write(self._conf_template.replace("{hook_lines}", hook_lines))
        args = spank_args if spank_args is not None else f"spool={self.spool}"
        if mode == "spank" and "hooks=" not in args:
            args += f" hooks={b}/hooks timing={self.hook_times}"
        with open(os.path.join(b, "etc", "plugstack.conf"), "w") as f:
            if mode != "tasks":  # tasks: no SPANK plugin at all, TaskProlog/TaskEpilog instead
                f.write(f"optional {self.spank_so} {args}\n")
        self.mode = mode

    @contextlib.contextmanager
    def hook_mode(self, mode: str):
        """Switch how jobs reach the agent, for the duration of the block.

        ``spank`` (the default, recommended): the SPANK plugin's job_prolog/job_epilog do it in
        C and run the Python hooks detached.  ``scripts``: slurm.conf Prolog=/Epilog= run
        ``reveal slurm prolog|epilog`` and the plugin only reports steps.  ``tasks``: no SPANK
        plugin; Prolog/Epilog plus TaskProlog/TaskEpilog scripts report the steps.
        """
        old = self.mode
        self._write_mode_files(mode)
        self._reconfigure()
        try:
            yield self
        finally:
            self._write_mode_files(old)
            self._reconfigure()

    @contextlib.contextmanager
    def spank_args(self, args: str):
        """Use ``args`` as the plugin's plugstack.conf arguments (re-read for every job)."""
        self._write_mode_files(self.mode, args)
        try:
            yield
        finally:
            self._write_mode_files(self.mode)

    @contextlib.contextmanager
    def proctrack(self, kind: str):
        """Run slurmd with ``ProctrackType=proctrack/<kind>`` for the block (slurmd restarts:
        the process-tracking plugin is chosen at start-up)."""
        old = self._conf_template
        self._conf_template = old.replace("ProctrackType=proctrack/linuxproc",
                                          f"ProctrackType=proctrack/{kind}")
        self._write_mode_files(self.mode)
        self._restart_slurmd()
        try:
            yield self
        finally:
            self._conf_template = old
            self._write_mode_files(self.mode)
            self._restart_slurmd()

    def _restart_slurmd(self) -> None:
        _stop_pid(_read_pid(self._pidfiles["slurmd"]), 15)
        subprocess.run(["scontrol", "reconfigure"], capture_output=True, env=self.env,
                       timeout=60)
        r = subprocess.run(["slurmd", "-f", self.conf, "-N", self.node], capture_output=True,
                           text=True, env=self.env, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"slurmd failed to restart: {r.stderr.strip()}")
        _wait(lambda: self.node_state().startswith("idle"), 60, "the node after a slurmd "
              "restart", 0.3)

    def _reconfigure(self) -> None:
        subprocess.run(["scontrol", "reconfigure"], capture_output=True, env=self.env,
                       timeout=60, check=True)
        _wait(lambda: self.node_state().startswith("idle"), 60, "the node after reconfigure",
              0.2)

    def _start_munge(self) -> None:
        b = self.base
        mu = pwd.getpwnam("munge")
        key = os.path.join(b, "munge", "munge.key")
        if os.path.exists("/etc/munge/munge.key"):
            shutil.copyfile("/etc/munge/munge.key", key)
        else:
            with open(key, "wb") as f:
                f.write(os.urandom(1024))
        for p in (os.path.join(b, "munge"), os.path.join(b, "munge-run")):
            os.chown(p, mu.pw_uid, mu.pw_gid)
        os.chmod(os.path.join(b, "munge"), 0o700)
        os.chown(key, mu.pw_uid, mu.pw_gid)
        os.chmod(key, 0o600)
        pidf = os.path.join(b, "munge-run", "munged.pid")
        r = subprocess.run(["runuser", "-u", "munge", "--", "munged", f"--socket={self.munge_socket}",
                            f"--key-file={key}", f"--pid-file={pidf}",
                            f"--log-file={b}/munge/munged.log",
                            f"--seed-file={b}/munge/munged.seed"],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"munged failed to start: {r.stderr.strip()}")
        self._pidfiles["munged"] = pidf
        _wait(lambda: os.path.exists(self.munge_socket), 10, "the munge socket")

    def start(self) -> None:
        self._write_config()
        self._start_munge()
        for argv in (["slurmctld", "-c", "-f", self.conf],
                     ["slurmd", "-f", self.conf, "-N", self.node]):
            r = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=60)
            if r.returncode != 0:
                raise RuntimeError(f"{argv[0]} failed to start ({r.returncode}): "
                                   f"{r.stderr.strip()}; see {self.base}/log")
        _wait(lambda: self.node_state().startswith("idle"), 60,
              f"node {self.node} to be idle (see {self.base}/log)", 0.3)

    def stop(self) -> None:
        self.stop_agent()
        for name in ("slurmd", "slurmctld", "munged"):
            _stop_pid(_read_pid(self._pidfiles[name]), 10)


def _ensure_users() -> list[str]:
    """Create the two test users (sharing a primary group); return the ones created here."""
    created = []
    if subprocess.run(["getent", "group", TEST_GROUP], capture_output=True).returncode != 0:
        subprocess.run(["groupadd", TEST_GROUP], check=True, capture_output=True)
        created.append("group:" + TEST_GROUP)
    for u in TEST_USERS:
        try:
            pwd.getpwnam(u)
        except KeyError:
            subprocess.run(["useradd", "-M", "-N", "-g", TEST_GROUP, "-d", "/nonexistent",
                            "-s", "/bin/sh", u], check=True, capture_output=True)
            created.append(u)
    return created


@pytest.fixture(scope="session")
def slurm_users():
    """Two non-root accounts sharing one primary group (created if missing, removed after)."""
    if os.geteuid() != 0:
        pytest.skip("creating test users needs root")
    if shutil.which("useradd") is None:
        pytest.skip("useradd not available")
    created = _ensure_users()
    yield list(TEST_USERS)
    for u in created:
        if u.startswith("group:"):
            continue
        subprocess.run(["userdel", u], capture_output=True)
    if "group:" + TEST_GROUP in created:
        subprocess.run(["groupdel", TEST_GROUP], capture_output=True)


@pytest.fixture(scope="session")
def slurm_cluster(slurm_users):
    """A running one-node Slurm with the Reveal hooks and SPANK plugin (see module docstring)."""
    if os.geteuid() != 0:
        pytest.skip("a real Slurm needs root (daemons, Prolog/Epilog as root)")
    reason = _ensure_installed()
    if reason:
        pytest.skip(reason)
    base = tempfile.mkdtemp(prefix="reveal-slurm-")
    os.chmod(base, 0o755)
    cluster = SlurmCluster(base)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    yield cluster
    cluster.stop()
    if not os.environ.get("REVEAL_KEEP_SLURM"):
        shutil.rmtree(base, ignore_errors=True)
