"""A hostile local user against the agent socket (run as an ordinary user).

    python tests/hostile_client.py SOCKET --seconds S [--run-id R] [--idle N] [--drip N]

Attacks at once: one oversized request line (no newline, hundreds of MiB offered), ``--idle``
idle connections held open, ``--drip`` slow-drip clients (one byte a second, never a newline),
and, with ``--run-id``, an event flood on that run (large and small events, new step ids).
Prints one JSON line of what it managed: connections held, requests sent/answered.
Used by tests/test_agent_hostile.py and benchmarks/reliability/run.py.
"""
from __future__ import annotations

import argparse
import json
import socket
import threading
import time


def _connect(path: str) -> socket.socket | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2.0)
    try:
        s.connect(path)
        return s
    except OSError:
        s.close()
        return None


def oversized(path: str, stats: dict, stop: threading.Event) -> None:
    chunk = b"x" * (1 << 20)
    while not stop.is_set():
        s = _connect(path)
        if s is None:
            time.sleep(0.2)
            continue
        sent = 0
        try:
            s.sendall(b'{"op":"event","pad":"')
            while not stop.is_set() and sent < (512 << 20):
                s.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        finally:
            stats["oversized_bytes_accepted"] = max(stats.get("oversized_bytes_accepted", 0),
                                                    sent)
            s.close()
        time.sleep(0.5)


def idle(path: str, n: int, stats: dict, stop: threading.Event) -> None:
    held: list[socket.socket] = []
    while not stop.is_set():
        while len(held) < n and not stop.is_set():
            s = _connect(path)
            if s is None:
                break
            held.append(s)
        # count those the agent has not closed (recv returns b"" on a closed one)
        alive = []
        for s in held:
            s.setblocking(False)
            try:
                if s.recv(1) == b"":
                    s.close()
                    continue
            except BlockingIOError:
                pass
            except OSError:
                s.close()
                continue
            alive.append(s)
        held = alive
        stats["idle_held_max"] = max(stats.get("idle_held_max", 0), len(held))
        stop.wait(0.5)
    for s in held:
        s.close()


def drip(path: str, stats: dict, stop: threading.Event) -> None:
    while not stop.is_set():
        s = _connect(path)
        if s is None:
            stop.wait(0.5)
            continue
        t0 = time.monotonic()
        try:
            s.sendall(b'{"op":"ping"')
            while not stop.is_set():
                stop.wait(1.0)
                s.sendall(b" ")
        except OSError:
            stats["drip_held_s_max"] = max(stats.get("drip_held_s_max", 0.0),
                                           time.monotonic() - t0)
        finally:
            s.close()


def flood(path: str, run_id: str, stats: dict, stop: threading.Event) -> None:
    big = "y" * (200 * 1024)
    k = 0
    while not stop.is_set():
        s = _connect(path)
        if s is None:
            stop.wait(0.2)
            continue
        s.settimeout(5.0)
        f = s.makefile("rb")
        try:
            while not stop.is_set():
                k += 1
                ev = {"op": "event", "run_id": run_id, "event": "step_start",
                      "step_id": f"s{k}", "t": time.time()}
                if k % 50 == 0:
                    ev["pad"] = big
                s.sendall((json.dumps(ev) + "\n").encode())
                stats["events_sent"] = stats.get("events_sent", 0) + 1
                line = f.readline()
                if not line:
                    break
                if b'"ok":true' in line:
                    stats["events_accepted"] = stats.get("events_accepted", 0) + 1
        except OSError:
            pass
        finally:
            f.close()
            s.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("socket")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--run-id")
    ap.add_argument("--idle", type=int, default=2000)
    ap.add_argument("--drip", type=int, default=50)
    a = ap.parse_args()
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))
    stats: dict = {}
    stop = threading.Event()
    threads = [threading.Thread(target=oversized, args=(a.socket, stats, stop)),
               threading.Thread(target=idle, args=(a.socket, a.idle, stats, stop))]
    threads += [threading.Thread(target=drip, args=(a.socket, stats, stop))
                for _ in range(a.drip)]
    if a.run_id:
        threads += [threading.Thread(target=flood, args=(a.socket, a.run_id, stats, stop))
                    for _ in range(4)]
    for th in threads:
        th.daemon = True
        th.start()
    time.sleep(a.seconds)
    stop.set()
    for th in threads:
        th.join(timeout=3)
    print(json.dumps(stats), flush=True)


if __name__ == "__main__":
    main()
