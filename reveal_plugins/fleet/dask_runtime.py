"""Where the fleet passes run: an embedded Dask cluster, an existing one, or workers that are
Slurm jobs.

Every fleet command takes the same three options (:func:`add_options`):

- default: a ``LocalCluster`` sized to the machine (one single-threaded worker *process* per
  core: the per-run work is Python that holds the GIL, so threads would not add up);
- ``--scheduler ADDRESS``: join a running cluster (``tcp://host:8786``);
- ``--slurm-workers N``: start N workers as Slurm jobs through dask-jobqueue's
  ``SLURMCluster`` (the workers run this interpreter, ``sys.executable``, and must reach the
  scheduler on this host; ``--slurm-partition``/``--slurm-account`` pass through).

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


class FleetRuntimeError(RuntimeError):
    """Dask is missing or the cluster could not be started/joined; the message says why."""


def add_options(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("where the pass runs (Dask)")
    g.add_argument("--scheduler", metavar="ADDRESS",
                   help="join an existing Dask cluster (e.g. tcp://head:8786)")
    g.add_argument("--slurm-workers", type=int, metavar="N",
                   help="start N Dask workers as Slurm jobs (dask-jobqueue)")
    g.add_argument("--slurm-partition", metavar="P", help="partition for --slurm-workers")
    g.add_argument("--slurm-account", metavar="A", help="account for --slurm-workers")
    g.add_argument("--workers", type=int, metavar="N",
                   help="embedded cluster size (default: one worker per core)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


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
                slurm_timeout_s: float = 120.0) -> Iterator[Any]:
    """A ``distributed.Client`` for one fleet command; closes what it started."""
    try:
        from distributed import Client, LocalCluster
    except ImportError as e:
        raise FleetRuntimeError(f"Dask is not installed ({e}); pip install "
                                "'reveal-plugins[fleet]'") from None
    if scheduler and slurm_workers:
        raise FleetRuntimeError("--scheduler and --slurm-workers exclude each other")
    import dask
    # The statistical profiler samples every task thread every 10 ms: on GIL-bound per-run
    # work it costs ~a quarter of the throughput.  Off here, in the workers started here
    # (they inherit this config) and in Slurm workers (environment of the job script).
    dask.config.set({"distributed.worker.profile.enabled": False})
    cluster = None
    try:
        if scheduler:
            client = Client(scheduler, timeout="30s")
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
                death_timeout=60)
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
            cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                                   dashboard_address=":0", silence_logs=40)
            client = Client(cluster)
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


def client_from_args(args: argparse.Namespace):
    return dask_client(scheduler=args.scheduler, slurm_workers=args.slurm_workers,
                       workers=args.workers, slurm_partition=args.slurm_partition,
                       slurm_account=args.slurm_account)


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
