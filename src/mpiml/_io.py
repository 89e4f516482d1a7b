"""Model files: arrays + JSON metadata in a zip, no pickle, written atomically.

Layout of a model file (a zip archive, entries stored uncompressed)::

    meta.json          format, version, class (module + qualified name), params, attributes
    arrays/0000.npy    one entry per array (NumPy format, read with allow_pickle=False)
    SHA256SUM          hex sha256 over every other entry (name, length, bytes; sorted by name)

Loading never runs code from the file: arrays are read with
``numpy.load(allow_pickle=False)``, everything else is JSON, and the class is
only instantiated when it lives in the ``mpiml`` package and subclasses
:class:`mpiml.base.SPMDEstimator`.  What an estimator saves is declared by
the estimator (``_saved_attributes`` or ``_get_saved_state``/``_set_saved_state``,
see ``docs/estimators.md``); the communicator is never saved.

Writing goes to a temporary file in the target's directory, which is flushed,
fsynced and renamed over the target, and the directory is fsynced: a reader
sees the old file or the new one, never a partial one.
"""

import hashlib
import importlib
import io
import json
import os
import secrets
import zipfile

import numpy as np

from ._array import is_device_array, to_numpy
from ._errors import MpimlError

__all__ = ["save", "load", "ModelFileError", "FORMAT_VERSION"]

FORMAT_NAME = "mpiml-model"
FORMAT_VERSION = 1
_META = "meta.json"
_SUM = "SHA256SUM"


class ModelFileError(MpimlError, ValueError):
    """A model file is missing, truncated, corrupted, or names a class that may not be loaded."""


# ---------------------------------------------------------------------- encoding values
class _Encoder:
    """Turns parameter and attribute values into JSON nodes plus ``.npy`` payloads."""

    def __init__(self):
        self.arrays = {}

    def encode(self, value, where):
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, np.generic):
            return value
        if isinstance(value, np.generic):
            if value.dtype.kind in "biufc" and value.dtype.kind != "c":
                return {"$scalar": value.dtype.str, "value": value.item()}
            if value.dtype.kind in "US":
                return value.item() if value.dtype.kind == "U" else value.item().decode()
            raise TypeError(f"{where}: cannot save a NumPy scalar of dtype {value.dtype}")
        if isinstance(value, np.ndarray) or is_device_array(value):
            arr = to_numpy(value)
            if arr.dtype.kind == "O" or arr.dtype.kind == "U":
                if not all(isinstance(v, str) for v in arr.ravel().tolist()):
                    raise TypeError(f"{where}: only object arrays of strings can be saved")
                return {"$strings": arr.tolist(), "dtype": "object" if arr.dtype.kind == "O" else arr.dtype.str,
                        "shape": list(arr.shape)}
            if arr.dtype.kind not in "biufc":
                raise TypeError(f"{where}: cannot save an array of dtype {arr.dtype}")
            name = f"arrays/{len(self.arrays):04d}.npy"
            buf = io.BytesIO()
            np.save(buf, np.ascontiguousarray(arr) if not arr.flags.f_contiguous else arr, allow_pickle=False)
            self.arrays[name] = buf.getvalue()
            return {"$array": name}
        if isinstance(value, (list, tuple)):
            items = [self.encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
            return {"$tuple" if isinstance(value, tuple) else "$list": items}
        if isinstance(value, dict):
            if not all(isinstance(k, str) for k in value):
                raise TypeError(f"{where}: only dicts with str keys can be saved")
            return {"$dict": {k: self.encode(v, f"{where}[{k!r}]") for k, v in value.items()}}
        raise TypeError(f"{where}: cannot save a value of type {type(value).__name__} "
                        "(model files hold arrays and JSON values only)")


def _decode(node, arrays, xp):
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):  # pragma: no cover - writers always tag lists
        return [_decode(v, arrays, xp) for v in node]
    if not isinstance(node, dict) or len(node) == 0:
        raise ModelFileError(f"unexpected value {node!r} in the metadata")
    if "$array" in node:
        name = node["$array"]
        if name not in arrays:
            raise ModelFileError(f"the metadata names a missing entry {name!r}")
        arr = arrays[name]
        return arr if xp is np else xp.asarray(arr)
    if "$scalar" in node:
        return np.dtype(node["$scalar"]).type(node["value"])
    if "$strings" in node:
        dtype = object if node["dtype"] == "object" else np.dtype(node["dtype"])
        return np.array(node["$strings"], dtype=dtype).reshape(node["shape"])
    if "$tuple" in node:
        return tuple(_decode(v, arrays, xp) for v in node["$tuple"])
    if "$list" in node:
        return [_decode(v, arrays, xp) for v in node["$list"]]
    if "$dict" in node:
        return {k: _decode(v, arrays, xp) for k, v in node["$dict"].items()}
    raise ModelFileError(f"unexpected value {node!r} in the metadata")


def _digest(entries):
    h = hashlib.sha256()
    for name in sorted(entries):
        data = entries[name]
        h.update(name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


# ---------------------------------------------------------------------- building and writing
def _payload(model):
    from .base import SPMDEstimator

    if not isinstance(model, SPMDEstimator):
        raise TypeError(f"only mpiml estimators can be saved; got {type(model).__module__}."
                        f"{type(model).__qualname__}")
    cls = type(model)
    if not _registered(cls):
        raise TypeError(f"{cls.__module__}.{cls.__qualname__} is not in mpiml's registry of estimator classes "
                        "(mpiml._io.REGISTRY): load() would refuse it")
    enc = _Encoder()
    params, replaced = {}, []
    for key, value in model.get_params(deep=False).items():
        if key == "comm":
            continue
        if isinstance(value, (np.random.RandomState, np.random.Generator)):
            value = None  # a generator's state is not a parameter worth keeping
            replaced.append(key)
        params[key] = enc.encode(value, f"parameter {key!r}")
    state = model._get_saved_state()
    attributes = {k: enc.encode(v, f"attribute {k!r}") for k, v in state.items()}
    import sklearn

    from . import __version__

    meta = {
        "format": FORMAT_NAME, "version": FORMAT_VERSION,
        "class": {"module": cls.__module__, "qualname": cls.__qualname__},
        "params": params, "replaced_params": replaced, "attributes": attributes,
        "mpiml_version": __version__, "sklearn_version": sklearn.__version__,
    }
    entries = {_META: json.dumps(meta, indent=1, sort_keys=True).encode(), **enc.arrays}
    entries[_SUM] = _digest(entries).encode()
    return entries


def _fsync_dir(directory):
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _write_atomic(path, entries):
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.mpiml.tmp{os.getpid()}.{secrets.token_hex(4)}")
    try:
        with open(tmp, "wb") as f:
            with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED) as z:
                for name, data in entries.items():
                    z.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(directory)


_RERAISE = {cls.__name__: cls for cls in (TypeError, ValueError, OSError, FileNotFoundError, PermissionError,
                                          IsADirectoryError, NotADirectoryError, ModelFileError)}


def save(model, path, *, comm=None):
    """Write a fitted mpiml estimator to ``path`` (atomically; no pickle).

    Parameters
    ----------
    model : SPMDEstimator
        A fitted mpiml estimator; its attributes are replicated, so every
        rank holds the same model.
    path : str or path-like
        Target file; an existing file is replaced only once the new one is
        complete on disk.
    comm : Communicator, default=None
        Ranks that call ``save`` together (default: the model's communicator).
        On more than one rank only rank 0 writes; every rank returns after it
        finished and raises the same error if it failed.  To save from a
        single rank, pass ``comm=mpiml.get_comm("self")``.

    Raises
    ------
    mpiml.NotFittedError
        The model is not fitted.
    TypeError
        Not an mpiml estimator, or a value that is neither an array nor JSON.
    OSError
        The file could not be written.
    """
    if comm is None:
        get = getattr(model, "_get_comm", None)
        if get is None:
            from .comm import get_comm

            comm = get_comm()
        else:
            comm = get()
    error = None
    if comm.rank == 0:
        try:
            _write_atomic(path, _payload(model))
        except Exception as exc:
            if comm.size == 1:
                raise
            error = exc
    if comm.size == 1:
        return
    info = None if error is None else (type(error).__name__, str(error))
    info = comm.bcast_obj(info, root=0)
    if info is None:
        return
    if error is not None:
        raise error
    cls = _RERAISE.get(info[0])
    if cls is None:
        from ._errors import NotFittedError

        cls = NotFittedError if info[0] == "NotFittedError" else ModelFileError
    raise cls(f"{info[1]} (raised on rank 0 while saving)" if cls is ModelFileError else info[1])


# ---------------------------------------------------------------------- reading
def _read_entries(path):
    path = os.fspath(path)
    try:
        with zipfile.ZipFile(path, "r") as z:
            names = z.namelist()
            if _META not in names or _SUM not in names:
                raise ModelFileError(f"{path!r} is not an mpiml model file (no {_META} or {_SUM})")
            entries = {name: z.read(name) for name in names}
    except (zipfile.BadZipFile, EOFError, zipfile.LargeZipFile) as exc:
        raise ModelFileError(f"{path!r} is not a valid mpiml model file (truncated or corrupted: {exc})") from exc
    stored = entries.pop(_SUM).decode(errors="replace").strip()
    if _digest(entries) != stored:
        raise ModelFileError(f"{path!r} is corrupted: its sha256 checksum does not match the content")
    return entries


#: The classes a model file may name: class name -> the mpiml module that defines it. A file only
#: chooses a key of this table; what gets imported is the value, written here, never text from the
#: file. A new estimator family adds its line.
REGISTRY = {
    "KMeans": "mpiml.cluster._kmeans",
    "LinearRegression": "mpiml.linear_model._least_squares",
    "Ridge": "mpiml.linear_model._least_squares",
    "LogisticRegression": "mpiml.linear_model._logistic",
    "RandomForestClassifier": "mpiml.ensemble._forest",
    "RandomForestRegressor": "mpiml.ensemble._forest",
    "PCA": "mpiml.decomposition._pca",
    "TruncatedSVD": "mpiml.decomposition._truncated_svd",
    "NearestNeighbors": "mpiml.neighbors._base",
    "KNeighborsClassifier": "mpiml.neighbors._supervised",
    "KNeighborsRegressor": "mpiml.neighbors._supervised",
    "MinimalSPMDTransformer": "mpiml.utils._testing",
}


def _registered(cls):
    """Whether ``cls`` is the class the registry names (so that load would find it again)."""
    return REGISTRY.get(cls.__qualname__) == cls.__module__


def _resolve_class(info, path):
    from .base import SPMDEstimator

    module, qualname = info.get("module", ""), info.get("qualname", "")
    if not isinstance(module, str) or not isinstance(qualname, str) or REGISTRY.get(qualname) != module:
        raise ModelFileError(f"{path!r} names the class {module}.{qualname}, which is not an mpiml estimator "
                             f"this version can load (known: {sorted(REGISTRY)})")
    try:
        cls = getattr(importlib.import_module(REGISTRY[qualname]), qualname)
    except (ImportError, AttributeError) as exc:
        raise ModelFileError(f"{path!r} names the class {module}.{qualname}, which this mpiml does not have") \
            from exc
    if not (isinstance(cls, type) and issubclass(cls, SPMDEstimator)):
        raise ModelFileError(f"{path!r} names {module}.{qualname}, which is not an mpiml estimator class")
    return cls


def load(path, *, device=None):
    """Read an estimator written by :func:`save`.

    Parameters
    ----------
    path : str or path-like
        A model file.
    device : {"cpu", "gpu"} or None, default=None
        Where the fitted arrays go: NumPy ("cpu", the default) or CuPy ("gpu").

    Returns
    -------
    SPMDEstimator
        A fitted estimator with ``comm=None`` (the world communicator).  Any
        rank, on any number of ranks, can load a file.

    Raises
    ------
    ModelFileError
        The file is truncated or corrupted (checksum), is not a model file,
        or names a class outside mpiml's estimators.
    """
    if device in (None, "cpu", "host"):
        xp = np
    elif device in ("gpu", "cuda", "device"):
        import cupy as xp
    else:
        raise ValueError(f"device must be 'cpu' or 'gpu'; got {device!r}")
    entries = _read_entries(path)
    try:
        meta = json.loads(entries[_META].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:  # pragma: no cover - the checksum guards this
        raise ModelFileError(f"{os.fspath(path)!r} has unreadable metadata: {exc}") from exc
    if meta.get("format") != FORMAT_NAME:
        raise ModelFileError(f"{os.fspath(path)!r} is not an mpiml model file")
    if meta.get("version") != FORMAT_VERSION:
        raise ModelFileError(f"{os.fspath(path)!r} has format version {meta.get('version')}; this mpiml reads "
                             f"version {FORMAT_VERSION}")
    cls = _resolve_class(meta.get("class", {}), os.fspath(path))
    arrays = {}
    for name, data in entries.items():
        if name.startswith("arrays/"):
            try:
                arrays[name] = np.load(io.BytesIO(data), allow_pickle=False)
            except ValueError as exc:
                raise ModelFileError(f"{os.fspath(path)!r}: entry {name!r} is not a plain array ({exc})") from exc
    params = {k: _decode(v, arrays, np) for k, v in meta.get("params", {}).items()}
    known = set(cls._get_param_names())
    unknown = sorted(set(params) - known)
    if unknown:
        raise ModelFileError(f"{os.fspath(path)!r} has parameters {unknown} that {cls.__name__} does not take")
    model = cls(**params)
    state = {k: _decode(v, arrays, xp) for k, v in meta.get("attributes", {}).items()}
    model._set_saved_state(state)
    return model
