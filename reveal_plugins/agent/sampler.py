"""The agent's sampling half: opens every probe once, reads the due ones on a drift-free
monotonic schedule, and hands each registered run its columns of the row.

Slow probes (``interval_s`` a multiple of the agent's) are read every n-th tick; the stored row
has NaN for them in between, live consumers see the last value held."""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import numpy as np

from ..hooks import get_plugin_manager, hook
from ..types import ChannelMeta
from ..probes.probe import Probe

log = logging.getLogger("reveal.agent")


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
        # rows are plain lists on the sampling path: at 10 Hz the per-tick numpy calls cost more
        # than the reads (a cold interpreter pays ~10 µs per call); one array per run per tick
        self._nan_blocks = [[np.nan] * (b - a) for a, b in slices]
        self._held: list[float] = [np.nan] * len(channels)
        self._read_all = True
        del pm

    def probe_table(self) -> list[dict[str, Any]]:
        return [p.describe() for p in self.all_probes]

    def _sample_host(self) -> tuple[list[float], list[float], bool]:
        """Read the probes due on this tick.  Returns ``(row, held, full)``: ``row`` has NaN
        for the slow probes not read this tick (what is stored), ``held`` repeats their last
        values (what live consumers see), ``full`` says every probe was read."""
        tick = self.ticks
        read_all, self._read_all = self._read_all, False
        full = read_all or all(tick % n == 0 for n in self._slow_every)
        row: list[float] = []
        held = self._held.copy() if self._slow_every else row
        for p, (a, b), n, nan in zip(self.probes, self.slices, self.every, self._nan_blocks):
            if n > 1 and tick % n and not read_all:
                row.extend(nan)
                continue
            try:
                vals = p.sample()
                if len(vals) != b - a:
                    raise ValueError(f"returned {len(vals)} values for {b - a} channels")
            except Exception as e:
                self._probe_failed(p.name, e)
                vals = nan
            row.extend(vals)
            if held is not row:
                held[a:b] = vals
        if held is not row:
            self._held = held
        return row, held, full

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
        snap = self._latest
        if snap is None:
            return None
        return snap[0], dict(zip(self.channel_names, _floats(snap[1]).tolist()))

    def sample_once(self) -> None:
        c0 = time.thread_time()
        t, mono = time.time(), time.monotonic()  # wall clock labels, monotonic schedules
        row, held, full = self._sample_host()
        self._latest = (t, held)
        with self._lock:
            for st in self._runs.values():
                if st.awaiting_full_read:
                    if not full:  # registered after this tick's reads began
                        continue
                    st.awaiting_full_read = False
                extra = []
                for p in st.probes:
                    try:
                        vals = p.sample()
                        if len(vals) != len(p.channels):
                            raise ValueError(f"returned {len(vals)} values for "
                                             f"{len(p.channels)} channels")
                        extra.extend(vals)
                    except Exception as e:
                        self._probe_failed(p.name, e)
                        extra.extend([np.nan] * len(p.channels))
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
        self.ticks += 1
        self.sample_cpu_s += time.thread_time() - c0

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
