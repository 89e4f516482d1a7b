"""Device point-to-point through ``comm.isendrecv``: rings of CuPy arrays (run under mpirun).

Usage: ``python gpu_sendrecv.py``.  Every rank sends arrays whose shapes and dtypes differ per
rank to the next and receives the previous one's, several steps in a row (as the neighbours'
ring does), each step's four arrays posted in the same order on every rank. Checked: the
values, shapes and dtypes; that the NCCL transport carried them; that a sender may overwrite
its array once ``wait()`` returned (the transfer is ordered before later work on the stream);
host arrays and empty arrays.
"""

import numpy as np

from _spmd import assert_close, check, guarded

import cupy as cp  # noqa: E402

from mpiml import init  # noqa: E402
from mpiml.comm import get_comm  # noqa: E402

comm = get_comm()
init(device="gpu")  # local rank mod visible GPUs
P, R = comm.size, comm.rank
DTYPES = [np.float32, np.int64, np.float16, np.bool_]


def block(rank, step, i):
    """Rank ``rank``'s i-th array of ``step`` (host): its length differs per rank; one is 2-D."""
    n = 3000 * (rank + 1) + 7 * step + i
    a = (np.arange(n) * (rank + 1) + step) % 11
    a = a.astype(DTYPES[i])
    return a.reshape(-1, 1 + (n % 3 == 0) * 2) if i == 1 else a


def main():
    right, left = (R + 1) % P, (R - 1) % P
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        for step in range(6):
            xs = [cp.asarray(block(R, step, i)) for i in range(len(DTYPES))]
            reqs = [comm.isendrecv(x, right, left, tag=20 + i) for i, x in enumerate(xs)]
            got = [r.wait() for r in reqs]
            for x in xs:  # after wait(): ordered after the transfer, so what was sent stays intact
                x[...] = 0
            for i, g in enumerate(got):
                assert_close(g, block(left, step, i), f"step {step} array {i} from rank {left}", exact=True)
        if P > 1:
            check("nccl" in comm._device_transports, "isendrecv of device arrays did not go over NCCL")
        empty = comm.isendrecv(cp.empty((0, 3), cp.float32), right, left, tag=30).wait()
        check(empty.shape == (0, 3) and isinstance(empty, cp.ndarray), f"empty: {type(empty)} {empty.shape}")
        host = comm.isendrecv(np.arange(5) + R, right, left, tag=31).wait()
        check(isinstance(host, np.ndarray), f"host arrays: got {type(host)}")
        assert_close(host, np.arange(5) + left, "host arrays", exact=True)
        stream.synchronize()


guarded(main, comm)
