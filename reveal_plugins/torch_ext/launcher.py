"""``reveal-torchrun [--reveal-out DIR] [--reveal-interval S] [--reveal-no-markers] [--reveal-off]
<torchrun args>``.

A drop-in ``torchrun``: it runs ``torch.distributed.run.main`` in this process, unchanged, with
the node's hardware telemetry recorded around it (``reveal_plugins.recording.Recording``: a
private agent, or the agent of the Slurm job it runs in), torchelastic's events and metrics
captured into ``events.jsonl`` (``elastic.py``), the rank layout (rank -> PID) recorded at every
worker start, and the workers' iteration markers received (``markers.py``).  At the end the run
is analysed and the summary printed; the exit code is torchrun's.

Only ``--reveal-*`` options placed before the training script are ours; everything else is
passed to torchrun untouched.  An unknown ``--reveal-*`` option is an error before anything
starts.  With ``--reveal-off`` it is exactly ``torchrun``.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

from ..agent import protocol
from ..agent.client import AgentClient, AgentError
from . import markers

log = logging.getLogger(__name__)

PROG = "reveal-torchrun"
USAGE = f"""usage: {PROG} [--reveal-out DIR] [--reveal-interval S] [--reveal-no-markers] [--reveal-off]
                       <torchrun arguments>

Runs torchrun (torch.distributed.run) with hardware telemetry recorded for the whole launch,
analyses it at the end and prints the summary.  The exit code is torchrun's.

reveal options (before the training script; all other arguments go to torchrun unchanged):
  --reveal-out DIR       run directory of this node (default ./reveal-runs/<time>-<host>-<pid>);
                         in a multi-node launch DIR/<host> (DIR/<host>.2 ... when taken)
  --reveal-interval S    sampling interval in seconds (0.01-60, default 0.1)
  --reveal-no-markers    no iteration markers (by default every optimizer step of every
                         worker is reported, so reports say how much an anomaly slowed
                         training; no change to the script)
  --reveal-off           no telemetry: behave exactly like torchrun
  --reveal-version       print reveal's version and exit (alone; --version is torchrun's)

environment:
  REVEAL_ITERATION_MARKERS=0   same as --reveal-no-markers
"""
REVEAL_OPTIONS = {"--reveal-out": True, "--reveal-interval": True, "--reveal-off": False,
                  "--reveal-no-markers": False}

# Worker bootstrap for REVEAL_ITERATION_MARKERS=1: a sitecustomize put first on the workers'
# PYTHONPATH that installs the markers once torch.optim is imported, then hands over to any
# sitecustomize the environment already had (the same technique as ddtrace-run / coverage).
BOOTSTRAP = '''"""reveal-torchrun worker bootstrap (REVEAL_ITERATION_MARKERS=1)."""
import os as _os
import sys as _sys

_here = _os.path.dirname(_os.path.abspath(__file__))
try:
    from reveal_plugins.torch_ext.markers import install_import_hook as _hook
    _hook()
except Exception as _e:
    _sys.stderr.write("reveal: iteration markers not installed: %s\\n" % (_e,))
_sys.path[:] = [_p for _p in _sys.path if _os.path.abspath(_p or ".") != _here]
try:  # run the sitecustomize this one shadows, if any
    import importlib.machinery as _mach
    import importlib.util as _iu
    _spec = _mach.PathFinder.find_spec("sitecustomize", _sys.path)
    if _spec is not None and _spec.loader is not None:
        _spec.loader.exec_module(_iu.module_from_spec(_spec))
except Exception as _e:
    _sys.stderr.write("reveal: the original sitecustomize failed: %s\\n" % (_e,))
'''


class UsageError(ValueError):
    """Bad reveal option; the message names the option and value."""


@dataclass
class RevealOptions:
    out: str | None = None
    interval_s: float = 0.1
    off: bool = False
    markers: bool = True


def _torchrun_options() -> dict[str, bool]:
    """Option string -> takes a value, from torchrun's own parser (so new options just work)."""
    from torch.distributed.run import get_args_parser
    out: dict[str, bool] = {}
    for a in get_args_parser()._actions:
        for s in a.option_strings:
            out[s] = a.nargs != 0
    return out


def _takes_value(opt: str, table: dict[str, bool]) -> bool:
    if opt in table:
        return table[opt]
    hits = [v for k, v in table.items() if k.startswith(opt) and k.startswith("--")]
    return bool(hits) and all(hits)  # argparse accepts unique abbreviations of long options


def split_args(argv: list[str], table: dict[str, bool] | None = None
               ) -> tuple[RevealOptions, list[str]]:
    """Take the ``--reveal-*`` options out of ``argv`` (only before the training script)."""
    from ..recording import validate_interval
    table = _torchrun_options() if table is None else table
    opts = RevealOptions()
    rest: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--reveal"):
            name, eq, val = a.partition("=")
            if name not in REVEAL_OPTIONS:
                raise UsageError(f"unknown option {name!r} (reveal options: "
                                 f"{', '.join(REVEAL_OPTIONS)})")
            if REVEAL_OPTIONS[name]:
                if not eq:
                    if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                        raise UsageError(f"{name} needs a value")
                    i += 1
                    val = argv[i]
                if name == "--reveal-out":
                    if not val.strip():
                        raise UsageError("--reveal-out: empty directory name")
                    opts.out = val
                else:
                    try:
                        opts.interval_s = validate_interval(val)
                    except ValueError as e:
                        raise UsageError(f"--reveal-interval: {e}") from None
            else:
                if eq:
                    raise UsageError(f"{name} takes no value (got {a!r})")
                if name == "--reveal-off":
                    opts.off = True
                else:
                    opts.markers = False
            i += 1
            continue
        if a == "--" or not a.startswith("-") or a == "-":
            rest.extend(argv[i:])  # the training script and its own arguments
            break
        rest.append(a)
        if a.startswith("--"):
            name, eq, _ = a.partition("=")
            if not eq and _takes_value(name, table) and i + 1 < len(argv):
                i += 1
                rest.append(argv[i])
        elif len(a) == 2 and table.get(a) and i + 1 < len(argv):
            i += 1
            rest.append(argv[i])
        i += 1
    return opts, rest


def run_torchrun(args: list[str]) -> int:
    """``torchrun args`` in this process; returns the exit code torchrun would have."""
    from torch.distributed import run as trun
    try:
        trun.main(args)
        return 0
    except SystemExit as e:
        if e.code is None:
            return 0
        if isinstance(e.code, int):
            return e.code
        print(e.code, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        traceback.print_exc()
        return 130
    except BaseException:  # ChildFailedError, SignalException, rendezvous errors: like torchrun
        traceback.print_exc()
        return 1


def claim_node_dir(base: str) -> str:
    """``base/<host>`` (or ``.2``, ``.3`` ... when taken): one run directory per node of a
    multi-node launch, claimed atomically so two launchers never share one."""
    os.makedirs(base, exist_ok=True)
    host = socket.gethostname().split(".")[0] or "node"
    for n in range(1, 1000):
        d = os.path.join(base, host if n == 1 else f"{host}.{n}")
        try:
            os.mkdir(d, 0o750)
            return d
        except FileExistsError:
            continue
    raise UsageError(f"--reveal-out {base}: no free node directory for {host}")


def _proc_env(pid: int, keys: tuple[str, ...]) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, _, v = item.partition(b"=")
        if k.decode(errors="replace") in keys:
            out[k.decode()] = v.decode(errors="replace")
    return out


class _Session:
    """Glue between torchrun's world and the Recording: one per launch.

    The Recording starts in a background thread (the agent's start-up then overlaps torchrun's
    own); events that arrive before it is ready are kept and written, in order, by ``attach``.
    """

    def __init__(self, rec: Any) -> None:
        self.rec = rec
        self.lock = threading.Lock()
        self.ranks: dict[int, dict[str, Any]] = {}
        self.restarts = 0
        self._metric_last: dict[str, Any] = {}
        self.direct_fd: int | None = None
        self.ready = False
        self._pending: list[tuple[str, float | None, dict[str, Any]]] = []
        from .gpus import GpuMapper
        self.gpu_mapper = GpuMapper(self._gpu_found)

    def attach(self) -> None:
        """The Recording is started (or failed to): write what was kept, then go direct."""
        run_dir = self.rec.run_dir
        # Iteration events are many: when the run directory is ours (private agent), append
        # them directly in one write per batch; inside a Slurm job (root-owned run directory)
        # they go through the agent like every other event.
        if run_dir and not getattr(self.rec, "joined", False) and os.access(run_dir, os.W_OK):
            try:
                self.direct_fd = os.open(os.path.join(run_dir, "events.jsonl"),
                                         os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                                         0o640)
            except OSError:
                self.direct_fd = None
        while True:  # replay in order; what arrives meanwhile queues behind it
            with self.lock:
                pending, self._pending = self._pending, []
                if not pending:
                    self.ready = True
                    return
            for name, t, fields in pending:
                self.rec.event(name, t, **fields)

    def event(self, name: str, t: float | None, /, **fields: Any) -> None:
        # positional-only: torchelastic fields include "name"
        if not self.ready:
            with self.lock:
                if not self.ready:
                    self._pending.append((name, t, fields))
                    return
        self.rec.event(name, t, **fields)

    def add_pids(self, pids: list[int], t: float, /, **fields: Any) -> None:
        self.event("pids", t, pids=list(pids), **fields)

    def close(self) -> None:
        self.gpu_mapper.close()
        if self.direct_fd is not None:
            os.close(self.direct_fd)
            self.direct_fd = None

    def marker_events(self, events: list[dict[str, Any]]) -> None:
        if self.direct_fd is not None and self.ready:
            data = "".join(json.dumps(e, sort_keys=True, default=str) + "\n" for e in events)
            try:
                os.write(self.direct_fd, data.encode())
                return
            except OSError as e:
                log.debug("direct event write failed (%s); using the agent", e)
        if self.ready and self._agent_batch(events):
            return
        for e in events:
            e = dict(e)
            self.event(e.pop("event"), e.pop("t"), **e)

    def _agent_batch(self, events: list[dict[str, Any]]) -> bool:
        """Send a batch of events to the agent on one connection (the agent answers each line
        in turn); False when that is not possible, so the caller sends them one by one."""
        client, run = getattr(self.rec, "client", None), self.rec.run
        path = getattr(client, "socket_path", None)
        if not path or run is None:
            return False
        try:
            replies = AgentClient(path, timeout=5.0).batch(
                [protocol.event_request(run.run_id, **e) for e in events])
        except AgentError as e:
            log.debug("batched events not sent (%s)", e)
            return False
        bad = [r for r in replies if not r.get("ok")]
        if bad:
            log.debug("agent refused %d of %d events: %s", len(bad), len(events),
                      str(bad[0].get("error"))[:200])
        return True

    def elastic(self, _event: str, _t: float, /, **fields: Any) -> None:
        if fields.get("kind") == "metric" and not self._metric_wanted(fields):
            return
        self.event(_event, _t, **fields)
        if fields.get("kind") == "worker" and fields.get("state") == "START":
            self._worker_started(_t, fields)

    # torchelastic's monitor loop puts the same few metrics every --monitor-interval: keep
    # durations/outcomes of real work, and state metrics only when their value changes.
    _NOISY_PREFIXES = ("LocalElasticAgent._monitor_workers.", "SimpleElasticAgent._monitor")

    def _metric_wanted(self, f: dict[str, Any]) -> bool:
        name = str(f.get("metric", ""))
        if name.startswith(self._NOISY_PREFIXES):
            return False
        if name.startswith("workers."):
            with self.lock:
                if self._metric_last.get(name) == f.get("value"):
                    return False
                self._metric_last[name] = f.get("value")
        return True

    def _worker_started(self, t: float, f: dict[str, Any]) -> None:
        pid = f.get("pid")
        if not isinstance(pid, int):
            return
        keys = ("CUDA_VISIBLE_DEVICES", "LOCAL_WORLD_SIZE", "WORLD_SIZE")
        env = _proc_env(pid, keys)
        # torchelastic sets WORLD_SIZE for every worker: without it the worker has not
        # exec'd yet (its environ is still the launcher's); wait for it a little
        for _ in range(25):
            if "WORLD_SIZE" in env:
                break
            time.sleep(0.02)
            env = _proc_env(pid, keys)
        layout = {"rank": f.get("global_rank"), "local_rank": f.get("local_rank"),
                  "group_rank": f.get("group_rank"), "pid": pid, "host": f.get("hostname"),
                  "restart": f.get("restart", 0), "role": f.get("role")}
        if env.get("WORLD_SIZE", "").isdigit():
            layout["world_size"] = int(env["WORLD_SIZE"])
        if "CUDA_VISIBLE_DEVICES" in env:
            layout["cuda_visible_devices"] = env["CUDA_VISIBLE_DEVICES"]
        restart = int(layout["restart"] or 0)
        with self.lock:
            self.ranks[int(layout["rank"]) if layout["rank"] is not None else -1] = layout
            new_restart = restart > self.restarts
            self.restarts = max(self.restarts, restart)
        if new_restart:  # one plain marker per restart of the worker group
            self.event("elastic", t, kind="restart", name="reveal.worker_group.restart",
                           restart=restart, rdzv_id=f.get("rdzv_id"))
        self.event("rank", t, **{k: v for k, v in layout.items() if v is not None})
        self.add_pids([pid], t, rank=layout["rank"], local_rank=layout["local_rank"])
        self.gpu_mapper.track(pid, layout)

    def _gpu_found(self, layout: dict[str, Any], gpus: list[dict[str, Any]]) -> None:
        """NVML saw the worker on a GPU: the same ``rank`` event again, with ``gpu``."""
        ev = {k: v for k, v in layout.items() if v is not None}
        ev.update(gpu=gpus[0]["gpu"], gpu_uuid=gpus[0]["gpu_uuid"], gpu_source="nvml")
        if len(gpus) > 1:
            ev["gpus"] = [g["gpu"] for g in gpus]
        self.event("rank", None, **ev)


def _launch_info(rest: list[str]) -> tuple[Any, int, str | None]:
    """Parse torchrun's arguments (as torchrun will): (args, max nodes, shared launch id)."""
    from torch.distributed.run import parse_args, parse_min_max_nnodes
    targs = parse_args(rest)
    try:
        _, max_nodes = parse_min_max_nnodes(targs.nnodes)
    except Exception:
        max_nodes = 1
    launch_id = None
    if not targs.standalone and targs.rdzv_id and targs.rdzv_id != "none":
        launch_id = targs.rdzv_id
    return targs, max_nodes, launch_id


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        import torch.distributed.run  # noqa: F401
    except ImportError as e:
        print(f"{PROG}: error: torch is not importable ({e}); install it, e.g. "
              "pip install 'reveal-plugins[torch]'", file=sys.stderr)
        return 2
    if argv[:1] == ["--reveal-version"]:
        from .. import __version__
        print(f"{PROG} (reveal-plugins) {__version__}")
        return 0
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE)
        print("torchrun arguments:")
        return run_torchrun(["--help"])
    try:
        opts, rest = split_args(argv)
    except UsageError as e:
        print(f"{PROG}: error: {e}\n(run '{PROG} --help' for the options)", file=sys.stderr)
        return 2
    if opts.off:
        return run_torchrun(rest)
    try:
        targs, max_nodes, launch_id = _launch_info(rest)
    except SystemExit as e:  # torchrun's own parser already said what is wrong
        return e.code if isinstance(e.code, int) else 2
    out = opts.out
    try:
        if out and max_nodes > 1:
            out = claim_node_dir(out)
    except (UsageError, OSError) as e:
        print(f"{PROG}: error: --reveal-out {opts.out}: {e}", file=sys.stderr)
        return 2
    if max_nodes > 1 and not launch_id:
        print(f"{PROG}: note: no --rdzv-id given; the nodes of this launch are recorded "
              "under separate run ids (pass --rdzv-id to share one)", file=sys.stderr)
    from ..recording import Recording
    extra = {"torchrun": {"rdzv_id": launch_id, "nnodes": targs.nnodes,
                          "nproc_per_node": targs.nproc_per_node,
                          "max_restarts": targs.max_restarts,
                          "rdzv_backend": "c10d" if targs.standalone else targs.rdzv_backend,
                          "rdzv_endpoint": targs.rdzv_endpoint or None}}
    run_id = f"torchrun-{launch_id}" if launch_id else None
    command = [PROG, *argv]
    rec = Recording(out=out, interval_s=opts.interval_s, source="torchrun", command=command,
                    run_id=run_id, extra=extra)
    sess = _Session(rec)

    def start() -> None:
        try:
            rec.__enter__()  # never raises: problems disable telemetry with a message
        finally:
            sess.attach()
    starter = threading.Thread(target=start, name="reveal-recording-start", daemon=True)
    starter.start()
    exc: tuple = (None, None, None)
    rc = 1
    try:
        rc = _run_recorded(sess, rest, targs, opts.markers)
    except BaseException:
        exc = sys.exc_info()
        raise
    finally:
        starter.join()
        sess.close()
        rec.exit_code = rc if exc[0] is None else None
        rec.__exit__(*exc)
    return rc


def markers_wanted(flag: bool, env: dict[str, str] | None = None) -> bool:
    """Iteration markers are on unless ``--reveal-no-markers`` or REVEAL_ITERATION_MARKERS=0."""
    val = (os.environ if env is None else env).get(markers.ENV_AUTO, "1").strip().lower()
    return flag and val not in ("0", "false", "no", "off")


def _run_recorded(sess: _Session, rest: list[str], targs: Any, want_markers: bool = True
                  ) -> int:
    from . import elastic
    tmp = tempfile.mkdtemp(prefix="reveal-torchrun-")
    saved_env = {k: os.environ.get(k) for k in (markers.ENV_SOCK, "PYTHONPATH",
                                                 markers.ENV_AUTO)}
    receiver = None
    uninstall = None
    try:
        try:
            receiver = markers.MarkerReceiver(os.path.join(tmp, "markers.sock"),
                                              sess.marker_events).start()
            os.environ[markers.ENV_SOCK] = receiver.path
        except OSError as e:
            print(f"reveal: iteration markers unavailable ({e})", file=sys.stderr)
        if markers_wanted(want_markers):
            os.environ[markers.ENV_AUTO] = "1"     # the workers' bootstrap reads it
            boot = os.path.join(tmp, "boot")
            os.mkdir(boot)
            with open(os.path.join(boot, "sitecustomize.py"), "w") as f:
                f.write(BOOTSTRAP)
            pp = os.environ.get("PYTHONPATH")
            os.environ["PYTHONPATH"] = boot + (os.pathsep + pp if pp else "")
        try:
            uninstall = elastic.install(sess.elastic, targs.event_log_handler)
        except Exception as e:  # torch internals moved: record without elastic events
            print(f"reveal: torchelastic events not captured ({e})", file=sys.stderr)
        rc = run_torchrun(rest)
    finally:
        if uninstall is not None:
            uninstall()
        if receiver is not None:
            receiver.close()
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tmp, ignore_errors=True)
    if receiver is not None and receiver.steps:
        sess.event("note", None, message=f"iteration markers: {receiver.steps} steps from "
                  f"{len(receiver.seen)} worker processes"
                  + (f", {receiver.dropped} dropped" if receiver.dropped else ""),
                  markers_steps=receiver.steps, markers_dropped=receiver.dropped)
    return rc


if __name__ == "__main__":
    sys.exit(main())
