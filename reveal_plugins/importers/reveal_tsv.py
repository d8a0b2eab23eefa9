"""Reveal's released telemetry (TSV) -> run directories (``reveal import reveal-tsv``).

The format of the Reveal paper's public dataset: one TSV file per job, the first column a
timestamp (unix s/ms/us or an ISO date), then one column per channel named
``Family:metric.index.host[unit]``, rows every 100 ms.  Families and what they become here:

==========================  ===========================================  =================
family                      channel                                      kind
==========================  ===========================================  =================
Perf                        ``cpu.perf[.<index>].<metric>``              gauge (per row)
Turbostat                   ``cpu.turbostat[.<index>].<metric>``         gauge
CPU                         ``cpu.core<index>.<metric>`` / ``cpu.all.``  gauge
Memory                      ``memory[.<index>].<metric>``                gauge
Meminfo_diff                ``memory[.<index>].<metric>``                counter (deltas)
Storage / Storage_diff      ``storage.<index>.<metric>``                 gauge / counter
``GPU: `` (with a space)    ``gpu.<index>.<metric>``                     gauge
NetworkInterStat_diff       ``network.<index>.<metric>``                 counter (deltas)
NetworkProtocolCounts       ``network.proto[.<index>].<metric>``         gauge
NetworkTCPRetrans_diff      ``network.tcp[.<index>].<metric>``           counter (deltas)
==========================  ===========================================  =================

``_diff`` columns hold per-row deltas: they are summed into cumulative counters, which the
analysis turns back into rates per second (so a delta and a rate read the same); deltas that
go negative (of a level such as ``Dirty``) add up to that level, stored as a gauge.  An index is
kept in the name only where a family has several for that metric.  Quirks handled: all-NaN
columns are dropped (listed in ``meta.json`` ``import.dropped``), the space after ``GPU:``,
and IPC stored x100 on some Intel GPU hosts (a Perf ``ipc`` whose median exceeds 20 is
divided by 100, noted in ``import.notes``).  One run directory per host in the file.
"""
from __future__ import annotations

import datetime
import os
import re
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

COLUMN_RE = re.compile(r"^\s*(?P<family>[A-Za-z][A-Za-z0-9_]*)\s*:\s*(?P<rest>[^\[\]]+?)\s*"
                       r"\[(?P<unit>[^\]]*)\]\s*$")
FAMILIES = {  # family -> (subsystem prefix, deltas?)
    "perf": ("cpu.perf", False), "turbostat": ("cpu.turbostat", False), "cpu": ("cpu", False),
    "memory": ("memory", False), "meminfo_diff": ("memory", True),
    "storage": ("storage", False), "storage_diff": ("storage", True), "gpu": ("gpu", False),
    "networkinterstat_diff": ("network", True), "networkprotocolcounts": ("network.proto",
                                                                        False),
    "networktcpretrans_diff": ("network.tcp", True)}
IPC_X100_MEDIAN = 20.0   # no CPU retires 20 instructions per cycle: such an IPC is x100


class TSVFormatError(ValueError):
    """The file is not in the Reveal TSV format; the message names file, line and column."""


@dataclass
class Column:
    index: int        # position in the file (0 = timestamp)
    raw: str
    family: str
    metric: str
    dev: str          # the "index" field: core, GPU, device, interface ...
    host: str
    unit: str


def parse_header(path: str, header: str) -> tuple[str, list[Column]]:
    names = header.rstrip("\r\n").split("\t")
    if len(names) < 2:
        raise TSVFormatError(f"{path}:1: expected a timestamp column and telemetry columns "
                           f"separated by tabs, got {len(names)} column(s)")
    cols = []
    for i, raw in enumerate(names[1:], 1):
        m = COLUMN_RE.match(raw)
        if not m:
            raise TSVFormatError(f"{path}:1: column {i + 1} {raw!r} is not "
                               "'Family:metric.index.host[unit]'")
        parts = m.group("rest").strip().split(".")
        if len(parts) >= 3:   # from the right: metrics may hold dots (nvidia-smi names)
            metric, dev, host = ".".join(parts[:-2]), parts[-2], parts[-1]
        elif len(parts) == 2:
            metric, dev, host = parts[0], "", parts[1]
        else:
            metric, dev, host = parts[0], "", "unknown"
        cols.append(Column(i, raw, m.group("family"), metric, dev, host, m.group("unit")))
    return names[0], cols


#: nvidia-smi query names -> the NVML probe's channel names (GPU derivations and symptoms)
GPU_ALIASES = {"utilization_gpu": "util_sm", "utilization_memory": "util_mem",
               "temperature_gpu": "temp", "temperature_memory": "memory_temp",
               "clocks_sm": "clock_sm", "clocks_current_sm": "clock_sm",
               "clocks_max_sm": "clock_sm_max", "power_draw": "power",
               "power_limit": "power_limit", "memory_used": "mem_used",
               "memory_total": "mem_total"}
#: Perf metrics that are ratios: averaged over cores, not summed.
_RATIO = re.compile(r"(ipc|ratio|pct|percent|rate)$")


def _slug(s: str) -> str:
    s = s.replace("%", "pct")
    return re.sub(r"[^A-Za-z0-9_]+", "_", s).strip("_") or "x"


def _path_part(s: str) -> str:
    """A host name as one safe path component."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s).lstrip(".") or "host"


def channel_names(cols: list[Column]) -> tuple[list[str], list[bool], list[str]]:
    """Channel name and delta flag per column, plus notes (unknown families)."""
    notes = []
    devs: dict[tuple[str, str, str], set[str]] = {}
    for c in cols:
        devs.setdefault((c.host, c.family.lower(), c.metric), set()).add(c.dev)
    names, deltas, used = [], [], set()
    unknown = set()
    for c in cols:
        fam = c.family.lower()
        prefix, delta = FAMILIES.get(fam, (None, fam.endswith("_diff")))
        if prefix is None:
            prefix = f"system.{_slug(fam)}"
            unknown.add(c.family)
        metric, dev = _slug(c.metric), _slug(c.dev) if c.dev else ""
        several = len(devs[(c.host, fam, c.metric)]) > 1
        if prefix == "gpu":
            metric = GPU_ALIASES.get(metric.lower(), metric)
            name = f"gpu.{dev or '0'}.{metric}"
        elif prefix == "cpu.perf":      # aggregated over cores (see aggregate_perf)
            name = f"cpu.perf.{metric.lower()}"
        elif prefix == "cpu":
            name = f"cpu.core{dev}.{metric}" if dev.isdigit() else f"cpu.all.{metric}"
        elif prefix in ("storage", "network"):
            name = f"{prefix}.{dev or 'all'}.{metric}"
        else:
            name = f"{prefix}.{dev}.{metric}" if several and dev else f"{prefix}.{metric}"
        key = (c.host, name)
        if key in used and prefix != "cpu.perf":   # Storage and Storage_diff of one metric
            name = f"{name}_{_slug(fam)}"
            key = (c.host, name)
        used.add(key)
        names.append(name)
        deltas.append(delta)
    for f in sorted(unknown):
        notes.append(f"family {f!r} is not one of Reveal's; its columns are system.* gauges")
    return names, deltas, notes


def parse_times(path: str, raw: list[str]) -> np.ndarray:
    """Unix seconds from the timestamp column (s, ms or us numbers, or ISO dates, UTC)."""
    try:
        v = np.array([float(x) for x in raw])
        med = float(np.nanmedian(v)) if len(v) else 0.0
        return v / (1e6 if med > 1e14 else 1e3 if med > 1e11 else 1.0)
    except ValueError:
        pass
    out = np.empty(len(raw))
    for i, s in enumerate(raw):
        try:
            d = datetime.datetime.fromisoformat(s.strip().replace("Z", "+00:00"))
        except ValueError:
            raise TSVFormatError(f"{path}:{i + 2}: timestamp {s!r} is neither a number nor an "
                               "ISO date") from None
        if d.tzinfo is None:
            d = d.replace(tzinfo=datetime.timezone.utc)
        out[i] = d.timestamp()
    return out


def read_tsv(path: str) -> tuple[np.ndarray, list[Column], np.ndarray]:
    """``(t, columns, values (rows, columns))``; NaN where a cell is empty or NaN."""
    import pyarrow as pa
    import pyarrow.csv as pcsv

    with open(path, "rb") as f:
        first = f.readline().decode("utf-8", "replace")
    tname, cols = parse_header(path, first)
    names = [tname] + [c.raw for c in cols]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise TSVFormatError(f"{path}:1: column {dup!r} appears twice")
    types = {c.raw: pa.float64() for c in cols}
    types[tname] = pa.string()
    try:
        table = pcsv.read_csv(
            path, read_options=pcsv.ReadOptions(column_names=names, skip_rows=1),
            parse_options=pcsv.ParseOptions(delimiter="\t"),
            convert_options=pcsv.ConvertOptions(
                column_types=types, strings_can_be_null=False,
                null_values=["", "nan", "NaN", "NAN", "-nan", "NA", "null", "None", "-"]))
    except pa.ArrowInvalid as e:
        msg = str(e)
        m = re.search(r"[Rr]ow #?(\d+)", msg)
        where = f"{path}:{int(m.group(1)) + 1}" if m else path
        raise TSVFormatError(f"{where}: {msg.splitlines()[0]}") from None
    t = parse_times(path, table.column(0).to_pylist())
    V = np.empty((table.num_rows, len(cols)))
    for j, c in enumerate(cols):
        V[:, j] = table.column(j + 1).to_numpy(zero_copy_only=False)
    return t, cols, V


def import_file(path: str, out_dir: str, job_id: str | None = None, user: str | None = None,
                workload: str | None = None, segment_s: float = 10.0) -> list[str]:
    """Write one run directory per host of ``path`` under ``out_dir/<file stem>/<host>``."""
    from ..store.store import SegmentWriter, write_meta
    from ..types import ChannelMeta

    t, cols, V = read_tsv(path)
    if len(t) == 0:
        raise TSVFormatError(f"{path}: no data rows")
    bad = ~np.isfinite(t)
    if bad.any():
        raise TSVFormatError(f"{path}:{int(np.argmax(bad)) + 2}: missing timestamp")
    order = np.argsort(t, kind="stable")
    t, V = t[order], V[order]
    names, deltas, notes = channel_names(cols)
    # one safe path component below --out ("...tsv" would otherwise give "..")
    stem = re.sub(r"\.(tsv|txt|csv)(\.gz)?$", "", os.path.basename(path)).lstrip(".") or "run"
    dt = np.diff(t)
    interval = float(np.median(dt[dt > 0])) if (dt > 0).any() else 0.1
    written = []
    for host in sorted({c.host for c in cols}):
        idx = [j for j, c in enumerate(cols) if c.host == host]
        hnotes = list(notes)
        dropped = []
        metas, data = [], []
        groups: dict[str, list[int]] = {}
        for j in idx:
            if not np.isfinite(V[:, j]).any():
                dropped.append(cols[j].raw)
                continue
            groups.setdefault(names[j], []).append(j)
        for name, js in groups.items():
            j, c = js[0], cols[js[0]]
            if len(js) == 1:
                col = V[:, j].copy()
            else:   # Perf per core -> one host-wide channel (the symptoms are host-wide)
                with np.errstate(invalid="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    block = V[:, js]
                    col = (np.nanmean(block, axis=1) if _RATIO.search(name)
                           else np.where(np.isfinite(block).any(axis=1),
                                         np.nansum(block, axis=1), np.nan))
                hnotes.append(f"{name}: {len(js)} per-core columns "
                              f"{'averaged' if _RATIO.search(name) else 'summed'}")
            if c.family.lower() == "perf" and c.metric.lower() == "ipc":
                med = float(np.nanmedian(col))
                if med > IPC_X100_MEDIAN:
                    col /= 100.0
                    hnotes.append(f"{c.raw}: IPC stored x100 (median {med:.3g}); divided "
                                  "by 100")
            kind = "gauge"
            if deltas[j]:
                fin = np.isfinite(col)
                cum = np.cumsum(np.where(fin, col, 0.0))
                col = np.where(fin, cum, np.nan)
                if np.nanmin(V[:, js]) >= 0:
                    kind = "counter"     # deltas of a count: a counter, read back as a rate
                else:                    # deltas of a level (Dirty, Cached ...): the level
                    hnotes.append(f"{name}: negative deltas; stored as the level they add up "
                                  "to (from 0 at the first row)")
            unit = c.unit if not deltas[j] else (c.unit or "count")
            try:
                metas.append(ChannelMeta(name, unit, kind,
                                         "reveal-tsv", description=c.raw))
            except ValueError as e:
                raise TSVFormatError(f"{path}:1: column {c.raw!r}: {e}") from None
            data.append(col)
        if not metas:
            raise TSVFormatError(f"{path}: host {host!r} has no column with data")
        X = np.stack(data, axis=1)
        run_dir = os.path.join(out_dir, stem, _path_part(host))
        if os.path.exists(os.path.join(run_dir, "meta.json")):
            raise TSVFormatError(f"{run_dir}: exists already (import into a new --out)")
        os.makedirs(run_dir, exist_ok=True)
        w = SegmentWriter(run_dir, metas, segment_s=segment_s, sync=False)
        for i in range(len(t)):
            w.add(float(t[i]), X[i])
        w.flush()
        rid = f"{stem}-{_path_part(host)}"
        run: dict[str, Any] = {
            "run_id": rid, "run_dir": os.path.abspath(run_dir), "source": "local",
            "host": host, "job_id": job_id or stem, "step_id": None, "user": user,
            "uid": None, "gid": None, "command": ["reveal-tsv", os.path.basename(path)],
            "pids": [], "cgroup": None, "gpus": None,
            "extra": {"workload": workload or stem, "imported_from": os.path.abspath(path)}}
        meta = {"schema": "reveal.run/1", "run": run, "host": host,
                "interval_s": interval, "channels": [m.to_dict() for m in metas],
                "probes": [{"name": "reveal-tsv", "available": True, "reason": None,
                            "channels": len(metas)}],
                "start": float(t[0]), "end": float(t[-1]) + interval, "exit_code": None,
                "steps": [], "samples": int(len(t)), "segment_s": segment_s,
                "import": {"format": "reveal-tsv", "file": os.path.abspath(path),
                           "rows": int(len(t)), "columns": len(idx), "dropped": dropped,
                           "notes": hnotes}}
        write_meta(run_dir, meta)
        written.append(run_dir)
    return written

