"""NVML probe.  There is no GPU on CI, so a THIN fake ``pynvml`` stands in for the driver: it
keeps the real binding's field-value structures (so the value-type mapping is the real one) and
answers like two different GPUs would."""
import ctypes.util
import math
import sys
import types

import pynvml as real
import pytest

from reveal_plugins.telemetry.nvml import NvmlProbe

NOT_SUPPORTED = real.NVML_ERROR_NOT_SUPPORTED


class FakeNvml(types.ModuleType):
    """GPU 0: a modern GPU answering batched field values (some NOT_SUPPORTED).
    GPU 1: an old driver/GPU without field values (the probe must use the per-call fallbacks)."""

    def __init__(self):
        super().__init__("pynvml")
        for k in dir(real):
            if k.startswith(("NVML_", "nvmlEventType", "c_nvml")):
                setattr(self, k, getattr(real, k))
        self.NVMLError = real.NVMLError
        self.field_calls = 0
        self.events = []
        self.throttle = [0x4 | 0x40, 0x0]
        self.shutdown = 0

    def _err(self, code):
        return real.NVMLError(code)

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        self.shutdown += 1

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("gpu", i)

    def nvmlDeviceGetIndex(self, h):
        return h[1]

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=97 - h[1], memory=40)

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(used=30 << 30, total=80 << 30, free=50 << 30)

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == real.NVML_TEMPERATURE_GPU
        return 71

    def nvmlDeviceGetClockInfo(self, h, c):
        return {real.NVML_CLOCK_SM: 1410, real.NVML_CLOCK_MEM: 1593}[c]

    def nvmlDeviceGetMaxClockInfo(self, h, c):
        return {real.NVML_CLOCK_SM: 1980, real.NVML_CLOCK_MEM: 2619}[c]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return self.throttle[h[1]]

    def nvmlDeviceGetFieldValues(self, h, ids):
        if h[1] == 1:
            raise self._err(NOT_SUPPORTED)
        self.field_calls += 1
        vals = (real.c_nvmlFieldValue_t * len(ids))()
        table = {
            real.NVML_FI_DEV_POWER_INSTANT: (1, "uiVal", 250_000),        # mW
            real.NVML_FI_DEV_POWER_CURRENT_LIMIT: (1, "uiVal", 700_000),
            real.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: (3, "ullVal", 5_000_000),  # mJ
            real.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: (3, "ullVal", 1 << 40),
            real.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: (3, "ullVal", 1 << 41),
            real.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (3, "ullVal", 3),
            real.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (3, "ullVal", 0),
            real.NVML_FI_DEV_REMAPPED_COR: (1, "uiVal", 2),
            real.NVML_FI_DEV_MEMORY_TEMP: (0, "dVal", 65.5),
        }
        for k, fid in enumerate(ids):
            vals[k].fieldId = fid
            if fid in table:
                vt, attr, v = table[fid]
                vals[k].valueType = vt
                setattr(vals[k].value, attr, v)
                vals[k].nvmlReturn = 0
            else:
                vals[k].nvmlReturn = NOT_SUPPORTED
        return vals

    def nvmlDeviceGetPowerUsage(self, h):
        return 123_000

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        return 300_000

    def nvmlDeviceGetTotalEccErrors(self, h, t, c):
        raise self._err(NOT_SUPPORTED)

    def nvmlDeviceGetRemappedRows(self, h):
        raise self._err(NOT_SUPPORTED)

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        return 1000  # KB/s

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return 4 if h[1] == 0 else 3

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return 16 if h[1] == 0 else 8

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return 5

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return 16

    def nvmlEventSetCreate(self):
        return "evset"

    def nvmlDeviceRegisterEvents(self, h, types_, s):
        assert types_ & real.nvmlEventTypeXidCriticalError

    def nvmlEventSetWait(self, s, timeout_ms):
        assert timeout_ms == 0, "XID polling must never block the sampling tick"
        if self.events:
            return self.events.pop(0)
        raise self._err(real.NVML_ERROR_TIMEOUT)

    def nvmlEventSetFree(self, s):
        pass


@pytest.fixture
def fake_nvml(monkeypatch):
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def _values(p):
    return dict(zip([c.name for c in p.channels], p.sample()))


def test_channels_units_and_batched_fields(fake_nvml):
    p = NvmlProbe()
    p.open()
    assert p.available, p.reason
    meta = {c.name: c for c in p.channels}
    before = fake_nvml.field_calls
    v = _values(p)
    # one batched field query per supported GPU per sample
    assert fake_nvml.field_calls == before + 1
    assert v["gpu.0.power"] == pytest.approx(250.0) and meta["gpu.0.power"].unit == "W"
    assert v["gpu.0.power_limit"] == pytest.approx(700.0)
    assert v["gpu.0.energy"] == pytest.approx(5000.0)
    assert meta["gpu.0.energy"].kind == "counter" and meta["gpu.0.energy"].unit == "J"
    assert v["gpu.0.pcie_tx"] == float(1 << 40) and meta["gpu.0.pcie_tx"].kind == "counter"
    assert v["gpu.0.ecc_corrected"] == 3 and meta["gpu.0.ecc_uncorrected"].kind == "counter"
    assert v["gpu.0.memory_temp"] == pytest.approx(65.5)
    assert v["gpu.0.remapped_rows_cor"] == 2
    # fields the GPU does not support are not channels at all
    assert "gpu.0.nvlink_tx" not in meta and "gpu.0.retired_pages_sbe" not in meta
    # the rest of the mapping
    assert v["gpu.0.util_sm"] == 97 and v["gpu.1.util_sm"] == 96 and v["gpu.0.util_mem"] == 40
    assert v["gpu.0.mem_used"] == 30 << 30 and meta["gpu.0.mem_total"].unit == "bytes"
    assert v["gpu.0.temp"] == 71 and meta["gpu.0.temp"].unit == "degC"
    assert (v["gpu.0.clock_sm"], v["gpu.0.clock_sm_max"]) == (1410, 1980)
    assert (v["gpu.0.pcie_link_width"], v["gpu.0.pcie_link_width_max"]) == (16, 16)
    assert (v["gpu.1.pcie_link_gen"], v["gpu.1.pcie_link_gen_max"]) == (3, 5)
    # throttle bitmask decoded: power cap + HW thermal on GPU 0, nothing on GPU 1
    assert v["gpu.0.throttle_power_cap"] == 1 and v["gpu.0.throttle_hw_thermal"] == 1
    assert v["gpu.0.throttle_sw_thermal"] == 0 and v["gpu.1.throttle_power_cap"] == 0
    assert all(c.subsystem == "gpu" for c in p.channels)


def test_old_gpu_uses_per_call_fallbacks(fake_nvml):
    p = NvmlProbe(gpus=[1])
    p.open()
    v = _values(p)
    assert all(n.startswith("gpu.1.") for n in v)
    assert v["gpu.1.power"] == pytest.approx(123.0)
    assert v["gpu.1.power_limit"] == pytest.approx(300.0)
    assert v["gpu.1.pcie_tx_rate"] == 1000 * 1024.0  # legacy KB/s → bytes/s
    assert "gpu.1.ecc_corrected" not in v  # unsupported: no channel, not NaN forever
    assert fake_nvml.field_calls == 0


def test_xid_events_counted_without_blocking(fake_nvml):
    p = NvmlProbe()
    p.open()
    v = _values(p)
    assert v["gpu.0.xid_events"] == 0 and v["gpu.1.xid_last"] == 0
    fake_nvml.events = [types.SimpleNamespace(device=("gpu", 1), eventData=79,
                                              eventType=real.nvmlEventTypeXidCriticalError)]
    v = _values(p)
    assert v["gpu.1.xid_events"] == 1 and v["gpu.1.xid_last"] == 79
    assert v["gpu.0.xid_events"] == 0
    p.close()
    assert fake_nvml.shutdown == 1


def test_failing_call_gives_nan_not_exception(fake_nvml, monkeypatch):
    p = NvmlProbe(gpus=[0])
    p.open()

    def lost(h):
        raise real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)
    monkeypatch.setattr(fake_nvml, "nvmlDeviceGetUtilizationRates", lost)
    v = _values(p)
    assert math.isnan(v["gpu.0.util_sm"]) and v["gpu.0.temp"] == 71
    assert len(p.sample()) == len(p.channels)


def test_absent_gpu_index_and_no_gpus(fake_nvml, monkeypatch):
    p = NvmlProbe(gpus=[5])
    p.open()
    assert not p.available and "not present" in p.reason and "2 GPUs" in p.reason
    monkeypatch.setattr(fake_nvml, "nvmlDeviceGetCount", lambda: 0)
    p = NvmlProbe()
    p.open()
    assert not p.available and "no GPU" in p.reason


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None,
                    reason="this machine has an NVIDIA driver")
def test_no_driver_reason_with_real_binding():
    p = NvmlProbe()
    p.open()
    assert not p.available
    assert p.reason == "NVML not available: libnvidia-ml.so.1 not found (no NVIDIA driver)"
    assert p.describe()["channels"] == 0
