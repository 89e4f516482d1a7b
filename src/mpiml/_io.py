"""Model files: arrays + JSON metadata in a zip, no pickle, written atomically.

Layout of a model file (a zip archive, entries stored uncompressed)::

    meta.json          format, version, class (module + qualified name), params, attributes
    arrays/0000.npy    one entry per array (NumPy format; numeric dtypes only, never pickled)
    SHA256SUM          hex sha256 over every other entry (name, length, bytes; sorted by name)

Loading never runs code from the file and never trusts a size it declares:
the class comes from a fixed registry (:data:`REGISTRY`; nothing the file names
is imported), entries are streamed with a cap on their inflated size (stored
entries may not grow at all, deflated ones at most ``_MAX_INFLATE_RATIO``
times the file), every ``.npy`` header is checked against the bytes that
follow it before anything is allocated, everything else is JSON, and every
way a file can be wrong raises :class:`ModelFileError`.  What an estimator
saves is declared by the estimator (``_saved_attributes`` or ``_get_saved_state``/``_set_saved_state``,
see ``docs/estimators.md``); the communicator is never saved.

Writing goes to a temporary file in the target's directory, which is flushed,
fsynced and renamed over the target, and the directory is fsynced: a reader
sees the old file or the new one, never a partial one.
"""

import hashlib
import importlib
import io
import json
import math
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


_SCALAR_KINDS = "biuf"   # what the encoder writes as "$scalar"
_ARRAY_KINDS = "biufc"   # what the encoder writes as "$array"


def _decode(node, arrays, xp, budget=1 << 30):
    """Rebuild a value from its JSON node; ``budget`` bounds the bytes a ``$strings`` node may allocate."""
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):  # pragma: no cover - writers always tag lists
        return [_decode(v, arrays, xp, budget) for v in node]
    if not isinstance(node, dict) or len(node) == 0:
        raise ModelFileError(f"unexpected value {node!r} in the metadata")
    if "$array" in node:
        name = node["$array"]
        if not isinstance(name, str) or name not in arrays:
            raise ModelFileError(f"the metadata names a missing entry {name!r}")
        arr = arrays[name]
        return arr if xp is np else xp.asarray(arr)
    if "$scalar" in node:
        dtype = np.dtype(node["$scalar"])
        value = node.get("value")
        if dtype.kind not in _SCALAR_KINDS or isinstance(value, bool) is not (dtype.kind == "b") \
                or not isinstance(value, (bool, int, float)):
            raise ModelFileError(f"unexpected scalar {node!r} in the metadata")
        return dtype.type(value)
    if "$strings" in node:
        strings, shape = node["$strings"], node.get("shape")
        if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise ModelFileError(f"unexpected shape {shape!r} of a string array in the metadata")
        dtype = object if node.get("dtype") == "object" else np.dtype(node.get("dtype"))
        if dtype is not object and (dtype.kind != "U" or math.prod(shape) * dtype.itemsize > budget):
            raise ModelFileError(f"unexpected dtype {node.get('dtype')!r} of a string array in the metadata")
        return np.array(strings, dtype=dtype).reshape(shape)
    if "$tuple" in node:
        return tuple(_decode(v, arrays, xp, budget) for v in node["$tuple"])
    if "$list" in node:
        return [_decode(v, arrays, xp, budget) for v in node["$list"]]
    if "$dict" in node:
        return {k: _decode(v, arrays, xp, budget) for k, v in node["$dict"].items()}
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

    from ._version import __version__

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
#: A deflated entry may inflate to at most this many times the file's size (the writer stores entries
#: uncompressed, so only a file re-packed by hand is deflated at all; a zip bomb is refused before it
#: inflates).
_MAX_INFLATE_RATIO = 64
_MAX_ENTRIES = 1 << 16
_CHUNK = 1 << 20


def _refuse(path, why):
    return ModelFileError(f"{path!r} is not a valid mpiml model file (truncated or corrupted: {why})")


def _check_layout(infos, file_size, path):
    """Check every entry's declared sizes against the file before reading any of it."""
    if len(infos) > _MAX_ENTRIES:
        raise _refuse(path, f"{len(infos)} entries")
    names = [info.filename for info in infos]
    if len(set(names)) != len(names):
        raise _refuse(path, "an entry name appears twice")
    if _META not in names or _SUM not in names:
        raise ModelFileError(f"{path!r} is not an mpiml model file (no {_META} or {_SUM})")
    budget = _MAX_INFLATE_RATIO * file_size
    total = stored = 0
    for info in infos:
        if info.flag_bits & 0x1:
            raise _refuse(path, f"entry {info.filename!r} is encrypted")
        if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
            raise _refuse(path, f"entry {info.filename!r} uses compression method {info.compress_type}")
        if info.header_offset < 0 or info.header_offset + info.compress_size > file_size:
            raise _refuse(path, f"entry {info.filename!r} reaches past the end of the file")
        if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
            raise _refuse(path, f"stored entry {info.filename!r} declares {info.file_size} bytes "
                                f"in {info.compress_size}")
        stored += info.compress_size
        if stored > file_size:
            raise _refuse(path, "its entries overlap")
        total += info.file_size
        if total > budget:
            raise _refuse(path, f"its entries would inflate to more than {budget} bytes "
                                f"({_MAX_INFLATE_RATIO} times the file's {file_size})")


def _read_entry(z, info, path):
    """Stream one entry into memory, never past its declared (already capped) size."""
    data = bytearray()
    with z.open(info) as src:
        while True:
            chunk = src.read(min(_CHUNK, info.file_size - len(data) + 1))
            if not chunk:
                break
            data += chunk
            if len(data) > info.file_size:
                raise _refuse(path, f"entry {info.filename!r} inflates past its declared size")
    if len(data) != info.file_size:
        raise _refuse(path, f"entry {info.filename!r} is short")
    return bytes(data)


def _read_entries(f, file_size, path):
    with zipfile.ZipFile(f, "r") as z:
        infos = z.infolist()
        _check_layout(infos, file_size, path)
        entries = {info.filename: _read_entry(z, info, path) for info in infos}
    stored = entries.pop(_SUM).decode(errors="replace").strip()
    if _digest(entries) != stored:
        raise ModelFileError(f"{path!r} is corrupted: its sha256 checksum does not match the content")
    return entries


def _read_npy(data, name, path):
    """An ``.npy`` entry as an array; its header is checked against the bytes that follow it first."""
    buf = io.BytesIO(data)
    version = np.lib.format.read_magic(buf)
    if version == (1, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(buf)
    elif version == (2, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(buf)
    else:
        raise ModelFileError(f"{path!r}: entry {name!r} has .npy format version {version}")
    if dtype.kind not in _ARRAY_KINDS or dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None:
        raise ModelFileError(f"{path!r}: entry {name!r} is not a plain array (dtype {dtype})")
    offset = buf.tell()
    declared = math.prod(shape) * dtype.itemsize
    if declared != len(data) - offset:
        raise ModelFileError(f"{path!r}: entry {name!r} declares a {dtype} array of shape {shape} "
                             f"({declared} bytes) but holds {len(data) - offset} bytes")
    flat = np.frombuffer(data, dtype=dtype, count=math.prod(shape), offset=offset)
    return flat.reshape(shape, order="F" if fortran_order else "C").copy(order="K")


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
        The file is truncated or corrupted (in its zip structure, its checksum
        or its ``.npy`` headers), declares sizes it does not hold, is not a
        model file, or names a class outside :data:`REGISTRY`.
    FileNotFoundError, PermissionError, IsADirectoryError
        The file cannot be opened.
    """
    if device in (None, "cpu", "host"):
        xp = np
    elif device in ("gpu", "cuda", "device"):
        import cupy as xp
    else:
        raise ValueError(f"device must be 'cpu' or 'gpu'; got {device!r}")
    path = os.fspath(path)
    with open(path, "rb") as f:
        file_size = os.fstat(f.fileno()).st_size
        try:
            return _load_from(f, file_size, path, xp)
        except ModelFileError:
            raise
        except Exception as exc:  # a corrupted file can fail inside zipfile, zlib, numpy or json
            if type(exc).__module__.split(".")[0] == "cupy":
                raise  # moving the arrays to the GPU failed: not the file's fault
            raise _refuse(path, f"{type(exc).__name__}: {exc}") from exc


def _load_from(f, file_size, path, xp):
    entries = _read_entries(f, file_size, path)
    meta = json.loads(entries[_META].decode())
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise ModelFileError(f"{path!r} is not an mpiml model file")
    if meta.get("version") != FORMAT_VERSION:
        raise ModelFileError(f"{path!r} has format version {meta.get('version')}; this mpiml reads "
                             f"version {FORMAT_VERSION}")
    info = meta.get("class", {})
    cls = _resolve_class(info if isinstance(info, dict) else {}, path)
    arrays = {name: _read_npy(data, name, path) for name, data in entries.items() if name.startswith("arrays/")}
    budget = _MAX_INFLATE_RATIO * file_size
    params = {k: _decode(v, arrays, np, budget) for k, v in meta.get("params", {}).items()}
    unknown = sorted(set(params) - set(cls._get_param_names()))
    if unknown:
        raise ModelFileError(f"{path!r} has parameters {unknown} that {cls.__name__} does not take")
    model = cls(**params)
    state = {k: _decode(v, arrays, xp, budget) for k, v in meta.get("attributes", {}).items()}
    model._set_saved_state(state)
    return model
