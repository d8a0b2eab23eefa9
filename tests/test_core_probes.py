"""procfs/PSI probes read this machine for real; the plugin manager exposes them."""
import json
import subprocess
import sys
import time

from reveal_plugins.hooks import hook
from reveal_plugins.probes.procfs import PROCFS_PROBES
from reveal_plugins.types import SUBSYSTEMS


def _open_all():
    probes = [p for batch in hook().reveal_register_probes(config={}) for p in batch]
    for p in probes:
        p.open()
    return probes


def test_host_probes_available_with_hundreds_of_channels():
    probes = _open_all()
    names = {p.name for p in probes if p.available}
    assert {cls.name for cls in PROCFS_PROBES} <= names
    assert {"psi.cpu", "psi.memory", "psi.io"} <= names
    chans = [c for p in probes if p.available for c in p.channels]
    assert len(chans) >= 200
    assert len({c.name for c in chans}) == len(chans), "channel names must be unique"
    assert all(c.subsystem in SUBSYSTEMS for c in chans)
    for must in ("cpu.all.user", "cpu.core0.idle", "memory.MemAvailable", "cpu.psi.some_total",
                 "network.tcp.RetransSegs", "cpu.procs_running", "cpu.load1", "lo"):
        if must == "lo":
            assert any(c.name.startswith("network.lo.") for c in chans)
        else:
            assert must in {c.name for c in chans}, must


def test_samples_move_with_the_machine():
    probes = {p.name: p for p in _open_all()}
    stat = probes["procfs.stat"]
    names = [c.name for c in stat.channels]
    i, j = names.index("cpu.all.user"), names.index("cpu.all.nice")

    def busy():      # user + nice: a reniced test process burns "nice" time
        v = stat.sample()
        return v[i] + v[j]
    a = busy()
    x, t0 = 0, time.monotonic()
    while True:            # burn CPU until the counter moves (a loaded machine: up to 5 s)
        for k in range(1_000_000):
            x += k
        b = busy()
        if b > a or time.monotonic() - t0 > 5:
            break
    assert b > a
    for p in probes.values():
        if p.available:
            v = p.sample()
            assert len(v) == len(p.channels)


def test_reveal_probes_lists_and_explains():
    out = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "probes", "--json"],
                         capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)
    assert any(r["name"] == "procfs.stat" and r["available"] for r in rows)
    for r in rows:
        if not r["available"]:
            assert r["reason"], f"{r['name']} unavailable without a reason"
    text = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "probes"],
                          capture_output=True, text=True, check=True).stdout
    assert "procfs.meminfo" in text and "probes available" in text
