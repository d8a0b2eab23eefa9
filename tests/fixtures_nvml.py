"""A fake NVIDIA driver that sits *under* the real ``nvidia-ml-py`` binding (module ``pynvml``).

The binding resolves every C call through ``pynvml._nvmlGetFunctionPointer(name)``, i.e.
``getattr(pynvml.nvmlLib, name)`` cached in ``pynvml._nvmlGetFunctionPointer_cache``, and only loads
``libnvidia-ml.so.1`` while ``pynvml.nvmlLib is None``.  :func:`install_fake_nvml` puts a
:class:`FakeDriver`'s library object there: its attributes are real ``ctypes.CFUNCTYPE`` function
pointers implemented in Python, written to the C semantics of ``nvml.h`` (return codes, output
pointers, structure layouts, the two-call size protocol, per-field ``nvmlReturn``).  The binding's own
argument marshalling, struct parsing, ``NVMLError_*`` classes and version fallbacks therefore run for
real.  A symbol the fake library lacks makes the binding raise ``NVMLError_FunctionNotFound``, exactly as
with an older ``libnvidia-ml.so``.

Quick use::

    def test_x(fake_nvml_driver):            # function-scoped fixture: 8 H100-like GPUs
        drv = fake_nvml_driver
        drv.gpus[3].throttle("power")         # fault knobs move numbers the way a driver would
        pynvml.nvmlInit()
        ...
        drv.gpus[3].calls["nvmlDeviceGetFieldValues"]   # calls per symbol per GPU

    with install_fake_nvml(FakeDriver(old_driver=True, clock=ManualClock())) as drv:
        ...

    @pytest.mark.parametrize("fake_nvml_driver", [dict(gpus=4, model="H200")], indirect=True)
    def test_y(fake_nvml_driver): ...

Units follow nvml.h: power mW, energy mJ, clocks MHz, temperatures C, NVLink throughput KiB,
PCIe counters bytes, legacy PCIe throughput KB/s, violation time ns with ``referenceTime`` a CPU
timestamp in us, field/sample timestamps us since 1970.  Counters integrate the GPU's state over the
driver's clock (``time.monotonic`` or an injected :class:`ManualClock`).  Blocking calls
(``nvmlDeviceGetPcieThroughput``, ``nvmlEventSetWait*``) block in real time.

Kept independent from ``reveal_plugins``: nothing here imports it.
"""
from __future__ import annotations

import collections
import contextlib
import ctypes
import hashlib
import re
import struct
import threading
import time
import traceback
from ctypes import (
    CFUNCTYPE, Structure, Union, c_char_p, c_double, c_int, c_longlong, c_uint, c_ulong, c_ulonglong,
    c_ushort, c_void_p, sizeof,
)

import pytest

# --------------------------------------------------------------------------------------------------
# nvml.h constants (defined here, not taken from the binding)
# --------------------------------------------------------------------------------------------------
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_INSUFFICIENT_SIZE = 7
ERROR_TIMEOUT = 10
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_RESET_REQUIRED = 16
ERROR_ARGUMENT_VERSION_MISMATCH = 25
ERROR_UNKNOWN = 999

ERROR_CODES = {
    "uninitialized": ERROR_UNINITIALIZED, "invalid_argument": ERROR_INVALID_ARGUMENT,
    "not_supported": ERROR_NOT_SUPPORTED, "no_permission": ERROR_NO_PERMISSION,
    "not_found": ERROR_NOT_FOUND, "insufficient_size": ERROR_INSUFFICIENT_SIZE,
    "timeout": ERROR_TIMEOUT, "gpu_is_lost": ERROR_GPU_IS_LOST, "lost": ERROR_GPU_IS_LOST,
    "reset_required": ERROR_RESET_REQUIRED, "unknown": ERROR_UNKNOWN,
}
_ERROR_STRINGS = {
    0: "Success", 1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported",
    4: "Insufficient Permissions", 6: "Not Found", 7: "Insufficient Size", 10: "Timeout",
    13: "Function Not Found", 15: "GPU is lost", 16: "GPU requires restart",
    25: "Argument version mismatch", 999: "Unknown Error",
}

VALUE_TYPE_DOUBLE = 0
VALUE_TYPE_UINT = 1
VALUE_TYPE_ULL = 3

UINT_MAX = 0xFFFFFFFF
ULL_NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF

# clocks event (throttle) reasons
REASON_GPU_IDLE = 0x1
REASON_APP_CLOCKS = 0x2
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SYNC_BOOST = 0x10
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80
REASON_DISPLAY_CLOCK = 0x100
REASONS_SUPPORTED = 0x1FF

# perf policies (nvmlDeviceGetViolationStatus)
POLICY_POWER, POLICY_THERMAL, POLICY_SYNC_BOOST, POLICY_BOARD_LIMIT = 0, 1, 2, 3
POLICY_LOW_UTILIZATION, POLICY_RELIABILITY = 4, 5
POLICY_TOTAL_APP_CLOCKS, POLICY_TOTAL_BASE_CLOCKS = 10, 11
_POLICIES = (0, 1, 2, 3, 4, 5, 10, 11)

EVENT_SBE, EVENT_DBE, EVENT_PSTATE, EVENT_XID, EVENT_MIG_CONFIG = 0x1, 0x2, 0x4, 0x8, 0x100
EVENTS_SUPPORTED = EVENT_SBE | EVENT_DBE | EVENT_PSTATE | EVENT_XID | EVENT_MIG_CONFIG

NVLINK_LINKS = 18  # H100/H200 SXM
MAX_MIG_DEVICES = 7

# field ids (nvml.h)
FI_ECC_CURRENT, FI_ECC_PENDING = 1, 2
FI_ECC_SBE_VOL_TOTAL, FI_ECC_DBE_VOL_TOTAL, FI_ECC_SBE_AGG_TOTAL, FI_ECC_DBE_AGG_TOTAL = 3, 4, 5, 6
FI_RETIRED_SBE, FI_RETIRED_DBE, FI_RETIRED_PENDING = 29, 30, 31
FI_RETIRED_PENDING_SBE, FI_RETIRED_PENDING_DBE = 92, 93
FI_MEMORY_TEMP = 82
FI_TOTAL_ENERGY_CONSUMPTION = 83
FI_NVLINK_LINK_COUNT = 91
FI_PCIE_REPLAY_COUNTER, FI_PCIE_REPLAY_ROLLOVER_COUNTER = 94, 95
FI_NVLINK_THROUGHPUT_DATA_TX, FI_NVLINK_THROUGHPUT_DATA_RX = 138, 139
FI_NVLINK_THROUGHPUT_RAW_TX, FI_NVLINK_THROUGHPUT_RAW_RX = 140, 141
FI_REMAPPED_COR, FI_REMAPPED_UNC, FI_REMAPPED_PENDING, FI_REMAPPED_FAILURE = 142, 143, 144, 145
FI_NVLINK_ERROR_DL_REPLAY, FI_NVLINK_ERROR_DL_RECOVERY, FI_NVLINK_ERROR_DL_CRC = 161, 162, 163
FI_NVLINK_GET_STATE = 165
FI_POWER_AVERAGE, FI_POWER_INSTANT = 185, 186
FI_POWER_MIN_LIMIT, FI_POWER_MAX_LIMIT, FI_POWER_DEFAULT_LIMIT, FI_POWER_CURRENT_LIMIT = 187, 188, 189, 190
FI_ENERGY = 191
FI_PCIE_COUNT_TX_BYTES, FI_PCIE_COUNT_RX_BYTES = 197, 198
FI_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN = 269
FI_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN = 270
FI_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN = 271
FI_MAX = 308
# NVLink totals refused on Hopper (configurable): CRC flit/data, replay, recovery, ECC data
FI_NVLINK_TOTALS = {38: "crc_flit", 45: "crc_data", 52: "replay", 59: "recovery", 160: "ecc_data"}
# per-link error fields: the link is encoded in the field id (links 0..11 only)
_NVLINK_LINK_FIELDS: dict[int, tuple[str, int]] = {}
for _kind, _lo, _hi in (("crc_flit", 32, 96), ("crc_data", 39, 102), ("replay", 46, 108),
                        ("recovery", 53, 114)):
    for _l in range(6):
        _NVLINK_LINK_FIELDS[_lo + _l] = (_kind, _l)
    for _l in range(6):
        _NVLINK_LINK_FIELDS[_hi + _l] = (_kind, 6 + _l)
for _l in range(12):
    _NVLINK_LINK_FIELDS[148 + _l] = ("ecc_data", _l)
_PERF_POLICY_FIELDS = {74: 0, 75: 1, 76: 2, 77: 3, 78: 4, 79: 5, 80: 10, 81: 11,
                       269: "sw_therm", 270: "hw_therm", 271: "hw_brake"}
_ECC_FIELDS = {FI_ECC_SBE_VOL_TOTAL: "sbe_vol", FI_ECC_DBE_VOL_TOTAL: "dbe_vol",
               FI_ECC_SBE_AGG_TOTAL: "sbe_agg", FI_ECC_DBE_AGG_TOTAL: "dbe_agg"}
_RETIRED_FIELDS = {FI_RETIRED_SBE: "sbe", FI_RETIRED_DBE: "dbe", FI_RETIRED_PENDING: "pending",
                   FI_RETIRED_PENDING_SBE: "pending", FI_RETIRED_PENDING_DBE: "pending"}
_REMAPPED_FIELDS = {FI_REMAPPED_COR: "cor", FI_REMAPPED_UNC: "unc", FI_REMAPPED_PENDING: "pending",
                    FI_REMAPPED_FAILURE: "failure"}
_DL_ERROR_FIELDS = {161: "replay", 162: "recovery", 163: "crc_flit"}
_NVLINK_ERROR_COUNTERS = {0: "replay", 1: "recovery", 2: "crc_flit", 3: "crc_data", 4: "ecc_data"}
OLD_DRIVER_FIELD_MAX = 161  # an r470-era library answers NOT_SUPPORTED from here on

# Symbols an r470-era libnvidia-ml.so does not export (the binding raises FunctionNotFound).
OLD_DRIVER_MISSING = frozenset({
    "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetSupportedClocksEventReasons",
    "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v3", "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetGpuMaxPcieLinkGeneration", "nvmlDeviceGetTemperatureV", "nvmlDeviceGetPcieSpeed",
    "nvmlDeviceGetProcessesUtilizationInfo", "nvmlSystemGetCudaDriverVersion_v2",
})

_MODELS = {
    "H100": dict(name="NVIDIA H100 80GB HBM3", mem_mib=81559, reserved_mib=511, pci_device_id=0x233010DE,
                 pci_subsystem_id=0x16C110DE, max_sm=1980, base_sm=1590, idle_sm=345, mem_clock=2619,
                 max_video=1755, idle_video=765, power_limit_mw=700_000, min_limit_mw=200_000,
                 idle_power_mw=70_000, cores=16896, mig_profiles=("1g.10gb", "1g.20gb", "2g.20gb",
                                                                  "3g.40gb", "4g.40gb", "7g.80gb")),
    "H200": dict(name="NVIDIA H200", mem_mib=143771, reserved_mib=551, pci_device_id=0x233510DE,
                 pci_subsystem_id=0x18A610DE, max_sm=1980, base_sm=1590, idle_sm=345, mem_clock=3201,
                 max_video=1755, idle_video=765, power_limit_mw=700_000, min_limit_mw=200_000,
                 idle_power_mw=75_000, cores=16896, mig_profiles=("1g.18gb", "1g.35gb", "2g.35gb",
                                                                  "3g.71gb", "4g.71gb", "7g.141gb")),
}
# HGX H100/H200 baseboard bus numbers, in NVML (PCI) order
_HGX_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
_PCIE_GEN_SPEED_MBPS = {1: 2500, 2: 5000, 3: 8000, 4: 16000, 5: 32000}
_PCIE_GEN_LANE_BYTES = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9}  # per lane, per direction
GIB = 1 << 30


def error_code(err) -> int:
    """``"no_permission"`` / ``"gpu_is_lost"`` / ``"reset_required"`` / an int -> nvmlReturn_t."""
    if isinstance(err, int):
        return err
    return ERROR_CODES[str(err).lower()]


# --------------------------------------------------------------------------------------------------
# nvml.h structure layouts (written from the header, independently of the binding's definitions)
# --------------------------------------------------------------------------------------------------
class _PciInfo(Structure):  # nvmlPciInfo_t (v3)
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", c_uint), ("bus", c_uint),
                ("device", c_uint), ("pciDeviceId", c_uint), ("pciSubSystemId", c_uint),
                ("busId", ctypes.c_char * 32)]


class _Memory(Structure):  # nvmlMemory_t
    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]


class _MemoryV2(Structure):  # nvmlMemory_v2_t
    _fields_ = [("version", c_uint), ("total", c_ulonglong), ("reserved", c_ulonglong),
                ("free", c_ulonglong), ("used", c_ulonglong)]


MEMORY_V2_VERSION = sizeof(_MemoryV2) | (2 << 24)  # NVML_STRUCT_VERSION(Memory, 2)


class _ProcessInfoV1(Structure):  # nvmlProcessInfo_v1_t
    _fields_ = [("pid", c_uint), ("usedGpuMemory", c_ulonglong)]


class _ProcessInfoV2(Structure):  # nvmlProcessInfo_v2_t == nvmlProcessInfo_t (used by _v3)
    _fields_ = [("pid", c_uint), ("usedGpuMemory", c_ulonglong), ("gpuInstanceId", c_uint),
                ("computeInstanceId", c_uint)]


class _Utilization(Structure):  # nvmlUtilization_t
    _fields_ = [("gpu", c_uint), ("memory", c_uint)]


class _ViolationTime(Structure):  # nvmlViolationTime_t
    _fields_ = [("referenceTime", c_ulonglong), ("violationTime", c_ulonglong)]


class _Value(Union):  # nvmlValue_t
    _fields_ = [("dVal", c_double), ("uiVal", c_uint), ("ulVal", c_ulong), ("ullVal", c_ulonglong),
                ("sllVal", c_longlong), ("siVal", c_int), ("usVal", c_ushort)]


class _FieldValue(Structure):  # nvmlFieldValue_t
    _fields_ = [("fieldId", c_uint), ("scopeId", c_uint), ("timestamp", c_longlong),
                ("latencyUsec", c_longlong), ("valueType", c_int), ("nvmlReturn", c_int),
                ("value", _Value)]


# nvmlFieldValue_t byte layout, for fast in-place reads/writes of a field batch
_FV_TS = _FieldValue.timestamp.offset
_FV_VTYPE = _FieldValue.valueType.offset
_FV_RETURN = _FieldValue.nvmlReturn.offset
_FV_VALUE_OFF = _FieldValue.value.offset
assert _FieldValue.scopeId.offset == 4 and _FieldValue.latencyUsec.offset == _FV_TS + 8
assert _FV_RETURN == _FV_VTYPE + 4
_FV_IDS = struct.Struct("=II")          # fieldId, scopeId
_FV_HEAD = struct.Struct("=qq")         # timestamp (us since 1970), latencyUsec
_FV_TYPED = struct.Struct("=ii")        # valueType, nvmlReturn
_FV_RET = struct.Struct("=i")           # nvmlReturn alone
_FV_VALUE = {0: struct.Struct("=d"), 1: struct.Struct("=I"), 3: struct.Struct("=Q")}


class _ProcessUtilizationSample(Structure):  # nvmlProcessUtilizationSample_t
    _fields_ = [("pid", c_uint), ("timeStamp", c_ulonglong), ("smUtil", c_uint), ("memUtil", c_uint),
                ("encUtil", c_uint), ("decUtil", c_uint)]


class _ProcessUtilizationInfoV1(Structure):  # nvmlProcessUtilizationInfo_v1_t
    _fields_ = [("timeStamp", c_ulonglong), ("pid", c_uint), ("smUtil", c_uint), ("memUtil", c_uint),
                ("encUtil", c_uint), ("decUtil", c_uint), ("jpgUtil", c_uint), ("ofaUtil", c_uint)]


class _ProcessesUtilizationInfoV1(Structure):  # nvmlProcessesUtilizationInfo_v1_t
    _fields_ = [("version", c_uint), ("processSamplesCount", c_uint), ("lastSeenTimeStamp", c_ulonglong),
                ("procUtilArray", c_void_p)]


PROCESSES_UTILIZATION_V1_VERSION = sizeof(_ProcessesUtilizationInfoV1) | (1 << 24)


class _EventData(Structure):  # nvmlEventData_t
    _fields_ = [("device", c_void_p), ("eventType", c_ulonglong), ("eventData", c_ulonglong),
                ("gpuInstanceId", c_uint), ("computeInstanceId", c_uint)]


class _EventDataV1(Structure):  # the nvmlEventSetWait (v1) layout
    _fields_ = [("device", c_void_p), ("eventType", c_ulonglong), ("eventData", c_ulonglong)]


class _TemperatureV1(Structure):  # nvmlTemperature_v1_t
    _fields_ = [("version", c_uint), ("sensorType", c_int), ("temperature", c_int)]


TEMPERATURE_V1_VERSION = sizeof(_TemperatureV1) | (1 << 24)

STRUCTS = {  # for layout checks against the binding
    "nvmlPciInfo_t": _PciInfo, "c_nvmlMemory_t": _Memory, "c_nvmlMemory_v2_t": _MemoryV2,
    "c_nvmlProcessInfo_v2_t": _ProcessInfoV2, "c_nvmlUtilization_t": _Utilization,
    "c_nvmlViolationTime_t": _ViolationTime, "c_nvmlFieldValue_t": _FieldValue,
    "c_nvmlProcessUtilizationSample_t": _ProcessUtilizationSample,
    "c_nvmlProcessUtilizationInfo_v1_t": _ProcessUtilizationInfoV1,
    "c_nvmlProcessesUtilizationInfo_v1_t": _ProcessesUtilizationInfoV1,
    "c_nvmlEventData_t": _EventData, "c_nvmlTemperature_v1_t": _TemperatureV1,
}


def _put(addr, ctype, value) -> int:
    if not addr:
        return ERROR_INVALID_ARGUMENT
    ctype.from_address(addr).value = value
    return SUCCESS


def _put_str(addr, text: str, length) -> int:
    if not addr:
        return ERROR_INVALID_ARGUMENT
    raw = text.encode() + b"\0"
    if length < len(raw):
        return ERROR_INSUFFICIENT_SIZE
    ctypes.memmove(addr, raw, len(raw))
    return SUCCESS


class ManualClock:
    """An injectable clock for deterministic counters: ``clock.advance(1.5)``."""

    def __init__(self, start: float = 1000.0):
        self.t = float(start)

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> float:
        self.t += float(seconds)
        return self.t


# --------------------------------------------------------------------------------------------------
# the simulated hardware
# --------------------------------------------------------------------------------------------------
class FakeProcess:
    def __init__(self, pid, mem_bytes, sm_util, mem_util, kind, mig):
        self.pid, self.mem_bytes, self.sm_util, self.mem_util = pid, mem_bytes, sm_util, mem_util
        self.kind, self.mig = kind, mig

    def __repr__(self):
        return f"FakeProcess(pid={self.pid}, mem={self.mem_bytes}, sm={self.sm_util}, {self.kind})"


class FakeMigDevice:
    """A MIG device (GPU instance + compute instance) of a GPU in MIG mode."""

    def __init__(self, gpu, index, profile, gi_id, ci_id, uuid, mem_bytes):
        self.gpu, self.index, self.profile = gpu, index, profile
        self.gpu_instance_id, self.compute_instance_id = gi_id, ci_id
        self.uuid, self.mem_bytes = uuid, mem_bytes
        self.handle = 0

    @property
    def name(self):
        return f"{self.gpu.name} MIG {self.profile}"

    def __repr__(self):
        return f"FakeMigDevice(gpu={self.gpu.index}, {self.profile}, gi={self.gpu_instance_id})"


class FakeGpu:
    """One GPU.  Knobs (``busy``, ``throttle``, ``downtrain``, ``add_process``, ``lose``, ``xid``, ...)
    change its state; counters are integrated up to "now" before every change and every read."""

    def __init__(self, driver, index, model, minor, bus):
        self.driver = driver
        self.index = index
        self.model = dict(_MODELS[model])
        self.name = self.model["name"]
        self.minor = minor
        digest = hashlib.sha256(f"fake-gpu-{driver.seed}-{index}".encode()).hexdigest()
        self.uuid = f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
        self.serial = str(1654922000000 + driver.seed * 100 + index)
        self.pci_bus = bus
        self.bus_id = f"00000000:{bus:02X}:00.0"
        self.handle = 0
        self.calls: collections.Counter = collections.Counter()
        # open / health state
        self.open_error: int | None = None
        self.lost = False
        # load and faults
        self.load: dict | None = None           # None = idle
        self.throttle_state: tuple | None = None  # (reason, cause, sm_clock)
        self.link_override: tuple | None = None  # (gen, width)
        self.replays_per_s = 0.0
        self.max_link = (5, 16)
        self.gpu_max_link_gen = 5
        self.processes: dict[int, FakeProcess] = {}
        self.mig_enabled = False
        self.mig_devices: list[FakeMigDevice] = []
        self.nvlink_active = [True] * NVLINK_LINKS
        self.nvlink_errors = {k: [0] * NVLINK_LINKS for k in _NVLINK_ERROR_COUNTERS.values()}
        self.ecc = {"sbe_vol": 0, "dbe_vol": 0, "sbe_agg": 0, "dbe_agg": 0}
        self.remapped = {"cor": 0, "unc": 0, "pending": 0, "failure": 0}
        self.retired = {"sbe": 0, "dbe": 0, "pending": 0}
        self.field_errors: dict[int, int] = {}
        self.pcie_counter_bits = driver.pcie_counter_bits
        # accumulators (floats; reported truncated)
        self._t = driver.clock()
        self.energy_mj = float(driver.seed * 1000 + index * 7_000_000)
        self.pcie_tx_bytes = 0.0
        self.pcie_rx_bytes = 0.0
        self._nvl_tx = [0.0] * NVLINK_LINKS
        self._nvl_rx = [0.0] * NVLINK_LINKS
        self._nvl_pending_tx = self._nvl_pending_rx = 0.0
        self.replays = 0.0
        self.violation_ns: dict = {p: 0.0 for p in (*_POLICIES, "sw_therm", "hw_therm", "hw_brake")}
        self._recompute()

    def __repr__(self):
        return f"FakeGpu({self.index}, {self.bus_id}, lost={self.lost}, load={self.load is not None})"

    # ---- derived instantaneous state ----------------------------------------------------------
    @property
    def busy_now(self) -> bool:
        return self.load is not None

    def _noise(self, key: int) -> float:
        amp = self.driver.noise
        if not amp:
            return 1.0
        x = (self.index * 1_000_003) ^ (key * 7919) ^ (int(self.driver.clock() * 10) * 2_654_435_761)
        x = (x * 1_103_515_245 + 12345) & 0x7FFFFFFF
        return 1.0 + amp * (2.0 * x / 0x7FFFFFFF - 1.0)

    def sm_util(self) -> int:
        base = self.load["sm"] if self.load else 0
        return int(min(100, base + sum(p.sm_util for p in self.processes.values())))

    def mem_util(self) -> int:
        base = self.load["mem_util"] if self.load else 0
        return int(min(100, base + sum(p.mem_util for p in self.processes.values())))

    def sm_clock(self) -> int:
        m = self.model
        if self.throttle_state:
            return self.throttle_state[2]
        if self.load or self.processes:
            return m["max_sm"]
        return m["idle_sm"]

    def power_mw(self) -> float:
        m = self.model
        if self.load is None and not self.processes:
            return m["idle_power_mw"]
        sm = self.sm_util()
        if self.load and self.load.get("power_mw") is not None:
            busy = self.load["power_mw"]
        else:
            busy = m["idle_power_mw"] + (m["power_limit_mw"] * 0.9 - m["idle_power_mw"]) * sm / 100.0
        if self.throttle_state:
            reason = self.throttle_state[0]
            if reason == "power":
                return float(m["power_limit_mw"])
            if reason == "thermal":
                return busy * 0.8
            return busy * 0.55
        return min(busy, float(m["power_limit_mw"]))

    def temperature(self) -> int:
        if self.throttle_state and self.throttle_state[0] == "thermal":
            return 88
        if self.throttle_state and self.throttle_state[:2] == ("hw_slowdown", "thermal"):
            return 93
        return int(32 + 0.4 * self.sm_util())

    def memory_temperature(self) -> int:
        t = self.temperature()
        return t + 9 if t >= 88 else t + 6

    def reasons(self) -> int:
        if self.throttle_state:
            reason, cause, _ = self.throttle_state
            if reason == "power":
                return REASON_SW_POWER_CAP
            if reason == "thermal":
                return REASON_SW_THERMAL
            return REASON_HW_SLOWDOWN | (REASON_HW_THERMAL if cause == "thermal" else REASON_HW_POWER_BRAKE)
        if self.load is None and not self.processes:
            return REASON_GPU_IDLE
        return 0

    def link(self) -> tuple[int, int]:
        if self.link_override:
            return self.link_override
        if self.driver.idle_pcie_downshift and self.load is None and not self.processes:
            return (1, self.max_link[1])
        return self.max_link

    def _pcie_rates(self) -> tuple[float, float]:
        if not self.load:
            return (0.0, 0.0)
        gen, width = self.link()
        cap = _PCIE_GEN_LANE_BYTES[gen] * width
        return (min(self.load["pcie_tx"], cap), min(self.load["pcie_rx"], cap))

    def _nvlink_rate_per_link(self) -> tuple[float, float]:
        active = sum(self.nvlink_active)
        if not self.load or not active:
            return (0.0, 0.0)
        return (self.load["nvlink_tx"] / active, self.load["nvlink_rx"] / active)

    def _active_policies(self) -> list:
        if self.load is None and not self.processes:
            return [POLICY_LOW_UTILIZATION]
        if not self.throttle_state:
            return []
        reason, cause, clock = self.throttle_state
        pols: list = [POLICY_TOTAL_APP_CLOCKS]
        if clock < self.model["base_sm"]:
            pols.append(POLICY_TOTAL_BASE_CLOCKS)
        if reason == "power":
            pols.append(POLICY_POWER)
        elif reason == "thermal":
            pols += [POLICY_THERMAL, "sw_therm"]
        elif cause == "thermal":
            pols += [POLICY_THERMAL, "hw_therm"]
        else:
            pols.append("hw_brake")
        return pols

    # ---- time integration ---------------------------------------------------------------------
    def _recompute(self) -> None:
        """Cache the rates the counters grow at (called after every state change through a knob)."""
        tx, rx = self._pcie_rates()
        ltx, lrx = self._nvlink_rate_per_link()
        self._rates = (self.power_mw(), tx, rx, ltx / 1024.0, lrx / 1024.0, self.replays_per_s,
                       tuple(self._active_policies()))

    def _sync(self, now: float | None = None) -> None:
        now = self.driver.clock() if now is None else now
        dt = now - self._t
        if dt <= 0:
            return
        self._t = now
        if self.lost:
            return  # a GPU off the bus counts nothing
        power, tx, rx, ltx, lrx, replays, policies = self._rates
        self.energy_mj += power * dt  # mW * s = mJ
        self.pcie_tx_bytes += tx * dt
        self.pcie_rx_bytes += rx * dt
        self._nvl_pending_tx += ltx * dt  # KiB per active link, spread over the links lazily
        self._nvl_pending_rx += lrx * dt
        self.replays += replays * dt
        ns = dt * 1e9
        for pol in policies:
            self.violation_ns[pol] += ns

    def _nvlink_flush(self) -> None:
        if self._nvl_pending_tx or self._nvl_pending_rx:
            for link in range(NVLINK_LINKS):
                if self.nvlink_active[link]:
                    self._nvl_tx[link] += self._nvl_pending_tx
                    self._nvl_rx[link] += self._nvl_pending_rx
            self._nvl_pending_tx = self._nvl_pending_rx = 0.0

    @property
    def nvlink_tx_kib(self) -> list[float]:
        """NVLink data sent per link (KiB, float)."""
        with self.driver.lock:
            self._sync()
            self._nvlink_flush()
            return self._nvl_tx

    @property
    def nvlink_rx_kib(self) -> list[float]:
        with self.driver.lock:
            self._sync()
            self._nvlink_flush()
            return self._nvl_rx

    @contextlib.contextmanager
    def _change(self):
        with self.driver.lock:
            self._sync()
            self._nvlink_flush()
            yield
            self._recompute()

    # ---- knobs --------------------------------------------------------------------------------
    def busy(self, sm=95, mem_util=40, power=None, mem_bytes=60 * GIB, pcie_tx_gbps=3.0, pcie_rx_gbps=6.0,
             nvlink_gbps=120.0, nvlink_rx_gbps=None):
        """A normal training load: SM/memory utilisation (%), power in W (None: derived from sm),
        framebuffer in use (bytes, on top of listed processes), PCIe and NVLink traffic (GB/s per
        direction, NVLink spread evenly over the active links)."""
        with self._change():
            self.load = dict(sm=sm, mem_util=mem_util, power_mw=None if power is None else power * 1000.0,
                             mem_bytes=mem_bytes, pcie_tx=pcie_tx_gbps * 1e9, pcie_rx=pcie_rx_gbps * 1e9,
                             nvlink_tx=nvlink_gbps * 1e9,
                             nvlink_rx=(nvlink_gbps if nvlink_rx_gbps is None else nvlink_rx_gbps) * 1e9)
        return self

    def idle(self):
        with self._change():
            self.load = None
            self.throttle_state = None
        return self

    def throttle(self, reason="power", sm_clock=None, cause="power_brake"):
        """Clocks held below max: ``"power"`` (SwPowerCap, power at the enforced limit),
        ``"thermal"`` (SwThermalSlowdown, hot), ``"hw_slowdown"`` (HwSlowdown plus HwPowerBrake or,
        with ``cause="thermal"``, HwThermalSlowdown; clocks halved or worse).  Violation counters of
        the matching policies accumulate while it lasts.  An idle GPU is made busy first."""
        if reason not in ("power", "thermal", "hw_slowdown"):
            raise ValueError(reason)
        max_sm = self.model["max_sm"]
        default = {"power": 0.68, "thermal": 0.6, "hw_slowdown": 0.45}[reason]
        clock = int(sm_clock if sm_clock is not None else max_sm * default)
        if self.load is None:
            self.busy()
        with self._change():
            self.throttle_state = (reason, cause, clock)
        return self

    def unthrottle(self):
        with self._change():
            self.throttle_state = None
        return self

    def downtrain(self, gen=3, width=8, replays_per_s=25.0):
        """PCIe link trained below its max gen/width; replays keep counting up."""
        with self._change():
            self.link_override = (gen, width)
            self.replays_per_s = float(replays_per_s)
        return self

    def retrain(self):
        with self._change():
            self.link_override = None
            self.replays_per_s = 0.0
        return self

    def add_process(self, pid, mem_bytes=1 * GIB, sm_util=0, mem_util=0, kind="compute", mig=None):
        """A process on this GPU (``kind``: compute | graphics | mps; ``mig``: MIG device index).
        ``mem_bytes=None`` reports NVML_VALUE_NOT_AVAILABLE.  Its SM/memory utilisation adds to the
        device's and is reported by the per-process utilisation calls."""
        with self._change():
            self.processes[pid] = FakeProcess(pid, mem_bytes, sm_util, mem_util, kind, mig)
        return self

    def remove_process(self, pid):
        with self._change():
            self.processes.pop(pid, None)
        return self

    def lose(self, xid=79):
        """The GPU falls off the bus: every call on its handles returns GPU_IS_LOST (and opening it
        too).  ``xid`` (default 79) is delivered to event sets first; ``None`` for no event."""
        if xid is not None:
            self.xid(xid)
        with self._change():
            self.lost = True
            self.driver._cond.notify_all()  # event waiters now get GPU_IS_LOST
        return self

    def recover(self):
        with self._change():
            self.lost = False
        return self

    def refuse(self, error="no_permission"):
        """Opening this GPU (by index, UUID, PCI bus id or serial) fails with ``error``
        (no_permission | gpu_is_lost | reset_required | an nvmlReturn_t int)."""
        self.open_error = error_code(error)
        return self

    def xid(self, code, mig=None):
        """An Xid critical error, delivered to every event set registered for Xid events here."""
        self.driver._deliver(self, EVENT_XID, int(code), mig)
        return self

    def ecc_error(self, sbe=0, dbe=0):
        with self._change():
            self.ecc["sbe_vol"] += sbe
            self.ecc["sbe_agg"] += sbe
            self.ecc["dbe_vol"] += dbe
            self.ecc["dbe_agg"] += dbe
        return self

    def remap(self, cor=0, unc=0, pending=None, failure=None):
        with self._change():
            self.remapped["cor"] += cor
            self.remapped["unc"] += unc
            if pending is not None:
                self.remapped["pending"] = int(bool(pending))
            if failure is not None:
                self.remapped["failure"] = int(bool(failure))
        return self

    def nvlink_error(self, link, crc_flit=0, crc_data=0, replay=0, recovery=0, ecc_data=0):
        with self._change():
            for kind, n in (("crc_flit", crc_flit), ("crc_data", crc_data), ("replay", replay),
                            ("recovery", recovery), ("ecc_data", ecc_data)):
                self.nvlink_errors[kind][link] += n
        return self

    def nvlink_down(self, link, down=True):
        with self._change():
            self.nvlink_active[link] = not down
        return self

    def refuse_fields(self, field_ids, error="no_permission"):
        """These field ids answer ``error`` in their own ``nvmlReturn``; the batch still succeeds."""
        for fid in field_ids:
            self.field_errors[int(fid)] = error_code(error)
        return self

    def set_mig(self, profiles=("3g.40gb", "3g.40gb")):
        """Put the GPU in MIG mode with one GPU instance + compute instance per profile;
        ``set_mig(())`` / ``set_mig(None)`` turns MIG off."""
        with self._change():
            for mig in self.mig_devices:
                self.driver._devices.pop(mig.handle, None)
            self.mig_devices = []
            self.mig_enabled = bool(profiles)
            if not profiles:
                return self
            if len(profiles) > MAX_MIG_DEVICES:
                raise ValueError("at most 7 MIG devices")
            for i, prof in enumerate(profiles):
                m = re.fullmatch(r"(\d)g\.(\d+)gb", prof)
                if not m:
                    raise ValueError(prof)
                gi = 0 if m.group(1) == "7" else i + 1
                d = hashlib.sha256(f"mig-{self.uuid}-{i}".encode()).hexdigest()
                uuid = f"MIG-{d[:8]}-{d[8:12]}-{d[12:16]}-{d[16:20]}-{d[20:32]}"
                mig = FakeMigDevice(self, i, prof, gi, 0, uuid, int(m.group(2)) * GIB)
                mig.handle = self.driver._new_handle(mig)
                self.mig_devices.append(mig)
        return self

    # ---- memory ---------------------------------------------------------------------------------
    def memory(self) -> tuple[int, int, int, int]:
        """(total, reserved, used-excluding-reserved, free) in bytes."""
        m = self.model
        total = m["mem_mib"] << 20
        reserved = m["reserved_mib"] << 20
        used = (self.load["mem_bytes"] if self.load else 0) + sum(
            p.mem_bytes or 0 for p in self.processes.values())
        used = min(used, total - reserved)
        return total, reserved, used, total - reserved - used


# --------------------------------------------------------------------------------------------------
# the library
# --------------------------------------------------------------------------------------------------
def _csym(*argtypes, restype=c_int, device=True, mig=False, lock=True, init=True):
    """Mark a FakeDriver method as the C function of the same name (``_c_<symbol>``).  ``device``:
    the first argument is an nvmlDevice_t, resolved centrally (unknown handle -> INVALID_ARGUMENT, lost
    GPU -> GPU_IS_LOST, MIG device handle -> NOT_SUPPORTED unless ``mig``)."""
    def mark(fn):
        fn._csym = dict(argtypes=((c_void_p,) if device else ()) + argtypes, restype=restype,
                        device=device, mig=mig, lock=lock, init=init)
        return fn
    return mark


_BINDING_SYMBOLS: frozenset | None = None


def binding_symbols() -> frozenset:
    """Every C symbol name the installed binding looks up."""
    global _BINDING_SYMBOLS
    if _BINDING_SYMBOLS is None:
        import pynvml
        with open(pynvml.__file__, encoding="utf-8") as f:
            _BINDING_SYMBOLS = frozenset(re.findall(r'_nvmlGetFunctionPointer\("(\w+)"\)', f.read()))
    return _BINDING_SYMBOLS


class _FakeLib:
    """Stands in for the ``CDLL`` object: attributes are ctypes function pointers; a symbol that the
    library does not export raises AttributeError (-> the binding's NVMLError_FunctionNotFound)."""

    def __init__(self, driver, functions):
        self.__dict__["_functions"] = functions
        self.__dict__["_driver"] = driver

    def __getattr__(self, name):
        try:
            return self.__dict__["_functions"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __repr__(self):
        return f"<fake libnvidia-ml.so.1 ({len(self._functions)} symbols)>"


class _EventSet:
    def __init__(self, handle):
        self.handle = handle
        self.registrations: dict[int, int] = {}  # gpu index -> mask
        self.queue: collections.deque = collections.deque()


class FakeDriver:
    """The fake NVIDIA driver + libnvidia-ml.so.

    Constructor:
      gpus=8, model="H100"|"H200", old_driver=False (r470-like: ``OLD_DRIVER_MISSING`` symbols absent,
      fields >= 161 NOT_SUPPORTED, so PCIe byte counters only via the legacy blocking call),
      clock=time.monotonic (or a ManualClock), pcie_counter_bits=64 (32: PCIE_COUNT_*_BYTES as a wrapping
      uint), nvlink_totals_supported=False (Hopper refuses the NVLink *_TOTAL error fields),
      retired_pages_supported=False (Hopper uses row remapping), field_errors={fid: code} (every GPU),
      refused={index: error} (GPUs that cannot be opened), minor_numbers=[...] (default = index),
      missing_symbols=() (extra symbols to drop), unimplemented="not_supported"|"missing" (binding
      symbols this fake has no model for: answer NOT_SUPPORTED, or be absent), noise=0.0 (relative
      jitter on gauges), idle_pcie_downshift=False (idle GPUs report current gen 1), driver_version,
      pcie_throughput_block_s=0.02, seed=0.

    Reading call counts: ``driver.calls[symbol]`` (all), ``driver.gpus[i].calls[symbol]`` (calls whose
    handle is GPU i or one of its MIG devices), ``driver.field_reads[(gpu_index, field_id)]``,
    ``driver.unimplemented_calls[symbol]``, ``driver.reset_calls()``, ``driver.calls_per_gpu()``.
    """

    def __init__(self, gpus=8, model="H100", old_driver=False, clock=None, pcie_counter_bits=64,
                 nvlink_totals_supported=False, retired_pages_supported=False, field_errors=None,
                 refused=None, minor_numbers=None, missing_symbols=(), unimplemented="not_supported",
                 noise=0.0, idle_pcie_downshift=False, driver_version=None, pcie_throughput_block_s=0.02,
                 seed=0):
        if pcie_counter_bits not in (32, 64):
            raise ValueError("pcie_counter_bits must be 32 or 64")
        if unimplemented not in ("not_supported", "missing"):
            raise ValueError(unimplemented)
        self.lock = threading.RLock()
        self._cond = threading.Condition(self.lock)
        self.clock = clock or time.monotonic
        self._wall0 = time.time()
        self._clock0 = self.clock()
        self.seed = seed
        self.old_driver = old_driver
        self.pcie_counter_bits = pcie_counter_bits
        self.nvlink_totals_supported = nvlink_totals_supported
        self.retired_pages_supported = retired_pages_supported
        self.field_errors = {int(k): error_code(v) for k, v in (field_errors or {}).items()}
        self.noise = noise
        self.idle_pcie_downshift = idle_pcie_downshift
        self.pcie_throughput_block_s = pcie_throughput_block_s
        self.field_max = OLD_DRIVER_FIELD_MAX if old_driver else FI_MAX
        self.driver_version = driver_version or ("470.256.02" if old_driver else "550.127.05")
        self.nvml_version = ("11." if old_driver else "12.") + self.driver_version
        self.cuda_version = 11040 if old_driver else 12040
        self.init_count = 0
        self.process_sample_period_s = 1 / 6
        self.calls: collections.Counter = collections.Counter()
        self.field_reads: collections.Counter = collections.Counter()
        self.unimplemented_calls: collections.Counter = collections.Counter()
        self.internal_errors: list[str] = []
        self._handle_buffers: list = []
        self._devices: dict[int, object] = {}
        self._event_sets: dict[int, _EventSet] = {}
        self._last_xid = 0
        self._strings: dict[int, ctypes.Array] = {}
        minors = list(minor_numbers) if minor_numbers is not None else list(range(gpus))
        self.gpus: list[FakeGpu] = []
        for i in range(gpus):
            bus = _HGX_BUSES[i] if i < len(_HGX_BUSES) else 0xE0 + i
            gpu = FakeGpu(self, i, model, minors[i], bus)
            gpu.handle = self._new_handle(gpu)
            self.gpus.append(gpu)
        for idx, err in (refused or {}).items():
            self.gpus[idx].refuse(err)
        missing = set(missing_symbols) | (set(OLD_DRIVER_MISSING) if old_driver else set())
        self.missing_symbols = frozenset(missing)
        self.lib = _FakeLib(self, self._build_functions(missing, unimplemented))

    # ---- helpers ------------------------------------------------------------------------------
    def _new_handle(self, obj) -> int:
        buf = (ctypes.c_char * 16)()  # real memory: the handle is a valid, unique pointer
        self._handle_buffers.append(buf)
        addr = ctypes.addressof(buf)
        self._devices[addr] = obj
        return addr

    def wall_us(self) -> int:
        """CPU timestamp in microseconds since 1970, moving with the driver's clock."""
        return int((self._wall0 + self.clock() - self._clock0) * 1e6)

    def advance(self, seconds: float) -> None:
        """Advance a ManualClock (convenience)."""
        self.clock.advance(seconds)

    def reset_calls(self) -> None:
        with self.lock:
            self.calls.clear()
            self.field_reads.clear()
            self.unimplemented_calls.clear()
            for g in self.gpus:
                g.calls.clear()

    def calls_per_gpu(self) -> dict[int, int]:
        return {g.index: sum(g.calls.values()) for g in self.gpus}

    def check(self) -> None:
        """Raise if a fake C function itself failed (those calls returned NVML_ERROR_UNKNOWN)."""
        if self.internal_errors:
            raise AssertionError("fake NVML driver raised inside C callbacks:\n" +
                                 "\n".join(self.internal_errors))

    def _deliver(self, gpu, etype, data, mig=None):
        with self.lock:
            if etype == EVENT_XID:
                self._last_xid = data
            gi = ci = UINT_MAX
            if mig is not None:
                gi = gpu.mig_devices[mig].gpu_instance_id
                ci = gpu.mig_devices[mig].compute_instance_id
            for es in self._event_sets.values():
                if es.registrations.get(gpu.index, 0) & etype:
                    es.queue.append((gpu, etype, data, gi, ci))
            self._cond.notify_all()

    def _build_functions(self, missing, unimplemented) -> dict:
        functions = {}
        for attr in dir(type(self)):
            if not attr.startswith("_c_"):
                continue
            method = getattr(self, attr)
            meta = getattr(method, "_csym", None)
            name = attr[3:]
            if meta is None or name in missing:
                continue
            functions[name] = self._cfunc(name, method, meta)
        if unimplemented == "not_supported":
            for name in binding_symbols():
                if name not in functions and name not in missing:
                    functions[name] = self._stub(name)
        return functions

    def _cfunc(self, name, method, meta):
        proto = CFUNCTYPE(meta["restype"], *meta["argtypes"])
        devices, is_device, allow_mig = self._devices, meta["device"], meta["mig"]
        needs_init, take_lock = meta["init"], meta["lock"]
        lock = self.lock

        def entry(*args):
            try:
                with lock:
                    self.calls[name] += 1
                    if needs_init and self.init_count <= 0:
                        return ERROR_UNINITIALIZED
                    if is_device:
                        dev = devices.get(args[0])
                        if dev is None:
                            return ERROR_INVALID_ARGUMENT
                        gpu = dev.gpu if isinstance(dev, FakeMigDevice) else dev
                        gpu.calls[name] += 1
                        if gpu.lost:
                            return ERROR_GPU_IS_LOST
                        if isinstance(dev, FakeMigDevice) and not allow_mig:
                            return ERROR_NOT_SUPPORTED
                        gpu._sync()
                        args = (dev,) + args[1:]
                    if take_lock:
                        return method(*args)
                return method(*args)
            except BaseException:  # a bug in the fake must not look like SUCCESS
                self.internal_errors.append(f"{name}: {traceback.format_exc()}")
                return ERROR_UNKNOWN

        cfn = proto(entry)
        cfn.__name__ = name
        return cfn

    def _stub(self, name):
        def entry():
            with self.lock:
                self.calls[name] += 1
                self.unimplemented_calls[name] += 1
                return ERROR_UNINITIALIZED if self.init_count <= 0 else ERROR_NOT_SUPPORTED
        cfn = CFUNCTYPE(c_int)(entry)
        cfn.__name__ = name
        return cfn

    def _open(self, gpu, out) -> int:
        if gpu.open_error is not None:
            return gpu.open_error
        if gpu.lost:
            return ERROR_GPU_IS_LOST
        return _put(out, c_void_p, gpu.handle)

    # ---- init / system ------------------------------------------------------------------------
    def _init(self):
        self.init_count += 1
        return SUCCESS

    @_csym(device=False, init=False)
    def _c_nvmlInit_v2(self):
        return self._init()

    @_csym(device=False, init=False)
    def _c_nvmlInit(self):
        return self._init()

    @_csym(c_uint, device=False, init=False)
    def _c_nvmlInitWithFlags(self, flags):
        return self._init()

    @_csym(device=False)
    def _c_nvmlShutdown(self):
        self.init_count -= 1
        return SUCCESS

    @_csym(c_int, restype=c_void_p, device=False, init=False)
    def _c_nvmlErrorString(self, result):
        if result not in self._strings:
            text = _ERROR_STRINGS.get(result, f"Unknown Error ({result})")
            self._strings[result] = ctypes.create_string_buffer(text.encode())
        return ctypes.addressof(self._strings[result])

    @_csym(c_void_p, c_uint, device=False)
    def _c_nvmlSystemGetDriverVersion(self, buf, length):
        return _put_str(buf, self.driver_version, length)

    @_csym(c_void_p, c_uint, device=False)
    def _c_nvmlSystemGetNVMLVersion(self, buf, length):
        return _put_str(buf, self.nvml_version, length)

    @_csym(c_void_p, device=False)
    def _c_nvmlSystemGetCudaDriverVersion(self, out):
        return _put(out, c_int, self.cuda_version)

    @_csym(c_void_p, device=False)
    def _c_nvmlSystemGetCudaDriverVersion_v2(self, out):
        return _put(out, c_int, self.cuda_version)

    @_csym(c_void_p, device=False)
    def _c_nvmlDeviceGetCount_v2(self, out):
        return _put(out, c_uint, len(self.gpus))

    @_csym(c_void_p, device=False)
    def _c_nvmlDeviceGetCount(self, out):  # v1: only the devices the caller may open
        return _put(out, c_uint, sum(1 for g in self.gpus if g.open_error is None))

    # ---- handles ------------------------------------------------------------------------------
    @_csym(c_uint, c_void_p, device=False)
    def _c_nvmlDeviceGetHandleByIndex_v2(self, index, out):
        if index >= len(self.gpus) or not out:
            return ERROR_INVALID_ARGUMENT
        return self._open(self.gpus[index], out)

    @_csym(c_uint, c_void_p, device=False)
    def _c_nvmlDeviceGetHandleByIndex(self, index, out):  # v1 enumerates accessible devices only
        accessible = [g for g in self.gpus if g.open_error is None]
        if index >= len(accessible) or not out:
            return ERROR_INVALID_ARGUMENT
        return self._open(accessible[index], out)

    @_csym(c_char_p, c_void_p, device=False)
    def _c_nvmlDeviceGetHandleByUUID(self, uuid, out):
        if not uuid or not out:
            return ERROR_INVALID_ARGUMENT
        text = uuid.decode(errors="replace")
        for g in self.gpus:
            if g.uuid == text:
                return self._open(g, out)
            for mig in g.mig_devices:
                if mig.uuid == text:
                    if g.open_error is not None:
                        return g.open_error
                    if g.lost:
                        return ERROR_GPU_IS_LOST
                    return _put(out, c_void_p, mig.handle)
        return ERROR_NOT_FOUND

    @_csym(c_char_p, c_void_p, device=False)
    def _c_nvmlDeviceGetHandleBySerial(self, serial, out):
        if not serial or not out:
            return ERROR_INVALID_ARGUMENT
        for g in self.gpus:
            if g.serial == serial.decode(errors="replace"):
                return self._open(g, out)
        return ERROR_NOT_FOUND

    def _by_pci(self, bus_id, out):
        if not bus_id or not out:
            return ERROR_INVALID_ARGUMENT
        m = re.fullmatch(r"(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.([0-7]))?",
                         bus_id.decode(errors="replace").strip())
        if not m:
            return ERROR_NOT_FOUND
        domain, bus, dev = int(m.group(1) or "0", 16), int(m.group(2), 16), int(m.group(3), 16)
        for g in self.gpus:
            if domain == 0 and bus == g.pci_bus and dev == 0 and (m.group(4) or "0") == "0":
                return self._open(g, out)
        return ERROR_NOT_FOUND

    @_csym(c_char_p, c_void_p, device=False)
    def _c_nvmlDeviceGetHandleByPciBusId_v2(self, bus_id, out):
        return self._by_pci(bus_id, out)

    @_csym(c_char_p, c_void_p, device=False)
    def _c_nvmlDeviceGetHandleByPciBusId(self, bus_id, out):
        return self._by_pci(bus_id, out)

    # ---- identity -----------------------------------------------------------------------------
    @_csym(c_void_p)
    def _c_nvmlDeviceGetIndex(self, gpu, out):
        return _put(out, c_uint, gpu.index)

    @_csym(c_void_p, c_uint, mig=True)
    def _c_nvmlDeviceGetUUID(self, dev, buf, length):
        return _put_str(buf, dev.uuid, length)

    @_csym(c_void_p, c_uint, mig=True)
    def _c_nvmlDeviceGetName(self, dev, buf, length):
        return _put_str(buf, dev.name, length)

    @_csym(c_void_p, c_uint)
    def _c_nvmlDeviceGetSerial(self, gpu, buf, length):
        return _put_str(buf, gpu.serial, length)

    @_csym(c_void_p)
    def _c_nvmlDeviceGetMinorNumber(self, gpu, out):
        return _put(out, c_uint, gpu.minor)

    @_csym(c_void_p)
    def _c_nvmlDeviceGetPciInfo_v3(self, gpu, out):
        if not out:
            return ERROR_INVALID_ARGUMENT
        info = _PciInfo.from_address(out)
        info.busIdLegacy = f"0000:{gpu.pci_bus:02X}:00.0".encode()
        info.domain, info.bus, info.device = 0, gpu.pci_bus, 0
        info.pciDeviceId = gpu.model["pci_device_id"]
        info.pciSubSystemId = gpu.model["pci_subsystem_id"]
        info.busId = gpu.bus_id.encode()
        return SUCCESS

    @_csym(c_void_p, c_void_p)
    def _c_nvmlDeviceGetCudaComputeCapability(self, gpu, major, minor):
        if _put(major, c_int, 9) or _put(minor, c_int, 0):
            return ERROR_INVALID_ARGUMENT
        return SUCCESS

    @_csym(c_void_p)
    def _c_nvmlDeviceGetArchitecture(self, gpu, out):
        return _put(out, c_uint, 9)  # NVML_DEVICE_ARCH_HOPPER

    @_csym(c_void_p)
    def _c_nvmlDeviceGetNumGpuCores(self, gpu, out):
        return _put(out, c_uint, gpu.model["cores"])

    @_csym(c_void_p)
    def _c_nvmlDeviceGetPersistenceMode(self, gpu, out):
        return _put(out, c_int, 1)

    # ---- utilisation, memory, temperature, clocks -----------------------------------------------
    @_csym(c_void_p)
    def _c_nvmlDeviceGetUtilizationRates(self, gpu, out):
        if gpu.mig_enabled:
            return ERROR_NOT_SUPPORTED  # not available on a GPU in MIG mode
        if not out:
            return ERROR_INVALID_ARGUMENT
        util = _Utilization.from_address(out)
        util.gpu = min(100, int(gpu.sm_util() * gpu._noise(1)))
        util.memory = min(100, int(gpu.mem_util() * gpu._noise(2)))
        return SUCCESS

    def _memory_of(self, dev):
        if isinstance(dev, FakeMigDevice):
            used = sum(p.mem_bytes or 0 for p in dev.gpu.processes.values() if p.mig == dev.index)
            reserved = 0
            return dev.mem_bytes, reserved, min(used, dev.mem_bytes), dev.mem_bytes - min(used, dev.mem_bytes)
        return dev.memory()

    @_csym(c_void_p, mig=True)
    def _c_nvmlDeviceGetMemoryInfo(self, dev, out):
        if not out:
            return ERROR_INVALID_ARGUMENT
        total, reserved, used, free = self._memory_of(dev)
        mem = _Memory.from_address(out)
        mem.total, mem.used, mem.free = total, used + reserved, free  # v1: reserved counts as used
        return SUCCESS

    @_csym(c_void_p, mig=True)
    def _c_nvmlDeviceGetMemoryInfo_v2(self, dev, out):
        if not out:
            return ERROR_INVALID_ARGUMENT
        mem = _MemoryV2.from_address(out)
        if mem.version != MEMORY_V2_VERSION:
            return ERROR_ARGUMENT_VERSION_MISMATCH
        mem.total, mem.reserved, mem.used, mem.free = self._memory_of(dev)
        return SUCCESS

    @_csym(c_uint, c_void_p)
    def _c_nvmlDeviceGetTemperature(self, gpu, sensor, out):
        if sensor != 0:
            return ERROR_INVALID_ARGUMENT
        return _put(out, c_uint, int(gpu.temperature() * gpu._noise(3)))

    @_csym(c_void_p)
    def _c_nvmlDeviceGetTemperatureV(self, gpu, out):
        if not out:
            return ERROR_INVALID_ARGUMENT
        t = _TemperatureV1.from_address(out)
        if t.version != TEMPERATURE_V1_VERSION:
            return ERROR_ARGUMENT_VERSION_MISMATCH
        if t.sensorType != 0:
            return ERROR_INVALID_ARGUMENT
        t.temperature = gpu.temperature()
        return SUCCESS

    @_csym(c_uint, c_void_p)
    def _c_nvmlDeviceGetTemperatureThreshold(self, gpu, which, out):
        table = {0: 92, 1: 89, 2: 95, 3: 87}  # shutdown, slowdown, mem max, gpu max
        if which not in table:
            return ERROR_NOT_SUPPORTED
        return _put(out, c_uint, table[which])

    def _clock(self, gpu, ctype, maximum):
        m = gpu.model
        if ctype in (0, 1):
            return m["max_sm"] if maximum else int(gpu.sm_clock() * min(1.0, gpu._noise(4)))
        if ctype == 2:
            return m["mem_clock"]
        if ctype == 3:
            return m["max_video"] if maximum or gpu.busy_now else m["idle_video"]
        return None

    @_csym(c_uint, c_void_p)
    def _c_nvmlDeviceGetClockInfo(self, gpu, ctype, out):
        value = self._clock(gpu, ctype, False)
        return ERROR_INVALID_ARGUMENT if value is None else _put(out, c_uint, value)

    @_csym(c_uint, c_void_p)
    def _c_nvmlDeviceGetMaxClockInfo(self, gpu, ctype, out):
        value = self._clock(gpu, ctype, True)
        return ERROR_INVALID_ARGUMENT if value is None else _put(out, c_uint, value)

    @_csym(c_uint, c_uint, c_void_p)
    def _c_nvmlDeviceGetClock(self, gpu, ctype, clock_id, out):
        if clock_id > 3:
            return ERROR_INVALID_ARGUMENT
        value = self._clock(gpu, ctype, clock_id != 0)
        return ERROR_INVALID_ARGUMENT if value is None else _put(out, c_uint, value)

    @_csym(c_void_p)
    def _c_nvmlDeviceGetCurrentClocksEventReasons(self, gpu, out):
        return _put(out, c_ulonglong, gpu.reasons())

    @_csym(c_void_p)
    def _c_nvmlDeviceGetCurrentClocksThrottleReasons(self, gpu, out):
        return _put(out, c_ulonglong, gpu.reasons())

    @_csym(c_void_p)
    def _c_nvmlDeviceGetSupportedClocksEventReasons(self, gpu, out):
        return _put(out, c_ulonglong, REASONS_SUPPORTED)

    @_csym(c_void_p)
    def _c_nvmlDeviceGetSupportedClocksThrottleReasons(self, gpu, out):
        return _put(out, c_ulonglong, REASONS_SUPPORTED)

    @_csym(c_void_p)
    def _c_nvmlDeviceGetPerformanceState(self, gpu, out):
        return _put(out, c_uint, 0)  # P0 (HGX parts stay in P0 with persistence mode)

    @_csym(c_uint, c_void_p)
    def _c_nvmlDeviceGetViolationStatus(self, gpu, policy, out):
        if policy not in _POLICIES or not out:
            return ERROR_INVALID_ARGUMENT
        v = _ViolationTime.from_address(out)
        v.referenceTime = self.wall_us()          # CPU timestamp, us
        v.violationTime = int(gpu.violation_ns[policy])  # ns
        return SUCCESS

    # ---- power / energy -----------------------------------------------------------------------
    @_csym(c_void_p)
    def _c_nvmlDeviceGetPowerUsage(self, gpu, out):
        return _put(out, c_uint, int(min(gpu._rates[0] * gpu._noise(5), gpu.model["power_limit_mw"] * 1.02)))

    @_csym(c_void_p)
    def _c_nvmlDeviceGetEnforcedPowerLimit(self, gpu, out):
        return _put(out, c_uint, gpu.model["power_limit_mw"])

    @_csym(c_void_p)
    def _c_nvmlDeviceGetPowerManagementLimit(self, gpu, out):
        return _put(out, c_uint, gpu.model["power_limit_mw"])

    @_csym(c_void_p)
    def _c_nvmlDeviceGetPowerManagementDefaultLimit(self, gpu, out):
        return _put(out, c_uint, gpu.model["power_limit_mw"])

    @_csym(c_void_p)
    def _c_nvmlDeviceGetTotalEnergyConsumption(self, gpu, out):
        return _put(out, c_ulonglong, int(gpu.energy_mj))

    # ---- PCIe ---------------------------------------------------------------------------------
    @_csym(c_void_p)
    def _c_nvmlDeviceGetCurrPcieLinkGeneration(self, gpu, out):
        return _put(out, c_uint, gpu.link()[0])

    @_csym(c_void_p)
    def _c_nvmlDeviceGetCurrPcieLinkWidth(self, gpu, out):
        return _put(out, c_uint, gpu.link()[1])

    @_csym(c_void_p)
    def _c_nvmlDeviceGetMaxPcieLinkGeneration(self, gpu, out):
        return _put(out, c_uint, gpu.max_link[0])

    @_csym(c_void_p)
    def _c_nvmlDeviceGetMaxPcieLinkWidth(self, gpu, out):
        return _put(out, c_uint, gpu.max_link[1])

    @_csym(c_void_p)
    def _c_nvmlDeviceGetGpuMaxPcieLinkGeneration(self, gpu, out):
        return _put(out, c_uint, gpu.gpu_max_link_gen)

    @_csym(c_void_p)
    def _c_nvmlDeviceGetPcieSpeed(self, gpu, out):
        return _put(out, c_uint, _PCIE_GEN_SPEED_MBPS[gpu.link()[0]])

    @_csym(c_void_p)
    def _c_nvmlDeviceGetPcieReplayCounter(self, gpu, out):
        return _put(out, c_uint, int(gpu.replays) & UINT_MAX)

    @_csym(c_uint, c_void_p, lock=False)
    def _c_nvmlDeviceGetPcieThroughput(self, gpu, counter, out):
        """Legacy call: the driver samples for ~20 ms and blocks the caller meanwhile; KB/s."""
        if counter not in (0, 1) or not out:
            return ERROR_INVALID_ARGUMENT
        time.sleep(self.pcie_throughput_block_s)
        with self.lock:
            if gpu.lost:
                return ERROR_GPU_IS_LOST
            rate = gpu._pcie_rates()[counter]
            return _put(out, c_uint, int(rate / 1024))

    # ---- ECC / row remapping / retired pages ------------------------------------------------------
    @_csym(c_void_p, c_void_p)
    def _c_nvmlDeviceGetEccMode(self, gpu, current, pending):
        if _put(current, c_int, 1) or _put(pending, c_int, 1):
            return ERROR_INVALID_ARGUMENT
        return SUCCESS

    @_csym(c_uint, c_uint, c_void_p)
    def _c_nvmlDeviceGetTotalEccErrors(self, gpu, error_type, counter_type, out):
        if error_type not in (0, 1) or counter_type not in (0, 1):
            return ERROR_INVALID_ARGUMENT
        key = ("sbe" if error_type == 0 else "dbe") + ("_vol" if counter_type == 0 else "_agg")
        return _put(out, c_ulonglong, gpu.ecc[key])

    @_csym(c_void_p, c_void_p, c_void_p, c_void_p)
    def _c_nvmlDeviceGetRemappedRows(self, gpu, cor, unc, pending, failure):
        r = gpu.remapped
        for addr, value in ((cor, r["cor"]), (unc, r["unc"]), (pending, r["pending"]), (failure, r["failure"])):
            if _put(addr, c_uint, value):
                return ERROR_INVALID_ARGUMENT
        return SUCCESS

    @_csym(c_void_p)
    def _c_nvmlDeviceGetRetiredPagesPendingStatus(self, gpu, out):
        if not self.retired_pages_supported:
            return ERROR_NOT_SUPPORTED
        return _put(out, c_int, gpu.retired["pending"])

    @_csym(c_uint, c_void_p, c_void_p)
    def _c_nvmlDeviceGetRetiredPages(self, gpu, cause, count, addresses):
        if not self.retired_pages_supported:
            return ERROR_NOT_SUPPORTED
        if cause not in (0, 1) or not count:
            return ERROR_INVALID_ARGUMENT
        n = gpu.retired["sbe" if cause == 0 else "dbe"]
        have = c_uint.from_address(count).value
        c_uint.from_address(count).value = n
        if have < n:
            return ERROR_INSUFFICIENT_SIZE
        for i in range(n):
            c_ulonglong.from_address(addresses + 8 * i).value = 0x1000 * (i + 1)
        return SUCCESS

    # ---- NVLink -------------------------------------------------------------------------------
    @_csym(c_uint, c_void_p)
    def _c_nvmlDeviceGetNvLinkState(self, gpu, link, out):
        if link >= NVLINK_LINKS:
            return ERROR_INVALID_ARGUMENT
        return _put(out, c_int, int(gpu.nvlink_active[link]))

    @_csym(c_uint, c_uint, c_void_p)
    def _c_nvmlDeviceGetNvLinkErrorCounter(self, gpu, link, counter, out):
        if link >= NVLINK_LINKS or counter not in _NVLINK_ERROR_COUNTERS:
            return ERROR_INVALID_ARGUMENT
        return _put(out, c_ulonglong, gpu.nvlink_errors[_NVLINK_ERROR_COUNTERS[counter]][link])

    # ---- field values -------------------------------------------------------------------------
    @_csym(c_int, c_void_p, mig=True)
    def _c_nvmlDeviceGetFieldValues(self, dev, count, values):
        """Per-field nvmlReturn; the call as a whole fails only for a bad handle/arguments or a
        lost GPU (checked before we get here)."""
        if count <= 0 or not values:
            return ERROR_INVALID_ARGUMENT
        mig = isinstance(dev, FakeMigDevice)
        gpu = dev.gpu if mig else dev
        size = sizeof(_FieldValue)
        mem = memoryview((ctypes.c_char * (size * count)).from_address(values)).cast("B")
        ts = self.wall_us()
        reads, index = self.field_reads, gpu.index
        gpu_errors, drv_errors = gpu.field_errors, self.field_errors
        handlers, field_max = _FIELD_HANDLERS, self.field_max
        unpack_ids, pack_head, pack_ret = _FV_IDS.unpack_from, _FV_HEAD.pack_into, _FV_RET.pack_into
        for off in range(0, size * count, size):
            fid, scope = unpack_ids(mem, off)
            reads[(index, fid)] += 1
            err = gpu_errors.get(fid, drv_errors.get(fid))
            if err is None:
                handler = handlers.get(fid)
                if mig or handler is None or fid >= field_max:
                    err = ERROR_NOT_SUPPORTED
                else:
                    err, vtype, value = handler(self, gpu, scope)
            if err != SUCCESS:
                pack_head(mem, off + _FV_TS, ts, 0)
                pack_ret(mem, off + _FV_RETURN, err)
                continue
            pack_head(mem, off + _FV_TS, ts, 0)
            _FV_TYPED.pack_into(mem, off + _FV_VTYPE, vtype, SUCCESS)
            _FV_VALUE[vtype].pack_into(mem, off + _FV_VALUE_OFF, value)
        return SUCCESS

    # ---- MIG ----------------------------------------------------------------------------------
    @_csym(c_void_p, c_void_p)
    def _c_nvmlDeviceGetMigMode(self, gpu, current, pending):
        mode = int(gpu.mig_enabled)
        if _put(current, c_uint, mode) or _put(pending, c_uint, mode):
            return ERROR_INVALID_ARGUMENT
        return SUCCESS

    @_csym(c_void_p)
    def _c_nvmlDeviceGetMaxMigDeviceCount(self, gpu, out):
        return _put(out, c_uint, MAX_MIG_DEVICES)

    @_csym(c_uint, c_void_p)
    def _c_nvmlDeviceGetMigDeviceHandleByIndex(self, gpu, index, out):
        if index >= MAX_MIG_DEVICES or not out:
            return ERROR_INVALID_ARGUMENT
        if not gpu.mig_enabled or index >= len(gpu.mig_devices):
            return ERROR_NOT_FOUND
        return _put(out, c_void_p, gpu.mig_devices[index].handle)

    @_csym(c_void_p, mig=True)
    def _c_nvmlDeviceIsMigDeviceHandle(self, dev, out):
        return _put(out, c_uint, int(isinstance(dev, FakeMigDevice)))

    @_csym(c_void_p, mig=True)
    def _c_nvmlDeviceGetGpuInstanceId(self, dev, out):
        if not isinstance(dev, FakeMigDevice):
            return ERROR_INVALID_ARGUMENT
        return _put(out, c_uint, dev.gpu_instance_id)

    @_csym(c_void_p, mig=True)
    def _c_nvmlDeviceGetComputeInstanceId(self, dev, out):
        if not isinstance(dev, FakeMigDevice):
            return ERROR_INVALID_ARGUMENT
        return _put(out, c_uint, dev.compute_instance_id)

    @_csym(c_void_p, mig=True)
    def _c_nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, dev, out):
        if not isinstance(dev, FakeMigDevice):
            return ERROR_INVALID_ARGUMENT
        return _put(out, c_void_p, dev.gpu.handle)

    # ---- processes ----------------------------------------------------------------------------
    def _processes(self, dev, kind, struct):
        gpu = dev.gpu if isinstance(dev, FakeMigDevice) else dev
        procs = [p for p in gpu.processes.values() if p.kind == kind]
        if isinstance(dev, FakeMigDevice):
            procs = [p for p in procs if p.mig == dev.index]
        return gpu, sorted(procs, key=lambda p: p.pid)

    def _process_list(self, dev, count, infos, kind, struct):
        """NVML's two-call protocol: *infoCount too small (e.g. 0 with infos NULL) ->
        INSUFFICIENT_SIZE with *infoCount set to the number needed; no processes -> SUCCESS, 0."""
        if not count:
            return ERROR_INVALID_ARGUMENT
        gpu, procs = self._processes(dev, kind, struct)
        have = c_uint.from_address(count).value
        c_uint.from_address(count).value = len(procs)
        if not procs:
            return SUCCESS
        if have < len(procs) or not infos:
            return ERROR_INSUFFICIENT_SIZE
        arr = (struct * len(procs)).from_address(infos)
        for slot, p in zip(arr, procs):
            slot.pid = p.pid
            slot.usedGpuMemory = ULL_NOT_AVAILABLE if p.mem_bytes is None else p.mem_bytes
            if struct is _ProcessInfoV2:
                if p.mig is not None and gpu.mig_enabled:
                    slot.gpuInstanceId = gpu.mig_devices[p.mig].gpu_instance_id
                    slot.computeInstanceId = gpu.mig_devices[p.mig].compute_instance_id
                else:
                    slot.gpuInstanceId = slot.computeInstanceId = UINT_MAX
        return SUCCESS

    @_csym(c_void_p, c_void_p, mig=True)
    def _c_nvmlDeviceGetComputeRunningProcesses_v3(self, dev, count, infos):
        return self._process_list(dev, count, infos, "compute", _ProcessInfoV2)

    @_csym(c_void_p, c_void_p, mig=True)
    def _c_nvmlDeviceGetComputeRunningProcesses_v2(self, dev, count, infos):
        return self._process_list(dev, count, infos, "compute", _ProcessInfoV2)

    @_csym(c_void_p, c_void_p, mig=True)
    def _c_nvmlDeviceGetComputeRunningProcesses(self, dev, count, infos):
        return self._process_list(dev, count, infos, "compute", _ProcessInfoV1)

    @_csym(c_void_p, c_void_p, mig=True)
    def _c_nvmlDeviceGetGraphicsRunningProcesses_v3(self, dev, count, infos):
        return self._process_list(dev, count, infos, "graphics", _ProcessInfoV2)

    @_csym(c_void_p, c_void_p, mig=True)
    def _c_nvmlDeviceGetGraphicsRunningProcesses_v2(self, dev, count, infos):
        return self._process_list(dev, count, infos, "graphics", _ProcessInfoV2)

    @_csym(c_void_p, c_void_p, mig=True)
    def _c_nvmlDeviceGetGraphicsRunningProcesses(self, dev, count, infos):
        return self._process_list(dev, count, infos, "graphics", _ProcessInfoV1)

    @_csym(c_void_p, c_void_p, mig=True)
    def _c_nvmlDeviceGetMPSComputeRunningProcesses_v3(self, dev, count, infos):
        return self._process_list(dev, count, infos, "mps", _ProcessInfoV2)

    @_csym(c_void_p, c_void_p, mig=True)
    def _c_nvmlDeviceGetMPSComputeRunningProcesses_v2(self, dev, count, infos):
        return self._process_list(dev, count, infos, "mps", _ProcessInfoV2)

    def _util_samples(self, gpu, last_seen):
        """One sample per process at the driver's latest sampling tick (us), if newer than last_seen."""
        period = self.process_sample_period_s
        elapsed = self.clock() - self._clock0
        tick = int((self._wall0 + (elapsed // period) * period) * 1e6)
        if tick <= last_seen:
            return tick, []
        return tick, sorted(gpu.processes.values(), key=lambda p: p.pid)

    @_csym(c_void_p, c_void_p, c_ulonglong)
    def _c_nvmlDeviceGetProcessUtilization(self, gpu, samples, count, last_seen):
        if not count:
            return ERROR_INVALID_ARGUMENT
        if gpu.mig_enabled:
            return ERROR_NOT_SUPPORTED
        tick, procs = self._util_samples(gpu, last_seen)
        if not samples:  # size query: number of processes running
            if not gpu.processes:
                return ERROR_NOT_FOUND
            c_uint.from_address(count).value = len(gpu.processes)
            return ERROR_INSUFFICIENT_SIZE
        if not procs:
            c_uint.from_address(count).value = 0
            return ERROR_NOT_FOUND
        have = c_uint.from_address(count).value
        c_uint.from_address(count).value = len(procs)
        if have < len(procs):
            return ERROR_INSUFFICIENT_SIZE
        arr = (_ProcessUtilizationSample * len(procs)).from_address(samples)
        for slot, p in zip(arr, procs):
            slot.pid, slot.timeStamp, slot.smUtil, slot.memUtil = p.pid, tick, p.sm_util, p.mem_util
            slot.encUtil = slot.decUtil = 0
        return SUCCESS

    @_csym(c_void_p)
    def _c_nvmlDeviceGetProcessesUtilizationInfo(self, gpu, info_addr):
        if not info_addr:
            return ERROR_INVALID_ARGUMENT
        info = _ProcessesUtilizationInfoV1.from_address(info_addr)
        if info.version != PROCESSES_UTILIZATION_V1_VERSION:
            return ERROR_ARGUMENT_VERSION_MISMATCH
        if gpu.mig_enabled:
            return ERROR_NOT_SUPPORTED
        tick, procs = self._util_samples(gpu, info.lastSeenTimeStamp)
        if not procs:
            info.processSamplesCount = 0
            return ERROR_NOT_FOUND
        have = info.processSamplesCount
        info.processSamplesCount = len(procs)
        if have < len(procs) or not info.procUtilArray:
            return ERROR_INSUFFICIENT_SIZE
        arr = (_ProcessUtilizationInfoV1 * len(procs)).from_address(info.procUtilArray)
        for slot, p in zip(arr, procs):
            slot.timeStamp, slot.pid, slot.smUtil, slot.memUtil = tick, p.pid, p.sm_util, p.mem_util
        info.lastSeenTimeStamp = tick
        return SUCCESS

    # ---- events -------------------------------------------------------------------------------
    @_csym(c_void_p, device=False)
    def _c_nvmlEventSetCreate(self, out):
        if not out:
            return ERROR_INVALID_ARGUMENT
        handle = self._new_handle(None)
        self._devices.pop(handle)
        self._event_sets[handle] = _EventSet(handle)
        return _put(out, c_void_p, handle)

    @_csym(c_void_p)
    def _c_nvmlDeviceGetSupportedEventTypes(self, gpu, out):
        return _put(out, c_ulonglong, EVENTS_SUPPORTED)

    @_csym(c_ulonglong, c_void_p)
    def _c_nvmlDeviceRegisterEvents(self, gpu, types, event_set):
        es = self._event_sets.get(event_set)
        if es is None:
            return ERROR_INVALID_ARGUMENT
        if types & ~EVENTS_SUPPORTED:
            return ERROR_NOT_SUPPORTED
        es.registrations[gpu.index] = es.registrations.get(gpu.index, 0) | types
        return SUCCESS

    def _wait(self, event_set, data, timeout_ms, struct):
        with self.lock:
            es = self._event_sets.get(event_set)
            if es is None or not data:
                return ERROR_INVALID_ARGUMENT
            deadline = time.monotonic() + timeout_ms / 1000.0
            while True:
                if es.queue:
                    gpu, etype, value, gi, ci = es.queue.popleft()
                    ev = struct.from_address(data)
                    ev.device = gpu.handle
                    ev.eventType = etype
                    # nvml.h: an Xid event reports the most recent Xid the system has seen
                    ev.eventData = self._last_xid if etype == EVENT_XID else value
                    if struct is _EventData:
                        ev.gpuInstanceId, ev.computeInstanceId = gi, ci
                    return SUCCESS
                if any(self.gpus[i].lost for i in es.registrations):
                    return ERROR_GPU_IS_LOST
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return ERROR_TIMEOUT
                self._cond.wait(remaining)

    @_csym(c_void_p, c_void_p, c_uint, device=False, lock=False)
    def _c_nvmlEventSetWait_v2(self, event_set, data, timeout_ms):
        return self._wait(event_set, data, timeout_ms, _EventData)

    @_csym(c_void_p, c_void_p, c_uint, device=False, lock=False)
    def _c_nvmlEventSetWait(self, event_set, data, timeout_ms):
        return self._wait(event_set, data, timeout_ms, _EventDataV1)

    @_csym(c_void_p, device=False)
    def _c_nvmlEventSetFree(self, event_set):
        if self._event_sets.pop(event_set, None) is None:
            return ERROR_INVALID_ARGUMENT
        return SUCCESS


# --------------------------------------------------------------------------------------------------
# field handlers: fid -> f(driver, gpu, scopeId) -> (nvmlReturn, valueType, value)
# --------------------------------------------------------------------------------------------------
_U, _L = VALUE_TYPE_UINT, VALUE_TYPE_ULL
_NOT_SUPPORTED = (ERROR_NOT_SUPPORTED, 0, 0)
_INVALID = (ERROR_INVALID_ARGUMENT, 0, 0)


def _fh_const(value, vtype=VALUE_TYPE_UINT):
    return lambda drv, gpu, scope: (SUCCESS, vtype, value)


def _fh_ecc(key):
    return lambda drv, gpu, scope: (SUCCESS, _L, gpu.ecc[key])


def _fh_retired(key):
    def handler(drv, gpu, scope):
        if not drv.retired_pages_supported:
            return _NOT_SUPPORTED
        return SUCCESS, _U, gpu.retired[key]
    return handler


def _fh_nvlink_lane(kind, link):
    return lambda drv, gpu, scope: (SUCCESS, _L, gpu.nvlink_errors[kind][link])


def _fh_nvlink_total(kind):
    def handler(drv, gpu, scope):
        if not drv.nvlink_totals_supported:
            return _NOT_SUPPORTED
        return SUCCESS, _L, sum(gpu.nvlink_errors[kind])
    return handler


def _fh_policy(key):
    return lambda drv, gpu, scope: (SUCCESS, _L, int(gpu.violation_ns[key]))


def _fh_nvlink_throughput(fid):
    tx = fid in (FI_NVLINK_THROUGHPUT_DATA_TX, FI_NVLINK_THROUGHPUT_RAW_TX)
    overhead = 1.0 if fid in (FI_NVLINK_THROUGHPUT_DATA_TX, FI_NVLINK_THROUGHPUT_DATA_RX) else 1.06

    def handler(drv, gpu, scope):  # nvml.h: scopeId = link; UINT_MAX = summed over all links
        per_link = gpu._nvl_tx if tx else gpu._nvl_rx
        pending = gpu._nvl_pending_tx if tx else gpu._nvl_pending_rx
        if scope == UINT_MAX:
            return SUCCESS, _L, int((sum(per_link) + pending * sum(gpu.nvlink_active)) * overhead)
        if scope >= NVLINK_LINKS:
            return _INVALID
        return SUCCESS, _L, int((per_link[scope] + (pending if gpu.nvlink_active[scope] else 0.0)) * overhead)
    return handler


def _fh_dl_error(kind):
    def handler(drv, gpu, scope):
        if scope >= NVLINK_LINKS:
            return _INVALID
        return SUCCESS, _L, gpu.nvlink_errors[kind][scope]
    return handler


def _fh_nvlink_state(drv, gpu, scope):
    if scope >= NVLINK_LINKS:
        return _INVALID
    return SUCCESS, _U, int(gpu.nvlink_active[scope])


def _fh_power(fid):
    def handler(drv, gpu, scope):
        if scope != 0:  # NVML_POWER_SCOPE_GPU only (no module/memory power on HGX)
            return _NOT_SUPPORTED
        m = gpu.model
        if fid == FI_POWER_AVERAGE:
            return SUCCESS, _U, int(gpu._rates[0])
        if fid == FI_POWER_INSTANT:
            return SUCCESS, _U, int(min(gpu._rates[0] * gpu._noise(6), m["power_limit_mw"] * 1.02))
        if fid == FI_POWER_MIN_LIMIT:
            return SUCCESS, _U, m["min_limit_mw"]
        return SUCCESS, _U, m["power_limit_mw"]
    return handler


def _fh_pcie_bytes(tx):
    def handler(drv, gpu, scope):  # nvml.h: "Value can be wrapped"
        total = int(gpu.pcie_tx_bytes if tx else gpu.pcie_rx_bytes)
        if gpu.pcie_counter_bits == 32:
            return SUCCESS, _U, total & UINT_MAX
        return SUCCESS, _L, total
    return handler


_FIELD_HANDLERS: dict = {
    FI_ECC_CURRENT: _fh_const(1), FI_ECC_PENDING: _fh_const(1),
    FI_MEMORY_TEMP: lambda drv, gpu, scope: (SUCCESS, _U, gpu.memory_temperature()),
    FI_TOTAL_ENERGY_CONSUMPTION: lambda drv, gpu, scope: (SUCCESS, _L, int(gpu.energy_mj)),
    FI_ENERGY: lambda drv, gpu, scope: (SUCCESS, _L, int(gpu.energy_mj)),
    FI_NVLINK_LINK_COUNT: _fh_const(NVLINK_LINKS),
    FI_PCIE_REPLAY_COUNTER: lambda drv, gpu, scope: (SUCCESS, _U, int(gpu.replays) & UINT_MAX),
    FI_PCIE_REPLAY_ROLLOVER_COUNTER: lambda drv, gpu, scope: (SUCCESS, _U, int(gpu.replays) >> 32),
    FI_NVLINK_GET_STATE: _fh_nvlink_state,
    FI_PCIE_COUNT_TX_BYTES: _fh_pcie_bytes(True), FI_PCIE_COUNT_RX_BYTES: _fh_pcie_bytes(False),
}
_FIELD_HANDLERS.update({fid: _fh_ecc(key) for fid, key in _ECC_FIELDS.items()})
_FIELD_HANDLERS.update({fid: _fh_retired(key) for fid, key in _RETIRED_FIELDS.items()})
_FIELD_HANDLERS.update({fid: _fh_nvlink_lane(*kl) for fid, kl in _NVLINK_LINK_FIELDS.items()})
_FIELD_HANDLERS.update({fid: _fh_nvlink_total(kind) for fid, kind in FI_NVLINK_TOTALS.items()})
_FIELD_HANDLERS.update({fid: _fh_policy(key) for fid, key in _PERF_POLICY_FIELDS.items()})
_FIELD_HANDLERS.update({fid: _fh_nvlink_throughput(fid) for fid in range(138, 142)})
_FIELD_HANDLERS.update({fid: (lambda key: lambda drv, gpu, scope: (SUCCESS, _U, gpu.remapped[key]))(key)
                        for fid, key in _REMAPPED_FIELDS.items()})
_FIELD_HANDLERS.update({fid: _fh_dl_error(kind) for fid, kind in _DL_ERROR_FIELDS.items()})
_FIELD_HANDLERS.update({fid: _fh_power(fid) for fid in range(FI_POWER_AVERAGE, FI_POWER_CURRENT_LIMIT + 1)})
SUPPORTED_FIELDS = frozenset(_FIELD_HANDLERS)


# --------------------------------------------------------------------------------------------------
# installing under the real binding
# --------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def install_fake_nvml(driver: FakeDriver | None = None):
    """Put ``driver``'s library under the real ``pynvml`` and restore the binding afterwards
    (``nvmlLib``, the function-pointer cache, the init refcount).  Yields the driver."""
    import pynvml
    driver = driver or FakeDriver()
    with pynvml.libLoadLock:
        saved = (pynvml.nvmlLib, dict(pynvml._nvmlGetFunctionPointer_cache), pynvml._nvmlLib_refcount)
        pynvml.nvmlLib = driver.lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlLib_refcount = 0
    try:
        yield driver
    finally:
        with pynvml.libLoadLock:
            pynvml.nvmlLib = saved[0]
            pynvml._nvmlGetFunctionPointer_cache.clear()
            pynvml._nvmlGetFunctionPointer_cache.update(saved[1])
            pynvml._nvmlLib_refcount = saved[2]


@pytest.fixture
def fake_nvml_driver(request):
    """A :class:`FakeDriver` installed under the real ``pynvml`` (not yet ``nvmlInit``-ed).
    Constructor arguments through indirect parametrisation:
    ``@pytest.mark.parametrize("fake_nvml_driver", [dict(old_driver=True)], indirect=True)``.
    Fails the test at teardown if a fake C function raised."""
    pytest.importorskip("pynvml")
    kwargs = getattr(request, "param", None) or {}
    driver = FakeDriver(**kwargs)
    with install_fake_nvml(driver):
        yield driver
    driver.check()
