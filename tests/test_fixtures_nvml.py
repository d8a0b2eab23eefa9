"""The fake NVIDIA driver (tests/fixtures_nvml.py) behaves like a driver through the REAL binding.

Every assertion goes through ``pynvml``'s public functions, so the binding's own argument marshalling,
struct parsing, error classes and fallbacks are exercised against the fake C library.
"""
import ctypes
import re
import threading
import time

import pytest

pynvml = pytest.importorskip("pynvml")

from fixtures_nvml import (  # noqa: E402
    GIB, STRUCTS, UINT_MAX, FakeDriver, ManualClock, install_fake_nvml,
)

ALL_LINKS = 0xFFFFFFFF


@pytest.fixture
def nvml(fake_nvml_driver):
    pynvml.nvmlInit()
    yield fake_nvml_driver
    pynvml.nvmlShutdown()


@pytest.fixture
def clocked():
    """A default driver on a ManualClock, initialised."""
    clock = ManualClock()
    with install_fake_nvml(FakeDriver(clock=clock)) as drv:
        pynvml.nvmlInit()
        yield drv, clock
        pynvml.nvmlShutdown()
    drv.check()


def handle(i):
    return pynvml.nvmlDeviceGetHandleByIndex(i)


def fields(h, *ids):
    return {(v.fieldId, v.scopeId): v for v in pynvml.nvmlDeviceGetFieldValues(h, list(ids))}


def test_struct_layouts_agree_with_the_binding():
    for name, ours in STRUCTS.items():
        assert ctypes.sizeof(ours) == ctypes.sizeof(getattr(pynvml, name)), name
        theirs = [f[0] for f in getattr(pynvml, name)._fields_]
        assert [f[0] for f in ours._fields_] == theirs, name


def test_fixture_installs_and_restores_binding_state():
    before = (pynvml.nvmlLib, dict(pynvml._nvmlGetFunctionPointer_cache), pynvml._nvmlLib_refcount)
    drv = FakeDriver(gpus=2)
    with install_fake_nvml(drv):
        assert pynvml.nvmlLib is drv.lib
        pynvml.nvmlInit()
        assert pynvml.nvmlDeviceGetCount() == 2
        assert pynvml._nvmlLib_refcount == 1
        # no shutdown: the restore must still put things back
    assert (pynvml.nvmlLib, dict(pynvml._nvmlGetFunctionPointer_cache), pynvml._nvmlLib_refcount) == before


def test_uninitialized_until_init_and_after_shutdown(fake_nvml_driver):
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    pynvml.nvmlInit()
    pynvml.nvmlInit()
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetCount() == 8  # refcounted
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetHandleByIndex(0)


def test_identity_of_eight_h100(nvml):
    assert pynvml.nvmlDeviceGetCount() == 8
    assert pynvml.nvmlSystemGetDriverVersion() == "550.127.05"
    assert pynvml.nvmlSystemGetNVMLVersion().startswith("12.")
    uuids, buses = set(), set()
    for i in range(8):
        h = handle(i)
        assert pynvml.nvmlDeviceGetIndex(h) == i
        assert pynvml.nvmlDeviceGetMinorNumber(h) == i
        assert pynvml.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
        uuid = pynvml.nvmlDeviceGetUUID(h)
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", uuid)
        pci = pynvml.nvmlDeviceGetPciInfo(h)
        assert re.fullmatch(r"00000000:[0-9A-F]{2}:00\.0", pci.busId)
        assert pci.pciDeviceId == 0x233010DE
        assert pynvml.nvmlDeviceGetSerial(h).isdigit()
        # handles by UUID / PCI bus id (either domain width, any case) are the same device
        assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(uuid)) == i
        short = pci.busId[4:].lower()
        assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByPciBusId(short)) == i
        uuids.add(uuid)
        buses.add(pci.busId)
    assert len(uuids) == len(buses) == 8
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(8)


@pytest.mark.parametrize("fake_nvml_driver", [dict(gpus=2, model="H200", minor_numbers=[5, 3])],
                         indirect=True)
def test_constructor_args_through_indirect_parametrisation(nvml):
    assert pynvml.nvmlDeviceGetCount() == 2
    assert pynvml.nvmlDeviceGetName(handle(0)) == "NVIDIA H200"
    assert [pynvml.nvmlDeviceGetMinorNumber(handle(i)) for i in range(2)] == [5, 3]


def test_memory_info_v1_and_v2(nvml):
    h = handle(0)
    nvml.gpus[0].busy(mem_bytes=10 * GIB)
    v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    assert v1.total == v2.total == 81559 << 20
    assert v2.used == 10 * GIB and v2.reserved > 0
    assert v1.used == v2.used + v2.reserved  # v1 counts reserved memory as used
    assert v1.free == v2.free == v2.total - v2.reserved - v2.used


def test_nvlink_throughput_scope_all_links_sums_and_scope_0_is_link_0(clocked):
    drv, clock = clocked
    drv.gpus[1].busy(nvlink_gbps=180.0)
    h = handle(1)
    start = fields(h, (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ALL_LINKS),
                   (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0))
    clock.advance(1.0)
    ids = [(pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ALL_LINKS),
           (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0),
           (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 17),
           (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 18),
           (pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT, 0)]
    got = fields(h, *ids)
    for v in got.values():
        assert v.timestamp > 1_600_000_000_000_000  # us since 1970
    all_links, link0, link17, bad, count = (got[k] for k in ids)
    assert count.nvmlReturn == 0 and count.value.uiVal == 18
    assert all_links.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    d_all = all_links.value.ullVal - start[ids[0]].value.ullVal
    d_0 = link0.value.ullVal - start[ids[1]].value.ullVal
    assert d_all == pytest.approx(180e9 / 1024, rel=1e-3)   # KiB in one second, all 18 links
    assert d_0 == pytest.approx(d_all / 18, rel=1e-3)        # link 0 alone: 1/18 of it
    assert link17.nvmlReturn == 0 and link17.value.ullVal > 0
    assert bad.nvmlReturn == pynvml.NVML_ERROR_INVALID_ARGUMENT  # no link 18; the batch still succeeds
    # a link that is down carries nothing; the total spreads over the others
    drv.gpus[1].nvlink_down(0)
    before = fields(h, *ids[:2])
    clock.advance(1.0)
    after = fields(h, *ids[:2])
    assert after[ids[1]].value.ullVal == before[ids[1]].value.ullVal
    assert after[ids[0]].value.ullVal - before[ids[0]].value.ullVal == pytest.approx(180e9 / 1024, rel=1e-3)


def test_per_field_errors_leave_the_rest_of_the_batch_ok(nvml):
    nvml.gpus[0].refuse_fields([pynvml.NVML_FI_DEV_POWER_INSTANT])
    h = handle(0)
    got = pynvml.nvmlDeviceGetFieldValues(h, [
        pynvml.NVML_FI_DEV_POWER_INSTANT, pynvml.NVML_FI_DEV_POWER_CURRENT_LIMIT,
        pynvml.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION, pynvml.NVML_FI_DEV_MEMORY_TEMP,
        pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,  # refused on Hopper
        pynvml.NVML_FI_DEV_REMAPPED_PENDING, 4000])
    rets = [v.nvmlReturn for v in got]
    assert rets == [pynvml.NVML_ERROR_NO_PERMISSION, 0, 0, 0, pynvml.NVML_ERROR_NOT_SUPPORTED, 0,
                    pynvml.NVML_ERROR_NOT_SUPPORTED]
    assert got[1].value.uiVal == 700_000 and got[1].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    # other GPUs are not affected; a driver-wide refusal set hits all GPUs
    assert fields(handle(1), pynvml.NVML_FI_DEV_POWER_INSTANT)[(186, 0)].nvmlReturn == 0


def test_nvlink_error_fields_per_link_and_scope(nvml):
    nvml.gpus[2].nvlink_error(3, crc_flit=7, replay=2).nvlink_error(15, recovery=1)
    h = handle(2)
    got = fields(h, pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L3,
                 pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L3,
                 (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, 15),
                 pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL)
    assert got[(pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L3, 0)].value.ullVal == 7
    assert got[(pynvml.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L3, 0)].value.ullVal == 2
    assert got[(pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, 15)].value.ullVal == 1
    assert got[(pynvml.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, 0)].nvmlReturn == 3
    assert pynvml.nvmlDeviceGetNvLinkErrorCounter(h, 3, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT) == 7


def test_lost_gpu_raises_gpu_is_lost_everywhere(nvml):
    h3, h4 = handle(3), handle(4)
    nvml.gpus[3].lose()
    for call in (lambda: pynvml.nvmlDeviceGetUtilizationRates(h3),
                 lambda: pynvml.nvmlDeviceGetFieldValues(h3, [pynvml.NVML_FI_DEV_POWER_INSTANT]),
                 lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(h3),
                 lambda: pynvml.nvmlDeviceGetPcieThroughput(h3, 0),
                 lambda: pynvml.nvmlDeviceGetHandleByIndex(3)):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call()
    assert pynvml.nvmlDeviceGetCount() == 8
    assert pynvml.nvmlDeviceGetUtilizationRates(h4).gpu == 0  # the others carry on
    nvml.gpus[3].recover()
    assert pynvml.nvmlDeviceGetUtilizationRates(h3).gpu == 0


@pytest.mark.parametrize("error,exc", [("no_permission", "NVMLError_NoPermission"),
                                       ("gpu_is_lost", "NVMLError_GpuIsLost"),
                                       ("reset_required", "NVMLError_ResetRequired")])
def test_gpu_that_cannot_be_opened(error, exc):
    drv = FakeDriver(refused={5: error})
    with install_fake_nvml(drv):
        pynvml.nvmlInit()
        assert pynvml.nvmlDeviceGetCount() == 8  # _v2 counts it anyway
        with pytest.raises(getattr(pynvml, exc)):
            pynvml.nvmlDeviceGetHandleByIndex(5)
        with pytest.raises(getattr(pynvml, exc)):
            pynvml.nvmlDeviceGetHandleByUUID(drv.gpus[5].uuid)
        assert pynvml.nvmlDeviceGetIndex(handle(6)) == 6
        pynvml.nvmlShutdown()
    drv.check()


def test_old_driver_lacks_new_functions():
    drv = FakeDriver(old_driver=True)
    with install_fake_nvml(drv):
        pynvml.nvmlInit()
        h = handle(0)
        drv.gpus[0].busy()
        assert pynvml.nvmlSystemGetDriverVersion().startswith("470.")
        for call in (lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
                     lambda: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2),
                     lambda: pynvml.nvmlDeviceGetComputeRunningProcesses_v3(h),
                     lambda: pynvml.nvmlDeviceGetGpuMaxPcieLinkGeneration(h)):
            with pytest.raises(pynvml.NVMLError_FunctionNotFound):
                call()
        # the binding's unversioned wrapper turns FunctionNotFound into NVMLLibraryMismatchError
        with pytest.raises(pynvml.NVMLLibraryMismatchError):
            pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        assert pynvml.nvmlDeviceGetComputeRunningProcesses_v2(h) == []
        assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h) == 0
        assert pynvml.nvmlDeviceGetMemoryInfo(h).total > 0
        got = fields(h, pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, pynvml.NVML_FI_DEV_POWER_INSTANT,
                     pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX)
        assert got[(197, 0)].nvmlReturn == got[(186, 0)].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
        assert got[(138, 0)].nvmlReturn == 0
        assert pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_RX_BYTES) > 0
        pynvml.nvmlShutdown()
    drv.check()


def test_pcie_count_32bit_wraps_64bit_does_not():
    clock = ManualClock()
    drv = FakeDriver(gpus=1, clock=clock, pcie_counter_bits=32)
    with install_fake_nvml(drv):
        pynvml.nvmlInit()
        h = handle(0)
        drv.gpus[0].busy(pcie_tx_gbps=5.0)  # Gen5 x16 carries it
        samples = []
        for _ in range(4):
            v = fields(h, pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES)[(197, 0)]
            assert v.nvmlReturn == 0 and v.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
            samples.append(v.value.uiVal)
            clock.advance(0.5)
        assert any(b < a for a, b in zip(samples, samples[1:]))  # wrapped within 2 s
        assert all((b - a) % 2**32 == int(2.5e9) or abs((b - a) % 2**32 - 2.5e9) <= 1
                   for a, b in zip(samples, samples[1:]))
        drv.gpus[0].pcie_counter_bits = 64
        v = fields(h, pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES)[(197, 0)]
        assert v.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG and v.value.ullVal >= 2**32
        pynvml.nvmlShutdown()
    drv.check()


def test_process_lists_two_call_protocol_and_process_utilization(nvml):
    gpu = nvml.gpus[2]
    h = handle(2)
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h) == []
    gpu.busy().add_process(4242, 20 * GIB, sm_util=30).add_process(777, None, kind="graphics")
    nvml.reset_calls()
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    assert [(p.pid, p.usedGpuMemory, p.gpuInstanceId) for p in procs] == [(4242, 20 * GIB, UINT_MAX)]
    assert nvml.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 2  # size query + fill
    graphics = pynvml.nvmlDeviceGetGraphicsRunningProcesses(h)
    assert [(p.pid, p.usedGpuMemory) for p in graphics] == [(777, None)]  # NVML_VALUE_NOT_AVAILABLE
    assert pynvml.nvmlDeviceGetUtilizationRates(h).gpu == 100  # 95 + 30, capped
    samples = pynvml.nvmlDeviceGetProcessUtilization(h, 0)
    assert {s.pid: s.smUtil for s in samples} == {4242: 30, 777: 0}
    with pytest.raises(pynvml.NVMLError_NotFound):  # nothing newer than the last sample seen
        pynvml.nvmlDeviceGetProcessUtilization(h, samples[0].timeStamp)
    with pytest.raises(pynvml.NVMLError_NotFound):  # no processes on another GPU
        pynvml.nvmlDeviceGetProcessUtilization(handle(3), 0)


def test_mig_devices(nvml):
    gpu = nvml.gpus[2].set_mig(["3g.40gb", "2g.20gb", "1g.10gb"])
    gpu.add_process(99, 5 * GIB, mig=1)
    h = handle(2)
    assert pynvml.nvmlDeviceGetMigMode(h) == [1, 1]
    assert pynvml.nvmlDeviceGetMigMode(handle(0)) == [0, 0]
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(h) == 7
    migs = [pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i) for i in range(3)]
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, 3)
    assert pynvml.nvmlDeviceIsMigDeviceHandle(migs[0]).value == 1
    assert pynvml.nvmlDeviceIsMigDeviceHandle(h).value == 0
    assert [pynvml.nvmlDeviceGetGpuInstanceId(m) for m in migs] == [1, 2, 3]
    assert pynvml.nvmlDeviceGetComputeInstanceId(migs[1]) == 0
    uuid = pynvml.nvmlDeviceGetUUID(migs[1])
    assert uuid.startswith("MIG-")
    assert pynvml.nvmlDeviceGetGpuInstanceId(pynvml.nvmlDeviceGetHandleByUUID(uuid)) == 2
    assert pynvml.nvmlDeviceGetName(migs[2]).endswith("MIG 1g.10gb")
    assert pynvml.nvmlDeviceGetMemoryInfo(migs[1]).total == 20 * GIB
    parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(migs[0])
    assert pynvml.nvmlDeviceGetIndex(parent) == 2
    assert [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(migs[1])] == [99]
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(migs[0]) == []
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(h)[0].gpuInstanceId == 2
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetUtilizationRates(migs[0])
    with pytest.raises(pynvml.NVMLError_NotSupported):  # no device utilisation in MIG mode
        pynvml.nvmlDeviceGetUtilizationRates(h)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetGpuInstanceId(h)


def test_power_throttle_moves_clocks_reasons_power_and_violation_counters(clocked):
    drv, clock = clocked
    h = handle(4)
    drv.gpus[4].busy()
    pol = pynvml.NVML_PERF_POLICY_POWER
    v0 = pynvml.nvmlDeviceGetViolationStatus(h, pol)
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == 0
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == 1980
    drv.gpus[4].throttle("power")
    clock.advance(2.0)
    v1 = pynvml.nvmlDeviceGetViolationStatus(h, pol)
    assert v1.violationTime - v0.violationTime == 2_000_000_000          # ns
    assert v1.referenceTime - v0.referenceTime == 2_000_000              # us
    assert pynvml.nvmlDeviceGetViolationStatus(h, pynvml.NVML_PERF_POLICY_THERMAL).violationTime == 0
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) & pynvml.nvmlClocksEventReasonSwPowerCap
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) < 0.8 * pynvml.nvmlDeviceGetMaxClockInfo(
        h, pynvml.NVML_CLOCK_SM)
    assert pynvml.nvmlDeviceGetPowerUsage(h) == pynvml.nvmlDeviceGetEnforcedPowerLimit(h) == 700_000
    got = fields(h, pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP)
    assert got[(74, 0)].value.ullVal == 2_000_000_000
    # an untouched busy GPU has no reason bits; an idle one reports GpuIdle
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle(0)) == pynvml.nvmlClocksEventReasonGpuIdle
    # energy integrates power over time (mJ)
    e0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    clock.advance(1.0)
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(h) - e0 == 700_000


def test_thermal_and_hw_slowdown(clocked):
    drv, clock = clocked
    drv.gpus[5].throttle("thermal")
    drv.gpus[6].throttle("hw_slowdown", cause="thermal")
    clock.advance(1.0)
    h5, h6 = handle(5), handle(6)
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h5) == pynvml.nvmlClocksEventReasonSwThermalSlowdown
    assert pynvml.nvmlDeviceGetTemperature(h5, pynvml.NVML_TEMPERATURE_GPU) >= 87
    r6 = pynvml.nvmlDeviceGetCurrentClocksEventReasons(h6)
    assert r6 & pynvml.nvmlClocksEventReasonHwSlowdown and r6 & pynvml.nvmlClocksEventReasonHwThermalSlowdown
    assert pynvml.nvmlDeviceGetClockInfo(h6, pynvml.NVML_CLOCK_SM) <= 1980 / 2
    got = fields(h6, pynvml.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN)
    assert got[(270, 0)].value.ullVal == 1_000_000_000


def test_downtrained_link_and_replays(clocked):
    drv, clock = clocked
    h = handle(7)
    drv.gpus[7].busy().downtrain(gen=3, width=8, replays_per_s=10)
    clock.advance(3.0)
    assert (pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h), pynvml.nvmlDeviceGetCurrPcieLinkWidth(h)) == (3, 8)
    assert (pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h), pynvml.nvmlDeviceGetMaxPcieLinkWidth(h)) == (5, 16)
    assert pynvml.nvmlDeviceGetGpuMaxPcieLinkGeneration(h) == 5
    assert pynvml.nvmlDeviceGetPcieReplayCounter(h) == 30
    assert fields(h, pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER)[(94, 0)].value.uiVal == 30


def test_legacy_pcie_throughput_blocks(nvml):
    nvml.gpus[0].busy(pcie_rx_gbps=8.0)
    h = handle(0)
    t0 = time.perf_counter()
    kbs = pynvml.nvmlDeviceGetPcieThroughput(h, pynvml.NVML_PCIE_UTIL_RX_BYTES)
    assert time.perf_counter() - t0 >= 0.015
    assert kbs == int(8e9 / 1024)


def test_call_counts_per_symbol_and_gpu(nvml):
    h1 = handle(1)
    nvml.reset_calls()
    for _ in range(3):
        pynvml.nvmlDeviceGetFieldValues(h1, [pynvml.NVML_FI_DEV_POWER_INSTANT, pynvml.NVML_FI_DEV_MEMORY_TEMP])
        pynvml.nvmlDeviceGetUtilizationRates(h1)
    pynvml.nvmlDeviceGetUtilizationRates(handle(2))
    assert nvml.gpus[1].calls == {"nvmlDeviceGetFieldValues": 3, "nvmlDeviceGetUtilizationRates": 3}
    assert nvml.calls["nvmlDeviceGetUtilizationRates"] == 4
    assert nvml.calls["nvmlDeviceGetHandleByIndex_v2"] == 1
    assert nvml.calls_per_gpu()[1] == 6 and nvml.calls_per_gpu()[2] == 1
    assert nvml.field_reads[(1, pynvml.NVML_FI_DEV_MEMORY_TEMP)] == 3
    # a binding symbol the fake has no model for answers NOT_SUPPORTED and is counted as such
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetFanSpeed(h1)
    assert nvml.unimplemented_calls["nvmlDeviceGetFanSpeed"] == 1


def test_missing_symbol_is_function_not_found():
    drv = FakeDriver(gpus=1, missing_symbols={"nvmlDeviceGetFieldValues"}, unimplemented="missing")
    with install_fake_nvml(drv):
        pynvml.nvmlInit()
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetFieldValues(handle(0), [pynvml.NVML_FI_DEV_POWER_INSTANT])
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetFanSpeed(handle(0))
        pynvml.nvmlShutdown()


def test_xid_events(nvml):
    es = pynvml.nvmlEventSetCreate()
    h1 = handle(1)
    pynvml.nvmlDeviceRegisterEvents(h1, pynvml.nvmlEventTypeXidCriticalError, es)
    t0 = time.perf_counter()
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(es, 0)  # never blocks with timeout 0
    assert time.perf_counter() - t0 < 0.01
    nvml.gpus[2].xid(13)                    # not registered: not delivered
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(es, 0)
    nvml.gpus[1].xid(79)
    ev = pynvml.nvmlEventSetWait_v2(es, 0)
    assert ev.eventType == pynvml.nvmlEventTypeXidCriticalError and ev.eventData == 79
    assert pynvml.nvmlDeviceGetIndex(ev.device) == 1 and ev.gpuInstanceId == UINT_MAX
    # a waiter with a timeout is woken by an Xid from another thread
    threading.Timer(0.02, nvml.gpus[1].xid, args=(48,)).start()
    ev = pynvml.nvmlEventSetWait_v2(es, 2000)
    assert ev.eventData == 48
    # nvml.h: several Xids before a wait all report the most recent one
    nvml.gpus[1].xid(31)
    nvml.gpus[1].xid(94)
    assert [pynvml.nvmlEventSetWait_v2(es, 0).eventData for _ in range(2)] == [94, 94]
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceRegisterEvents(h1, pynvml.nvmlEventTypeClock, es)
    nvml.gpus[1].lose()                      # Xid 79, then the GPU is gone
    assert pynvml.nvmlEventSetWait_v2(es, 0).eventData == 79
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlEventSetWait_v2(es, 0)
    pynvml.nvmlEventSetFree(es)


def test_internal_error_is_not_reported_as_success(nvml):
    nvml.gpus[0].memory = None  # break the fake on purpose
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetMemoryInfo(handle(0))
    assert nvml.internal_errors
    nvml.internal_errors.clear()
