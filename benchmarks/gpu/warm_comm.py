"""Compile the IPC collectives' kernels for this GPU into the kernel cache, every program at once.

    python3 benchmarks/gpu/warm_comm.py [--jobs N]

Where the shipped cubins do not match the sources (a branch whose ``kernels/comm`` changed, before the
cubins are rebuilt), every rank of a GPU run would compile each family (one NVRTC program per element
type, ~30 s of one core each) when it first calls it, inside the timed or time-limited steps. This
compiles those programs (``mpiml.kernels.build.specs`` of the device's architecture, the ``comm``
ones) in parallel into the cache that the ranks read (``ensure_cached``: nothing is compiled where a
shipped cubin or the cache already holds a program). Prints how each was served and the seconds.
"""

import argparse
import concurrent.futures
import os
import time

from mpiml.kernels import COMMON, _loader, build


def _one(args):
    files, exprs, arch, major = args
    t0 = time.perf_counter()
    how = _loader.ensure_cached(files, exprs, arch, major)
    return files[-1], exprs[0], how, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    import cupy

    cc = int(cupy.cuda.Device(0).compute_capability)
    arch = f"sm_{cc}"
    major = _loader._runtime_major()
    todo = [(tuple(files), list(exprs), arch, major) for files, exprs in build.specs(arch) if COMMON in files]
    t0 = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for file, first, how, secs in pool.map(_one, todo):
            print(f"{file} ({first}, ...): {how}, {secs:.1f} s", flush=True)
    print(f"warm_comm: {len(todo)} programs for {arch} in {time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
