"""``python -m mpiml.dask SCRIPT.py``: see :mod:`mpiml.dask._launcher`."""

import sys

from mpiml.dask._launcher import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
