"""``reveal fleet`` runs as root (it reads every user's job directories): no other local user
may run code through its Dask cluster (issue 22).

The attacker (tests/dask_attacker.py, run as ``nobody`` with no credentials) tries the pass's
scheduler as a Dask client and every TCP listener of the pass's processes with the raw ``run``
RPCs; cluster modes refuse to start without TLS unless ``--insecure`` is given."""
import json
import os
import pwd
import subprocess
import sys

import pytest

pytest.importorskip("distributed")
HERE = os.path.dirname(os.path.abspath(__file__))
CLI = [sys.executable, "-m", "reveal_plugins.cli", "fleet"]


def _listeners(pid: int) -> set[str]:
    """``host:port`` of every TCP socket listening in ``pid`` and its descendants."""
    import psutil
    pids = {pid} | {c.pid for c in psutil.Process(pid).children(recursive=True)}
    out = set()
    for c in psutil.net_connections(kind="inet"):
        if c.status == psutil.CONN_LISTEN and c.pid in pids:
            out.add(f"[{c.laddr.ip}]:{c.laddr.port}" if ":" in c.laddr.ip
                    else f"{c.laddr.ip}:{c.laddr.port}")
    return out


def _as_nobody(argv: list[str], timeout: float):
    nobody = pwd.getpwnam("nobody")
    return subprocess.run(argv, user=nobody.pw_uid, group=nobody.pw_gid, cwd="/",
                          capture_output=True, text=True, timeout=timeout,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_other_user_cannot_run_code_through_the_embedded_cluster():
    """While a root pass's embedded cluster is up, ``nobody`` runs no code through it."""
    try:
        _as_nobody([sys.executable, "-c", "import distributed"], 60).check_returncode()
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"nobody cannot run {sys.executable} with distributed ({e}); "
                    ".ci/run makes the interpreter's directories traversable")
    from reveal_plugins.fleet.dask_runtime import dask_client
    before = _listeners(os.getpid())
    with dask_client(workers=2) as client:
        assert os.getuid() == 0 and set(client.run(os.getuid).values()) == {0}  # the pass works
        ports = sorted(_listeners(os.getpid()) - before)
        targets = [p.replace("0.0.0.0:", "127.0.0.1:").replace("[::]:", "[::1]:") for p in ports]
        p = _as_nobody([sys.executable, os.path.join(HERE, "dask_attacker.py"),
                        client.scheduler.address, *targets], 240)
    tries = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert tries, p.stderr[-3000:]
    ran = [t for t in tries if "uid" in t]
    assert not ran, f"another user ran code in the fleet pass's cluster: {ran}"
    assert len(tries) == 1 + 7 * len(ports) and ports
    # and nothing listens on a routable address (the dashboard listened on every interface)
    assert all(p.startswith("127.") for p in ports), ports


def _refused(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + argv, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "REVEAL_CONFIG": ""})


@pytest.mark.parametrize("mode", [["--scheduler", "tcp://127.0.0.1:9"],
                                  ["--scheduler", "tls://127.0.0.1:9"],
                                  ["--slurm-workers", "1"]])
def test_cluster_modes_refuse_to_start_without_tls(tmp_path, mode):
    """A scheduler other users can reach takes TLS credentials, or an explicit --insecure."""
    r = _refused(["index", str(tmp_path), "--out", str(tmp_path / "F"), *mode])
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "without TLS" in r.stderr and "--tls-ca-file" in r.stderr and \
        "--insecure" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
