"""Where node-level run directories live (the Slurm spool, shared by the agent and ``reveal report``).

Layout: ``<spool>/jobs/<job_id>/<host>/`` is the run directory of job ``job_id`` on node ``host``
(one per job per node; steps are marked inside it).  ``<spool>/agent.sock`` is the node agent's
socket.  The spool root is ``$REVEAL_SPOOL`` or ``/var/spool/reveal``.
"""
from __future__ import annotations

import os
import re

DEFAULT_SPOOL = "/var/spool/reveal"
JOB_ID_RE = re.compile(r"^[0-9]+(_[0-9]+)?(\+[0-9]+)?$")


def spool_root() -> str:
    return os.environ.get("REVEAL_SPOOL") or DEFAULT_SPOOL


def agent_socket(spool: str | None = None) -> str:
    return os.path.join(spool or spool_root(), "agent.sock")


def job_dir(job_id: str, spool: str | None = None) -> str:
    if not JOB_ID_RE.match(str(job_id)):
        raise ValueError(f"invalid Slurm job id {job_id!r} (expected digits, e.g. 1234 or 1234_5)")
    return os.path.join(spool or spool_root(), "jobs", str(job_id))


def job_run_dirs(job_id: str, spool: str | None = None) -> list[str]:
    """Run directories (one per node) of a job, sorted by host name; [] when none exist."""
    d = job_dir(job_id, spool)
    try:
        hosts = sorted(os.listdir(d))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [os.path.join(d, h) for h in hosts if os.path.isfile(os.path.join(d, h, "meta.json"))]
