"""Iteration markers: worker hook -> datagram -> launcher receiver -> iteration events."""
import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from reveal_plugins.torch_ext import markers  # noqa: E402


def test_iteration_events_one_per_step_when_steps_are_slow():
    ev = markers.iteration_events(3, 5, [10.0, 10.2, 10.5], prev_t=9.75)
    assert [(e["step"], round(e["dt"], 6), e["rank"]) for e in ev] == \
        [(5, 0.25, 3), (6, 0.2, 3), (7, 0.3, 3)]
    assert all("n" not in e for e in ev)


def test_fast_steps_are_merged_with_mean_and_max():
    times = [1.0 + 0.01 * i for i in range(1, 31)]  # 30 steps of 10 ms, one of them slow
    times[14:] = [t + 0.05 for t in times[14:]]
    ev = markers.iteration_events(0, 1, times, prev_t=1.0)
    assert sum(e["n"] for e in ev) == 30 and ev[-1]["step"] == 30
    assert all(e["t"] in times for e in ev)
    assert max(e["dt_max"] for e in ev) == pytest.approx(0.06)
    total = sum(e["dt"] * e["n"] for e in ev)
    assert total == pytest.approx(times[-1] - 1.0)
    assert len(ev) <= 4  # at most one event per MIN_EVENT_SPAN_S of training


def test_first_step_without_previous_boundary_has_no_event():
    ev = markers.iteration_events(0, 1, [5.0, 5.5], prev_t=None)
    assert [(e["step"], e["dt"]) for e in ev] == [(2, 0.5)]


def test_malformed_datagrams_are_rejected_with_a_reason():
    with pytest.raises(ValueError, match="separator"):
        markers.decode(b"no header")
    with pytest.raises(ValueError, match="rank/first_step"):
        markers.decode(b'{"x":1}\0')
    with pytest.raises(ValueError, match="float64"):
        markers.decode(b'{"rank":0,"first_step":1}\0abc')


def test_instrument_outside_the_launcher_is_a_noop(monkeypatch):
    monkeypatch.delenv(markers.ENV_SOCK, raising=False)
    assert markers.instrument() is False
    from torch.optim.optimizer import _global_optimizer_post_hooks
    assert not _global_optimizer_post_hooks


def test_optimizer_steps_reach_the_receiver_as_iteration_events(tmp_path, monkeypatch):
    got = []
    recv = markers.MarkerReceiver(str(tmp_path / "m.sock"), got.extend).start()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    try:
        assert markers.instrument(sock_path=recv.path) is True
        assert markers.instrument(sock_path=recv.path) is True  # idempotent
        p = torch.nn.Parameter(torch.zeros(3))
        opt = torch.optim.SGD([p], lr=0.1)
        other = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        for _ in range(12):
            p.grad = torch.ones(3)
            opt.step()
            other.step()  # a second optimizer does not double the iterations
            time.sleep(0.03)
    finally:
        markers.uninstrument()
        time.sleep(0.1)
        recv.close()
    its = [e for e in got if e["event"] == "iteration"]
    assert its and all(e["rank"] == 1 for e in its)
    assert sum(e.get("n", 1) for e in its) == 11 and its[-1]["step"] == 12
    assert all(0.02 < e["dt"] < 1.0 for e in its)
    assert recv.steps == 12 and recv.dropped == 0


def test_env_variable_installs_markers_without_code_change(tmp_path):
    """The worker bootstrap: REVEAL_ITERATION_MARKERS=1 + the launcher's sitecustomize."""
    from reveal_plugins.torch_ext.launcher import BOOTSTRAP
    boot = tmp_path / "boot"
    boot.mkdir()
    (boot / "sitecustomize.py").write_text(BOOTSTRAP)
    got = []
    recv = markers.MarkerReceiver(str(tmp_path / "m.sock"), got.extend).start()
    script = ("import sys; assert 'torch' not in sys.modules, 'bootstrap imported torch early'\n"
              "import torch\n"
              "p = torch.nn.Parameter(torch.zeros(2)); o = torch.optim.SGD([p], lr=0.1)\n"
              "for _ in range(5):\n"
              "    p.grad = torch.ones(2); o.step()\n")
    orig = tmp_path / "orig"  # a site's own sitecustomize must still run
    orig.mkdir()
    ran = tmp_path / "orig-ran"
    (orig / "sitecustomize.py").write_text(f"open({str(ran)!r}, 'w').close()\n")
    env = {**os.environ, markers.ENV_AUTO: "1", markers.ENV_SOCK: recv.path,
           "PYTHONPATH": os.pathsep.join([str(boot), str(orig),
                                          os.environ.get("PYTHONPATH", "")])}
    try:
        r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "sitecustomize" not in r.stderr, r.stderr
        time.sleep(0.2)
    finally:
        recv.close()
    assert recv.steps == 5
    assert ran.exists(), "the shadowed sitecustomize did not run"


class FakeNvml:
    """Stands in for pynvml where no NVIDIA GPU exists (CI): two GPUs, PIDs per GPU."""

    def __init__(self, procs_by_gpu):
        self.procs_by_gpu = procs_by_gpu
        self.shutdown = False

    def nvmlDeviceGetCount(self):
        return len(self.procs_by_gpu)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        from types import SimpleNamespace
        return [SimpleNamespace(pid=p, usedGpuMemory=1 << 30) for p in self.procs_by_gpu[h]]

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h:04d}".encode()

    def nvmlShutdown(self):
        self.shutdown = True


def test_gpu_mapper_reports_each_worker_gpu_once_when_it_appears():
    from reveal_plugins.torch_ext.gpus import GpuMapper
    fake = FakeNvml([[], []])
    found = []
    m = GpuMapper(lambda info, gpus: found.append((info["rank"], gpus)), poll_s=3600,
                  loader=lambda: fake)
    m.track(101, {"rank": 0})
    m.track(102, {"rank": 1})
    m.poll_once()
    assert found == []            # no CUDA context yet
    fake.procs_by_gpu[1] = [102, 999]
    m.poll_once()
    fake.procs_by_gpu[0] = [101]
    m.poll_once()
    m.poll_once()                 # reported once only
    assert found == [(1, [{"gpu": 1, "gpu_uuid": "GPU-0001"}]),
                     (0, [{"gpu": 0, "gpu_uuid": "GPU-0000"}])]
    m.close()
    assert fake.shutdown


def test_gpu_mapper_without_nvml_does_nothing():
    from reveal_plugins.torch_ext.gpus import GpuMapper
    calls = []
    m = GpuMapper(lambda *a: calls.append(a), loader=lambda: None)
    m.track(1, {"rank": 0})
    m.poll_once()
    m.close()
    assert calls == [] and m._thread is None
