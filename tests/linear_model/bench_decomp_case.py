"""One run of the SPMD benchmark ``mpiml.bench.ml_decomp`` as a case of a shared launch (test_bench_linear.py):
``main(OUTDIR, *ARGS)`` runs ``ml_decomp.main(ARGS + ["--json", OUTDIR/ml_<algo>.json])`` on every rank of the
launch, as ``mpiexec -n N python -m mpiml.bench.ml_decomp ARGS`` would, and records a non-zero exit."""

import os

from mpiml.bench import ml_decomp

from _spmd import check


def main(out, *args):
    args = list(args)
    algo = args[args.index("--algo") + 1]
    code = ml_decomp.main(args + ["--json", os.path.join(out, f"ml_{algo}.json")])
    check(code == 0, f"mpiml.bench.ml_decomp {' '.join(args)} returned {code}")
