"""One loader for every kernel family: prebuilt cubins, then this machine's cache, then NVRTC.

:func:`load` takes the family's ``.cu`` files (concatenated in order), the name
expressions a call needs and the NVRTC options, and returns ``{expression:
cupy.RawKernel}`` on the current device.  It looks, in order, for

1. a cubin shipped in the package (``prebuilt/sm_XY.zip``, written by
   :mod:`mpiml.kernels.build`) for this device's architecture, or an older
   minor of the same major (binary compatible), that holds every expression,
   compiled from the same source and options by the same NVRTC major;
2. a cubin in the per-machine cache (``MPIML_KERNEL_CACHE``, default
   ``~/.cache/mpiml/kernels``) that holds them;
3. else it compiles all the expressions in one NVRTC program and writes the
   cubin to the cache (a temporary file, then a rename).  The ranks of a node
   that ask at once wait on a file lock (``fcntl``) while the first compiles,
   then load its result.

A cubin travels with ``<key>.json``: the source hash, NVRTC major and the
lowered (mangled) name of every expression, so it is loaded with
``cupy.RawModule(path=...)`` without recompiling.  Anything that fails on the
way (a read-only cache, no NVRTC binding) falls back to CuPy's own
``RawModule(code=..., name_expressions=...)``, as before the loader existed.
"""

import contextlib
import ctypes
import glob
import hashlib
import json
import os
import site
import tempfile
import zipfile
from importlib import resources

__all__ = ["load", "load_module", "ensure_cached", "Module", "stats", "cache_dir", "source_text", "source_hash",
           "entry_key", "prebuilt_archs", "prebuilt_summary", "compile_cubin", "DEFAULT_OPTIONS"]

DEFAULT_OPTIONS = ("--std=c++17",)
_PACKAGE = "mpiml.kernels"

_TEXTS = {}          # (files) -> source text
_HASHES = {}         # (text, options) -> source hash
_LOADED = {}         # (device, source hash) -> [Module]: the modules loaded so far
_CACHE_INDEX = {}    # cache folder -> {json path: metadata}
_PREBUILT = {}       # zip path -> (zip path, index) or None
_STATS = {"prebuilt": 0, "cache": 0, "compiled": 0, "fallback": 0}


# ---------------------------------------------------------------------------------------------------------- keys

def source_text(files):
    """The source of ``files`` (package files under ``mpiml/kernels``), concatenated with newlines."""
    files = tuple(files)
    text = _TEXTS.get(files)
    if text is None:
        pkg = resources.files(_PACKAGE)
        text = _TEXTS[files] = "\n".join(pkg.joinpath(f).read_text() for f in files)
    return text


def source_hash(text, options):
    """What a cubin was compiled from: the source text and the options (hex)."""
    key = (text, tuple(options))
    hit = _HASHES.get(key)
    if hit is None:
        h = hashlib.sha256(text.encode())
        h.update(b"\0" + "\0".join(options).encode())
        hit = _HASHES[key] = h.hexdigest()[:24]
    return hit


def entry_key(src_hash, expressions, arch, nvrtc_major):
    """The name of one cubin: source hash, its expressions (any order), architecture and NVRTC major."""
    h = hashlib.sha256(f"{src_hash}|{arch}|{nvrtc_major}|".encode())
    h.update("\0".join(sorted(expressions)).encode())
    return h.hexdigest()[:24]


def cache_dir():
    """This machine's kernel cache: ``MPIML_KERNEL_CACHE``, else ``~/.cache/mpiml/kernels``."""
    named = os.environ.get("MPIML_KERNEL_CACHE")
    if named:
        return os.path.abspath(os.path.expanduser(named))
    return os.path.join(os.path.expanduser("~"), ".cache", "mpiml", "kernels")


def compatible_archs(cc):
    """Architectures whose cubins run on compute capability ``cc`` (an int like 86), best first: the same
    one, then the older minors of its major."""
    major, minor = divmod(int(cc), 10)
    return [f"sm_{major}{m}" for m in range(minor, -1, -1)]


# ------------------------------------------------------------------------------------------------------ compile

def _find_nvrtc():
    """libnvrtc for compiling without CuPy: ``MPIML_NVRTC``, else the ``nvidia-cuda-nvrtc`` wheel."""
    named = os.environ.get("MPIML_NVRTC")
    if named:
        return named
    roots = site.getsitepackages() + [site.getusersitepackages()]
    for root in roots:
        hits = sorted(glob.glob(os.path.join(root, "nvidia", "cu*", "lib", "libnvrtc.so.*"))
                      + glob.glob(os.path.join(root, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.*")))
        for hit in hits:
            if "builtins" not in hit:
                return hit
    return "libnvrtc.so"


class _CtypesNVRTC:
    """The few NVRTC calls the build needs, through ctypes (no CuPy, no GPU)."""

    def __init__(self, path=None):
        self.lib = ctypes.CDLL(path or _find_nvrtc())

    def version(self):
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        return major.value, minor.value

    def archs(self):
        n = ctypes.c_int()
        self.lib.nvrtcGetNumSupportedArchs(ctypes.byref(n))
        out = (ctypes.c_int * n.value)()
        self.lib.nvrtcGetSupportedArchs(out)
        return list(out)

    def compile(self, source, expressions, arch, options):
        lib = self.lib
        prog = ctypes.c_void_p()
        if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"mpiml.cu", 0, None, None):
            raise RuntimeError("nvrtcCreateProgram failed")
        try:
            for e in expressions:
                lib.nvrtcAddNameExpression(prog, e.encode())
            opts = [f"--gpu-architecture={arch}".encode()] + [o.encode() for o in options]
            res = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            if res:
                raise RuntimeError(f"NVRTC failed to compile {list(expressions)} for {arch}:\n"
                                   + log.value.decode(errors="replace"))
            ptx = arch.startswith("compute_")
            (lib.nvrtcGetPTXSize if ptx else lib.nvrtcGetCUBINSize)(prog, ctypes.byref(size))
            cubin = ctypes.create_string_buffer(size.value)
            (lib.nvrtcGetPTX if ptx else lib.nvrtcGetCUBIN)(prog, cubin)
            lowered = {}
            for e in expressions:
                ptr = ctypes.c_char_p()
                lib.nvrtcGetLoweredName(prog, e.encode(), ctypes.byref(ptr))
                lowered[e] = ptr.value.decode()
            return cubin.raw, lowered
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))


class _CupyNVRTC:
    """NVRTC through CuPy's binding (the library CuPy itself compiles with)."""

    def __init__(self):
        from cupy.cuda import nvrtc

        self.nvrtc = nvrtc

    def version(self):
        return tuple(self.nvrtc.getVersion())

    def archs(self):
        return list(self.nvrtc.getSupportedArchs())

    def compile(self, source, expressions, arch, options):
        nv = self.nvrtc
        prog = nv.createProgram(source, "mpiml.cu", (), ())
        try:
            for e in expressions:
                nv.addNameExpression(prog, e)
            try:
                nv.compileProgram(prog, [f"--gpu-architecture={arch}", *options])
            except nv.NVRTCError as exc:
                raise RuntimeError(f"NVRTC failed to compile {list(expressions)} for {arch}:\n"
                                   + nv.getProgramLog(prog)) from exc
            image = nv.getPTX(prog) if arch.startswith("compute_") else nv.getCUBIN(prog)
            return image, {e: nv.getLoweredName(prog, e) for e in expressions}
        finally:
            nv.destroyProgram(prog)


_COMPILER = None


def _compiler():
    global _COMPILER
    if _COMPILER is None:
        try:
            _COMPILER = _CupyNVRTC()
        except ImportError:
            _COMPILER = _CtypesNVRTC()
    return _COMPILER


def compile_cubin(source, expressions, arch, options=DEFAULT_OPTIONS, compiler=None):
    """``(cubin bytes, {expression: lowered name})``: every expression in one NVRTC program for ``arch``
    (``compute_XY``: PTX instead of a cubin)."""
    return (compiler or _compiler()).compile(source, list(expressions), arch, tuple(options))


# ------------------------------------------------------------------------------------------------- file helpers

def _file_mode():
    """0o666 less the process's umask (read once: setting it back and forth is process-wide)."""
    global _MODE
    if _MODE is None:
        umask = os.umask(0o22)
        os.umask(umask)
        _MODE = 0o666 & ~umask
    return _MODE


_MODE = None


def _write_atomic(path, data):
    """Write ``data`` (bytes) to ``path`` through a temporary file in the same folder and a rename."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, _file_mode())          # as open() would make it (mkstemp's is private), for a shared cache
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _store(folder, key, cubin, meta):
    """Cubin first, then its JSON: a reader that sees the JSON finds the cubin complete."""
    _write_atomic(os.path.join(folder, key + ".cubin"), cubin)
    _write_atomic(os.path.join(folder, key + ".json"), json.dumps(meta, sort_keys=True).encode())


@contextlib.contextmanager
def _file_lock(path):
    """An exclusive ``fcntl`` lock on ``path`` (created): the other processes of the node wait here."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _read_meta(path):
    try:
        with open(path) as f:
            meta = json.load(f)
        return meta if isinstance(meta.get("lowered"), dict) else None
    except (OSError, ValueError):
        return None


def find_cached(folder, src_hash, expressions, nvrtc_major):
    """``(cubin path, metadata)`` of a cubin in ``folder`` compiled from ``src_hash`` by ``nvrtc_major`` that
    holds every expression, or None.  The folder's JSON files are read once a process, and its new ones
    again on a miss (another process may have compiled since)."""
    need = set(expressions)
    for scan in (False, True):
        index = _CACHE_INDEX.get(folder)
        if index is None or scan:
            known = index or {}
            index = _CACHE_INDEX[folder] = {}
            for path in glob.glob(os.path.join(folder, "*.json")):
                meta = known.get(path) or _read_meta(path)
                if meta is not None:
                    index[path] = meta
        for path, meta in index.items():
            if (meta.get("source") == src_hash and meta.get("nvrtc") == nvrtc_major
                    and need <= meta["lowered"].keys() and os.path.exists(path[:-5] + ".cubin")):
                return path[:-5] + ".cubin", meta
    return None


# --------------------------------------------------------------------------------------------------- prebuilt

def _prebuilt_folder():
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "prebuilt")


def _prebuilt(arch):
    """``(zip path, index)`` of the cubins shipped for ``arch``, or None."""
    path = os.path.join(_prebuilt_folder(), arch + ".zip")
    if path not in _PREBUILT:
        entry = None
        if os.path.exists(path):
            try:
                with zipfile.ZipFile(path) as z:
                    entry = (path, json.loads(z.read("index.json")))
            except (OSError, ValueError, KeyError, zipfile.BadZipFile):
                entry = None
        _PREBUILT[path] = entry
    return _PREBUILT[path]


def prebuilt_archs():
    """The architectures the package ships cubins for."""
    folder = _prebuilt_folder()
    return sorted(os.path.basename(p)[:-4] for p in glob.glob(os.path.join(folder, "sm_*.zip")))


def prebuilt_summary(cc=None):
    """``{arch, kernels, cubins, nvrtc, bytes}`` of the shipped cubins that run on compute capability ``cc``
    (None: every architecture shipped), one dict per architecture found."""
    archs = compatible_archs(cc) if cc is not None else prebuilt_archs()
    out = []
    for arch in archs:
        hit = _prebuilt(arch)
        if hit is None:
            continue
        path, index = hit
        out.append({"arch": arch, "cubins": len(index["entries"]),
                    "kernels": sum(len(e["lowered"]) for e in index["entries"]),
                    "nvrtc": sorted({e["nvrtc"] for e in index["entries"]}), "bytes": os.path.getsize(path)})
    return out


def _from_prebuilt(archs, src_hash, expressions, nvrtc_major, cache):
    """A shipped cubin holding ``expressions``, extracted into the cache: ``(path, metadata)`` or None."""
    need = set(expressions)
    for arch in archs:
        hit = _prebuilt(arch)
        if hit is None:
            continue
        zpath, index = hit
        for entry in index["entries"]:
            if entry["source"] == src_hash and entry["nvrtc"] == nvrtc_major and need <= entry["lowered"].keys():
                # (a cubin's file name is its key: the same name holds the same kernels)
                with zipfile.ZipFile(zpath) as z:
                    for folder in (os.path.join(cache, "prebuilt", arch),
                                   os.path.join(tempfile.gettempdir(), f"mpiml-kernels-{os.getuid()}", arch)):
                        path = os.path.join(folder, entry["file"])
                        try:
                            if not os.path.exists(path):
                                os.makedirs(folder, exist_ok=True)
                                _write_atomic(path, z.read(entry["file"]))
                            return path, entry
                        except OSError:          # a read-only cache: a private temporary folder
                            continue
    return None


# ------------------------------------------------------------------------------------------------------- load

def _device_arch():
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    return dev, int(cupy.cuda.Device(dev).compute_capability)


def _runtime_major():
    """The CUDA major version CuPy runs (its NVRTC's), which a cubin's NVRTC must match."""
    import cupy

    return int(cupy.cuda.runtime.runtimeGetVersion()) // 1000


class Module:
    """A loaded cubin: kernels by name expression, globals by symbol, on the device it was loaded on."""

    def __init__(self, raw, lowered, path=None):
        self.raw, self.lowered, self.path = raw, lowered, path
        self._functions = {}

    def get_function(self, expression):
        """The ``cupy.RawKernel`` of ``expression``."""
        fn = self._functions.get(expression)
        if fn is None:
            fn = self._functions[expression] = self.raw.get_function(self.lowered[expression])
        return fn

    def get_global(self, name):
        """The ``cupy.cuda.MemoryPointer`` of the module-scope variable ``name``."""
        return self.raw.get_global(name)


def _open(path, meta):
    """Load the cubin at ``path`` on the current device (now, so that a cubin the driver refuses fails here)."""
    import cupy

    mod = Module(cupy.RawModule(path=path), dict(meta["lowered"]), path)
    mod.get_function(next(iter(mod.lowered)))
    return mod


def _compile_into(folder, text, src_hash, expressions, arch, nvrtc_major, options, compiler=None):
    """Compile ``expressions`` into ``folder`` under its lock, unless another process did meanwhile."""
    os.makedirs(folder, exist_ok=True)
    key = entry_key(src_hash, expressions, arch, nvrtc_major)
    with _file_lock(os.path.join(folder, key + ".lock")):
        meta = _read_meta(os.path.join(folder, key + ".json"))
        if meta is not None and os.path.exists(os.path.join(folder, key + ".cubin")):
            return os.path.join(folder, key + ".cubin"), meta, "cache"
        cubin, lowered = compile_cubin(text, expressions, arch, options, compiler)
        meta = {"source": src_hash, "nvrtc": nvrtc_major, "arch": arch, "options": list(options),
                "lowered": lowered}
        _store(folder, key, cubin, meta)
        _CACHE_INDEX.setdefault(folder, {})[os.path.join(folder, key + ".json")] = meta
        return os.path.join(folder, key + ".cubin"), meta, "compiled"


def ensure_cached(files, expressions, arch, nvrtc_major, options=DEFAULT_OPTIONS, compiler=None):
    """Make ``expressions`` findable for ``arch`` without loading them (no GPU needed): ``"prebuilt"`` when a
    shipped cubin holds them, ``"cache"`` when this machine's cache does, else ``"compiled"`` into the cache."""
    text = source_text(files)
    src_hash = source_hash(text, options)
    need = set(expressions)
    for shipped in compatible_archs(int(arch[3:])):
        hit = _prebuilt(shipped)
        if hit is not None and any(e["source"] == src_hash and e["nvrtc"] == nvrtc_major
                                   and need <= e["lowered"].keys() for e in hit[1]["entries"]):
            return "prebuilt"
    folder = os.path.join(cache_dir(), arch)
    if os.path.isdir(folder) and find_cached(folder, src_hash, expressions, nvrtc_major) is not None:
        return "cache"
    return _compile_into(folder, text, src_hash, list(expressions), arch, nvrtc_major, tuple(options), compiler)[2]


def load_module(files, expressions, options=DEFAULT_OPTIONS, also=()):
    """A :class:`Module` holding every expression, on the current device.

    ``also``: expressions compiled into the same program when ``expressions`` must be compiled (the rest of
    what the call will ask for next), not looked for.  A module already loaded in this process that holds
    ``expressions`` is reused (one module, one constant bank, per cubin): a family that needs its own module
    for an expression asks for it alone, with nothing ``also``, and the build never groups it with others.
    """
    files, expressions, options = tuple(files), list(dict.fromkeys(expressions)), tuple(options)
    also = [e for e in dict.fromkeys(also) if e not in expressions]
    text = source_text(files)
    src_hash = source_hash(text, options)
    dev, cc = _device_arch()
    need = set(expressions)
    for mod in _LOADED.get((dev, src_hash), ()):
        if need <= mod.lowered.keys():
            return mod
    try:
        path, meta, how = _locate(text, src_hash, expressions, cc, options, also)
        mod = _open(path, meta)
    except Exception as exc:       # noqa: BLE001 - any failure of ours: compile as CuPy always did
        if os.environ.get("MPIML_KERNEL_STRICT") == "1":
            raise
        import cupy

        _STATS["last_fallback_error"] = repr(exc)
        raw = cupy.RawModule(code=text, options=options, name_expressions=expressions + also)
        raw.compile()
        mod, how = Module(raw, {e: e for e in expressions + also}), "fallback"
    _STATS[how] += 1
    _record(files, expressions, options, how)
    _LOADED.setdefault((dev, src_hash), []).append(mod)
    return mod


def _record(files, expressions, options, how):
    """``MPIML_KERNEL_RECORD=path``: append what was asked for and how it was served (one JSON line a module
    loaded), to see which kernels a run needs beyond those shipped."""
    path = os.environ.get("MPIML_KERNEL_RECORD")
    if path:
        with contextlib.suppress(OSError), open(path, "a") as f:
            f.write(json.dumps({"files": list(files), "expressions": list(expressions),
                                "options": list(options), "how": how}) + "\n")


def _locate(text, src_hash, expressions, cc, options, also=()):
    """``(cubin path, metadata, how)``: shipped (``"prebuilt"``), ``"cache"``d or ``"compiled"`` now."""
    major = _runtime_major()
    cache = cache_dir()
    archs = compatible_archs(cc)
    hit = _from_prebuilt(archs, src_hash, expressions, major, cache)
    if hit is not None:
        return (*hit, "prebuilt")
    arch = archs[0]
    folder = os.path.join(cache, arch)
    hit = find_cached(folder, src_hash, expressions, major) if os.path.isdir(folder) else None
    if hit is not None:
        return (*hit, "cache")
    return _compile_into(folder, text, src_hash, list(expressions) + list(also), _nvrtc_arch(arch), major,
                         options)


def _nvrtc_arch(arch):
    """``arch`` if this NVRTC can compile for it, else the newest it can, as PTX (``compute_XY``) that the
    driver compiles for the device."""
    try:
        supported = _compiler().archs()
    except Exception:              # noqa: BLE001 - an old binding: assume it knows the device
        return arch
    cc = int(arch[3:])
    if not supported or cc in supported:
        return arch
    return f"compute_{max(a for a in supported if a <= cc)}"


def load(files, expressions, options=DEFAULT_OPTIONS):
    """``{expression: cupy.RawKernel}`` for every expression of ``files`` on the current device.

    Parameters
    ----------
    files : sequence of str
        ``.cu``/``.cuh`` files of :mod:`mpiml.kernels`, concatenated in order.
    expressions : sequence of str
        Name expressions (``"mpiml_hist_move<true>"``); all are compiled in one program on a miss.
    options : sequence of str, default=("--std=c++17",)
        NVRTC options (part of the cubin's key).
    """
    mod = load_module(files, expressions, options)
    return {e: mod.get_function(e) for e in expressions}


def stats():
    """How this process's kernel requests were served: prebuilt, cache, compiled, fallback."""
    return dict(_STATS)
