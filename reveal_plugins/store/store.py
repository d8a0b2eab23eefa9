"""The run-directory store (★ contract).

A run directory holds::

    meta.json        run identity, host, probes, channel metadata (name, unit, kind, probe)
    events.jsonl     lifecycle events, one JSON object a line, each with unix-seconds "t"
    segments/seg-NNNNNN.parquet   telemetry, Parquet + zstd, at most ~10 s each
    report.json      after analysis

Every file is written under a temporary name (``.<name>.<pid>.<n>.tmp``), fsynced, and renamed
when complete, then the directory is fsynced (:func:`.rundir.atomic_file`), so a crash loses at
most the open segment and ``meta.json`` is never empty or partial.  Segments are change logs (see
:class:`SegmentWriter`); :func:`read_segment` turns one back into a dense frame.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import re
import stat
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..types import ChannelMeta, Frame, RunInfo
from .rundir import atomic_file, open_dir, write_file

log = logging.getLogger(__name__)

META = "meta.json"
EVENTS = "events.jsonl"
REPORT = "report.json"
SEGMENTS = "segments"
SEGMENT_RE = re.compile(r"^seg-(\d{6})\.parquet$")
RUNNING = ".running"     # present while an agent records the run (see mark_running)
META_SCHEMA = "reveal.run/1"
SEGMENT_FORMAT = "reveal.segment/1"


class StoreError(RuntimeError):
    """A run directory cannot be written or read; the message names the path."""


def _limit(name: str, default: int) -> int:
    try:
        return max(1, int(os.environ.get(name, "")))
    except ValueError:
        return default


# What a reader accepts from a run directory.  Run directories outside the agent's spool are
# written by their users (``reveal-runs/*``) and read by root (a fleet pass, an Epilog), so
# every file is opened without following a symlink, without blocking on a FIFO, must be a
# regular file and is refused beyond these sizes (the agent's own files stay far below).
MAX_META_BYTES = _limit("REVEAL_MAX_META_BYTES", 32 << 20)
MAX_EVENTS_BYTES = _limit("REVEAL_MAX_EVENTS_BYTES", 96 << 20)   # the agent caps 64 MiB
MAX_REPORT_BYTES = _limit("REVEAL_MAX_REPORT_BYTES", 64 << 20)
MAX_SEGMENT_BYTES = _limit("REVEAL_MAX_SEGMENT_BYTES", 256 << 20)
#: stored rows and decoded bytes a segment's footer may declare (read before decoding)
MAX_SEGMENT_ROWS = _limit("REVEAL_MAX_SEGMENT_ROWS", 16_000_000)
MAX_SEGMENT_DECODED = _limit("REVEAL_MAX_SEGMENT_DECODED", 1 << 30)
#: samples x channels one segment may expand to (10 s x 1 kHz x 1,600 channels)
MAX_SEGMENT_CELLS = _limit("REVEAL_MAX_SEGMENT_CELLS", 16_000_000)

_KIND = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK:
         "a block device", stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}


def open_regular(path: str, max_bytes: int, what: str = "file", *,
                 nofollow_dir: bool = False) -> tuple[int, os.stat_result]:
    """Open ``path`` for reading as a reader of user-writable run directories must: the last
    component never followed if it is a symlink (``O_NOFOLLOW``), never blocking on a FIFO
    (``O_NONBLOCK``), a regular file (checked on the descriptor, ``fstat``) of at most
    ``max_bytes``.  With ``nofollow_dir`` the directory holding it must not be a symlink
    either (``segments/``).  Returns ``(fd, stat)``; raises FileNotFoundError when it is
    absent and :class:`StoreError` naming the file otherwise."""
    parent, name = os.path.split(path)
    dflags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | (os.O_NOFOLLOW if nofollow_dir
                                                           else 0)
    try:
        dfd = os.open(parent or ".", dflags)
    except FileNotFoundError:
        raise
    except OSError as e:
        why = ("is a symbolic link or not a directory; not followed"
               if e.errno in (errno.ELOOP, errno.ENOTDIR) else e.strerror)
        raise StoreError(f"{parent}: {why}") from None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                     | os.O_CLOEXEC, dir_fd=dfd)
    except FileNotFoundError:
        raise
    except OSError as e:
        why = ("is a symbolic link; not followed (a run directory's files are read only "
               "as regular files)" if e.errno == errno.ELOOP else e.strerror)
        raise StoreError(f"{path}: {why}") from None
    finally:
        os.close(dfd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = _KIND.get(stat.S_IFMT(st.st_mode), "not a plain file")
        raise StoreError(f"{path}: not a regular file ({kind}); not read")
    if st.st_size > max_bytes:
        os.close(fd)
        raise StoreError(f"{path}: {st.st_size} bytes, more than the {max_bytes} a {what} "
                         "may hold; not read")
    return fd, st


def read_arrow_buffer(fd: int, max_bytes: int) -> pa.Buffer:
    """The whole file behind ``fd`` (closed here) in memory Arrow owns, for parquet readers.

    Not a Python file object or ``bytes``: Arrow would wrap those in a buffer that needs the
    GIL to be released, and its worker threads release the last reference to a reader's pages
    a moment after a read returns; a process that exits in that moment (a short ``reveal
    analyze``) aborts in interpreter teardown ("terminate called without an active
    exception", apache/arrow#34314)."""
    with os.fdopen(fd, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        buf = pa.allocate_buffer(min(size, max_bytes), resizable=True)
        view, got = memoryview(buf), 0
        while got < len(view):
            n = f.readinto(view[got:])
            if not n:
                break                   # shorter than fstat said (being rewritten): keep it
            got += n
        view.release()
    buf.resize(got)
    return buf


def segment_source(path: str) -> pa.BufferReader:
    """A segment opened as every reader of one must (:func:`open_regular`, the segment bound,
    ``segments/`` not a symlink), for :mod:`pyarrow.parquet`, in Arrow's memory."""
    fd, _ = open_regular(path, MAX_SEGMENT_BYTES, "segment", nofollow_dir=True)
    return pa.BufferReader(read_arrow_buffer(fd, MAX_SEGMENT_BYTES))


def read_bounded(path: str, max_bytes: int, what: str = "file") -> tuple[bytes, os.stat_result]:
    """The content of ``path`` opened by :func:`open_regular` (at most ``max_bytes``)."""
    fd, st = open_regular(path, max_bytes, what)
    with os.fdopen(fd, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise StoreError(f"{path}: grew past the {max_bytes} bytes a {what} may hold; not read")
    return data, st


def parse_json(data: bytes, path: str) -> Any:
    try:
        return json.loads(data)
    except RecursionError:
        raise StoreError(f"{path}: invalid JSON (nested too deeply)") from None
    except UnicodeDecodeError as e:
        raise StoreError(f"{path}: invalid JSON (not UTF-8: {e.reason})") from None
    except json.JSONDecodeError as e:
        raise StoreError(f"{path}: invalid JSON at line {e.lineno}: {e.msg}") from None
    except ValueError as e:  # an integer too long to convert (int_max_str_digits)
        raise StoreError(f"{path}: invalid JSON ({str(e)[:120]})") from None


def write_meta(run_dir: str, meta: dict[str, Any]) -> None:
    """Replace ``meta.json`` atomically and durably (readers never see it empty or partial)."""
    write_file(run_dir, META, json.dumps(meta, sort_keys=True, separators=(",", ":")).encode())


def read_meta(run_dir: str) -> dict[str, Any]:
    path = os.path.join(run_dir, META)
    try:
        data, _ = read_bounded(path, MAX_META_BYTES, "meta.json")
    except FileNotFoundError:
        raise StoreError(f"{path}: not a run directory (meta.json missing)") from None
    meta = parse_json(data, path)
    if not isinstance(meta, dict) or "channels" not in meta:
        raise StoreError(f"{path}: missing key 'channels'")
    return meta


def mark_running(run_dir: str) -> None:
    """Create the empty ``.running`` marker: the run is being recorded.

    The agent removes it first thing when it closes the run (:func:`clear_running`), before it
    rewrites ``meta.json``: removing a file needs no free space, so a run whose final
    ``meta.json`` could not be written (ENOSPC) still reads as finished to the next agent,
    which then closes it instead of adopting it and sampling a job that is over."""
    dfd = open_dir(run_dir)
    try:
        fd = os.open(RUNNING, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640,
                     dir_fd=dfd)
        os.close(fd)
    finally:
        os.close(dfd)


def clear_running(run_dir: str) -> None:
    """Remove the ``.running`` marker (absent already: nothing to do)."""
    dfd = open_dir(run_dir)
    try:
        os.unlink(RUNNING, dir_fd=dfd)
    except FileNotFoundError:
        pass
    finally:
        os.close(dfd)


def is_running(run_dir: str) -> bool:
    return os.path.lexists(os.path.join(run_dir, RUNNING))


def last_activity(run_dir: str, meta: dict[str, Any] | None = None) -> float:
    """When the run directory last changed (the newest of its own, ``meta.json``'s,
    ``events.jsonl``'s and ``segments/``' modification times, and the run's start)."""
    times = []
    for name in ("", META, EVENTS, SEGMENTS):
        try:
            times.append(os.lstat(os.path.join(run_dir, name) if name else run_dir).st_mtime)
        except OSError:
            pass
    start = (meta or {}).get("start")
    if isinstance(start, (int, float)):
        times.append(float(start))
    return max(times, default=0.0)


def append_event(run_dir: str, event: str, t: float | None = None, **fields: Any) -> dict:
    """Append one lifecycle event to ``events.jsonl`` (whole lines only, see _append_line).

    Not fsynced (events can come many a second); a crash may lose the last lines, which
    :func:`read_events` then skips if cut short."""
    rec = {"t": time.time() if t is None else float(t), "event": event, **fields}
    line = (json.dumps(rec, sort_keys=True, default=str) + "\n").encode()
    dfd = open_dir(run_dir)   # as root: only into a directory root owns, never via a symlink
    try:
        fd = os.open(EVENTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o640, dir_fd=dfd)
    finally:
        os.close(dfd)
    try:
        _append_line(fd, line, os.path.join(run_dir, EVENTS))
    finally:
        os.close(fd)
    return rec


def _append_line(fd: int, line: bytes, path: str) -> None:
    """Write all of ``line`` at the end of the file, or none of it: a short write (a disk
    filling up) is continued, and when the rest cannot be written the file is cut back to
    where the line began, so the next event never lands glued to a torn line (the agent is
    the file's only writer)."""
    start = os.fstat(fd).st_size
    done = 0
    try:
        while done < len(line):
            n = os.write(fd, line[done:])
            if n <= 0:
                raise OSError(errno.EIO, f"{path}: write returned {n}")
            done += n
    except BaseException:
        if done:
            try:
                os.ftruncate(fd, start)
            except OSError as e:
                log.error("%s: cannot remove a torn event line: %s", path, e)
        raise


def read_events(run_dir: str, warnings: list[str] | None = None) -> list[dict[str, Any]]:
    path = os.path.join(run_dir, EVENTS)
    out: list[dict[str, Any]] = []
    try:
        fd, _ = open_regular(path, MAX_EVENTS_BYTES, "events.jsonl")
    except FileNotFoundError:
        return out
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_EVENTS_BYTES + 1)
    if len(data) > MAX_EVENTS_BYTES:
        raise StoreError(f"{path}: grew past the {MAX_EVENTS_BYTES} bytes an events.jsonl "
                         "may hold; not read")
    for n, line in enumerate(data.split(b"\n"), 1):
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
            float(rec["t"])
        except (ValueError, KeyError, TypeError, RecursionError, OverflowError) as e:
            msg = f"{path}:{n}: skipped invalid event line ({type(e).__name__}: {e})"
            log.warning(msg)
            if warnings is not None:
                warnings.append(msg)
            continue
        out.append(rec)
    return out


SAMPLE_CHANNEL = "__sample__"


class SegmentWriter:
    """Buffers sample rows for one run and writes a Parquet segment every ``segment_s`` seconds.

    Layout of a segment ("change log", long format, sorted by channel then time)::

        channel: dictionary<int32, string>   channel name ("__sample__" rows list every tick)
        t_ms:    int64                       unix milliseconds of the sample
        value:   float64                     the channel's value (NaN = not read this time)

    A channel's value is stored only when it differs from the previous sample of the same
    segment; the first sample of a segment is complete, so every segment stands alone.
    Why not one column per channel: Parquet spends ~130 bytes of footer and page headers per
    column chunk, which for hundreds of channels x one file per 10 s alone exceeds 4 KB/s.
    """

    def __init__(self, run_dir: str, channels: list[ChannelMeta], segment_s: float = 10.0,
                 file_mode: int = 0o640, sync: bool = True):
        self.run_dir = run_dir
        self.dir = os.path.join(run_dir, SEGMENTS)
        os.makedirs(self.dir, mode=0o750, exist_ok=True)
        self.channels = channels
        self.segment_s = segment_s
        self.file_mode = file_mode
        self.sync = sync          # fsync each segment and the directory (benchmarks turn it off)
        self._t: list[float] = []
        self._rows: list[np.ndarray] = []
        self._first_t: float | None = None
        self.seq = self._next_seq()
        # called with the path of every segment written (the incremental featurizer of
        # reveal_plugins.detect.longrun.featurize); its close() is called by close().  One
        # with ``takes_rows = True`` also gets the segment's rows as they read back
        # (``rows=(t, values)``), so it need not read the file it was just handed.
        self.on_segment: Any = None
        self.bytes_written = 0
        self.samples_written = 0
        self._names = pa.array([SAMPLE_CHANNEL] + [c.name for c in channels], pa.string())
        self.schema = pa.schema([pa.field("channel", pa.dictionary(pa.int32(), pa.string())),
                                 pa.field("t_ms", pa.int64()),
                                 pa.field("value", pa.float64())],
                                metadata={b"reveal": SEGMENT_FORMAT.encode()})

    def _next_seq(self) -> int:
        seqs = [int(m.group(1)) for m in map(SEGMENT_RE.match, os.listdir(self.dir)) if m]
        return max(seqs, default=0) + 1

    def add(self, t: float, row: np.ndarray, mono: float | None = None) -> None:
        """Add one sample row (len == len(channels)); flushes when the segment is full.

        ``t`` (wall clock) labels the row.  The agent passes ``mono`` (its monotonic clock): the
        segment is full after ``segment_s`` of it, so a wall clock stepped back never stalls
        flushing.  Without it (replays, synthetic runs) ``t`` measures the segment."""
        mono = t if mono is None else mono
        if self._first_t is None:
            self._first_t = mono
        self._t.append(t)
        self._rows.append(row)
        if mono - self._first_t >= self.segment_s - 1e-9:
            self.flush()

    def flush(self) -> str | None:
        if not self._t:
            return None
        values = np.vstack(self._rows)
        t_ms = np.round(np.asarray(self._t, dtype=np.float64) * 1000.0).astype(np.int64)
        self._t, self._rows, self._first_t = [], [], None
        n, c = values.shape
        nan = np.isnan(values)
        changed = np.ones((n, c), dtype=bool)
        changed[1:] = (values[1:] != values[:-1]) & ~(nan[1:] & nan[:-1])
        ch_idx, row_idx = np.nonzero(changed.T)  # sorted by channel, then time
        codes = np.concatenate([np.zeros(n, np.int32), (ch_idx + 1).astype(np.int32)])
        times = np.concatenate([t_ms, t_ms[row_idx]])
        vals = np.concatenate([t_ms.astype(np.float64) / 1000.0, values[row_idx, ch_idx]])
        table = pa.Table.from_arrays(
            [pa.DictionaryArray.from_arrays(pa.array(codes), self._names), pa.array(times),
             pa.array(vals)], schema=self.schema)
        name = f"seg-{self.seq:06d}.parquet"
        with atomic_file(self.dir, name, self.file_mode, sync=self.sync) as f:
            pq.write_table(table, f, compression="zstd", compression_level=6,
                           use_dictionary=["channel"], write_statistics=False,
                           column_encoding={"t_ms": "DELTA_BINARY_PACKED",
                                            "value": "BYTE_STREAM_SPLIT"})
            f.flush()
            size = os.fstat(f.fileno()).st_size
        self.seq += 1
        self.bytes_written += size
        self.samples_written += n
        path = os.path.join(self.dir, name)
        if self.on_segment is not None:
            try:
                if getattr(self.on_segment, "takes_rows", False):
                    # what read_segment returns for this file: ms timestamps, float64 values
                    self.on_segment(path, rows=(t_ms.astype(np.float64) / 1000.0, values))
                else:
                    self.on_segment(path)
            except Exception as e:  # a consumer never costs a segment
                log.warning("%s: segment consumer failed: %s", path, e)
        return path

    def close(self) -> None:
        """The run ended (after the last :meth:`flush`): let the segment consumer finish."""
        close = getattr(self.on_segment, "close", None)
        if close is not None:
            try:
                close()
            except Exception as e:
                log.warning("%s: segment consumer failed to close: %s", self.dir, e)


def read_segment(path: str, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Read one segment into ``(t (n,), values (n, len(names)))``, forward-filling the change log.

    Raises on an unreadable file or a file that is not a reveal segment, and
    :class:`StoreError` naming the file when it is not a regular file or would expand beyond
    the ``MAX_SEGMENT_*`` limits: its footer is checked before anything is decoded, and the
    dense result (samples x ``names``) before it is allocated, so a tiny crafted segment with
    millions of compressible ticks under a meta.json declaring thousands of channels cannot
    make the reader allocate gigabytes."""
    pf = pq.ParquetFile(segment_source(path))
    md = pf.metadata
    decoded = sum(md.row_group(i).column(j).total_uncompressed_size
                  for i in range(md.num_row_groups) for j in range(md.num_columns))
    if md.num_rows > MAX_SEGMENT_ROWS or decoded > MAX_SEGMENT_DECODED:
        raise StoreError(f"{path}: declares {md.num_rows} rows, {decoded} bytes decoded; "
                         f"more than a segment may hold ({MAX_SEGMENT_ROWS} rows, "
                         f"{MAX_SEGMENT_DECODED} bytes); not read")
    table = pf.read()
    if table.schema.metadata is None or \
            table.schema.metadata.get(b"reveal") != SEGMENT_FORMAT.encode():
        raise ValueError("not a reveal segment (schema metadata 'reveal' missing)")
    ch = table.column("channel").combine_chunks()
    dictionary = ch.dictionary.to_pylist()
    codes = ch.indices.to_numpy(zero_copy_only=False)
    t_ms = table.column("t_ms").to_numpy()
    vals = table.column("value").to_numpy()
    sample_code = dictionary.index(SAMPLE_CHANNEL)
    is_tick = codes == sample_code
    n_ticks = int(np.count_nonzero(is_tick))
    if n_ticks * max(1, len(names)) > MAX_SEGMENT_CELLS:
        raise StoreError(f"{path}: {n_ticks} samples x {len(names)} channels would expand to "
                         f"{n_ticks * len(names)} values, more than the {MAX_SEGMENT_CELLS} a "
                         "segment may hold (REVEAL_MAX_SEGMENT_CELLS); not read")
    grid = t_ms[is_tick]
    t = vals[is_tick]
    col_of = {name: j for j, name in enumerate(names)}
    code_col = np.array([col_of.get(d, -1) for d in dictionary], dtype=np.intp)
    cols = code_col[codes]
    keep = ~is_tick & (cols >= 0)
    rows = np.searchsorted(grid, t_ms[keep])
    n = len(grid)
    out = np.full((n, len(names)), np.nan)
    if n == 0:
        return t, out
    rows = np.minimum(rows, n - 1)
    setmask = np.zeros((n, len(names)), dtype=bool)
    setmask[rows, cols[keep]] = True
    out[rows, cols[keep]] = vals[keep]
    # forward fill each column from its last stored change
    idx = np.where(setmask, np.arange(n)[:, None], 0)
    np.maximum.accumulate(idx, axis=0, out=idx)
    filled = np.take_along_axis(out, idx, axis=0)
    # channels absent from this segment stay NaN (row 0 was never set)
    present = setmask[0]
    filled[:, ~present] = np.nan
    return t, filled


@dataclass
class RunData:
    """What a run directory holds, loaded: metadata, the sample frame, events, load warnings."""

    run_dir: str
    meta: dict[str, Any]
    frame: Frame
    events: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    segments: int = 0
    bytes_stored: int = 0

    @property
    def run(self) -> RunInfo:
        return RunInfo.from_dict(self.meta["run"])


def segment_paths(run_dir: str) -> list[str]:
    d = os.path.join(run_dir, SEGMENTS)
    try:
        names = sorted(n for n in os.listdir(d) if SEGMENT_RE.match(n))
    except FileNotFoundError:
        return []
    return [os.path.join(d, n) for n in names]


def fill_slow_channels(t: np.ndarray, values: np.ndarray, chans: list[ChannelMeta],
                        interval_s: float, tail: bool = True) -> None:
    """Channels read less often than every tick (``sample_every_s``) hold NaN between reads:
    interpolate linearly in time between reads no further apart than twice their period, and
    carry the last read forward over the tail, so that analysis sees a smooth series (a
    counter's rate is then spread evenly over the interval it accumulated in).

    The channels of one probe are read on the same ticks: columns with the same period and
    the same reads share one search and one set of weights (the agent's featurizer runs this
    on every segment; one ``np.interp`` per column cost most of its time).  The arithmetic is
    ``np.interp``'s own, so the values are the same to the bit."""
    if len(t) < 2:
        return
    slow = [j for j, c in enumerate(chans)
            if c.sample_every_s and c.sample_every_s > interval_s * 1.5]
    if not slow:
        return
    read = ~np.isnan(values[:, slow])
    groups: dict[tuple[float, bytes], list[int]] = {}   # -> positions in ``slow``
    for k, j in enumerate(slow):
        groups.setdefault((chans[j].sample_every_s, np.packbits(read[:, k]).tobytes()),
                          []).append(k)
    for (every, _), ks in groups.items():
        ok = read[:, ks[0]]
        cols = [slow[k] for k in ks]
        if not ok.any() or ok.all():
            continue
        tk = t[ok]
        m = len(tk)
        pos = np.searchsorted(tk, t, side="right")
        prev_i = np.clip(pos - 1, 0, m - 1)
        next_i = np.clip(pos, 0, m - 1)
        # no invention across real gaps (lost segment, probe error): leave NaN there
        interior = (pos > 0) & (pos < m) & (tk[next_i] - tk[prev_i] <= 2.5 * every)
        after = (pos == m) & (t - tk[-1] <= 1.5 * every) if tail else np.zeros(len(t), bool)
        vk = values[np.ix_(ok, cols)]   # the group's reads only, not every channel's
        rows = np.nonzero(~ok & interior)[0]
        if len(rows):
            j0, x = prev_i[rows], t[rows]
            x0, x1 = tk[j0][:, None], tk[j0 + 1][:, None]
            y0, y1 = vk[j0], vk[j0 + 1]
            with np.errstate(divide="ignore", invalid="ignore"):
                slope = (y1 - y0) / (x1 - x0)
                res = slope * (x[:, None] - x0) + y0
                back = slope * (x[:, None] - x1) + y1   # np.interp's retry from the right
            res = np.where(np.isnan(res), back, res)
            res = np.where(np.isnan(res) & (y0 == y1), y0, res)
            res = np.where(x[:, None] == x0, y0, res)
            values[np.ix_(rows, cols)] = res
        rows = np.nonzero(~ok & after)[0]
        if len(rows):
            values[np.ix_(rows, cols)] = vk[-1]


def _positive(v: Any) -> float | None:
    """A finite number > 0 from what a meta.json says, else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        v = float(v)
    except OverflowError:
        return None
    return v if 0 < v < float("inf") else None


def _channels(meta: dict[str, Any], path: str) -> list[ChannelMeta]:
    """The channels a meta.json declares; StoreError when they are not a list of objects with
    a string name (the file may come from a user-writable run directory)."""
    raw = meta.get("channels")
    if not isinstance(raw, list):
        raise StoreError(f"{path}: 'channels' must be a list, not {type(raw).__name__}")
    out = []
    for i, c in enumerate(raw):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str):
            raise StoreError(f"{path}: channels[{i}] is not an object with a string 'name'")
        d = {k: v for k, v in c.items() if k in ("unit", "kind", "probe", "description")
             and isinstance(v, str)}
        out.append(ChannelMeta.from_dict(dict(d, name=c["name"],
                                              sample_every_s=_positive(c.get("sample_every_s")))))
    return out


def load_run(run_dir: str, channels: Iterable[str] | None = None) -> RunData:
    """Load a run directory.  Corrupt segments and leftover temporary files are skipped with a
    warning (recorded in ``RunData.warnings``); a missing ``meta.json`` raises StoreError."""
    meta = read_meta(run_dir)
    warnings: list[str] = []
    chans = _channels(meta, os.path.join(run_dir, META))
    if channels is not None:
        want = set(channels)
        chans = [c for c in chans if c.name in want]
    names = [c.name for c in chans]
    seg_dir = os.path.join(run_dir, SEGMENTS)
    if os.path.isdir(seg_dir):
        for n in sorted(os.listdir(seg_dir)):
            if n.endswith(".tmp"):
                msg = (f"{os.path.join(seg_dir, n)}: ignored unfinished segment "
                       "(the writer stopped before renaming it)")
                log.warning(msg)
                warnings.append(msg)
    ts: list[np.ndarray] = []
    blocks: list[np.ndarray] = []
    nbytes = 0
    nseg = 0
    for path in segment_paths(run_dir):
        try:
            t, block = read_segment(path, names)
        except Exception as e:  # corrupt or truncated file: keep going with the others
            msg = f"{path}: skipped unreadable segment ({type(e).__name__}: {e})"
            log.warning(msg)
            warnings.append(msg)
            continue
        nseg += 1
        nbytes += os.path.getsize(path)
        ts.append(t)
        blocks.append(block)
    if ts:
        t = np.concatenate(ts)
        values = np.vstack(blocks)
        order = np.argsort(t, kind="stable")
        t, values = t[order], values[order]
    else:
        t, values = np.zeros(0), np.zeros((0, len(names)))
    fill_slow_channels(t, values, chans, _positive(meta.get("interval_s")) or 0.1)
    events = read_events(run_dir, warnings)
    return RunData(run_dir, meta, Frame(t, values, chans), events, warnings, nseg, nbytes)
