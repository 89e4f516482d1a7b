"""Compile the kernels the estimators use at common shapes into cubins, without a GPU.

    python -m mpiml.kernels.build                      # every architecture, into the package (prebuilt/)
    python -m mpiml.kernels.build --arch sm_90 --list  # what would be compiled, nothing written
    python -m mpiml.kernels.build --out DIR --jobs 4 [--fresh]

Writes one ``sm_XY.zip`` an architecture: ``index.json`` (per cubin: the source hash, NVRTC major, the
lowered name of every expression) and the cubins, named by their key (see :mod:`mpiml.kernels._loader`).
The specialisations come from the families' own plan functions: the k-means kernels' plans are asked
for a grid of shapes with the shared memory and compute capability of a typical GPU of each architecture
(they depend on it), the collectives' every element type, the histograms', linear models' and sparse products' whole
families, and the k-selection kernels of the common metrics for every query tile and alignment.  NVRTC comes
from the ``nvidia-cuda-nvrtc`` wheel (or ``MPIML_NVRTC``).  Rerun this after any change to a ``.cu`` file
(a cubin is found only for the exact source it was compiled from): the programs of unchanged sources are
kept from the zip already there, so only the changed family compiles again.
"""

import argparse
import concurrent.futures
import contextlib
import io
import json
import os
import sys
import time
import zipfile

import numpy as np

from . import _loader

__all__ = ["ARCHS", "DEVICE_MODELS", "specs", "build_arch", "main"]

#: Architectures built by default: the data-centre and workstation GPUs users have.
ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")

#: A typical device of each architecture, as the distance plans see it: (SMs, shared memory per SM,
#: per block opt-in, compute capability).  A100, A40, L40S, H100, B200, RTX PRO 6000.
DEVICE_MODELS = {
    "sm_80": (108, 164 * 1024, 163 * 1024, 80),
    "sm_86": (84, 100 * 1024, 99 * 1024, 86),
    "sm_89": (142, 100 * 1024, 99 * 1024, 89),
    "sm_90": (132, 228 * 1024, 227 * 1024, 90),
    "sm_100": (148, 228 * 1024, 227 * 1024, 100),
    "sm_120": (188, 100 * 1024, 99 * 1024, 120),
}

#: Shapes whose distance kernels are shipped: clusters (or index rows) k and features d.
_KS = (2, 3, 8, 10, 16, 32, 64, 128, 256)
_DS = (2, 3, 8, 16, 32, 64, 128)
#: Metrics whose k-selection kernels are shipped (the others compile once per machine: 0.9 MiB an architecture).
_SELECT_METRICS = ("euclidean", "cosine", "inner_product")
#: Most expressions of one source a program holds (smaller programs build in parallel, larger load slower).
_GROUP = 12
#: Plans that raised on an emulated device (printed by --list).
_SKIPPED = []


def _kmeans_exprs(model):
    """``{program's files: set of expressions}`` the k-means launches ask for at the shapes of the grid."""
    from .kmeans import SIMT_FILES, TC_FILES, emulated_device, kernel_plan
    from .kmeans._common import _CTYPE

    tc, simt = set(), set()
    with emulated_device(model):
        for dtype in (np.dtype(np.float32), np.dtype(np.float64)):
            ct = _CTYPE[dtype]
            tc.update({f"mpiml_distances_step_totals<{ct}>", f"mpiml_small_bank_pack<{ct}>"})
            simt.update({"mpiml_distances_reduce_partials", f"mpiml_lloyd_update<{ct}>",
                         f"mpiml_distances_argmin_gemm<{ct}>", f"mpiml_distances_label_sums<{ct}, {ct}>"})
            for d in _DS:
                vw = 16 // dtype.itemsize if d % (16 // dtype.itemsize) == 0 else 1
                for k in _KS:
                    for metric in ("sqeuclidean", "euclidean", "inner_product", "cosine"):
                        simt.add(kernel_plan(dtype, k, d, mode=metric, vw=vw)["expr"])
                    for lloyd in (True, False):
                        try:
                            _launch_exprs(dtype, k, d, vw, lloyd, tc, simt)
                        except ValueError as exc:      # a plan that does not fit this device: nothing to ship
                            _SKIPPED.append((model[3], dtype.name, k, d, "lloyd" if lloyd else "assign", str(exc)))
    return {TC_FILES: tc, SIMT_FILES: simt}


def _launch_exprs(dtype, k, d, vw, lloyd, tc, simt):
    """Add the expressions of one Lloyd step or arg-min launch (the choices of the launchers)."""
    from .kmeans import kernel_plan, small_plan, sums_plan, tc_plan
    from .kmeans._common import _CTYPE, _GEMM_FROM_K
    from .kmeans._lloyd import _method

    ct = _CTYPE[dtype]
    mode = "lloyd" if lloyd else "assign"
    method = _method("auto", k, d, dtype, lloyd)
    if method == "small":
        for unit in (True, False):
            plan = small_plan(dtype, k, d, mode=mode, vw=vw, unit=unit)
            tc.update(v for key, v in plan.items() if key.startswith("expr"))
    elif method == "tc":
        for m in ({mode, "assign"} if lloyd else {mode}):
            plan = tc_plan(dtype, k, d, mode=m, vw=vw)
            tc.update((plan["expr"], plan["pack"]))
        if lloyd and not tc_plan(dtype, k, d, mode=mode, vw=vw)["fused"]:
            if k >= _GEMM_FROM_K:
                simt.add(f"mpiml_distances_label_sums<{ct}, {ct}>")
            else:
                tc.add(sums_plan(dtype, k, d, vw=vw)["expr"])
    else:
        plan = kernel_plan(dtype, k, d, mode=mode, vw=vw)
        if method == "fused":
            simt.add(plan["expr"])
        if lloyd and (method == "gemm" or not plan["groups"]):
            simt.add(f"mpiml_distances_label_sums<{ct}, {plan['accum']}>")


def _select_programs():
    """The k-selection family's programs as its launchers ask for them: per element type, metric of
    :data:`_SELECT_METRICS`, query tile (from k up to ``MAX_K``) and row alignment, the selection with its merge
    and norms; the radius pair."""
    from . import select

    out = []
    for dtype in (np.dtype(np.float32), np.dtype(np.float64)):
        ct = select._ctype(dtype)
        out.append((("select/select.cu",), [f"mpiml_knn_exact_sq<{ct}>"]))
        tiles = set()
        for k in (1, 2, 5, 10, 16, 32, 64, 100, 128, 256, 512, select.MAX_K):
            with contextlib.suppress(ValueError):
                tiles.add(select._config(dtype, k)[:2])
        for mode in sorted({select.METRICS[m] for m in _SELECT_METRICS}):
            norms = f"mpiml_knn_norms<{ct}, {min(mode, 1)}>"
            for vec in ("false", "true"):
                for tm, ty in sorted(tiles):
                    out.append((("select/select.cu",), [f"mpiml_knn_select<{ct}, {mode}, {tm}, {ty}, {vec}>",
                                                         f"mpiml_knn_merge<{ct}>", norms]))
                tm, ty = (4, 16) if dtype.itemsize == 4 else (2, 16)
                out.append((("select/select.cu",), [f"mpiml_knn_radius<{ct}, {mode}, {tm}, {ty}, {vec}, {f}>"
                                                     for f in ("false", "true")] + [norms]))
            # the GEMM route's selection over a cuBLAS tile (select.topk at large d)
            out.append((("select/select.cu",), [f"mpiml_knn_tile_select<{ct}, {mode}>", f"mpiml_knn_merge<{ct}>",
                                                 norms]))
    return out


def _own_module(expr):
    """Whether ``expr`` needs a module of its own (its constant bank is one per module)."""
    return expr.startswith("mpiml_distances_small<") and expr.endswith(", true>")


def specs(arch, model=None):
    """``[(files, expressions)]``: the programs compiled for ``arch``, each a list of expressions; ``model``: the
    device the distance plans are made for (default :data:`DEVICE_MODELS`'s for ``arch``)."""
    from . import COMMON, FAMILIES, PUSH_SOURCES, _name_expressions, copy_type, reduce_type, sparse

    out = [(sparse.FILES, sparse.expressions())]   # the sparse products' whole family, one program
    for family, (file, _, reduces) in FAMILIES.items():
        ctypes = ({reduce_type(t) for t in ("float16", "float32", "float64", "int32", "int64", "bool")} if reduces
                  else {copy_type(s) for s in (1, 2, 4, 8)})
        for ct in sorted(ctypes):
            out.append(((COMMON, file), _name_expressions(family, ct, None)))
    # the push kernels (``PUSH_SOURCES``: a family of their own, ``comm.backends.ipc._push_kernel``)
    for ct in sorted({reduce_type(t) for t in ("float16", "float32", "float64", "int32", "int64", "bool")}):
        out.append((PUSH_SOURCES, [f"mpiml_reduce_llpush<{ct}, {o}, {a}>" for o in range(4) for a in ("false", "true")]))
    for ct in sorted({copy_type(s) for s in (1, 2, 4, 8)}):
        out.append((PUSH_SOURCES, [f"mpiml_allgather_llpush<{ct}, {a}>" for a in ("false", "true")]))
    hist = [f"mpiml_hist_build<{c}, {d}, {w}>" for c in ("false", "true") for d in (0, 1) for w in ("false", "true")]
    out.append((("forest/histograms.cu",), hist + ["mpiml_hist_route", "mpiml_hist_move<false>", "mpiml_hist_move<true>",
                                            "mpiml_hist_split<false>", "mpiml_hist_split<true>",
                                            "mpiml_hist_build_reg<0>", "mpiml_hist_build_reg<1>"]))
    out.append((("forest/bootstrap.cu",), ["mpiml_boot_counts<false>", "mpiml_boot_counts<true>"]))
    for ct in ("float", "double"):
        out.append((("linear/linear.cu",), [f"mpiml_linear_gram<{ct}, {w}>" for w in ("false", "true")]
                    + [f"mpiml_linear_gram_mma<{ct}, {w}, {m}>" for w in ("false", "true") for m in range(1, 17)]
                    + [f"mpiml_linear_gram_mma3<{ct}, {w}, {', '.join(map(str, g))}, {st}>" for w in ("false", "true")
                       for g in _linear_mma3_groups() for st in (32, 64)]
                    + [f"mpiml_linear_gram_mma3g<{ct}, {w}, {', '.join(map(str, g))}, {4 if ct == 'float' else 2}>"
                       for w in ("false", "true") for g in _linear_mma3_groups()]
                    + [f"mpiml_linear_logistic<{ct}, {m}, {c}>" for m in (0, 1) for c in (1, 2, 4, 8)]
                    + ["mpiml_linear_sum_blocks", "mpiml_linear_sum_sym", "mpiml_linear_sum_pack"]))
    out.append((("linear/linear.cu",), [f"mpiml_linear_labels{m}<{t}>" for t in ("int", "long long", "float", "double")
                                         for m in ("", "_merge")]))
    out += _select_programs()
    for files, exprs in _kmeans_exprs(model or DEVICE_MODELS[arch]).items():
        shared = sorted(e for e in exprs if not _own_module(e))
        out += [(files, shared[i:i + _GROUP]) for i in range(0, len(shared), _GROUP)]
        out += [(files, [e]) for e in sorted(exprs) if _own_module(e)]
    return out


def _linear_mma3_groups():
    """The tile-row groups ``mpiml.kernels.linear`` asks ``mpiml_linear_gram_mma3`` for, one per tile count."""
    from .linear import _mma3_groups

    return [g for g in (_mma3_groups(nt) for nt in range(1, 17)) if g is not None]


def _compile_one(args):
    files, exprs, arch, options, nvrtc_path = args
    compiler = _loader._CtypesNVRTC(nvrtc_path)
    text = _loader.source_text(files)
    cubin, lowered = _loader.compile_cubin(text, exprs, arch, options, compiler=compiler)
    return files, exprs, cubin, lowered


def _previous(path):
    """``{cubin name: (entry, bytes)}`` of the zip already at ``path`` (empty when there is none)."""
    try:
        with zipfile.ZipFile(path) as z:
            return {e["file"]: (e, z.read(e["file"])) for e in json.loads(z.read("index.json"))["entries"]}
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return {}


def build_arch(arch, out_dir, *, jobs=1, options=_loader.DEFAULT_OPTIONS, nvrtc_path=None, fresh=False, log=print):
    """Compile :func:`specs` for ``arch`` into ``out_dir/arch.zip``; returns its summary dict.

    A program whose key (source, expressions, architecture, NVRTC major) is already in the zip there is
    kept as it is unless ``fresh``: after a change to one ``.cu`` file only its family compiles again.
    """
    compiler = _loader._CtypesNVRTC(nvrtc_path)
    major = compiler.version()[0]
    path = os.path.join(out_dir, arch + ".zip")
    old = {} if fresh else _previous(path)
    t0 = time.perf_counter()
    entries, blobs, todo = [], {}, []
    for files, exprs in specs(arch):
        src = _loader.source_hash(_loader.source_text(files), options)
        name = _loader.entry_key(src, exprs, arch, major) + ".cubin"
        if name in old:
            # the same text and expressions: the same cubin, under the files' names now (a family moved or split)
            entries.append(dict(old[name][0], files=list(files)))
            blobs[name] = old[name][1]
        else:
            todo.append((files, exprs, arch, tuple(options), nvrtc_path))
    log(f"{arch}: {len(entries)} programs kept, {len(todo)} to compile")
    with concurrent.futures.ProcessPoolExecutor(max_workers=max(1, jobs)) as pool:
        for i, (files, exprs, cubin, lowered) in enumerate(pool.map(_compile_one, todo), 1):
            src = _loader.source_hash(_loader.source_text(files), options)
            name = _loader.entry_key(src, exprs, arch, major) + ".cubin"
            blobs[name] = cubin
            entries.append({"file": name, "files": list(files), "source": src, "nvrtc": major, "arch": arch,
                            "options": list(options), "lowered": lowered})
            if i % 10 == 0:
                log(f"  {i}/{len(todo)} compiled, {time.perf_counter() - t0:.0f} s")
    entries.sort(key=lambda e: e["file"])
    os.makedirs(out_dir, exist_ok=True)
    index = {"arch": arch, "nvrtc": list(compiler.version()), "entries": entries}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr(zipfile.ZipInfo("index.json", date_time=(2020, 1, 1, 0, 0, 0)),
                   json.dumps(index, sort_keys=True, indent=0), compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
        for name in sorted(blobs):
            z.writestr(zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0)), blobs[name],
                       compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
    _loader._write_atomic(path, buf.getvalue())
    summary = {"arch": arch, "programs": len(entries), "kernels": sum(len(e["lowered"]) for e in entries),
               "cubin_bytes": sum(len(b) for b in blobs.values()), "zip_bytes": os.path.getsize(path),
               "seconds": round(time.perf_counter() - t0, 1)}
    log(f"{arch}: {summary['kernels']} kernels in {summary['programs']} cubins, "
        f"{summary['cubin_bytes'] / 2**20:.1f} MiB ({summary['zip_bytes'] / 2**20:.1f} MiB zipped), "
        f"{summary['seconds']} s")
    return summary


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m mpiml.kernels.build", description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default=",".join(ARCHS), help="comma-separated, e.g. sm_80,sm_90")
    ap.add_argument("--out", default=_loader._prebuilt_folder(), help="folder of the sm_XY.zip files")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--list", action="store_true", help="print the programs, compile nothing")
    ap.add_argument("--fresh", action="store_true", help="compile every program (default: keep those of the "
                                                         "zip already there whose source has not changed)")
    ap.add_argument("--json", help="write the summary here")
    args = ap.parse_args(argv)
    archs = [a.strip() for a in args.arch.split(",") if a.strip()]
    unknown = [a for a in archs if a not in DEVICE_MODELS]
    if unknown:
        ap.error(f"unknown architecture(s) {unknown} (known: {sorted(DEVICE_MODELS)})")
    if args.list:
        for arch in archs:
            progs = specs(arch)
            print(f"{arch}: {sum(len(e) for _, e in progs)} kernels in {len(progs)} programs")
            for files, exprs in progs:
                print(f"  {'+'.join(files)}: " + "; ".join(exprs))
        for skipped in _SKIPPED:
            print("plan raised:", *skipped)
        return 0
    supported = _loader._CtypesNVRTC().archs()
    summaries = []
    for arch in archs:
        if int(arch[3:]) not in supported:
            print(f"{arch}: skipped, this NVRTC compiles for {supported}")
            continue
        summaries.append(build_arch(arch, args.out, jobs=args.jobs, fresh=args.fresh))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summaries, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
