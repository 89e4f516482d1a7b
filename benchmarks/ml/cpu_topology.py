"""What a node's CPUs are, as ``/sys`` says and as they behave: the probe behind CPU ranks' placement.

    python benchmarks/ml/cpu_topology.py --out OUT/cpu_topology.json [--seconds 0.06]

1. ``/sys``: CPUs, physical cores (hardware threads a core), NUMA nodes, every cache level of CPU 0
   (size, CPUs sharing it), the model and the kernel's frequency reading.
2. Pairs: one single-threaded process pinned to CPU 0 and one to CPU ``j``, both running the same
   kernel at the same time, for every ``j``: a CPU whose neighbour slows CPU 0 down shares a physical
   core (or its caches) with it.  A virtual machine shows a flat topology in ``/sys`` (each vCPU its
   own core) whatever its vCPUs share on the host; this is how the sharing shows.
3. Load: the first ``n`` CPUs busy (one pinned process each, ``n`` = 1, 2, 4, 8, 16, 32, all), each
   process's rate against CPU 0's alone: how much slower a thread runs as the node fills (shared
   memory bandwidth and caches, a lower all-core clock, hardware threads, the host's other guests).

Kernels: ``gemm``, a 192 x 192 float32 matrix product in one BLAS thread (fits a core's L2: compute
bound, the k-NN and Lloyd steps' arithmetic), and ``stream``, ``c = a + b`` over 3 x 64 MiB a
process (memory bound, the rows' read).  Rates are per second of wall time, the process pinned.
The whole probe takes ~15 s on 64 CPUs.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import multiprocessing as mp  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src"))


def _kernel(name):
    import numpy as np

    if name == "gemm":
        a = np.random.default_rng(0).random((192, 192), dtype=np.float32)
        b = a.T.copy()
        c = np.empty_like(a)

        def step():
            np.matmul(a, b, out=c)
        return step, 2 * 192 ** 3 / 1e9     # GFLOP a step
    n = _STREAM_BYTES // 4
    a, b = np.ones(n, np.float32), np.ones(n, np.float32)
    c = np.empty_like(a)

    def step():
        np.add(a, b, out=c)
    return step, 3 * n * 4 / 1e9             # GB a step


#: Bytes of each of the stream kernel's three arrays (set by main: 64 MiB, less where memory is short).
_STREAM_BYTES = 64 << 20


def _worker(cpu, conn):
    os.sched_setaffinity(0, [cpu])
    kernels = {}
    while True:
        msg = conn.recv()
        if msg is None:
            return
        name, start, seconds = msg
        if name not in kernels:
            kernels[name] = _kernel(name)
            kernels[name][0]()
        step, unit = kernels[name]
        while time.monotonic() < start:
            pass
        done, t0 = 0, time.perf_counter()
        while True:   # at least one step, however late this process was scheduled
            step()
            done += 1
            if time.monotonic() >= start + seconds:
                break
        conn.send(done * unit / (time.perf_counter() - t0))


class Pool:
    """One pinned process per CPU, each running a kernel when told, all starting at the same instant."""

    def __init__(self, cpus):
        ctx = mp.get_context("fork")
        self.conns, self.procs = {}, []
        for c in cpus:
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(c, child), daemon=True)
            p.start()
            self.conns[c], self.procs = parent, self.procs + [p]

    def run(self, cpus, name, seconds):
        start = time.monotonic() + 0.02
        for c in cpus:
            self.conns[c].send((name, start, seconds))
        return {c: self.conns[c].recv() for c in cpus}

    def close(self):
        for conn in self.conns.values():
            conn.send(None)
        for p in self.procs:
            p.join(5)


def _sys_topology():
    from mpiml.utils import _placement

    cpus = _placement.online_cpus()
    base = "/sys/devices/system/cpu/cpu%d/cache" % cpus[0]
    caches = []
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        r = {k: _placement._read(f"{base}/{name}/{k}") for k in ("level", "type", "size", "shared_cpu_list")}
        if r["level"]:
            caches.append(r)
    model = mhz = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model is None:
                    model = line.split(":", 1)[1].strip()
                if line.startswith("cpu MHz") and mhz is None:
                    mhz = float(line.split(":", 1)[1])
    except OSError:
        pass
    cores = _placement.node_cores(cpus)
    return {**_placement.describe_topology(), "model": model, "cpu_mhz": mhz, "caches_cpu0": caches,
            "siblings": [c for c in cores if len(c) > 1][:8], "numa": {
                n: _placement._read(f"/sys/devices/system/node/{n}/cpulist")
                for n in sorted(os.listdir("/sys/devices/system/node")) if n.startswith("node") and n[4:].isdigit()}
            if os.path.isdir("/sys/devices/system/node") else {}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="cpu_topology.json")
    ap.add_argument("--seconds", type=float, default=0.06, help="each measurement (default 0.06)")
    ap.add_argument("--no-pairs", action="store_true")
    args = ap.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    global _STREAM_BYTES
    try:   # the three arrays of every process in a quarter of the free memory at most
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        _STREAM_BYTES = int(max(16 << 20, min(_STREAM_BYTES, free // 4 // (3 * len(cpus)))))
    except (ValueError, OSError):
        pass
    out = {"stream_bytes": _STREAM_BYTES, "topology": _sys_topology(), "affinity": len(cpus), "seconds": args.seconds}
    print(json.dumps(out["topology"]), flush=True)
    pool = Pool(cpus)
    try:
        t0 = time.perf_counter()
        for k in ("gemm", "stream"):   # every process makes its arrays and runs each kernel once first
            pool.run(cpus, k, 0.005)
        base = {k: max(pool.run([cpus[0]], k, 2 * args.seconds)[cpus[0]] for _ in range(3)) for k in ("gemm", "stream")}
        out["alone"] = {k: round(v, 2) for k, v in base.items()}
        if not args.no_pairs and len(cpus) > 1:
            pairs = {}
            for j in cpus[1:]:
                r = pool.run([cpus[0], j], "gemm", args.seconds)
                pairs[j] = round(r[cpus[0]] / base["gemm"], 3)
            out["pairs_gemm"] = pairs     # CPU 0's rate beside CPU j, over its rate alone
            low = sorted(pairs, key=pairs.get)[:4]
            out["pairs_slowest"] = {j: pairs[j] for j in low}
            # the slowest pairs again, to tell a sibling from a moment's noise
            out["pairs_again"] = {j: round(pool.run([cpus[0], j], "gemm", 3 * args.seconds)[cpus[0]] / base["gemm"], 3)
                                  for j in low}
            print(f"pairs: CPU 0 beside each CPU, rate over alone: min {min(pairs.values())} "
                  f"median {sorted(pairs.values())[len(pairs) // 2]} slowest {out['pairs_slowest']} "
                  f"again {out['pairs_again']}", flush=True)
        load = {}
        counts = sorted({n for n in (1, 2, 4, 8, 16, 32, len(cpus)) if n <= len(cpus)})
        for kernel in ("gemm", "stream"):
            for n in counts:
                r = pool.run(cpus[:n], kernel, 3 * args.seconds)
                v = sorted(r.values())
                load.setdefault(kernel, {})[n] = {"mean_over_alone": round(sum(v) / n / base[kernel], 3),
                                                  "min_over_alone": round(v[0] / base[kernel], 3),
                                                  "total": round(sum(v), 1)}
            print(f"load {kernel} ({'GFLOP/s' if kernel == 'gemm' else 'GB/s'} alone {base[kernel]:.1f}): " + ", ".join(
                f"{n} busy {x['mean_over_alone']} (min {x['min_over_alone']}, total {x['total']})"
                for n, x in load[kernel].items()), flush=True)
        # 8 busy: CPUs 0-7 (one block, as a pinned rank's threads) against 8 spread over the node
        if len(cpus) >= 16:
            spread = cpus[::len(cpus) // 8][:8]
            for kernel in ("gemm", "stream"):
                r = pool.run(spread, kernel, 3 * args.seconds)
                load[kernel]["8_spread"] = {"mean_over_alone": round(sum(r.values()) / 8 / base[kernel], 3),
                                            "cpus": spread}
        out["load"] = load
        out["probe_seconds"] = round(time.perf_counter() - t0, 2)
    finally:
        pool.close()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out} ({out['probe_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
