"""``mpiml warmup``: compile, once per machine, the kernels that the package does not ship for this GPU.

1. The kernels the estimators use at common shapes (:func:`mpiml.kernels.build.specs`) that no shipped cubin
   holds are compiled into the kernel cache (``MPIML_KERNEL_CACHE``), several programs at a time.  With
   ``--arch sm_XY`` this needs no GPU (a login node can fill a cluster's shared cache).
2. On a GPU, CuPy's own element-wise and reduction kernels that the package's manifest lists
   (:mod:`mpiml.kernels._cupy_warm`) are compiled into CuPy's cache, in parallel; then (unless ``--no-fit``)
   each estimator is fitted once on a small sample, which compiles whatever the manifest misses.

Run it once after installing, or in a cluster job's prologue; under ``mpiexec`` every rank may run it (the
ranks of a node share the work through the cache's file locks).
"""

import concurrent.futures
import os
import time

from ._options import parser

__all__ = ["main"]

_FITS = {
    "kmeans": lambda X, yc, yr: __import__("mpiml.cluster", fromlist=["KMeans"]).KMeans(
        n_clusters=32, random_state=0, max_iter=3).fit(X),
    "rf": lambda X, yc, yr: __import__("mpiml.ensemble", fromlist=["x"]).RandomForestClassifier(
        n_estimators=2, max_depth=8, random_state=0).fit(X, yc),
    "rfr": lambda X, yc, yr: __import__("mpiml.ensemble", fromlist=["x"]).RandomForestRegressor(
        n_estimators=2, max_depth=8, random_state=0).fit(X, yr),
    "logreg": lambda X, yc, yr: __import__("mpiml.linear_model", fromlist=["x"]).LogisticRegression(
        max_iter=5).fit(X, yc),
    "linreg": lambda X, yc, yr: __import__("mpiml.linear_model", fromlist=["x"]).LinearRegression().fit(X, yr),
    "pca": lambda X, yc, yr: __import__("mpiml.decomposition", fromlist=["x"]).PCA(n_components=8).fit(X),
    "knn": lambda X, yc, yr: __import__("mpiml.neighbors", fromlist=["x"]).NearestNeighbors(
        n_neighbors=10).fit(X).kneighbors(X[:1000]),
}


def _compile_one(args):
    from ..kernels import _loader

    files, exprs, arch, major = args
    compiler = _loader._CtypesNVRTC() if major is not None else None
    if major is None:
        major = _loader._runtime_major()
    return _loader.ensure_cached(files, exprs, arch, major, compiler=compiler)


def compile_specs(arch, jobs, gpu, say):
    """Put every program of ``build.specs(arch)`` in the cache unless shipped; ``{how: count}``."""
    from ..kernels import _loader, build
    from ..kernels.kmeans import _common

    # no GPU: NVRTC through ctypes (the wheel), in processes, for a typical device of the architecture; on a
    # GPU: CuPy's NVRTC, in threads, for the plans of this device
    major = None if gpu else _loader._CtypesNVRTC().version()[0]
    todo = [(files, exprs, arch, major) for files, exprs in build.specs(arch, _common._device() if gpu else None)]
    counts = {}
    pool_cls = concurrent.futures.ThreadPoolExecutor if gpu else concurrent.futures.ProcessPoolExecutor
    t = time.perf_counter()
    with pool_cls(max_workers=max(1, jobs)) as pool:
        for i, how in enumerate(pool.map(_compile_one, todo), 1):
            counts[how] = counts.get(how, 0) + 1
            if how == "compiled" and counts[how] % 10 == 0:
                say(f"  {i}/{len(todo)} programs, {time.perf_counter() - t:.0f} s")
    return counts


def main(argv):
    p = parser("mpiml warmup", "Compile once, into this machine's kernel cache, what the package does not ship.")
    p.add_argument("--arch", default=None, help="compile for this architecture (sm_80, sm_90, ...), no GPU needed; "
                                                "default: the GPU's")
    p.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1), help="programs compiled at once")
    p.add_argument("--no-fit", action="store_true", help="skip the small fits (they compile what CuPy's kernel list misses)")
    p.add_argument("--only", default=",".join(_FITS), help="estimators fitted, comma-separated")
    args = p.parse_args(argv)
    from ..kernels import _loader

    gpu = False
    if args.arch is None:
        try:
            import cupy

            cc = int(cupy.cuda.Device(0).compute_capability)
            args.arch, gpu = f"sm_{cc}", True
        except Exception as exc:   # noqa: BLE001 - no CuPy, no driver, no device
            p.error(f"no GPU here ({type(exc).__name__}: {exc}); name one with --arch sm_XY")
    from ..kernels import build

    if not gpu and args.arch not in build.DEVICE_MODELS:
        p.error(f"--arch must be one of {sorted(build.DEVICE_MODELS)}, got {args.arch!r}")
    say = print
    say(f"mpiml warmup: kernels for {args.arch} into {_loader.cache_dir()}")
    t = time.perf_counter()
    counts = compile_specs(args.arch, args.jobs, gpu, say)
    say(f"  {counts.get('prebuilt', 0)} programs shipped, {counts.get('cache', 0)} already cached, "
        f"{counts.get('compiled', 0)} compiled now ({time.perf_counter() - t:.1f} s)")
    if gpu:
        import cupy

        import mpiml

        dev = mpiml.init(device="gpu", warm=False)
        from .._init import _local_rank
        from ..kernels import _cupy_warm
        from ..utils._threads import thread_info

        # CuPy's own kernels that the package's manifest lists, all of them, the node's ranks sharing the list
        t = time.perf_counter()
        info = thread_info()
        st = _cupy_warm.start(dev, wait=True, node_rank=_local_rank()[0], node_size=info.get("ranks_on_node") or 1,
                              cores=info.get("cores"), setting="wait")
        say(f"  CuPy kernels ({_cupy_warm.MANIFEST}): " + (
            f"{st['entries']} modules, {st['counts']}" if "counts" in st else st.get("reason", st["state"]))
            + f" ({time.perf_counter() - t:.1f} s; CuPy's cache: CUPY_CACHE_DIR)")
    if gpu and not args.no_fit:
        rs = cupy.random.RandomState(0)
        X = rs.standard_normal((20000, 32), dtype=cupy.float32)
        yc = (X[:, 0] > 0).astype(cupy.int32)
        yr = X[:, 0] * 2 + X[:, 1]
        for name in [n for n in args.only.split(",") if n]:
            if name not in _FITS:
                p.error(f"--only: unknown estimator {name!r} (known: {sorted(_FITS)})")
            t = time.perf_counter()
            _FITS[name](X, yc, yr)
            cupy.cuda.Device().synchronize()
            say(f"  {name}: {time.perf_counter() - t:.1f} s")
        say(f"  kernel modules: {_loader.stats()}")
    return 0
