#!/usr/bin/env python3
"""Compile a kernel family's CUDA source with NVRTC for a named architecture, no GPU needed.

    python scripts/nvrtc_check.py src/mpiml/kernels/distances_tc.cu \
        --expr 'mpiml_distances_small<float, 16, 16, 2>' --arch sm_90 [--prepend ipc_common.cuh]

Catches compile errors on a machine without a GPU before a device session is spent on them.
NVRTC comes from the ``nvidia-cuda-nvrtc`` wheel (``pip install nvidia-cuda-nvrtc``) or a CUDA
toolkit (``MPIML_NVRTC`` names the library). Prints the log; exits 1 when compilation fails.
"""

import argparse
import ctypes
import glob
import os
import site
import sys


def find_nvrtc():
    named = os.environ.get("MPIML_NVRTC")
    if named:
        return named
    roots = site.getsitepackages() + [site.getusersitepackages()]
    for root in roots:
        for hit in sorted(glob.glob(os.path.join(root, "nvidia", "cu*", "lib", "libnvrtc.so.*"))
                          + glob.glob(os.path.join(root, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.*"))):
            if "builtins" not in hit:
                return hit
    return "libnvrtc.so"


def compile_source(source, exprs, arch="sm_90", options=("--std=c++17",), name="mpiml.cu"):
    """(ok, log, cubin bytes or None, {expression: lowered name})."""
    lib = ctypes.CDLL(find_nvrtc())
    prog = ctypes.c_void_p()
    check = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None)
    if check:
        raise RuntimeError(f"nvrtcCreateProgram failed ({check})")
    for e in exprs:
        lib.nvrtcAddNameExpression(prog, e.encode())
    opts = [f"--gpu-architecture={arch}".encode()] + [o.encode() for o in options]
    arr = (ctypes.c_char_p * len(opts))(*opts)
    res = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, buf)
    log = buf.value.decode(errors="replace")
    cubin, lowered = None, {}
    if res == 0:
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        out = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetCUBIN(prog, out)
        cubin = out.raw
        for e in exprs:
            ptr = ctypes.c_char_p()
            lib.nvrtcGetLoweredName(prog, e.encode(), ctypes.byref(ptr))
            lowered[e] = ptr.value.decode()
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return res == 0, log, cubin, lowered


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", help="CUDA sources, concatenated in order")
    ap.add_argument("--expr", action="append", default=[], help="a name expression to instantiate (repeatable)")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--option", action="append", default=[], help="an extra NVRTC option (repeatable)")
    args = ap.parse_args(argv)
    source = "\n".join(open(f).read() for f in args.files)
    ok, log, cubin, lowered = compile_source(source, args.expr, args.arch, ("--std=c++17", *args.option))
    if log.strip():
        print(log)
    if ok:
        print(f"ok: {len(cubin)} bytes of {args.arch} cubin; " + ", ".join(f"{k} -> {v}" for k, v in lowered.items()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
