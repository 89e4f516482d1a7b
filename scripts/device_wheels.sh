#!/usr/bin/env bash
# Fill the git-ignored .whl/ with the wheels that the GPU host's Python (3.12, no registry) lacks, for
# `run` to carry (carry: [".whl"]); scripts/device_pass.sh installs them under /tmp/pfx.
#   dask, distributed (+ their needs): the dask part and seed 001
#   scikit-learn-intelex, daal, tbb: the CPU benchmarks' peer (~41 MB of the 64 MiB a call carries)
set -eu
cd "$(dirname "$0")/.."
PIP=${PIP:-python3 -m pip}
ver() { $PIP show "$1" 2>/dev/null | awk '/^Version/{print $2}'; }
mkdir -p .whl
$PIP download -q -d .whl --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    "dask==$(ver dask)" "distributed==$(ver distributed)"
$PIP download -q -d .whl --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
    "scikit-learn-intelex==$(ver scikit-learn-intelex)" "daal==$(ver daal)" tbb
du -sh .whl
