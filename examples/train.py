#!/usr/bin/env python3
"""A small, real CPU training script for trying Reveal (plain, under torchrun/DDP, under Slurm).

Plain:            python examples/train.py --model mlp --seconds 60
Under torchrun:   torchrun --standalone --nproc-per-node 2 examples/train.py --model cnn --seconds 30
With Reveal:      reveal-torchrun --standalone --nproc-per-node 2 examples/train.py --instrument
Under Reveal:     reveal record -- python examples/train.py --model rnn --steps 500

When started by torchrun (``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` in the environment) it joins a
gloo process group and wraps the model in DistributedDataParallel; otherwise it trains alone.
Data are synthetic (a fixed random regression/classification task), so nothing is downloaded.
``--seconds`` bounds the run by wall time; with several ranks, rank 0's clock decides (broadcast
every few steps) so all ranks stop on the same step and no collective is left hanging.
``--instrument`` (or ``REVEAL_ITERATION_MARKERS=1``) calls ``reveal_plugins.torch_ext.instrument()``
so each optimizer step is reported to ``reveal-torchrun`` as an iteration marker.
``--crash-once-at N`` makes rank 0 crash at step N on the first attempt only (restart tests);
``--fail-at-step N`` makes every rank exit at step N on every attempt (exit code ``--fail-code``),
before any collective of that step: torchrun's error table then shows that code whichever rank it
names first (with one rank failing, the others die of a broken collective, exit 1, and may be
reported first).
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("mlp", "cnn", "rnn"), default="mlp",
                   help="model kind (default: mlp)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--seconds", type=float, default=None,
                   help="train for this many seconds (default: 20 unless --steps is given)")
    g.add_argument("--steps", type=int, default=None, help="train for exactly this many steps")
    p.add_argument("--batch", type=int, default=64, help="per-rank batch size (default: 64)")
    p.add_argument("--width", type=int, default=256, help="hidden width (default: 256)")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--log-every", type=int, default=50, metavar="N",
                   help="print a log line every N steps (rank 0 only; 0 = never)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads (default: 1 per rank under torchrun, else torch's)")
    p.add_argument("--instrument", action="store_true",
                   help="report iteration markers (reveal_plugins.torch_ext.instrument())")
    p.add_argument("--crash-once-at", type=int, default=None, metavar="STEP",
                   help="rank 0 raises at STEP on the first attempt only (TORCHELASTIC_RESTART_COUNT=0)")
    p.add_argument("--fail-at-step", type=int, default=None, metavar="STEP",
                   help="every rank exits with --fail-code at STEP on every attempt")
    p.add_argument("--fail-code", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=0, metavar="N",
                   help="DataLoader worker processes (restarted every epoch; default 0)")
    p.add_argument("--eval-every", type=int, default=0, metavar="N",
                   help="every N steps, an evaluation phase of --eval-batches forward passes")
    p.add_argument("--eval-batches", type=int, default=40, metavar="K")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                   help="every N steps, torch.save model+optimizer into --checkpoint-dir")
    p.add_argument("--checkpoint-every-s", type=float, default=0.0, metavar="S",
                   help="also every S seconds of training (time, not steps)")
    p.add_argument("--checkpoint-extra-mb", type=int, default=0, metavar="MB",
                   help="save MB more with each checkpoint (the state of a large model)")
    p.add_argument("--fsync", action="store_true",
                   help="fsync each checkpoint before renaming it into place")
    p.add_argument("--checkpoint-dir", default=None, metavar="DIR")
    a = p.parse_args(argv)
    for k in ("checkpoint_every_s", "checkpoint_extra_mb"):
        if getattr(a, k) < 0:
            p.error(f"--{k.replace('_', '-')} must be >= 0, got {getattr(a, k)}")
    if a.seconds is None and a.steps is None:
        a.seconds = 20.0
    if a.seconds is not None and a.seconds <= 0:
        p.error(f"--seconds must be > 0, got {a.seconds}")
    if a.steps is not None and a.steps <= 0:
        p.error(f"--steps must be > 0, got {a.steps}")
    if a.batch <= 0:
        p.error(f"--batch must be > 0, got {a.batch}")
    return a


def build(kind: str, width: int):
    """Return (model, make_batch(n, generator) -> (x, y), loss_fn) for a model kind."""
    import torch
    from torch import nn

    if kind == "mlp":
        model = nn.Sequential(nn.Linear(128, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                              nn.Linear(width, 10))

        def make(n, g):
            x = torch.randn(n, 128, generator=g)
            return x, (x[:, :10].sum(1) * 3).long().remainder(10)
        return model, make, nn.CrossEntropyLoss()
    if kind == "cnn":
        c = max(8, width // 16)
        model = nn.Sequential(nn.Conv2d(3, c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(c, 2 * c, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
                              nn.Flatten(), nn.Linear(2 * c * 16, 10))

        def make(n, g):
            x = torch.randn(n, 3, 32, 32, generator=g)
            return x, (x.mean((1, 2, 3)) > 0).long()
        return model, make, nn.CrossEntropyLoss()

    class RNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rnn = nn.GRU(16, width // 2, batch_first=True)
            self.head = nn.Linear(width // 2, 1)

        def forward(self, x):
            out, _ = self.rnn(x)
            return self.head(out[:, -1])

    def make(n, g):
        x = torch.randn(n, 24, 16, generator=g)
        return x, x.sum((1, 2)).unsqueeze(1) / 20.0
    return RNN(), make, nn.MSELoss()


def init_gloo(rank: int, world: int) -> None:
    """Join the gloo process group.  When workers share torchelastic's agent store (c10d
    rendezvous), its keys outlive a restarted worker group, so a restarted rank can read a dead
    peer's address from the previous attempt ("Connection refused" in connectFullMesh); a
    per-attempt key prefix avoids that race."""
    import torch.distributed as dist
    from datetime import timedelta

    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        dist.init_process_group("gloo")
        return
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=False, timeout=timedelta(seconds=300))
    dist.init_process_group("gloo", store=dist.PrefixStore(f"train.py/attempt-{attempt}", store),
                            rank=rank, world_size=world)


def save_checkpoint(a, model, opt, step: int, extra) -> None:
    """torch.save model+optimizer (and ``extra``) into --checkpoint-dir; with --fsync the file
    is on the disk before it replaces the previous one (what a careful trainer does)."""
    import torch

    path = os.path.join(a.checkpoint_dir, "ckpt-0.pt")
    state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step}
    if extra is not None:
        state["extra"] = extra
    with open(path + ".tmp", "wb") as f:
        torch.save(state, f)
        if a.fsync:
            f.flush()
            os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    distributed = world > 1 and "MASTER_ADDR" in os.environ
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    elif "TORCHELASTIC_RUN_ID" in os.environ:
        torch.set_num_threads(1)
    if distributed:
        init_gloo(rank, world)
    if a.instrument or os.environ.get("REVEAL_ITERATION_MARKERS", "") not in ("", "0"):
        from reveal_plugins.torch_ext import instrument
        instrument()

    torch.manual_seed(a.seed)
    model, make, loss_fn = build(a.model, a.width)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)

    # A light input pipeline: a fixed synthetic data set, sharded per rank, reshuffled per epoch.
    g = torch.Generator().manual_seed(a.seed + 1000 * rank)
    x, y = make(max(a.batch * 16, 256), g)
    loader = DataLoader(TensorDataset(x, y), batch_size=a.batch, shuffle=True, drop_last=True,
                        generator=g, num_workers=a.workers)
    if (a.checkpoint_every or a.checkpoint_every_s) and not a.checkpoint_dir:
        import tempfile
        a.checkpoint_dir = tempfile.mkdtemp(prefix="train-ckpt-")
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    sync_every = 10
    stop = torch.zeros(1)
    t0 = time.time()
    next_ckpt = t0 + a.checkpoint_every_s
    extra = torch.zeros(a.checkpoint_extra_mb * (1 << 18)) if a.checkpoint_extra_mb else None
    last_log_t, last_log_step = t0, 0
    step = 0
    done = False
    if rank == 0:
        print(f"train.py: model={a.model} world={world} batch={a.batch} attempt={attempt} "
              f"{'seconds=%g' % a.seconds if a.seconds else 'steps=%d' % a.steps}", flush=True)
    while not done:
        for xb, yb in loader:
            if rank == 0 and a.crash_once_at is not None and step == a.crash_once_at and attempt == 0:
                raise RuntimeError(f"train.py: deliberate crash at step {step} (attempt {attempt})")
            if a.fail_at_step is not None and step == a.fail_at_step:
                if rank == 0:
                    print(f"train.py: deliberate failure at step {step}, exit {a.fail_code}",
                          file=sys.stderr, flush=True)
                sys.exit(a.fail_code)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            step += 1
            if a.eval_every and step % a.eval_every == 0:   # a phase of its own: no backward
                with torch.no_grad():
                    for _ in range(a.eval_batches):
                        model(make(a.batch, g)[0])
            due = a.checkpoint_every_s and time.time() >= next_ckpt
            if due:
                next_ckpt += a.checkpoint_every_s
            if (due or a.checkpoint_every and step % a.checkpoint_every == 0) and rank == 0:
                save_checkpoint(a, model, opt, step, extra)
            if a.log_every and rank == 0 and step % a.log_every == 0:
                now = time.time()
                print(f"step {step:6d}  loss {loss.item():.4f}  "
                      f"{(now - last_log_t) / (step - last_log_step) * 1e3:7.2f} ms/step  "
                      f"{now - t0:6.1f} s", flush=True)
                last_log_t, last_log_step = now, step
            if a.steps is not None:
                done = step >= a.steps
            elif step % sync_every == 0 or not distributed:
                stop[0] = 1.0 if time.time() - t0 >= a.seconds else 0.0
                if distributed:
                    dist.broadcast(stop, src=0)
                done = bool(stop[0])
            if done:
                break
    if distributed:
        dist.barrier()
        # Drop DDP's and the optimizer's hold on the process group first, so that it is torn
        # down here, with its gloo threads joined, and not at interpreter exit: there a gloo
        # worker thread still running aborts the rank ("terminate called without an active
        # exception", SIGABRT) about once in 15 runs, after all steps were done.
        del model, opt
        gc.collect()
        dist.destroy_process_group()
    if rank == 0:
        el = time.time() - t0
        print(f"train.py: done {step} steps in {el:.1f} s ({el / max(step, 1) * 1e3:.2f} ms/step)",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
