"""The IPC collectives' CUDA sources against what the host launches (no GPU needed).

Every kernel named in ``mpiml.kernels.FAMILIES`` exists in its file under ``kernels/comm/``, and
every kernel declares the block size the host launches it with as its launch bounds (512
threads, barrier kernels MPIML_THREADS, LL kernels (``_ll``, ``_lltwoshot``, ``_llrelay``, ``_ll128``, ``_ll128direct``,
``_ll128twoshot``) MPIML_LL_THREADS): one whose registers outgrow
such a block fails to launch (with every peer's pack loaded at once, the one-byte types asked for
254 registers before the bounds were declared).
"""

import re
from importlib import resources

import pytest

from mpiml.comm.backends import ipc
from mpiml.kernels import COMMON, FAMILIES

_KERNELS = resources.files("mpiml.kernels")


def _text(path):
    return _KERNELS.joinpath(path).read_text()


def test_the_header_names_the_block_size_the_host_launches():
    assert re.search(rf"#define MPIML_THREADS {ipc.THREADS}\b", _text(COMMON))
    assert re.search(rf"#define MPIML_LL_THREADS {ipc.LL_THREADS}\b", _text(COMMON))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_kernel_exists_with_its_launch_bounds(family):
    path, names, _ = FAMILIES[family]
    assert path.startswith("comm/"), path
    text = _text(path)
    kernels = {name: bound for bound, name in re.findall(
        r"__global__ void (?:__launch_bounds__\((MPIML_\w+)\)\s*)?(mpiml_\w+)\(", text)}
    assert set(names) <= set(kernels), sorted(set(names) - set(kernels))
    assert len(re.findall(r"__global__", text)) == len(kernels)
    for name, bound in kernels.items():
        ll = name.endswith(("_ll", "_lltwoshot", "_llrelay", "_ll128", "_ll128direct", "_ll128twoshot"))
        assert bound == ("MPIML_LL_THREADS" if ll else "MPIML_THREADS"), (name, bound)


def test_the_error_codes_the_kernels_write_are_the_hosts():
    text = _text(COMMON)
    for name, value in (("TIMEOUT", ipc.ERR_TIMEOUT), ("ABORT", ipc.ERR_ABORT), ("OVERLAP", ipc.ERR_OVERLAP)):
        assert re.search(rf"#define MPIML_ERR_{name} {value}\b", text), name


def test_the_ll_relay_chunks_keep_every_owner_within_the_region():
    """``ipc._lltwoshot_plan(..., relay=True)`` (the reduce whose parts the non-roots own): an owner's region holds
    the other ranks' nranks - 1 copies of its part, the root's the nranks - 1 reduced parts (the largest index
    written is (nranks - 1) * part); the grid has one index per line of a part; without the relay, or for another
    op, the plan is the plain one."""
    for nranks in range(2, 9):
        for slot in (512 << 10, 1 << 20, (3 << 20) + 16):
            region = nranks * slot // 16
            for nbytes in (1, 8, 17, 4096, 1 << 20, 4 << 20, 9 << 20):
                chunk, _ = ipc._lltwoshot_plan("reduce", nbytes, nranks, slot, True)
                assert chunk % 8 == 0 and chunk > 0
                lines = -(-min(nbytes, chunk) // 8)
                part = -(-lines // (nranks - 1))
                assert (nranks - 1) * part <= region, (nranks, slot, nbytes)
                _, grid = ipc._lltwoshot_plan("reduce", min(nbytes, chunk), nranks, slot, True)
                assert grid == max(1, min(ipc.WIDE_LL_MAX_BLOCKS, -(-part // ipc.LL_THREADS)))
                for op in ("bcast", "allreduce"):
                    assert ipc._lltwoshot_plan(op, nbytes, nranks, slot, True) == \
                        ipc._lltwoshot_plan(op, nbytes, nranks, slot)
    # 4 ranks, the default slots: a 1 MiB reduce is one launch either way, the relay takes a 2 MiB one in one, and
    # a 2 MiB bcast is still one launch
    slot = ipc.LL_SLOT_DEFAULT
    assert ipc._lltwoshot_plan("reduce", 2 << 20, 4, slot, True)[0] >= 2 << 20
    assert ipc._lltwoshot_plan("reduce", 1 << 20, 4, slot)[0] >= 1 << 20
    assert ipc._lltwoshot_plan("bcast", 2 << 20, 4, slot)[0] >= 2 << 20
    assert ipc._lltwoshot_plan("reduce", 64, 1, 1 << 20, True) == ipc._lltwoshot_plan("reduce", 64, 1, 1 << 20)


def test_the_ll128_chunks_keep_every_line_within_the_staging_buffer():
    """``ipc._ll128_plan``: lines of 120 payload bytes in 128 in one staging buffer (cap / 128 lines): the two-shot's
    nranks parts, every rank's copies and the gathered parts (2 * nranks * part lines); the relay's nranks - 1 parts
    ((nranks - 1) * part lines); the direct reduce's nranks - 1 copies of every line; 8 lanes a line, at most
    ``blocks`` blocks (a split grid: 4 lines a pushing warp); the header's payload words agree with the host's; with the default 32 MiB buffers a 4 MiB
    reduce or allreduce is one launch (a direct reduce: 10 MiB at 4 ranks)."""
    words = re.search(r"#define MPIML_LL128_WORDS (\d+)", _text(COMMON))
    assert words and int(words.group(1)) * 8 == ipc.LL128_PAYLOAD
    for nranks in range(2, 9):
        for cap in (4096, 1 << 20, 32 << 20, (3 << 20) + 256):
            region = cap // 128
            for nbytes in (1, 8, 17, 121, 4096, 1 << 20, 4 << 20, 9 << 20, 40 << 20):
                for relay, direct in ((False, False), (True, False), (False, True)):
                    chunk, _ = ipc._ll128_plan(nbytes, nranks, cap, relay, direct)
                    assert chunk % 8 == 0 and chunk > 0
                    lines = -(-(-(-min(nbytes, chunk) // 8)) // 15)
                    parts = 1 if direct else nranks - 1 if relay else nranks
                    part = -(-lines // parts)
                    copies = nranks - 1 if direct else parts if relay else 2 * nranks
                    assert copies * part <= region, (nranks, cap, nbytes, relay, direct)
                    for blocks in (ipc.WIDE_LL_MAX_BLOCKS, 32):
                        _, grid = ipc._ll128_plan(min(nbytes, chunk), nranks, cap, relay, direct, blocks)
                        assert grid == max(1, min(blocks, -(-8 * part // ipc.LL_THREADS)))
                        # split: the pushing warps of a block (4 lines each a round) size the grid
                        for split, pushing in ((0, 16), (8, 8), (4, 4), (15, 15), (16, 16)):
                            _, grid = ipc._ll128_plan(min(nbytes, chunk), nranks, cap, relay, direct, blocks, split)
                            assert grid == max(1, min(blocks, -(-part // (4 * pushing))))
        assert ipc._ll128_plan(4 << 20, nranks, 32 << 20)[0] >= 4 << 20
        assert ipc._ll128_plan(4 << 20, nranks, 32 << 20, True)[0] >= 4 << 20
        assert ipc._ll128_plan(4 << 20, nranks, 32 << 20, direct=True)[0] >= 4 << 20


@pytest.mark.parametrize("op", ["bcast", "reduce", "allreduce"])
def test_the_two_shot_ll_chunks_keep_every_line_within_the_region(op):
    """``ipc._lltwoshot_plan``: the largest line index a chunk's kernel writes (bcast: every line at its own
    index; (all)reduce: nranks parts of copies, then the lines) stays within one parity's LL slots, and the grid has
    one index per line of a part (at most LL_MAX_BLOCKS blocks)."""
    for nranks in range(2, 9):
        for slot in (512 << 10, 4 << 20, (3 << 20) + 16):
            region = nranks * slot // 16
            for nbytes in (1, 8, 17, 4096, 1 << 20, 4 << 20, 9 << 20):
                chunk, _ = ipc._lltwoshot_plan(op, nbytes, nranks, slot)
                assert chunk % 8 == 0 and chunk > 0
                lines = -(-min(nbytes, chunk) // 8)
                parts = nranks - 1 if op == "bcast" else nranks
                part = -(-lines // parts)
                used = lines if op == "bcast" else nranks * part + lines  # (the largest index written, + 1)
                assert used <= region, (nranks, slot, nbytes, used, region)
                _, grid = ipc._lltwoshot_plan(op, min(nbytes, chunk), nranks, slot)
                assert grid == max(1, min(ipc.LL_MAX_BLOCKS, -(-part // ipc.LL_THREADS)))


def test_the_header_names_the_pipelined_kernels_flag_count_the_host_allocates():
    assert re.search(rf"#define MPIML_PIPE_MAX_STEPS {ipc.PIPE_MAX_STEPS}\b", _text(COMMON))
    assert ipc.PIPE_BYTES == 2 * ipc.MAX_RANKS * ipc.PIPE_MAX_STEPS * 4


@pytest.mark.parametrize("op", ["bcast", "reduce", "allreduce"])
def test_the_pipelined_chunks_fit_one_buffer_and_their_steps_the_flags(op):
    """``ipc._pipe_chunk`` keeps the sources' copies and the gathered parts ((nranks + q) * part packs) within one
    staging buffer; ``ipc._pipe_plan`` cuts a part into at most PIPE_MAX_STEPS steps (a multiple of
    PIPE_STEP_ALIGN packs) and launches at most ``blocks`` (and MAX_BLOCKS) blocks, no more than there are steps."""
    for nranks in range(2, 9):
        q = nranks if op == "allreduce" else nranks - 1
        for cap in (1 << 20, 32 << 20, 256 << 20):
            chunk = ipc._pipe_chunk(op, nranks, cap)
            assert chunk > 0 and chunk % 16 == 0
            part = -(-(chunk // 16) // q)
            assert (nranks + q) * part * 16 <= cap, (nranks, cap)
            for blocks, rounds in ((64, 2), (1, 1), (128, 64), (3, 5)):
                for nbytes in (1, 17, 4096, 65536, 1 << 20, 4 << 20, chunk):
                    if nbytes > chunk:
                        continue
                    step, grid = ipc._pipe_plan(op, nbytes, nranks, blocks, rounds)
                    part = -(-(-(-nbytes // 16)) // q)
                    steps = -(-part // step)
                    assert step % ipc.PIPE_STEP_ALIGN == 0 and steps <= ipc.PIPE_MAX_STEPS
                    assert 1 <= grid <= min(blocks, ipc.MAX_BLOCKS, steps)


@pytest.mark.parametrize("op,algo", [("bcast", "lltwoshot"), ("reduce", "lltwoshot"), ("allreduce", "lltwoshot"),
                                     ("reduce", "llrelay"), ("reduce", "ll128"), ("allreduce", "ll128"),
                                     ("reduce", "ll128direct"), ("reduce", "ll128twoshot"), ("bcast", "ll128")])
def test_the_hot_launcher_of_the_ll_two_shot_kernels_logs_the_calls_plan(monkeypatch, op, algo):
    """``IPCTransport.hot_launcher`` (no GPU: a transport stand-in, the launcher parts recorded) hands the call's
    plan (what the deferred check logs) to the launcher, and the kernel of the algorithm to the issue: the launch
    plan of the LL two-shot variants must not take its name (the 22:50 pass: every such hot call logged a function,
    and the next agreement round failed with AttributeError on every rank)."""
    import numpy as np

    from mpiml.comm import _hotpath

    seen = {}
    monkeypatch.setattr(_hotpath, "binding", lambda op_, x, **kw: ("bind", op_))
    monkeypatch.setattr(_hotpath, "ipc_issue", lambda t, op_, x, fa, fu, grid, block, mask, extra=0:
                        seen.update(fa=fa, grid=grid, block=block, mask=mask, extra=extra) or "issue")
    monkeypatch.setattr(_hotpath, "launcher", lambda comm, t, plan, op_, bind, issue, err=None:
                        seen.update(plan=plan, bind=bind, issue=issue) or "launcher")

    class X:
        size, nbytes, dtype = 1 << 18, 1 << 20, np.dtype(np.float32)

    t = object.__new__(ipc.IPCTransport)
    t.multi_node, t._sync, t._err_host, t._err_code = False, False, 1, None
    t.rank, t.size, t.cap, t.ll_max, t.ll_slot = 1, 4, 32 << 20, 256 << 10, ipc.LL_SLOT_DEFAULT
    t.oneshot_max, t.twoshot_cap, t.push_cap = 256 << 10, 16 << 20, 8 << 20
    t.ll128_blocks, t.ll128_split = ipc.WIDE_LL_MAX_BLOCKS, {"reduce": 8, "allreduce": 4}
    t._kernel = lambda family, name, dtype, rop, aligned: (family, name, aligned)
    plan = object()
    arg = {"bcast": 0, "reduce": ("sum", 0), "allreduce": "sum"}[op]
    assert t.hot_launcher(None, plan, op, algo, X(), arg) == "launcher"
    assert seen["plan"] is plan and seen["bind"] == ("bind", op) and seen["issue"] == "issue"
    kernel = {"lltwoshot": f"mpiml_{op}_lltwoshot", "llrelay": "mpiml_reduce_llrelay",
              "ll128": f"mpiml_{op}_ll128", "ll128direct": "mpiml_reduce_ll128direct",
              "ll128twoshot": "mpiml_reduce_ll128twoshot"}[algo]
    assert seen["fa"] == (op, kernel, True) and seen["block"] == ipc.LL_THREADS and seen["mask"] == 7
    # the LL128 relay and two-shot take their split above the root's byte (extra = split << 8 | root); the bcast
    # has none (its root pushes, the others wait and forward)
    assert seen["extra"] == (t.ll128_split[op] << 8 if algo in ("ll128", "ll128twoshot") and op != "bcast" else 0)


def test_run_algorithm_dispatches_every_algorithm_an_op_lists():
    """``IPCTransport.run_algorithm`` (no GPU: a stand-in) runs every algorithm ``algorithm_names`` lists for an op
    through the op's native method (scan and exscan take no algorithm), the two-level allreduce too, and refuses a
    name its op does not list."""
    t = object.__new__(ipc.IPCTransport)
    calls = []
    for op in ipc.IPCTransport._OP_ALGORITHMS:
        setattr(t, "native_" + op, lambda *a, _op=op, **kw: calls.append((_op, kw.get("algorithm"))) or _op)
    for op, names in ipc.IPCTransport._OP_ALGORITHMS.items():
        for name in names:
            assert t.run_algorithm(op, name, "x") == op
            assert calls.pop() == (op, None if op in ("scan", "exscan") else name)
    assert t.run_algorithm("allreduce", "two_level", "x") == "allreduce" and calls.pop() == ("allreduce", "two_level")
    assert "ll128twoshot" in ipc.IPCTransport._OP_ALGORITHMS["reduce"]
    assert "ll128" in ipc.IPCTransport._OP_ALGORITHMS["reduce_scatter"] and "ll128" in ipc.IPCTransport._OP_ALGORITHMS["bcast"]
    for op, name in (("reduce_scatter", "twoshot"), ("bcast", "ll128direct"), ("scan", "ll"), ("gather", "ll")):
        with pytest.raises(ValueError, match="does not apply"):
            t.run_algorithm(op, name, "x")


# ---------------------------------------------------------------- the push kernels (ipc/llpush)
def test_the_push_kernels_exist_with_their_launch_bounds_and_the_hosts_flags():
    """``small_push.cu`` (loaded by ``ipc._push_kernel``, a family of its own) holds the two kernels the host asks
    for, each with the LL kernels' launch bounds, and the flags of their ``extra`` are the host's."""
    assert ipc.PUSH_SOURCES[0] == COMMON
    text = _text(ipc.PUSH_SOURCES[1])
    kernels = dict((name, bound) for bound, name in re.findall(
        r"__global__ void (?:__launch_bounds__\((MPIML_\w+)\)\s*)?(mpiml_\w+)\(", text))
    assert kernels == {"mpiml_reduce_llpush": "MPIML_LL_THREADS", "mpiml_allgather_llpush": "MPIML_LL_THREADS"}
    assert re.search(rf"#define MPIML_PUSH_ENDACK {ipc.PUSH_ENDACK}\b", text)
    assert re.search(rf"#define MPIML_PUSH_SPLIT {ipc.PUSH_SPLIT}\b", text)
    # the flags sit where the host puts them: above the reduce's root byte, above the allgather's 48-bit stride
    assert "(int)(extra >> 8)" in text and "(int)(extra >> 48)" in text
    for name in kernels:  # (not in FAMILIES: the shipped families keep their source hash)
        assert all(name not in names for _, names, _ in FAMILIES.values())


def test_the_push_kernels_grid_covers_every_line_in_whole_groups():
    """``ipc._llpush_plan``: 32 to LL_THREADS threads a block (a multiple of 32), a block's lines within its
    ``block_bytes``, every line of a group's share taken by one thread a round at most, whole groups (the split
    allgather's blocks per peer), never more than LL_MAX_BLOCKS."""
    for groups in (1, 2, 3, 7):
        for block_bytes in (8, 256, 1024, 4096, 1 << 16):
            for nbytes in (1, 4, 8, 9, 1024, 4096, 4097, 16384, 65536, 256 << 10):
                grid, block = ipc._llpush_plan(nbytes, block_bytes, groups)
                lines = -(-nbytes // 8)
                assert block % 32 == 0 and 32 <= block <= ipc.LL_THREADS
                assert block <= max(32, -(-block_bytes // 8 // 32) * 32)
                assert grid % groups == 0 and groups <= grid <= ipc.LL_MAX_BLOCKS
                per = grid // groups
                assert per * block >= lines or per == ipc.LL_MAX_BLOCKS // groups
    # the default (4096 bytes a block): one block of 512 threads to 4 KiB, as the LL kernels
    assert ipc._llpush_plan(4, 4096) == (1, 32)
    assert ipc._llpush_plan(4096, 4096) == (1, 512)
    assert ipc._llpush_plan(65536, 4096) == (16, 512)


def _push_transport(size=4, **knobs):
    t = object.__new__(ipc.IPCTransport)
    t.multi_node, t._sync, t._err_host, t._err_code = False, False, 1, None
    t.rank, t.size, t.cap, t.ll_max, t.ll_slot = 1, size, 32 << 20, 256 << 10, ipc.LL_SLOT_DEFAULT
    t.llpush_block_bytes, t.llpush_split_bytes, t.llpush_endack, t.llpush_depth = 4096, 0, False, 0
    for k, v in knobs.items():
        setattr(t, k, v)
    return t


def test_the_push_kernels_extra_carries_the_root_or_stride_and_the_knobs():
    t = _push_transport()
    assert t._llpush_launch("reduce", 1024, 3) == (1, 128, 3)
    assert t._llpush_launch("allgather", 1024, 256) == (1, 128, 256)
    t = _push_transport(llpush_endack=True, llpush_split_bytes=4096)
    assert t._llpush_launch("reduce", 1024, 2) == (1, 128, 2 | ipc.PUSH_ENDACK << 8)
    assert t._llpush_launch("allgather", 1024, 256) == (1, 128, 256 | ipc.PUSH_ENDACK << 48)  # below the split size
    grid, block, extra = t._llpush_launch("allgather", 16384, 4096)
    assert (grid, block, extra) == (12, 512, 4096 | (ipc.PUSH_ENDACK | ipc.PUSH_SPLIT) << 48)
    # two ranks: one peer, nothing to split
    assert _push_transport(2, llpush_split_bytes=8)._llpush_launch("allgather", 16384, 4096) == (4, 512, 4096)


@pytest.mark.parametrize("op", ["reduce", "allgather"])
def test_the_hot_launcher_of_the_push_kernels(monkeypatch, op):
    """``hot_launcher`` (no GPU: a stand-in) issues the push kernel of the op (``ipc._push_kernel``) with its plan and
    ``extra``, and takes nothing above ``MPIML_IPC_LL_BYTES`` (one launch)."""
    import numpy as np

    from mpiml.comm import _hotpath

    seen = {}
    monkeypatch.setattr(_hotpath, "binding", lambda op_, x, **kw: ("bind", op_, kw.get("root")))
    monkeypatch.setattr(_hotpath, "ipc_issue", lambda t, op_, x, fa, fu, grid, block, mask, extra=0:
                        seen.update(fa=fa, fu=fu, grid=grid, block=block, mask=mask, extra=extra,
                                    launch=t._launch_kernel) or "issue")
    monkeypatch.setattr(_hotpath, "launcher", lambda comm, t, plan, op_, bind, issue, err=None:
                        seen.update(plan=plan, bind=bind) or "launcher")
    monkeypatch.setattr(ipc, "_push_kernel", lambda name, dtype, rop, aligned: (name, rop, aligned))

    class X:
        size, nbytes, dtype = 1023, 4092, np.dtype(np.float32)

    t = _push_transport(_launch_kernel="plain", _pdl_launch=None)
    arg = ("max", 2) if op == "reduce" else None
    assert t.hot_launcher(None, "plan", op, "llpush", X(), arg) == "launcher"
    rop = "max" if op == "reduce" else None
    assert seen["fu"] == (f"mpiml_{op}_llpush", rop, False) and seen["mask"] == 7
    # the allgather's row stride (4092 bytes) is not 8-byte aligned: the unaligned kernel both ways
    assert seen["fa"] == (f"mpiml_{op}_llpush", rop, op == "reduce")
    assert (seen["grid"], seen["block"]) == (1, 512)
    assert seen["extra"] == (2 if op == "reduce" else 1023)
    assert seen["bind"] == ("bind", op, 2 if op == "reduce" else 0)
    assert seen["launch"] == "plain"
    # MPIML_IPC_LLPUSH_PDL: the issue takes the programmatic launch; the transport keeps its plain one
    t._pdl_launch = "pdl"
    assert t.hot_launcher(None, "plan", op, "llpush", X(), arg) == "launcher"
    assert seen["launch"] == "pdl" and t._launch_kernel == "plain"

    class Big:
        size, nbytes, dtype = (256 << 10) // 4 + 1, (256 << 10) + 4, np.dtype(np.float32)

    assert t.hot_launcher(None, "plan", op, "llpush", Big(), arg) is None


def test_the_pdl_launch_structures_have_the_drivers_layout():
    """``cuLaunchKernelEx``'s ``CUlaunchConfig`` and ``CUlaunchAttribute`` as ``cuda.h`` (CUDA 12) lays them out: the
    push kernels' ``MPIML_IPC_LLPUSH_PDL`` launch hands the driver these bytes; without a driver here, no launcher."""
    import ctypes

    A, C = ipc._LaunchAttribute, ipc._LaunchConfig
    assert ctypes.sizeof(A) == 72 and A.value.offset == 8
    assert (C.grid.offset, C.block.offset, C.shared.offset, C.stream.offset, C.attrs.offset, C.count.offset) == \
        (0, 12, 24, 32, 40, 48)
    assert ctypes.sizeof(C) == 56
    assert ipc._PROGRAMMATIC_STREAM_SERIALIZATION == 6
    text = _text(ipc.PUSH_SOURCES[1])
    assert text.count("mpiml_pdl_wait();") == 2 and text.count("mpiml_pdl_launch_next();") == 2
    # every push kernel waits before it reads its input or the epoch word
    for kernel in ("mpiml_reduce_llpush", "mpiml_allgather_llpush"):
        body = text[text.index(f"{kernel}(const MpimlCtx"):]
        assert body.index("mpiml_pdl_wait();") < body.index("mpiml_ll_get<A>(in") < body.index("mpiml_push_begin(")


def test_the_push_ring_lives_where_the_host_puts_it():
    """The ring's depth rides in the flags' bits 2-5 (the host's shift); its marks sit in the control block's free
    bytes between the acks and the barrier flags (zeroed with it); the ring itself after the pipelined kernels'
    flags, where the host allocates depth * nranks LL slots."""
    text = _text(ipc.PUSH_SOURCES[1])
    common = _text(COMMON)
    assert re.search(rf"#define MPIML_PUSH_DEPTH_SHIFT {ipc.PUSH_DEPTH_SHIFT}\b", text)
    assert re.search(rf"#define MPIML_PUSH_MARK_OFF {ipc.PUSH_MARK_OFF}\b", text)
    ack_off = int(re.search(r"#define MPIML_ACK_OFF (\d+)", common).group(1))
    flag_off = int(re.search(r"#define MPIML_FLAG_OFF (\d+)", common).group(1))
    assert ack_off + 4 * ipc.MAX_RANKS <= ipc.PUSH_MARK_OFF and ipc.PUSH_MARK_OFF + 4 * 8 <= flag_off
    assert ipc.PROBE_OFF + 8 * ipc.MAX_RANKS <= ack_off and flag_off < ipc.DATA_OFF
    assert "c->ll_off + 2 * c->nranks * c->ll_slot + 4ll * MPIML_PIPE_WORDS" in text
    assert ipc.PIPE_BYTES == 4 * 2 * ipc.MAX_RANKS * ipc.PIPE_MAX_STEPS
    t = _push_transport(llpush_depth=8)
    assert t._llpush_launch("reduce", 8, 1) == (1, 32, 1 | (8 << ipc.PUSH_DEPTH_SHIFT) << 8)
    assert t._llpush_launch("allgather", 8, 2)[2] == 2 | (8 << ipc.PUSH_DEPTH_SHIFT) << 48
