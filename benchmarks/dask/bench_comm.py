"""Comm-level latency and throughput of mpi:// against tcp://, through Dask's Comm API.

Run on two ranks (rank 0 echoes, rank 1 measures)::

    mpiexec -n 2 python benchmarks/dask/bench_comm.py --out benchmarks/results/dask_comm_vm.json

For each protocol and message size (1 B .. 64 MiB, a NumPy ``uint8`` payload
sent out of band with ``to_serialize``, as Dask sends data; with ``--device gpu``
a CuPy payload on GPU ``rank % n_gpus``, which mpi:// keeps on the device and
stages through pinned memory unless MPI is CUDA-aware):

* latency: ping-pong, half the median round trip (the MPI4Dask paper's
  one-to-one latency);
* throughput: ``window`` messages written back to back, one small
  acknowledgement, size * window / time (best of the repetitions).

Both protocols are measured in the same job, one after the other.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time

import numpy as np
from mpi4py import MPI

import mpiml.dask
from mpiml.dask import _backend  # noqa: F401  (registers mpi://)

from distributed.comm import connect, listen  # noqa: E402
from distributed.protocol import to_serialize  # noqa: E402

WORLD = MPI.COMM_WORLD
RANK = WORLD.Get_rank()


def sizes(max_bytes):
    out, n = [], 1
    while n <= max_bytes:
        out.append(n)
        n *= 4
    return out


def iterations(nbytes, budget_bytes, lo, hi):
    return int(max(lo, min(hi, budget_bytes // max(nbytes, 1))))


async def serve(comm):
    while True:
        msg = await comm.read()
        op = msg["op"]
        if op == "ping":
            await comm.write({"op": "pong", "x": to_serialize(msg["x"])})
        elif op == "bw":
            for _ in range(msg["window"] - 1):
                await comm.read()
            await comm.write({"op": "ack"})
        else:
            await comm.close()
            return


async def barrier():
    req = WORLD.Ibarrier()
    while not req.Test():
        await asyncio.sleep(0.001)


async def server(protocol):
    done = asyncio.Event()

    async def handle(comm):
        await serve(comm)
        done.set()

    address = {"mpi": "mpi://", "tcp": "tcp://127.0.0.1"}[protocol]
    async with listen(address, handle) as listener:
        WORLD.bcast(listener.contact_address, root=0)
        await done.wait()
    await barrier()


async def client(protocol, args):
    address = WORLD.bcast(None, root=0)
    comm = await connect(address)
    rows = []
    for nbytes in sizes(args.max_bytes):
        payload = np.random.default_rng(nbytes).integers(0, 255, nbytes, dtype=np.uint8)
        if args.device == "gpu":
            import cupy

            payload = cupy.asarray(payload)
        ping = {"op": "ping", "x": to_serialize(payload)}
        n_iter = iterations(nbytes, args.budget, 5, args.iters)
        for _ in range(min(10, n_iter)):
            await comm.write(ping)
            await comm.read()
        rtts = []
        for _ in range(n_iter):
            t0 = time.perf_counter()
            await comm.write(ping)
            got = await comm.read()
            rtts.append(time.perf_counter() - t0)
        assert got["x"].nbytes == nbytes
        window = args.window if nbytes <= 2**20 else max(2, args.window // 4)
        reps = iterations(nbytes * window, args.budget * 2, 3, 20)
        msgs = [{"op": "bw", "window": window, "x": to_serialize(payload)}] + [
            {"op": "data", "x": to_serialize(payload)}
        ] * (window - 1)
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            for m in msgs:
                await comm.write(m)
            await comm.read()
            best = min(best, time.perf_counter() - t0)
        row = {
            "bytes": nbytes,
            "latency_us": float(np.median(rtts)) / 2 * 1e6,
            "latency_p10_us": float(np.percentile(rtts, 10)) / 2 * 1e6,
            "iterations": n_iter,
            "window": window,
            "throughput_MBps": nbytes * window / best / 1e6,
        }
        rows.append(row)
        print(f"{protocol:>4} {nbytes:>10} B  latency {row['latency_us']:10.1f} us  "
              f"throughput {row['throughput_MBps']:10.1f} MB/s", flush=True)
    await comm.write({"op": "stop"})
    try:
        await comm.read()
    except Exception:
        pass
    await comm.close()
    await barrier()
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="JSON file (rank 1 writes it)")
    parser.add_argument("--max-bytes", type=int, default=64 * 2**20)
    parser.add_argument("--iters", type=int, default=200, help="ping-pongs for small sizes")
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--budget", type=int, default=256 * 2**20,
                        help="bytes moved per size and test (fewer iterations for big sizes)")
    parser.add_argument("--protocols", default="mpi,tcp")
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="payload in host memory (NumPy) or on the GPU (CuPy)")
    args = parser.parse_args(argv)
    if args.device == "gpu":
        import cupy

        cupy.cuda.Device(RANK % cupy.cuda.runtime.getDeviceCount()).use()
    if WORLD.Get_size() != 2:
        if RANK == 0:
            print("bench_comm.py needs exactly 2 ranks: mpiexec -n 2 python bench_comm.py",
                  file=sys.stderr)
        return 2
    mpiml.dask.initialize()
    results = {}
    for protocol in args.protocols.split(","):
        if RANK == 0:
            asyncio.run(server(protocol))
        else:
            results[protocol] = asyncio.run(client(protocol, args))
    mpiml.dask.finalize()
    if RANK == 1:
        from mpiml.dask._progress import poll_settings

        spin, _, max_pause = poll_settings()
        report = {
            "benchmark": "dask comm ping-pong latency and windowed throughput",
            "machine": {"hostname": platform.node(), "cpu_count": os.cpu_count(),
                        "mpi": MPI.Get_library_version().splitlines()[0].strip()},
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": "mpiexec -n 2 python " + " ".join([sys.argv[0], *sys.argv[1:]]),
            "settings": {"MPIML_DASK_SPIN": spin, "MPIML_DASK_POLL_MAX": max_pause,
                         "window": args.window, "device": args.device,
                         "MPIML_DASK_STAGING_BYTES": os.environ.get("MPIML_DASK_STAGING_BYTES", "default"),
                         "MPIML_CUDA_AWARE_MPI": os.environ.get("MPIML_CUDA_AWARE_MPI", "unset")},
            "results": results,
        }
        if "mpi" in results and "tcp" in results:
            report["ratios_tcp_over_mpi"] = [
                {"bytes": m["bytes"],
                 "latency": t["latency_us"] / m["latency_us"],
                 "throughput_mpi_over_tcp": m["throughput_MBps"] / t["throughput_MBps"]}
                for m, t in zip(results["mpi"], results["tcp"])
            ]
        if args.out:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
