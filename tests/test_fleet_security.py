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


def _pem_files(tmp_path, key_mode=0o600):
    """A temporary CA-signed certificate and key (Dask's own generator) written as the
    operator would: root-owned files, the key not world-readable."""
    from distributed.security import Security
    tmp = Security.temporary()
    d = tmp_path / "tls"
    d.mkdir(mode=0o755)
    files = {"tls_ca_file": tmp.tls_ca_file, "tls_cert": tmp.tls_scheduler_cert,
             "tls_key": tmp.tls_scheduler_key}
    out = {}
    for k, text in files.items():
        p = d / f"{k}.pem"
        p.write_text(text)
        os.chmod(p, key_mode if k == "tls_key" else 0o644)
        out[k] = str(p)
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="the trust rule applies to root")
def test_tls_files_are_read_once_and_judged_on_what_was_read(tmp_path):
    """Issue 22 (low): the CA, certificate and key are read by ``trust.read_trusted`` and Dask
    gets their contents, never a path it would open later (a file swapped in between would
    choose who joins root's cluster).  A cluster made with those credentials accepts them."""
    from distributed import Client, LocalCluster

    from reveal_plugins.fleet.dask_runtime import FleetRuntimeError, cluster_security
    files = _pem_files(tmp_path)
    sec = cluster_security(scheduler="tls://127.0.0.1:1", config_file="/nonexistent",
                           **files)
    assert sec.tls_ca_file.startswith("-----BEGIN") and sec.tls_client_key.startswith(
        "-----BEGIN"), "Dask must get contents, not paths"
    with LocalCluster(n_workers=1, processes=False, security=sec, dashboard_address=None,
                      protocol="tls", host="127.0.0.1") as cl:
        with Client(cl.scheduler_address, security=sec, timeout=30) as c:
            assert c.submit(lambda: 42).result(timeout=30) == 42
    # refused: a key everyone can read, a file another user owns, something that is no PEM
    os.chmod(files["tls_key"], 0o644)
    with pytest.raises(FleetRuntimeError, match="readable by every user"):
        cluster_security(scheduler="tls://127.0.0.1:1", **files)
    os.chmod(files["tls_key"], 0o600)
    nobody = pwd.getpwnam("nobody")
    os.chown(files["tls_ca_file"], nobody.pw_uid, -1)
    with pytest.raises(FleetRuntimeError, match="refused as root|not root"):
        cluster_security(scheduler="tls://127.0.0.1:1", **files)
    os.chown(files["tls_ca_file"], 0, -1)
    with open(files["tls_cert"], "w") as f:
        f.write("not a certificate\n")
    with pytest.raises(FleetRuntimeError, match="not PEM"):
        cluster_security(scheduler="tls://127.0.0.1:1", **files)
