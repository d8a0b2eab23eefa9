"""A real multi-node job on one machine (``examples/multinode.sh``): N nodes, each with its own
network namespace, interface, CPU set, host name, PID namespace and agent, one gloo DDP job.

``multinode`` yields a :class:`Multinode` whose ``start(seconds, *args)`` launches the example
(args such as ``--fault cpu --node 2``) and returns a :class:`MultinodeRun`: parsed node lines,
``wait_ready()``, ``inject_cpu(k)`` / ``inject_tbf(k)`` for faults of the test's own, and
``finish()`` -> the job report.  Whatever happens, the fixture ends the example (its trap tears
the nodes down) and removes any fault it injected.  Needs root, unshare, torch: skipped with
the reason otherwise.  ``leftovers(prefix)`` lists what a run left behind (namespaces,
processes), for tests that check the teardown.
"""
import importlib.util
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parent.parent / "examples" / "multinode.sh"
NODE_LINE = re.compile(r"^node=(\S+) netns=(\S+) dev=(\S+) cpus=([0-9,-]+)$")


@dataclass
class NodeLine:
    host: str
    netns: str
    dev: str
    cpus: str


def leftovers(prefix: str, *needles: str) -> list[str]:
    """Namespaces named ``prefix*`` and processes whose command line mentions ``prefix`` (the
    example's temporary directory is named by it: agents, slurmd, munged) or a needle (e.g.
    the spool: launchers, workers)."""
    out = [f"netns {ln.split()[0]}" for ln in
           subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
           .splitlines() if ln.startswith(prefix)]
    me = os.getpid()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == me:
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(n in cmd for n in (f"{prefix}-", f".{prefix}.", *needles)):
            out.append(f"process {pid}: {cmd[:120]}")
    with open("/proc/self/mountinfo") as f:     # the machine's /proc bound for the agents
        out += [f"mount {ln.split()[4]}" for ln in f if f".{prefix}." in ln.split()[4]]
    return out


@dataclass
class MultinodeRun:
    proc: subprocess.Popen
    spool: str
    lines: list[str] = field(default_factory=list)
    nodes: list[NodeLine] = field(default_factory=list)
    ready: bool = False
    stderr: str = ""
    _hogs: list[subprocess.Popen] = field(default_factory=list)
    _tbf: list[tuple[str, str]] = field(default_factory=list)

    def _line(self, timeout: float) -> str | None:
        import select
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not r:
            return None
        ln = self.proc.stdout.readline()
        if ln == "":
            return None
        ln = ln.rstrip("\n")
        self.lines.append(ln)
        m = NODE_LINE.match(ln)
        if m:
            self.nodes.append(NodeLine(*m.groups()))
        elif ln == "ready":
            self.ready = True
        return ln

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready and time.monotonic() < deadline:
            if self._line(max(0.1, deadline - time.monotonic())) is None \
                    and self.proc.poll() is not None:
                break
        if not self.ready:
            raise AssertionError(f"no 'ready' within {timeout} s; stdout {self.lines}, "
                                 f"stderr {self._stderr_now()}")

    @property
    def prefix(self) -> str:
        return self.nodes[0].netns.rsplit("-", 1)[0] if self.nodes else "rmn"

    def inject_cpu(self, k: int, seconds: float) -> None:
        """A CPU hog on node ``k``'s CPU set (what an operator's neighbour job would do)."""
        cpus = self.nodes[k - 1].cpus
        self._hogs.append(subprocess.Popen(
            ["taskset", "-c", cpus, "stress-ng", "--cpu", "1", "--timeout", f"{seconds}s",
             "-q"], start_new_session=True))

    def inject_tbf(self, k: int, rate: str = "20mbit") -> None:
        n = self.nodes[k - 1]
        subprocess.run(["ip", "netns", "exec", n.netns, "tc", "qdisc", "replace", "dev", n.dev,
                        "root", "tbf", "rate", rate, "burst", "32kb", "latency", "50ms"],
                       check=True)
        self._tbf.append((n.netns, n.dev))

    def _stderr_now(self) -> str:
        return self.stderr

    def finish(self, timeout: float = 120.0) -> dict:
        """Wait for the end; return the job report named by the last line (``report=``)."""
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"multinode.sh did not end within {timeout} s")
        self.stderr += err
        for ln in out.splitlines():
            self.lines.append(ln)
            m = NODE_LINE.match(ln)
            if m:
                self.nodes.append(NodeLine(*m.groups()))
            self.ready = self.ready or ln == "ready"
        self.cleanup_faults()
        assert self.proc.returncode == 0, f"exit {self.proc.returncode}: {self.stderr[-2000:]}"
        last = self.lines[-1] if self.lines else ""
        assert last.startswith("report="), f"last line {last!r}; stderr {self.stderr[-2000:]}"
        with open(last[len("report="):]) as f:
            return json.load(f)

    def cleanup_faults(self) -> None:
        for h in self._hogs:
            if h.poll() is None:
                os.killpg(h.pid, signal.SIGKILL)
            h.wait()
        self._hogs.clear()
        for ns, dev in self._tbf:
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"],
                           capture_output=True)
        self._tbf.clear()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()   # the example's trap tears the nodes down
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.cleanup_faults()


class Multinode:
    def __init__(self, spool: pathlib.Path):
        self.spool = spool
        self.runs: list[MultinodeRun] = []

    def start(self, seconds: int = 30, *args: str) -> MultinodeRun:
        cmd = ["bash", str(EXAMPLE), "--seconds", str(seconds), "--spool", str(self.spool),
               *args]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
        run = MultinodeRun(p, str(self.spool))
        self.runs.append(run)
        return run


def _multinode_skip() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network, UTS and PID namespaces)"
    for c in ("ip", "tc", "unshare", "taskset", "stress-ng", "reveal-torchrun"):
        if shutil.which(c) is None:
            return f"{c} not found"
    if (os.cpu_count() or 1) < 2:
        return "needs 2 CPUs (one per node)"
    if importlib.util.find_spec("torch") is None:
        return "torch not installed"
    r = subprocess.run(["unshare", "--uts", "--pid", "--fork", "--mount-proc", "true"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return f"unshare refused namespaces: {r.stderr.strip()}"
    return None


@pytest.fixture
def multinode(tmp_path):
    why = _multinode_skip()
    if why:
        pytest.skip(why)
    m = Multinode(tmp_path / "spool")
    try:
        yield m
    finally:
        for r in m.runs:
            r.stop()
