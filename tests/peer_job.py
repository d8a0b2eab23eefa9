#!/usr/bin/env python3
"""A tiny synchronous two-rank "job" for the peer tests: every step each rank does a fixed
amount of CPU work, then both exchange a byte over TCP (a barrier, like an all-reduce), so
the slow rank slows both.  Every 10 steps a rank appends an ``iteration`` event (``n`` steps
merged, ``dt`` their mean) to its run directory, as reveal-torchrun's markers do.

    python tests/peer_job.py --rank 0|1 --port P --seconds S --run-dir DIR [--work N]
"""
import argparse
import socket
import sys
import time


def work(n: int) -> int:
    x = 0
    for i in range(n):
        x = (x * 31 + i) & 0xFFFF
    return x


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--run-dir", default=None)
    ap.add_argument("--work", type=int, default=60_000)
    a = ap.parse_args()
    if a.rank == 0:
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", a.port))
        srv.listen(1)
        srv.settimeout(30)
        conn, _ = srv.accept()
    else:
        deadline = time.time() + 30
        while True:
            try:
                conn = socket.create_connection(("127.0.0.1", a.port), timeout=5)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.settimeout(30)
    def append(**kw):
        if not a.run_dir:
            return
        from reveal_plugins.store.store import append_event
        try:
            append_event(a.run_dir, "iteration", **kw)
        except OSError:
            pass
    # rank 0 decides when to stop, so both leave on the same step
    t_end = time.time() + a.seconds
    step, acc, t_prev = 0, [], time.time()
    while True:
        work(a.work)
        stop = a.rank == 0 and time.time() >= t_end
        conn.sendall(b"s" if stop else b"c")
        peer = conn.recv(1)
        if not peer:
            break
        now = time.time()
        acc.append(now - t_prev)
        t_prev = now
        step += 1
        if len(acc) == 10:
            append(rank=a.rank, step=step, n=len(acc), dt=sum(acc) / len(acc), dt_max=max(acc))
            acc = []
        if stop or peer == b"s":
            break
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
