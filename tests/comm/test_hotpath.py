"""The hot path's binding of results and pointers, on a stand-in for CuPy arrays (no GPU needed).

A binding returns ``(result, in_ptr, out_ptr)`` or None (take the full path); a reduce_scatter
result is one part of the input, so only an ``out`` that meets that part's bytes overlaps the
input (sizing it as the whole input sent calls whose result sat just below the input down the
full path, at 3-4x NCCL's time).
"""

import sys
import types


import numpy as np
import pytest

from mpiml.comm import _hotpath


class _Mem:
    __slots__ = ("ptr",)

    def __init__(self, ptr):
        self.ptr = ptr


class _Array:
    """What a binding reads of a CuPy array: class, dtype, shape, size, bytes, contiguity, pointer."""

    def __init__(self, shape, dtype=np.float32, ptr=1 << 20):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.size = int(np.prod(self.shape))
        self.itemsize = self.dtype.itemsize
        self.nbytes = self.size * self.itemsize
        self._c_contiguous = True
        self.data = _Mem(ptr)


@pytest.fixture
def fake_cupy(monkeypatch):
    mod = types.ModuleType("cupy")
    mod.empty = lambda shape, dtype: _Array(shape, dtype, ptr=1 << 30)
    monkeypatch.setitem(sys.modules, "cupy", mod)
    return mod


def test_reduce_scatter_out_just_below_the_input_is_not_an_overlap(fake_cupy):
    x = _Array((4096,), ptr=1 << 20)  # 16 KiB
    bind = _hotpath.binding("reduce_scatter", x, rank=1, size=4, rows=1024)  # result: 4 KiB
    below = _Array((1024,), ptr=x.data.ptr - 4096)  # ends where x starts
    assert bind(x, below) == (below, x.data.ptr, below.data.ptr)
    inside = _Array((1024,), ptr=x.data.ptr + 8192)
    assert bind(x, inside) is None  # a real overlap: the full path copies the input first
    straddling = _Array((1024,), ptr=x.data.ptr - 2048)
    assert bind(x, straddling) is None
    res, ip, op = bind(x, None)  # allocated
    assert res.shape == (1024,) and ip == x.data.ptr and op == res.data.ptr


def test_reduce_scatter_rows_keep_the_trailing_shape(fake_cupy):
    x = _Array((10, 3), dtype=np.float64)
    bind = _hotpath.binding("reduce_scatter", x, rank=0, size=4, rows=3)  # array_split: 3, 3, 2, 2
    res, _, _ = bind(x, None)
    assert res.shape == (3, 3) and res.dtype == np.float64
    assert bind(x, _Array((2, 3), dtype=np.float64, ptr=1 << 28)) is None  # another rank's block shape
    assert bind(x, _Array((3, 3), dtype=np.float32, ptr=1 << 28)) is None  # another dtype
    out = _Array((3, 3), dtype=np.float64, ptr=1 << 28)
    assert bind(x, out)[0] is out


def test_allreduce_in_place_is_bound_and_partial_overlap_is_not(fake_cupy):
    x = _Array((100,))
    bind = _hotpath.binding("allreduce", x, rank=0, size=2)
    assert bind(x, x) == (x, x.data.ptr, x.data.ptr)
    assert bind(x, _Array((100,), ptr=x.data.ptr + 4)) is None
    assert bind(x, _Array((100,), ptr=x.data.ptr + 400))[0] is not None


def test_allgather_out_is_size_times_the_input(fake_cupy):
    x = _Array((8,), ptr=1 << 20)
    bind = _hotpath.binding("allgather", x, rank=0, size=4)
    assert bind(x, _Array((32,), ptr=x.data.ptr - 4 * 32)) is not None  # ends where x starts
    assert bind(x, _Array((32,), ptr=x.data.ptr - 4 * 31)) is None


# ---------------------------------------------------------------- the launcher's memo and pinned launches
class _Stream:
    def __init__(self, ptr):
        self.ptr = ptr


class _Comm:
    """What a launcher reads of its communicator: the deferred log, its first call number, the round."""

    def __init__(self, every=1 << 30):
        self._deferred, self._deferred_from, self._seq, self._check_every = [], 0, 0, every
        self.rounds = 0

    def _verify_sequence(self, op):
        self.rounds += 1
        self._deferred.clear()


class _Transport:
    _broken = None

    def __init__(self):
        self.launched, self.graphs = [], []
        self.order = None


def _plan(op="allreduce"):
    """A stand-in of the call's plan: what a launcher logs (its signature's base) and what names it (its spec)."""
    spec = (op, "float32", 4, 0, "sum", (4,), "device", None)
    return types.SimpleNamespace(base=hash(spec), spec=spec)


def _launcher(op="allreduce", pinned=None, comm=None, **kw):
    """A launcher over recording bind / issue parts: (call, comm, record)."""
    rec = {"bind": 0, "issue": [], "pinned": [], "go": 0}
    comm = comm or _Comm()
    real = _hotpath.binding(op, _Array((4,)), rank=kw.get("rank", 0), size=4, root=kw.get("root", 0))

    def bind(x, out):
        rec["bind"] += 1
        return real(x, out)

    def issue(ip, outp):
        rec["issue"].append((ip, outp))

    if pinned is not None:
        def pin(ip, outp):
            rec["pinned"].append((ip, outp))
            got = pinned(ip, outp)
            if got in (None, False):
                return got

            def go():
                rec["go"] += 1
            return go
        issue.pinned = pin
    plan = _plan(op)
    call = _hotpath.launcher(comm, _Transport(), plan, op, bind, issue)
    call.keep = comm  # (a launcher holds its communicator weakly)
    return call, comm, rec, plan


@pytest.fixture
def default_check(monkeypatch):
    monkeypatch.delenv("MPIML_CHECK", raising=False)


def test_repeats_on_the_same_arrays_skip_the_binding_and_replay_a_pinned_launch(fake_cupy, default_check):
    call, comm, rec, plan = _launcher(pinned=lambda ip, outp: True)
    x, y = _Array((4,), ptr=1 << 20), _Array((4,), ptr=1 << 22)
    for i in range(5):
        assert call(x, y) is y
    assert rec["bind"] == 1  # bound once; the repeats reuse the pointers
    assert rec["issue"] == [(x.data.ptr, y.data.ptr)]  # launched, then pinned at the first repeat
    assert rec["pinned"] == [(x.data.ptr, y.data.ptr)] and rec["go"] == 4
    assert comm._deferred == [plan.base] * 5  # every call is logged for the next round, pinned or not


def test_two_alternating_buffers_both_hit_and_a_third_binds(fake_cupy, default_check):
    call, comm, rec, _ = _launcher(pinned=lambda ip, outp: True)
    x, a, b, c = (_Array((4,), ptr=p << 20) for p in (1, 2, 3, 4))
    for _ in range(3):
        assert call(x, a) is a
        assert call(x, b) is b
    assert rec["bind"] == 2 and len(rec["pinned"]) == 2 and rec["go"] == 4
    assert call(x, c) is c and rec["bind"] == 3
    assert call(x, a) is a and rec["bind"] == 4  # a fell out of the two-entry memo: bound again


def test_a_new_result_array_is_bound_every_call(fake_cupy, default_check):
    call, _, rec, _ = _launcher(pinned=lambda ip, outp: True)
    x = _Array((4,))
    r1, r2 = call(x, None), call(x, None)
    assert r1 is not r2 and rec["bind"] == 2 and not rec["pinned"]


def test_bcast_root_and_reduce_non_root_hit_without_an_out(fake_cupy, default_check):
    call, _, rec, _ = _launcher("bcast", pinned=lambda ip, outp: True, rank=0, root=0)
    x = _Array((4,))
    assert call(x, None) is x and call(x, None) is x and rec["bind"] == 1 and rec["go"] == 1
    call, _, rec, _ = _launcher("reduce", pinned=lambda ip, outp: True, rank=1, root=0)
    assert call(x, None) is _hotpath.NOTHING and call(x, None) is _hotpath.NOTHING and rec["bind"] == 1


def test_no_pin_while_capturing_then_a_pin_and_none_to_be_had_is_not_asked_again(fake_cupy, default_check):
    state = {"answer": None}
    call, _, rec, _ = _launcher(pinned=lambda ip, outp: state["answer"])
    x, y = _Array((4,), ptr=1 << 20), _Array((4,), ptr=1 << 22)
    call(x, y)
    call(x, y)  # capturing: not now, launched as a kernel
    assert len(rec["pinned"]) == 1 and len(rec["issue"]) == 2 and rec["go"] == 0
    state["answer"] = True
    call(x, y)
    call(x, y)
    assert len(rec["pinned"]) == 2 and rec["go"] == 2
    call2, _, rec2, _ = _launcher(pinned=lambda ip, outp: False)
    for _ in range(3 * _hotpath._PIN_LIMIT):
        call2(x, y)
    assert len(rec2["pinned"]) == _hotpath._PIN_LIMIT and len(rec2["issue"]) == 3 * _hotpath._PIN_LIMIT


def test_pins_stop_at_the_limit(fake_cupy, default_check):
    call, _, rec, _ = _launcher(pinned=lambda ip, outp: True)
    x = _Array((4,), ptr=1 << 20)
    outs = [_Array((4,), ptr=(p + 2) << 20) for p in range(_hotpath._PIN_LIMIT + 3)]
    for y in outs:
        call(x, y)
        call(x, y)
        call(x, y)
    assert len(rec["pinned"]) == _hotpath._PIN_LIMIT
    assert len(rec["issue"]) == len(outs) + 2 * 3  # the unpinned ones launch kernels


def test_a_collected_array_never_matches_a_new_one(fake_cupy, default_check):
    import gc

    call, _, rec, _ = _launcher(pinned=lambda ip, outp: True)
    x = _Array((4,), ptr=1 << 20)
    y = _Array((4,), ptr=1 << 22)
    call(x, y)
    del y
    gc.collect()
    z = _Array((4,), ptr=1 << 24)
    assert call(x, z) is z and rec["bind"] == 2 and rec["issue"][-1] == (x.data.ptr, z.data.ptr)


@pytest.mark.parametrize("why", ["error", "broken", "strict", "profile"])
def test_the_full_path_is_taken_when_the_launcher_must_not_run(fake_cupy, monkeypatch, why):
    import ctypes

    from mpiml.comm import _profile

    monkeypatch.delenv("MPIML_CHECK", raising=False)
    rec = {"issue": 0}

    def issue(ip, outp):
        rec["issue"] += 1
    issue.pinned = lambda ip, outp: (lambda: rec.__setitem__("issue", rec["issue"] + 1))
    err = ctypes.c_int32(0)
    t = _Transport()
    comm = _Comm()
    call = _hotpath.launcher(comm, t, _plan(), "allreduce",
                             _hotpath.binding("allreduce", _Array((4,)), rank=0, size=4), issue, err)
    x, y = _Array((4,), ptr=1 << 20), _Array((4,), ptr=1 << 22)
    assert call(x, y) is y and call(x, y) is y and call(x, y) is y  # pinned and replayed
    if why == "error":
        err.value = 1
    elif why == "broken":
        t._broken = "aborted"
    elif why == "strict":
        monkeypatch.setenv("MPIML_CHECK", "1")
    else:
        monkeypatch.setattr(_profile, "_ACTIVE", [object()])
        call = _hotpath.launcher(comm, t, _plan(), "allreduce",
                                 _hotpath.binding("allreduce", _Array((4,)), rank=0, size=4), issue, err)
    before = rec["issue"]
    assert call(x, y) is None and rec["issue"] == before


def test_unchecked_calls_log_nothing_and_the_log_is_agreed_every_n_calls(fake_cupy, monkeypatch):
    monkeypatch.setenv("MPIML_CHECK", "0")
    call, comm, _, _ = _launcher(pinned=lambda ip, outp: True)
    x, y = _Array((4,), ptr=1 << 20), _Array((4,), ptr=1 << 22)
    for _ in range(4):
        call(x, y)
    assert comm._deferred == []
    monkeypatch.delenv("MPIML_CHECK")
    call, comm, _, plan = _launcher(pinned=lambda ip, outp: True, comm=_Comm(every=3))
    comm._seq = 41
    for _ in range(7):
        call(x, y)
    assert comm.rounds == 2 and comm._deferred == [plan.base]


def test_ipc_issue_replays_the_pinned_graph_and_launches_the_kernel_into_a_capture(fake_cupy):
    """``ipc_issue``'s pinned launch: a graph replay on an idle stream, the kernel itself into a capturing one
    (with its pointers written first), the stream order consulted on a switch; no graph while capturing."""
    from mpiml.comm.backends._stream_order import StreamOrder

    streams = {"cur": _Stream(7)}
    capturing = set()
    launches, replays, made = [], [], []
    fake_cupy.cuda = types.SimpleNamespace(
        get_current_stream=lambda: streams["cur"],
        runtime=types.SimpleNamespace(streamIsCapturing=lambda p: int(p in capturing)))

    class G:
        def launch(self, st):
            replays.append(st.ptr)

    class T:
        _broken = None
        _replay = True
        _ctx = _Array((8,), np.int64, ptr=99)

        def __init__(self):
            self.switches = []
            self._order = StreamOrder(lambda s: s.ptr in capturing, lambda s: None,
                                      lambda s: self.switches.append(s.ptr))

        def _launch_kernel(self, fn, gx, gy, gz, bx, by, bz, shm, sp, argv, extra):
            words = (ctypes_u64 * 5).from_address(ctypes_ptr.from_address(argv).value)
            launches.append((fn, sp, words[1], words[2]))

        def one_node_graph(self, fn, grid, block, words):
            made.append((fn, words))
            return G()

    import ctypes
    ctypes_u64, ctypes_ptr = ctypes.c_uint64, ctypes.c_void_p
    t = T()
    x = _Array((16,))
    issue = _hotpath.ipc_issue(t, "allreduce", x, "aligned", "unaligned", 2, 512, 15)
    issue(1 << 20, 1 << 22)
    assert launches == [("aligned", 7, 1 << 20, 1 << 22)]
    capturing.add(7)
    assert issue.pinned(1 << 20, 1 << 22) is None and not made  # not while capturing
    capturing.clear()
    go = issue.pinned(1 << 20, (1 << 22) + 4)
    assert made == [("unaligned", (99, 1 << 20, (1 << 22) + 4, 16, 0))]
    go()
    assert replays == [7] and len(launches) == 1
    capturing.add(7)
    go()  # into the capture: the kernel itself, its pointers written
    assert launches[-1] == ("unaligned", 7, 1 << 20, (1 << 22) + 4) and replays == [7]
    capturing.clear()
    streams["cur"] = _Stream(9)
    go()
    assert replays == [7, 9] and t.switches == [9]  # ordered after the launch on stream 7
    t._replay = False
    assert _hotpath.ipc_issue(t, "allreduce", x, "a", "u", 2, 512, 15).pinned is None


def test_the_communicator_reaches_a_launcher_by_its_latest_arrays_and_not_after_a_change():
    """A hot call on the same x as the latest one (same reduction, algorithm, shape) skips the key; another
    reduction, an in-place reshape of x or a new launcher takes the key's way (size-1 communicator, stand-ins)."""
    from mpiml.comm import get_comm

    comm = get_comm("self")
    seen = []

    def launcher(name):
        def call(x, out):
            seen.append(name)
            return out
        return call

    class A(_Array):
        pass

    A.__module__ = "cupy._stand_in"  # (hot launchers are kept for CuPy's array types only)
    x, y = A((4,), ptr=1 << 20), A((4,), ptr=1 << 22)
    key = ("allreduce", A, x.dtype, x.shape, "sum", None)
    comm._hot[key] = launcher("sum")
    comm._hot[key[:4] + ("max", None)] = launcher("max")
    assert comm.allreduce(x, out=y) is y and comm._memo_allreduce is not None
    comm._hot.clear()  # (only the memo can reach the launcher now)
    assert comm.allreduce(x, out=y) is y and seen == ["sum", "sum"]
    comm._hot[key] = launcher("sum")
    comm._hot[key[:4] + ("max", None)] = launcher("max")
    assert comm.allreduce(x, "max", out=y) is y and seen[-1] == "max"  # another reduction: by the key
    x.shape = (2, 2)  # reshaped in place: its key is another
    comm._hot[("allreduce", A, x.dtype, (2, 2), "max", None)] = launcher("2x2")
    assert comm.allreduce(x, "max", out=y) is y and seen[-1] == "2x2"

    class Route:
        def hot_launcher(self, *a):
            return launcher("new")

    comm._memo_bcast = (lambda: x, 0, None, x.shape, launcher("stale"))
    comm._last_route = (Route(), "native")
    comm._plans[key] = type("Plan", (), {"mode": None})()
    del comm._hot[key]
    comm._remember_hot(key, "allreduce", x, "sum")  # a new launcher: every memo forgotten
    assert comm._hot[key] is not None and comm._memo_bcast is None and comm._memo_allreduce is None


def test_one_node_graphs_are_counted_limited_and_a_failure_turns_them_off():
    """``IPCTransport.one_node_graph`` (no GPU: CuPy's stream stood in): a graph of the launch on a stream of
    the transport's own, counted while alive, none past the limit, and the first failure turns replays off."""
    import gc

    from mpiml.comm.backends import ipc

    log = []

    class Stream:
        ptr = 77
        fail = False

        def __init__(self, non_blocking=False):
            log.append("stream")

        def begin_capture(self):
            if Stream.fail:
                raise RuntimeError("capture refused")
            log.append("begin")

        def end_capture(self):
            log.append("end")
            return types.SimpleNamespace(launch=lambda st: log.append(("replay", st)))

    t = object.__new__(ipc.IPCTransport)
    t._replay, t._graphs, t._capture_stream, t._broken = True, [0], None, None
    t._cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(Stream=Stream))
    t._launch_kernel = lambda fn, gx, gy, gz, bx, by, bz, shm, sp, argv, extra: log.append(("launch", fn, sp))
    g = t.one_node_graph("fn", 2, 512, (1, 2, 3, 4, 5))
    assert log == ["stream", "begin", ("launch", "fn", 77), "end"] and t._graphs == [1]
    g.launch("s")
    assert log[-1] == ("replay", "s")
    del g
    gc.collect()
    assert t._graphs == [0]  # (its finalizer counts it out)
    t._graphs[0] = ipc.GRAPH_LIMIT
    assert t.one_node_graph("fn", 2, 512, (1, 2, 3, 4, 5)) is None and t._replay
    t._graphs[0] = 0
    Stream.fail = True
    assert t.one_node_graph("fn", 2, 512, (1, 2, 3, 4, 5)) is None and t._replay is False
    Stream.fail = False
    assert t.one_node_graph("fn", 2, 512, (1, 2, 3, 4, 5)) is None  # off for good on this transport


@pytest.mark.parametrize("op,algo", [("allreduce", "ll128"), ("allreduce", "lltwoshot"), ("reduce", "llrelay"),
                                     ("reduce", "ll128"), ("bcast", "lltwoshot")])
def test_the_ll_two_shot_calls_complete_as_the_transport_says(op, algo):
    """The LL two-shot, relay and LL128 calls return what ``_done`` says (under ``MPIML_DEVICE_SYNC=1`` it waits and
    reads the error record): their ``_done`` had slid past a ``return`` into ``_lltwoshot_variant``, so they
    returned None, unwaited (no GPU: a transport stand-in)."""
    from mpiml.comm.backends import ipc

    t = object.__new__(ipc.IPCTransport)
    t.multi_node, t.rank, t.size, t.cap = False, 0, 4, 32 << 20
    t.ll_slot, t.ll_max, t._broken = ipc.LL_SLOT_DEFAULT, 256 << 10, None
    t.ll128_blocks, t.ll128_split = ipc.WIDE_LL_MAX_BLOCKS, dict(ipc.LL128_SPLIT)
    t._err = np.zeros(16, dtype=np.int32)
    launches = []
    t._kernel = lambda family, name, dtype, rop, aligned: name
    t._launch = lambda fn, grid, sp, rp, n, extra, block=512: launches.append((fn, n))
    t._done = lambda name: ("done", name)
    x, y = _Array((1000,), ptr=1 << 20), _Array((1000,), ptr=1 << 22)
    if op == "allreduce":
        got = t.native_allreduce(x, y, "sum", algorithm=algo)
    elif op == "reduce":
        got = t.native_reduce(x, y, "sum", 0, algorithm=algo)
    else:
        got = t.native_bcast(x, 0, algorithm=algo)
    assert got == ("done", op) and len(launches) == 1
