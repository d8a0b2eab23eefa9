"""``reveal import reveal-tsv``: files in the Reveal dataset's format (generated here, with its
quirks) become run directories that ``reveal analyze`` reads end to end."""
import datetime
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from reveal_plugins.importers.reveal_tsv import TSVFormatError, import_file, parse_header
from reveal_plugins.store.store import load_run

T0 = 1_700_000_000.0


def write_reveal_tsv(path, host="gpu-node1", seconds=150.0, episode=(70.0, 100.0),
                     ipc_x100=True, iso_times=False, seed=0, extra_host=None, cause="cpu"):
    """A file in the Reveal format: Perf per core (IPC x100 on this "Intel GPU host"), an
    all-NaN Perf column, Turbostat, CPU, Memory, Meminfo_diff, Storage(_diff), ``GPU: ``
    with nvidia-smi names, network deltas; 100 ms rows; in ``episode`` the GPU starves
    (utilisation and power drop) because of ``cause``: ``cpu`` contention (IPC halves, the
    cores busy) or the ``network`` (TCP retransmissions from ~1/s to ~30/s, nothing else
    moves: the issue's headline case)."""
    rng = np.random.default_rng(seed)
    n = int(seconds * 10)
    t = T0 + np.arange(n) * 0.1
    off = t - T0
    ep = (off >= episode[0]) & (off < episode[1]) if episode else np.zeros(n, bool)
    cpu_ep = ep if cause == "cpu" else np.zeros(n, bool)
    net_ep = ep if cause == "network" else np.zeros(n, bool)
    cols = {}
    hosts = [host] + ([extra_host] if extra_host else [])
    for h in hosts:
        for core in (0, 1):
            cyc = 2.5e8 + rng.normal(0, 2e6, n)
            ipc = np.where(cpu_ep, 0.8, 1.6) + rng.normal(0, 0.03, n)
            cols[f"Perf:cycles.{core}.{h}[count]"] = cyc
            cols[f"Perf:instructions.{core}.{h}[count]"] = cyc * ipc
            cols[f"Perf:IPC.{core}.{h}[]"] = ipc * (100 if ipc_x100 else 1)
        cols[f"Perf:stalls_l3_miss.0.{h}[count]"] = np.full(n, np.nan)   # quirk: NaN column
        cols[f"Turbostat:Busy%.0.{h}[%]"] = np.where(cpu_ep, 99, 60) + rng.normal(0, 2, n)
        cols[f"Turbostat:Bzy_MHz.0.{h}[MHz]"] = 2400 + rng.normal(0, 20, n)
        for core in (0, 1):
            u = np.clip(np.where(cpu_ep, 97, 55) + rng.normal(0, 3, n), 0, 100)
            cols[f"CPU:user.{core}.{h}[%]"] = u
            cols[f"CPU:idle.{core}.{h}[%]"] = 100 - u
        cols[f"Memory:MemTotal.0.{h}[kB]"] = np.full(n, 256e6)
        cols[f"Memory:MemAvailable.0.{h}[kB]"] = 200e6 + rng.normal(0, 2e5, n)
        cols[f"Meminfo_diff:Dirty.0.{h}[kB]"] = rng.normal(0, 50, n)
        cols[f"Storage:in_flight.nvme0n1.{h}[count]"] = rng.poisson(0.2, n).astype(float)
        cols[f"Storage_diff:read_bytes.nvme0n1.{h}[B]"] = rng.poisson(4e5, n).astype(float)
        cols[f"GPU: utilization.gpu.0.{h}[%]"] = np.clip(
            np.where(ep, 35 if cause == "cpu" else 40, 95) + rng.normal(0, 2, n), 0, 100)
        cols[f"GPU: power.draw.0.{h}[W]"] = (np.where(ep, 180, 290) if cause == "cpu" else
                                             np.where(ep, 150, 300)) + rng.normal(0, 5, n)
        cols[f"GPU: temperature.gpu.0.{h}[C]"] = 60 + rng.normal(0, 0.5, n)
        cols[f"GPU: clocks.sm.0.{h}[MHz]"] = 1980 + rng.normal(0, 5, n)
        cols[f"NetworkInterStat_diff:rx_bytes.ib0.{h}[B]"] = rng.poisson(2e6, n).astype(float)
        cols[f"NetworkInterStat_diff:tx_bytes.ib0.{h}[B]"] = rng.poisson(2e6, n).astype(float)
        cols[f"NetworkProtocolCounts:CurrEstab.0.{h}[count]"] = np.full(n, 12.0)
        cols[f"NetworkTCPRetrans_diff:RetransSegs.0.{h}[count]"] = rng.poisson(
            np.where(net_ep, 3.0, 0.1), n) * 1.0       # per 100-ms row: ~30/s vs ~1/s
    names = list(cols)
    with open(path, "w") as f:
        f.write("timestamp\t" + "\t".join(names) + "\n")
        for i in range(n):
            ts = (datetime.datetime.fromtimestamp(t[i], datetime.timezone.utc)
                  .strftime("%Y-%m-%d %H:%M:%S.%f") if iso_times else f"{t[i]:.3f}")
            vals = ["NaN" if not np.isfinite(cols[c][i]) else f"{cols[c][i]:.6g}"
                    for c in names]
            if i == 5:
                vals[names.index(f"Storage:in_flight.nvme0n1.{host}[count]")] = ""  # a gap
            f.write(ts + "\t" + "\t".join(vals) + "\n")
    return path


def test_header_quirks_parse():
    _, cols = parse_header("f.tsv", "ts\tGPU: power.draw.0.node7[W]\tPerf:IPC.3.node7[]\t"
                                    "NetworkTCPRetrans_diff:RetransSegs.0.node7[count]")
    assert [(c.family, c.metric, c.dev, c.host, c.unit) for c in cols] == [
        ("GPU", "power.draw", "0", "node7", "W"), ("Perf", "IPC", "3", "node7", ""),
        ("NetworkTCPRetrans_diff", "RetransSegs", "0", "node7", "count")]
    with pytest.raises(TSVFormatError, match=r"f.tsv:1: column 3 'cpu_busy' is not"):
        parse_header("f.tsv", "ts\tGPU: power.draw.0.n[W]\tcpu_busy")


def test_import_keeps_values_and_fixes_quirks(tmp_path):
    f = write_reveal_tsv(str(tmp_path / "job-77.tsv"), seconds=30, episode=None)
    runs = import_file(f, str(tmp_path / "out"))
    assert runs == [str(tmp_path / "out" / "job-77" / "gpu-node1")]
    rd = load_run(runs[0])
    meta = rd.meta
    names = rd.frame.names
    assert meta["run"]["host"] == "gpu-node1" and meta["interval_s"] == pytest.approx(0.1)
    assert len(rd.frame.t) == 300
    # the all-NaN column is dropped and said so
    assert "Perf:stalls_l3_miss.0.gpu-node1[count]" in meta["import"]["dropped"]
    # IPC x100 undone (and noted); per-core Perf columns made host-wide
    ipc = rd.frame.column("cpu.perf.ipc")
    assert 1.4 < np.nanmedian(ipc) < 1.8
    assert any("x100" in n for n in meta["import"]["notes"])
    # "GPU: " with its space; nvidia-smi names become the NVML probe's
    assert {"gpu.0.util_sm", "gpu.0.power", "gpu.0.temp", "gpu.0.clock_sm"} <= set(names)
    # _diff families are deltas: stored as cumulative counters, read back as rates
    kinds = {c.name: c.kind for c in rd.frame.channels}
    assert kinds["network.ib0.rx_bytes"] == "counter"
    assert kinds["network.tcp.RetransSegs"] == "counter"
    assert kinds["storage.nvme0n1.in_flight"] == "gauge"
    assert kinds["memory.Dirty"] == "gauge"    # deltas of a level (some negative): the level
    assert any(n.startswith("memory.Dirty: negative deltas") for n in meta["import"]["notes"])
    rx = rd.frame.column("network.ib0.rx_bytes")
    assert np.nanmedian(np.diff(rx)) == pytest.approx(2e6, rel=0.01)   # per-row delta back
    assert np.isnan(rd.frame.column("storage.nvme0n1.in_flight")[5])   # the empty cell
    # re-importing over it is refused (no silent mix of two files)
    with pytest.raises(TSVFormatError, match="exists already"):
        import_file(f, str(tmp_path / "out"))


def test_iso_timestamps_and_two_hosts(tmp_path):
    f = write_reveal_tsv(str(tmp_path / "j.tsv"), seconds=20, episode=None, iso_times=True,
                         extra_host="gpu-node2", ipc_x100=False)
    runs = import_file(f, str(tmp_path / "out"))
    assert [os.path.basename(r) for r in runs] == ["gpu-node1", "gpu-node2"]
    rd = load_run(runs[1])
    assert rd.frame.t[0] == pytest.approx(T0, abs=1e-3)
    assert not rd.meta["import"]["notes"] or not any("x100" in n
                                                     for n in rd.meta["import"]["notes"])


def test_bad_value_names_file_and_line(tmp_path):
    f = tmp_path / "bad.tsv"
    f.write_text("t\tMemory:MemFree.0.h[kB]\n1700000000.0\t5\n1700000000.1\tlots\n")
    with pytest.raises(TSVFormatError, match=r"bad.tsv"):
        import_file(str(f), str(tmp_path / "out"))


@pytest.mark.slow
def test_imported_file_analysed_end_to_end(tmp_path, report_schema_validate):
    """The CLI imports and `reveal analyze` finds the planted episode in the imported run."""
    f = write_reveal_tsv(str(tmp_path / "job-9.tsv"))
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "import", "reveal-tsv", f,
                        "--out", str(out), "--user", "alice"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    run = out / "job-9" / "gpu-node1"
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "analyze", str(run),
                        "--no-publish"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = report_schema_validate(json.loads((run / "report.json").read_text()))
    assert rep["run"]["user"] == "alice"
    hit = [a for a in rep["anomalies"] if a["start"] < T0 + 100 and a["end"] > T0 + 70]
    assert hit, rep["anomalies"]
    assert hit[0]["subsystem"] in ("cpu", "gpu")
    chans = {e["channel"] for a in hit for e in a["evidence"]}
    assert chans & {"cpu.perf.ipc", "gpu.0.util_sm", "gpu.0.power", "cpu.perf.instructions"}
    # nothing outside the episode (start-up aside)
    assert all(a["end"] > T0 + 60 for a in rep["anomalies"]), rep["anomalies"]
    assert not any("went backwards" in n for n in rep.get("notes") or []), rep.get("notes")


def test_gpu_starved_by_the_network_is_named_network(tmp_path, report_schema_validate):
    """Issue 21, item 4 (the paper's headline case): 2 min at 10 Hz, a 20-s episode in which
    TCP retransmissions go from ~1/s to ~30/s while GPU utilisation falls from 95 % to 40 %
    and power from 300 W to 150 W.  The idle GPU is the consequence; the report names the
    network, with a hint for the network, and says the GPU starved."""
    f = write_reveal_tsv(str(tmp_path / "job-11.tsv"), seconds=120.0, episode=(60.0, 80.0),
                         cause="network", ipc_x100=False)
    out = tmp_path / "runs"
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "import", "reveal-tsv", f,
                        "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    run = out / "job-11" / "gpu-node1"
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "analyze", str(run),
                        "--no-publish"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    rep = report_schema_validate(json.loads((run / "report.json").read_text()))
    hit = [a for a in rep["anomalies"] if a["start"] < T0 + 80 and a["end"] > T0 + 60]
    assert len(hit) == 1, rep["anomalies"]
    a = hit[0]
    assert a["subsystem"] == "network", a
    assert a["evidence"][0]["channel"] == "network.tcp.RetransSegs", a["evidence"][:3]
    text = json.dumps(a["hints"])
    assert "GPU" in text and "starved" in text, a["hints"]
    assert "No specific rule matched" not in text, a["hints"]
