"""Fault scenarios run under ``mpiexec`` by ``test_faults.py``.

``python fault_script.py SCENARIO`` runs one scenario; every rank writes what
each of its calls did (returned data or raised what, after how many seconds,
and what the next calls on that communicator did) to
``$MPIML_FAULT_OUT/rank<r>.json``.  The test reads every rank's file, so a rank
that was killed, or that never came back, cannot hide a verdict, and no MPI
call is needed after a fault to agree on one.

Scenarios:

* ``mismatch`` — every kind of mismatched collective, each on a fresh
  communicator, under the default checking (``MPIML_CHECK`` unset) and a few
  under ``MPIML_CHECK=1``;
* ``stall`` — the last rank sleeps past ``MPIML_TIMEOUT`` before a collective
  (small inline, mid-size native, forced ring), then every later call on that
  communicator, splits included, is tried;
* ``freeze`` — the last rank stops (SIGSTOP) in the middle of a ring allreduce:
  to its peers it is gone, as a killed rank is when the launcher does not end
  the job (MPICH's launcher does: see ``kill``); once every other rank wrote
  its record, rank 0 kills it;
* ``kill`` — the last rank kills itself (SIGKILL) in the middle of a ring
  allreduce; the others report what they saw if the launcher lets them;
* ``dead_peer`` — the last rank kills itself between calls, under a launcher
  that lets the others go on and without ``MPIML_TIMEOUT``: the survivors' next
  calls must find it dead (its process ended) within seconds.
"""

import json
import os
import signal
import sys
import threading
import time

import numpy as np

from mpiml import CommAbortedError
from mpiml.comm import Communicator, get_comm

OUT = os.environ["MPIML_FAULT_OUT"]
world = get_comm()
r, p = world.rank, world.size
last = p - 1
records = []


def attempt(fn):
    """What ``fn()`` did: returned (with what) or raised (what, after how long)."""
    t = time.perf_counter()
    try:
        res = fn()
    except Exception as exc:
        return {"returned": False, "type": type(exc).__name__, "error": str(exc),
                "seconds": time.perf_counter() - t}
    return {"returned": True, "type": None, "error": None, "value": repr(res)[:200],
            "seconds": time.perf_counter() - t}


def after_state(c):
    """What the next calls on ``c`` do: ``usable`` (they return) or the errors they raise."""
    calls = {"allreduce": lambda: c.allreduce(np.ones(1)), "bcast": lambda: c.bcast(np.ones(2)),
             "allgather_obj": lambda: c.allgather_obj(r), "barrier": c.barrier, "split": lambda: c.split(0)}
    out = {}
    for name, fn in calls.items():
        res = attempt(fn)
        out[name] = "usable" if res["returned"] else res["type"]
        if res["returned"] and name == "allreduce":
            return {"allreduce": "usable"}  # no need to try the rest (and they would succeed)
    return out


def save():
    with open(os.path.join(OUT, f"rank{r}.json.tmp"), "w") as f:
        json.dump(records, f)
    os.replace(os.path.join(OUT, f"rank{r}.json.tmp"), os.path.join(OUT, f"rank{r}.json"))


def finish():
    """Write this rank's file and end normally (every rank is alive: MPI_Finalize must not hang,
    abandoned operations on the trial communicators notwithstanding)."""
    save()
    sync()
    sys.exit(0)


def leave(expected_files):
    """Write this rank's file, wait (a little) for the others', and exit without MPI_Finalize
    (a dead or stopped peer would hang it)."""
    save()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if all(os.path.exists(os.path.join(OUT, f"rank{k}.json")) for k in expected_files):
            break
        time.sleep(0.05)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def sync():
    """A world barrier with a generous limit (the trial communicators carry the short one)."""
    old = os.environ.get("MPIML_TIMEOUT")
    os.environ["MPIML_TIMEOUT"] = "120"
    try:
        world.barrier()
    finally:
        if old is None:
            os.environ.pop("MPIML_TIMEOUT", None)
        else:
            os.environ["MPIML_TIMEOUT"] = old


# ------------------------------------------------------------------ mismatches
def _warm_op(c):
    for op in ("sum", "max"):  # both shapes remembered on every rank: the repeated (fast) path
        for _ in range(3):
            c.allreduce(np.ones(1000), op=op)
    return c.allreduce(np.ones(1000), op="max" if r == last else "sum")


def _skipped_call(c):
    if r == last:  # a local error raised on this rank alone: it skipped a call the others are in
        try:
            c.allreduce(np.ones(4), op="bogus")
        except ValueError:
            pass
    return c.allreduce(np.ones(4))


def _scatter_root(c):
    root = 1 if r == last else 0
    return c.scatter(np.ones((2 * p, 3)) if r == root else None, root=root)


MISMATCHES = {
    # name: (call, expected words in the message)
    "allreduce_count_small": (lambda c: c.allreduce(np.ones(3 if r == last else 4)), ["count"]),
    "allreduce_count_mid": (lambda c: c.allreduce(np.ones(1001 if r == last else 1000)), ["count"]),
    "allreduce_straddle": (lambda c: c.allreduce(np.ones(120000 if r == last else 140000)),
                           ["count", "140000", "120000"]),
    "allreduce_dtype": (lambda c: c.allreduce(np.ones(4, np.float32 if r == last else np.float64)),
                        ["dtype", "float32", "float64"]),
    "allreduce_dtype_mid": (lambda c: c.allreduce(np.ones(1000, np.float32 if r == last else np.float64)),
                            ["dtype"]),
    "allreduce_op": (lambda c: c.allreduce(np.ones(4), op="max" if r == last else "sum"), ["op", "max", "sum"]),
    "allreduce_op_repeated": (_warm_op, ["op", "max", "sum"]),
    "allreduce_shape": (lambda c: c.allreduce(np.ones((2, 3)) if r == last else np.ones((3, 2))), ["shape"]),
    "ring_op": (lambda c: c.allreduce(np.ones(1000), op="max" if r == last else "sum", algorithm="ring"),
                ["op", "max", "sum"]),
    "ring_op_small": (lambda c: c.allreduce(np.ones(4), op="max" if r == last else "sum", algorithm="ring"),
                      ["op"]),
    "algorithm": (lambda c: c.allreduce(np.ones(1000), algorithm="ring" if r == last else None), ["algorithm"]),
    "bcast_root": (lambda c: c.bcast(np.ones(4), root=1 if r == last else 0), ["root"]),
    "bcast_root_mid": (lambda c: c.bcast(np.ones(5000), root=1 if r == last else 0), ["root"]),
    "reduce_root": (lambda c: c.reduce(np.ones(1000), root=1 if r == last else 0), ["root"]),
    "gather_root": (lambda c: c.gather(np.ones(4), root=1 if r == last else 0), ["root"]),
    "gather_count": (lambda c: c.gather(np.ones(2 if r == last else 3)), ["count"]),
    "bcast_count_mid": (lambda c: c.bcast(np.ones(3000 if r == last else 2000)), ["count"]),
    "reduce_scatter_count": (lambda c: c.reduce_scatter(np.ones(4 * p + (1 if r == last else 0))), ["count"]),
    "scan_op": (lambda c: c.scan(np.ones(4), op="max" if r == last else "sum"), ["op"]),
    "exscan_dtype": (lambda c: c.exscan(np.ones(4, np.int32 if r == last else np.int64)), ["dtype"]),
    "alltoall_count": (lambda c: c.alltoall(np.ones(2 * p if r == last else 4 * p)), ["count"]),
    "scatter_root": (_scatter_root, ["root"]),
    "gatherv_dtype": (lambda c: c.gatherv(np.ones(2, np.int32 if r == last else np.int64)), ["dtype"]),
    "allgatherv_trailing": (lambda c: c.allgatherv(np.ones((2, 3 if r == last else 4))), ["trailing shape"]),
    "alltoall_divide": (lambda c: c.alltoall(np.ones(p + (1 if r == last else 0))), ["does not divide"]),
    "kind_small": (lambda c: c.bcast(np.ones(4)) if r == last else c.allreduce(np.ones(4)),
                   ["different collectives", "bcast", "allreduce"]),
    "kind_mid": (lambda c: c.reduce_scatter(np.ones(4000)) if r == last else c.allgather(np.ones(1000)),
                 ["different collectives", "reduce_scatter", "allgather"]),
    "kind_barrier": (lambda c: c.barrier() if r == last else c.allreduce(np.ones(1000)),
                     ["different collectives", "barrier"]),
    "obj_bcast_root": (lambda c: c.bcast_obj({"a": r}, root=1 if r == last else 0), ["root"]),
    "obj_allreduce_op": (lambda c: c.allreduce_obj(r, op="max" if r == last else "sum"), ["op"]),
    "obj_kind": (lambda c: c.bcast_obj(r) if r == last else c.allreduce_obj(r),
                 ["different collectives", "bcast_obj", "allreduce_obj"]),
    "obj_vs_array": (lambda c: c.allgather_obj(r) if r == last else c.allreduce(np.ones(1000)),
                     ["different collectives", "allgather_obj", "allreduce"]),
    "obj_big_kind": (lambda c: c.allgather_obj("x" * 5000) if r == last else c.bcast_obj("y" * 5000),
                     ["different collectives"]),
    "skipped_call": (_skipped_call, ["call number"]),
    "obj_unpicklable": (lambda c: c.allgather_obj(threading.Lock() if r == last else r), ["invalid", "pickle"]),
    "split_vs_allreduce": (lambda c: c.split(0) if r == last else c.allreduce(np.ones(4)),
                           ["different collectives", "split"]),
}
STRICT = ("allreduce_count_mid", "allreduce_op_repeated", "kind_mid", "allreduce_straddle")


def run_mismatch():
    for check, names in (("", list(MISMATCHES)), ("1", STRICT)):
        for name in names:
            if check:
                os.environ["MPIML_CHECK"] = check
            else:
                os.environ.pop("MPIML_CHECK", None)
            call, words = MISMATCHES[name]
            c = Communicator(world._world)
            rec = attempt(lambda: call(c))
            rec.update(name=name, check=check, words=words, after=after_state(c))
            records.append(rec)
            os.environ.pop("MPIML_CHECK", None)
            sync()
    finish()


# ------------------------------------------------------------------ stalls and kills
STALLS = {  # name: (call, its right result)
    "inline": (lambda c: c.allreduce(np.ones(4)), lambda: np.full(4, float(p))),
    "native": (lambda c: c.allreduce(np.ones(10000)), lambda: np.full(10000, float(p))),
    "ring": (lambda c: c.allreduce(np.ones(10000), algorithm="ring"), lambda: np.full(10000, float(p))),
    "bcast_obj": (lambda c: c.bcast_obj(r), lambda: 0),
}


def run_stall():
    limit = float(os.environ["MPIML_TIMEOUT"])
    for name, (call, right) in STALLS.items():
        c = Communicator(world._world)
        c.allreduce(np.ones(10000))  # warm: the repeated path serves the stalled call
        sync()
        if r == last:
            time.sleep(limit + 1)  # past the others' limit: they must raise, then refuse
        got = {}
        rec = attempt(lambda: got.setdefault("value", call(c)))
        if rec["returned"]:  # (only a late rank may complete what the others posted before giving up)
            rec["right"] = bool(np.array_equal(got["value"], right()))
        rec.update(name=name, stalled=r == last, after=after_state(c))
        records.append(rec)
        sync()
    finish()


def run_gone(sig):
    c = world
    c.allreduce(np.ones(4))
    x = np.ones(1 << 20)
    if r == last:  # leaves inside the collective: it has posted its first messages and waits for the others
        with open(os.path.join(OUT, "victim.pid"), "w") as f:
            f.write(str(os.getpid()))
        threading.Timer(0.1, lambda: os.kill(os.getpid(), sig)).start()
    else:  # ... who come later, so that it cannot have finished
        time.sleep(0.5)
    rec = attempt(lambda: c.allreduce(x, algorithm="ring"))
    if r == last:  # (unreachable: the ring cannot complete without the others)
        os.kill(os.getpid(), signal.SIGKILL)
    rec.update(name="gone", after=after_state(c))
    records.append(rec)
    save()
    if r == 0:  # every survivor has written: end the stopped rank (the launcher then ends the job)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(
                os.path.exists(os.path.join(OUT, f"rank{k}.json")) for k in range(p - 1)):
            time.sleep(0.05)
        with open(os.path.join(OUT, "victim.pid")) as f:
            os.kill(int(f.read()), signal.SIGKILL)
    leave(range(p - 1))


def run_dead_peer():
    """The last rank dies (SIGKILL) between calls while the launcher lets the job go on, with no
    MPIML_TIMEOUT: each survivor's next call (a small inline one, then a forced ring on another
    communicator) must raise CommAbortedError naming the dead rank within seconds."""
    comms = [Communicator(world._world) for _ in range(2)]
    for c in comms:
        c.allreduce(np.ones(4))
    sync()
    if r == last:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)  # (it is dead, or about to be: the survivors' calls wait for it)
    calls = {"inline": lambda: comms[0].allreduce(np.ones(4)),
             "ring": lambda: comms[1].allreduce(np.ones(1 << 18), algorithm="ring")}
    for name, call in calls.items():
        rec = attempt(call)
        rec.update(name=name, after=after_state(comms[0] if name == "inline" else comms[1]))
        records.append(rec)
    leave(range(p - 1))


if __name__ == "__main__":
    {"mismatch": run_mismatch, "stall": run_stall, "freeze": lambda: run_gone(signal.SIGSTOP),
     "kill": lambda: run_gone(signal.SIGKILL), "dead_peer": run_dead_peer}[sys.argv[1]]()
