"""``reveal fleet index SPOOL_OR_RUN_DIRS... --out FLEET``: the fleet index, built incrementally.

Layout (hive-partitioned Parquet, zstd; pandas, polars, DuckDB and pyarrow read it as is)::

    FLEET/runs/day=YYYY-MM-DD/part-*.parquet       one row per run (identity, findings)
    FLEET/anomalies/day=YYYY-MM-DD/part-*.parquet  one row per anomaly
    FLEET/features/day=YYYY-MM-DD/part-*.parquet   one row per run x channel (window means)
    FLEET/_manifest.parquet                        run_dir, run_key, signature, day, part
    FLEET/_fleet.json                              format version and counts

``day`` is the UTC day the run started.  A pass extracts only runs that are new or whose
``meta.json``/``report.json``/``events.jsonl``/``segments`` changed (size or mtime); rows of
a changed run are removed from the part files that held them.  One pass at a time (a lock).
"""
from __future__ import annotations

import fcntl
import json
import os
import time
import uuid
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from .extract import extract_batch

FORMAT = "reveal.fleet/1"
DATASETS = ("runs", "anomalies", "features")
MANIFEST = "_manifest.parquet"

_S, _F, _I = pa.string(), pa.float64(), pa.int64()
SCHEMAS = {
    "runs": pa.schema([
        ("run_key", _S), ("run_dir", _S), ("run_id", _S), ("source", _S), ("job_id", _S),
        ("step_id", _S), ("user", _S), ("node", _S), ("partition", _S), ("account", _S),
        ("workload", _S), ("command", _S), ("start", _F), ("end", _F), ("duration_s", _F),
        ("exit_code", _I), ("status", _S), ("status_reason", _S), ("analysed", pa.bool_()),
        ("n_anomalies", _I), ("anomalous", pa.bool_()), ("subsystems", pa.list_(_S)),
        ("dominant_subsystem", _S), ("max_score", _F), ("anomaly_s", _F),
        ("peer_suspects", pa.list_(_S)), ("samples", _I), ("channels", _I),
        ("indexed_at", _F), ("error", _S)]),
    "anomalies": pa.schema([
        ("run_key", _S), ("node", _S), ("user", _S), ("workload", _S), ("job_id", _S),
        ("anomaly_id", _S), ("subsystem", _S), ("score", _F), ("start", _F), ("end", _F),
        ("duration_s", _F), ("top_channel", _S), ("top_deviation", _F), ("hint", _S),
        ("severity", _S)]),
    "features": pa.schema([
        ("run_key", _S), ("workload", _S), ("node", _S), ("channel", _S), ("unit", _S),
        ("windows", _I), ("mean", _F), ("median", _F), ("mad", _F), ("p05", _F),
        ("p95", _F)]),
}
MANIFEST_SCHEMA = pa.schema([("run_dir", _S), ("run_key", _S), ("signature", _S),
                             ("day", _S), ("part", _S)])


class FleetError(RuntimeError):
    """A fleet directory cannot be used; the message names the path."""


def discover(paths: Iterable[str], max_depth: int = 6) -> list[str]:
    """Run directories under ``paths`` (a directory holding ``meta.json`` is a run; a spool's
    ``jobs/<id>/<host>`` and ``reveal-runs/*`` are found the same way).  Symlinks are never
    followed, so a user's link cannot pull another tree into the index."""
    found: list[str] = []
    for p in paths:
        p = os.path.abspath(p)
        if not os.path.isdir(p):
            raise FleetError(f"{p}: not a directory")
        stack = [(p, 0)]
        while stack:
            d, depth = stack.pop()
            # any meta.json entry makes a run (a symlink or FIFO there is then a row with
            # an error an operator sees, not a directory silently skipped)
            if os.path.lexists(os.path.join(d, "meta.json")):
                found.append(d)
                continue
            if depth >= max_depth:
                continue
            try:
                with os.scandir(d) as it:
                    subs = [e.path for e in it if e.is_dir(follow_symlinks=False)
                            and not e.name.startswith(".")]
            except OSError:
                continue
            stack.extend((s, depth + 1) for s in sorted(subs, reverse=True))
    return sorted(set(found))


def _table(name: str, rows: list[dict]) -> pa.Table:
    schema = SCHEMAS[name]
    cols = {f.name: [r.get(f.name) for r in rows] for f in schema}
    return pa.Table.from_pydict(cols, schema=schema)


def _write(path: str, table: pa.Table) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}.tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)


def read_manifest(fleet: str) -> pa.Table:
    path = os.path.join(fleet, MANIFEST)
    if not os.path.exists(path):
        return MANIFEST_SCHEMA.empty_table()
    try:
        return pq.read_table(path).cast(MANIFEST_SCHEMA)
    except Exception as e:
        raise FleetError(f"{path}: unreadable manifest ({type(e).__name__}: {e}); "
                         "remove the fleet directory and index again") from None


def check_fleet(fleet: str) -> None:
    """Raise FleetError unless ``fleet`` is an index written by ``reveal fleet index``."""
    path = os.path.join(fleet, "_fleet.json")
    try:
        with open(path) as f:
            info = json.load(f)
    except FileNotFoundError:
        raise FleetError(f"{fleet}: not a fleet index (no _fleet.json); build one with "
                         "`reveal fleet index SPOOL... --out DIR`") from None
    except ValueError as e:
        raise FleetError(f"{path}: invalid JSON ({e})") from None
    if info.get("format") != FORMAT:
        raise FleetError(f"{path}: key 'format' is {info.get('format')!r}, expected {FORMAT!r}")


def part_files(fleet: str, dataset: str) -> list[str]:
    """The Parquet files of one dataset (sorted; the unit of work of the fleet passes)."""
    root = os.path.join(fleet, dataset)
    out = []
    for dirpath, _, files in os.walk(root):
        out += [os.path.join(dirpath, f) for f in files if f.endswith(".parquet")
                and not f.startswith(".")]
    return sorted(out)


class _PartWriter:
    """Collects extracted runs and writes one part file per dataset and day every
    ``flush_runs`` runs, so memory stays bounded however many runs a pass covers."""

    def __init__(self, fleet: str, pass_id: str, flush_runs: int = 5000):
        self.fleet, self.pass_id, self.flush_runs = fleet, pass_id, flush_runs
        self.seq = 0
        self.buf: dict[tuple[str, str], list[dict]] = {}
        self.n = 0
        self.manifest: list[dict] = []

    def add(self, rec: dict[str, Any]) -> None:
        day = rec["day"]
        part = f"day={day}/part-{self.pass_id}-{self.seq:04d}.parquet"
        self.buf.setdefault(("runs", day), []).append(rec["run"])
        self.buf.setdefault(("anomalies", day), []).extend(rec["anomalies"])
        self.buf.setdefault(("features", day), []).extend(rec["features"])
        self.manifest.append({"run_dir": rec["run"]["run_dir"], "run_key": rec["run"]["run_key"],
                              "signature": rec["signature"], "day": day, "part": part})
        self.n += 1
        if self.n >= self.flush_runs:
            self.flush()

    def flush(self) -> None:
        for (ds, day), rows in self.buf.items():
            if rows or ds == "runs":
                path = os.path.join(self.fleet, ds, f"day={day}",
                                    f"part-{self.pass_id}-{self.seq:04d}.parquet")
                _write(path, _table(ds, rows))
        self.buf = {}
        self.n = 0
        self.seq += 1


def _drop_runs(fleet: str, parts: set[str], keys: set[str]) -> None:
    """Rewrite the part files that hold rows of ``keys`` without them."""
    for part in sorted(parts):
        for ds in DATASETS:
            path = os.path.join(fleet, ds, part)
            if not os.path.exists(path):
                continue
            t = pq.read_table(path, schema=SCHEMAS[ds])
            import pyarrow.compute as pc
            keep = pc.invert(pc.is_in(t.column("run_key"), value_set=pa.array(sorted(keys))))
            t2 = t.filter(keep)
            if t2.num_rows == t.num_rows:
                continue
            if t2.num_rows == 0:
                os.unlink(path)
            else:
                _write(path, t2)


def build_index(paths: list[str], fleet: str, client=None, features: bool = True,
                progress: bool | None = None, flush_runs: int = 5000) -> dict[str, Any]:
    """Index new and changed runs under ``paths`` into ``fleet``; returns counts.

    ``client`` is a ``distributed.Client`` (the extraction runs on its workers), or a
    callable returning a context manager that yields one (entered only when some run is new
    or changed: an unchanged spool starts no cluster); without one the runs are extracted in
    this process (the single-process reference)."""
    os.makedirs(fleet, exist_ok=True)
    lock = open(os.path.join(fleet, ".lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise FleetError(f"{fleet}: another `reveal fleet index` is writing it") from None
    try:
        return _build(paths, fleet, client, features, progress, flush_runs)
    finally:
        lock.close()


def index_batch(run_dirs: list[str], fleet: str, pass_id: str, features: bool = True,
                flush_runs: int = 5000) -> dict[str, Any]:
    """The Dask task: extract a batch of runs and write their part files into ``fleet``
    (workers write, so nothing but the manifest entries travels back to the client and the
    client's memory does not grow with the fleet).  Returns manifest rows and error count."""
    writer = _PartWriter(fleet, f"{pass_id}-{uuid.uuid4().hex[:8]}", flush_runs)
    errors = 0
    for rec in extract_batch(run_dirs, features):
        errors += rec["run"].get("error") is not None
        writer.add(rec)
    writer.flush()
    return {"manifest": writer.manifest, "errors": errors}


def _build(paths, fleet, client, features, progress, flush_runs) -> dict[str, Any]:
    t0 = time.monotonic()
    found = discover(paths)
    old = read_manifest(fleet).to_pylist()
    by_dir = {r["run_dir"]: r for r in old}
    from .extract import signature
    todo = []
    for d in found:
        prev = by_dir.get(d)
        if prev is None or prev["signature"] != signature(d):
            todo.append(d)
    changed = [by_dir[d] for d in todo if d in by_dir]
    # unique per pass (two passes within one second must never overwrite each other's parts)
    pass_id = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"-{uuid.uuid4().hex[:6]}"
    fleet = os.path.abspath(fleet)
    kw = dict(fleet=fleet, pass_id=pass_id, features=features, flush_runs=flush_runs)
    if callable(client) and not hasattr(client, "scheduler_info"):
        if not todo:
            client = None
        else:
            with client() as c:
                return _build_with(todo, changed, old, found, fleet, c, kw, progress, t0)
    return _build_with(todo, changed, old, found, fleet, client, kw, progress, t0)


def _build_with(todo, changed, old, found, fleet, client, kw, progress, t0) -> dict[str, Any]:
    flush_runs = kw["flush_runs"]
    features = kw["features"]
    if client is not None:
        from .dask_runtime import run_tasks
        results = run_tasks(client, index_batch, todo, "indexing runs", progress=progress,
                            **kw)
    else:
        from ..report.progress import Progress
        bar = Progress(enabled=progress)

        def local():
            step = max(1, min(500, flush_runs))
            for i in range(0, len(todo), step):
                bar.update("indexing runs", i, len(todo))
                yield index_batch(todo[i:i + step], **kw)
            bar.done()
        results = local()
    new_manifest: list[dict] = []
    errors = 0
    for res in results:
        new_manifest += res["manifest"]
        errors += res["errors"]
    if changed:   # old rows of re-extracted runs go before the new parts become visible
        _drop_runs(fleet, {r["part"] for r in changed}, {r["run_key"] for r in changed})
    redone = set(todo)
    manifest = [r for r in old if r["run_dir"] not in redone] + new_manifest
    _write(os.path.join(fleet, MANIFEST), pa.Table.from_pylist(manifest, MANIFEST_SCHEMA))
    info = {"format": FORMAT, "updated": time.time(), "runs": len(manifest),
            "datasets": list(DATASETS), "features": features}
    tmp = os.path.join(fleet, "._fleet.json.tmp")
    with open(tmp, "w") as f:
        json.dump(info, f, indent=1)
    os.replace(tmp, os.path.join(fleet, "_fleet.json"))
    return {"found": len(found), "indexed": len(todo), "changed": len(changed),
            "unchanged": len(found) - len(todo), "runs": len(manifest), "errors": errors,
            "seconds": time.monotonic() - t0}
