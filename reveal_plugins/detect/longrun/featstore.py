"""The feature store of a run: window statistics beside the segments (``DIR/features/``).

One Parquet file per featurized segment, ``feat-AAAAAA-BBBBBB.parquet`` (segments A..B, the
windows their arrival finished), written like segments (:func:`~reveal_plugins.store.rundir.atomic_file`:
a crash loses at most the file being written).  Every :data:`GROUP` single-segment files are
merged into one (written first, the small ones removed after), so a week-long run has ~170
files to read at job end, not 60 000.  Each file carries in its metadata the featurizer's state
after it (to resume) and the per-channel sums of its samples (channel filtering without the
samples).

Layout: ``start`` float64, ``count`` int32, ``valid`` bool, and one ``list<float32>`` column
per statistic (``mean``, ``std``, ``min``, ``max``, ``slope``; one value per prepared channel,
in the order of the channel names), byte-stream-split and zstd.  The metadata is the file's
own key-value metadata with ``colstats`` (float64) deflated, and no Arrow schema: a copy of it
with the metadata inside was four fifths of each 10-s file (``reveal.features/1``, still read).
The channel names, the same for every file of a run, are written once beside them
(``names-<sha256[:16]>.json.z``, deflated JSON); a file names the list by its hash.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import re
import shutil
import tempfile
import threading
import zlib
from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ...store import store
from ...store.rundir import atomic_file, open_dir
from ...types import ChannelMeta
from .featurize import WARMUP_SEGMENTS, Chunk, Featurizer, full_columns, resume
from ..batch.windows import STATS

log = logging.getLogger(__name__)

FEATURES = "features"
FORMAT = "reveal.features/2"
#: Formats read: /1 kept its metadata uncompressed in the Arrow schema.
FORMATS = (FORMAT.encode(), b"reveal.features/1")
FILE_RE = re.compile(r"^feat-(\d{6})-(\d{6})\.parquet$")
NAMES_RE = re.compile(r"^names-([0-9a-f]{16})\.json\.z$")
#: A names file larger than this is not read (a run has a few thousand channels).
MAX_NAMES_BYTES = 4 << 20
#: Single-segment files merged into one (360 x 10 s = one hour).
GROUP = 360


def segment_seq(path: str) -> int:
    m = store.SEGMENT_RE.match(os.path.basename(path))
    return int(m.group(1)) if m else -1


class FeatureStore:
    """Feature files of one run (in the run directory, or a private temporary directory when
    the run directory is not ours to write)."""

    def __init__(self, path: str, private: bool = False, sync: bool = True):
        self.path = path
        self.private = private
        self.sync = sync
        self._f: Featurizer | None = None      # featurizer kept between agent calls
        self._f_last: int | None = None
        self._names_written: set[str] = set()

    @classmethod
    def for_run(cls, run_dir: str, create: bool = False, sync: bool = True) -> "FeatureStore":
        path = os.path.join(run_dir, FEATURES)
        if create and not os.path.isdir(path):
            dfd = open_dir(run_dir)          # as root: only a directory root owns
            try:
                os.mkdir(FEATURES, 0o750, dir_fd=dfd)
            except FileExistsError:
                pass
            finally:
                os.close(dfd)
        return cls(path, sync=sync)

    @classmethod
    def temporary(cls) -> "FeatureStore":
        return cls(tempfile.mkdtemp(prefix="reveal-features-"), private=True, sync=False)

    def cleanup(self) -> None:
        if self.private:
            shutil.rmtree(self.path, ignore_errors=True)

    def clear(self) -> None:
        """Remove every feature file (``--full`` rebuilds them)."""
        if not os.path.isdir(self.path):
            return
        dfd = open_dir(self.path)
        try:
            for n in os.listdir(dfd):
                if FILE_RE.match(n) or NAMES_RE.match(n):
                    os.unlink(n, dir_fd=dfd)
        finally:
            os.close(dfd)
        self._f = None
        self._names_written.clear()

    # -- which files cover which segments ------------------------------------------------
    def files(self) -> list[tuple[int, int, str]]:
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return []
        out = []
        for n in names:
            m = FILE_RE.match(n)
            if m:
                out.append((int(m.group(1)), int(m.group(2)), os.path.join(self.path, n)))
        return sorted(out, key=lambda x: (x[0], -x[1]))

    def cover(self, seqs: Sequence[int]) -> list[tuple[int, int, str]]:
        """Files that cover the first segments of ``seqs`` without hole (largest first)."""
        pos = {s: i for i, s in enumerate(seqs)}
        by_start: dict[int, tuple[int, int, str]] = {}
        for a, b, p in self.files():
            if a not in by_start and b in pos and a in pos:
                by_start[a] = (a, b, p)
        out, i = [], 0
        while i < len(seqs) and seqs[i] in by_start:
            f = by_start[seqs[i]]
            out.append(f)
            i = pos[f[1]] + 1
        return out

    # -- writing -------------------------------------------------------------------------
    def write(self, ch: Chunk, a: int, b: int, state: dict, names: list[str]) -> str:
        c = len(names)
        cf = len(full_columns(names))
        cols = [pa.array(ch.start, pa.float64()), pa.array(ch.count.astype(np.int32)),
                pa.array(ch.valid.astype(bool))]
        for s in STATS:
            flat = pa.array(np.ascontiguousarray(ch.stats[s], np.float32).reshape(-1))
            cols.append(pa.FixedSizeListArray.from_arrays(flat, c if s == "mean" else cf))
        info = {"seg_first": a, "seg_last": b, "state": state, "samples": ch.samples,
                "t_min": ch.t_min if np.isfinite(ch.t_min) else None,
                "t_max": ch.t_max if np.isfinite(ch.t_max) else None,
                "gaps": ch.gaps[:50], "resets": ch.resets, "dropped_t": ch.dropped_t,
                "channels": c, "full_channels": cf}
        schema = pa.schema([("start", pa.float64()), ("count", pa.int32()),
                            ("valid", pa.bool_())] +
                           [(s, pa.list_(pa.float32(), c if s == "mean" else cf))
                            for s in STATS])
        table = pa.Table.from_arrays(cols, schema=schema)
        meta = {b"reveal": FORMAT.encode(), b"info": json.dumps(info).encode(),
                b"names_sha": self._write_names(names).encode(),
                # level 6: 2 % larger than 9 here, 14x faster (0.16 against 2.3 ms a file)
                b"colstats": zlib.compress(np.ascontiguousarray(ch.colstats,
                                                                np.float64).tobytes(), 6)}
        name = f"feat-{a:06d}-{b:06d}.parquet"
        with atomic_file(self.path, name, 0o640, sync=self.sync) as f:
            with pq.ParquetWriter(f, schema, compression="zstd", compression_level=1,
                                  write_statistics=False, store_schema=False,
                                  use_dictionary=["start", "count", "valid"],
                                  column_encoding={f"{s}.list.element": "BYTE_STREAM_SPLIT"
                                                   for s in STATS}) as w:
                w.write_table(table)
                w.add_key_value_metadata(meta)
        return os.path.join(self.path, name)

    def _write_names(self, names: list[str]) -> str:
        """The names file of ``names`` (written once per run and list); returns its hash."""
        blob = json.dumps(names).encode()
        sha = hashlib.sha256(blob).hexdigest()[:16]
        fname = f"names-{sha}.json.z"
        if sha not in self._names_written and not os.path.isfile(os.path.join(self.path,
                                                                              fname)):
            with atomic_file(self.path, fname, 0o640, sync=self.sync) as f:
                f.write(zlib.compress(blob, 9))
        self._names_written.add(sha)
        return sha

    def compact(self, seqs: Sequence[int], names: list[str], group: int = GROUP) -> None:
        """Merge every complete run of ``group`` single-segment files into one file."""
        cov = self.cover(seqs)
        single = [f for f in cov if f[0] == f[1]]
        i = 0
        while i + group <= len(single):
            run = single[i:i + group]
            chunks = [read(p) for _, _, p in run]
            merged = merge(chunks)
            state = read_info(run[-1][2])["state"]
            self.write(merged, run[0][0], run[-1][1], state, names)
            for _, _, p in run:
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
            i += group

    # -- featurizing ---------------------------------------------------------------------
    def update(self, run_dir: str, metas: Sequence[ChannelMeta], interval_s: float | None,
               window_s: float, stride_s: float, upto: str | None = None,
               final: bool = False, warnings: list[str] | None = None,
               given: dict[str, tuple[np.ndarray, np.ndarray]] | None = None
               ) -> tuple[Chunk | None, int, int]:
        """Featurize the segments not covered yet (up to the segment named ``upto``), one file
        each; with ``final`` also the windows still open at the end of the run, returned (not
        stored: the run might go on).  ``given``: rows of segments by path, as
        :func:`store.read_segment` would return them (the writer's own copy), not read again.
        Returns ``(tail chunk, segments read, bytes read)``."""
        names = [m.name for m in metas]
        paths = store.segment_paths(run_dir)
        if upto is not None:
            paths = [p for p in paths if os.path.basename(p) <= upto]
        seqs = [segment_seq(p) for p in paths]
        cov = self.cover(seqs)
        done = cov[-1][1] if cov else None
        start = 0 if done is None else seqs.index(done) + 1
        f = self._f if (self._f is not None and self._f_last == done) else None
        nseg = nbytes = 0
        if f is None:
            if done is None:
                f = Featurizer(metas, interval_s, window_s, stride_s)
            else:
                state = read_info(cov[-1][2])["state"]
                warm = []
                for p in paths[max(0, start - WARMUP_SEGMENTS):start]:
                    try:
                        warm.append(store.read_segment(p, names))
                    except Exception:
                        pass
                f = resume(metas, state, warm)
        pnames = f.names
        for p, s in zip(paths[start:], seqs[start:]):
            try:
                if given and p in given:
                    t, raw = given[p]
                else:
                    t, raw = store.read_segment(p, names)
                    nbytes += os.path.getsize(p)
                    nseg += 1
            except Exception as e:  # corrupt or truncated: the others still count
                if warnings is not None:
                    warnings.append(f"{p}: skipped unreadable segment ({type(e).__name__}: "
                                    f"{e})")
                t, raw = np.zeros(0), np.zeros((0, len(names)))
            ch = f.feed(t, raw)
            self.write(ch, s, s, f.state(), pnames)
            self._f, self._f_last = f, s
        if len(seqs) >= GROUP:
            self.compact(seqs, pnames)
        tail = f.finish() if final else None
        if final:
            self._f = None
        return tail, nseg, nbytes

    # -- reading -------------------------------------------------------------------------
    def chunks(self, seqs: Sequence[int], stats: Sequence[str] = STATS) -> Iterator[Chunk]:
        for _, _, p in self.cover(seqs):
            yield read(p, stats)


def _metadata(path: str, meta: object = None) -> dict[bytes, bytes]:
    """The file's metadata, ``names`` and ``colstats`` as written by /1 (plain JSON and
    float64 bytes)."""
    md = dict((meta or pq.read_metadata(path)).metadata or {})   # type: ignore[attr-defined]
    if md.get(b"reveal") not in FORMATS:
        raise FeatureFileError(f"{path}: not a reveal feature file")
    if md[b"reveal"] != b"reveal.features/1":
        md[b"names"] = _read_names_file(path, md[b"names_sha"].decode())
        md[b"colstats"] = zlib.decompress(md[b"colstats"])
    return md


def _read_names_file(path: str, sha: str) -> bytes:
    """The names a feature file refers to, from the file beside it (no symlink followed, size
    bounded, content checked against its hash)."""
    name = os.path.join(os.path.dirname(path), f"names-{sha}.json.z")
    if not NAMES_RE.match(os.path.basename(name)):
        raise FeatureFileError(f"{path}: bad names reference {sha!r}")
    try:
        fd, _ = store.open_regular(name, MAX_NAMES_BYTES, "feature names", nofollow_dir=True)
    except FileNotFoundError:
        raise FeatureFileError(f"{path}: its names file {name} is missing") from None
    with os.fdopen(fd, "rb") as f:
        d = zlib.decompressobj()
        blob = d.decompress(f.read(), MAX_NAMES_BYTES * 8)
    if d.unconsumed_tail or hashlib.sha256(blob).hexdigest()[:16] != sha:
        raise FeatureFileError(f"{name}: does not match its hash (or too large)")
    return blob


def read_info(path: str) -> dict:
    return json.loads(_metadata(path)[b"info"])


def read_names(path: str) -> list[str]:
    return json.loads(_metadata(path)[b"names"])


class FeatureFileError(ValueError):
    """A feature file cannot be read (the analysis then recomputes from the segments)."""


def read(path: str, stats: Sequence[str] = STATS) -> Chunk:
    """One feature file (only the statistics in ``stats``); :class:`FeatureFileError` when it
    is unreadable."""
    try:
        return _read(path, stats)
    except FeatureFileError:
        raise
    except Exception as e:
        raise FeatureFileError(f"{path}: unreadable feature file ({type(e).__name__}: {e})") \
            from None


def _read(path: str, stats: Sequence[str]) -> Chunk:
    pf = pq.ParquetFile(path)
    md = _metadata(path, pf.metadata)
    info = json.loads(md[b"info"])
    c, cf = int(info["channels"]), int(info["full_channels"])
    tab = pf.read(columns=["start", "count", "valid", *stats])
    out = {}
    for s in stats:
        col = tab.column(s).combine_chunks()
        out[s] = col.flatten().to_numpy(zero_copy_only=False).reshape(-1, c if s == "mean"
                                                                       else cf)
    ch = Chunk(tab.column("start").to_numpy(), tab.column("count").to_numpy().astype(np.int64),
               tab.column("valid").to_numpy(zero_copy_only=False).astype(bool), out,
               np.frombuffer(md[b"colstats"], np.float64).reshape(4, c).copy())
    ch.samples = int(info["samples"])
    ch.t_min = info["t_min"] if info["t_min"] is not None else np.inf
    ch.t_max = info["t_max"] if info["t_max"] is not None else -np.inf
    ch.gaps, ch.resets, ch.dropped_t = info["gaps"], info["resets"], info["dropped_t"]
    return ch


def merge(chunks: list[Chunk]) -> Chunk:
    stats = list(chunks[0].stats)
    acc = chunks[0].colstats.copy()
    for ch in chunks[1:]:
        acc[:3] += ch.colstats[:3]
        np.maximum(acc[3], ch.colstats[3], out=acc[3])
    out = Chunk(np.concatenate([c.start for c in chunks]),
                np.concatenate([c.count for c in chunks]),
                np.concatenate([c.valid for c in chunks]),
                {s: np.concatenate([c.stats[s] for c in chunks]) for s in stats}, acc)
    out.samples = sum(c.samples for c in chunks)
    out.t_min = min(c.t_min for c in chunks)
    out.t_max = max(c.t_max for c in chunks)
    out.gaps = [g for c in chunks for g in c.gaps][:50]
    out.resets = sum(c.resets for c in chunks)
    out.dropped_t = sum(c.dropped_t for c in chunks)
    return out


# -- the agent's hook point ----------------------------------------------------------------

class FeatureWriter:
    """Featurizes each segment of a run in a background thread, after the agent wrote it.

    The agent's segment writer calls it with each segment's path (cheap: queued) and
    :meth:`close` when the run ends; featurization never delays sampling and a failure only
    costs the job-end analysis some time (it featurizes what is missing)."""

    def __init__(self, run_dir: str, metas: Sequence[ChannelMeta], interval_s: float | None,
                 window_s: float = 3.0, stride_s: float = 1.0):
        self.run_dir = run_dir
        self.metas = list(metas)
        self.interval_s = interval_s
        self.window_s, self.stride_s = window_s, stride_s
        self._q: queue.Queue = queue.Queue()
        # at most 15 characters: the agent gives its threads' names to the kernel (top -H)
        self._thread = threading.Thread(target=self._loop, name="reveal-features", daemon=True)
        self._thread.start()
        self.failed: str | None = None

    #: ``SegmentWriter`` hands over each segment's rows with its path: featurized without
    #: reading the file back (a third of the featurizer's time per segment)
    takes_rows = True

    def __call__(self, path: str, rows: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """A segment was written (``SegmentWriter.on_segment``): queue it (with its rows)."""
        self._q.put((path, rows))

    def close(self, timeout: float = 2.0) -> None:
        self._q.put(None)
        self._thread.join(timeout)

    def _loop(self) -> None:
        try:
            fs = FeatureStore.for_run(self.run_dir, create=True)
        except OSError as e:
            self.failed = f"features directory: {e}"
            log.warning("%s: no incremental features (%s)", self.run_dir, e)
            fs = None
        while True:
            item = self._q.get()
            if item is None:
                return
            path, rows = item
            if fs is None or self.failed:
                continue
            try:
                fs.update(self.run_dir, self.metas, self.interval_s, self.window_s,
                          self.stride_s, upto=os.path.basename(path),
                          given={path: rows} if rows is not None else None)
            except Exception as e:  # never the agent's problem: job-end analysis catches up
                self.failed = f"{type(e).__name__}: {e}"
                log.warning("%s: incremental featurization stopped: %s", self.run_dir,
                            self.failed)


def feature_writer(run_dir: str, channels: Sequence[ChannelMeta], interval_s: float | None,
                   config: dict | None = None) -> FeatureWriter | None:
    """The agent's hook point: a :class:`FeatureWriter` for a new run (None when turned off:
    ``REVEAL_FEATURES=0`` in the agent's environment, or its config ``features: False``)."""
    off = os.environ.get("REVEAL_FEATURES") == "0"
    if off or (config or {}).get("features", True) is False:
        return None
    return FeatureWriter(run_dir, channels, interval_s)
