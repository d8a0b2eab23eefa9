"""The qdisc probe on a real veth between two network namespaces, with a real tc shaper."""
import json
import subprocess
import sys

import pytest

from reveal_plugins.detect.evidence.attribution import symptom_mask
from reveal_plugins.probes.qdisc import QdiscProbe, parse_dump

from fixtures_netns import netns_pair  # noqa: F401  (fixture)

_SAMPLE = r"""
import json, socket, sys, threading, time
from reveal_plugins.probes.qdisc import QdiscProbe
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


def test_an_ingress_policer_drops_count_as_the_nodes_drops(netns_pair):  # noqa: F811
    p = netns_pair
    add = [["tc", "qdisc", "add", "dev", p.veth_b, "ingress"],
           ["tc", "filter", "add", "dev", p.veth_b, "parent", "ffff:", "matchall", "action",
            "police", "rate", "1mbit", "burst", "10k", "drop"]]
    for c in add:
        r = subprocess.run(p.cmd("b", c), capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"kernel without ingress policing ({' '.join(c[:4])}): {r.stderr.strip()}")
    before = _probe_in(p, "b", p.ip_a, 0.2)
    subprocess.run(p.cmd("a", [sys.executable, "-c", "import socket,time\n"
                               "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);t=time.time()\n"
                               "while time.time()-t<1: s.sendto(b'x'*1400,(%r,9))" % p.ip_b]),
                   check=True, timeout=30)
    after = _probe_in(p, "b", p.ip_a, 0.2)
    i = after["names"].index(f"network.{p.veth_b}.qdisc_drops")
    assert after["first"][i] > before["first"][i] + 100, (before["first"][i], after["first"][i])


def _qdisc_msg(ifindex: int, parent: int, kind: bytes, drops: int, overlimits: int,
               backlog: int = 0) -> bytes:
    """One RTM_NEWQDISC message as the kernel writes it (tcmsg, TCA_KIND, TCA_STATS2)."""
    import struct
    def rta(t, payload):
        raw = struct.pack("=HH", 4 + len(payload), t) + payload
        return raw + b"\0" * (-len(raw) % 4)
    queue = struct.pack("=5I", 0, backlog, drops, 0, overlimits)   # qlen backlog drops req ovl
    body = struct.pack("=BxxxiIII", 0, ifindex, 0, parent, 1) + rta(1, kind + b"\0") + rta(
        7, rta(3, queue))
    return struct.pack("=IHHII", 16 + len(body), 36, 2, 1, 0) + body


def test_ingress_drops_add_to_the_interfaces_drops_in_either_order():
    root = _qdisc_msg(3, 0xFFFFFFFF, b"tbf", drops=5, overlimits=7, backlog=3000)
    ingress = _qdisc_msg(3, 0xFFFFFFF1, b"ingress", drops=40, overlimits=0)
    child = _qdisc_msg(3, 0x80010001, b"bfifo", drops=99, overlimits=99)   # inside the tbf
    for order in ([root, ingress, child], [ingress, child, root]):
        q = parse_dump([b"".join(order)])[3]
        assert (q["kind"], q["drops"], q["overlimits"], q["backlog"]) == ("tbf", 45, 7, 3000)
