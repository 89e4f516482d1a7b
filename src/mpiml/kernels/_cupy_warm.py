"""CuPy's own kernels, compiled before a fit needs them: a recorded list, shipped, compiled in parallel at start-up.

CuPy compiles each element-wise, reduction and raw kernel with NVRTC the first time a machine needs it
and keeps the cubin in its cache (``CUPY_CACHE_DIR``, default ``~/.cupy/kernel_cache``); on a machine where
CuPy never ran, that is most of a first fit (KMeans 10 s of 10.2 s on an H100).  Every one of those
compilations goes through one function, ``cupy.cuda.compiler._compile_module_with_cache``, looked up on
its module at each call.  So:

* :class:`Recorder` wraps it while workloads run and keeps, for each module compiled (or found in the
  cache), what CuPy asked for: the source, the options, the name expressions, the backend, jitify, and
  the workloads ("tags") that needed it, in order of first use.  ``python -m mpiml.cli._cupy_record``
  runs the estimators of ``benchmarks/gpu/first_fit.py`` and ``mpiml run`` and writes the manifest
  :data:`MANIFEST` (gzipped JSON beside this module, package data) with the CuPy and NVRTC versions.
  Options are stored as the options CuPy assembles with its own include paths (``{"user": [...]}``), so
  an entry means the same on any installation of that CuPy.
* :func:`start` (called by :func:`mpiml.init` on a GPU) replays the manifest's entries through the same
  CuPy function -- CuPy computes the cache key, compiles and writes its cache itself -- on a pool of
  threads (NVRTC releases the GIL while it compiles).  The ranks of a node split the list (local rank
  ``r`` of ``n`` starts with the entries ``i % n == r``, then helps with the others' from the end); an
  ``fcntl`` lock per entry makes sure one process compiles each, and a marker file
  (``<CUPY_CACHE_DIR>/mpiml-warm/``) says it is in the cache, so a warm machine costs a few ``stat``
  calls.  The warm-up runs in the background while the program goes on; until it ends, the wrapped
  function lets a fit that needs an entry take it first (compiled at once in the fit's thread, or waited
  for where another thread or rank is compiling it) and moves that workload's other entries to the
  front of the queue.  A manifest recorded with another CuPy version or CUDA major is not used.

``MPIML_CUPY_WARM``: unset, :func:`mpiml.init` starts no warm-up (``mpiml run`` warms its own workload,
``mpiml warmup`` compiles everything ahead); ``1`` starts it for every workload; ``0`` turns it off
everywhere; ``wait`` makes :func:`mpiml.init` return only once the kernels are compiled; a comma-separated
list of tags (``kmeans,pca``) compiles only those workloads' kernels.
``MPIML_CUPY_WARM_JOBS``: threads per rank (default: this rank's share of the node's cores, at most 16).
Nothing here ever fails a fit: a warm-up that fails says why once (logger ``mpiml.kernels``) and stops.
"""

import atexit
import contextlib
import functools
import gzip
import hashlib
import inspect
import json
import logging
import os
import threading
import time
from importlib import resources

__all__ = ["Recorder", "read_manifest", "write_manifest", "manifest_path", "start", "wait", "stop", "status",
           "parse_setting", "MANIFEST", "FORMAT"]

MANIFEST = "cupy_kernels.json.gz"
FORMAT = 1
_PACKAGE = "mpiml.kernels"
_MAX_JOBS = 16
_FIELDS = ("source", "options", "arch", "extra_source", "backend", "enable_cooperative_groups", "name_expressions",
           "jitify", "to_ltoir")
_OFF = ("0", "off", "no", "false")
_ON = ("1", "on", "yes", "true", "all")

_log = logging.getLogger("mpiml.kernels")
_WARNED = set()
_CURRENT = []      # the warm-up of this process (at most one)
_STATUS = {"state": "not started"}


def _warn_once(key, msg):
    if key not in _WARNED:
        _WARNED.add(key)
        _log.warning("mpiml: CuPy kernel warm-up: %s", msg)


# ------------------------------------------------------------------------------------------------------ CuPy

class CupyHooks:
    """What the recorder and the warm-up need from CuPy, in one place (the tests pass a stand-in)."""

    def __init__(self):
        import cupy
        from cupy._core import core
        from cupy.cuda import compiler

        self.cupy, self.core, self.compiler = cupy, core, compiler

    def versions(self):
        """``{"cupy": version, "nvrtc": [major, minor]}``."""
        return {"cupy": self.cupy.__version__, "nvrtc": list(self.compiler._get_nvrtc_version())}

    def get(self):
        return self.compiler._compile_module_with_cache

    def set(self, fn):
        self.compiler._compile_module_with_cache = fn

    def assemble(self, options):
        """The options CuPy passes down for the user-level ``options`` (its include paths and C++ standard)."""
        return tuple(self.core.assemble_cupy_compiler_options(tuple(options)))

    def header_source(self):
        """The header text CuPy adds to every cache key (``extra_source``)."""
        return self.core._get_header_source()

    def paths(self):
        """Installation paths that raw options may name, by placeholder."""
        out = {"{cupy_include}": self.core._get_header_dir_path()}
        with contextlib.suppress(Exception):
            out["{cuda_path}"] = self.cupy.cuda.get_cuda_path()
        return {k: v for k, v in out.items() if v}

    def cache_dir(self):
        return os.environ.get("CUPY_CACHE_DIR") or os.path.expanduser("~/.cupy/kernel_cache")

    def arch(self):
        """The architecture CuPy compiles for on the current device (``"90"``)."""
        return str(self.compiler._get_arch())

    def use_device(self, device):
        self.cupy.cuda.Device(device).use()


# --------------------------------------------------------------------------------------------------- entries

_SIGNATURES = {}


def _signature(fn):
    sig = _SIGNATURES.get(fn)
    if sig is None:
        sig = _SIGNATURES[fn] = inspect.signature(fn)
    return sig


def _bind(fn, args, kwargs):
    """The arguments of a call of CuPy's compile function by name (its signature changed between versions)."""
    sig = _signature(fn)
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    named = dict(bound.arguments)
    for name, p in sig.parameters.items():
        if p.kind is p.VAR_KEYWORD:                  # a wrapper's **kwargs
            named.update(named.pop(name, {}))
    return {k: named.get(k) for k in _FIELDS}


class _Options:
    """Options as CuPy passed them <-> a form that holds on another installation of the same CuPy."""

    def __init__(self, hooks):
        self.hooks = hooks
        self.base = hooks.assemble(())
        self.paths = sorted(hooks.paths().items(), key=lambda kv: -len(kv[1]))

    def portable(self, options):
        """``{"user": [...]}`` when CuPy's assembly of those gives ``options`` here, else ``{"raw": [...]}`` with
        the installation's paths replaced by placeholders."""
        options, base = tuple(options), self.base
        n = min(len(options), len(base))
        p = 0
        while p < n and options[p] == base[p]:
            p += 1
        s = 0
        while s < n - p and options[-1 - s] == base[-1 - s]:
            s += 1
        user = options[p:len(options) - s]
        if self.hooks.assemble(user) == options:
            return {"user": list(user)}
        raw = []
        for o in options:
            for placeholder, path in self.paths:
                o = o.replace(path, placeholder)
            raw.append(o)
        return {"raw": raw}

    def local(self, spec):
        """The options to pass here for a stored form, or None when a placeholder has no value here."""
        if "user" in spec:
            return self.hooks.assemble(tuple(spec["user"]))
        local = dict(self.paths)
        out = []
        for o in spec["raw"]:
            for placeholder in ("{cupy_include}", "{cuda_path}"):
                if placeholder in o:
                    if placeholder not in local:
                        return None
                    o = o.replace(placeholder, local[placeholder])
            out.append(o)
        return tuple(out)


def _spec(call, options, hooks):
    """The stored form of one call (``_bind``'s dict)."""
    extra = call["extra_source"]
    if extra is not None and extra == hooks.header_source():
        extra = {"cupy_headers": True}
    names = call["name_expressions"]
    return {"source": call["source"], "options": options.portable(call["options"] or ()),
            "arch": None if call["arch"] is None else str(call["arch"]), "extra": extra,
            "backend": call["backend"] or "nvrtc", "cooperative": bool(call["enable_cooperative_groups"]),
            "name_expressions": None if names is None else [str(n) for n in names],
            "jitify": bool(call["jitify"]), "to_ltoir": bool(call["to_ltoir"])}


def entry_id(spec):
    """A stable name for a stored call (its fields, not its tags)."""
    fields = {k: spec[k] for k in ("source", "options", "arch", "extra", "backend", "cooperative",
                                   "name_expressions", "jitify", "to_ltoir")}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:24]


def _replay(spec, fn, options, hooks):
    """Call CuPy's compile function as the recorded call did (CuPy compiles it, or finds it in its cache)."""
    opts = options.local(spec["options"])
    if opts is None:
        raise _Skip("an include path of the recording machine has no counterpart here")
    extra = spec["extra"]
    if isinstance(extra, dict):
        extra = hooks.header_source()
    kwargs = {"arch": spec["arch"], "extra_source": extra, "backend": spec["backend"],
              "enable_cooperative_groups": spec["cooperative"], "name_expressions": spec["name_expressions"],
              "log_stream": None, "jitify": spec["jitify"]}
    if spec["to_ltoir"]:
        kwargs["to_ltoir"] = True
    params = _signature(fn).parameters
    return fn(spec["source"], opts, **{k: v for k, v in kwargs.items() if k in params})


@contextlib.contextmanager
def _flock(path, blocking=True):
    """An exclusive ``flock`` on ``path`` (created); yields whether it was taken (always, when blocking)."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            with contextlib.suppress(OSError):
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


class _Skip(Exception):
    """An entry that cannot be replayed here (not an error of the warm-up)."""


# -------------------------------------------------------------------------------------------------- recording

class Recorder:
    """While active, keeps every module CuPy compiles or loads from its cache (see the module's docstring).

    >>> with Recorder() as rec:                              # doctest: +SKIP
    ...     with rec.tagged("kmeans"):
    ...         KMeans(32).fit(X)
    >>> write_manifest(path, rec.manifest())                 # doctest: +SKIP
    """

    def __init__(self, hooks=None):
        self.hooks = hooks
        self.entries = {}       # id -> spec with "tags", in order of first use
        self.errors = []
        self._tags = []
        self._lock = threading.Lock()
        self._orig = self._hooked = None
        self._on = False

    @contextlib.contextmanager
    def tagged(self, tag):
        """Calls inside are attributed to workload ``tag``."""
        self._tags.append(tag)
        try:
            yield self
        finally:
            self._tags.pop()

    def __enter__(self):
        self.hooks = self.hooks or CupyHooks()
        self._options = _Options(self.hooks)
        orig = self._orig = self.hooks.get()

        @functools.wraps(orig)          # its signature too, for a wrapper above this one
        def hooked(*args, **kwargs):
            if self._on:
                try:
                    self.add(_bind(orig, args, kwargs))
                except Exception as exc:  # noqa: BLE001 - recording never changes what CuPy does
                    self.errors.append(f"{type(exc).__name__}: {exc}")
            return orig(*args, **kwargs)

        self._hooked = hooked
        self._on = True
        self.hooks.set(hooked)
        return self

    def __exit__(self, *exc):
        self._on = False
        if self.hooks.get() is self._hooked:
            self.hooks.set(self._orig)
        return False

    def add(self, call):
        """Keep one call (a dict of :data:`_FIELDS`)."""
        spec = _spec(call, self._options, self.hooks)
        eid = entry_id(spec)
        tag = self._tags[-1] if self._tags else "untagged"
        with self._lock:
            entry = self.entries.get(eid)
            if entry is None:
                entry = self.entries[eid] = dict(spec, id=eid, tags=[])
            if tag not in entry["tags"]:
                entry["tags"].append(tag)

    def manifest(self, **meta):
        """The manifest of what was recorded (``meta`` is stored beside the versions)."""
        out = {"format": FORMAT, **self.hooks.versions(), "recorded": meta, "entries": list(self.entries.values())}
        if self.errors:
            out["recording_errors"] = self.errors[:20]
        return out


def merge(manifests):
    """One manifest from several (same versions), entries in the order the parts come, tags united."""
    if not manifests:
        raise ValueError("nothing to merge")
    first = manifests[0]
    for m in manifests[1:]:
        if (m["cupy"], m["nvrtc"]) != (first["cupy"], first["nvrtc"]):
            raise ValueError(f"parts recorded with different CuPy/NVRTC: {m['cupy']} {m['nvrtc']} vs "
                             f"{first['cupy']} {first['nvrtc']}")
    entries = {}
    for m in manifests:
        for e in m["entries"]:
            have = entries.get(e["id"])
            if have is None:
                entries[e["id"]] = dict(e, tags=list(e["tags"]))
            else:
                have["tags"] += [t for t in e["tags"] if t not in have["tags"]]
    out = {k: v for k, v in first.items() if k not in ("entries", "recording_errors")}
    out["entries"] = list(entries.values())
    return out


# --------------------------------------------------------------------------------------------------- manifest

def manifest_path():
    """The manifest shipped in the package (it may not exist)."""
    return str(resources.files(_PACKAGE).joinpath(MANIFEST))


def write_manifest(path, manifest):
    """Write ``manifest`` as gzipped JSON (reproducible bytes: no time stamp in the gzip header)."""
    data = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    tmp = path + ".tmp"
    with open(tmp, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as z:
        z.write(data)
    os.replace(tmp, path)


def read_manifest(path=None):
    """The manifest at ``path`` (default: the shipped one), or None when there is none; ValueError when it is
    not one."""
    path = path or manifest_path()
    try:
        with gzip.open(path, "rb") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, EOFError) as exc:
        raise ValueError(f"{path}: not a CuPy kernel manifest ({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), list):
        raise ValueError(f"{path}: not a CuPy kernel manifest of format {FORMAT}")
    return data


# ----------------------------------------------------------------------------------------------------- warm-up

def parse_setting(value):
    """``MPIML_CUPY_WARM`` -> ``(on, wait, tags or None)``."""
    words = [w.strip().lower() for w in (value or "").split(",") if w.strip()]
    if any(w in _OFF for w in words):
        return False, False, None
    tags = [w for w in words if w not in _ON and w != "wait"]
    return True, "wait" in words, tags or None


def node_order(n_entries, node_rank, node_size):
    """The order in which local rank ``node_rank`` of ``node_size`` takes the entries: its own share
    (``i % node_size == node_rank``) first, then the others' from the end (their owners start at the front)."""
    node_size = max(1, int(node_size))
    node_rank = int(node_rank) % node_size
    own = [i for i in range(n_entries) if i % node_size == node_rank]
    rest = [i for i in reversed(range(n_entries)) if i % node_size != node_rank]
    return own + rest


def default_jobs(cores=None, ranks_on_node=1):
    """Threads of one rank: ``MPIML_CUPY_WARM_JOBS``, else its share of the node's cores, at most 16."""
    named = os.environ.get("MPIML_CUPY_WARM_JOBS", "").strip()
    if named.isdigit() and int(named) > 0:
        return int(named)
    if not cores:
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
    return max(1, min(_MAX_JOBS, int(cores) // max(1, int(ranks_on_node))))


class _Warmup:
    """One process's warm-up: a queue of entries, worker threads, and the wrapped compile function."""

    def __init__(self, entries, hooks, device, node_rank, node_size, jobs, marker_dir, versions):
        self.hooks, self.device, self.jobs, self.marker_dir = hooks, device, jobs, marker_dir
        self.entries = {e["id"]: e for e in entries}
        order = node_order(len(entries), node_rank, node_size)
        self.pending = [entries[i]["id"] for i in order]
        self.options = _Options(hooks)
        arch = hooks.arch()
        self.salt = f"{versions['cupy']}|{versions['nvrtc']}|{arch}"
        self.counts = {"compiled": 0, "cached": 0, "waited": 0, "by_fit": 0, "skipped": 0, "failed": 0}
        self.context = set()
        self.deferred = []
        # one entry per set of options: replayed even where cached, so that CuPy's per-process set-up of those
        # options (loading NVRTC, its one-off compile of an empty file per option set) is not a fit's
        primers = {}
        for e in entries:
            primers.setdefault(json.dumps([e["options"], e["arch"], e["backend"]], sort_keys=True), e["id"])
        self.primers = list(primers.values())
        self.lock = threading.Lock()
        self.entry_locks = {}
        self.stopping = False
        self.active = True
        self.done = threading.Event()
        self.t0 = time.perf_counter()
        self.seconds = None
        self.threads = []
        self.running = 0
        self.finished = False
        self.orig = hooks.get()
        self.hooked = self._make_hook()

    # -- markers and locks
    def marker(self, eid):
        entry = self.entries[eid]
        arch = entry["arch"] or ""
        name = hashlib.sha256(f"{eid}|{self.salt}|{arch}".encode()).hexdigest()[:32]
        return os.path.join(self.marker_dir, name)

    def _entry_lock(self, eid):
        with self.lock:
            lk = self.entry_locks.get(eid)
            if lk is None:
                lk = self.entry_locks[eid] = threading.Lock()
            return lk

    def ensure(self, eid, live=None, blocking=True):
        """Put entry ``eid`` in CuPy's cache unless its marker says it is: here, or by waiting for the thread or
        process compiling it (``blocking=False``: return ``("busy", None)`` instead of waiting).  ``live`` (the
        fit's own call) compiles it instead of a replay; returns ``(how, its result or None)``."""
        marker = self.marker(eid)
        lk = self._entry_lock(eid)           # threads of this process (flock may not separate them on NFS)
        if not lk.acquire(blocking):
            return "busy", None
        try:
            if os.path.exists(marker):
                return "cached", None
            with _flock(marker + ".lock", blocking) as got:   # other processes
                if not got:
                    return "busy", None
                if os.path.exists(marker):
                    return "waited", None
                result = live() if live is not None else _replay(self.entries[eid], self.orig, self.options,
                                                                 self.hooks)
                with open(marker, "wb"):
                    pass
                return "compiled", result
        finally:
            lk.release()

    # -- the queue
    def take(self):
        """``(entry, blocking)``: the next entry; those another thread or rank was compiling come last, waited
        for.  ``(None, _)`` when there is none left."""
        with self.lock:
            if self.stopping:
                return None, False
            if self.pending:
                return self.pending.pop(0), False
            if self.deferred:
                return self.deferred.pop(0), True
            return None, False

    def defer(self, eid):
        with self.lock:
            self.deferred.append(eid)

    def claim(self, eid):
        """A fit needs ``eid`` now: nobody else takes it from the queue, and the entries of the workloads that
        explain the fit's requests so far (the tags they share, else this one's) go first."""
        with self.lock:
            with contextlib.suppress(ValueError):
                self.pending.remove(eid)
            tags = set(self.entries[eid]["tags"])
            context = (self.context & tags) or tags
            if context != self.context:
                self.context = context
                self.pending.sort(key=lambda e: not context.intersection(self.entries[e]["tags"]))

    def count(self, how):
        with self.lock:
            self.counts[how] += 1

    # -- the wrapped compile function
    def match(self, args, kwargs):
        eid = entry_id(_spec(_bind(self.orig, args, kwargs), self.options, self.hooks))
        return eid if eid in self.entries else None

    def _make_hook(self):
        orig = self.orig

        @functools.wraps(orig)
        def hooked(*args, **kwargs):
            eid = None
            if self.active:
                try:
                    eid = self.match(args, kwargs)
                except Exception:  # noqa: BLE001 - never in the way of CuPy
                    eid = None
            if eid is None:
                return orig(*args, **kwargs)
            out = {}

            def live():
                try:
                    out["result"] = orig(*args, **kwargs)
                except BaseException as exc:
                    out["error"] = exc
                    raise
                return out["result"]

            try:
                self.claim(eid)
                how, _ = self.ensure(eid, live)
                self.count("by_fit" if how == "compiled" else how)
            except BaseException as exc:  # noqa: BLE001
                if "error" in out:         # CuPy's own failure: the fit sees it as it would have
                    raise out["error"] from None
                if not isinstance(exc, Exception):   # an interrupt while waiting
                    raise
                _warn_once("hook", f"{type(exc).__name__}: {exc}")
            if "result" in out:
                return out["result"]
            return orig(*args, **kwargs)

        return hooked

    # -- threads
    def run_worker(self):
        try:
            if self.device is not None:
                self.hooks.use_device(self.device)
            self._work()
        except Exception as exc:  # noqa: BLE001 - a thread that cannot work (no device): said once
            _warn_once("worker", f"a worker stopped ({type(exc).__name__}: {exc})")
        finally:
            self._worker_done()

    def _prime(self):
        with self.lock:
            todo, self.primers = self.primers, []
        for eid in todo:
            if os.path.exists(self.marker(eid)):      # in the cache: CuPy loads it (a missing one the queue compiles)
                with contextlib.suppress(Exception):
                    _replay(self.entries[eid], self.orig, self.options, self.hooks)

    def _work(self):
        self._prime()
        while True:
            eid, blocking = self.take()
            if eid is None:
                break
            try:
                how, _ = self.ensure(eid, blocking=blocking)
                if how == "busy":
                    self.defer(eid)
                    continue
                self.count(how)
            except _Skip:
                self.count("skipped")
            except Exception as exc:  # noqa: BLE001 - one entry that does not compile here
                self.count("failed")
                _warn_once("entry", f"an entry failed to compile ({type(exc).__name__}: "
                                    f"{str(exc).splitlines()[0] if str(exc) else ''}); the others go on")

    def _worker_done(self):
        with self.lock:
            self.running -= 1
            last = self.running == 0
        if last:
            self.finish()

    def finish(self):
        with self.lock:
            if self.finished:
                return
            self.finished = True
        self.active = False
        if self.hooks.get() is self.hooked:
            self.hooks.set(self.orig)
        self.seconds = time.perf_counter() - self.t0
        self.done.set()
        _STATUS.update(self.status())

    def status(self):
        with self.lock:
            pending = len(self.pending)
            counts = dict(self.counts)
        return {"state": "done" if self.done.is_set() else "running", "entries": len(self.entries),
                "pending": pending, "jobs": self.jobs, "counts": counts,
                "seconds": self.seconds if self.seconds is not None else time.perf_counter() - self.t0,
                "marker_dir": self.marker_dir}

    def start(self):
        self.hooks.set(self.hooked)
        with self.lock:
            for i in range(self.jobs):
                t = threading.Thread(target=self.run_worker, name=f"mpiml-cupy-warm-{i}", daemon=True)
                self.threads.append(t)
            self.running = len(self.threads)
        for t in self.threads:
            t.start()

    def forget_in_child(self):
        self.active = False
        self.stopping = True
        if self.hooks.get() is self.hooked:
            self.hooks.set(self.orig)
        self.done.set()

    def stop(self, timeout):
        """No new entries; wait up to ``timeout`` s for those being compiled (at exit)."""
        with self.lock:
            self.stopping = True
        deadline = time.monotonic() + timeout
        for t in list(self.threads):
            t.join(max(0.0, deadline - time.monotonic()))
        self.finish()


def start(device=None, *, tags=None, node_rank=0, node_size=1, cores=None, hooks=None, manifest=None, wait=None,
          setting=None):
    """Start compiling the manifest's kernels missing from CuPy's cache; returns :func:`status`.

    Parameters
    ----------
    device : int, default=None
        The GPU the worker threads compile for (None: CuPy's current one in each thread).
    tags : list of str or False, default=None
        Workloads whose kernels are compiled (None: ``MPIML_CUPY_WARM``'s list, else every one); False: none.
    node_rank, node_size : int
        This process's rank among the ranks of its node, and their count: how the list is split.
    cores : int, default=None
        Cores of the node for its ranks (threads: ``cores // node_size``, at most 16).
    hooks, manifest :
        CuPy's side (:class:`CupyHooks`) and the manifest (default: the shipped one); the tests pass their own.
    wait : bool, default=None
        Return only once done (None: ``wait`` in ``MPIML_CUPY_WARM``).
    setting : str, default=None
        Instead of ``MPIML_CUPY_WARM``.

    Never raises: a warm-up that cannot run records why in :func:`status` (and logs a failure once).
    """
    try:
        return _start(device, tags, node_rank, node_size, cores, hooks, manifest, wait, setting)
    except Exception as exc:  # noqa: BLE001 - the warm-up never fails the caller
        _warn_once("start", f"not started ({type(exc).__name__}: {exc})")
        _STATUS.clear()
        _STATUS.update(state="failed", reason=f"{type(exc).__name__}: {exc}")
        return dict(_STATUS)


def _skip(reason, log=False):
    _STATUS.clear()
    _STATUS.update(state="skipped", reason=reason)
    if log:
        _warn_once("skip", reason)
    return dict(_STATUS)


def _start(device, tags, node_rank, node_size, cores, hooks, manifest, wait, setting):
    if _CURRENT:
        return status()
    on, env_wait, env_tags = parse_setting(os.environ.get("MPIML_CUPY_WARM") if setting is None else setting)
    if not on or tags is False:
        return _skip("turned off (MPIML_CUPY_WARM=0)" if not on else "turned off by the caller")
    wait = env_wait if wait is None else bool(wait)
    if isinstance(tags, str):
        tags = [t.strip().lower() for t in tags.split(",") if t.strip()]
    tags = list(tags) if tags else env_tags
    if os.environ.get("CUPY_CACHE_IN_MEMORY", "").strip().lower() in ("1", "true", "yes", "on"):
        return _skip("CUPY_CACHE_IN_MEMORY is set: CuPy keeps no cache to fill")
    if manifest is None:
        manifest = read_manifest()
        if manifest is None:
            return _skip(f"no manifest shipped ({MANIFEST})")
    hooks = hooks or CupyHooks()
    versions = hooks.versions()
    if manifest["cupy"] != versions["cupy"] or list(manifest["nvrtc"])[:1] != list(versions["nvrtc"])[:1]:
        return _skip(f"the manifest was recorded with CuPy {manifest['cupy']} / NVRTC {manifest['nvrtc']}, this is "
                     f"CuPy {versions['cupy']} / NVRTC {versions['nvrtc']}")
    entries = [e for e in manifest["entries"] if e.get("backend", "nvrtc") == "nvrtc"
               and (tags is None or set(tags).intersection(e["tags"]))]
    if not entries:
        return _skip(f"no entry for {tags}" if tags else "an empty manifest")
    marker_dir = os.path.join(hooks.cache_dir(), "mpiml-warm")
    try:
        os.makedirs(marker_dir, exist_ok=True)
    except OSError as exc:
        return _skip(f"cannot write beside CuPy's cache ({exc})", log=True)
    jobs = min(default_jobs(cores, node_size), len(entries))
    w = _Warmup(entries, hooks, device, node_rank, node_size, jobs, marker_dir, versions)
    _CURRENT.append(w)
    _STATUS.clear()
    _STATUS.update(w.status())
    w.start()
    atexit.register(w.stop, 5.0)
    if hasattr(os, "register_at_fork"):   # a forked child has none of the threads (nor their locks' owners)
        os.register_at_fork(after_in_child=w.forget_in_child)
    if wait:
        w.done.wait()
    return status()


def wait(timeout=None):
    """Wait for this process's warm-up to end (at most ``timeout`` s); True when it has."""
    if not _CURRENT:
        return True
    return _CURRENT[0].done.wait(timeout)


def stop(timeout=10.0):
    """End this process's warm-up early: no new entries; wait up to ``timeout`` s for those being compiled."""
    if _CURRENT:
        _CURRENT[0].stop(timeout)


def status():
    """Where this process's warm-up stands: ``state`` ("running", "done", "skipped", "failed", "not started"),
    ``reason``, ``entries``, ``pending``, ``jobs``, ``counts`` (``compiled`` here, ``cached`` already,
    ``waited`` for another process, ``by_fit`` compiled by a fit that came first, ``skipped``, ``failed``),
    ``seconds``."""
    if _CURRENT and not _CURRENT[0].done.is_set():
        return _CURRENT[0].status()
    return dict(_STATUS)


def _reset():
    """Forget this process's warm-up (tests)."""
    for w in _CURRENT:
        w.stop(5.0)
        with contextlib.suppress(Exception):
            atexit.unregister(w.stop)
    _CURRENT.clear()
    _STATUS.clear()
    _STATUS.update(state="not started")
    _WARNED.clear()
