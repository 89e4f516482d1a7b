"""``python -m mpiml.dask`` with one GPU per worker rank (CuPy runs).

Sets ``CUDA_VISIBLE_DEVICES`` from the MPI rank before CUDA is initialised
(worker rank r gets GPU (r - 2) mod the number of GPUs; the scheduler and the
client see GPU 0), then runs the launcher with the same arguments.
"""

import os
import subprocess
import sys


def gpu_count():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        return max(1, sum(line.startswith("GPU ") for line in out.stdout.splitlines()))
    except (OSError, subprocess.SubprocessError):
        return 1


def main():
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.Get_rank()
    if "CUDA_VISIBLE_DEVICES" not in os.environ:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(max(rank - 2, 0) % gpu_count())
    from mpiml.dask import main as launch

    return launch(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
