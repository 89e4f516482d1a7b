"""``mpiml info``: what this machine and this MPI job can use, and why not."""

import json
import platform
import socket
import sys

from . import parser

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


def _gpu_info():
    try:
        import cupy
    except Exception as exc:
        return {"available": False, "why": f"CuPy cannot be imported ({type(exc).__name__}); pip install 'mpiml[gpu]'"}
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
    return {"available": n > 0, "count": n, "devices": devices, "peer_access": peer, "cupy": cupy.__version__,
            "cuda_runtime": cupy.cuda.runtime.runtimeGetVersion(), "nccl": nccl}


def collect_local():
    return {"host": socket.gethostname(), "python": sys.version.split()[0], "platform": platform.platform(),
            "mpi": _mpi_info(), "gpu": _gpu_info()}


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
    local = collect_local()
    everyone = comm.allgather_obj(local)
    if comm.rank != 0:
        return 0
    from .. import __version__

    report = backend_report(local, comm.size)
    if args.json:
        print(json.dumps({"mpiml": __version__, "ranks": comm.size, "comm_backend": comm.backend,
                          "per_rank": everyone,
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
        print(f"GPUs: {gpu['count']} (CuPy {gpu['cupy']}, CUDA runtime {gpu['cuda_runtime']}, NCCL {gpu['nccl']})")
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
    print("backends:")
    for name, (ok, detail) in report.items():
        print(f"  {name:<5} {'available' if ok else 'unavailable'}: {detail}")
    return 0
