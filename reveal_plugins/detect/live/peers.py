"""Live peer comparison: the suspect node of a multi-node job named while the job runs.

Every node's agent, in live mode, does two things every ~2 s for a run whose run directory
has sibling run directories of the same job (a shared spool, ``<spool>/jobs/<job>/<node>/``,
or ``reveal-torchrun --reveal-out`` on a shared filesystem):

1. **publish** its recent telemetry as 1-s block means on the wall-clock second grid
   (``live-peers.npz`` in its run directory: a few hundred KB, replaced atomically), computed
   from the horizon the :class:`reveal_plugins.detect.live.analyzer.LiveAnalyzer` already holds;
2. **compare** itself and up to ``max_peers`` of its peers (the nearest in host order) with
   :func:`reveal_plugins.detect.peers.nodes.compare` on what they published, and return each suspect
   that is still going on and was not reported yet.

Files older than ``stale_s`` (a node that finished, or whose agent died) are left out.  The
agent records each suspect as a ``peer_suspect`` event and hands it to the
``reveal_live_finding`` hook (the OTel sink adds a span event).
"""
from __future__ import annotations

import io
import json
import logging
import os
import stat
import time
from collections import deque
from typing import Any

import numpy as np

from ...store import store
from ..config import LivePeersConfig
from ..peers.nodes import NodeSeries, compare

log = logging.getLogger(__name__)

FILE = "live-peers.npz"
#: The peer comparison's settings live: a cause on the node itself (foreign load, a shaper's
#: queue) is named after 2 windows; symptoms alone, bursty by nature, after 5 as at job end; the
#: start-up left out as at job end (10 s).
LIVE_COMPARE = {"cooldown_s": 0.0, "warmup_s": 10.0, "min_windows": 2, "symptom_windows": 5}
#: The documented defaults (:class:`~reveal_plugins.detect.config.LivePeersConfig`, ``[detect.live.peers]``).
LIVE_PEER_DEFAULTS: dict[str, Any] = LivePeersConfig().model_dump(exclude={"enabled"})


def block_means(t: np.ndarray, X: np.ndarray, block_s: float = 1.0
                ) -> tuple[np.ndarray, np.ndarray]:
    """1-s block means on the wall-clock grid (complete blocks with at least half their
    samples): every node's blocks line up, whenever it started."""
    if len(t) < 2:
        return np.zeros(0), np.zeros((0, X.shape[1]), np.float32)
    b = np.floor(t / block_s).astype(np.int64)
    keys, start, counts = np.unique(b, return_index=True, return_counts=True)
    iv = float(np.median(np.diff(t)))
    full = counts >= 0.5 * block_s / max(iv, 1e-6)
    full[-1] = full[-1] and (t[-1] - keys[-1] * block_s) >= block_s - 1.5 * iv
    fin = np.isfinite(X)
    sums = np.add.reduceat(np.where(fin, X, 0.0).astype(np.float64), start, axis=0)
    n = np.add.reduceat(fin.astype(np.float64), start, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        M = (sums / np.where(n > 0, n, np.nan)).astype(np.float32)
    return (keys[full] + 0.5) * block_s, M[full]


def _job_key(meta: dict) -> str | None:
    run = meta.get("run") or {}
    return str(run.get("job_id") or run.get("run_id") or "") or None


class IterationTail:
    """The job's iteration markers as they are appended to the run's ``events.jsonl`` (by the
    agent, or by reveal-torchrun directly when the run directory is its own): read on from
    where the last read ended, at most 1 MiB a time, never through a symlink."""

    def __init__(self, path: str, keep: int = 4096):
        self.path, self.off, self.rest = path, 0, b""
        self.items: deque[tuple[float, float, float]] = deque(maxlen=keep)

    def poll(self) -> list[tuple[float, float, float]]:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return list(self.items)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                return list(self.items)
            if st.st_size < self.off:          # replaced: start again
                self.off, self.rest = 0, b""
            data = os.pread(fd, 1 << 20, self.off)
        except OSError:
            return list(self.items)
        finally:
            os.close(fd)
        self.off += len(data)
        lines = (self.rest + data).split(b"\n")
        self.rest = lines.pop()
        if len(self.rest) > 1 << 16:           # no line is that long: skip the garbage
            self.rest = b""
        for ln in lines:
            if b'"iteration"' not in ln:
                continue
            try:
                e = json.loads(ln)
                t, dt, n = float(e["t"]), float(e["dt"]), float(e.get("n") or 1)
            except (ValueError, KeyError, TypeError):
                continue
            if e.get("event") == "iteration" and dt > 0 and n > 0:
                self.items.append((t, dt, n))
        return list(self.items)


class PeerLive:
    """Publishes one node's recent blocks and compares them with its peers' (see module)."""

    def __init__(self, run_dir: str, node: str, key: str, start: float,
                 config: dict | None = None):
        settings = LivePeersConfig.model_validate(
            {k: v for k, v in (config or {}).items() if k != "enabled"})
        self.cfg = {k: float(v) for k, v in settings.model_dump(exclude={"enabled"}).items()}
        self.run_dir, self.node, self.key, self.start = run_dir, node, key, float(start)
        self._reported: dict[tuple[str, str], float] = {}
        self.checks = 0
        self.iterations = IterationTail(os.path.join(run_dir, store.EVENTS))

    # -- publish -------------------------------------------------------------------------
    def publish(self, t: np.ndarray, X: np.ndarray, names: list[str], units: list[str],
                iterations: list[tuple[float, float, float]] | None = None) -> None:
        """``iterations``: the job's recent markers on this node, ``(t, dt, n)`` (default:
        what the run's events.jsonl holds): a symptom alone is named only when the job slowed
        (:func:`~reveal_plugins.detect.peers.nodes.compare`)."""
        lo = float(t[-1]) - self.cfg["horizon_s"] if len(t) else 0.0
        sel = t >= lo
        bt, M = block_means(t[sel], X[sel])
        if iterations is None:
            iterations = self.iterations.poll()
        its = np.asarray([x for x in iterations if x[0] >= lo], np.float64).reshape(-1, 3)
        buf = io.BytesIO()
        np.savez(buf, t=bt, X=M, it=its, names=np.array(names, dtype=str),
                 units=np.array(units, dtype=str), node=np.array(self.node),
                 key=np.array(self.key), start=np.array(self.start))
        from ...store.rundir import write_file
        write_file(self.run_dir, FILE, buf.getvalue(), 0o644, sync=False)

    # -- compare -------------------------------------------------------------------------
    def peer_dirs(self) -> list[str]:
        """Sibling run directories of the same job, nearest in host order, up to max_peers."""
        parent = os.path.dirname(os.path.abspath(self.run_dir))
        me = os.path.basename(os.path.abspath(self.run_dir))
        try:
            names = sorted(d for d in os.listdir(parent) if d != me)
        except OSError:
            return []
        names = [d for d in names if os.path.isfile(os.path.join(parent, d, FILE))
                 and not os.path.islink(os.path.join(parent, d))]
        k = int(self.cfg["max_peers"])
        if len(names) > k:   # the nearest in host order, wrapping around
            pos = sum(1 for d in names if d < me)
            names = [names[(pos + j) % len(names)] for j in range(-(k // 2), k - k // 2)]
        return [os.path.join(parent, d) for d in names]

    @staticmethod
    def read(run_dir: str) -> dict | None:
        """A peer's published blocks (None when unreadable); never follows a symlink."""
        try:
            fd = os.open(os.path.join(run_dir, FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            with os.fdopen(fd, "rb") as f:
                data = f.read(64 << 20)
            z = np.load(io.BytesIO(data), allow_pickle=False)
            out = {k: z[k] for k in ("t", "X", "names", "units", "node", "key", "start")}
            it = z["it"] if "it" in z.files else np.zeros((0, 3))
            out["it"] = it if it.ndim == 2 and it.shape[1] == 3 else np.zeros((0, 3))
            return out
        except Exception as e:   # torn, foreign or hostile file: leave that peer out
            log.debug("peer file %s unreadable: %s", run_dir, e)
            return None

    def check(self, now: float | None = None) -> list[dict]:
        """Compare the published blocks of this node and its peers; new ongoing suspects."""
        self.checks += 1
        now = time.time() if now is None else now
        mine = self.read(self.run_dir)
        if mine is None or len(mine["t"]) < 10:
            return []
        nodes = [self._series(mine)]
        for d in self.peer_dirs():
            p = self.read(d)
            if p is None or str(p["key"]) != self.key or not len(p["t"]):
                continue
            if float(p["t"][-1]) < float(mine["t"][-1]) - self.cfg["stale_s"]:
                continue
            nodes.append(self._series(p))
        if len(nodes) < 2 or len({s.node for s in nodes}) < len(nodes):
            return []
        res = compare(nodes, LIVE_COMPARE)
        newest = min(float(s.t[-1]) for s in nodes)
        out = []
        for sp in res.suspects:
            k = (sp["node"], sp["subsystem"])
            if sp["end"] < newest - 3.0:         # over already: the batch report tells it
                continue
            last = self._reported.get(k)
            if last is not None and sp["start"] <= last + self.cfg["gap_s"]:
                self._reported[k] = sp["end"]
                continue
            self._reported[k] = sp["end"]
            sp.update({"live": True, "detected_at": round(now, 3),
                       "peers_compared": len(nodes) - 1})
            out.append(sp)
        return out

    @staticmethod
    def _series(p: dict) -> NodeSeries:
        its = [{"event": "iteration", "t": float(a), "dt": float(b), "n": float(c)}
               for a, b, c in np.asarray(p.get("it", np.zeros((0, 3))), np.float64)]
        return NodeSeries(str(p["node"]), np.asarray(p["t"], np.float64),
                          np.asarray(p["X"], np.float64), [str(x) for x in p["names"]],
                          [str(x) for x in p["units"]], events=its, starts=[float(p["start"])],
                          ends=[])


def for_run(run: Any, config: dict | None = None) -> PeerLive | None:
    """A :class:`PeerLive` for an agent's run when its run directory sits in a job directory
    (``<...>/<job>/<node>/``); None otherwise or when live peers are off (``config["peers"]
    = False``)."""
    if isinstance(config, dict) and config.get("live_peers") is False:
        return None
    run_dir = getattr(run, "run_dir", None)
    if not run_dir:
        return None
    try:
        meta = store.read_meta(run_dir)
    except Exception:
        return None
    key = _job_key(meta)
    if key is None:
        return None
    node = os.path.basename(os.path.normpath(run_dir))
    lp = (config or {}).get("live_peers") if isinstance(config, dict) else None
    return PeerLive(run_dir, node, key, float(meta.get("start") or time.time()),
                    lp if isinstance(lp, dict) else None)
