"""Several GPU scripts of this folder in one launch, each with a verdict of its own (run under mpirun).

Usage: ``python gpu_batch.py SPEC.json`` with SPEC ``{"scenarios": [{"name": ..., "script": "gpu_variants.py",
"args": [...], "env": {...}}, ...]}``.  Every rank runs the scenarios in the file's order, each as its script
would run alone (``python SCRIPT ARGS`` with ``ENV`` added to the environment), in this one process: the
launch's start-up (the interpreter, CuPy, mpiml, MPI, the CUDA context) is paid once for the lot, not once
a script.  Between scenarios:

* the world communicators ``get_comm()`` made are closed and forgotten, so each scenario makes its own (the
  settings read when a communicator or transport is made, ``MPIML_TUNING_FILE``, ``MPIML_IPC_BYTES``,
  ``MPIML_NODE_SIZE``, ``MPIML_TIMEOUT``, take the scenario's values);
* the environment, ``sys.argv``, tests/_spmd.py's failure list and CuPy's current stream are put back; a
  scenario's own namespace is kept until the end (the communicators a script keeps, as its process would);
* the verdict is agreed over ``MPI.COMM_WORLD`` (the script's own ``finish`` agrees it too; an exception
  outside the script's ``guarded`` counts as a failure on every rank).

Rank 0 prints ``@@ begin NAME``, the failures of every rank as ``@@ fail NAME rank R: ...`` and
``@@ end NAME PASS|FAIL SECONDS`` (tests/comm/_gpu_jobs.py reads these: one pytest case a scenario).
Scenarios that poison communicators on purpose (gpu_deferred.py, gpu_replay.py's last part) go last in a spec;
those that kill or stall a rank (gpu_timeout.py) have launches of their own.
"""

import json
import os
import sys
import time
import traceback

from mpi4py import MPI

import _spmd

HERE = os.path.dirname(os.path.abspath(__file__))
world = MPI.COMM_WORLD
RANK = world.Get_rank()
KEEP = []  # every scenario's namespace, alive to the end as in a process of its own


def say(line):
    if RANK == 0:
        print(line, flush=True)


def close_world_comms():
    """Close the communicators ``get_comm()`` made (the same ones, in the same order, on every rank)."""
    import mpiml.comm as mc

    comms = list(mc._WORLD.values())
    mc._WORLD.clear()
    err = None
    for c in comms:
        try:
            c.close()
        except Exception as exc:  # noqa: BLE001 (reported, the next scenario goes on)
            err = f"closing {c!r}: {type(exc).__name__}: {exc}"
    return err


def reset_device_state():
    try:
        import cupy as cp
    except ImportError:  # (the CPU check of this driver, tests/comm/test_gpu_jobs.py)
        return None
    try:
        cp.cuda.Stream.null.use()
        cp.cuda.Device().synchronize()
        cp.get_default_memory_pool().free_all_blocks()
    except Exception as exc:  # noqa: BLE001
        return f"after the scenario: {type(exc).__name__}: {exc}"
    return None


def run_one(sc, last=False):
    path = os.path.join(HERE, sc["script"])
    env_before, argv_before = dict(os.environ), list(sys.argv)
    for k, v in sc.get("env", {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = str(v)
    sys.argv = [path, *map(str, sc.get("args", []))]
    _spmd._failures.clear()
    ns = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
    KEEP.append(ns)
    code, errors = 0, []
    sys.stdout.flush()
    try:
        with open(path) as fh:
            exec(compile(fh.read(), path, "exec"), ns)  # noqa: S102 (our own test scripts)
    except SystemExit as exc:  # tests/_spmd.py's finish: 0 or 1, agreed over the script's communicator
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 (outside the script's guarded(): its module-level code)
        code = 1
        errors.append(traceback.format_exc()[-3000:])
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for k in [k for k in os.environ if k not in env_before]:  # (key by key: other threads read it meanwhile)
            del os.environ[k]
        for k, v in env_before.items():
            if os.environ.get(k) != v:
                os.environ[k] = v
        sys.argv = argv_before
    if not last:  # (after the last one the process ends, as the script's own would: a kernel a failed scenario
        # left waiting on a peer that never comes, NCCL's included, ends with it instead of holding a synchronize)
        for err in (reset_device_state(), close_world_comms()):
            if err:
                errors.append(err)
    return code, [str(f)[-1500:] for f in _spmd._failures[:10]] + errors


def main():
    with open(sys.argv[1]) as fh:
        spec = json.load(fh)
    names = [sc["name"] for sc in spec["scenarios"]]
    say(f"@@ launch {world.Get_size()} rank(s): {', '.join(names)}")
    failed = 0
    for i, sc in enumerate(spec["scenarios"]):
        world.Barrier()
        say(f"@@ begin {sc['name']}")
        t0 = time.perf_counter()
        code, errors = run_one(sc, last=i == len(names) - 1)
        bad = world.allreduce(1 if (code or errors) else 0, op=MPI.MAX)
        gathered = world.gather(errors, root=0)
        took = world.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        if RANK == 0:
            for r, errs in enumerate(gathered):
                for e in errs:
                    print(f"@@ fail {sc['name']} rank {r}: " + e.replace("\n", "\n@@ | "), flush=True)
            print(f"@@ end {sc['name']} {'FAIL' if bad else 'PASS'} {took:.1f}", flush=True)
        failed += bad
    say(f"@@ done {len(names) - failed} of {len(names)} passed")
    sys.stdout.flush()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
