"""Model files under attack: every truncation and byte flip, zip bombs, lying .npy headers.

Whatever a file holds, ``mpiml.load`` either raises :class:`mpiml.ModelFileError` or returns a model
that predicts exactly as the saved one did: never another exception, never a large allocation.
"""

import io
import json
import os
import struct
import time
import tracemalloc
import zipfile
import zlib

import numpy as np
import pytest

import mpiml
from mpiml.cluster import KMeans
from mpiml.linear_model import LinearRegression

from conftest import forge_model_file


def _small_models():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 3))
    y = X @ np.array([1.0, -2.0, 0.5]) + 0.25
    return [
        ("kmeans", KMeans(n_clusters=2, n_init=1, random_state=0).fit(X), X),
        ("linear", LinearRegression().fit(X, y), X),
    ]


def _outcome(path, X, expected):
    """"refused", "loaded" (a model that predicts identically), or what went wrong."""
    try:
        model = mpiml.load(path)
    except mpiml.ModelFileError:
        return "refused"
    except Exception as exc:  # noqa: BLE001 - the point of the test
        return f"{type(exc).__name__}: {exc}"
    try:
        got = model.predict(X)
    except Exception as exc:  # noqa: BLE001
        return f"loaded, but predict raised {type(exc).__name__}: {exc}"
    if not (got.dtype == expected.dtype and np.array_equal(got, expected)):
        return "loaded a model that predicts differently"
    return "loaded"


@pytest.mark.parametrize("which", [0, 1], ids=["kmeans", "linear"])
def test_every_truncation_and_byte_flip(tmp_path, which):
    name, model, X = _small_models()[which]
    good = tmp_path / "good.mpiml"
    mpiml.save(model, good)
    raw = good.read_bytes()
    expected = model.predict(X)
    assert _outcome(good, X, expected) == "loaded"
    path = tmp_path / "bad.mpiml"
    failures, counts = [], {"refused": 0, "loaded": 0}

    def attempt(what):
        got = _outcome(path, X, expected)
        if got in counts:
            counts[got] += 1
        else:
            failures.append(f"{what}: {got}")

    # The file is edited in place (rewriting it thousands of times is slow on some file systems).
    path.write_bytes(raw)
    with open(path, "r+b") as f:
        for i in range(len(raw)):
            for mask in (0xFF, 1 << (i % 8)):  # every byte inverted, and one bit of it
                f.seek(i)
                f.write(bytes([raw[i] ^ mask]))
                f.flush()
                attempt(f"byte {i} xor {mask:#04x}")
            f.seek(i)
            f.write(raw[i:i + 1])
            f.flush()
    for n in range(len(raw) - 1, -1, -1):
        os.truncate(path, n)
        attempt(f"truncated to {n} bytes")
    assert not failures, f"{len(failures)} of {3 * len(raw)} variants of a {len(raw)}-byte {name} file:\n" + \
        "\n".join(failures[:20])
    # a flip in a field the reader ignores (a date, the zip's "version made by") loads the same model, so
    # both outcomes occur: the comparison of predictions is exercised
    assert counts["loaded"] > 0 and counts["refused"] > len(raw), counts


def _npy_header(shape, descr="<f8"):
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


@pytest.mark.parametrize("shape, payload", [
    ((2 ** 40,), 16),            # 8 TiB declared, 16 bytes present
    ((2 ** 31, 2 ** 31), 0),     # 2^62 elements
    ((3,), 16),                  # one element short
    ((2,), 24),                  # trailing bytes
])
def test_npy_header_is_checked_before_allocating(tmp_path, shape, payload):
    name, model, X = _small_models()[0]
    path = tmp_path / "m.mpiml"
    mpiml.save(model, path)
    entry = json.loads(zipfile.ZipFile(path).read("meta.json"))["attributes"]["cluster_centers_"]["$array"]

    def edit(entries):
        entries[entry] = _npy_header(shape) + bytes(payload)

    forge_model_file(path, edit)
    tracemalloc.start()
    try:
        with pytest.raises(mpiml.ModelFileError, match="declares a float64 array"):
            mpiml.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


@pytest.mark.parametrize("descr", ["|O", "<V8", [("a", "<f8")], "<M8[s]"])
def test_npy_entry_of_a_non_numeric_dtype_is_refused(tmp_path, descr):
    name, model, X = _small_models()[0]
    path = tmp_path / "m.mpiml"
    mpiml.save(model, path)
    entry = json.loads(zipfile.ZipFile(path).read("meta.json"))["attributes"]["cluster_centers_"]["$array"]

    def edit(entries):
        entries[entry] = _npy_header((1,), descr) + bytes(8)

    forge_model_file(path, edit)
    with pytest.raises(mpiml.ModelFileError, match="not a plain array"):
        mpiml.load(path)


def _zip_with_raw_entry(good, name, raw_deflate, crc, file_size):
    """The entries of ``good`` (stored) with ``name`` replaced by a deflated entry given as raw bytes."""
    with zipfile.ZipFile(good) as z:
        entries = {n: z.read(n) for n in z.namelist()}
    out, central = bytearray(), bytearray()
    for n, data in entries.items():
        method, payload, c, size = (8, raw_deflate, crc, file_size) if n == name else \
            (0, data, zlib.crc32(data), len(data))
        fname = n.encode()
        offset = len(out)
        out += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, method, 0, 0x21, c, len(payload), size,
                           len(fname), 0) + fname + payload
        central += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, method, 0, 0x21, c, len(payload), size,
                               len(fname), 0, 0, 0, 0, 0, offset) + fname
    start = len(out)
    out += central + struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(entries), len(entries), len(central),
                                 start, 0)
    return bytes(out)


def _deflated_zeros(n_mib):
    """A raw deflate stream of ``n_mib`` MiB of zeros, built from one compressed MiB (about 1 KiB each)."""
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = comp.compress(bytes(1 << 20)) + comp.flush(zlib.Z_FULL_FLUSH)
    tail = zlib.compressobj(9, zlib.DEFLATED, -15).flush(zlib.Z_FINISH)
    return block * n_mib + tail


@pytest.mark.parametrize("declared", ["honest", "small"])
def test_zip_bomb_is_refused_quickly(tmp_path, declared):
    """A 2 MiB file whose array entry inflates to 2 GiB: refused in milliseconds, without the 2 GiB.

    "honest": the entry declares its 2 GiB (refused by the cap before reading); "small": it declares
    4 KiB and inflates further (reading stops at the declared size). The CRC is left wrong: a reader
    checks it only at the end of the entry, which is too late.
    """
    name, model, X = _small_models()[0]
    good = tmp_path / "good.mpiml"
    mpiml.save(model, good)
    entry = json.loads(zipfile.ZipFile(good).read("meta.json"))["attributes"]["cluster_centers_"]["$array"]
    bomb = _deflated_zeros(2048)
    # sanity check of the bomb itself: its first MiB inflates as promised
    assert len(zlib.decompressobj(-15).decompress(bomb[: 4 << 10], 1 << 20)) == 1 << 20
    size = (2 << 30) if declared == "honest" else 4096
    data = _zip_with_raw_entry(good, entry, bomb, 0, size)
    assert len(data) < 3 << 20
    path = tmp_path / "bomb.mpiml"
    path.write_bytes(data)
    tracemalloc.start()
    t0 = time.process_time()  # CPU time: the test machine may be shared
    try:
        with pytest.raises(mpiml.ModelFileError, match="inflate|CRC|corrupted"):
            mpiml.load(path)
        seconds = time.process_time() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert seconds < 0.5, f"took {seconds:.3f} s"
    assert peak < 32 << 20, f"allocated {peak} bytes"


def test_deflated_model_file_still_loads(tmp_path):
    """Re-packing a model file with deflate (an archiver's default) keeps it loadable."""
    name, model, X = _small_models()[1]
    path = tmp_path / "m.mpiml"
    mpiml.save(model, path)
    with zipfile.ZipFile(path) as z:
        entries = {n: z.read(n) for n in z.namelist()}
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for n, d in entries.items():
            z.writestr(n, d)
    assert np.array_equal(mpiml.load(path).predict(X), model.predict(X))


@pytest.mark.parametrize("edit", ["encrypted flag", "bzip2", "duplicate name", "past the end"])
def test_zip_structure_faults_are_model_file_errors(tmp_path, edit):
    name, model, X = _small_models()[0]
    path = tmp_path / "m.mpiml"
    mpiml.save(model, path)
    raw = bytearray(path.read_bytes())
    cd = raw.rindex(b"PK\x01\x02")  # the last entry's central directory record
    if edit == "encrypted flag":
        raw[cd + 8] |= 1
    elif edit == "bzip2":
        raw[cd + 10] = 12
    elif edit == "duplicate name":
        with zipfile.ZipFile(path) as z:
            entries = [(n, z.read(n)) for n in z.namelist()]
        buf = io.BytesIO()
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zipfile warns about the duplicate
            with zipfile.ZipFile(buf, "w") as z:
                for n, d in entries + entries[:1]:
                    z.writestr(n, d)
        raw = bytearray(buf.getvalue())
    else:
        struct.pack_into("<L", raw, cd + 42, len(raw))  # local header offset beyond the file
    path.write_bytes(bytes(raw))
    with pytest.raises(mpiml.ModelFileError):
        mpiml.load(path)


def test_forged_metadata_is_a_model_file_error(tmp_path):
    """Metadata with a valid checksum but values the writer never produces: ModelFileError, nothing else."""
    name, model, X = _small_models()[0]
    path = tmp_path / "m.mpiml"
    mpiml.save(model, path)
    base = path.read_bytes()
    forgeries = [
        lambda m: m.update(params=[1, 2]),
        lambda m: m.update(attributes={"cluster_centers_": {"$scalar": "V100000000000", "value": 1}}),
        lambda m: m.update(attributes={"cluster_centers_": {"$scalar": "<f8"}}),
        lambda m: m.update(attributes={"x_": {"$strings": ["a"], "dtype": "<U1000000000", "shape": [10 ** 6]}}),
        lambda m: m.update(attributes={"cluster_centers_": {"$array": ["arrays/0000.npy"]}}),
        lambda m: m.update(attributes={"nope_": 1}),
        lambda m: m.update({"class": "KMeans"}),
        lambda m: m.update(params={"n_clusters": {"$tuple": 3}}),
    ]
    for i, forge in enumerate(forgeries):
        path.write_bytes(base)

        def edit(entries):
            meta = json.loads(entries["meta.json"])
            forge(meta)
            entries["meta.json"] = json.dumps(meta).encode()

        forge_model_file(path, edit)
        with pytest.raises(mpiml.ModelFileError):
            mpiml.load(path)
    path.write_bytes(base)
    forge_model_file(path, lambda entries: entries.update({"meta.json": b"[" * 100000}))
    with pytest.raises(mpiml.ModelFileError):
        mpiml.load(path)
