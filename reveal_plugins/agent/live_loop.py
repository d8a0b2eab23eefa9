"""The agent's live loop: every few seconds, each live run's new rows go to its
live analyzer (the ``reveal_live_analyzer`` hook); findings become ``live_finding`` events and
``reveal_live_finding`` hook calls (OTel span events, peers); a multi-node job's suspect node
(the ``reveal_live_peers`` hook) becomes a ``peer_suspect`` event."""
from __future__ import annotations

import logging
import time

import numpy as np

from ..hooks import hook
from ..types import ChannelMeta

log = logging.getLogger("reveal.agent")


class LiveLoop:
    """Mixin of :class:`~reveal_plugins.agent.daemon.Agent`: live detection."""

    def _make_live(self, channels: list[ChannelMeta]):
        """The run's live analyzer from the ``reveal_live_analyzer`` hook (a plugin's
        failure is logged by the plugin manager and leaves live mode off for the run)."""
        live = hook().reveal_live_analyzer(channels=channels, interval_s=self.interval_s,
                                           config=self.config)
        if live is None:
            log.warning("live mode unavailable: no reveal_live_analyzer plugin answered")
        return live

    def _live_loop(self, every_s: float = 2.0, settle_s: float = 0.4) -> None:
        # On the wall-clock grid (every node's agent wakes at the same moments): each node
        # publishes its blocks for the peers at k * every_s and compares settle_s later, so
        # what it reads of its peers is fresh, not up to one period old.
        while not self._stop.wait(every_s - time.time() % every_s):
            with self._lock:
                self._drain()
                work = []
                for st in self._runs.values():
                    if st.live is not None and st.live_t:
                        work.append((st, np.asarray(st.live_t), np.vstack(st.live_rows)))
                        st.live_t, st.live_rows = [], []
            for st, t, rows in work:
                try:
                    findings = st.live.update(t, rows) or []
                except Exception as e:
                    log.warning("live analysis of %s failed: %s: %s", st.run.run_id,
                                type(e).__name__, e)
                    st.live = None
                    continue
                for a in findings:
                    st.live_findings += 1
                    with self._lock:
                        self._event(st, "live_finding", anomaly=a)
                    hook().reveal_live_finding(run=st.run, anomaly=a)
            published = [st for st, _, _ in work if self._peer_publish(st)]
            if published and not self._stop.wait(settle_s):
                for st in published:
                    self._peer_check(st)

    def _peer_publish(self, st) -> bool:
        """A run of a multi-node job whose run directories sit side by side (shared spool):
        publish this node's live horizon for its peers (the ``reveal_live_peers`` hook);
        True when it then has peers to compare with."""
        peer = getattr(st, "peer_live", False)
        if peer is False:    # first call for this run: is it part of a job with peers?
            peer = hook().reveal_live_peers(run=st.run, config=self.config)
            st.peer_live = peer
        if peer is None or st.live is None:
            return False
        try:
            h = st.live.horizon()
            if h is None:
                return False
            peer.publish(*h)
            return True
        except Exception as e:   # never break the agent; give up on peers for this run
            log.warning("live peer publishing of %s failed: %s: %s", st.run.run_id,
                        type(e).__name__, e)
            st.peer_live = None
            return False

    def _peer_check(self, st) -> None:
        """Compare with the peers' fresh blocks; each new suspect becomes a ``peer_suspect``
        event and a ``reveal_live_finding`` hook call."""
        peer = getattr(st, "peer_live", None)
        if not peer:
            return
        try:
            suspects = peer.check()
        except Exception as e:   # never break the agent; give up on peers for this run
            log.warning("live peer comparison of %s failed: %s: %s", st.run.run_id,
                        type(e).__name__, e)
            st.peer_live = None
            return
        for sp in suspects:
            with self._lock:
                self._event(st, "peer_suspect", suspect=sp)
            hook().reveal_live_finding(run=st.run, anomaly=sp)
