"""Where the fleet passes run: an embedded Dask cluster, an existing one, or workers that are
Slurm jobs.

Every fleet command takes the same three options (:func:`add_options`):

- default: a ``LocalCluster`` sized to the machine (one single-threaded worker *process* per
  core: the per-run work is Python that holds the GIL, so threads would not add up);
- ``--scheduler ADDRESS``: join a running cluster (``tls://host:8786``);
- ``--slurm-workers N``: start N workers as Slurm jobs through dask-jobqueue's
  ``SLURMCluster`` (the workers run this interpreter, ``sys.executable``, and must reach the
  scheduler on this host; ``--slurm-partition``/``--slurm-account`` pass through).

Whoever connects to a Dask scheduler, nanny or worker runs code in it (``Client.run``), and
the fleet pass runs as root.  So every listener requires mutual TLS: the embedded cluster
with temporary credentials that exist only in its processes' memory, the cluster modes with
the operator's CA, certificate and key (``--tls-*`` or ``[fleet]`` in the config file); a
cluster mode without them is refused unless ``--insecure`` says the operator accepts it.

Dask is imported only here and only when a pass needs it.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import tempfile
from typing import Any, Callable, Iterable, Iterator, Sequence

from ..report.progress import Progress
from .config import TLS_KEYS


class FleetRuntimeError(RuntimeError):
    """Dask is missing or the cluster could not be started/joined; the message says why."""


def add_options(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("where the pass runs (Dask)")
    g.add_argument("--scheduler", metavar="ADDRESS",
                   help="join an existing Dask cluster (e.g. tls://head:8786)")
    g.add_argument("--slurm-workers", type=int, metavar="N",
                   help="start N Dask workers as Slurm jobs (dask-jobqueue)")
    g.add_argument("--slurm-partition", metavar="P", help="partition for --slurm-workers")
    g.add_argument("--slurm-account", metavar="A", help="account for --slurm-workers")
    g.add_argument("--workers", type=int, metavar="N",
                   help="embedded cluster size (default: one worker per core)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g = ap.add_argument_group("TLS for --scheduler/--slurm-workers (default: [fleet] table of "
                              "the config file)")
    g.add_argument("--tls-ca-file", metavar="PEM", help="CA that signed the cluster's certificates")
    g.add_argument("--tls-cert", metavar="PEM",
                   help="certificate of this client (and of the scheduler and Slurm workers "
                   "it starts)")
    g.add_argument("--tls-key", metavar="PEM", help="its private key (if not in --tls-cert)")
    g.add_argument("--insecure", action="store_true",
                   help="allow --scheduler/--slurm-workers without TLS: anyone who reaches "
                   "the scheduler or a worker runs code as the fleet pass's user")


def _config_tls(path: str | None = None) -> tuple[dict[str, str], str | None]:
    """The ``[fleet]`` table of ``$REVEAL_CONFIG`` / ``/etc/reveal/reveal.toml`` (its TLS
    keys that are set) and the file it came from; root reads it only if it passes the trust
    rule."""
    from .. import site_config
    from .config import FleetConfig
    try:
        cfg, path = site_config.table("fleet", FleetConfig, path)
    except site_config.SiteConfigError as e:
        raise FleetRuntimeError(str(e)) from None
    return cfg.model_dump(exclude_none=True), path


def cluster_security(scheduler: str | None = None, slurm_workers: int | None = None,
                     tls_ca_file: str | None = None, tls_cert: str | None = None,
                     tls_key: str | None = None, insecure: bool = False,
                     config_file: str | None = None):
    """The ``distributed.security.Security`` a cluster mode connects with; None for the
    embedded cluster (it makes its own) and for ``insecure`` without credentials.  Raises
    :class:`FleetRuntimeError` before anything starts when TLS is missing or incomplete."""
    if not (scheduler or slurm_workers):
        return None
    tls = {k: v for k, v in zip(TLS_KEYS, (tls_ca_file, tls_cert, tls_key)) if v}
    where = "the command line"
    if not tls:
        tls, cfg = _config_tls(config_file)
        where = f"[fleet] in {cfg}"
    mode = "--scheduler" if scheduler else "--slurm-workers"
    if not tls:
        if not insecure:
            raise FleetRuntimeError(
                f"refusing {mode} without TLS: anyone who can reach the scheduler or a worker "
                "could run code as this user (root for a spool). Pass --tls-ca-file, "
                "--tls-cert and --tls-key (or set tls_ca_file, tls_cert, tls_key in [fleet] "
                "of the config file), or --insecure to accept that")
        print(f"reveal fleet: WARNING: {mode} --insecure: the Dask cluster is not "
              "authenticated; anyone who can reach the scheduler or a worker runs code as "
              f"uid {os.geteuid()}", file=sys.stderr)
        return None
    if "tls_ca_file" not in tls or "tls_cert" not in tls:
        raise FleetRuntimeError(f"TLS from {where} needs both tls_ca_file (--tls-ca-file) and "
                                "tls_cert (--tls-cert)")
    if scheduler and "://" in scheduler and not scheduler.startswith("tls://"):
        raise FleetRuntimeError(f"--scheduler {scheduler}: with TLS the address is tls://...")
    from ..trust import UntrustedPath, read_trusted
    pem: dict[str, str] = {}
    for k, path in tls.items():
        # A CA or key another user can replace lets them join root's cluster: read once,
        # judged on the open descriptor (trust.read_trusted), and hand Dask the contents --
        # checking the path and letting Dask open it later would be a race.
        try:
            st = os.stat(path)
            raw = read_trusted(path, f"TLS file ({k})", max_bytes=1 << 20)
        except (UntrustedPath, OSError) as e:
            raise FleetRuntimeError(str(e)) from None
        if k == "tls_key" and st.st_mode & 0o004:
            raise FleetRuntimeError(f"TLS key {path} is readable by every user (chmod o-r)")
        text = raw.decode("ascii", errors="replace")
        if "-----BEGIN " not in text:
            raise FleetRuntimeError(f"TLS file ({k}) {path}: not PEM (no -----BEGIN line)")
        pem[k] = text if text.endswith("\n") else text + "\n"   # Dask: contents have "\n"
    try:
        from distributed.security import Security
    except ImportError as e:
        raise FleetRuntimeError(f"Dask is not installed ({e}); pip install "
                                "'reveal-plugins[fleet]'") from None
    roles = {f"tls_{r}_{w}": pem.get(f"tls_{w}") for r in ("client", "scheduler", "worker")
             for w in ("cert", "key")}
    return Security(require_encryption=True, tls_ca_file=pem["tls_ca_file"],
                    **{k: v for k, v in roles.items() if v})


def _routable_host() -> str:
    """An address of this host that Slurm nodes can reach (the scheduler listens on it)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent: picks the outgoing address
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


@contextlib.contextmanager
def dask_client(scheduler: str | None = None, slurm_workers: int | None = None,
                workers: int | None = None, slurm_partition: str | None = None,
                slurm_account: str | None = None, slurm_log_dir: str | None = None,
                slurm_timeout_s: float = 120.0, security: Any = None,
                insecure: bool = False) -> Iterator[Any]:
    """A ``distributed.Client`` for one fleet command; closes what it started.  A cluster mode
    needs ``security`` (see :func:`cluster_security`) or ``insecure``; the embedded cluster's
    TLS credentials are temporary (a fresh self-signed CA, in its processes' memory only)."""
    try:
        from distributed import Client, LocalCluster
    except ImportError as e:
        raise FleetRuntimeError(f"Dask is not installed ({e}); pip install "
                                "'reveal-plugins[fleet]'") from None
    if scheduler and slurm_workers:
        raise FleetRuntimeError("--scheduler and --slurm-workers exclude each other")
    if (scheduler or slurm_workers) and security is None and not insecure:
        raise FleetRuntimeError("a cluster mode needs TLS security or insecure=True")
    import dask
    # The statistical profiler samples every task thread every 10 ms: on GIL-bound per-run
    # work it costs ~a quarter of the throughput.  Off here, in the workers started here
    # (they inherit this config) and in Slurm workers (environment of the job script).
    dask.config.set({"distributed.worker.profile.enabled": False})
    cluster = None
    try:
        if scheduler:
            if security is not None and "://" not in scheduler:
                scheduler = "tls://" + scheduler
            client = Client(scheduler, timeout="30s", security=security)
        elif slurm_workers:
            if slurm_workers < 1:
                raise FleetRuntimeError(f"--slurm-workers must be >= 1, got {slurm_workers}")
            try:
                from dask_jobqueue import SLURMCluster
            except ImportError as e:
                raise FleetRuntimeError(f"dask-jobqueue is not installed ({e}); pip install "
                                        "'reveal-plugins[fleet]'") from None
            host = _routable_host()
            kw: dict[str, Any] = dict(
                cores=1, processes=1, memory="2GB", python=sys.executable,
                walltime="01:00:00", job_name="reveal-fleet",
                scheduler_options={"host": host, "dashboard_address": ":0"},
                job_directives_skip=["--mem"],   # sites without memory accounting refuse it
                job_script_prologue=["export DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False"],
                log_directory=slurm_log_dir or tempfile.mkdtemp(prefix="reveal-fleet-slurm-"),
                death_timeout=60, security=security)
            if slurm_partition:
                kw["queue"] = slurm_partition
            if slurm_account:
                kw["account"] = slurm_account
            cluster = SLURMCluster(**kw)
            cluster.scale(jobs=slurm_workers)
            client = Client(cluster)
            try:
                client.wait_for_workers(slurm_workers, timeout=slurm_timeout_s)
            except Exception as e:  # TimeoutError from distributed
                raise FleetRuntimeError(
                    f"{slurm_workers} Slurm worker job(s) did not join the scheduler at "
                    f"{host} within {slurm_timeout_s:.0f} s ({type(e).__name__}); check "
                    "`squeue -n reveal-fleet` and the job logs") from None
        else:
            n = workers or os.cpu_count() or 1
            try:
                from distributed.security import Security
                sec = Security.temporary()
            except ImportError as e:   # cryptography
                raise FleetRuntimeError(f"{e}; pip install 'reveal-plugins[fleet]'") from None
            # Dask's HTTP servers (status pages, metrics) start in any case: loopback only,
            # and with no pages to serve.
            dask.config.set({"distributed.scheduler.http.routes": [],
                             "distributed.worker.http.routes": []})
            cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                   host="127.0.0.1", protocol="tls://", security=sec,
                                   dashboard_address="127.0.0.1:0", silence_logs=40)
            client = Client(cluster, security=sec)
    except FleetRuntimeError:
        if cluster is not None:
            cluster.close()
        raise
    except OSError as e:
        if cluster is not None:
            cluster.close()
        raise FleetRuntimeError(f"cannot reach the Dask scheduler {scheduler or ''}: "
                                f"{e}") from None
    try:
        yield client
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


def security_from_args(args: argparse.Namespace):
    return cluster_security(args.scheduler, args.slurm_workers, args.tls_ca_file,
                            args.tls_cert, args.tls_key, args.insecure)


def client_from_args(args: argparse.Namespace, security: Any = None):
    return dask_client(scheduler=args.scheduler, slurm_workers=args.slurm_workers,
                       workers=args.workers, slurm_partition=args.slurm_partition,
                       slurm_account=args.slurm_account, security=security,
                       insecure=args.insecure)


def _traced(items: list, fn: Callable, **kw) -> tuple[Any, str]:
    """Runs on a worker: the task's result and where it ran (the Slurm job when a worker
    is one: ``slurm:<jobid>``, else ``host:pid``)."""
    job = os.environ.get("SLURM_JOB_ID")
    where = f"slurm:{job}" if job else f"{socket.gethostname()}:{os.getpid()}"
    return fn(items, **kw), where


def run_tasks(client, fn: Callable, items: Sequence, what: str, batch: int = 0,
              progress: bool | None = None, ran_on: set | None = None, **kw) -> Iterable:
    """Map ``fn`` over batches of ``items`` on the cluster (``fn`` takes a list and returns a
    list); yields each batch's result as it completes, with a progress bar on a terminal.

    Batches keep the task count (and the scheduler's overhead) small for 10,000s of runs.
    ``ran_on`` collects where the tasks ran (see :func:`_traced`)."""
    from distributed import as_completed

    items = list(items)
    if not items:
        return
    try:
        info = client.scheduler_info(n_workers=-1)
    except TypeError:   # distributed < 2025: every worker is listed anyway
        info = client.scheduler_info()
    nworkers = max(1, len(info.get("workers", {})))
    if batch <= 0:   # ~8 tasks per worker: balance without per-task overhead
        batch = max(1, min(500, -(-len(items) // (8 * nworkers))))
    chunks = [items[i:i + batch] for i in range(0, len(items), batch)]
    futs = client.map(_traced, chunks, fn=fn, pure=False, **kw)
    sizes = {f.key: len(c) for f, c in zip(futs, chunks)}
    done = 0
    with Progress(enabled=progress) as bar:
        bar.update(what, 0, len(items))
        for fut in as_completed(futs):
            res, where = fut.result()
            if ran_on is not None:
                ran_on.add(where)
            done += sizes[fut.key]
            bar.update(what, min(done, len(items)), len(items))
            fut.release()
            yield res
