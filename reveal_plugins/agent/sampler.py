"""The agent's sampling half: opens every probe once, reads the due ones on a drift-free
monotonic schedule, and hands each registered run its columns of the row.

Each tick only takes the probes' raw readings (:meth:`Probe.read_raw`); once a second they are
parsed together into rows (:meth:`Sampler._drain`), or sooner when someone needs the rows.

Slow probes (``interval_s`` a multiple of the agent's) are read every n-th tick; the stored row
has NaN for them in between, live consumers see the last value held."""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Any, Sequence

import numpy as np

from ..hooks import get_plugin_manager, hook
from ..types import ChannelMeta
from ..probes.probe import Probe

log = logging.getLogger("reveal.agent")


#: how often the sampler parses what it read (seconds): a 10 Hz wake-up then only reads its
#: files, and the parsing of ten ticks runs together with warm caches (see Probe.read_raw)
DRAIN_S = 1.0


class _Failed:
    """A reading that raised: its probe's channels are NaN on that tick."""

    __slots__ = ("error",)

    def __init__(self, error: Exception):
        self.error = error


def _floats(row: list) -> np.ndarray:
    """One row as floats; a value a probe should not have returned (a string, an object)
    becomes NaN instead of costing the row."""
    try:
        return np.array(row, dtype=float)
    except (TypeError, ValueError):
        out = np.full(len(row), np.nan)
        for i, v in enumerate(row):
            try:
                out[i] = v
            except (TypeError, ValueError):
                pass
        return out


class Sampler:
    """Mixin of :class:`~reveal_plugins.agent.daemon.Agent`: probes and the sampling loop."""

    def _open_probes(self) -> None:
        pm = get_plugin_manager()
        probes: list[Probe] = []
        for batch in hook().reveal_register_probes(config=self.config):
            probes.extend(batch)
        self.all_probes = probes
        self.probes: list[Probe] = []
        slices = []
        every = []
        channels: list[ChannelMeta] = []
        for p in probes:
            try:
                p.open()
            except Exception as e:  # a probe must not raise from open(); if it does, skip it
                p.available, p.reason = False, f"open() failed: {type(e).__name__}: {e}"
            if p.available and p.channels:
                slices.append((len(channels), len(channels) + len(p.channels)))
                n = max(1, round((p.interval_s or 0) / self.interval_s))
                every.append(n)
                chans = p.channels
                if n > 1:
                    chans = [dataclasses.replace(c, sample_every_s=n * self.interval_s)
                             for c in chans]
                channels.extend(chans)
                self.probes.append(p)
        self.slices = slices
        self.every = every
        self.channels = channels
        self.channel_names = [c.name for c in channels]
        self._slow_every = sorted({n for n in every if n > 1})
        # which probes each tick reads, worked out once per phase: tick k reads
        # _due(k % _period); a tick that reads every probe has phase 0
        self._period = math.lcm(*every) if every else 1
        self._due_cache: dict[int, list[tuple[int, Any]]] = {}
        # rows are plain lists on the sampling path: at 10 Hz the per-tick numpy calls cost more
        # than the reads (a cold interpreter pays ~10 µs per call); one array per run per tick
        self._nan_blocks = [[np.nan] * (b - a) for a, b in slices]
        self._held: list[float] = [np.nan] * len(channels)
        self._read_all = True
        self._pending: list[tuple] = []      # ticks read, not parsed yet (see _drain)
        # at most a tenth of a segment pending: what a kill -9 loses stays within the open
        # segment, which it loses anyway
        self._drain_every = max(1, round(min(DRAIN_S, self.segment_s / 10) / self.interval_s))
        del pm

    def probe_table(self) -> list[dict[str, Any]]:
        return [p.describe() for p in self.all_probes]

    def _read_host(self) -> tuple[list[tuple[int, Any]], bool]:
        """Take the raw readings of the host probes due on this tick: ``([(probe index,
        reading)], full)``; ``full`` says every probe was read."""
        k = self.ticks % self._period
        read_all, self._read_all = self._read_all, False
        raws: list[tuple[int, Any]] = []
        for i, read in self._due(0 if read_all else k):
            try:
                raws.append((i, read()))
            except Exception as e:
                raws.append((i, _Failed(e)))
        return raws, read_all or k == 0

    def _due(self, k: int) -> list[tuple[int, Any]]:
        due = self._due_cache.get(k)
        if due is None:
            due = [(i, p.read_raw) for i, (p, n) in enumerate(zip(self.probes, self.every))
                   if k % n == 0]
            if len(self._due_cache) < 10_000:   # odd probe intervals: a long period
                self._due_cache[k] = due
        return due

    def _values(self, p: Probe, raw: Any, n: int) -> Sequence[float] | None:
        """A reading's values; None (and the failure reported once) when reading or parsing
        it raised or it has the wrong length."""
        try:
            if isinstance(raw, _Failed):
                raise raw.error
            vals = p.parse_raw(raw)
            if len(vals) != n:
                raise ValueError(f"returned {len(vals)} values for {n} channels")
            return vals
        except Exception as e:
            self._probe_failed(p.name, e)
            return None

    def _host_row(self, raws: list[tuple[int, Any]]) -> tuple[list[float], list[float]]:
        """``(row, held)`` of one tick's readings: ``row`` has NaN for the slow probes not read
        on it (what is stored), ``held`` repeats their last values (what live consumers see)."""
        row: list[float] = []
        held = self._held.copy() if self._slow_every else row
        due = iter(raws)
        nxt = next(due, None)
        for i, (p, (a, b), nan) in enumerate(zip(self.probes, self.slices, self._nan_blocks)):
            if nxt is None or nxt[0] != i:
                row.extend(nan)
                continue
            vals = self._values(p, nxt[1], b - a)
            nxt = next(due, None)
            if vals is None:
                vals = nan
            row.extend(vals)
            if held is not row:
                held[a:b] = vals
        if held is not row:
            self._held = held
        return row, held

    def _probe_failed(self, name: str, e: Exception) -> None:
        if name in self._failed_probes:
            return
        self._failed_probes.add(name)  # logged once; the others go on
        msg = f"{type(e).__name__}: {e}"
        log.warning("probe %s failed (further errors not logged): %s", name, msg)
        with self._lock:
            for st in self._runs.values():
                self._event(st, "probe_error", probe=name, error=msg)

    def latest(self) -> tuple[float, dict[str, float]] | None:
        with self._lock:
            self._drain()
            snap = self._latest
        if snap is None:
            return None
        return snap[0], dict(zip(self.channel_names, _floats(snap[1]).tolist()))

    def sample_once(self) -> None:
        """One tick: take the due probes' readings; every ``DRAIN_S`` parse the ticks taken
        since into rows (:meth:`_drain`)."""
        c0 = time.thread_time()
        t, mono = time.time(), time.monotonic()  # wall clock labels, monotonic schedules
        raws, full = self._read_host()
        with self._lock:
            runs = []
            for st in self._runs.values():
                if st.awaiting_full_read:
                    if not full:  # registered after this tick's reads began
                        continue
                    st.awaiting_full_read = False
                extra = []
                for p in st.probes:
                    try:
                        extra.append(p.read_raw())
                    except Exception as e:
                        extra.append(_Failed(e))
                runs.append((st, extra))
            self._pending.append((t, mono, raws, runs))
            self.ticks += 1
            if len(self._pending) >= self._drain_every:
                self._drain()
        self.sample_cpu_s += time.thread_time() - c0

    def _drain(self) -> None:
        """Parse the ticks taken since the last drain, in order, into each run's segment
        writer and live rows and the latest snapshot.  Called with ``_lock`` held: by the
        sampler every ``DRAIN_S``, and by whoever needs the rows now (the live loop, a run
        ending, ``latest()``), so nothing waits for the sampler's next drain."""
        pending, self._pending = self._pending, []
        for t, mono, raws, runs in pending:
            row, held = self._host_row(raws)
            self._latest = (t, held)
            for st, readings in runs:
                if self._runs.get(st.run.run_id) is not st:   # ended: drained before it did
                    continue
                extra: list[float] = []
                for p, raw in zip(st.probes, readings):
                    vals = self._values(p, raw, len(p.channels))
                    extra.extend([np.nan] * len(p.channels) if vals is None else vals)
                pick = st.host_pick
                rrow = row if pick is None else list(pick(row))
                if extra:
                    rrow = rrow + extra
                try:
                    st.writer.add(t, _floats(rrow), mono)
                except Exception as e:  # disk full, directory removed: keep sampling
                    self._write_failed(st, f"segment: {type(e).__name__}: {e}")
                if st.live is not None:
                    lrow = held if pick is None else list(pick(held))
                    if extra:
                        lrow = lrow + extra
                    st.live_t.append(t)
                    st.live_rows.append(_floats(lrow))

    def _sampling_loop(self) -> None:
        t0 = time.monotonic()
        k = 0
        while not self._stop.is_set():
            k += 1
            target = t0 + k * self.interval_s
            delay = target - time.monotonic()
            if delay < 0:  # fell behind (suspended, overloaded): skip the missed ticks
                missed = int(-delay // self.interval_s) + 1
                self.missed_ticks += missed - 1 if missed > 1 else 0
                k += missed - 1
                target = t0 + k * self.interval_s
                delay = max(0.0, target - time.monotonic())
            # time.sleep is one syscall; Event.wait with a timeout costs several times more
            # per tick, which matters at 10 Hz.  Stop latency stays below one interval.
            time.sleep(delay)
            if self._stop.is_set():
                break
            try:
                self.sample_once()
            except Exception as e:  # never let the loop die
                log.exception("sampling failed: %s", e)
