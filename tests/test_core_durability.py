"""Crash-safety of the write path (issue 13): every file of a run directory is fsynced before
it is renamed into place and the directory after, and ``meta.json`` is never seen empty or
partial by a reader, whoever writes it and how often."""
import json
import os
import re
import shutil
import subprocess
import sys
import threading

import pytest

from reveal_plugins.store import store

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WRITE = """
import sys
import numpy as np
sys.path.insert(0, {root!r})
from reveal_plugins.store import store
from reveal_plugins.types import ChannelMeta
d = sys.argv[1]
store.write_meta(d, {{"channels": []}})
w = store.SegmentWriter(d, [ChannelMeta("cpu.x", "%", "gauge", "t")], segment_s=1.0)
for k in range(5):
    w.add(float(k), np.array([float(k)]))
w.flush()
"""
# strace -y: fsync(4</path/.name.123.0.tmp>) = 0 / renameat(3</dir>, "src", 3</dir>, "dst") = 0
FSYNC = re.compile(r'f(?:data)?sync\(\d+<([^>]*)>\)\s+= 0')
RENAME = re.compile(r'rename(?:at2?)?\((?:\d+<([^>]*)>, )?"([^"]+)", (?:\d+<[^>]*>, )?"([^"]+)"')


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace not installed (.ci/run)")
def test_file_synced_before_rename_and_directory_after(tmp_path):
    out = tmp_path / "trace"
    subprocess.run(["strace", "-f", "-y", "-o", str(out), "-e",
                    "trace=fsync,fdatasync,rename,renameat,renameat2",
                    sys.executable, "-c", WRITE.format(root=ROOT), str(tmp_path)],
                   check=True, capture_output=True, timeout=120)
    events = []     # ("fsync", path) / ("rename", dir, src, dst), in order
    for line in out.read_text().splitlines():
        if m := FSYNC.search(line):
            events.append(("fsync", m.group(1)))
        elif m := RENAME.search(line):
            if " = 0" in line:
                events.append(("rename", m.group(1), m.group(2), m.group(3)))
    renames = [(i, e) for i, e in enumerate(events) if e[0] == "rename"]
    finals = {os.path.basename(e[3]) for _, e in renames}
    assert {"meta.json", "seg-000001.parquet"} <= finals, events
    for i, (_, d, src, dst) in renames:
        d = d or os.path.dirname(dst)
        tmp = os.path.join(d, os.path.basename(src))
        assert ("fsync", tmp) in events[:i], f"{dst}: not fsynced before its rename: {events}"
        assert ("fsync", d) in events[i + 1:], f"{d}: directory not fsynced after {dst}"


def test_meta_never_seen_empty_during_1000_rewrites(tmp_path):
    """Two writers (the agent writes meta.json from its server and its finishing threads)
    rewrite a realistic meta.json 1,000 times while a reader reads it continuously."""
    d = str(tmp_path)
    chans = [{"name": f"cpu.core{i}.user", "unit": "ticks", "kind": "counter",
              "probe": "procfs.stat", "description": "x" * 40} for i in range(700)]
    store.write_meta(d, {"channels": chans, "n": -1})
    stop = threading.Event()
    bad: list[str] = []
    errors: list[BaseException] = []
    reads = [0]

    def reader():
        path = os.path.join(d, "meta.json")
        while not stop.is_set():
            with open(path, "rb") as f:
                data = f.read()
            try:
                meta = json.loads(data)
                assert len(meta["channels"]) == 700
            except (ValueError, AssertionError, KeyError) as e:
                bad.append(f"{len(data)} bytes: {type(e).__name__}")
            reads[0] += 1

    def writer(k0):
        try:
            for k in range(k0, 1000, 2):
                store.write_meta(d, {"channels": chans, "n": k})
        except BaseException as e:  # noqa: BLE001 -- reported below
            errors.append(e)

    r = threading.Thread(target=reader)
    r.start()
    ws = [threading.Thread(target=writer, args=(k,)) for k in (0, 1)]
    for w in ws:
        w.start()
    for w in ws:
        w.join()
    stop.set()
    r.join()
    assert not errors, errors
    assert not bad, f"{len(bad)} of {reads[0]} reads saw a broken meta.json: {bad[:5]}"
    assert reads[0] > 100
    assert store.read_meta(d)["n"] in (998, 999)
    assert [n for n in os.listdir(d) if n.endswith(".tmp")] == []
