"""NVIDIA GPUs through NVML (``pynvml`` from the ``nvidia-ml-py`` package).

Per GPU (NVML index ``i``) the channels are ``gpu.<i>.<metric>``: SM/memory utilisation,
memory used/total, SM/memory clocks and their maxima, clock-event reasons as 0/1 flags, the
driver's *violation counters* (seconds the clocks were held below what was asked, per reason:
``capped_*_s``), power, power limit, energy, GPU and HBM temperature, PCIe bytes, replays and
link generation/width, NVLink data (all links) and errors, ECC, retired pages, row remapping,
XID events, and ``nvml_status`` (0 ok, 1 lost, 2 refused).

How it survives a real driver:
- **Per GPU.** A GPU whose handle the driver refuses (a cgroup hiding it, a GPU needing a reset)
  is skipped and listed with the reason in ``describe()`` (``reveal probes``); a transient
  refusal keeps the GPU's channels declared and retries every :data:`RETRY_S`.  A GPU that
  falls off the bus mid-run (``GPU_IS_LOST``) turns ``nvml_status`` to 1 and its values to NaN.
- **Per field.** Field values are read in batches and judged field by field: NOT_SUPPORTED /
  FUNCTION_NOT_FOUND drop that field for good, NO_PERMISSION drops it with a note, anything
  else keeps it declared and retried.  Groups refused at open for a transient reason are
  retried every :data:`RETRY_S`, not dropped for the agent's lifetime.
- **Cost.** The 100 ms path is five calls per GPU: utilisation, memory, SM clock, clock-event
  reasons and one field batch (power, energy, PCIe bytes, violation counters, NVLink data).
  Slow-moving values (temperatures, memory clock, link state, ECC, remapping, NVLink errors,
  power limit) are one batch every ``slow_every`` samples.  No call on the sampling path blocks:
  the legacy ``nvmlDeviceGetPcieThroughput`` (20 ms inside the driver, for drivers without the
  PCIe byte counters) runs on a thread of its own, once a second.
- **Counters** narrower than 64 bits (``PCIE_COUNT_*_BYTES`` may be 32-bit) are unwrapped by
  their value type, so they never step backwards.  NVLink data uses the all-links scope
  (``UINT_MAX``): scope 0 is link 0 alone.
- **XID** events come from an NVML event set polled with a zero timeout.
"""
from __future__ import annotations

import ctypes
import logging
import struct
import threading
import time
from typing import Any, Callable, Sequence

from ..types import ChannelMeta
from .probe import NAN, Probe

log = logging.getLogger(__name__)

UINT_MAX = 0xFFFFFFFF
RETRY_S = 60.0
STATUS_OK, STATUS_LOST, STATUS_REFUSED = 0.0, 1.0, 2.0

# NVML return codes (nvml.h); the binding's names are used where present.
_NOT_SUPPORTED, _NO_PERMISSION, _FUNCTION_NOT_FOUND, _GPU_IS_LOST = 3, 4, 13, 15
_INVALID_ARGUMENT, _NOT_FOUND = 2, 6
ABSENT = frozenset({_NOT_SUPPORTED, _FUNCTION_NOT_FOUND, _INVALID_ARGUMENT})

# Field values: (constant suffix, metric, unit, kind, scale, description, scope, slow)
FIELDS: list[tuple[str, str, str, str, float, str, int, bool]] = [
    ("POWER_INSTANT", "power", "W", "gauge", 1e-3, "power draw (instant)", 0, False),
    ("TOTAL_ENERGY_CONSUMPTION", "energy", "J", "counter", 1e-3,
     "energy consumed since driver load", 0, False),
    ("PCIE_COUNT_TX_BYTES", "pcie_tx", "bytes", "counter", 1.0, "bytes sent over PCIe", 0,
     False),
    ("PCIE_COUNT_RX_BYTES", "pcie_rx", "bytes", "counter", 1.0, "bytes received over PCIe", 0,
     False),
    ("PERF_POLICY_POWER", "capped_power_s", "s", "counter", 1e-9,
     "time clocks were held down by the power limit", 0, False),
    ("PERF_POLICY_THERMAL", "capped_thermal_s", "s", "counter", 1e-9,
     "time clocks were held down by temperature", 0, False),
    ("PERF_POLICY_BOARD_LIMIT", "capped_board_s", "s", "counter", 1e-9,
     "time clocks were held down by a board limit", 0, False),
    ("PERF_POLICY_RELIABILITY", "capped_reliability_s", "s", "counter", 1e-9,
     "time clocks were held down for reliability (voltage)", 0, False),
    ("PERF_POLICY_SYNC_BOOST", "capped_sync_boost_s", "s", "counter", 1e-9,
     "time clocks were held to match other GPUs (sync boost)", 0, False),
    ("NVLINK_THROUGHPUT_DATA_TX", "nvlink_tx", "KiB", "counter", 1.0,
     "NVLink data transmitted, all links", UINT_MAX, False),
    ("NVLINK_THROUGHPUT_DATA_RX", "nvlink_rx", "KiB", "counter", 1.0,
     "NVLink data received, all links", UINT_MAX, False),
    ("POWER_CURRENT_LIMIT", "power_limit", "W", "gauge", 1e-3, "enforced power limit", 0, True),
    ("MEMORY_TEMP", "memory_temp", "degC", "gauge", 1.0, "HBM temperature", 0, True),
    ("PCIE_REPLAY_COUNTER", "pcie_replay", "replays", "counter", 1.0,
     "PCIe replays (link errors retried)", 0, True),
    ("ECC_SBE_VOL_TOTAL", "ecc_corrected", "errors", "counter", 1.0,
     "corrected (single-bit) ECC errors since driver load", 0, True),
    ("ECC_DBE_VOL_TOTAL", "ecc_uncorrected", "errors", "counter", 1.0,
     "uncorrected (double-bit) ECC errors since driver load", 0, True),
    ("RETIRED_SBE", "retired_pages_sbe", "pages", "gauge", 1.0,
     "pages retired for single-bit errors", 0, True),
    ("RETIRED_DBE", "retired_pages_dbe", "pages", "gauge", 1.0,
     "pages retired for double-bit errors", 0, True),
    ("RETIRED_PENDING", "retired_pages_pending", "flag", "gauge", 1.0,
     "1 if a page retirement waits for a reset", 0, True),
    ("REMAPPED_COR", "remapped_rows_cor", "rows", "gauge", 1.0,
     "rows remapped for correctable errors", 0, True),
    ("REMAPPED_UNC", "remapped_rows_unc", "rows", "gauge", 1.0,
     "rows remapped for uncorrectable errors", 0, True),
    ("REMAPPED_PENDING", "remap_pending", "flag", "gauge", 1.0,
     "1 if a row remap waits for a GPU reset", 0, True),
    ("REMAPPED_FAILURE", "remap_failure", "flag", "gauge", 1.0,
     "1 if a row remap failed (GPU should be replaced)", 0, True),
    ("NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "nvlink_crc_flit_errors", "errors", "counter", 1.0,
     "NVLink flit CRC errors, all links", 0, True),
    ("NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "nvlink_crc_data_errors", "errors", "counter", 1.0,
     "NVLink data CRC errors, all links", 0, True),
    ("NVLINK_REPLAY_ERROR_COUNT_TOTAL", "nvlink_replay_errors", "errors", "counter", 1.0,
     "NVLink replays, all links", 0, True),
    ("NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "nvlink_recovery_errors", "errors", "counter", 1.0,
     "NVLink link recoveries, all links", 0, True),
]

# Per-link NVLink error fields (scopeId = link), summed over active links, for GPUs that
# refuse the *_TOTAL fields (Hopper does): metric → field constant suffix.
NVLINK_PER_LINK = {"nvlink_replay_errors": "NVLINK_ERROR_DL_REPLAY",
                   "nvlink_recovery_errors": "NVLINK_ERROR_DL_RECOVERY",
                   "nvlink_crc_flit_errors": "NVLINK_ERROR_DL_CRC"}

# Clock-event ("throttle") reason bits → 0/1 channels.
THROTTLE_BITS = [
    ("throttle_power_cap", 0x4, "clocks held down by the software power cap"),
    ("throttle_hw_slowdown", 0x8, "hardware slowdown (thermal or power brake)"),
    ("throttle_sync_boost", 0x10, "clocks held to match other GPUs (sync boost)"),
    ("throttle_sw_thermal", 0x20, "software thermal slowdown"),
    ("throttle_hw_thermal", 0x40, "hardware thermal slowdown"),
    ("throttle_hw_power_brake", 0x80, "hardware power brake (external signal)"),
    ("throttle_idle", 0x1, "clocks low because the GPU is idle"),
]

# Value types of nvmlFieldValue_t → (union member, bits; 0 = float / signed: no unwrapping).
_VALUE = {0: ("dVal", 0), 1: ("uiVal", 32), 2: ("ulVal", 64), 3: ("ullVal", 64),
          4: ("sllVal", 0), 5: ("siVal", 0), 6: ("usVal", 16)}


def _import_pynvml():
    import pynvml  # nvidia-ml-py
    return pynvml


def _code(e: BaseException) -> int | None:
    v = getattr(e, "value", None)
    return v if isinstance(v, int) else None


def _reason_from(e: BaseException, pynvml: Any) -> str:
    val = _code(e)
    if val == getattr(pynvml, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
        return "NVML not available: libnvidia-ml.so.1 not found (no NVIDIA driver)"
    if val == getattr(pynvml, "NVML_ERROR_DRIVER_NOT_LOADED", 9):
        return "NVML not available: the NVIDIA kernel driver is not loaded"
    if val == _NO_PERMISSION:
        return "NVML not available: permission denied on /dev/nvidia*"
    return f"NVML not available: {e}"


class _UtilT(ctypes.Structure):  # nvmlUtilization_t
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class _MemoryT(ctypes.Structure):  # nvmlMemory_t (v1)
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


def _cfn(nv: Any, name: str) -> Any:
    """The C function through the binding's own lookup (raises FunctionNotFound when the
    driver lacks it), or None when the binding has no such lookup (then its wrappers are used).
    The 100 ms path calls these with preallocated outputs: the binding's wrappers allocate and
    convert on every call, which costs more than the driver call itself."""
    get = getattr(nv, "_nvmlGetFunctionPointer", None)
    return get(name) if get is not None else None


def _addr(h: Any) -> int | None:
    try:
        return ctypes.cast(h, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


def _check(nv: Any, ret: int) -> None:
    if ret:
        raise nv.NVMLError(ret)


class _FieldBatch:
    """One ``nvmlDeviceGetFieldValues`` call over a fixed list of (field, scope) ids, with the
    request array built once and the answers decoded with one ``struct.unpack_from``."""

    REC = 40  # sizeof(nvmlFieldValue_t): ids 8, timestamp 8, latency 8, type 4, return 4, value 8
    FMT = {0: "d", 1: "I4x", 2: "Q", 3: "Q", 4: "q", 5: "i4x", 6: "H6x"}

    def __init__(self, nv: Any, h: Any, ids: list[tuple[int, int]]):
        self.nv, self.h, self.n = nv, h, len(ids)
        self.fn = _cfn(nv, "nvmlDeviceGetFieldValues")
        self.arr = (nv.c_nvmlFieldValue_t * self.n)()
        if ctypes.sizeof(nv.c_nvmlFieldValue_t) != self.REC:
            self.fn = None  # an unexpected layout: use the binding's wrapper
        for k, (fid, scope) in enumerate(ids):
            self.arr[k].fieldId, self.arr[k].scopeId = fid, scope
        self.ids = ids
        self.types: list[int] | None = None
        self.fmt = ""

    def read(self) -> list[tuple[int, int, float]]:
        """[(nvmlReturn, valueType, value)] per field."""
        if self.fn is None:
            vals = self.nv.nvmlDeviceGetFieldValues(self.h, self.ids)
            return [(int(v.nvmlReturn), int(v.valueType),
                     float(getattr(v.value, _VALUE.get(v.valueType, ("ullVal", 64))[0])))
                    for v in vals]
        _check(self.nv, self.fn(self.h, ctypes.c_int32(self.n), ctypes.byref(self.arr)))
        if self.types is None:
            self._layout()
        t = struct.unpack_from(self.fmt, self.arr)
        out = []
        for k in range(self.n):
            vt, ret, val = t[3 * k], t[3 * k + 1], t[3 * k + 2]
            if vt != self.types[k] and ret == 0:  # the driver changed its mind: decode by type
                vt_fmt = self.FMT.get(vt, "Q")
                val = struct.unpack_from("<" + vt_fmt, self.arr, k * self.REC + 32)[0]
            out.append((ret, vt, float(val)))
        return out

    def _layout(self) -> None:
        self.types = []
        parts = []
        for k in range(self.n):
            vt = int(struct.unpack_from("<i", self.arr, k * self.REC + 24)[0])
            self.types.append(vt)
            parts.append("24xii" + self.FMT.get(vt, "Q"))
        self.fmt = "<" + "".join(parts)


class _Unwrap:
    """A counter read through a value type narrower than 64 bits, made monotonic."""

    __slots__ = ("mod", "prev", "offset")

    def __init__(self, bits: int):
        self.mod, self.prev, self.offset = float(1 << bits), None, 0.0

    def __call__(self, raw: float) -> float:
        if self.prev is not None and raw < self.prev:
            self.offset += self.mod
        self.prev = raw
        return raw + self.offset


class _Group:
    """Channels filled by one NVML call (or one field batch) of one GPU.

    ``pos`` maps the call's values to the GPU's declared channels (-1: not declared).
    ``retry_at`` > 0: the call failed for a transient reason and is tried again then."""

    __slots__ = ("metas", "fn", "slow", "pos", "retry_at", "fails", "name")

    def __init__(self, name: str, metas: list[ChannelMeta], fn: Callable[[], list[float]],
                 slow: bool = False):
        self.name, self.metas, self.fn, self.slow = name, metas, fn, slow
        self.pos: list[int] = []
        self.retry_at = 0.0
        self.fails = 0


class _Gpu:
    """One GPU: its handle, declared channels, groups and status."""

    def __init__(self, probe: "NvmlProbe", index: int):
        self.p, self.index = probe, index
        self.h: Any = None
        self.status = STATUS_OK
        self.reason = ""
        self.names: list[str] = []
        self.metas: list[ChannelMeta] = []
        self.out: list[float] = []
        self.groups: list[_Group] = []
        self.retry_at = 0.0
        self.notes: list[str] = []
        self.legacy_pcie = False
        self.legacy_pos: list[int] | None = None
        self.sealed = False

    # -- declaring ---------------------------------------------------------------------------
    def ch(self, metric: str, unit: str, kind: str, desc: str) -> ChannelMeta:
        return ChannelMeta(f"gpu.{self.index}.{metric}", unit, kind, self.p.name, desc)

    def declare(self, metas: Sequence[ChannelMeta]) -> None:
        if self.sealed:  # the agent's channel list is fixed once the probe is open
            return
        for m in metas:
            if m.name not in self.names:
                self.names.append(m.name)
                self.metas.append(m)
                self.out.append(NAN)

    def attach(self, g: _Group) -> None:
        where = {n: k for k, n in enumerate(self.names)}
        g.pos = [where.get(m.name, -1) for m in g.metas]
        self.groups.append(g)

    # -- reading -----------------------------------------------------------------------------
    def run(self, g: _Group, now: float) -> None:
        nv = self.p.nv
        try:
            vals = g.fn()
        except nv.NVMLError as e:
            self.failed(g, e, now)
            return
        g.fails = 0
        g.retry_at = 0.0
        out = self.out
        for k, v in zip(g.pos, vals):
            if k >= 0:
                out[k] = v

    def failed(self, g: _Group, e: BaseException, now: float) -> None:
        code = _code(e)
        for k in g.pos:
            if k >= 0:
                self.out[k] = NAN
        if code == _GPU_IS_LOST:
            self.lose(str(e), now)
        elif code in ABSENT:
            self.groups.remove(g)
            self.note(f"{g.name}: {e} (dropped)")
        else:
            g.fails += 1
            if g.fails >= 3 or g.retry_at:
                g.retry_at = now + RETRY_S
            log.debug("GPU %d %s: %s", self.index, g.name, e)

    def lose(self, why: str, now: float) -> None:
        if self.status != STATUS_LOST:
            log.error("GPU %d is lost (%s): its channels read NaN; retried every %.0f s",
                      self.index, why, RETRY_S)
            self.note(f"lost at {time.strftime('%H:%M:%S')}: {why}")
        self.status = STATUS_LOST
        self.retry_at = now + RETRY_S
        self.out = [NAN] * len(self.out)

    def note(self, msg: str) -> None:
        if msg not in self.notes and len(self.notes) < 32:
            self.notes.append(msg)

    def sample(self, n: int, now: float) -> list[float]:
        if self.status != STATUS_OK:
            if now >= self.retry_at:
                self.p._reopen(self, now)
            if self.status != STATUS_OK:
                return self.out + [self.status]
        slow_turn = n % self.p.slow_every == 0
        for g in list(self.groups):
            if g.retry_at:
                if now < g.retry_at:
                    continue
            elif g.slow and not slow_turn:
                continue
            self.run(g, now)
            if self.status != STATUS_OK:
                return self.out + [self.status]
        if self.legacy_pcie:
            self.p._legacy.fill(self)
        return self.out + [self.status]


class _LegacyPcie:
    """``nvmlDeviceGetPcieThroughput`` off the sampling thread: it blocks ~20 ms per call."""

    def __init__(self, nv: Any, period_s: float = 1.0):
        self.nv, self.period_s = nv, period_s
        self.gpus: list[_Gpu] = []
        self.vals: dict[int, tuple[float, float]] = {}
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._loop, name="reveal-nvml-pcie", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        nv = self.nv
        while not self.stop.is_set():
            for g in self.gpus:
                if g.status != STATUS_OK or g.h is None:
                    continue
                try:
                    tx = nv.nvmlDeviceGetPcieThroughput(g.h, nv.NVML_PCIE_UTIL_TX_BYTES) * 1024.0
                    rx = nv.nvmlDeviceGetPcieThroughput(g.h, nv.NVML_PCIE_UTIL_RX_BYTES) * 1024.0
                    self.vals[g.index] = (float(tx), float(rx))
                except Exception:
                    self.vals.pop(g.index, None)
            self.stop.wait(self.period_s)

    def fill(self, g: _Gpu) -> None:
        if g.legacy_pos is None:  # found once: the declared channels never change
            g.legacy_pos = [g.names.index(f"gpu.{g.index}.{m}") if
                            f"gpu.{g.index}.{m}" in g.names else -1
                            for m in ("pcie_tx_rate", "pcie_rx_rate")]
        for k, x in zip(g.legacy_pos, self.vals.get(g.index, (NAN, NAN))):
            if k >= 0:
                g.out[k] = x

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=2.0)


class NvmlProbe(Probe):
    """All GPUs of the node (``gpus=None``) or the given NVML indices (a run's GPUs)."""

    name = "nvml"

    def __init__(self, gpus: Sequence[int] | None = None, slow_every: int = 10,
                 xid_events: bool = True, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.gpus = list(gpus) if gpus is not None else None
        self.slow_every = max(1, int(slow_every))
        self.xid_events = xid_events
        self.clock = clock
        self.note = ""
        self.nv: Any = None
        self._gpus: list[_Gpu] = []
        self._n = 0
        self._evset: Any = None
        self._xid_idx: dict[int, int] = {}
        self._xid: list[list[float]] = []
        self._xid_handle: dict[int | None, int] = {}  # handle address → index (a lost GPU
        self._inited = False                          # cannot be asked for its index)
        self._legacy: _LegacyPcie | None = None
        self.skipped: dict[int, str] = {}

    # -- open ------------------------------------------------------------------------------
    def open(self) -> None:
        try:
            self._open()
        except Exception as e:  # open() never raises
            log.debug("NVML open failed", exc_info=True)
            self.close()
            self._unavailable(f"NVML not available: {type(e).__name__}: {e}")

    def _open(self) -> None:
        try:
            nv = _import_pynvml()
        except ImportError as e:
            self._unavailable(f"NVML not available: the nvidia-ml-py package is not installed "
                              f"({e})")
            return
        self.nv = nv
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            self._unavailable(_reason_from(e, nv))
            return
        self._inited = True
        count = nv.nvmlDeviceGetCount()
        if count == 0:
            self._unavailable("NVML found no GPU")
            return
        wanted = self.gpus if self.gpus is not None else list(range(count))
        missing = [i for i in wanted if not 0 <= i < count]
        if missing:
            log.warning("GPU index(es) %s not present (NVML sees %d GPUs)", missing, count)
        wanted = [i for i in wanted if 0 <= i < count]
        if not wanted:
            self._unavailable(f"GPU index(es) {missing} not present (NVML sees {count} GPUs)")
            return
        now = self.clock()
        for i in wanted:
            g = _Gpu(self, i)
            try:
                g.h = nv.nvmlDeviceGetHandleByIndex(i)
            except nv.NVMLError as e:
                code = _code(e)
                g.reason = f"handle refused: {e}"
                self.skipped[i] = g.reason
                if code in (_NO_PERMISSION, _NOT_FOUND) or code in ABSENT:
                    # not ours to read (hidden by a cgroup, not there): status only
                    g.status = STATUS_REFUSED
                    g.retry_at = float("inf")
                else:  # mid-reset, lost, unknown: declare the usual set and try again later
                    g.status = STATUS_LOST if code == _GPU_IS_LOST else STATUS_REFUSED
                    g.retry_at = now + RETRY_S
                    g.declare([m for grp in self._groups_for(g, probe=False) for m in grp.metas])
                log.warning("GPU %d skipped: %s", i, e)
                self._gpus.append(g)
                continue
            self._build(g, now)
            self._gpus.append(g)
        channels: list[ChannelMeta] = []
        for g in self._gpus:
            g.sealed = True
            channels.extend(g.metas)
            channels.append(g.ch("nvml_status", "state", "gauge",
                                 "NVML state of the GPU: 0 ok, 1 lost, 2 refused"))
        notes: list[str] = []
        if self.xid_events:
            channels.extend(self._open_xid([g for g in self._gpus if g.h is not None], notes))
        if any(g.legacy_pcie for g in self._gpus):
            self._legacy = _LegacyPcie(nv)
            self._legacy.gpus = [g for g in self._gpus if g.legacy_pcie]
            self._legacy.start()
        self.note = "; ".join(notes)
        self._ready(channels)

    def _build(self, g: _Gpu, now: float) -> None:
        """Find what this GPU answers, declare it (first open) and attach the groups."""
        first = not g.sealed
        groups = self._groups_for(g, probe=True)
        if first:
            g.declare([m for grp in groups for m in grp.metas])
        for grp in groups:
            g.attach(grp)
        if not first:  # a re-open: the declared set stays, the new groups fill what they can
            g.groups = [grp for grp in g.groups if any(k >= 0 for k in grp.pos)]

    def _reopen(self, g: _Gpu, now: float) -> None:
        nv = self.nv
        g.retry_at = now + RETRY_S
        try:
            h = nv.nvmlDeviceGetHandleByIndex(g.index)
            nv.nvmlDeviceGetUtilizationRates(h)
        except nv.NVMLError as e:
            log.debug("GPU %d still unavailable: %s", g.index, e)
            return
        g.h, g.groups = h, []
        if not g.names:
            return
        self._build(g, now)
        g.status = STATUS_OK
        g.note(f"back at {time.strftime('%H:%M:%S')}")
        log.warning("GPU %d answers again", g.index)

    def _try(self, g: _Gpu, name: str, fn: Callable[[], list[float]]) -> str:
        """'ok', 'absent' (the GPU does not have it) or 'retry' (a transient refusal)."""
        nv = self.nv
        try:
            fn()
            return "ok"
        except nv.NVMLError as e:
            code = _code(e)
            if code in ABSENT:
                return "absent"
            if code == _NO_PERMISSION:
                g.note(f"{name}: no permission (needs root)")
                return "absent"
            g.note(f"{name}: {e} at open (retried every {RETRY_S:.0f} s)")
            return "retry"

    def _groups_for(self, g: _Gpu, probe: bool) -> list[_Group]:
        """The GPU's groups.  ``probe=False`` declares the usual set without calling NVML (a
        GPU that could not be opened yet)."""
        nv, h, ch = self.nv, g.h, g.ch
        groups: list[_Group] = []

        def add(name: str, metas: list[ChannelMeta], fn: Callable[[], list[float]],
                slow: bool = False) -> bool:
            state = self._try(g, name, fn) if probe else "ok"
            if state == "absent":
                return False
            grp = _Group(name, metas, fn, slow)
            if state == "retry":
                grp.retry_at = self.clock() + RETRY_S
            groups.append(grp)
            return True

        c_util, u_out = self._c(g, "nvmlDeviceGetUtilizationRates"), _UtilT()
        c_mem, m_out = self._c(g, "nvmlDeviceGetMemoryInfo"), _MemoryT()
        c_clock, clk_out = self._c(g, "nvmlDeviceGetClockInfo"), ctypes.c_uint()
        sm = ctypes.c_uint(getattr(nv, "NVML_CLOCK_SM", 1))  # enums are unsigned int
        byref = ctypes.byref

        def util() -> list[float]:
            if c_util is not None:
                _check(nv, c_util(h, byref(u_out)))
                return [float(u_out.gpu), float(u_out.memory)]
            u = nv.nvmlDeviceGetUtilizationRates(h)
            return [float(u.gpu), float(u.memory)]
        add("utilization", [ch("util_sm", "%", "gauge", "time a kernel was running"),
                            ch("util_mem", "%", "gauge", "time device memory was read or written")],
            util)

        def mem() -> list[float]:
            if c_mem is not None:
                _check(nv, c_mem(h, byref(m_out)))
                return [float(m_out.used), float(m_out.total)]
            m = nv.nvmlDeviceGetMemoryInfo(h)
            return [float(m.used), float(m.total)]
        add("memory", [ch("mem_used", "bytes", "gauge", "device memory used"),
                       ch("mem_total", "bytes", "gauge", "device memory total")], mem)

        def clock_sm() -> list[float]:
            if c_clock is not None:
                _check(nv, c_clock(h, sm, byref(clk_out)))
                return [float(clk_out.value)]
            return [float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))]
        add("clock_sm", [ch("clock_sm", "MHz", "gauge", "SM clock")], clock_sm)

        # older drivers only have the "throttle" name of the same call
        c_reasons = self._c(g, "nvmlDeviceGetCurrentClocksEventReasons") or \
            self._c(g, "nvmlDeviceGetCurrentClocksThrottleReasons")
        r_out = ctypes.c_ulonglong()

        def reasons() -> list[float]:
            if c_reasons is not None:
                _check(nv, c_reasons(h, byref(r_out)))
                r = r_out.value
            else:
                r = int(nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))
            return [1.0 if r & bit else 0.0 for _, bit, _ in THROTTLE_BITS]
        add("clock_event_reasons", [ch(m, "flag", "gauge", d) for m, _, d in THROTTLE_BITS],
            reasons)

        # Field batches, judged field by field.
        fast_ok, slow_ok = self._fields(g, probe, groups)
        have = {m for m, _ in fast_ok} | {m for m, _ in slow_ok}

        # Slow per-call values.
        add("temperature", [ch("temp", "degC", "gauge", "GPU core temperature")],
            lambda: [float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))], slow=True)
        add("clock_mem", [ch("clock_mem", "MHz", "gauge", "memory clock")],
            lambda: [float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM))], slow=True)
        add("pcie_link", [ch("pcie_link_gen", "gen", "gauge", "current PCIe link generation"),
                          ch("pcie_link_width", "lanes", "gauge", "current PCIe link width")],
            lambda: [float(nv.nvmlDeviceGetCurrPcieLinkGeneration(h)),
                     float(nv.nvmlDeviceGetCurrPcieLinkWidth(h))], slow=True)

        # Static maxima: read once, held.
        if probe:
            maxes = self._static(g, [
                ("clock_sm_max", "MHz", "maximum SM clock",
                 lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)),
                ("clock_mem_max", "MHz", "maximum memory clock",
                 lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM)),
                ("pcie_link_gen_max", "gen", "maximum PCIe link generation",
                 lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(h)),
                ("pcie_link_width_max", "lanes", "maximum PCIe link width",
                 lambda: nv.nvmlDeviceGetMaxPcieLinkWidth(h))])
            if maxes:
                metas = [m for m, _ in maxes]
                vals = [v for _, v in maxes]
                groups.append(_Group("maxima", metas, lambda vals=vals: vals, slow=True))
        else:
            groups.append(_Group("maxima", [
                ch("clock_sm_max", "MHz", "gauge", "maximum SM clock"),
                ch("clock_mem_max", "MHz", "gauge", "maximum memory clock"),
                ch("pcie_link_gen_max", "gen", "gauge", "maximum PCIe link generation"),
                ch("pcie_link_width_max", "lanes", "gauge", "maximum PCIe link width")],
                lambda: [NAN] * 4, slow=True))

        if not probe:
            return groups
        # Per-call fallbacks for what the field batch did not give.
        if "power" not in have:
            add("power_usage", [ch("power", "W", "gauge", "power draw")],
                lambda: [nv.nvmlDeviceGetPowerUsage(h) * 1e-3])
        if "energy" not in have:
            add("energy", [ch("energy", "J", "counter", "energy consumed since driver load")],
                lambda: [nv.nvmlDeviceGetTotalEnergyConsumption(h) * 1e-3])
        if "power_limit" not in have:
            add("power_limit", [ch("power_limit", "W", "gauge", "enforced power limit")],
                lambda: [nv.nvmlDeviceGetEnforcedPowerLimit(h) * 1e-3], slow=True)
        if "pcie_replay" not in have:
            add("pcie_replay", [ch("pcie_replay", "replays", "counter",
                                   "PCIe replays (link errors retried)")],
                lambda: [float(nv.nvmlDeviceGetPcieReplayCounter(h))], slow=True)
        if "ecc_corrected" not in have:
            add("ecc", [ch("ecc_corrected", "errors", "counter", "corrected ECC errors"),
                        ch("ecc_uncorrected", "errors", "counter", "uncorrected ECC errors")],
                lambda: [float(nv.nvmlDeviceGetTotalEccErrors(
                    h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC)),
                    float(nv.nvmlDeviceGetTotalEccErrors(
                        h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC))],
                slow=True)
        if "remap_pending" not in have:
            add("remapped_rows", [
                ch("remapped_rows_cor", "rows", "gauge", "rows remapped (correctable)"),
                ch("remapped_rows_unc", "rows", "gauge", "rows remapped (uncorrectable)"),
                ch("remap_pending", "flag", "gauge", "row remap waits for a reset"),
                ch("remap_failure", "flag", "gauge", "row remap failed")],
                lambda: [float(x) for x in nv.nvmlDeviceGetRemappedRows(h)][:4], slow=True)
        for metric, policy, desc in (
                ("capped_power_s", "POWER", "time clocks were held down by the power limit"),
                ("capped_thermal_s", "THERMAL", "time clocks were held down by temperature")):
            if metric not in have:
                pol = getattr(nv, "NVML_PERF_POLICY_" + policy)
                add("violation_" + policy.lower(), [ch(metric, "s", "counter", desc)],
                    lambda pol=pol: [nv.nvmlDeviceGetViolationStatus(h, pol).violationTime
                                     * 1e-9], slow=True)
        if "pcie_tx" not in have and hasattr(nv, "nvmlDeviceGetPcieThroughput") \
                and not g.sealed:
            # one blocking call at open; afterwards only the legacy thread calls it
            if self._try(g, "pcie_throughput", lambda: nv.nvmlDeviceGetPcieThroughput(
                    h, nv.NVML_PCIE_UTIL_TX_BYTES)) == "ok":
                g.legacy_pcie = True
                g.declare([ch("pcie_tx_rate", "bytes/s", "gauge",
                              "PCIe TX throughput (driver's 20 ms window, read once a second)"),
                           ch("pcie_rx_rate", "bytes/s", "gauge",
                              "PCIe RX throughput (driver's 20 ms window, read once a second)")])
        return groups

    def _c(self, g: _Gpu, name: str) -> Any:
        """A C function for the fast path, None when absent (callers fall back)."""
        if g.h is None:
            return None
        try:
            return _cfn(self.nv, name)
        except self.nv.NVMLError:
            return None

    def _static(self, g: _Gpu, items: list) -> list[tuple[ChannelMeta, float]]:
        out = []
        for metric, unit, desc, fn in items:
            try:
                out.append((g.ch(metric, unit, "gauge", desc), float(fn())))
            except self.nv.NVMLError:
                pass
        return out

    def _fields(self, g: _Gpu, probe: bool, groups: list[_Group]):
        """Fast and slow field batches; returns the (metric, id) pairs each kept."""
        nv, h = self.nv, g.h
        cand = []
        for suffix, metric, unit, kind, scale, desc, scope, slow in FIELDS:
            fid = getattr(nv, "NVML_FI_DEV_" + suffix, None)
            if fid is not None:
                cand.append((metric, (fid, scope), g.ch(metric, unit, kind, desc), scale, slow))
        kept: dict[str, tuple] = {}
        retry = False
        if not probe:
            kept = {c[0]: c for c in cand}
        elif cand:
            try:
                vals = nv.nvmlDeviceGetFieldValues(h, [c[1] for c in cand])
                rets = [int(v.nvmlReturn) for v in vals]
            except nv.NVMLError as e:
                code = _code(e)
                if code in ABSENT:
                    rets = [_NOT_SUPPORTED] * len(cand)
                else:  # keep them all declared; the batch is retried
                    g.note(f"field values: {e} at open (retried every {RETRY_S:.0f} s)")
                    rets, retry = [0] * len(cand), True
            for c, r in zip(cand, rets):
                if r == 0 or (r not in ABSENT and r != _NO_PERMISSION):
                    kept[c[0]] = c
                elif r == _NO_PERMISSION:
                    g.note(f"field {c[0]}: no permission (needs root)")
        # NVLink errors per link where the *_TOTAL fields are refused (Hopper)
        links = self._active_links(g) if probe else []
        per_link: list[tuple[str, list[tuple[int, int]], ChannelMeta]] = []
        for metric, suffix in NVLINK_PER_LINK.items():
            fid = getattr(nv, "NVML_FI_DEV_" + suffix, None)
            if metric in kept or fid is None or not links:
                continue
            ids = [(fid, link) for link in links]
            try:
                vals = nv.nvmlDeviceGetFieldValues(h, ids)
                ok = [i for i, v in zip(ids, vals) if v.nvmlReturn == 0]
            except nv.NVMLError:
                ok = []
            if ok:
                desc = {"nvlink_replay_errors": "NVLink replays",
                        "nvlink_recovery_errors": "NVLink link recoveries",
                        "nvlink_crc_flit_errors": "NVLink CRC errors"}[metric]
                per_link.append((metric, ok, g.ch(metric, "errors", "counter",
                                                  f"{desc}, summed over active links")))
        fast_ok, slow_ok = [], []
        for slow, dst in ((False, fast_ok), (True, slow_ok)):
            sel = [c for c in kept.values() if c[4] == slow]
            extra = per_link if slow else []
            if not sel and not extra:
                continue
            ids = [c[1] for c in sel]
            scales = [c[3] for c in sel]
            unwrap: list[_Unwrap | None] = [None] * len(sel)
            kinds = [c[2].kind for c in sel]
            spans = [len(x[1]) for x in extra]
            for x in extra:
                ids.extend(x[1])
            metas = [c[2] for c in sel] + [x[2] for x in extra]
            fb = _FieldBatch(nv, h, ids) if probe else None

            def batch(fb=fb, scales=scales, unwrap=unwrap, kinds=kinds, spans=spans,
                      n=len(sel)) -> list[float]:
                vals = fb.read()
                out = []
                for k in range(n):
                    ret, vt, raw = vals[k]
                    if ret != 0:
                        if ret == _GPU_IS_LOST:
                            raise nv.NVMLError(_GPU_IS_LOST)
                        out.append(NAN)
                        continue
                    bits = _VALUE.get(vt, ("ullVal", 64))[1]
                    if 0 < bits < 64 and kinds[k] == "counter":
                        u = unwrap[k]
                        if u is None:
                            u = unwrap[k] = _Unwrap(bits)
                        raw = u(raw)
                    out.append(raw * scales[k])
                j = n
                for s in spans:  # per-link sums
                    tot = 0.0
                    for ret, _vt, raw in vals[j:j + s]:
                        tot = tot + raw if ret == 0 else NAN
                    out.append(tot)
                    j += s
                return out
            grp = _Group("fields_slow" if slow else "fields", metas, batch, slow)
            if retry:
                grp.retry_at = self.clock() + RETRY_S
            groups.append(grp)
            dst.extend((c[0], c[1]) for c in sel)
            dst.extend((x[0], None) for x in extra)
        return fast_ok, slow_ok

    def _active_links(self, g: _Gpu) -> list[int]:
        nv, h = self.nv, g.h
        fid = getattr(nv, "NVML_FI_DEV_NVLINK_LINK_COUNT", None)
        n = 0
        if fid is not None:
            try:
                v = nv.nvmlDeviceGetFieldValues(h, [fid])[0]
                if v.nvmlReturn == 0:
                    n = int(getattr(v.value, _VALUE.get(v.valueType, ("uiVal", 32))[0]))
            except nv.NVMLError:
                n = 0
        links = []
        for link in range(min(n, 18)):
            try:
                if nv.nvmlDeviceGetNvLinkState(h, link) == 1:
                    links.append(link)
            except nv.NVMLError:
                pass
        return links

    def _open_xid(self, gpus: list[_Gpu], notes: list[str]) -> list[ChannelMeta]:
        nv = self.nv
        xid_type = getattr(nv, "nvmlEventTypeXidCriticalError", 0x8)
        try:
            self._evset = nv.nvmlEventSetCreate()
        except nv.NVMLError as e:
            notes.append(f"XID events unavailable: {e}")
            return []
        chans: list[ChannelMeta] = []
        for g in gpus:
            try:
                nv.nvmlDeviceRegisterEvents(g.h, xid_type, self._evset)
            except nv.NVMLError as e:
                notes.append(f"GPU {g.index}: XID events unavailable ({e})")
                continue
            self._xid_idx[g.index] = len(self._xid)
            self._xid_handle[_addr(g.h)] = g.index
            self._xid.append([0.0, 0.0])
            chans.append(g.ch("xid_events", "events", "counter",
                              "XID critical errors reported by the driver"))
            chans.append(g.ch("xid_last", "xid", "gauge",
                              "code of the latest XID error (0 = none yet)"))
        if not chans:
            try:
                nv.nvmlEventSetFree(self._evset)
            except nv.NVMLError:
                pass
            self._evset = None
        return chans

    # -- sample ----------------------------------------------------------------------------
    def sample(self) -> list[float]:
        n = self._n
        self._n += 1
        now = self.clock()
        out: list[float] = []
        for g in self._gpus:
            out.extend(g.sample(n, now))
        if self._evset is not None:
            self._poll_xid()
            for cnt_last in self._xid:
                out.extend(cnt_last)
        return out

    def _poll_xid(self) -> None:
        nv = self.nv
        for _ in range(64):  # bounded: an XID storm must not stall the tick
            try:
                ev = nv.nvmlEventSetWait(self._evset, 0)
            except nv.NVMLError:  # NVML_ERROR_TIMEOUT: no pending event
                return
            idx = self._xid_handle.get(_addr(ev.device))
            if idx is None:
                try:
                    idx = int(nv.nvmlDeviceGetIndex(ev.device))
                except nv.NVMLError:
                    continue
            k = self._xid_idx.get(idx)
            if k is not None:
                self._xid[k][0] += 1
                self._xid[k][1] = float(ev.eventData)
                log.warning("GPU %d: XID %d", idx, ev.eventData)

    def close(self) -> None:
        if self._legacy is not None:
            self._legacy.close()
            self._legacy = None
        nv = self.nv
        if nv is None:
            return
        if self._evset is not None:
            try:
                nv.nvmlEventSetFree(self._evset)
            except Exception:
                pass
            self._evset = None
        if self._inited:
            try:
                nv.nvmlShutdown()
            except Exception:
                pass
            self._inited = False

    def describe(self) -> dict:
        d = super().describe()
        notes = [self.note] if self.note else []
        for g in self._gpus:
            if g.reason:
                notes.append(f"GPU {g.index} skipped: {g.reason}")
            notes.extend(f"GPU {g.index}: {m}" for m in g.notes)
        if notes:
            d["note"] = "; ".join(notes)
        if self.skipped:
            d["skipped_gpus"] = {str(k): v for k, v in self.skipped.items()}
        return d
