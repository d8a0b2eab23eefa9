"""Job metadata from Slurm: pyslurm when it is importable, Slurm's own CLIs otherwise.

Used after the job (analysis, summaries, tests) -- never in the Prolog, which must not load
slurmctld on a large cluster.  pyslurm is an optional extra (PyPI has no build for Slurm
22.05), so the tested path is ``squeue --json`` and then ``scontrol -o show job``.
"""
from __future__ import annotations

import json
import re
import subprocess
from typing import Any

from ..spool import JOB_ID_RE

FIELDS = ("job_id", "name", "user", "uid", "gid", "partition", "account", "state", "nodes",
          "num_nodes", "exit_code", "start", "end", "work_dir", "gres")


class JobInfoError(RuntimeError):
    """No source could describe the job; the message lists what each source said."""


def _from_pyslurm(job_id: str) -> dict[str, Any]:
    import pyslurm  # optional extra
    if hasattr(pyslurm, "db"):  # pyslurm >= 23: object API
        j = pyslurm.Job.load(int(job_id))
        return {"job_id": str(j.id), "name": j.name, "user": j.user_name, "uid": j.user_id,
                "gid": j.group_id, "partition": j.partition, "account": j.account,
                "state": j.state, "nodes": j.nodes, "num_nodes": j.num_nodes,
                "exit_code": getattr(j, "exit_code", None), "start": j.start_time,
                "end": j.end_time, "work_dir": j.working_directory, "gres": None,
                "source": "pyslurm"}
    d = pyslurm.job().find_id(int(job_id))[0]
    return {"job_id": str(d.get("job_id")), "name": d.get("name"), "user": d.get("user_id"),
            "uid": d.get("user_id"), "gid": d.get("group_id"), "partition": d.get("partition"),
            "account": d.get("account"), "state": d.get("job_state"), "nodes": d.get("nodes"),
            "num_nodes": d.get("num_nodes"), "exit_code": d.get("exit_code"),
            "start": d.get("start_time"), "end": d.get("end_time"),
            "work_dir": d.get("work_dir"), "gres": d.get("tres_per_node"), "source": "pyslurm"}


def _num(v: Any) -> Any:
    """squeue --json wraps some numbers as {"set":..,"number":..} (newer Slurm)."""
    if isinstance(v, dict) and "number" in v:
        return v["number"] if v.get("set", True) else None
    return v


def from_squeue_json(doc: dict[str, Any], job_id: str) -> dict[str, Any]:
    """Pick job ``job_id`` out of ``squeue --json`` output."""
    for j in doc.get("jobs", []):
        if str(j.get("job_id")) == str(job_id):
            state = j.get("job_state")
            if isinstance(state, list):
                state = ",".join(state)
            ec = j.get("exit_code")
            if isinstance(ec, dict):
                ec = _num(ec.get("return_code"))
            return {"job_id": str(job_id), "name": j.get("name"), "user": j.get("user_name"),
                    "uid": _num(j.get("user_id")), "gid": _num(j.get("group_id")),
                    "partition": j.get("partition"), "account": j.get("account"),
                    "state": state, "nodes": j.get("nodes"),
                    "num_nodes": _num(j.get("node_count")), "exit_code": ec,
                    "start": _num(j.get("start_time")), "end": _num(j.get("end_time")),
                    "work_dir": j.get("current_working_directory"),
                    "gres": j.get("tres_per_node") or None, "source": "squeue"}
    raise JobInfoError(f"job {job_id} not in squeue --json output")


_KV = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z:/_]*)=")


def parse_scontrol_line(line: str) -> dict[str, str]:
    """Parse one ``scontrol -o show job`` line into {Key: Value} (values may hold spaces)."""
    out: dict[str, str] = {}
    matches = list(_KV.finditer(line))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out[m.group(1)] = line[m.end():end].strip()
    return out


def from_scontrol(kv: dict[str, str], job_id: str) -> dict[str, Any]:
    def num(key: str) -> int | None:
        m = re.match(r"(\d+)", kv.get(key, ""))
        return int(m.group(1)) if m else None

    user = kv.get("UserId", "")
    m = re.match(r"([^()]*)\((\d+)\)", user)
    g = re.match(r"([^()]*)\((\d+)\)", kv.get("GroupId", ""))
    ec = kv.get("ExitCode", "")
    return {"job_id": str(job_id), "name": kv.get("JobName"),
            "user": m.group(1) if m else user or None, "uid": int(m.group(2)) if m else None,
            "gid": int(g.group(2)) if g else None, "partition": kv.get("Partition"),
            "account": None if kv.get("Account") in (None, "(null)") else kv.get("Account"),
            "state": kv.get("JobState"), "nodes": kv.get("NodeList"),
            "num_nodes": num("NumNodes"),
            "exit_code": int(ec.split(":")[0]) if ec.split(":")[0].isdigit() else None,
            "start": kv.get("StartTime"), "end": kv.get("EndTime"),
            "work_dir": kv.get("WorkDir"),
            "gres": None if kv.get("TresPerNode") in (None, "(null)") else kv.get("TresPerNode"),
            "source": "scontrol"}


def job_info(job_id: str, timeout: float = 5.0, use_pyslurm: bool = True) -> dict[str, Any]:
    """Describe job ``job_id`` (keys: FIELDS plus ``source``); raises JobInfoError."""
    job_id = str(job_id)
    if not JOB_ID_RE.match(job_id):
        raise ValueError(f"invalid Slurm job id {job_id!r}")
    errors = []
    if use_pyslurm:
        try:
            return _from_pyslurm(job_id)
        except ImportError:
            errors.append("pyslurm: not installed")
        except Exception as e:
            errors.append(f"pyslurm: {type(e).__name__}: {e}")
    try:
        r = subprocess.run(["squeue", "--json", "-j", job_id], capture_output=True, text=True,  # nosec B607  # Slurm's client from the PATH slurmd gives; job_id one argv item
                           timeout=timeout)
        if r.returncode == 0:
            return from_squeue_json(json.loads(r.stdout), job_id)
        errors.append(f"squeue: {r.stderr.strip() or 'exit ' + str(r.returncode)}")
    except (OSError, subprocess.TimeoutExpired, ValueError, JobInfoError) as e:
        errors.append(f"squeue: {e}")
    try:
        r = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True,  # nosec B607  # as squeue above
                           text=True, timeout=timeout)
        if r.returncode == 0 and r.stdout.strip():
            return from_scontrol(parse_scontrol_line(r.stdout.strip().splitlines()[0]), job_id)
        errors.append(f"scontrol: {r.stderr.strip() or 'exit ' + str(r.returncode)}")
    except (OSError, subprocess.TimeoutExpired) as e:
        errors.append(f"scontrol: {e}")
    raise JobInfoError(f"job {job_id}: " + "; ".join(errors))
