"""CuPy's own compiled kernels, shipped: the files of CuPy's kernel cache, zipped per arch, put in place by init.

CuPy compiles each element-wise, reduction and raw kernel with NVRTC the first time a machine needs it; on a
machine where CuPy never ran that is most of a first fit (KMeans 10 s of 10.2 s on an H100), and compiling
the recorded list ahead in the background (:mod:`._cupy_warm`) did not help.  So the package ships the
compiled files themselves, as it ships its own cubins: ``prebuilt/cupy_smXY.zip``, and :func:`install`
(called by :func:`mpiml.init` on a GPU, before any fit) writes the ones missing into CuPy's cache.

**CuPy's cache, as CuPy 14.2 keeps it** (``cupy/cuda/compiler.py: _compile_with_cache_cuda``,
``cupy/cuda/_compiler_cache.py: DiskKernelCacheBackend``), which decides when a shipped file is used:

* One file per module, in the folder ``CUPY_CACHE_DIR`` named when ``cupy.cuda.compiler`` was imported
  (default ``~/.cupy/kernel_cache``), no subfolders: ``<SHA-1 hex of the key>.cubin`` (``.ltoir`` for LTO IR).
  Its bytes: the SHA-1 hex of the payload (40 ASCII characters), then the payload, which CuPy checks at
  every load (a mismatch is a miss: it compiles again).  The payload is the cubin or, for a module built
  with ``name_expressions``, a small header (magic ``\\x93CUPYNE\\0``, the mangled names) then the cubin.
  ``CUPY_CACHE_IN_MEMORY=1`` bypasses the folder altogether.
* The key is the text ``"%s %s %s %s %s" % (env, base, source, extra_source, CUPY_CACHE_KEY)``, followed,
  when there are name expressions, by `` ne1 `` and their sorted list joined by NUL, where
  ``env = (arch, options, nvrtc_version, backend, "-arch=sm_XY", "cubin")``:

  - ``arch``: the device's compute capability (capped at NVRTC's newest, ``"90"`` on H100 and H200);
  - ``options``: as CuPy hands them to NVRTC, **install paths included**: ``-I<site-packages>/cupy/_core/
    include/cupy/_cccl/{cub,thrust,libcudacxx}``, ``--std=c++17``, ``-I<site-packages>/cupy/_core/include``,
    ``-I<the CUDA headers' folder>`` (``cuda.pathfinder``), then ``-ftz=true`` (and ``-DCUPY_USE_JITIFY``,
    ``--device-debug`` under ``CUPY_CUDA_COMPILE_WITH_DEBUG``);
  - ``nvrtc_version``: NVRTC's (major, minor); ``base``: the comment lines of the PTX NVRTC makes of an
    empty program (its exact build, "Cuda compilation tools, release 13.0, V13.0.88");
  - ``source`` (with CuPy's ``#include`` lines), ``extra_source`` (the text of CuPy's bundled headers, for
    CuPy's generated kernels), ``CUPY_CACHE_KEY`` (a checksum of those headers fixed when CuPy was built).

  So a shipped file name holds where the CuPy build, the NVRTC build, the architecture **and the install
  paths** are the recording machine's.  Elsewhere the name is simply never looked up (harmless).

**What this module does about it.**  The versions (CuPy, NVRTC major.minor, arch) are checked before
anything is written.  The rest is checked with CuPy's own code: a cache backend that answers a lookup by
raising the name it was asked for (in the calling thread only; every other thread reaches CuPy's own
backend) gives the name CuPy would use here for a module described by the recorded manifest
(:mod:`._cupy_warm`'s entries, stored in the zip).  :func:`install` computes it for one shipped module:
equal to the shipped name, every file is written as shipped; different (another venv, another NVRTC
build), every module the manifest describes is written under the name computed here ("re-keyed": the
cubin is the same, only the key's paths differ).  Computing a name costs CuPy's per-process NVRTC set-up
for those options (an empty compile, kept by CuPy for the fits), only on the first install into a cache.

:func:`install` is quick: the 205 files of the H100 recording (3.6 MiB, 0.7 MiB zipped) took 0.09 s on a busy
2-core host, once per cache (a 9.6 MiB fake one 0.1 s, ``tests/kernels/test_cupy_ship.py``).  The
files missing from the cache are written through a temporary file and ``os.replace`` (ranks of a node
doing it at once are safe; they queue on an ``fcntl`` lock, the first writes), and a marker
``<cache>/mpiml-ship/<digest>`` (of the zip, versions, arch, paths) makes a warm machine cost two
``stat`` calls.  A read-only or full cache never fails :func:`mpiml.init`: it is logged once (logger
``mpiml.kernels``) and CuPy compiles as before.  ``MPIML_CUPY_SHIP=0`` turns it off; a path to a ``.zip``
installs that one instead of the shipped one.

On a GPU host, ``python -m mpiml.kernels._cupy_ship record --out $OUT/cupy_sm90.zip`` runs the recorder
(:mod:`mpiml.cli._cupy_record`) into a fresh CuPy cache and packs it (with the manifest, written beside it).
"""

import contextlib
import datetime
import glob
import hashlib
import inspect
import json
import logging
import os
import re
import sys
import tempfile
import threading
import time
import zipfile

from . import _cupy_warm, _loader

__all__ = ["pack", "install", "status", "info", "read_header", "shipped_path", "shipped", "zip_name", "ShipHooks",
           "HEADER", "FORMAT"]

FORMAT = 1
HEADER = "mpiml-cupy-cache.json"      # the zip's first member
MANIFEST_MEMBER = "manifest.json"     # the recorded specs of the modules (for re-keying)
_FILE = re.compile(r"^[0-9a-f]{40}\.(cubin|ltoir)$")
_HASH = 40
_OFF = ("0", "off", "no", "false")
_DATE = (1980, 1, 1, 0, 0, 0)         # reproducible zips

_log = logging.getLogger("mpiml.kernels")
_WARNED = set()
_STATUS = {"state": "not started"}


def _warn_once(key, msg):
    if key not in _WARNED:
        _WARNED.add(key)
        _log.warning("mpiml: shipped CuPy kernels: %s", msg)


def zip_name(arch):
    """``"cupy_sm90.zip"`` for ``arch`` ``"90"`` (or ``"sm_90"``)."""
    return f"cupy_sm{str(arch).replace('sm_', '')}.zip"


def _prebuilt_folder():
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "prebuilt")


def shipped_path(arch):
    """Where the package keeps the zip of ``arch`` (it may not exist)."""
    return os.path.join(_prebuilt_folder(), zip_name(arch))


def shipped():
    """The headers of the zips the package ships (``[{"zip", "arch", "cupy", "nvrtc", "count", "bytes"}]``)."""
    out = []
    for path in sorted(glob.glob(os.path.join(_prebuilt_folder(), "cupy_sm*.zip"))):
        try:
            h = read_header(path)
        except ValueError as exc:
            out.append({"zip": os.path.basename(path), "error": str(exc)})
            continue
        out.append({"zip": os.path.basename(path), **{k: h.get(k) for k in ("arch", "cupy", "nvrtc", "count",
                                                                             "bytes", "mapped", "date")}})
    return out


# ------------------------------------------------------------------------------------------------------ CuPy

class _Named(Exception):
    """Raised by :class:`_NameProbe` with the file name CuPy looked up."""

    def __init__(self, name):
        super().__init__(name)
        self.name = name


class _NameProbe:
    """A stand-in for CuPy's cache backend: in the thread that turned it on, a lookup raises :class:`_Named`
    (nothing is compiled); in any other thread it is CuPy's backend."""

    def __init__(self, inner):
        self.inner = inner
        self.local = threading.local()

    def load(self, name):
        if getattr(self.local, "on", False):
            raise _Named(name)
        return self.inner.load(name)

    def save(self, name, cubin, source):
        return self.inner.save(name, cubin, source)


class ShipHooks(_cupy_warm.CupyHooks):
    """CuPy's side of packing and installing (the tests pass a stand-in)."""

    def cache_dir(self):
        """The folder CuPy's disk cache reads (None: another backend, nothing to fill)."""
        backend = getattr(self.compiler, "_kernel_cache_backend", None)
        if backend is None:              # an older CuPy: the folder it reads at each call
            return super().cache_dir()
        disk = getattr(sys.modules.get("cupy.cuda._compiler_cache"), "DiskKernelCacheBackend", None)
        if disk is None or type(backend) is not disk:
            return None
        return backend._cache_dir

    def runtime(self):
        return int(self.cupy.cuda.runtime.runtimeGetVersion())

    def names(self, entries):
        """``{entry id: the file name CuPy gives that module here}`` (None where it cannot say), from CuPy's
        own key computation: each entry is replayed as :mod:`._cupy_warm` does, and the lookup is answered by
        raising the name.  The first entry of each set of options costs CuPy's empty NVRTC compile."""
        compiler = self.compiler
        inner = compiler._kernel_cache_backend
        probe = _NameProbe(inner)
        fn = inspect.unwrap(self.get())          # CuPy's function, under any recorder or warm-up wrapper
        options = _cupy_warm._Options(self)
        out = {}
        compiler._kernel_cache_backend = probe
        probe.local.on = True
        try:
            for e in entries:
                try:
                    _cupy_warm._replay(e, fn, options, self)
                    out[e["id"]] = None          # no lookup: a backend or CuPy that keys elsewhere
                except _Named as n:
                    out[e["id"]] = n.name
                except Exception:  # noqa: BLE001 - an entry CuPy cannot key here (no NVRTC, bad options)
                    out[e["id"]] = None
        finally:
            probe.local.on = False
            if compiler._kernel_cache_backend is probe:
                compiler._kernel_cache_backend = inner
        return out


# ------------------------------------------------------------------------------------------------------ pack

def _valid(data):
    """Whether ``data`` is a file of CuPy's disk cache (the SHA-1 of the payload, then the payload)."""
    return len(data) > _HASH and data[:_HASH] == hashlib.sha1(data[_HASH:]).hexdigest().encode("ascii")


def pack(cache_dir, out_zip, manifest=None, *, hooks=None, versions=None, arch=None, runtime=None):
    """Zip the files of CuPy's cache folder ``cache_dir`` with a header; returns the header.

    Parameters
    ----------
    cache_dir : str
        A CuPy cache folder (``CUPY_CACHE_DIR`` of a recording run).  Its ``<sha1>.cubin`` files whose
        digest checks are packed; temporary files, ``.cu`` sources and subfolders are not.
    out_zip : str
        The zip to write (through a temporary file).
    manifest : dict or str, default=None
        The manifest recorded in the same run (:func:`._cupy_warm.read_manifest`), or its path; stored in the
        zip, and with CuPy here each module's name is computed from it (``header["mapped"]``), which lets
        :func:`install` re-key the files for another install path.
    hooks : ShipHooks, default=None
        CuPy's side; None: CuPy's when it can be imported with a GPU, else ``versions`` and ``arch`` are needed.
    versions : dict, default=None
        ``{"cupy": "14.2.0", "nvrtc": [13, 0]}`` when packing without CuPy (default: the manifest's).
    arch : str, default=None
        ``"90"`` when packing without CuPy.
    """
    if isinstance(manifest, str):
        manifest = _cupy_warm.read_manifest(manifest)
    if hooks is None and (versions is None or arch is None):
        with contextlib.suppress(Exception):
            hooks = ShipHooks()
            hooks.arch()
    if versions is None:
        versions = hooks.versions() if hooks is not None else (
            {"cupy": manifest["cupy"], "nvrtc": manifest["nvrtc"]} if manifest else None)
    if versions is None or (arch is None and hooks is None):
        raise ValueError("pack: without CuPy, name the versions (or a manifest) and the architecture")
    arch = str(arch if arch is not None else hooks.arch()).replace("sm_", "")
    if runtime is None and hooks is not None:
        with contextlib.suppress(Exception):
            runtime = hooks.runtime()
    if runtime is None and manifest is not None:
        runtime = (manifest.get("recorded") or {}).get("cuda_runtime")
    files, skipped = {}, 0
    for name in sorted(os.listdir(cache_dir)):
        path = os.path.join(cache_dir, name)
        if not _FILE.match(name) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        if _valid(data):
            files[name] = data
        else:
            skipped += 1
    mapped, checked = {}, False
    if manifest is not None and hooks is not None:
        entries = [e for e in manifest["entries"] if e.get("backend", "nvrtc") == "nvrtc"]
        try:
            mapped = {name: eid for eid, name in hooks.names(entries).items() if name in files}
            checked = True
        except Exception as exc:  # noqa: BLE001 - still a zip, only not re-keyable
            _warn_once("pack", f"names not computed ({type(exc).__name__}: {exc})")
    header = {"format": FORMAT, "cupy": versions["cupy"], "nvrtc": list(versions["nvrtc"]), "arch": arch,
              "cuda_runtime": runtime, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                  timespec="seconds"),
              "count": len(files), "bytes": sum(len(d) for d in files.values()), "invalid_skipped": skipped,
              "manifest_entries": len(manifest["entries"]) if manifest else 0,
              "mapped": len(mapped), "checked": checked,
              "entries": {name: mapped.get(name) for name in files},
              "options": list(hooks.assemble(())) if hooks is not None else None}
    header["id"] = hashlib.sha256(json.dumps(sorted((n, d[:_HASH].decode()) for n, d in files.items()))
                                  .encode()).hexdigest()[:24]
    tmp = out_zip + ".tmp"
    os.makedirs(os.path.dirname(os.path.abspath(out_zip)), exist_ok=True)
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        def put(name, data):
            z.writestr(zipfile.ZipInfo(name, _DATE), data, zipfile.ZIP_DEFLATED, 9)

        put(HEADER, json.dumps(header, indent=0, sort_keys=True))
        if manifest is not None:
            put(MANIFEST_MEMBER, json.dumps(manifest, sort_keys=True, separators=(",", ":")))
        for name, data in files.items():
            put(name, data)
    os.replace(tmp, out_zip)
    return header


def read_header(path):
    """The header of a packed zip; ValueError when it is not one."""
    try:
        with zipfile.ZipFile(path) as z:
            header = json.loads(z.read(HEADER))
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path}: not a zip of CuPy's cache ({type(exc).__name__}: {exc})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"{path}: not a zip of CuPy's cache of format {FORMAT}")
    return header


# --------------------------------------------------------------------------------------------------- install

def _skip(reason, log=False, **more):
    _STATUS.clear()
    _STATUS.update(state="skipped", reason=reason, **more)
    if log:
        _warn_once("skip", reason)
    return dict(_STATUS)


def _cupy_flag(name):
    """A boolean CuPy setting, read as CuPy reads it (only an integer 1 is on)."""
    try:
        return int(os.environ.get(name, "") or 0) == 1
    except ValueError:
        return False


def _marker_name(path, st, versions, arch, cache, paths):
    text = json.dumps([os.path.realpath(path), st.st_size, st.st_mtime_ns, versions["cupy"],
                       list(versions["nvrtc"]), arch, os.path.realpath(cache), paths])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@contextlib.contextmanager
def _node_lock(path):
    """``flock`` on ``path`` where the file system has it; without it (some NFS) the writes stay safe, only
    repeated by each rank."""
    lock = _cupy_warm._flock(path)
    try:
        lock.__enter__()
    except OSError:
        yield False
        return
    try:
        yield True
    finally:
        lock.__exit__(None, None, None)


def _write(folder, name, data):
    """``folder/name`` <- ``data`` through a temporary file and a rename; False when it is already there."""
    target = os.path.join(folder, name)
    if os.path.exists(target):
        return False
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".mpiml-ship-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, _loader._file_mode())     # as open() would make it (mkstemp's is private): a shared cache
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return True


def install(device=None, *, hooks=None, path=None, setting=None):
    """Write the shipped CuPy cache files that are missing into CuPy's cache; returns :func:`status`.

    Parameters
    ----------
    device : int, default=None
        Unused beyond the current device (CuPy's arch is that of the current device); kept for symmetry
        with :func:`._cupy_warm.start`.
    hooks : ShipHooks, default=None
        CuPy's side (the tests pass a stand-in).
    path : str, default=None
        The zip (default: ``MPIML_CUPY_SHIP`` when it names a ``.zip``, else the package's for this arch).
    setting : str, default=None
        Instead of ``MPIML_CUPY_SHIP`` (``0``: off).

    Never raises: what could not be done is in :func:`status` (and a failure is logged once).
    """
    t0 = time.perf_counter()
    try:
        out = _install(hooks, path, setting)
    except Exception as exc:  # noqa: BLE001 - shipping kernels never fails init
        _warn_once("install", f"not installed ({type(exc).__name__}: {exc}); CuPy compiles what it needs")
        _STATUS.clear()
        _STATUS.update(state="failed", reason=f"{type(exc).__name__}: {exc}")
        out = dict(_STATUS)
    _STATUS["seconds"] = out["seconds"] = round(time.perf_counter() - t0, 4)
    return out


def _install(hooks, path, setting):
    value = (os.environ.get("MPIML_CUPY_SHIP", "") if setting is None else setting).strip()
    if value.lower() in _OFF:
        return _skip("turned off (MPIML_CUPY_SHIP=0)")
    if _cupy_flag("CUPY_CACHE_IN_MEMORY"):
        return _skip("CUPY_CACHE_IN_MEMORY=1: CuPy reads no cache folder")
    for var in ("CUPY_CUDA_COMPILE_WITH_DEBUG", "CUPY_COMPILE_WITH_PTX"):
        if _cupy_flag(var):           # other code than the shipped cubins, under keys the probe would re-key to
            return _skip(f"{var}=1: CuPy compiles other code than the shipped cubins")
    hooks = hooks or ShipHooks()
    arch = str(hooks.arch())
    if path is None:
        path = value if value.endswith(".zip") else shipped_path(arch)
    try:
        st = os.stat(path)
    except OSError:
        return _skip(f"no CuPy kernels shipped for sm_{arch} ({os.path.basename(path)})")
    cache = hooks.cache_dir()
    if cache is None:
        return _skip("CuPy uses a cache backend of its own, not a folder")
    versions, paths = hooks.versions(), list(hooks.assemble(()))
    marker_dir = os.path.join(cache, "mpiml-ship")
    marker = os.path.join(marker_dir, _marker_name(path, st, versions, arch, cache, paths))
    if os.path.exists(marker):                    # installed before: the warm case
        _STATUS.clear()
        _STATUS.update(state="present", zip=path, cache_dir=cache, marker=marker)
        return dict(_STATUS)
    header = read_header(path)
    if header["cupy"] != versions["cupy"] or list(header["nvrtc"]) != list(versions["nvrtc"]) \
            or str(header["arch"]) != arch:
        return _skip(f"{os.path.basename(path)} holds CuPy {header['cupy']} / NVRTC "
                     f"{'.'.join(map(str, header['nvrtc']))} / sm_{header['arch']} kernels; this is CuPy "
                     f"{versions['cupy']} / NVRTC {'.'.join(map(str, versions['nvrtc']))} / sm_{arch}", zip=path)
    try:
        os.makedirs(marker_dir, exist_ok=True)
    except OSError as exc:
        return _skip(f"cannot write into CuPy's cache {cache} ({exc})", log=True, zip=path)
    with _node_lock(marker + ".lock"):            # the ranks of a node: one writes, the others wait
        if os.path.exists(marker):
            _STATUS.clear()
            _STATUS.update(state="present", zip=path, cache_dir=cache, marker=marker, waited=True)
            return dict(_STATUS)
        with zipfile.ZipFile(path) as z:
            plan, keys = _plan(z, header, hooks)
            counts = {"written": 0, "present": 0}
            try:
                for target, member in plan:
                    counts["written" if _write(cache, target, z.read(member)) else "present"] += 1
            except OSError as exc:
                _warn_once("write", f"stopped writing into {cache} ({exc}); CuPy compiles what is missing")
                _STATUS.clear()
                _STATUS.update(state="failed", reason=f"cannot write into {cache}: {exc}", zip=path, keys=keys,
                               **counts)
                return dict(_STATUS)
        info = dict(state="installed", zip=path, cache_dir=cache, files=len(plan), keys=keys, **counts)
        with contextlib.suppress(OSError):
            _write(marker_dir, os.path.basename(marker), json.dumps(info).encode())
    _STATUS.clear()
    _STATUS.update(info)
    return dict(_STATUS)


def _plan(z, header, hooks):
    """``([(name in CuPy's cache, zip member)], how the names were checked)``.

    One mapped module's name is computed here: equal to the shipped name, every file goes in as shipped
    ("as shipped"); different, each module of the manifest gets the name computed here ("re-keyed", the
    unmapped files are left out).  Without a mapped module, or where CuPy cannot compute the name, nothing
    is checked: the files go in as shipped ("unchecked"; a wrong name is never looked up)."""
    files = [n for n in z.namelist() if _FILE.match(n)]
    mapped = {n: e for n, e in (header.get("entries") or {}).items() if e and n in files}
    if not mapped:
        return [(n, n) for n in files], "unchecked"
    manifest = json.loads(z.read(MANIFEST_MEMBER))
    by_id = {e["id"]: e for e in manifest["entries"]}
    probe_name, probe_id = next(iter(sorted(mapped.items())))
    here = hooks.names([by_id[probe_id]]).get(probe_id)
    if here is None:                  # CuPy could not key it here (its NVRTC refused the options): as shipped
        return [(n, n) for n in files], "unchecked"
    if here == probe_name:
        return [(n, n) for n in files], "as shipped"
    names = hooks.names([by_id[e] for e in mapped.values()])
    plan = [(names[e], n) for n, e in sorted(mapped.items()) if names.get(e)]
    return plan, "re-keyed"


def status():
    """What :func:`install` did in this process: ``state`` ("installed", "present": installed before,
    "skipped", "failed", "not started"), ``reason``, ``zip``, ``cache_dir``, ``written``, ``present``
    (already in the cache), ``keys`` ("as shipped", "re-keyed" for this install's paths, "unchecked"),
    ``seconds``."""
    return dict(_STATUS)


def info(gpu=False):
    """For ``mpiml info``: the zips shipped, whether one fits this process's CuPy, NVRTC and GPU 0 (``gpu``),
    where CuPy's cache is, and what :func:`install` did in this process."""
    out = {"shipped": shipped(), "setting": os.environ.get("MPIML_CUPY_SHIP", ""), "status": status()}
    if gpu:
        try:
            hooks = ShipHooks()
            arch, versions = str(hooks.arch()), hooks.versions()
            out.update(arch=arch, cupy=versions["cupy"], nvrtc=versions["nvrtc"], cache_dir=hooks.cache_dir())
            h = next((z for z in out["shipped"] if str(z.get("arch")) == arch), None)
            out["fits"] = h is not None and h["cupy"] == versions["cupy"] and list(h["nvrtc"]) == versions["nvrtc"]
        except Exception as exc:  # noqa: BLE001 - descriptive only
            out["error"] = f"{type(exc).__name__}: {exc}"
    return out


def _reset():
    """Forget this process's install (tests)."""
    _STATUS.clear()
    _STATUS.update(state="not started")
    _WARNED.clear()


# ------------------------------------------------------------------------------------------------------- CLI

def _record(args):
    """Run the recorder into a fresh CuPy cache and pack it (a GPU host)."""
    import subprocess

    out = os.path.abspath(args.out)
    with tempfile.TemporaryDirectory(prefix="mpiml-cupy-ship-") as tmp:
        cache = os.path.join(tmp, "cache")
        os.makedirs(cache)
        manifest_out = args.manifest_out or os.path.join(os.path.dirname(out), _cupy_warm.MANIFEST)
        env = dict(os.environ, CUPY_CACHE_DIR=cache, MPIML_CUPY_SHIP="0", MPIML_CUPY_WARM="0")
        cmd = [sys.executable, "-m", "mpiml.cli._cupy_record", "--out", manifest_out] + (
            ["--jobs", str(args.jobs)] if args.jobs else []) + (["--only", args.only] if args.only else [])
        t = time.perf_counter()
        code = subprocess.run(cmd, env=env).returncode
        print(f"recorder exited {code} after {time.perf_counter() - t:.1f} s", flush=True)
        if not os.path.exists(manifest_out):
            return 1
        header = pack(cache, out, manifest_out)
    _say(out, header)
    return code


def _say(path, h):
    print(f"{path}: {h['count']} files, {h['bytes'] / 2**20:.1f} MiB of cubins, "
          f"{os.path.getsize(path) / 2**20:.1f} MiB zipped; CuPy {h['cupy']}, NVRTC "
          f"{'.'.join(map(str, h['nvrtc']))}, sm_{h['arch']}, CUDA runtime {h.get('cuda_runtime')}; "
          + (f"{h['mapped']} of the manifest's {h['manifest_entries']} modules found under the names CuPy computes "
             "here" if h.get("checked") else "names not checked (no CuPy or no manifest here)")
          + f"; {h['invalid_skipped']} invalid files skipped", flush=True)


def main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(prog="python -m mpiml.kernels._cupy_ship", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record", help="record the workloads into a fresh CuPy cache and pack it (GPU host)")
    r.add_argument("--out", required=True)
    r.add_argument("--manifest-out", default=None, help="the manifest (default: beside --out)")
    r.add_argument("--jobs", type=int, default=None)
    r.add_argument("--only", default=None)
    p = sub.add_parser("pack", help="pack a CuPy cache folder")
    p.add_argument("cache_dir")
    p.add_argument("--out", required=True)
    p.add_argument("--manifest", default=None)
    p.add_argument("--arch", default=None, help="without CuPy: the architecture (90)")
    p.add_argument("--cupy", default=None, help="without CuPy: its version (default: the manifest's)")
    p.add_argument("--nvrtc", default=None, help="without CuPy: NVRTC major.minor (default: the manifest's)")
    s = sub.add_parser("show", help="print a zip's header")
    s.add_argument("zip")
    i = sub.add_parser("install", help="install a zip into CuPy's cache here (a GPU)")
    i.add_argument("zip", nargs="?", default=None)
    args = ap.parse_args(argv)
    if args.cmd == "record":
        return _record(args)
    if args.cmd == "pack":
        versions = None
        if args.cupy or args.nvrtc:
            m = _cupy_warm.read_manifest(args.manifest) if args.manifest else {}
            versions = {"cupy": args.cupy or m.get("cupy"),
                        "nvrtc": [int(x) for x in args.nvrtc.split(".")] if args.nvrtc else m.get("nvrtc")}
        _say(args.out, pack(args.cache_dir, args.out, args.manifest, versions=versions, arch=args.arch))
        return 0
    if args.cmd == "show":
        h = read_header(args.zip)
        print(json.dumps({k: v for k, v in h.items() if k != "entries"}, indent=1))
        return 0
    import cupy

    cupy.cuda.Device(0).use()
    print(json.dumps(install(path=args.zip), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
