"""hwmon, cpufreq and InfiniBand probes.  This VM has none of these devices, so the real paths
must give a clear reason; the channel mapping is checked against small fake sysfs trees."""
import os

import pytest

from reveal_plugins.probes.cpufreq import CpufreqProbe
from reveal_plugins.probes.hwmon import HwmonProbe
from reveal_plugins.probes.infiniband import InfinibandProbe


def _w(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _vals(p):
    return dict(zip([c.name for c in p.channels], p.sample()))


@pytest.mark.skipif(os.path.exists("/sys/class/hwmon"), reason="this machine has hwmon")
def test_hwmon_unavailable_here_says_why():
    p = HwmonProbe()
    p.open()
    assert not p.available and "/sys/class/hwmon" in p.reason


@pytest.mark.skipif(os.path.exists("/sys/devices/system/cpu/cpu0/cpufreq"),
                    reason="this machine has cpufreq")
def test_cpufreq_unavailable_here_says_why():
    p = CpufreqProbe()
    p.open()
    assert not p.available and "cpufreq" in p.reason


@pytest.mark.skipif(os.path.exists("/sys/class/infiniband"), reason="this machine has RDMA")
def test_infiniband_unavailable_here_says_why():
    p = InfinibandProbe()
    p.open()
    assert not p.available and "InfiniBand" in p.reason


def test_hwmon_fake_tree(tmp_path):
    r = tmp_path / "hwmon"
    _w(f"{r}/hwmon0/name", "coretemp\n")
    _w(f"{r}/hwmon0/temp1_input", "54000\n")
    _w(f"{r}/hwmon0/temp1_label", "Package id 0\n")
    _w(f"{r}/hwmon0/temp2_input", "51500\n")
    _w(f"{r}/hwmon0/temp2_label", "Core 0\n")
    _w(f"{r}/hwmon1/name", "nvme\n")
    _w(f"{r}/hwmon1/temp1_input", "38850\n")
    _w(f"{r}/hwmon1/temp1_label", "Composite\n")
    _w(f"{r}/hwmon2/name", "nct6775\n")
    _w(f"{r}/hwmon2/fan1_input", "1200\n")
    p = HwmonProbe(root=str(r))
    p.open()
    assert p.available, p.reason
    v = _vals(p)
    assert v == {"cpu.temp.package_id_0": 54.0, "cpu.temp.core_0": 51.5,
                 "system.hwmon.nvme_composite": pytest.approx(38.85),
                 "system.hwmon.nct6775_fan1": 1200.0}
    units = {c.name: (c.unit, c.kind) for c in p.channels}
    assert units["cpu.temp.core_0"] == ("degC", "gauge")
    assert units["system.hwmon.nct6775_fan1"] == ("RPM", "gauge")
    _w(f"{r}/hwmon0/temp2_input", "90000\n")  # re-read on every sample
    assert _vals(p)["cpu.temp.core_0"] == 90.0
    p.close()


def test_hwmon_empty_tree(tmp_path):
    (tmp_path / "hwmon").mkdir()
    p = HwmonProbe(root=str(tmp_path / "hwmon"))
    p.open()
    assert not p.available and "no temperature" in p.reason


def test_cpufreq_fake_tree(tmp_path):
    for n, f in ((0, 2400000), (1, 1200000)):
        d = tmp_path / f"cpu{n}" / "cpufreq"
        _w(f"{d}/scaling_cur_freq", f"{f}\n")
        _w(f"{d}/cpuinfo_max_freq", "3500000\n")
        _w(f"{d}/base_frequency", "2100000\n")
        _w(f"{d}/scaling_governor", "powersave\n")
    (tmp_path / "cpufreq").mkdir()  # the policy dir is not a core
    p = CpufreqProbe(root=str(tmp_path))
    p.open()
    assert p.available, p.reason
    assert _vals(p) == {"cpu.core0.freq": 2400.0, "cpu.core1.freq": 1200.0,
                        "cpu.freq_max": 3500.0, "cpu.freq_nominal": 2100.0}
    assert all(c.unit == "MHz" for c in p.channels)
    assert p.describe()["note"] == "governor powersave on 2 cores"


def test_infiniband_fake_tree(tmp_path):
    port = tmp_path / "mlx5_0" / "ports" / "1"
    _w(f"{port}/counters/port_rcv_data", "1000\n")
    _w(f"{port}/counters/port_xmit_data", "2500\n")
    _w(f"{port}/counters/port_xmit_wait", "17\n")
    _w(f"{port}/counters/link_downed", "0\n")
    _w(f"{port}/counters/symbol_error", "3\n")
    _w(f"{port}/hw_counters/out_of_buffer", "5\n")
    _w(f"{port}/hw_counters/lifespan", "10\n")
    _w(f"{port}/rate", "200 Gb/sec (4X HDR)\n")
    _w(f"{port}/state", "4: ACTIVE\n")
    _w(f"{port}/phys_state", "5: LinkUp\n")
    _w(f"{port}/link_layer", "InfiniBand\n")
    p = InfinibandProbe(root=str(tmp_path))
    p.open()
    assert p.available, p.reason
    v = _vals(p)
    pre = "network.ib.mlx5_0_1."
    assert v[pre + "port_rcv_data"] == 1000 and v[pre + "port_xmit_data"] == 2500
    assert v[pre + "rate"] == 200 and v[pre + "state"] == 4 and v[pre + "phys_state"] == 5
    assert v[pre + "out_of_buffer"] == 5 and v[pre + "link_downed"] == 0
    assert pre + "lifespan" not in v and pre + "link_layer" not in v
    meta = {c.name: c for c in p.channels}
    assert meta[pre + "port_rcv_data"].unit == "4-byte words"
    assert meta[pre + "port_rcv_data"].kind == "counter"
    assert meta[pre + "rate"].kind == "gauge" and meta[pre + "rate"].unit == "Gb/s"
    assert all(c.subsystem == "network" for c in p.channels)
    _w(f"{port}/state", "1: DOWN\n")
    assert _vals(p)[pre + "state"] == 1
