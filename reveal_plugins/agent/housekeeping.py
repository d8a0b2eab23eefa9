"""The agent's housekeeping loop: the pending queue (requests root left while no agent
listened), runs whose owner died, old job directories, and exiting when idle."""
from __future__ import annotations

import logging
import os
import select
import threading
import time

from ..types import RunInfo
from . import pending
from ..store import store

log = logging.getLogger("reveal.agent")


class Housekeeping:
    """Mixin of :class:`~reveal_plugins.agent.daemon.Agent`: the background chores."""

    def prune_old_jobs(self, now: float | None = None) -> list[str]:
        """Remove ``<spool>/jobs/<job>`` once every run in it ended more than
        ``retention_days`` ago (config, default 30; 0 keeps everything).  A run that was never
        closed (``end`` null: its agent died and no Epilog closed it, or its end could not be
        written) counts as ended when its directory last changed.  ``shutil.rmtree`` works on
        directory descriptors here and never follows a planted symlink."""
        import shutil
        days = float(self.config.get("retention_days", 30))
        if days <= 0:
            return []
        cutoff = (time.time() if now is None else now) - days * 86400
        jobs = os.path.join(self.spool, "jobs")
        removed = []
        try:
            names = os.listdir(jobs)
        except OSError:
            return removed
        open_ids = {st.run.job_id for st in self._runs.values()}
        unfinished = set(getattr(self, "_unfinished", {}))
        for job in names:
            d = os.path.join(jobs, job)
            if job in open_ids or os.path.islink(d) or not os.path.isdir(d):
                continue
            try:
                ends = []
                for h in os.listdir(d):
                    rd = os.path.join(d, h)
                    meta = store.read_meta(rd)
                    end = meta.get("end")
                    if end is None and rd not in unfinished:
                        end = store.last_activity(rd, meta)
                    ends.append(end)
            except Exception:
                continue  # unreadable or torn: an operator should look, not the agent delete
            if ends and all(isinstance(e, (int, float)) and e < cutoff for e in ends):
                shutil.rmtree(d, ignore_errors=True)
                removed.append(job)
        if removed:
            log.info("removed %d job directories older than %g days", len(removed), days)
        return removed

    def _pending_loop(self) -> None:
        pend = os.path.join(self.spool, "pending")
        while not self._stop.is_set():
            self.housekeeping_pass(pend)
            if self._stop.wait(1.0):  # each wake-up costs ~0.03 % of a core on a VM
                break
            if self.exit_when_idle and not self._runs and \
                    time.monotonic() - self._idle_since > self.idle_grace_s:
                log.info("no runs left; exiting")
                self._stop.set()
            if self._runs:
                self._idle_since = time.monotonic()

    def housekeeping_pass(self, pend: str) -> None:
        """One round of chores; each in its own ``try`` so that one failing (a bad file in
        the queue, an unreadable job directory) never stops the others."""
        def prune() -> None:
            if time.monotonic() >= self._next_prune:
                self._next_prune = time.monotonic() + 3600
                self.prune_old_jobs()
        for name, chore in (("thread names", self._name_os_threads),
                            ("pending queue", lambda: self.take_pending(pend)),
                            ("reaping dead owners", self._reap_owners),
                            ("closing unfinished runs", self.close_unfinished),
                            ("retention", prune)):
            try:
                chore()
            except Exception as e:
                log.warning("housekeeping (%s) failed: %s: %s", name, type(e).__name__, e)

    def _name_os_threads(self) -> None:
        """Give each thread its Python name in the kernel too (``top -H``, ``ps -L``,
        ``/proc/<agent>/task/*/comm``: which thread spends the agent's CPU).  A thread may
        rename its siblings through /proc; only threads not named yet are written."""
        named = self.__dict__.setdefault("_os_named", set())
        threads = threading.enumerate()
        named.intersection_update(th.native_id for th in threads)  # ids are reused
        for th in threads:
            tid = th.native_id
            if tid is None or tid in named:
                continue
            named.add(tid)
            try:
                with open(f"/proc/self/task/{tid}/comm", "w") as f:
                    f.write(th.name[:15])
            except OSError:
                pass  # exited meanwhile, or /proc read-only: cosmetic only

    def take_pending(self, pend: str) -> None:
        """Register runs queued as files while the socket was not up (root/own-uid files only).

        A registration whose unregister is queued too (the job ended while no agent ran) is
        finalized at once, so the Epilog's analysis finds a closed run and no sampling starts
        for a job that is gone."""
        reqs = pending.take(pend, (0, self.uid))
        ended = {r.get("run_id") for _, r in reqs if r.get("op") == "unregister"}
        for path, req in reqs:
            try:
                op = req.get("op", "register")
                if op == "register":
                    run = RunInfo.from_dict(req["run"])
                    if self._already_closed(run):
                        log.info("pending registration %s: run %s was closed while no agent "
                                 "ran (its job ended); not reopened", path, run.run_id)
                        continue
                    self.register(run)
                    if run.run_id in ended:
                        self.event(run.run_id, "registered_after_end", source="pending")
                elif op == "unregister":
                    self.unregister(req["run_id"], req.get("exit_code"))
                elif op == "event":
                    self.event(req.pop("run_id"), req.pop("event"), req.pop("t", None),
                               **{k: v for k, v in req.items() if k not in ("op", "v")})
            except Exception as e:
                log.warning("pending request %s ignored: %s: %s", path, type(e).__name__, e)

    @staticmethod
    def _already_closed(run: RunInfo) -> bool:
        """The run directory holds a finished run (the Epilog finalized it from disk)."""
        if not run.run_dir:
            return False
        try:
            return store.read_meta(run.run_dir).get("end") is not None
        except Exception:  # absent or unreadable: nothing to protect
            return False

    def _reap_owners(self) -> None:
        """Close runs whose owning process died (pidfd readable = the process exited)."""
        with self._lock:
            watched = [(st.run.run_id, st.owner_fd) for st in self._runs.values()
                       if st.owner_fd is not None]
        if not watched:
            return
        ready, _, _ = select.select([fd for _, fd in watched], [], [], 0)
        for run_id, fd in watched:
            if fd in ready:
                log.warning("run %s: its owner process died without closing it; closing it",
                            run_id)
                try:
                    with self._lock:
                        st = self._runs.get(run_id)
                        if st is not None:
                            self._event(st, "owner_gone")
                    self.unregister(run_id, None)
                except KeyError:
                    pass
