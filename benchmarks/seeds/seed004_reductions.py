"""Seed 004: reduce / allreduce / scan designs, where each wins by message size, and the cost
model's prediction next to the measurement.

    mpiexec -n 4 python benchmarks/seeds/seed004_reductions.py --json benchmarks/seeds/results/seed004_vm.json \
        --plot benchmarks/seeds/results/seed004_vm.png [--device gpu]

1. The model's constants are measured first, on this machine and buffer kind: ``alpha`` and
   ``beta`` from a ping-pong between ranks 0 and 1 (latency at 8 B, bandwidth at 4 MiB), ``gamma``
   from a local ``x += y`` (the reduction our algorithms run between messages).
2. Every algorithm of each op (forced with ``algorithm=``, MPI's or NCCL's own as "native") is
   timed at sizes 8 B-16 MiB (median of several rounds, each call ended by a barrier).
3. Each algorithm's registered cost formula (``mpiml.comm.algorithms``: a pure function of bytes,
   ranks and the model) predicts the same points; the JSON holds both, the table prints the
   winner by measurement and by prediction, the plot shows measured lines and predicted dashes.
4. ``auto`` (no algorithm forced: the communicator's own device path on GPUs, IPC or NCCL kernels
   reducing on the GPU) at the same points, against ``native`` (MPI's own collective: on GPUs
   without a CUDA-aware MPI, the reduction on the host after staging).  Their ratio at the largest
   size is the document's comparison of a GPU-kernel reduction with the host-reduction default
   (its allreduce 1.7x faster at 32 GPUs, 1.8x at 96).

The document's designs ran over InfiniBand between GPU nodes; ours are one node (NVLink, or CPU
ranks sharing cores).
"""

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _seeds  # noqa: E402

OPS = ("reduce", "allreduce", "scan")
DOC = {
    "source": "shared/seeds/004 (GPU-kernel reductions in MPI collectives; cost models of host-staged, "
              "kernel-based and two-level designs; up to 96 GPUs over InfiniBand)",
    "figure": "GPU-kernel allreduce 1.7x (32 GPUs) / 1.8x (96 GPUs) faster than the host-reduction default; "
              "gather-first best for small messages, k-nomial GPU reduction for large; the cost models "
              "predict which design wins",
    "kernel_speedup": 1.7,
    "their_peer": "MVAPICH2-GDR's default (reduction on the host)",
}


def _timeit(fn, comm, reps):
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    comm.barrier()
    return (time.perf_counter() - t0) / reps


def measure_model(comm, xp, sync):
    from mpiml.comm.algorithms import CostModel

    p2p = {}
    for nbytes in (8, 4 << 20):
        x = xp.ones(nbytes // 8, dtype=xp.float64)
        reps = 200 if nbytes < 1024 else 20
        t = []
        for _ in range(3):
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(reps):
                if comm.rank == 0:
                    comm.send(x, 1)
                    comm.recv(1)
                elif comm.rank == 1:
                    comm.recv(0)
                    comm.send(x, 0)
            sync()
            t.append((time.perf_counter() - t0) / reps / 2)
        p2p[nbytes] = comm.bcast_obj(float(np.median(t)))
    alpha = p2p[8]
    beta = max((p2p[4 << 20] - alpha) / (4 << 20), 1e-13)
    y = xp.ones(1 << 20, dtype=xp.float64)
    z = xp.ones(1 << 20, dtype=xp.float64)

    def red():
        y.__iadd__(z)
        sync()

    gamma = comm.bcast_obj(float(_timeit(red, comm, 50) / y.nbytes))
    return CostModel(alpha=alpha, beta=beta, gamma=gamma, launch=0.0), p2p


def summarise(rows, sizes):
    """native / auto per op at the largest size (above 1: the device path faster) against the document's
    1.7x; the measured / predicted time of each design (the model's error), median per size."""
    big = sizes[-1]
    t = {(r["op"], r["algorithm"], r["bytes"]): r["measured_s"] for r in rows}
    speed = {op: _seeds.ratio(t.get((op, "native", big)), t.get((op, "auto", big)))
             for op in dict.fromkeys(r["op"] for r in rows)}
    error = {}
    for nbytes in sizes:
        q = [r["measured_s"] / r["predicted_s"] for r in rows
             if r["bytes"] == nbytes and r["predicted_s"] and r["measured_s"] > 0]
        if q:
            error[str(nbytes)] = float(np.median(q))
    return {"largest_bytes": big, "native_over_auto_largest": speed,
            "vs_document": _seeds.ratio(speed.get("allreduce"), DOC["kernel_speedup"]),
            "measured_over_predicted_median": error}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--sizes", default="8,64,512,4096,32768,262144,2097152,16777216")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    args = ap.parse_args()

    import mpiml
    from mpiml.comm import algorithm_names, get_comm
    from mpiml.comm.algorithms import ALGORITHMS

    comm = get_comm()
    if args.device == "gpu":
        mpiml.init(device="gpu")
        import cupy as xp

        def sync():
            xp.cuda.get_current_stream().synchronize()
    else:
        xp = np

        def sync():
            pass

    model, p2p = measure_model(comm, xp, sync)
    sizes = [int(s) for s in args.sizes.split(",")]
    ops = [o for o in args.ops.split(",") if o in OPS]
    rows = []
    result = {"seed": "004", "experiment": "reduce / allreduce / scan designs by size vs their cost model; "
              "the device path (auto) vs MPI's own (native)",
              "machine": _seeds.machine(comm), **_seeds.stamp(comm.size), "ranks": comm.size,
              "device": args.device, "peer": "native: MPI's own collective (host-staged on GPUs), same run",
              "document": DOC, "model": {"alpha_s": model.alpha, "beta_s_per_byte": model.beta,
                                         "gamma_s_per_byte": model.gamma},
              "pingpong_s": {str(k): v for k, v in p2p.items()}, "rows": rows}
    for op in ops:
        names = ["auto"] + [n for n in algorithm_names(op) if n != "linear" or comm.size <= 4]
        for nbytes in sizes:
            x = xp.ones(max(1, nbytes // 8), dtype=xp.float64)
            for name in names:
                kw = {} if name == "auto" else {"algorithm": name}
                call = {"reduce": lambda: comm.reduce(x, root=0, **kw),
                        "allreduce": lambda: comm.allreduce(x, **kw),
                        "scan": lambda: comm.scan(x, **kw)}[op]
                try:
                    call()
                except ValueError:
                    continue
                reps = 50 if nbytes <= 32768 else 5
                times = []
                for _ in range(args.rounds):
                    def one():
                        call()
                        sync()
                    times.append(_timeit(one, comm, reps))
                t = comm.allreduce_obj(float(np.median(times)), op="max")
                alg = ALGORITHMS[op].get(name)
                pred = float(alg.cost(nbytes, comm.size, model)) if alg is not None else None
                rows.append({"op": op, "algorithm": name, "bytes": nbytes, "measured_s": t, "predicted_s": pred})
        if comm.rank == 0:  # after every op: a run cut short keeps what it measured
            result["summary"] = summarise(rows, sizes)
            _seeds.write_json(result, args.json)
    if comm.rank != 0:
        return
    print(f"seed 004 on {comm.size} ranks, {args.device} buffers; model alpha={model.alpha * 1e6:.2f} us, "
          f"beta={1 / model.beta / 1e9:.2f} GB/s, gamma={1 / model.gamma / 1e9:.2f} GB/s reduced")
    print(f"{'op':<10}{'bytes':>10}  {'fastest measured':<34}{'fastest predicted (ours)':<34}")
    agree = total = 0
    for op in ops:
        for nbytes in sizes:
            pts = [r for r in rows if r["op"] == op and r["bytes"] == nbytes]
            if not pts:
                continue
            best = min(pts, key=lambda r: r["measured_s"])
            ours = [r for r in pts if r["predicted_s"] is not None]
            pbest = min(ours, key=lambda r: r["predicted_s"]) if ours else None
            mbest = min(ours, key=lambda r: r["measured_s"]) if ours else None
            if pbest:
                total += 1
                agree += pbest["algorithm"] == mbest["algorithm"]
            print(f"{op:<10}{nbytes:>10}  {best['algorithm']:<18}{best['measured_s'] * 1e6:>10.1f} us    "
                  f"{(pbest or {}).get('algorithm', '-'):<18}"
                  f"{(pbest['predicted_s'] * 1e6 if pbest else float('nan')):>10.1f} us")
    print(f"the model picks the fastest of our algorithms at {agree} of {total} (op, size) points")
    result["model_picks_fastest"] = {"agree": agree, "points": total}
    summary = result["summary"] = summarise(rows, sizes)
    for op, v in summary["native_over_auto_largest"].items():
        print(f"{op}: native (MPI's own) / auto (the device path) at {sizes[-1]} B: {_seeds.fmt(v)}x "
              f"(document: GPU-kernel allreduce {DOC['kernel_speedup']}x the host reduction)")
    _seeds.write_json(result, args.json)
    _seeds.readme_row([
        "004", f"{comm.size} {'GPUs' if args.device == 'gpu' else 'CPU ranks'}",
        f"GPU-kernel allreduce {DOC['kernel_speedup']}x the host reduction; the models predict the winner",
        f"native / auto at {sizes[-1]} B: " + ", ".join(f"{op} {_seeds.fmt(v)}x"
                                                         for op, v in summary["native_over_auto_largest"].items())
        + f"; the model picks the fastest design at {agree} of {total} points",
        "native", _seeds.fmt(summary["vs_document"]), result["command"]])
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(ops), figsize=(5 * len(ops), 4), sharey=True, squeeze=False)
        axes = axes[0]
        for ax, op in zip(axes, ops):
            for name in sorted({r["algorithm"] for r in rows if r["op"] == op}):
                pts = [r for r in rows if r["op"] == op and r["algorithm"] == name]
                line, = ax.loglog([r["bytes"] for r in pts], [r["measured_s"] * 1e6 for r in pts], "o-", label=name)
                if pts[0]["predicted_s"] is not None:
                    ax.loglog([r["bytes"] for r in pts], [r["predicted_s"] * 1e6 for r in pts], "--",
                              color=line.get_color(), alpha=0.6)
            ax.set_title(f"{op}, {comm.size} ranks ({args.device})")
            ax.set_xlabel("message size (bytes)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8, loc="upper left")
        axes[0].set_ylabel("time per call (us); dashed: cost model")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=110)


if __name__ == "__main__":
    main()
