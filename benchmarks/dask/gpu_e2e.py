"""End-to-end CuPy check over the launcher's cluster (client script).

    mpirun -n 4 python3 benchmarks/dask/gpu_rank.py --protocol mpi benchmarks/dask/gpu_e2e.py OUT.json

Checks, and writes as JSON: a CuPy dask.array computation equals its NumPy
twin; CuPy arrays survive scatter/gather and a worker-to-worker transfer; and a
comm-level mpi:// round trip in this process moves CUDA frames (device
memory, staged through the host unless MPIML_CUDA_AWARE_MPI=1).
"""

import asyncio
import json
import sys
import time
import traceback

import numpy as np


def check_array(client, out):
    import cupy
    import dask.array as da

    x = da.random.RandomState(0, RandomState=cupy.random.RandomState).random(
        (4000, 4000), chunks=(1000, 1000)).persist()
    got = (x + x.T).sum().compute()
    out["array_result_type"] = type(got).__module__
    host = x.map_blocks(cupy.asnumpy, dtype=x.dtype).compute()
    want = float((host + host.T).sum())
    out["array_sum"] = [float(got), want]
    assert np.isclose(float(got), want, rtol=1e-9), out["array_sum"]


def total(a):
    return float(a.sum())


def check_transfers(client, out):
    import cupy

    from mpiml.dask import worker_addresses

    workers = worker_addresses(client)
    data = cupy.arange(3_000_000, dtype=cupy.float64)
    [remote] = client.scatter([data], workers=[workers[0]])
    back = client.gather(remote)
    out["gather_type"] = type(back).__module__
    assert isinstance(back, cupy.ndarray) and bool((back == data).all())
    made = client.submit(cupy.arange, 2_000_000, dtype=cupy.float64, workers=[workers[0]],
                         pure=False)
    moved = client.submit(total, made, workers=[workers[-1]], pure=False).result()
    out["moved_sum"] = moved
    assert moved == float(np.arange(2_000_000, dtype=np.float64).sum())
    out["device_per_worker"] = client.run(lambda: int(cupy.cuda.runtime.getDevice()))


async def comm_roundtrip(out):
    import cupy
    from distributed.comm import connect, listen
    from distributed.protocol import to_serialize

    seen = {}

    async def handle(comm):
        msg = await comm.read()
        seen["type"] = type(msg["x"]).__module__
        await comm.write({"x": to_serialize(msg["x"] * 2)})
        await comm.close()

    x = cupy.random.default_rng(0).random(5_000_000)
    async with listen("mpi://", handle) as listener:
        comm = await connect(listener.contact_address)
        t0 = time.perf_counter()
        await comm.write({"x": to_serialize(x)})
        got = await comm.read()
        out["comm_roundtrip_seconds_40MB"] = time.perf_counter() - t0
        await comm.close()
    out["comm_server_type"] = seen["type"]
    out["comm_client_type"] = type(got["x"]).__module__
    assert isinstance(got["x"], cupy.ndarray) and bool((got["x"] == x * 2).all())


def main(path):
    from mpiml.dask import get_client
    from mpiml.dask._channel import cuda_aware

    client = get_client()
    out = {"protocol": client.scheduler.address.split("://")[0], "cuda_aware_mpi": cuda_aware()}
    status = 0
    for name, fn in [("array", lambda: check_array(client, out)),
                     ("transfers", lambda: check_transfers(client, out)),
                     ("comm", lambda: asyncio.run(comm_roundtrip(out)))]:
        try:
            fn()
            out[name] = "ok"
        except Exception:
            out[name] = traceback.format_exc()
            status = 1
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
