"""Device buffers over an MPI that is not CUDA-aware: stage through host memory.

Never hand a device pointer to an MPI that is not CUDA-aware: it crashes.
Whether MPI is CUDA-aware is decided by ``MPIML_CUDA_AWARE_MPI`` (1/0) or, when
unset, by a probe of the MPI library that never touches device memory.
"""

import numpy as np

from .._request import Request

__all__ = ["mpi_is_cuda_aware", "staged_isend", "staged_irecv", "staged_native"]


def mpi_is_cuda_aware(MPI):
    """True only when the MPI library says it is CUDA-aware (never by trying it)."""
    from ... import _config

    forced = _config.cuda_aware_mpi()
    if forced is not None:
        return forced
    query = getattr(MPI, "Query_cuda_support", None)
    if query is not None:
        try:
            return bool(query())
        except Exception:
            return False
    return False


def _to_host(buf):
    import cupy

    host = cupy.cuda.alloc_pinned_memory(buf.nbytes) if buf.nbytes else None
    arr = np.frombuffer(host, dtype=buf.dtype, count=buf.size) if host is not None else np.empty(0, buf.dtype)
    if buf.size:
        buf.get(out=arr)
    return arr


def _host_like(buf):
    import cupy

    if not buf.nbytes:
        return np.empty(0, buf.dtype)
    host = cupy.cuda.alloc_pinned_memory(buf.nbytes)
    return np.frombuffer(host, dtype=buf.dtype, count=buf.size)


def staged_isend(transport, buf, dest, tag):
    host = _to_host(buf)
    return transport.isend(host, dest, tag)


def staged_irecv(transport, buf, source, tag):
    host = _host_like(buf)
    inner = transport.irecv(host, source, tag)

    def test():
        if inner.test():
            if buf.size:
                buf.set(host)
            return True
        return False

    return Request(test, op="recv", peer=source)


def staged_native(transport, name, call, sendbuf, recvbuf):
    """Run a native MPI collective on host copies; copy the result back to the device."""
    same = sendbuf is recvbuf
    hsend = _to_host(sendbuf) if sendbuf is not None else None
    hrecv = hsend if same else (_host_like(recvbuf) if recvbuf is not None else None)
    inner = transport._wrap(call(hsend, hrecv), name, "all")

    def test():
        if inner.test():
            if recvbuf is not None and recvbuf.size and type(recvbuf).__module__.startswith("cupy"):
                recvbuf.set(hrecv)
            return True
        return False

    return Request(test, op=name, peer="all")
