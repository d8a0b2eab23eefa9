"""A job's GPUs resolved to NVML devices, and foreign work on them, on the driver-level fake."""
import json
import os
import subprocess
import sys
import time

import pytest

pynvml = pytest.importorskip("pynvml")

from fixtures_nvml import FakeDriver, install_fake_nvml  # noqa: E402
from reveal_plugins.probes import gpu_ids  # noqa: E402
from reveal_plugins.probes.gpu_procs import GpuForeignProbe  # noqa: E402
from reveal_plugins.types import RunInfo  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def _devices(drv):
    pynvml.nvmlInit()
    try:
        return gpu_ids.list_devices(pynvml)
    finally:
        pynvml.nvmlShutdown()


def test_slurm_gres_indices_are_minor_numbers_not_nvml_indices():
    # minor numbers out of NVML (PCI) order, as on many HGX boards
    with install_fake_nvml(FakeDriver(gpus=4, minor_numbers=[2, 3, 0, 1])) as drv:
        devs = _devices(drv)
    r = gpu_ids.resolve(devs, "SLURM_JOB_GPUS", "0,1", slurm=True)
    assert r.indices == [2, 3]
    assert [d["minor"] for d in r.identities] == [0, 1]
    assert r.identities[0]["uuid"] == drv.gpus[2].uuid
    assert r.identities[0]["pci_bus_id"].endswith(drv.gpus[2].bus_id[-7:])


def test_cuda_visible_devices_by_uuid_pci_and_index():
    with install_fake_nvml(FakeDriver(gpus=8)) as drv:
        devs = _devices(drv)
    r = gpu_ids.resolve(devs, "CUDA_VISIBLE_DEVICES", f"{drv.gpus[6].uuid},{drv.gpus[1].uuid}")
    assert r.indices == [6, 1]
    r = gpu_ids.resolve(devs, "CUDA_VISIBLE_DEVICES", drv.gpus[4].bus_id)
    assert r.indices == [4]
    r = gpu_ids.resolve(devs, "CUDA_VISIBLE_DEVICES", "3")   # outside Slurm: PCI order
    assert r.indices == [3]


def test_job_local_cuda_indices_in_slurm_give_no_gpu_rather_than_a_wrong_one():
    with install_fake_nvml(FakeDriver(gpus=8)) as drv:
        devs = _devices(drv)
    r = gpu_ids.resolve(devs, "CUDA_VISIBLE_DEVICES", "0,1", slurm=True)
    assert r.indices == [] and "job-local" in r.note
    r = gpu_ids.resolve(devs, "CUDA_VISIBLE_DEVICES", "GPU-00000000-dead-beef-0000-000000000000")
    assert r.indices == [] and "matches no GPU" in r.note


def test_mig_instance_resolves_to_its_gpu_with_identity_and_a_plain_note():
    with install_fake_nvml(FakeDriver(gpus=2)) as drv:
        drv.gpus[1].set_mig(("3g.40gb", "3g.40gb"))
        devs = _devices(drv)
    mig_uuid = drv.gpus[1].mig_devices[1].uuid
    r = gpu_ids.resolve(devs, "CUDA_VISIBLE_DEVICES", mig_uuid)
    assert r.indices == [1]
    inst = r.identities[0]["mig_instances"][0]
    assert inst["uuid"] == mig_uuid and "gpu_instance" in inst
    assert "MIG" in r.note and "not measured" in r.note


def test_spec_from_env_prefers_slurm():
    env = {"SLURM_JOB_GPUS": "4,5", "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_ID": "7"}
    assert gpu_ids.spec_from_env(env) == {"source": "SLURM_JOB_GPUS", "value": "4,5",
                                          "slurm": True}
    assert gpu_ids.spec_from_env({}) is None


def test_foreign_processes_on_the_runs_gpus_counted_without_pids(tmp_path):
    me = os.getpid()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    stranger = os.getppid()   # our parent: on the node, not in the run's process tree
    try:
        with install_fake_nvml(FakeDriver(gpus=4)) as drv:
            drv.gpus[1].add_process(child.pid, mem_bytes=8 << 30, sm_util=60)      # the run's
            drv.gpus[2].add_process(stranger, mem_bytes=3 << 30, sm_util=40)   # not
            drv.gpus[3].add_process(stranger, mem_bytes=1 << 30)               # not ours
            run = RunInfo(run_id="r", run_dir=str(tmp_path), pids=[me], gpus=[1, 2])
            p = GpuForeignProbe(run)
            p.open()
            assert p.available, p.reason
            names = [c.name for c in p.channels]
            assert not any(n.startswith("gpu.3.") for n in names)   # not the run's GPU
            time.sleep(0.3)
            v = dict(zip(names, p.sample()))
            assert v["gpu.1.foreign_procs"] == 0 and v["gpu.1.foreign_mem"] == 0
            assert v["gpu.2.foreign_procs"] == 1 and v["gpu.2.foreign_mem"] == 3 << 30
            assert 0 < v["gpu.2.foreign_sm"] <= 100
            p.close()
    finally:
        child.kill()


def _fake_env(tmp_path, setup: str) -> dict:
    """A Python started with this env sees the fake driver under the real binding."""
    boot = tmp_path / "boot"
    boot.mkdir()
    (boot / "sitecustomize.py").write_text(
        "import sys\n"
        f"sys.path.insert(0, {HERE!r})\n"
        "from fixtures_nvml import FakeDriver, install_fake_nvml\n"
        f"{setup}\n"
        "_ctx = install_fake_nvml(d); _ctx.__enter__()\n")
    return dict(os.environ, PYTHONPATH=f"{boot}:{os.environ.get('PYTHONPATH', '')}".rstrip(":"))


@pytest.mark.slow
def test_reveal_record_gets_only_the_gpus_it_was_given(tmp_path):
    """`reveal record` with CUDA_VISIBLE_DEVICES naming two GPUs by UUID: meta.json has their
    identities and the recording has channels of those two GPUs only."""
    with install_fake_nvml(FakeDriver(gpus=8)) as drv:
        uuids = [drv.gpus[5].uuid, drv.gpus[2].uuid]
    env = _fake_env(tmp_path, "d = FakeDriver(gpus=8)\nfor g in d.gpus: g.busy()")
    env["CUDA_VISIBLE_DEVICES"] = ",".join(uuids)
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "reveal_plugins.cli", "record", "--no-analyze",
                        "--out", str(out), "--", "sleep", "3"],
                       capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    meta = json.loads((out / "meta.json").read_text())
    assert [g["index"] for g in meta["gpus"]] == [5, 2]
    assert [g["uuid"] for g in meta["gpus"]] == uuids
    assert meta["gpu_source"].startswith("CUDA_VISIBLE_DEVICES=")
    gpus = {c["name"].split(".")[1] for c in meta["channels"] if c["name"].startswith("gpu.")}
    assert gpus == {"2", "5"}
    from reveal_plugins.store import store
    frame = store.load_run(str(out)).frame
    col = frame.column("gpu.5.util_sm")
    assert (col[~(col != col)] == 95).all() and len(col) > 10


def test_foreign_processes_on_an_old_driver_without_v3_process_lists(tmp_path):
    with install_fake_nvml(FakeDriver(gpus=2, old_driver=True)) as drv:
        drv.gpus[0].add_process(os.getppid(), mem_bytes=2 << 30)
        run = RunInfo(run_id="r", run_dir=str(tmp_path), pids=[os.getpid()], gpus=[0])
        p = GpuForeignProbe(run)
        p.open()
        v = dict(zip([c.name for c in p.channels], p.sample()))
        assert v["gpu.0.foreign_procs"] == 1 and v["gpu.0.foreign_mem"] == 2 << 30
        p.close()


@pytest.mark.parametrize("old", [False, True])
def test_torchrun_gpu_mapper_finds_a_workers_gpu_through_the_real_binding(old):
    from reveal_plugins.torch_ext.gpus import gpus_of_pids
    with install_fake_nvml(FakeDriver(gpus=4, old_driver=old)) as drv:
        drv.gpus[3].add_process(4242, mem_bytes=1 << 30)
        pynvml.nvmlInit()
        try:
            hit = gpus_of_pids(pynvml, {4242, 999})
        finally:
            pynvml.nvmlShutdown()
    assert hit == {4242: [{"gpu": 3, "gpu_uuid": drv.gpus[3].uuid}]}


def test_slurm_job_gets_the_gpus_of_its_gres_indices_in_the_agent(tmp_path):
    """A Slurm registration (SPANK/Prolog send SLURM_JOB_GPUS as `gpus`) on a node whose minor
    numbers are not in NVML order: the run records the GPUs with those minor numbers only."""
    from reveal_plugins.agent.daemon import Agent
    with install_fake_nvml(FakeDriver(gpus=4, minor_numbers=[3, 2, 1, 0])) as drv:
        for g in drv.gpus:
            g.busy()
        a = Agent(str(tmp_path / "spool"), interval_s=0.1)
        try:
            run = RunInfo(run_id="slurm-7", run_dir=str(tmp_path / "run"), source="slurm",
                          job_id="7", gpus=[0, 1])
            a.register(run)
            meta = json.loads((tmp_path / "run" / "meta.json").read_text())
        finally:
            for p in a.all_probes:
                p.close()
    assert [g["minor"] for g in meta["gpus"]] == [0, 1]
    assert [g["index"] for g in meta["gpus"]] == [3, 2]
    assert meta["gpu_source"] == "SLURM_JOB_GPUS=0,1"
    gpus = {c["name"].split(".")[1] for c in meta["channels"] if c["name"].startswith("gpu.")}
    assert gpus == {"2", "3"}
