"""Launchers of the one-pass linear-model kernels (``linear.cu``) on CuPy arrays.

:func:`augmented_gram` returns the float64 Gram matrix of ``[X | Y | 1]``
(weighted), read from ``X`` once; :func:`logistic_pass` the binary logistic
loss and gradient (or a Hessian-vector product), also read from ``X`` once.
Both end with a deterministic sum of per-block partials on the device, so the
result does not depend on scheduling: the same bits on every run.  The kernels
load through :mod:`mpiml.kernels._loader` (shipped, cached or compiled once) on
first use and are memoised per device.
"""

import functools
import os

import numpy as np

__all__ = ["augmented_gram", "logistic_pass", "LogisticPass", "label_scan", "GRAM_MAX_COLUMNS",
           "LOGISTIC_MAX_FEATURES", "GRAM_KERNELS", "LABELS_TWO", "LABELS_NAN"]

#: Largest ``k = d + t + 1`` of the Gram kernel: its ``(k / 4)(k / 4 + 1) / 2`` register tiles fit one
#: block of at most 512 threads.  Wider problems are compute-bound and go to cuBLAS on float64 chunks.
GRAM_MAX_COLUMNS = 124
#: Largest ``d`` of the logistic kernel (a lane holds at most 8 columns of a row in registers).
LOGISTIC_MAX_FEATURES = 256

_STAGE = 32
_MMA_STAGE = 32                 # MPIML_LINEAR_MMA_STAGE (and _MMA3_STAGE) in linear.cu
_MMA3_THREADS = 192             # MPIML_LINEAR_MMA3_THREADS in linear.cu
_MMA3_MAX_TILES = 16
#: The Gram kernels by name: three-group tensor-core kernels (staged 32 or 64 rows, or fed from global
#: memory), the two-row tensor-core kernel, the CUDA-core kernel of GPUs without float64 tensor cores.
GRAM_KERNELS = ("mma3", "mma3s64", "mma3g", "mma", "cuda")
_CALIBRATE_ROWS = 1 << 20
_MARGIN = 0.03
_PICKS = {}         # (device, dtype, weighted, tile count) -> the kernel picked
_PICK_TIMES = {}    # the same key -> {kernel: ms} of the calibration
_LOGISTIC_THREADS = 256
_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}

_FUNCTIONS = {}
_SMS = {}
_DMMA = {}        # device -> whether it has float64 tensor cores
_WAVES = {}         # (function, threads, shared memory) -> blocks resident at once
_SMEM_SET = set()   # (function, bytes) whose dynamic shared memory limit is raised already
#: Threads of a block of the partial-sum kernels (one warp per output: mpiml_linear_warp_sum in linear.cu).
_SUM_THREADS = 128


def _function(expr):
    import cupy

    key = (cupy.cuda.runtime.getDevice(), expr)
    fn = _FUNCTIONS.get(key)
    if fn is None:
        # shipped, cached or compiled once (:mod:`mpiml.kernels._loader`), with the partials' sum every pass ends with
        from .._loader import load_module

        sums = ("mpiml_linear_sum_blocks", "mpiml_linear_sum_sym", "mpiml_linear_sum_pack")
        fn = load_module(("linear/linear.cu",), [expr], also=sums).get_function(expr)
        try:   # all of the SM's on-chip memory as shared memory: the one-pass kernels stage rows, they reuse no L1
            fn.preferred_shared_memory_carveout = 100
        except Exception:   # an older CuPy without the attribute: the driver's default split
            pass
        _FUNCTIONS[key] = fn
    return fn


def _tensor_cores(dev=None):
    """Whether the current device (``dev``, when known) has float64 tensor cores (DMMA, compute capability 8.0
    and later)."""
    import cupy

    if dev is None:
        dev = cupy.cuda.runtime.getDevice()
    found = _DMMA.get(dev)
    if found is None:   # (memoised: a Device object and its attribute query cost microseconds every fit paid)
        found = _DMMA[dev] = int(cupy.cuda.Device(dev).compute_capability) >= 80
    return found


def _sm_count():
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    if dev not in _SMS:
        _SMS[dev] = cupy.cuda.Device(dev).attributes["MultiProcessorCount"]
    return _SMS[dev]


def _wave(fn, threads, smem=None, regs_unknown=128):
    """Blocks of ``fn`` resident on the whole GPU at once (threads, registers and, if given, shared memory per SM).

    Memoised per function (a loaded function lives as long as the process): the attribute query and
    the device lookup cost microseconds that every launch paid.
    """
    key = (id(fn), threads, smem, regs_unknown)
    found = _WAVES.get(key)
    if found is None:
        regs = max(32, int(getattr(fn, "num_regs", regs_unknown) or regs_unknown))
        per_sm = min(2048 // threads, 65536 // (regs * threads))
        if smem is not None:
            per_sm = min(per_sm, (200 << 10) // smem)
        found = _WAVES[key] = _sm_count() * max(1, per_sm)
    return found


def _allow_shared(fn, smem):
    """Raise ``fn``'s dynamic shared memory limit to ``smem`` bytes (once per function and size)."""
    key = (id(fn), smem)
    if key not in _SMEM_SET:
        fn.max_dynamic_shared_size_bytes = smem
        _SMEM_SET.add(key)


def _sum_grid(outputs):
    """Blocks of a partial-sum kernel for ``outputs`` sums: one warp each (a function of the count alone)."""
    return max(1, min(-(-outputs * 32 // _SUM_THREADS), 1 << 16))


def supported(X):
    """Whether the kernels take ``X`` (a dense CuPy float32/float64 matrix)."""
    return getattr(X, "ndim", 0) == 2 and np.dtype(X.dtype) in _TYPES and type(X).__module__.startswith("cupy") \
        and not hasattr(X, "format")


def _mma3_tiles(groups):
    """Tiles of each warp group of ``mpiml_linear_gram_mma3`` for tile-row groups ``(s0, s1, s2)``."""
    s0, s1, s2 = groups
    return (s0 * s1 + s0 * (s0 + 1) // 2, s1 * s2 + s1 * (s1 + 1) // 2, s0 * s2 + s2 * (s2 + 1) // 2)


@functools.lru_cache(maxsize=None)
def _mma3_groups(nt):
    """The split of ``nt`` tile rows into three groups with the fewest tiles on the busiest warp, or None
    when that warp would hold more than :data:`_MMA3_MAX_TILES` (its accumulators would not fit in registers)."""
    best = None
    for s0 in range(nt + 1):
        for s1 in range(nt + 1 - s0):
            groups = (s0, s1, nt - s0 - s1)
            key = (max(_mma3_tiles(groups)), groups)
            if best is None or key < best:
                best = key
    return best[1] if best[0] <= _MMA3_MAX_TILES else None


def augmented_gram(X, Y, w=None, kernel=None):
    """``Zᵀ diag(w) Z`` with ``Z = [X | Y | 1]`` as a float64 CuPy matrix of shape (k, k), ``k = d + t + 1``.

    ``X`` (n, d) and ``Y`` (n, t) share a dtype (float32 or float64; a 1-d
    ``Y`` is one target, read in place); ``w`` (n,) or None.  Products are formed and summed in float64 (a float32
    product is exact in float64).  Only the upper triangle is computed; the
    result is symmetrised.  Needs ``k <= GRAM_MAX_COLUMNS``.

    ``kernel`` names one of :data:`GRAM_KERNELS` (comparisons, tests);
    by default GPUs without float64 tensor cores take ``"cuda"``, and
    the others the tensor-core kernel :func:`_pick_gram` measured fastest
    for this dtype and width.  Every kernel is deterministic.
    """
    import cupy

    n, d = X.shape
    t = Y.shape[1] if Y.ndim == 2 else 1   # (a 1-d Y has the memory of its (n, 1) column: no reshape)
    k = d + t + 1
    if k > GRAM_MAX_COLUMNS:
        raise ValueError(f"augmented_gram takes at most {GRAM_MAX_COLUMNS} columns; got {k}")
    # (the usual input, contiguous and of one dtype, goes to the launch without CuPy's conversion calls: this
    # path runs before the kernel starts, at every fit)
    if not X.flags.c_contiguous:
        X = cupy.ascontiguousarray(X)
    if Y.dtype != X.dtype or not Y.flags.c_contiguous:
        Y = cupy.ascontiguousarray(Y.astype(X.dtype, copy=False))
    weighted = w is not None
    if weighted:
        w = cupy.ascontiguousarray(w.astype(X.dtype, copy=False))
    dev = cupy.cuda.runtime.getDevice()
    if kernel is None:
        nt = (k + 7) // 8
        if not _tensor_cores(dev):
            kernel = "cuda"
        elif _mma3_groups(nt) is None:
            kernel = "mma"
        else:
            kernel = _pick_gram(X, Y, w, nt, dev)
    return _launch_gram(X, Y, w, kernel, dev)


def _pick_gram(X, Y, w, nt, dev=None):
    """The tensor-core Gram kernel to use for this device, dtype, weighting and tile count.

    The kernels differ in how they feed the tensor cores (see ``linear.cu``), and which is fastest
    depends on the GPU; so the first shard of at least :data:`_CALIBRATE_ROWS` rows of each class
    times them once, on its first rows, and the fastest is kept for the process (``"mma"``, the one
    measured longest, unless another is more than :data:`_MARGIN` faster).  Smaller shards before
    that take ``"mma"``.  ``MPIML_LINEAR_GRAM`` names one instead.
    """
    import cupy

    forced = os.environ.get("MPIML_LINEAR_GRAM", "")
    if forced in GRAM_KERNELS:
        return forced
    key = (cupy.cuda.runtime.getDevice() if dev is None else dev, X.dtype.char, w is not None, nt)
    pick = _PICKS.get(key)
    if pick is not None:
        return pick
    if X.shape[0] < _CALIBRATE_ROWS:
        return "mma"
    rows = min(X.shape[0], 2 * _CALIBRATE_ROWS)
    Xs, Ys, ws = X[:rows], Y[:rows], (None if w is None else w[:rows])
    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
    times = {}
    for name in ("mma", "mma3", "mma3s64", "mma3g"):
        try:
            _launch_gram(Xs, Ys, ws, name)          # loads the kernel
            best = float("inf")
            for _ in range(2):
                e0.record()
                _launch_gram(Xs, Ys, ws, name)
                e1.record()
                e1.synchronize()
                best = min(best, cupy.cuda.get_elapsed_time(e0, e1))
            times[name] = best
        except Exception:     # noqa: BLE001 - a kernel this device cannot launch: not a candidate
            continue
    pick = min(times, key=times.get) if times else "mma"
    if "mma" in times and times[pick] > (1.0 - _MARGIN) * times["mma"]:
        pick = "mma"
    _PICKS[key] = pick
    _PICK_TIMES[key] = times
    return pick


def _launch_gram(X, Y, w, choice, dev=None):
    """``augmented_gram`` by the kernel ``choice`` (validated arrays) on the current device (``dev``, when known)."""
    import cupy

    n, d = X.shape
    t = Y.shape[1] if Y.ndim == 2 else 1
    weighted = w is not None
    key = (cupy.cuda.runtime.getDevice() if dev is None else dev, X.dtype.char, n, d, t, weighted, choice)
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = _gram_plan(X, n, d, t, weighted, choice)
    fn, grid, threads, smem, tail, parts, k, sum_grid, sum_tail = plan
    if not n:
        return cupy.zeros((k, k), dtype=cupy.float64)
    # a block writes only its tiles of the upper triangle, and the sum reads nothing else: no zeroing
    partial = cupy.empty(parts, dtype=cupy.float64)
    fn(grid, threads, (X, np.int64(n), np.int32(d), Y, np.int32(t), w if weighted else X) + tail + (partial,),
       shared_mem=smem)
    G = cupy.empty((k, k), dtype=cupy.float64)
    _function("mpiml_linear_sum_sym")(sum_grid, (_SUM_THREADS,), (partial,) + sum_tail + (G,))
    return G


#: (device, dtype, n, d, t, weighted, kernel) -> the launch of :func:`_launch_gram` worked out once: its
#: function, grid, shared memory and constant arguments (a fit's path to the kernel is then a few operations)
_PLANS = {}


def _gram_plan(X, n, d, t, weighted, choice):
    """``(fn, grid, block, smem, constant args, partials' size, k, sum grid, sum args)`` of one Gram launch."""
    k = d + t + 1
    ctype = _TYPES[np.dtype(X.dtype)]
    wflag = "true" if weighted else "false"
    nt = (k + 7) // 8
    groups = _mma3_groups(nt)
    if choice in ("mma3", "mma3s64") and groups is not None:
        # float64 tensor cores, three tile groups: a warp's fragments serve 2.5 DMMAs each (see linear.cu)
        kp = 8 * nt
        stage = 64 if choice == "mma3s64" else _MMA_STAGE
        fn = _function(f"mpiml_linear_gram_mma3<{ctype}, {wflag}, {groups[0]}, {groups[1]}, {groups[2]}, {stage}>")
        threads = _MMA3_THREADS
        tm = max(_mma3_tiles(groups))
        # two staging buffers; the same memory then parks the second half's sums
        smem = max(2 * (stage * (kp + 4) + stage), 3 * tm * 64) * 8
        if smem > 48 << 10:
            _allow_shared(fn, smem)
        args = ()
    elif choice == "mma3g" and groups is not None:
        # the same tiles, fragments read from global memory (no staging, no barrier); KA k-steps in flight
        kp = 8 * nt
        ka = 4 if ctype == "float" else 2
        fn = _function(f"mpiml_linear_gram_mma3g<{ctype}, {wflag}, {groups[0]}, {groups[1]}, {groups[2]}, {ka}>")
        threads = _MMA3_THREADS
        smem = 3 * max(_mma3_tiles(groups)) * 64 * 8
        stage = 8
        args = ()
    elif choice in ("mma", "mma3", "mma3s64", "mma3g"):
        # float64 tensor cores (DMMA): tiles of 8 columns, (nt + 1) / 2 warps, all of a block's tiles per warp pair
        kp = 8 * nt
        fn = _function(f"mpiml_linear_gram_mma<{ctype}, {wflag}, {nt}>")
        threads = 32 * ((nt + 1) // 2)
        smem = (_MMA_STAGE * (kp + 4) + _MMA_STAGE) * 8
        stage = _MMA_STAGE
        args = ()
    else:
        nt = (k + 3) // 4
        kp = 4 * nt
        ntiles = nt * (nt + 1) // 2
        threads = max(32, (ntiles + 31) // 32 * 32)
        fn = _function(f"mpiml_linear_gram<{ctype}, {wflag}>")
        smem = (_STAGE * kp + _STAGE) * 8
        stage = _STAGE
        args = (np.int32(ntiles),)
    # one wave of blocks: as many as fit on every SM at once (threads, registers, shared memory)
    nblocks = int(max(1, min((n + stage - 1) // stage, _wave(fn, threads, smem))))
    rows_per_block = ((n + nblocks - 1) // nblocks + stage - 1) // stage * stage
    rows_per_block = max(rows_per_block, stage)
    nblocks = int(max(1, (n + rows_per_block - 1) // rows_per_block))
    tail = (np.int64(rows_per_block), np.int32(kp)) + args
    return (fn, (nblocks,), (threads,), smem, tail, nblocks * kp * kp, k, (_sum_grid(k * k),),
            (np.int32(nblocks), np.int32(kp), np.int32(k)))


#: Label dtypes :func:`label_scan` takes, and their C types.
_LABEL_TYPES = {np.dtype(np.int32): "int", np.dtype(np.int64): "long long", np.dtype(np.float32): "float",
                np.dtype(np.float64): "double"}
_LABEL_THREADS = 256     # MPIML_LABELS_THREADS in linear.cu
_LABEL_PLANS = {}        # (device, C type, n) -> (scan, merge, blocks)
#: Flags of :func:`label_scan` (MPIML_LABELS_* in linear.cu): a second distinct value exists, a NaN was seen.
LABELS_TWO, LABELS_NAN = 2, 4


def label_scan(y):
    """One read of a CuPy label vector: ``(values, flags)``, or None when the kernel does not take its dtype.

    ``values`` (host, ``y``'s dtype) holds the smallest value, the second smallest distinct one (valid
    when ``flags & LABELS_TWO``) and the largest; ``flags & LABELS_NAN`` says a NaN was seen (not counted
    among the values).  So ``y`` holds at most two distinct values exactly when the second is absent or
    equals the largest.  Two launches (per-block states, then their merge) and one copy of 32 bytes.
    """
    import cupy

    ctype = _LABEL_TYPES.get(y.dtype)
    if ctype is None or y.ndim != 1 or y.shape[0] == 0:
        return None
    if not y.flags.c_contiguous:
        y = cupy.ascontiguousarray(y)
    n = y.shape[0]
    key = (cupy.cuda.runtime.getDevice(), ctype, n)
    plan = _LABEL_PLANS.get(key)
    if plan is None:
        scan = _function(f"mpiml_linear_labels<{ctype}>")
        blocks = int(max(1, min(-(-n // _LABEL_THREADS), _wave(scan, _LABEL_THREADS, regs_unknown=32))))
        plan = _LABEL_PLANS[key] = (scan, _function(f"mpiml_linear_labels_merge<{ctype}>"), blocks)
    scan, merge, blocks = plan
    part = cupy.empty(3 * blocks, dtype=y.dtype)
    flags = cupy.empty(blocks, dtype=cupy.int32)
    out = cupy.empty(32, dtype=cupy.uint8)
    scan((blocks,), (_LABEL_THREADS,), (y, np.int64(n), part, flags))
    merge((1,), (_LABEL_THREADS,), (part, flags, np.int32(blocks), out))
    host = out.get()
    values = host.reshape(4, 8)[:3, :y.dtype.itemsize].copy().view(y.dtype).reshape(3)
    return values, int(host[24:28].view(np.int32)[0])


def logistic_pass(X, y01, sw, coef, bias, vec=None, vbias=0.0, pack=None):
    """One read of ``X`` for the binary logistic objective; a float64 CuPy vector of length ``d + 2``.

    Without ``vec``: ``[Σ sw·loss, Σ g, Σ g x]`` with ``g = sw (expit(m) - y)``
    and ``m = X coef + bias`` (the loss and the unscaled gradient).  With
    ``vec`` (the Hessian-vector product at ``coef``): ``[0, Σ q, Σ q x]`` with
    ``q = sw p (1 - p) (X vec + vbias)``.  ``coef`` and ``vec`` are host
    float64 vectors of length ``d``; needs ``d <= LOGISTIC_MAX_FEATURES``.

    ``pack=(fit_intercept, scale, fp)``: the same sums laid out for the
    objective's allreduce instead, ``[Σ sw·loss (without vec), Σ g x,
    scale Σ g (if fit_intercept), fp, fp²]`` (the same bits, one kernel).
    A solver that evaluates many points of one shard keeps a :class:`LogisticPass`.
    """
    fi, scale, fp = (None, 1.0, 0.0) if pack is None else pack
    # (a pageable copy of the point: this call's staging buffer is not kept past it)
    return LogisticPass(X, y01, sw, fit_intercept=fi, scale=scale, pinned=False)(coef, bias, vec, vbias, fp)


class LogisticPass:
    """:func:`logistic_pass` prepared once for one shard ``(X, y01, sw)`` and one packing.

    ``fit_intercept=None``: the plain ``[loss | Σ g | Σ g x]`` layout; True or False: the packed layout
    of the objective's allreduce (see :func:`logistic_pass`).  What every evaluation of an optimiser
    repeated is made once here: the kernels and their grids, the blocks' partials buffer, and a pinned
    host buffer from which the point (and the direction) reaches the device by one asynchronous copy
    (a pageable copy waits for the host and costs several times more).  Each call returns a new device
    vector; calls on the same stream follow one another.  ``pinned=False``: a plain copy of the point instead
    (for a pass used once, whose staging buffer may be dropped before its copy ran).
    """

    def __init__(self, X, y01, sw, *, fit_intercept=None, scale=1.0, pinned=True):
        import cupy
        import cupyx

        n, d = X.shape
        if d > LOGISTIC_MAX_FEATURES:
            raise ValueError(f"logistic_pass takes at most {LOGISTIC_MAX_FEATURES} features; got {d}")
        self.X, self.y01, self.sw = X, y01, sw
        self.n, self.d = n, d
        self.packed = fit_intercept is not None
        self.fi = int(bool(fit_intercept))
        self.scale = float(scale)
        cpl = 1
        while 32 * cpl < d:
            cpl *= 2
        self._cpl = cpl
        self._rows = 16 if cpl <= 2 else (8 if cpl == 4 else 4)   # a warp's batch of rows (mpiml_linear_rows)
        self._ctype = _TYPES[np.dtype(X.dtype)]
        self._pinned = pinned
        self._host = (cupyx.empty_pinned if pinned else np.empty)(2 * max(d, 1), dtype=np.float64)
        self._host_ptr = self._host.ctypes.data   # (read once: ndarray.ctypes builds an object per access)
        self._dev = cupy.empty(2 * max(d, 1), dtype=cupy.float64)
        self._copied = cupy.cuda.Event(disable_timing=True)   # the last copy out of _host is done
        self._unrecorded = False   # the last copy out of _host was a synced launch's (no event recorded)
        self._launched = None      # (mode, blocks, partials) of the last launch, for sums()
        self._cw, self._cv = self._dev[:d], self._dev[d:2 * d]  # (views made once: a CuPy view costs microseconds)
        self._shape_args = (np.int64(n), np.int32(d))
        self._modes = {}
        self._partial = None
        self._sum = _function("mpiml_linear_sum_pack" if self.packed else "mpiml_linear_sum_blocks")

    def _mode(self, mode):
        """(function, blocks) of the kernel for ``mode`` (0: loss and gradient, 1: Hessian-vector product)."""
        found = self._modes.get(mode)
        if found is None:
            import cupy

            fn = _function(f"mpiml_linear_logistic<{self._ctype}, {mode}, {self._cpl}>")
            warps = _LOGISTIC_THREADS // 32
            # one wave: as many blocks as are resident on every SM at once (the warps stride over the row batches)
            nblocks = int(max(1, min((self.n + warps * self._rows - 1) // (warps * self._rows),
                                     _wave(fn, _LOGISTIC_THREADS, regs_unknown=64))))
            if self._partial is None or self._partial.size < nblocks * (self.d + 2):
                self._partial = cupy.empty(nblocks * (self.d + 2), dtype=cupy.float64)
            found = self._modes[mode] = (fn, nblocks, warps * self.d * 8)
        return found

    def __call__(self, coef, bias, vec=None, vbias=0.0, fp=0.0):
        self.launch(coef, bias, vec, vbias)
        return self.sums(fp)

    def launch(self, coef, bias, vec=None, vbias=0.0, synced=False):
        """The point (and the direction) to the device and the pass's kernel launched; :meth:`sums` follows.

        ``synced``: the caller waited for the stream since its last call here (an optimiser that reads
        each result before it asks for the next point), so no earlier copy out of the staging buffer can
        be pending: the event that guards the buffer is neither waited for nor recorded, two driver calls
        fewer on the evaluation's path, where the device waits for the host.
        """
        import cupy

        d, n = self.d, self.n
        mode = 0 if vec is None else 1
        stream = cupy.cuda.get_current_stream()
        # the point (and the direction) in one copy to the device, from pinned memory; the buffer is
        # rewritten only once its last copy is done (at once when the caller waited for the last result)
        if not synced:
            if self._unrecorded:      # the last copy was a synced call's, without its event
                stream.synchronize()
                self._unrecorded = False
            else:
                self._copied.synchronize()
        host = self._host
        host[:d] = coef
        if mode:
            host[d:2 * d] = vec
        if d and self._pinned:
            cupy.cuda.runtime.memcpyAsync(self._dev.data.ptr, self._host_ptr, (d << mode) * 8,
                                          cupy.cuda.runtime.memcpyHostToDevice, stream.ptr)
        elif d:
            self._dev[:d << mode].set(host[:d << mode])
        if synced:
            self._unrecorded = True
        else:
            self._copied.record(stream)
        cw = self._cw
        cv = self._cv if mode else cw
        if n == 0:
            self._launched = (mode, 1, cupy.zeros(d + 2, dtype=cupy.float64))
            return
        fn, nblocks, smem = self._mode(mode)
        partial = self._partial
        fn((nblocks,), (_LOGISTIC_THREADS,),
           (self.X, *self._shape_args, self.y01, self.sw, cw, np.float64(bias), cv, np.float64(vbias), partial),
           shared_mem=smem)
        self._launched = (mode, nblocks, partial)

    def sums(self, fp=0.0):
        """The last launched pass's partials summed (packed with the fingerprint ``fp``): a new float64 CuPy vector."""
        import cupy

        mode, nblocks, partial = self._launched
        d = self.d
        if not self.packed:
            if self.n == 0:
                return cupy.zeros(d + 2, dtype=cupy.float64)
            out = cupy.empty(d + 2, dtype=cupy.float64)
            self._sum((_sum_grid(d + 2),), (_SUM_THREADS,), (partial, np.int32(nblocks), np.int64(d + 2), out))
            return out
        loss = 1 - mode
        out = cupy.empty(loss + d + self.fi + 2, dtype=cupy.float64)
        self._sum((_sum_grid(out.size),), (_SUM_THREADS,),
                  (partial, np.int32(nblocks), np.int32(d), np.int32(loss), np.int32(self.fi),
                   np.float64(self.scale), np.float64(fp), out))
        return out
