"""NVIDIA GPUs through NVML (``pynvml`` from the ``nvidia-ml-py`` package).

Per GPU (host index ``i``, NVML enumeration order) the channels are ``gpu.<i>.<metric>``:
utilization (SM, memory), memory used/total, power draw and limit, energy, GPU and HBM
temperature, SM and memory clocks with their maxima, clock-throttle reasons decoded into 0/1
channels, PCIe TX/RX bytes, PCIe link generation/width (current and max), PCIe replays, NVLink
data and error counters, ECC corrected/uncorrected, retired pages, row remapping, and XID
critical-error events.

Cost: everything NVML offers as a *field value* (power, energy, PCIe bytes and replays, ECC,
retired pages, remapped rows, NVLink) is fetched with ONE batched ``nvmlDeviceGetFieldValues``
call per GPU per sample; the rest is one call per metric group.  Fields and calls that answer
NOT_SUPPORTED at ``open()`` are dropped, so each GPU only gets the channels it really has.
The PCIe link state and the legacy ``nvmlDeviceGetPcieThroughput`` (which blocks ~20 ms inside
the driver) are read only every ``slow_every`` samples.  XID events come from an NVML event
set polled with a zero timeout (never blocks).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

from ..types import ChannelMeta
from .probe import NAN, Probe

log = logging.getLogger(__name__)

# Field values fetched in one batch: (pynvml constant, metric, unit, kind, scale, description)
FIELDS = [
    ("NVML_FI_DEV_POWER_INSTANT", "power", "W", "gauge", 1e-3, "power draw (instant)"),
    ("NVML_FI_DEV_POWER_CURRENT_LIMIT", "power_limit", "W", "gauge", 1e-3,
     "enforced power limit"),
    ("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "energy", "J", "counter", 1e-3,
     "energy consumed since driver load"),
    ("NVML_FI_DEV_MEMORY_TEMP", "memory_temp", "degC", "gauge", 1.0, "HBM temperature"),
    ("NVML_FI_DEV_PCIE_COUNT_TX_BYTES", "pcie_tx", "bytes", "counter", 1.0,
     "bytes sent over PCIe"),
    ("NVML_FI_DEV_PCIE_COUNT_RX_BYTES", "pcie_rx", "bytes", "counter", 1.0,
     "bytes received over PCIe"),
    ("NVML_FI_DEV_PCIE_REPLAY_COUNTER", "pcie_replay", "replays", "counter", 1.0,
     "PCIe replays (link errors retried)"),
    ("NVML_FI_DEV_ECC_SBE_VOL_TOTAL", "ecc_corrected", "errors", "counter", 1.0,
     "corrected (single-bit) ECC errors since driver load"),
    ("NVML_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_uncorrected", "errors", "counter", 1.0,
     "uncorrected (double-bit) ECC errors since driver load"),
    ("NVML_FI_DEV_RETIRED_SBE", "retired_pages_sbe", "pages", "gauge", 1.0,
     "pages retired for single-bit errors"),
    ("NVML_FI_DEV_RETIRED_DBE", "retired_pages_dbe", "pages", "gauge", 1.0,
     "pages retired for double-bit errors"),
    ("NVML_FI_DEV_RETIRED_PENDING", "retired_pages_pending", "flag", "gauge", 1.0,
     "1 if a page retirement waits for a reset"),
    ("NVML_FI_DEV_REMAPPED_COR", "remapped_rows_cor", "rows", "gauge", 1.0,
     "rows remapped for correctable errors"),
    ("NVML_FI_DEV_REMAPPED_UNC", "remapped_rows_unc", "rows", "gauge", 1.0,
     "rows remapped for uncorrectable errors"),
    ("NVML_FI_DEV_REMAPPED_PENDING", "remap_pending", "flag", "gauge", 1.0,
     "1 if a row remap waits for a GPU reset"),
    ("NVML_FI_DEV_REMAPPED_FAILURE", "remap_failure", "flag", "gauge", 1.0,
     "1 if a row remap failed (GPU should be replaced)"),
    ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "nvlink_tx", "KiB", "counter", 1.0,
     "NVLink data transmitted, all links"),
    ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", "nvlink_rx", "KiB", "counter", 1.0,
     "NVLink data received, all links"),
    ("NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "nvlink_crc_flit_errors", "errors",
     "counter", 1.0, "NVLink flit CRC errors, all links"),
    ("NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "nvlink_crc_data_errors", "errors",
     "counter", 1.0, "NVLink data CRC errors, all links"),
    ("NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "nvlink_replay_errors", "errors",
     "counter", 1.0, "NVLink replays, all links"),
    ("NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "nvlink_recovery_errors", "errors",
     "counter", 1.0, "NVLink link recoveries, all links"),
]

# Throttle ("clocks event") reason bits → 0/1 channels.
THROTTLE_BITS = [
    ("throttle_power_cap", 0x4, "clocks held down by the software power cap"),
    ("throttle_hw_slowdown", 0x8, "hardware slowdown (thermal or power brake)"),
    ("throttle_sync_boost", 0x10, "clocks held to match other GPUs (sync boost)"),
    ("throttle_sw_thermal", 0x20, "software thermal slowdown"),
    ("throttle_hw_thermal", 0x40, "hardware thermal slowdown"),
    ("throttle_hw_power_brake", 0x80, "hardware power brake (external signal)"),
    ("throttle_idle", 0x1, "clocks low because the GPU is idle"),
]

_VALUE_ATTR = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal",
               6: "usVal"}


def _field_value(fv: Any) -> float:
    return float(getattr(fv.value, _VALUE_ATTR.get(fv.valueType, "ullVal")))


def _import_pynvml():
    import pynvml  # nvidia-ml-py
    return pynvml


def _reason_from(e: BaseException, pynvml: Any) -> str:
    val = getattr(e, "value", None)
    if val == getattr(pynvml, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
        return "NVML not available: libnvidia-ml.so.1 not found (no NVIDIA driver)"
    if val == getattr(pynvml, "NVML_ERROR_DRIVER_NOT_LOADED", 9):
        return "NVML not available: the NVIDIA kernel driver is not loaded"
    if val == getattr(pynvml, "NVML_ERROR_NO_PERMISSION", 4):
        return "NVML not available: permission denied on /dev/nvidia*"
    return f"NVML not available: {e}"


class _Group:
    """Channels filled by one NVML call (or one batched field query) for one GPU."""

    __slots__ = ("channels", "fn", "every", "last")

    def __init__(self, channels: list[ChannelMeta], fn: Callable[[], list[float]],
                 every: int = 1):
        self.channels, self.fn, self.every = channels, fn, every
        self.last: list[float] = [NAN] * len(channels)


class NvmlProbe(Probe):
    """All GPUs of the node (``gpus=None``) or the given host indices (a run's GPUs)."""

    name = "nvml"

    def __init__(self, gpus: Sequence[int] | None = None, slow_every: int = 10,
                 xid_events: bool = True):
        super().__init__()
        self.gpus = list(gpus) if gpus is not None else None
        self.slow_every = max(1, int(slow_every))
        self.xid_events = xid_events
        self.note = ""
        self._nv: Any = None
        self._groups: list[_Group] = []
        self._n = 0
        self._evset: Any = None
        self._xid_idx: dict[int, int] = {}   # host GPU index → position in self._xid
        self._xid: list[list[float]] = []    # [count, last xid] per GPU with events
        self._xid_handles: dict[int, int] = {}
        self._inited = False

    # -- open ------------------------------------------------------------------------------
    def open(self) -> None:
        try:
            self._open()
        except Exception as e:  # open() never raises
            self.close()
            self._unavailable(f"NVML not available: {type(e).__name__}: {e}")

    def _open(self) -> None:
        try:
            nv = _import_pynvml()
        except ImportError as e:
            self._unavailable(f"NVML not available: the nvidia-ml-py package is not installed "
                              f"({e})")
            return
        self._nv = nv
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
        channels: list[ChannelMeta] = []
        notes: list[str] = []
        for i in wanted:
            h = nv.nvmlDeviceGetHandleByIndex(i)
            for g in self._groups_for(i, h):
                self._groups.append(g)
                channels.extend(g.channels)
        if self.xid_events:
            xid_ch = self._open_xid(wanted, notes)
            channels.extend(xid_ch)
        self.note = "; ".join(notes)
        self._ready(channels)

    def _ch(self, i: int, metric: str, unit: str, kind: str, desc: str) -> ChannelMeta:
        return ChannelMeta(f"gpu.{i}.{metric}", unit, kind, self.name, desc)

    def _try(self, fn: Callable[[], list[float]]) -> list[float] | None:
        """Call once at open: None when the GPU does not support it (the group is dropped)."""
        try:
            return fn()
        except self._nv.NVMLError as e:
            log.debug("NVML call unsupported: %s", e)
            return None

    def _groups_for(self, i: int, h: Any) -> list[_Group]:
        nv = self._nv
        groups: list[_Group] = []
        ch = lambda m, u, k, d: self._ch(i, m, u, k, d)  # noqa: E731

        def add(chans: list[ChannelMeta], fn: Callable[[], list[float]], every: int = 1) -> None:
            first = self._try(fn)
            if first is not None:
                g = _Group(chans, fn, every)
                g.last = list(first)
                groups.append(g)

        def util() -> list[float]:
            u = nv.nvmlDeviceGetUtilizationRates(h)
            return [float(u.gpu), float(u.memory)]
        add([ch("util_sm", "%", "gauge", "time a kernel was running (SM utilization)"),
             ch("util_mem", "%", "gauge", "time device memory was read or written")], util)

        def mem() -> list[float]:
            m = nv.nvmlDeviceGetMemoryInfo(h)
            return [float(m.used), float(m.total)]
        add([ch("mem_used", "bytes", "gauge", "device memory used"),
             ch("mem_total", "bytes", "gauge", "device memory total")], mem)

        add([ch("temp", "degC", "gauge", "GPU core temperature")],
            lambda: [float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))])

        # Static maxima are read once; the current clocks every sample.
        maxes = [self._try(lambda c=c: [float(nv.nvmlDeviceGetMaxClockInfo(h, c))])
                 for c in (nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM)]

        def clocks() -> list[float]:
            return [float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                    float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM))]
        add([ch("clock_sm", "MHz", "gauge", "SM clock"),
             ch("clock_mem", "MHz", "gauge", "memory clock")], clocks)
        mx = [m[0] if m else NAN for m in maxes]
        if maxes[0] or maxes[1]:
            groups.append(_Group([ch("clock_sm_max", "MHz", "gauge", "maximum SM clock"),
                                  ch("clock_mem_max", "MHz", "gauge", "maximum memory clock")],
                                 lambda mx=mx: mx))

        reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons")

        def throttle() -> list[float]:
            r = int(reasons_fn(h))
            return [1.0 if r & bit else 0.0 for _, bit, _ in THROTTLE_BITS]
        add([ch(m, "flag", "gauge", d) for m, _, d in THROTTLE_BITS], throttle)

        # Batched field values: probe each field once, keep the supported ones.
        ids, metas, scales = [], [], []
        for const, metric, unit, kind, scale, desc in FIELDS:
            fid = getattr(nv, const, None)
            if fid is not None:
                ids.append(fid)
                metas.append(ch(metric, unit, kind, desc))
                scales.append(scale)
        fields_ok: set[str] = set()
        if ids:
            try:
                vals = nv.nvmlDeviceGetFieldValues(h, ids)
                ok = [k for k, fv in enumerate(vals) if fv.nvmlReturn == 0]
            except nv.NVMLError as e:
                log.debug("nvmlDeviceGetFieldValues unsupported: %s", e)
                ok = []
            if ok:
                ids = [ids[k] for k in ok]
                metas = [metas[k] for k in ok]
                scales = [scales[k] for k in ok]
                fields_ok = {m.name.split(".", 2)[2] for m in metas}

                def fields(ids=ids, scales=scales) -> list[float]:
                    out = []
                    for fv, s in zip(nv.nvmlDeviceGetFieldValues(h, ids), scales):
                        out.append(_field_value(fv) * s if fv.nvmlReturn == 0 else NAN)
                    return out
                add(metas, fields)

        # Fallbacks for drivers that lack the field ids.
        if "power" not in fields_ok:
            add([ch("power", "W", "gauge", "power draw")],
                lambda: [nv.nvmlDeviceGetPowerUsage(h) * 1e-3])
        if "power_limit" not in fields_ok:
            add([ch("power_limit", "W", "gauge", "enforced power limit")],
                lambda: [nv.nvmlDeviceGetEnforcedPowerLimit(h) * 1e-3])
        if "ecc_corrected" not in fields_ok and hasattr(nv, "nvmlDeviceGetTotalEccErrors"):
            add([ch("ecc_corrected", "errors", "counter", "corrected ECC errors"),
                 ch("ecc_uncorrected", "errors", "counter", "uncorrected ECC errors")],
                lambda: [float(nv.nvmlDeviceGetTotalEccErrors(
                    h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC)),
                    float(nv.nvmlDeviceGetTotalEccErrors(
                        h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC))])
        if "remapped_rows_cor" not in fields_ok and hasattr(nv, "nvmlDeviceGetRemappedRows"):
            add([ch("remapped_rows_cor", "rows", "gauge", "rows remapped (correctable)"),
                 ch("remapped_rows_unc", "rows", "gauge", "rows remapped (uncorrectable)"),
                 ch("remap_pending", "flag", "gauge", "row remap waits for a reset"),
                 ch("remap_failure", "flag", "gauge", "row remap failed")],
                lambda: [float(x) for x in nv.nvmlDeviceGetRemappedRows(h)][:4],
                every=self.slow_every)
        if "pcie_tx" not in fields_ok and hasattr(nv, "nvmlDeviceGetPcieThroughput"):
            # Legacy path: blocks ~20 ms in the driver, so only every slow_every samples.
            add([ch("pcie_tx_rate", "bytes/s", "gauge", "PCIe TX throughput (20 ms window)"),
                 ch("pcie_rx_rate", "bytes/s", "gauge", "PCIe RX throughput (20 ms window)")],
                lambda: [nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES) * 1024.0,
                         nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES) * 1024.0],
                every=self.slow_every)

        # PCIe link: current state can train down at runtime; maxima are static.
        link_max = self._try(lambda: [float(nv.nvmlDeviceGetMaxPcieLinkGeneration(h)),
                                      float(nv.nvmlDeviceGetMaxPcieLinkWidth(h))])
        add([ch("pcie_link_gen", "gen", "gauge", "current PCIe link generation"),
             ch("pcie_link_width", "lanes", "gauge", "current PCIe link width")],
            lambda: [float(nv.nvmlDeviceGetCurrPcieLinkGeneration(h)),
                     float(nv.nvmlDeviceGetCurrPcieLinkWidth(h))], every=self.slow_every)
        if link_max:
            groups.append(_Group([ch("pcie_link_gen_max", "gen", "gauge",
                                     "maximum PCIe link generation"),
                                  ch("pcie_link_width_max", "lanes", "gauge",
                                     "maximum PCIe link width")], lambda lm=link_max: lm))
        return groups

    def _open_xid(self, wanted: list[int], notes: list[str]) -> list[ChannelMeta]:
        nv = self._nv
        xid_type = getattr(nv, "nvmlEventTypeXidCriticalError", 0x8)
        try:
            self._evset = nv.nvmlEventSetCreate()
        except nv.NVMLError as e:
            notes.append(f"XID events unavailable: {e}")
            return []
        chans: list[ChannelMeta] = []
        for i in wanted:
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                nv.nvmlDeviceRegisterEvents(h, xid_type, self._evset)
            except nv.NVMLError as e:
                notes.append(f"GPU {i}: XID events unavailable ({e})")
                continue
            self._xid_idx[i] = len(self._xid)
            self._xid.append([0.0, 0.0])
            chans.append(self._ch(i, "xid_events", "events", "counter",
                                  "XID critical errors reported by the driver"))
            chans.append(self._ch(i, "xid_last", "xid", "gauge",
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
        nv = self._nv
        n = self._n
        self._n += 1
        out: list[float] = []
        for g in self._groups:
            if g.every == 1 or n % g.every == 0:
                try:
                    g.last = g.fn()
                except nv.NVMLError:
                    g.last = [NAN] * len(g.channels)
            out.extend(g.last)
        if self._evset is not None:
            self._poll_xid()
            for cnt_last in self._xid:
                out.extend(cnt_last)
        return out

    def _poll_xid(self) -> None:
        nv = self._nv
        for _ in range(64):  # bounded: an XID storm must not stall the tick
            try:
                ev = nv.nvmlEventSetWait(self._evset, 0)
            except nv.NVMLError:  # NVML_ERROR_TIMEOUT: no pending event
                return
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
        nv = self._nv
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
        if self.note:
            d["note"] = self.note
        return d
