#!/usr/bin/env python3
"""Compile a kernel family's CUDA source with NVRTC for a named architecture, no GPU needed.

    K=src/mpiml/kernels/kmeans
    PYTHONPATH=src python scripts/nvrtc_check.py $K/tc_common.cuh $K/tc.cu $K/sums.cu $K/small.cu $K/small_tc.cu \
        --expr 'mpiml_distances_small<float, float, 16, 16, 16, 1, 2, 2, true>' --arch sm_90

Catches compile errors on a machine without a GPU before a device session is spent on them. The
sources are concatenated in order (give ``kernels/ipc_common.cuh`` first for the collectives). It
compiles through the kernel loader's NVRTC (:func:`mpiml.kernels._loader.compile_cubin`: CuPy's
NVRTC where CuPy imports, else the ``nvidia-cuda-nvrtc`` wheel or ``MPIML_NVRTC``). Prints the
lowered names; exits 1 with NVRTC's log when compilation fails.
"""

import argparse
import sys

from mpiml.kernels._loader import DEFAULT_OPTIONS, compile_cubin


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="CUDA sources, concatenated in order")
    ap.add_argument("--expr", action="append", default=[], help="a name expression to instantiate (repeatable)")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--option", action="append", default=[], help="an extra NVRTC option (repeatable)")
    args = ap.parse_args(argv)
    source = "\n".join(open(f).read() for f in args.files)
    try:
        cubin, lowered = compile_cubin(source, args.expr, args.arch, (*DEFAULT_OPTIONS, *args.option))
    except RuntimeError as exc:
        print(exc)
        return 1
    print(f"ok: {len(cubin)} bytes for {args.arch}; " + ", ".join(f"{k} -> {v}" for k, v in lowered.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
