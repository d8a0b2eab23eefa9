"""Which NVML devices a job was given: Slurm GRES indices and ``CUDA_VISIBLE_DEVICES`` resolved to
NVML indices through identities NVML reports (minor number, PCI bus id, UUID, MIG UUID).

The numbers people pass around are not NVML indices:
- ``SLURM_JOB_GPUS`` holds Slurm's GRES indices; with ``gres.conf`` naming ``/dev/nvidia<N>`` (by
  hand or ``AutoDetect=nvml``) index N is the device's **minor number**;
- ``CUDA_VISIBLE_DEVICES`` holds CUDA indices (job-local under ``ConstrainDevices``, where CUDA only
  sees the job's GPUs), ``GPU-<uuid>`` or ``MIG-<uuid>`` strings.  A CUDA index counts the
  devices the process can see in PCI bus order (``CUDA_DEVICE_ORDER=PCI_BUS_ID``, and the
  default order on nodes of one GPU model); it names a host GPU only when all GPUs are visible.
So a job is never handed another job's GPU: numbers that cannot be resolved without guessing
resolve to nothing, with a note, and the run then records no GPU channels rather than wrong ones.
MIG: a MIG UUID resolves to its parent GPU (NVML's per-GPU counters cover the whole GPU; the
identity records the instance); what is not measured per instance is said in ``note``.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class GpuIdentity:
    index: int
    uuid: str = ""
    pci_bus_id: str = ""
    minor: int | None = None
    name: str = ""
    mig: bool = False
    mig_devices: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not self.mig:
            d.pop("mig_devices")
        return d


@dataclass
class Resolution:
    indices: list[int]
    identities: list[dict[str, Any]]
    source: str
    note: str = ""


def _s(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


def list_devices(nv: Any) -> list[GpuIdentity]:
    """Every GPU NVML can open, with its identities (a GPU that refuses is left out)."""
    out = []
    for i in range(nv.nvmlDeviceGetCount()):
        try:
            h = nv.nvmlDeviceGetHandleByIndex(i)
        except nv.NVMLError as e:
            log.debug("GPU %d: %s", i, e)
            continue
        g = GpuIdentity(index=i)
        for attr, fn in (("uuid", lambda: _s(nv.nvmlDeviceGetUUID(h))),
                         ("pci_bus_id", lambda: _s(nv.nvmlDeviceGetPciInfo(h).busId)),
                         ("minor", lambda: int(nv.nvmlDeviceGetMinorNumber(h))),
                         ("name", lambda: _s(nv.nvmlDeviceGetName(h)))):
            try:
                setattr(g, attr, fn())
            except nv.NVMLError:
                pass
        try:
            cur, _pending = nv.nvmlDeviceGetMigMode(h)
            g.mig = cur == getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1)
        except nv.NVMLError:
            g.mig = False
        if g.mig:
            g.mig_devices = _mig_devices(nv, h)
        out.append(g)
    return out


def _mig_devices(nv: Any, h: Any) -> list[dict[str, Any]]:
    out = []
    try:
        n = nv.nvmlDeviceGetMaxMigDeviceCount(h)
    except nv.NVMLError:
        return out
    for k in range(n):
        try:
            m = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
        except nv.NVMLError:
            continue
        d: dict[str, Any] = {"slot": k}
        for attr, fn in (("uuid", lambda: _s(nv.nvmlDeviceGetUUID(m))),
                         ("gpu_instance", lambda: int(nv.nvmlDeviceGetGpuInstanceId(m))),
                         ("compute_instance", lambda: int(nv.nvmlDeviceGetComputeInstanceId(m)))):
            try:
                d[attr] = fn()
            except nv.NVMLError:
                pass
        out.append(d)
    return out


def _norm_bus(b: str) -> str:
    b = b.strip().lower()
    return b[4:] if len(b) == 16 and b.startswith("0000") else b  # 8- vs 4-digit domain


def resolve(devices: list[GpuIdentity], source: str, value: str,
            slurm: bool = False) -> Resolution:
    """NVML indices for ``value`` as ``source`` names them (``SLURM_JOB_GPUS`` or
    ``CUDA_VISIBLE_DEVICES``); what cannot be resolved is left out and said in ``note``.
    ``slurm``: the value comes from a Slurm job, where CUDA indices may be job-local."""
    parts = [p.strip() for p in str(value).split(",") if p.strip()]
    by_minor = {d.minor: d for d in devices if d.minor is not None}
    by_uuid = {d.uuid.lower(): d for d in devices if d.uuid}
    by_mig = {m.get("uuid", "").lower(): (d, m) for d in devices for m in d.mig_devices}
    by_bus = {_norm_bus(d.pci_bus_id): d for d in devices if d.pci_bus_id}
    pci_order = sorted(devices, key=lambda d: _norm_bus(d.pci_bus_id) or f"~{d.index:04d}")
    chosen: list[tuple[GpuIdentity, dict[str, Any] | None]] = []
    notes: list[str] = []
    numeric = [p for p in parts if p.isdigit()]
    if source == "CUDA_VISIBLE_DEVICES" and numeric and slurm:
        # under ConstrainDevices a Slurm task's CUDA indices are job-local: the host devices
        # behind them are not knowable from the numbers alone
        notes.append(f"CUDA_VISIBLE_DEVICES={value!r} in a Slurm job may be job-local "
                     "(ConstrainDevices): not mapped to host GPUs; SLURM_JOB_GPUS or GPU UUIDs "
                     "are needed")
        return Resolution([], [], source, "; ".join(notes))
    for p in parts:
        low = p.lower()
        hit: tuple[GpuIdentity, dict[str, Any] | None] | None = None
        if low.startswith("gpu-"):
            d = by_uuid.get(low)
            hit = (d, None) if d else None
        elif low.startswith("mig-"):
            hit = by_mig.get(low)
            if hit is None:  # old MIG syntax MIG-GPU-<uuid>/<gi>/<ci>
                d = by_uuid.get(low[4:].split("/")[0])
                hit = (d, None) if d else None
        elif ":" in p:
            d = by_bus.get(_norm_bus(p))
            hit = (d, None) if d else None
        elif p.isdigit():
            k = int(p)
            if source == "SLURM_JOB_GPUS":
                d = by_minor.get(k)
            else:
                d = pci_order[k] if k < len(pci_order) else None
            hit = (d, None) if d else None
        if hit is None:
            notes.append(f"{source} entry {p!r} matches no GPU NVML can open")
            continue
        chosen.append(hit)
    idx: list[int] = []
    ident: list[dict[str, Any]] = []
    for d, mig in chosen:
        if d.index in idx:
            if mig is not None:
                ident[idx.index(d.index)].setdefault("mig_instances", []).append(mig)
            continue
        idx.append(d.index)
        rec = d.to_dict()
        rec.pop("mig_devices", None)
        if mig is not None:
            rec["mig_instances"] = [mig]
        ident.append(rec)
    if any(d.mig for d, _ in chosen):
        notes.append("MIG: GPU-level counters (power, clocks, PCIe, ECC) cover the whole GPU, "
                     "all instances; utilisation per instance is not measured")
    return Resolution(idx, ident, source, "; ".join(notes))


def spec_from_env(env: dict[str, str]) -> dict[str, Any] | None:
    """``{"source", "value", "slurm"}`` from a job's environment: Slurm's list first (host
    identity), then ``CUDA_VISIBLE_DEVICES``; None when neither says anything."""
    for key in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        v = (env.get(key) or "").strip()
        if v and v.lower() not in ("nodevfiles", "none"):
            return {"source": key, "value": v[:1024], "slurm": bool(env.get("SLURM_JOB_ID"))}
    return None


def spec_of(run_gpus: list[int] | None, source: str, extra: dict[str, Any]) -> dict | None:
    """The GPU spec a registration carries: ``extra["gpu_spec"]`` (Python callers), else a
    Slurm job's ``gpus`` list (SLURM_JOB_GPUS, as the SPANK plugin and Prolog send it)."""
    spec = extra.get("gpu_spec")
    if isinstance(spec, dict) and isinstance(spec.get("value"), str):
        return {"source": str(spec.get("source", "")), "value": spec["value"][:1024],
                "slurm": bool(spec.get("slurm"))}
    if source == "slurm" and run_gpus is not None:
        return {"source": "SLURM_JOB_GPUS", "value": ",".join(str(int(g)) for g in run_gpus),
                "slurm": True}
    return None


def resolve_with_nvml(spec: dict[str, str]) -> Resolution | None:
    """Resolve through NVML here; None when NVML is not available (no GPU: nothing to scope)."""
    try:
        import pynvml as nv
        nv.nvmlInit()
    except Exception as e:
        log.debug("NVML unavailable for GPU resolution: %s", e)
        return None
    try:
        return resolve(list_devices(nv), spec.get("source", ""), spec.get("value", ""),
                       bool(spec.get("slurm")))
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass
