"""Two network namespaces joined by a veth (``examples/netns_pair.sh``): two "hosts" on one
machine for multi-node tests (torchrun rendezvous over TCP, slow-network scenarios).

``netns_pair`` creates a pair with a name prefix and /24 unique to this test process (so
parallel sessions never collide), yields a ``NetnsPair`` and deletes it afterwards.  It skips
(with the reason) when not root or when the kernel refuses network namespaces.
"""
import os
import pathlib
import random
import shutil
import subprocess
from dataclasses import dataclass

import pytest

NETNS_SCRIPT = pathlib.Path(__file__).resolve().parent.parent / "examples" / "netns_pair.sh"


@dataclass
class NetnsPair:
    prefix: str
    subnet: str
    ns_a: str
    ns_b: str
    ip_a: str
    ip_b: str
    veth_a: str
    veth_b: str

    @property
    def env(self) -> dict:
        return {**os.environ, "REVEAL_NETNS_PREFIX": self.prefix,
                "REVEAL_NETNS_SUBNET": self.subnet}

    def script(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run ``examples/netns_pair.sh ARGS`` for this pair (e.g. ``slow 10mbit``)."""
        return subprocess.run(["bash", str(NETNS_SCRIPT), *args], env=self.env, check=check,
                              capture_output=True, text=True, timeout=60)

    def cmd(self, side: str, argv: list) -> list:
        """argv prefixed to run inside namespace ``a`` or ``b``."""
        return ["ip", "netns", "exec", self.ns_a if side == "a" else self.ns_b, *map(str, argv)]


@pytest.fixture
def netns_pair():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if not shutil.which("ip") or not shutil.which("tc"):
        pytest.skip("iproute2 (ip, tc) not installed")
    tag = f"{os.getpid() % 100000}{random.randint(0, 99):02d}"
    prefix = f"rv{tag}"[:10]
    subnet = f"10.{random.randint(100, 250)}.{random.randint(1, 250)}"
    pair = NetnsPair(prefix, subnet, f"{prefix}-a", f"{prefix}-b", f"{subnet}.1", f"{subnet}.2",
                     f"{prefix}-va", f"{prefix}-vb")
    r = pair.script("up", check=False)
    if r.returncode != 0:
        pair.script("down", check=False)
        pytest.skip(f"cannot create network namespaces here: {r.stderr.strip()}")
    try:
        yield pair
    finally:
        pair.script("down", check=False)
