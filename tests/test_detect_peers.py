"""Peer comparison on synthetic per-node frames (prepared channels, the names the real probes
and derived metrics use): the node that moved is found for 2, 4 and 64 nodes; a change all
nodes share, a rank's permanent offset and the waiting of the healthy nodes are no suspect."""
import numpy as np
import pytest

from reveal_plugins.detect.peers.nodes import NodeSeries, compare, settings

T0 = 1.7e9
IV = 0.1
GiB_kB = 1024 * 1024

CHANNELS = [("cpu.all.busy_pct", "%"), ("cpu.foreign.cores", "cores"),
            ("cpu.run.usage", "s/s"), ("cpu.procs_running", "tasks"),
            ("network.eth0.tx_bytes", "bytes/s"), ("network.tcp.RetransSegs", "count/s"),
            ("storage.psi.some_total", "us/s"), ("memory.MemAvailable", "kB"),
            ("memory.foreign.used", "bytes")]


def frames(n, seconds=120.0, fault=None, common=None, offset_rank0=False, seed=0,
           skew_s=0.7):
    """``n`` nodes of one synchronous job.  ``fault = (node, kind, start, end)`` with kind
    cpu|net|mem|io; ``common = (kind, start, end)`` hits every node at once.  The healthy
    nodes wait for a faulty one (their CPU share and traffic fall): the straggler effect."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        t0 = T0 + rng.uniform(0, skew_s)           # nodes start at slightly different times
        t = t0 + np.arange(int(seconds / IV)) * IV
        rel = t - T0
        x = {
            "cpu.all.busy_pct": 92 + rng.normal(0, 2, len(t)),
            "cpu.foreign.cores": 0.02 + np.abs(rng.normal(0, 0.01, len(t))),
            "cpu.run.usage": 0.9 + rng.normal(0, 0.03, len(t)),
            "cpu.procs_running": 1.5 + rng.normal(0, 0.4, len(t)),
            "network.eth0.tx_bytes": 20e6 * (1 + 0.2 * np.sin(rel)) + rng.normal(0, 1e6, len(t)),
            "network.tcp.RetransSegs": np.abs(rng.normal(0, 0.3, len(t))),
            "storage.psi.some_total": np.abs(rng.normal(2000, 1000, len(t))),
            "memory.MemAvailable": 20 * GiB_kB + rng.normal(0, 2e4, len(t)),
            "memory.foreign.used": 3e8 + rng.normal(0, 2e6, len(t)),
        }
        if offset_rank0 and i == 0:                # rank 0 always does a bit more
            x["cpu.all.busy_pct"] += 5
            x["network.eth0.tx_bytes"] *= 1.3
            x["cpu.foreign.cores"] += 0.05
        # the job's own phase: every 30 s an eval loop, on all nodes together
        ev = (rel % 30) > 25
        x["cpu.all.busy_pct"][ev] -= 30
        x["network.eth0.tx_bytes"][ev] *= 0.1
        for spec, who in ((fault, fault and fault[0]), (common and (None, *common), i)):
            if not spec:
                continue
            _, kind, a, b = spec
            on = (rel >= a) & (rel < b)
            if who == i:
                if kind == "cpu":
                    x["cpu.foreign.cores"][on] += 0.5
                    x["cpu.run.usage"][on] -= 0.45
                    x["cpu.all.busy_pct"][on] = 99.5
                elif kind == "net":
                    x["network.tcp.RetransSegs"][on] += 40
                elif kind == "mem":
                    x["memory.MemAvailable"][on] -= 6 * GiB_kB
                    x["memory.foreign.used"][on] += 6 * 2 ** 30
                elif kind == "io":
                    x["storage.psi.some_total"][on] += 400_000
            if spec is fault and who != i:       # the others wait for the slow node
                x["cpu.run.usage"][on] -= 0.3
                x["cpu.all.busy_pct"][on] -= 25
            if spec is fault or spec is not fault:
                x["network.eth0.tx_bytes"][on] *= 0.5
        X = np.stack([x[c] for c, _ in CHANNELS], axis=1).astype(np.float32)
        out.append(NodeSeries(f"node{i:02d}", t, X, [c for c, _ in CHANNELS],
                              [u for _, u in CHANNELS], rank=i))
    return out


def suspects(res):
    return [(s["node"], s["subsystem"]) for s in res.suspects]


@pytest.mark.parametrize("n", [2, 4, 64])
def test_cpu_hog_on_one_node_is_found(n):
    res = compare(frames(n, fault=(n - 1, "cpu", 50, 80)))
    assert suspects(res) == [(f"node{n - 1:02d}", "cpu")], res.suspects
    sp = res.suspects[0]
    assert 47 <= sp["start"] - T0 <= 54 and 76 <= sp["end"] - T0 <= 84, sp
    ev = {e["channel"]: e for e in sp["evidence"]}
    assert ev["cpu.foreign.cores"]["observed"] > 0.4 > ev["cpu.foreign.cores"]["peers"]
    assert sp["rank"] == n - 1 and sp["peers_compared"] == n - 1
    assert [x["node"] for x in res.nodes if x["suspect"]] == [f"node{n - 1:02d}"]


@pytest.mark.parametrize("kind,sub", [("net", "network"), ("mem", "memory"),
                                      ("io", "storage")])
def test_subsystem_of_the_suspect(kind, sub):
    res = compare(frames(5, fault=(2, kind, 40, 70), seed=3))
    assert suspects(res) == [("node02", sub)], res.suspects


def _with_foreign_reads(nodes, node, spans, rate=9e6):
    """Add ``storage.foreign.read_bytes``: a few kB/s everywhere, ``rate`` on ``node`` in
    ``spans`` (seconds after T0)."""
    rng = np.random.default_rng(7)
    out = []
    for i, s in enumerate(nodes):
        col = np.abs(rng.normal(2e3, 1e3, len(s.t)))
        if i == node:
            for a, b in spans:
                col[(s.t - T0 >= a) & (s.t - T0 < b)] += rate
        out.append(NodeSeries(s.node, s.t, np.column_stack([s.X, col]).astype(np.float32),
                              s.names + ["storage.foreign.read_bytes"], s.units + ["bytes/s"],
                              rank=s.rank))
    return out


def test_a_cpu_hog_that_read_its_binary_first_is_cpu_one_reading_throughout_is_storage():
    # stress-ng starting on a cold page cache: 9 MB/s from disk for 2 s, then 30 s of spinning
    hog = _with_foreign_reads(frames(2, fault=(1, "cpu", 50, 80)), 1, [(50, 52)])
    assert suspects(compare(hog)) == [("node01", "cpu")]
    reader = _with_foreign_reads(frames(2, fault=(1, "cpu", 50, 80)), 1, [(50, 80)])
    assert suspects(compare(reader)) == [("node01", "storage")]


def _iterations(series, slow=None, dt=0.2):
    """Every node's iteration markers, ``dt`` apart; ``slow = (start, end, factor)``."""
    out = []
    for s in series:
        t, evs = s.t[0], []
        while t < s.t[-1]:
            d = dt * (slow[2] if slow and slow[0] <= t - T0 < slow[1] else 1.0)
            d *= 1 + 0.02 * np.sin(t)
            t += d
            evs.append({"event": "iteration", "t": float(t), "dt": float(d), "n": 1})
        out.append(NodeSeries(s.node, s.t, s.X, s.names, s.units, events=evs, rank=s.rank))
    return out


def test_symptoms_alone_while_the_iterations_kept_their_pace_are_no_suspect():
    # a node's retransmissions rose and nothing on it caused them: with markers that say the
    # job ran as fast as ever, no node is named (a healthy link's bursts); when it slowed, it is
    series = frames(2, fault=(1, "net", 50, 80), seed=5)
    res = compare(_iterations(series))
    assert suspects(res) == [] and res.analysis["symptoms_without_slowdown"] == 1, res.suspects
    assert any("did not slow" in n for n in res.notes)
    res = compare(_iterations(series, slow=(50, 80, 1.4)))
    assert suspects(res) == [("node01", "network")], res.suspects
    assert res.suspects[0]["impact"]["iteration_time_pct"] > 30
    # a cause on the node (foreign CPU) is named whatever the markers say
    hog = frames(2, fault=(1, "cpu", 50, 80), seed=5)
    assert suspects(compare(_iterations(hog))) == [("node01", "cpu")]


def test_two_nodes_the_one_that_moved():
    """With 2 nodes each is the other's only peer: the residuals are mirror images.  The
    healthy node's CPU share fell too (it waited); the hogged one is the one whose own signals
    moved in the harmful direction."""
    for victim in (0, 1):
        res = compare(frames(2, fault=(victim, "cpu", 60, 90), seed=victim + 7))
        assert suspects(res) == [(f"node{victim:02d}", "cpu")], res.suspects


@pytest.mark.parametrize("n", [2, 6])
def test_common_mode_is_no_suspect(n):
    """Storage pressure on every node at once (a filesystem-wide slowdown)."""
    res = compare(frames(n, common=("io", 40, 70), seed=11))
    assert res.suspects == [], res.suspects


def test_shared_episode_named_from_the_nodes_own_findings():
    nodes = frames(3, common=("io", 40, 70), seed=12)
    own = {s.node: [{"start": T0 + 41 + k, "end": T0 + 69, "subsystem": "storage"}]
           for k, s in enumerate(nodes)}
    res = compare(nodes, node_anomalies=own)
    assert res.suspects == []
    assert len(res.shared) == 1 and res.shared[0]["subsystem"] == "storage"
    assert res.shared[0]["nodes"] == [s.node for s in nodes]


@pytest.mark.parametrize("n,seed", [(2, 1), (3, 2), (8, 3), (32, 4)])
def test_clean_job_with_phases_and_a_busier_rank0_has_no_suspect(n, seed):
    res = compare(frames(n, seed=seed, offset_rank0=True))
    assert res.suspects == [], res.suspects
    assert res.analysis["windows_compared"] > 80


def test_too_short_or_single_node_says_why():
    assert "at least 2" in compare(frames(1)).notes[0]
    res = compare(frames(2, seconds=12))
    assert res.suspects == [] and ("short" in res.notes[0] or "steady" in res.notes[0])


def test_bad_setting_names_the_key():
    with pytest.raises(ValueError, match="thresold"):
        settings({"thresold": 3})
    with pytest.raises(ValueError, match="min_z"):
        settings({"min_z": -1})


# -- live: every node publishes its recent blocks, compares itself with its peers ------------

def _live_nodes(tmp_path, n, key="job-42"):
    from reveal_plugins.detect.live.peers import for_run
    from reveal_plugins.store import store
    from reveal_plugins.types import RunInfo
    out = []
    for i in range(n):
        d = tmp_path / "jobs" / "42" / f"node{i:02d}"
        d.mkdir(parents=True)
        store.write_meta(str(d), {"schema": "reveal.run/1", "channels": [], "start": T0,
                                  "run": {"run_id": key, "job_id": "42"}})
        out.append(for_run(RunInfo(run_id=key, run_dir=str(d), source="slurm")))
    return out


def _replay(lives, series, t_from, t_to, step=2.0):
    """Drive the nodes as the agents' live loops do (publish, then compare, every 2 s) and
    return [(time of the check, suspect)]."""
    found = []
    for now in np.arange(t_from, t_to, step):
        for lv, s in zip(lives, series):
            sel = (s.t <= T0 + now) & (s.t > T0 + now - 120)
            its = [(e["t"], e["dt"], e["n"]) for e in s.events if e["t"] <= T0 + now]
            lv.publish(s.t[sel], s.X[sel], s.names, s.units, iterations=its)
        for lv in lives:
            found += [(now, sp) for sp in lv.check(now=T0 + now)]
    return found


def test_live_names_the_suspect_within_10_s_of_onset(tmp_path):
    onset = 70.0
    series = frames(3, seconds=110, fault=(1, "cpu", onset, 100), seed=21)
    lives = _live_nodes(tmp_path, 3)
    found = _replay(lives, series, 20, 100)
    assert found, "no live suspect"
    first_t, sp = found[0]
    assert sp["node"] == "node01" and sp["subsystem"] == "cpu" and sp["live"] is True
    assert first_t - onset <= 10.0, first_t - onset
    assert {s["node"] for _, s in found} == {"node01"}
    # each checking node names it once for the episode, not every 2 s
    assert len(found) <= len(lives), [(t, s["node"]) for t, s in found]


def test_live_a_cpu_hog_that_read_its_binary_first_is_cpu(tmp_path):
    """Named live, ~10 s after onset, the hog's 2-s cold read is a third of the span so far
    (at job end a tenth): it must not name the suspect ``storage`` then either."""
    onset = 70.0
    series = _with_foreign_reads(frames(3, seconds=110, fault=(1, "cpu", onset, 100), seed=21),
                                 1, [(onset, onset + 2)])
    found = _replay(_live_nodes(tmp_path, 3), series, 20, 100)
    assert found and {(s["node"], s["subsystem"]) for _, s in found} == {("node01", "cpu")}, \
        [(t, s["node"], s["subsystem"]) for t, s in found]


def test_live_symptoms_alone_need_the_job_to_have_slowed(tmp_path):
    # the markers travel with the published blocks: a node's retransmissions while the job
    # kept its pace are not named live either; the same while it slowed are
    series = frames(2, seconds=100, fault=(1, "net", 60, 90), seed=24)
    assert _replay(_live_nodes(tmp_path / "a", 2), _iterations(series), 20, 95) == []
    found = _replay(_live_nodes(tmp_path / "b", 2), _iterations(series, slow=(60, 90, 1.4)),
                    20, 95)
    assert found and {s["node"] for _, s in found} == {"node01"}, found
    assert found[0][0] - 60 <= 10


def test_live_clean_job_names_no_one(tmp_path):
    series = frames(3, seconds=110, seed=22, offset_rank0=True)
    lives = _live_nodes(tmp_path, 3)
    assert _replay(lives, series, 20, 108) == []


def test_live_leaves_out_stale_and_foreign_files(tmp_path):
    series = frames(2, seconds=60, fault=(1, "cpu", 40, 55), seed=23)
    lives = _live_nodes(tmp_path, 2)
    other = _live_nodes(tmp_path / "x", 1, key="another-job")[0]
    sel = series[1].t <= T0 + 50
    other.publish(series[1].t[sel], series[1].X[sel], series[1].names, series[1].units)
    other.run_dir = str(tmp_path / "jobs" / "42" / "zz")     # a different job's file in the dir
    os = __import__("os")
    os.makedirs(other.run_dir)
    other.publish(series[1].t[sel], series[1].X[sel], series[1].names, series[1].units)
    lives[0].publish(series[0].t[series[0].t <= T0 + 50], series[0].X[series[0].t <= T0 + 50],
                     series[0].names, series[0].units)
    assert lives[0].check(now=T0 + 50) == []          # its only same-job peer has no file yet


def test_otel_peer_finding_on_the_job_span_and_live_span_in_the_jobs_trace():
    from reveal_plugins.otel.trace import build_peer_spans, build_spans
    from reveal_plugins.detect.peers.job import annotate
    rep = {"schema": "reveal.report/1", "status": "ok", "anomalies": [], "summary": "",
           "telemetry": {"interval_s": 0.1, "samples": 1, "channels": 1, "probes": []},
           "run": {"source": "slurm", "job_id": "77", "start": T0, "end": T0 + 100,
                   "nodes": ["n1"]}}
    sp = {"id": "P1", "node": "n1", "rank": 3, "subsystem": "network", "start": T0 + 20,
          "end": T0 + 40, "score": 9.0, "hints": [],
          "evidence": [{"channel": "network.tcp.RetransSegs", "deviation": 9.0,
                        "observed": 40.0, "peers": 0.2}]}
    annotate(rep, {"nodes": [{"node": "n0"}, {"node": "n1"}], "suspects": [sp],
                   "summary": "Peers: node n1"}, {"node": "n1", "suspect": True}, "77")
    root = build_spans(rep, {"run": {"host": "n1", "job_id": "77", "source": "slurm"}})[0]
    assert root.attributes["reveal.peers.suspect"] is True
    assert list(root.attributes["reveal.peers.suspect_nodes"]) == ["n1"]
    ev = [e for e in root.events if e.name == "peer_suspect"]
    assert len(ev) == 1 and ev[0].attributes["reveal.peer.rank"] == 3
    assert list(ev[0].attributes["reveal.peer.evidence.peers"]) == [0.2]
    live = build_peer_spans(dict(sp, live=True, detected_at=T0 + 26, peers_compared=1),
                            {"run_id": "x", "source": "slurm", "job_id": "77", "host": "n1"})
    assert live[0].context.trace_id == root.context.trace_id        # the job's trace
    assert live[0].events[0].name == "peer_suspect"


def test_iteration_tail_reads_on_from_where_it_stopped(tmp_path):
    from reveal_plugins.detect.live.peers import IterationTail
    p = tmp_path / "events.jsonl"
    p.write_text('{"event": "run_start", "t": 1}\n{"event": "iteration", "t": 2, "dt": 0.1, "n": 3}\n'
                 '{"event": "iteration", "t": 3, "dt"')          # a line still being written
    tail = IterationTail(str(p))
    assert tail.poll() == [(2.0, 0.1, 3.0)]
    with open(p, "a") as f:
        f.write(': 0.2}\nnot json "iteration"\n{"event": "iteration", "t": 4, "dt": -1}\n')
    assert tail.poll() == [(2.0, 0.1, 3.0), (3.0, 0.2, 1.0)]   # garbage and dt <= 0 left out
    p.write_text('{"event": "iteration", "t": 9, "dt": 0.5}\n')   # replaced by a shorter file
    assert tail.poll()[-1] == (9.0, 0.5, 1.0)
    link = tmp_path / "link.jsonl"
    link.symlink_to(p)
    assert IterationTail(str(link)).poll() == []                 # never through a symlink
