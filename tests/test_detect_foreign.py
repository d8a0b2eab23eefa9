"""Foreign load: what the node did that the run did not (node totals minus the run's own
accounting) is evidence of its own; the run's own phase changes, core migrations and worker
restarts are not.  Synthetic frames with the channel names the real probes write."""
import numpy as np
import pytest

from reveal_plugins.detect import pipeline
from reveal_plugins.detect.foreign import derive
from reveal_plugins.types import ChannelMeta

HZ = 100          # USER_HZ
IV = 0.1
T0 = 1.7e9
GiB = 1 << 30


def frame(seconds=150.0, cores=2, run_cores=None, foreign_cores=None, run_rss=None,
          foreign_mem=None, migrate=False, seed=0):
    """Cumulative counters of a node running one job.  Each ``*_cores``/``*_mem`` argument is
    a function of the time since start (s) -> level."""
    rng = np.random.default_rng(seed)
    n = int(seconds / IV)
    t = T0 + np.arange(n) * IV
    rel = t - T0
    rc = np.array([run_cores(x) for x in rel]) if run_cores else np.full(n, 1.0)
    fc = np.array([foreign_cores(x) for x in rel]) if foreign_cores else np.zeros(n)
    rss = np.array([run_rss(x) for x in rel]) if run_rss else np.full(n, 2.0 * GiB)
    fm = np.array([foreign_mem(x) for x in rel]) if foreign_mem else np.zeros(n)
    rc = np.clip(rc + rng.normal(0, 0.02, n), 0, cores)
    node = np.clip(rc + fc + 0.02 + rng.normal(0, 0.01, n), 0, cores)
    ch, cols = [], []

    def add(name, unit, kind, col):
        ch.append(ChannelMeta(name, unit, kind, "synth"))
        cols.append(col)

    busy_ticks = node * HZ * IV
    add("cpu.all.user", "ticks", "counter", np.cumsum(busy_ticks * 0.9))
    add("cpu.all.system", "ticks", "counter", np.cumsum(busy_ticks * 0.1))
    add("cpu.all.nice", "ticks", "counter", np.zeros(n))
    add("cpu.all.idle", "ticks", "counter", np.cumsum((cores - node) * HZ * IV))
    add("cpu.all.iowait", "ticks", "counter", np.zeros(n))
    # per core: the load moves between cores (migration) or stays put
    share = np.zeros((n, cores))
    for i in range(n):
        k = (i // 20) % cores if migrate else 0
        rest = node[i]
        for c in [k] + [c for c in range(cores) if c != k]:
            share[i, c] = min(1.0, rest)
            rest -= share[i, c]
    for c in range(cores):
        add(f"cpu.core{c}.user", "ticks", "counter", np.cumsum(share[:, c] * HZ * IV))
        add(f"cpu.core{c}.idle", "ticks", "counter", np.cumsum((1 - share[:, c]) * HZ * IV))
        add(f"cpu.core{c}.system", "ticks", "counter", np.zeros(n))
    add("cpu.run.usage", "s", "counter", np.cumsum(rc * IV))
    add("cpu.run.user", "s", "counter", np.cumsum(rc * IV * 0.9))
    add("cpu.run.system", "s", "counter", np.cumsum(rc * IV * 0.1))
    total = 24 * GiB
    used = rss * 0.8 + fm + 1.5 * GiB + rng.normal(0, 2e6, n)     # shared pages: RSS > own
    add("memory.MemTotal", "kB", "gauge", np.full(n, total / 1024))
    add("memory.MemAvailable", "kB", "gauge", (total - used) / 1024)
    add("memory.run.rss", "bytes", "gauge", rss)
    add("cpu.procs_running", "tasks", "gauge", np.round(node + 0.5))
    return t, np.stack(cols, axis=1), ch


def run(t, v, ch, **cfg):
    return pipeline.detect(t, v, ch, {"host": "h"}, [], cfg)


def test_derive_node_minus_run():
    t, v, ch = frame(foreign_cores=lambda x: 1.0 if 60 <= x < 80 else 0.0)
    from reveal_plugins.detect.prepare import prepare
    P = prepare(t, v, ch, drop=False)
    fc = P.X[:, P.names.index("cpu.foreign.cores")]
    rel = t - T0
    assert abs(np.nanmedian(fc[(rel > 62) & (rel < 78)]) - 1.0) < 0.1
    assert abs(np.nanmedian(fc[(rel > 90)])) < 0.1
    fm = P.X[:, P.names.index("memory.foreign.used")]
    assert np.isfinite(fm).all()


def test_foreign_core_on_idle_core_is_a_cpu_anomaly_with_hint():
    """A one-core hog on the idle core of a 2-core node: no pressure, no slowdown of a
    single-threaded job -- only the node doing what the job does not."""
    t, v, ch = frame(foreign_cores=lambda x: 1.0 if 60 <= x < 80 else 0.0)
    det = run(t, v, ch)
    assert len(det.anomalies) == 1, (det.anomalies, det.observations)
    a = det.anomalies[0]
    assert a["subsystem"] == "cpu" and "foreign" in a["families"]
    assert 57 <= a["start"] - T0 <= 63 and 77 <= a["end"] - T0 <= 84
    assert a["evidence"][0]["channel"] == "cpu.foreign.cores"
    assert a["foreign"]["source"] == "processes in no registered run"
    h = a["hints"][0]
    assert h["rule"] == "foreign_load" and "core" in h["why"] and "--exclusive" in h["action"]


def test_foreign_memory_is_a_memory_anomaly():
    t, v, ch = frame(foreign_mem=lambda x: 0.6 * GiB if 70 <= x < 90 else 0.0)
    det = run(t, v, ch)
    assert [a["subsystem"] for a in det.anomalies] == ["memory"], det.anomalies
    assert det.anomalies[0]["evidence"][0]["channel"] == "memory.foreign.used"


def test_jobs_own_phase_change_is_not_foreign():
    """An eval phase: the job drops to 0.3 core for 20 s and back; the node follows."""
    t, v, ch = frame(run_cores=lambda x: 0.3 if 60 <= x < 80 else 1.0)
    det = run(t, v, ch)
    assert not [a for a in det.anomalies if "foreign" in a.get("families", [])]
    assert det.anomalies == [], det.anomalies


def test_worker_exit_is_not_foreign_memory():
    """DataLoader workers exit: the run's summed RSS drops by 1 GiB (shared pages counted in
    each worker) while the node frees only part of it; foreign memory did not appear."""
    t, v, ch = frame(run_rss=lambda x: 1.0 * GiB if 60 <= x < 70 else 2.0 * GiB)
    det = run(t, v, ch)
    assert not [a for a in det.anomalies if a["subsystem"] == "memory"], det.anomalies


@pytest.mark.parametrize("cores", [2, 128])
def test_core_migration_is_no_anomaly_and_cores_do_not_multiply_channels(cores):
    """A single-threaded job that the kernel moves between cores every 2 s: per-core channels
    swing, totals do not.  On a replayed 128-core frame nothing is found either, and the
    number of modelled channels does not grow with the cores (aggregates only)."""
    t, v, ch = frame(cores=cores, migrate=True, seconds=120)
    det = run(t, v, ch)
    assert det.anomalies == [], det.anomalies
    assert det.analysis["channels_analysed"] <= 30, det.analysis


def test_foreign_load_found_live():
    from reveal_plugins.detect.live import LiveAnalyzer
    t, v, ch = frame(foreign_cores=lambda x: 1.0 if 80 <= x < 100 else 0.0)
    la = LiveAnalyzer(ch, IV, {})
    found = []
    for a in range(0, len(t), 20):
        found += la.update(t[a:a + 20], v[a:a + 20])
    assert found and found[0]["subsystem"] == "cpu", found
    assert 0 <= found[0]["detected_at"] - (T0 + 80) <= 6
    assert found[0]["foreign"]["support"][0]["channel"] == "cpu.foreign.cores"


def test_neighbour_arriving_after_startup_is_not_startup():
    """Start-up activity of the job runs into a neighbour that arrives later: the merged event
    begins inside the start-up grace, yet the foreign load began after it -- an anomaly."""
    t, v, ch = frame(run_cores=lambda x: 1.8 if x < 16 else 1.0,
                     foreign_cores=lambda x: 1.0 if 18 <= x < 40 else 0.0, cores=4)
    det = run(t, v, ch)
    assert [a["subsystem"] for a in det.anomalies] == ["cpu"], (det.anomalies,
                                                                  det.observations)
    assert "foreign" in det.anomalies[0]["families"]
