"""The qdisc probe on a real veth between two network namespaces, with a real tc shaper."""
import socket
import subprocess
import threading
import time

import pytest

from reveal_plugins.detect.attribution import symptom_mask
from reveal_plugins.telemetry.qdisc import QdiscProbe, parse_dump

from fixtures_netns import netns_pair  # noqa: F401  (fixture)

_SAMPLE = r"""
import json, socket, sys, threading, time
from reveal_plugins.telemetry.qdisc import QdiscProbe
p = QdiscProbe(); p.open()
names = [c.name for c in p.channels]
first = p.sample()
def blast():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); t = time.time()
    while time.time() - t < float(sys.argv[2]):
        try: s.sendto(b"x" * 1400, (sys.argv[1], 9))
        except OSError: pass
th = threading.Thread(target=blast); th.start()
time.sleep(0.5); during = p.sample(); th.join()
print(json.dumps({"names": names, "first": first, "during": during,
                  "describe": p.describe()}))
"""


def _probe_in(pair, side: str, dest: str, seconds: float = 1.0) -> dict:
    import json
    import sys
    r = subprocess.run(pair.cmd(side, [sys.executable, "-c", _SAMPLE, dest, seconds]),
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_shaper_on_the_interface_shows_a_queue_and_rate_limits(netns_pair):  # noqa: F811
    p = netns_pair
    subprocess.run(p.cmd("a", ["tc", "qdisc", "replace", "dev", p.veth_a, "root", "tbf",
                               "rate", "5mbit", "burst", "4kb", "latency", "50ms"]), check=True)
    got = _probe_in(p, "a", p.ip_b)
    ch = {n: i for i, n in enumerate(got["names"])}
    pre = f"network.{p.veth_a}."
    assert {pre + f for f in ("qdisc_backlog", "qdisc_drops", "qdisc_overlimits")} <= set(ch)
    assert not any(n.startswith("network.lo.") for n in ch)
    d = got["during"]
    assert d[ch[pre + "qdisc_overlimits"]] > got["first"][ch[pre + "qdisc_overlimits"]]
    assert d[ch[pre + "qdisc_drops"]] > 0
    # the other end has no shaper: nothing waits there
    other = _probe_in(p, "b", p.ip_a, 0.5)
    och = {n: i for i, n in enumerate(other["names"])}
    vb = f"network.{p.veth_b}."
    assert other["during"][och[vb + "qdisc_overlimits"]] == 0
    assert other["during"][och[vb + "qdisc_backlog"]] == 0


def test_the_queue_channels_are_network_symptoms():
    names = ["network.eth0.qdisc_overlimits", "network.eth0.qdisc_backlog",
             "network.eth0.qdisc_requeues"]
    is_s, dirn, mins, _ = symptom_mask(names)
    assert list(is_s) == [True, True, False]   # requeues: a busy NIC driver, not a shaper
    assert list(dirn[:2]) == [1.0, 1.0] and all(mins[:2] > 0)


def test_a_truncated_or_foreign_dump_is_ignored_not_raised():
    assert parse_dump([b""]) == {}
    assert parse_dump([b"\x10\x00\x00\x00\x03\x00\x00\x00" + b"\0" * 8]) == {}   # DONE only
    assert parse_dump([b"\xff" * 7]) == {}


def test_a_probe_whose_socket_is_gone_reports_missing_values():
    q = QdiscProbe()
    q.open()
    if not q.available:
        pytest.skip(q.reason)
    q.close()
    assert all(v != v for v in q.sample())     # NaN, no exception
