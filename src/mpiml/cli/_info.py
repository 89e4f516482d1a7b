"""``mpiml info``: what this machine and this MPI job can use, and why not."""

import glob
import json
import os
import platform
import socket
import sys

from ._options import parser

__all__ = ["main", "collect_local", "backend_report"]


def _mpi_info():
    try:
        from mpi4py import MPI
    except Exception as exc:
        return {"available": False, "why": f"mpi4py cannot be imported ({exc}); pip install mpi4py mpich"}
    import mpi4py

    from ..comm.backends._staging import mpi_is_cuda_aware

    lib = " ".join(MPI.Get_library_version().strip().splitlines()[0].split())
    return {
        "available": True,
        "mpi4py": mpi4py.__version__,
        "library": lib,
        "standard": "{}.{}".format(*MPI.Get_version()),
        "cuda_aware": mpi_is_cuda_aware(MPI),
        "cuda_aware_how": "MPIML_CUDA_AWARE_MPI or MPI.Query_cuda_support (never probed with a device pointer)",
    }


def driver_cuda_version():
    """The CUDA version the installed driver supports, as (major, minor), or None without a driver.

    Read from ``libcuda`` itself through ctypes, so it works before any CuPy is installed.
    """
    import ctypes

    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        version = ctypes.c_int(0)
        try:
            if lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
                return None
        except AttributeError:
            return None
        return version.value // 1000, (version.value % 1000) // 10
    return None


def cupy_extra(driver):
    """The pip extra whose CuPy wheel fits a driver of CUDA ``driver`` = (major, minor)."""
    if driver is None:
        return None
    return "cuda13" if driver[0] >= 13 else "cuda12" if driver[0] == 12 else None


def _cupy_advice():
    driver = driver_cuda_version()
    extra = cupy_extra(driver)
    if driver is None:
        return "no NVIDIA driver found (libcuda); mpiml runs on the CPU"
    if extra is None:
        return f"the driver supports CUDA {driver[0]}.{driver[1]}, older than any CuPy wheel mpiml offers (12, 13)"
    return f"the driver supports CUDA {driver[0]}.{driver[1]}: pip install 'mpiml[{extra}]'"


def _gpu_info():
    try:
        import cupy
    except Exception as exc:
        return {"available": False, "why": f"CuPy cannot be imported ({type(exc).__name__}); {_cupy_advice()}",
                "driver_cuda": driver_cuda_version()}
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return {"available": False, "why": f"no CUDA device ({exc})", "cupy": cupy.__version__}
    devices = []
    for i in range(n):
        props = cupy.cuda.runtime.getDeviceProperties(i)
        devices.append({"id": i, "name": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
                        "memory_gib": round(props["totalGlobalMem"] / 2**30, 1)})
    peer = []
    for i in range(n):
        peer.append([bool(i == j or cupy.cuda.runtime.deviceCanAccessPeer(i, j)) for j in range(n)])
    nccl = None
    try:
        from cupy.cuda import nccl as _nccl

        v = _nccl.get_version()
        nccl = f"{v // 10000}.{(v // 100) % 100}.{v % 100}" if v >= 10000 else str(v)
    except Exception as exc:
        nccl = f"unavailable ({type(exc).__name__})"
    driver = driver_cuda_version()
    runtime = cupy.cuda.runtime.runtimeGetVersion()
    fits = None
    if driver is not None and runtime // 1000 > driver[0]:
        fits = (f"CuPy was built for CUDA {runtime // 1000} but the driver supports only {driver[0]}.{driver[1]}; "
                f"{_cupy_advice()}")
    return {"available": n > 0, "count": n, "devices": devices, "peer_access": peer, "cupy": cupy.__version__,
            "cuda_runtime": runtime, "driver_cuda": driver, "nccl": nccl, "cupy_mismatch": fits}


def collect_local():
    return {"host": socket.gethostname(), "python": sys.version.split()[0], "platform": platform.platform(),
            "mpi": _mpi_info(), "gpu": _gpu_info()}


def kernel_info(gpu):
    """Where compiled kernels come from here: the shipped architectures, those for GPU 0, the cache."""
    from ..kernels import _loader

    cache = _loader.cache_dir()
    cached = len(glob.glob(os.path.join(cache, "*", "*.cubin")))
    out = {"cache": cache, "cached_cubins": cached, "shipped": _loader.prebuilt_archs(), "this_gpu": None}
    if gpu.get("available"):
        import cupy

        cc = int(cupy.cuda.Device(0).compute_capability)
        out["this_gpu"] = {"arch": f"sm_{cc}", "prebuilt": _loader.prebuilt_summary(cc)}
    out["cupy_warm"] = cupy_warm_info(gpu)
    from ..kernels import _cupy_ship

    out["cupy_ship"] = _cupy_ship.info(bool(gpu.get("available")))
    return out


def cupy_warm_info(gpu):
    """The shipped list of CuPy's own kernels (mpiml.kernels._cupy_warm) and whether it fits the CuPy here."""
    from ..kernels import _cupy_warm

    try:
        m = _cupy_warm.read_manifest()
    except ValueError as exc:
        return {"manifest": None, "why": str(exc)}
    if m is None:
        return {"manifest": None, "why": f"not shipped ({_cupy_warm.MANIFEST})"}
    out = {"manifest": _cupy_warm.MANIFEST, "entries": len(m["entries"]), "cupy": m["cupy"], "nvrtc": m["nvrtc"],
           "setting": os.environ.get("MPIML_CUPY_WARM") or "unset (off but for mpiml run and mpiml warmup)",
           "cupy_cache": os.environ.get("CUPY_CACHE_DIR") or os.path.expanduser("~/.cupy/kernel_cache")}
    if gpu.get("available"):
        import cupy

        out["matches"] = cupy.__version__ == m["cupy"]
    return out


def backend_report(local, size):
    """Which backends can run here, and why not (a dict name -> (ok, reason))."""
    mpi, gpu = local["mpi"], local["gpu"]
    report = {"self": (True, "always (single process)")}
    report["mpi"] = (mpi["available"], mpi.get("library", mpi.get("why", "")))
    if not gpu["available"]:
        why = gpu.get("why", "no GPU")
        report["nccl"] = (False, why)
        report["ipc"] = (False, why)
        return report
    nccl = gpu.get("nccl", "")
    report["nccl"] = (not str(nccl).startswith("unavailable"), f"NCCL {nccl}")
    if size < 2:
        report["ipc"] = (True, "CUDA IPC (used when 2 or more ranks share a host)")
    else:
        report["ipc"] = (True, "CUDA IPC between ranks of one host")
    return report


def main(argv):
    p = parser("mpiml info", "Show the MPI library, CUDA-awareness, GPUs, NCCL and the backends available.")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = p.parse_args(argv)

    from ..comm import get_comm

    comm = get_comm()
    from ..utils._threads import limit_threads

    threads = limit_threads(comm)
    local = collect_local()
    local["threads"] = threads
    everyone = comm.allgather_obj(local)
    if comm.rank != 0:
        return 0
    from .. import __version__

    report = backend_report(local, comm.size)
    if args.json:
        print(json.dumps({"mpiml": __version__, "ranks": comm.size, "comm_backend": comm.backend,
                          "per_rank": everyone, "kernels": kernel_info(local["gpu"]),
                          "backends": {k: {"ok": v[0], "detail": v[1]} for k, v in report.items()}}, indent=2))
        return 0
    mpi, gpu = local["mpi"], local["gpu"]
    print(f"mpiml {__version__}   python {local['python']}   {local['platform']}")
    print(f"job: {comm.size} rank(s), communicator backend {comm.backend!r}, hosts: "
          f"{sorted({r['host'] for r in everyone})}")
    if mpi["available"]:
        print(f"MPI: {mpi['library']} (MPI {mpi['standard']}, mpi4py {mpi['mpi4py']})")
        print(f"  CUDA-aware: {'yes' if mpi['cuda_aware'] else 'no'}  "
              f"(decided by {mpi['cuda_aware_how']}; device buffers are "
              f"{'passed directly' if mpi['cuda_aware'] else 'staged through pinned host memory'})")
    else:
        print(f"MPI: not available: {mpi['why']}")
    if gpu["available"]:
        driver = gpu.get("driver_cuda")
        print(f"GPUs: {gpu['count']} (CuPy {gpu['cupy']}, CUDA runtime {gpu['cuda_runtime']}, "
              f"driver CUDA {'%d.%d' % tuple(driver) if driver else '?'}, NCCL {gpu['nccl']})")
        if gpu.get("cupy_mismatch"):
            print(f"  warning: {gpu['cupy_mismatch']}")
        for d in gpu["devices"]:
            print(f"  [{d['id']}] {d['name']}, {d['memory_gib']} GiB")
        if gpu["count"] > 1:
            full = all(all(row) for row in gpu["peer_access"])
            print(f"  peer access between all pairs: {'yes' if full else 'no'}")
        per_rank = ", ".join(f"rank {i}: {r['gpu'].get('count', 0)} GPU(s) on {r['host']}"
                             for i, r in enumerate(everyone))
        print(f"  {per_rank}")
    else:
        print(f"GPUs: none ({gpu['why']})")
    kern = kernel_info(gpu)
    print(f"kernels: shipped for {', '.join(kern['shipped']) or 'no architecture'}; cache {kern['cache']} "
          f"({kern['cached_cubins']} cubins; MPIML_KERNEL_CACHE sets it)")
    if kern["this_gpu"]:
        got = kern["this_gpu"]["prebuilt"]
        print(f"  {kern['this_gpu']['arch']}: " + (", ".join(f"{g['kernels']} kernels precompiled in {g['cubins']} "
                                                          f"cubins ({g['arch']}, NVRTC {g['nvrtc']})" for g in got)
                                                 if got else "none precompiled: `mpiml warmup` compiles them once"))
    w = kern["cupy_warm"]
    print("CuPy's kernels listed to compile ahead: " + (
        f"{w['entries']} recorded with CuPy {w['cupy']} (NVRTC {'.'.join(map(str, w['nvrtc']))})"
        + ("" if w.get("matches", True) else ", not this CuPy: not used")
        + f"; MPIML_CUPY_WARM={w['setting']}; into {w['cupy_cache']} (CUPY_CACHE_DIR)" if w["manifest"] else w["why"]))
    s = kern["cupy_ship"]
    print("CuPy's kernels shipped compiled: " + ("; ".join(
        f"{z['zip']} ({z.get('count')} files, CuPy {z.get('cupy')}, NVRTC {'.'.join(map(str, z.get('nvrtc') or []))})"
        for z in s["shipped"]) or "none") + ("" if "fits" not in s else (
        f"; {'used' if s['fits'] else 'none fits'} here (sm_{s['arch']}, CuPy {s['cupy']}, NVRTC "
        f"{'.'.join(map(str, s['nvrtc']))}), written by mpiml.init into {s['cache_dir']} unless MPIML_CUPY_SHIP=0"))
          + (f"; this process: {s['status']['state']}" if s["status"].get("state") != "not started" else ""))
    print(f"CPU threads per rank: {threads['threads']} ({threads['source']})")
    from ..utils._placement import describe_topology

    topo = describe_topology()
    print(f"CPU placement (node: {topo['cpus']} CPUs, {topo['cores']} physical cores, {topo['numa_nodes']} NUMA "
          f"node(s), {topo['llc']['count']} L{topo['llc']['level']} cache(s); MPIML_BIND=auto pins each rank to its own cores):")
    for i, r in enumerate(everyone):
        print(f"  rank {i} on {r['host']}: {r['threads'].get('placement')}")
    print("backends:")
    for name, (ok, detail) in report.items():
        print(f"  {name:<5} {'available' if ok else 'unavailable'}: {detail}")
    return 0
