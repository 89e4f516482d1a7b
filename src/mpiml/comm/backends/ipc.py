"""The ``ipc`` transport: intra-node collectives through a CUDA-IPC workspace and our kernels.

Longer than 800 lines because one transport owns the workspace's layout alone: every collective's host
path, its hot launcher and the two-level path read and write the same regions.

Each rank allocates one workspace with ``cudaMalloc`` (not CuPy's pool, whose
chunks share IPC handles), exchanges its IPC handle over the host transport and
opens every peer's.  The kernels in :mod:`mpiml.kernels` synchronise through
flags in those workspaces (a device-side barrier with monotonic counters, see
``ipc_common.cuh``), so a call is a single kernel launch with no host
round-trip, and it can be captured into a CUDA graph: the call counter lives in
device memory and the host keeps no per-call state.

Launches bypass ``RawKernel.__call__``: arguments are packed once into a
pinned array of five 64-bit words (context, in, out, count, extra) and the
kernel is launched through ``cuLaunchKernel`` directly.

Algorithms (``algorithm=`` with backend ``ipc``):

===================  ===========================================================
``ll``               no barrier: data pushed into the peers' slots in 16-byte
                     lines that carry the call's flag (allreduce, reduce, bcast,
                     allgather; up to ``MPIML_IPC_LL_BYTES`` per call, 256 KiB;
                     reduce_scatter: up to that much per part)
``oneshot``          every rank reads all peers (allreduce, reduce, scan);
                     reduce_scatter: every rank pushes part r into rank r's
                     buffer, barrier, each reduces its part from its own memory
``twoshot``          reduce-scatter + all-gather, both pushed into the peers'
                     buffers, two barriers (allreduce); scatter + all-gather
                     (bcast); reduce-scatter + gather (reduce)
``lltwoshot``        two-shot in LL lines, no barrier (bcast: the root scatters
                     the lines to the other ranks, each forwards its part to the
                     rest; reduce / allreduce: reduce-scatter to every rank,
                     then its reduced part to the root / every rank); up to one
                     parity's LL slots per launch (``nranks`` slots of
                     ``MPIML_IPC_LL_SLOT_BYTES``, 1 MiB + 128 B: at 4 ranks a
                     2 MiB bcast, a 1 MiB reduce), in chunks above
``llrelay``          reduce: the LL two-shot as a relay, the parts owned by the
                     non-roots, which send them reduced to the root (n bytes
                     into the root, not 1.5 n at 4 ranks; 2 MiB a launch)
``ll128``            the relay (reduce), the LL two-shot (allreduce, bcast) in
                     LL128 lines (128 bytes, 120 of payload, written by the 8
                     lanes of a warp at once) in the staging buffers (at 4 ranks
                     and 32 MiB buffers: reduce and bcast 28 MiB, allreduce
                     15 MiB a launch);
                     reduce_scatter: every rank pushes part r as LL128 lines into
                     rank r's staging buffer, which reduces them as they arrive
                     (parts up to 10 MiB at 4 ranks)
``ll128twoshot``     reduce: the LL128 two-shot (every rank reduces a part of the
                     LL128 lines pushed to it, the non-roots push theirs reduced
                     to the root: 1.5 n into the root at 4 ranks, one hop each)
``ll128direct``      reduce: every non-root pushes its LL128 lines straight into
                     the root's staging buffer, the root reduces them as they
                     arrive (one hop; 10 MiB a launch at 4 ranks)
``pipe``             two-shot without a barrier, pipelined in steps with a flag
                     each (allreduce: reduce-scatter to every rank, then all-gather;
                     reduce: every non-root reduces a part and stores it into the
                     root's buffer; bcast: the root scatters a part to every
                     non-root, which forwards it to the others); each link
                     carries about n bytes (reduce, bcast) and the phases of
                     successive steps overlap (``MPIML_IPC_PIPE_BLOCKS``, 128, and
                     ``MPIML_IPC_PIPE_ROUNDS``, 1: the grid and how many steps a
                     block takes)
``llpush``           reduce, allgather up to ``MPIML_IPC_LL_BYTES``: the LL kernels
                     with every remote store at the start of the call (the ack of
                     the previous call goes out beside the lines, none at the end:
                     ``kernels/comm/small_push.cu``); knobs, all local to a rank:
                     ``MPIML_IPC_LLPUSH_BLOCK_BYTES`` (payload a block, 4096),
                     ``MPIML_IPC_LLPUSH_SPLIT_BYTES`` (allgather parts from this size
                     take one group of blocks per peer; 0: never),
                     ``MPIML_IPC_LLPUSH_ENDACK`` (1: the acks at the end as well, to
                     measure what moving them saved), ``MPIML_IPC_LLPUSH_PDL`` (1, the
                     default: hot launches with programmatic dependent launch,
                     the graph's kernel-to-kernel gap overlapped; 0: plain),
                     ``MPIML_IPC_LLPUSH_DEPTH`` (4 or 8: a ring of slots of their own
                     that many calls deep, so that a reduce's non-roots run ahead of
                     the root; agreed, part of the workspace)
``pull``             readers copy from the root / every rank (bcast, allgather)
``push``             every rank writes its part into every peer's buffer, barrier,
                     each copies from its own memory (allgather)
``two_level``        reduce in each node over IPC, allreduce among node leaders
                     over NCCL, bcast in each node (allreduce; nodes from the
                     hosts, cut into virtual nodes by ``MPIML_NODE_SIZE``)
===================  ===========================================================

``native`` picks ll up to ``MPIML_IPC_LL_BYTES`` (256 KiB), then oneshot up to
``MPIML_IPC_ONESHOT_BYTES`` (if larger) and twoshot above; bcast and allgather
likewise pick ll, then pull.  Messages larger than one staging buffer (``MPIML_IPC_BYTES``,
32 MiB; half of it for twoshot) run in chunks; a reduce_scatter whose parts do not
fit one buffer goes to NCCL.
Ops without an IPC kernel (gather, scatter, alltoall, v-variants) go to NCCL.

Cost model (per call): ``launch + one-way + 2 n * p / link_bw`` (ll),
``launch + barrier + n * p / link_bw`` (one-shot) or ``launch + 2 barrier +
2 n / link_bw`` (two-shot), with barrier ~ a round trip over NVLink.

One call at a time: a kernel takes its call number from the workspace's epoch
word when it starts, so two collectives of one workspace must never run at once
on a rank.  Launches on one stream are ordered by the stream and cost nothing
more (one ``is`` comparison); a launch on another stream than the previous one
first records an event on the previous stream (held, so alive) and makes the
new one wait on it (:class:`StreamOrder`: two capture-status queries, an event
record and a stream wait per switch).  Captured launches are
not ordered here: a CUDA graph runs where it is launched, and the stream it is
launched on must be ordered with the communicator's other collectives by the
caller (launch it on the stream of the calls around it, or wait on their
events), as for NCCL.
A wait of more than 20 us that finds the epoch word moved under it (another
kernel of this workspace finished meanwhile) ends and reports that overlap.

Failures are stream-ordered too: a kernel that waits past ``MPIML_TIMEOUT``
writes the host-mapped error record and ends; the watchdog
(:mod:`~mpiml.comm.backends._watchdog`) reads the record and poisons the
communicator; :meth:`IPCTransport.abort` writes the record's abort code, which
every kernel still waiting reads and gives up on.
"""

import ctypes
import weakref

import numpy as np

from ..._errors import BackendUnavailableError, CommError, CommTimeoutError
from ... import _config
from ...kernels import PUSH_SOURCES
from ._base import Transport
from ._device import require_exclusive_devices
from ._stream import DONE, agree_or_raise, device_sync, node_layout
from ._stream_order import StreamOrder

__all__ = ["IPCTransport", "IPC_ALGORITHMS", "StreamOrder"]

MAX_RANKS = 8
MAX_BLOCKS = 128
DATA_OFF = 16384
PROBE_OFF = 64
THREADS = 512
LL_THREADS = 512  # (ipc_common.cuh's MPIML_LL_THREADS: the LL kernels' launch bounds)
LL_MAX_BLOCKS = 264
IPC_ALGORITHMS = ("ll", "oneshot", "twoshot", "lltwoshot", "llrelay", "ll128", "ll128direct", "ll128twoshot", "pipe",
                  "pull", "push", "llpush", "two_level")
PIPE_MAX_STEPS = 2048  # (ipc_common.cuh's MPIML_PIPE_MAX_STEPS: flags per writer and step)
PIPE_BYTES = 2 * MAX_RANKS * PIPE_MAX_STEPS * 4  # the pipelined kernels' flags, after the LL slots
PIPE_STEP_ALIGN = 128  # packs: a step is a multiple of this
ERR_TIMEOUT, ERR_ABORT, ERR_OVERLAP = 1, 3, 4
# bytes of one LL slot: 1 MiB and a cache line, so that a parity's region (nranks slots) holds a 2 MiB relay reduce at
# 4 ranks in one launch (3 parts of 87382 lines: 262146 > 4 MiB / 16 lines; see _lltwoshot_plan)
LL_SLOT_DEFAULT = (1 << 20) + 128
LL128_PAYLOAD = 120  # payload bytes of an LL128 line (ipc_common's MPIML_LL128_WORDS words of 8)
# the grid of the relay and LL128 kernels: their threads need 93-128 registers (one 512-thread block an SM), and a
# block waits for the same block of its peers, so every block must be resident at once: at most one an SM of the
# smallest GPU meant (132 SMs on an H100; their loops take the lines beyond)
WIDE_LL_MAX_BLOCKS = 128
# pushing warps a block of the LL128 reduces (the relay, the two-shot) and of the LL128 two-shot allreduce
# (MPIML_IPC_LL128_REDUCE_SPLIT, MPIML_IPC_LL128_ALLREDUCE_SPLIT; see MpimlLL128's roles in ipc_common.cuh; 0: every
# warp pushes, then waits). Pass 1 of 2026-11-28 04:25 (4 x H100, key kern_pass1_0425 of
# benchmarks/results/vs_nccl_4xh100.json): the two-shot reduce with 4 of 16 warps pushing took 12.6 / 15.9 / 22.2 us
# in graphs at 2 / 3 / 4 MiB against 13.9 / 18.2 / 23.9 unsplit (8: 14.7 / 17.6 / 21.3); the allreduce kept its time
# unsplit to 3 MiB (3 MiB: 19.8 against 22.5-23.0 split) and gained at 4 MiB only (27.5 with 4, 33.3 unsplit), where
# its route is the pushed two-shot (29.8)
LL128_SPLIT = {"reduce": 4, "allreduce": 0}

_CHUNK_ALIGN = 256
# the push kernels (algorithm llpush: kernels/comm/small_push.cu, a family of its own loaded here, so that the shipped
# cubins of the others keep their source hash); the flags of their `extra` (MPIML_PUSH_ENDACK, MPIML_PUSH_SPLIT, the
# ring's depth from bit MPIML_PUSH_DEPTH_SHIFT)
PUSH_ENDACK, PUSH_SPLIT, PUSH_DEPTH_SHIFT = 1, 2, 2
PUSH_MARK_OFF = 160  # (small_push.cu's MPIML_PUSH_MARK_OFF: the ring's marks, 8 words of the zeroed control block)
_PUSH_KERNELS = {}


def _push_kernel(name, dtype, op, aligned):
    """The ``CUfunction`` handle of ``name`` (``mpiml_reduce_llpush``: ``<T, OP, A>``, ``mpiml_allgather_llpush``:
    ``<U, A>``) for ``dtype``, compiled on first use with every op and alignment of it (one small program)."""
    import cupy

    from ...kernels import OP_CODES, copy_type, reduce_type
    from ...kernels._loader import load_module

    dtype = np.dtype(dtype)
    key = (cupy.cuda.runtime.getDevice(), name, dtype.char, op, aligned)
    fn = _PUSH_KERNELS.get(key)
    if fn is None:
        a = "true" if aligned else "false"
        if name == "mpiml_reduce_llpush":
            ctype = reduce_type(dtype)
            expr = f"{name}<{ctype}, {OP_CODES[op]}, {a}>"
            every = [f"{name}<{ctype}, {o}, {b}>" for o in range(4) for b in ("false", "true")]
        else:
            ctype = copy_type(dtype.itemsize)
            expr = f"{name}<{ctype}, {a}>"
            every = [f"{name}<{ctype}, {b}>" for b in ("false", "true")]
        kernel = load_module(PUSH_SOURCES, [expr], also=every).get_function(expr)
        fn = _PUSH_KERNELS[key] = (kernel, int(kernel.kernel.ptr))
    return fn[1]


class _LaunchAttribute(ctypes.Structure):
    """``CUlaunchAttribute``: an id, padding to 8 bytes, a 64-byte union of values."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):
    """``CUlaunchConfig`` (``cuLaunchKernelEx``)."""
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.POINTER(_LaunchAttribute)), ("count", ctypes.c_uint)]


_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION


def _pdl_launcher(fallback):
    """A launch function with ``driver.launchKernel``'s arguments that launches through ``cuLaunchKernelEx`` with
    programmatic stream serialization (the push kernels' ``MPIML_IPC_LLPUSH_PDL``: a kernel may start while the one
    before it in its stream or graph ends, and waits in ``griddepcontrol.wait``), or None without that driver call.
    A launch the driver refuses goes through ``fallback`` (the plain launch), and so does every later one."""
    try:
        ex = ctypes.CDLL("libcuda.so.1").cuLaunchKernelEx
    except (OSError, AttributeError):
        return None
    ex.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    ex.restype = ctypes.c_int
    attr = _LaunchAttribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
    attr.value[0] = 1
    cfg = _LaunchConfig(attrs=ctypes.pointer(attr), count=1)
    cfg_ptr = ctypes.addressof(cfg)
    broken = []

    def launch(fn, gx, gy, gz, bx, by, bz, shared, stream, argv, extra):
        if not broken:
            cfg.grid[:] = (gx, gy, gz)
            cfg.block[:] = (bx, by, bz)
            cfg.shared, cfg.stream = shared, stream
            rc = ex(cfg_ptr, fn, argv, None)
            if rc == 0:
                return
            broken.append(rc)
        fallback(fn, gx, gy, gz, bx, by, bz, shared, stream, argv, extra)

    launch.state = (attr, cfg, broken)  # (alive with the function)
    return launch


def _llpush_plan(nbytes, block_bytes, groups=1):
    """``(grid, block)`` of a push kernel for ``nbytes`` of payload: a block takes ``block_bytes`` (8-byte lines, one a
    thread, 32 to ``LL_THREADS`` threads: no more than the call has lines), ``groups`` groups of such blocks (the
    split allgather: one group per peer), at most ``LL_MAX_BLOCKS`` in all."""
    lines = max(1, -(-nbytes // 8))
    threads = min(LL_THREADS, max(32, -(-min(lines, max(1, block_bytes // 8)) // 32) * 32))
    per = max(1, min(LL_MAX_BLOCKS // groups, -(-lines // threads)))
    return per * groups, threads


# one-node graphs of repeated hot calls alive at once per transport (IPCTransport.one_node_graph)
GRAPH_LIMIT = 256


class _OneNodeGraph:
    """A CuPy graph of one kernel launch; ``launch(stream)`` replays it."""

    __slots__ = ("graph", "launch", "__weakref__")

    def __init__(self, graph):
        self.graph = graph
        self.launch = graph.launch


def _one_graph_gone(count):
    count[0] -= 1


def _env_bytes(name, default):
    return _config.env_number(name, default, minimum=4096, unit="bytes")


def _grid(units):
    return max(1, min(MAX_BLOCKS, -(-units // THREADS)))


def _ll_grid(nbytes):
    return max(1, min(LL_MAX_BLOCKS, -(-nbytes // (8 * LL_THREADS))))


def _lltwoshot_plan(op, nbytes, nranks, ll_slot, relay=False):
    """``(chunk bytes, grid)`` of the two-shot LL kernels (``mpiml_bcast_lltwoshot``,
    ``mpiml_reduce_lltwoshot``, ``mpiml_allreduce_lltwoshot``) for calls of ``nbytes``: a chunk keeps its lines within
    the LL region of one parity (``nranks`` slots of ``ll_slot`` bytes, 16-byte lines of
    8 payload bytes); the grid has one index per line of a part (the same on every rank).
    ``relay``: the reduce whose parts the non-roots own (``mpiml_ll_relay_reduce``, 2 ranks or more)."""
    region = nranks * ll_slot // 16  # lines
    relay = relay and op == "reduce" and nranks > 1
    parts = max(1, nranks - 1) if op == "bcast" or relay else nranks
    if op == "bcast":   # every line at its own index
        chunk = region
    elif relay:         # nranks - 1 parts, an owner's nranks - 1 copies of its part (the root's reduced parts)
        chunk = region // parts * parts
    else:               # nranks parts, each with its nranks copies and the receivers' gathered copy
        chunk = ll_slot // 32 * nranks
    chunk_bytes = 8 * chunk
    lines = -(-min(nbytes, chunk_bytes) // 8)
    most = WIDE_LL_MAX_BLOCKS if relay else LL_MAX_BLOCKS
    return chunk_bytes, max(1, min(most, -(-(-(-lines // parts)) // LL_THREADS)))


def _ll128_plan(nbytes, nranks, cap, relay=False, direct=False, blocks=WIDE_LL_MAX_BLOCKS, split=0):
    """``(chunk bytes, grid)`` of the LL128 kernels (``mpiml_allreduce_ll128``: the two-shot, ``mpiml_reduce_ll128``:
    the relay, ``relay`` true, ``mpiml_reduce_ll128direct``: ``direct`` true) for calls of ``nbytes``: lines of 128
    bytes carrying 120 in the staging buffer of one parity (``cap`` bytes), cut into ``nranks`` parts whose
    ``2 * nranks * part`` lines fit it (the two-shot: every rank's copies and the gathered reduced parts) or
    ``nranks - 1`` parts whose ``(nranks - 1) * part`` lines fit it (the relay: an owner's copies, the root's reduced
    parts); the direct reduce keeps ``nranks - 1`` copies of every line (one part) at the root; 8 lanes a line, so
    the grid has ``8 * part`` threads (the same on every rank), at most ``blocks`` blocks.  ``split``: the pushing
    warps of a block (``MpimlLL128``'s roles in ``ipc_common.cuh``; 0, every warp pushes and waits), whose lines
    size the grid: ``8 * part`` threads of pushing warps."""
    if direct:
        parts = 1
        chunk = LL128_PAYLOAD * (cap // 128 // max(1, nranks - 1))
    elif relay:
        parts = nranks - 1
        chunk = LL128_PAYLOAD * (cap // 128 // parts * parts)
    else:
        parts = nranks
        chunk = LL128_PAYLOAD * nranks * (cap // 128 // (2 * nranks))
    part = -(-_ll128_lines(min(nbytes, chunk)) // parts)
    pushing = split if 0 < split < LL_THREADS // 32 else LL_THREADS // 32
    return chunk, max(1, min(blocks, -(-8 * part // (32 * pushing))))


def _ll128_lines(nbytes):
    """LL128 lines of a message of ``nbytes`` (8-byte words, 15 a line)."""
    return -(-(-(-nbytes // 8)) // (LL128_PAYLOAD // 8))


def _pipe_plan(op, nbytes, nranks, blocks, rounds):
    """``(step packs, grid)`` of a pipelined kernel (``mpiml_<op>_pipe``) for one launch of ``nbytes``.

    The packs (16 bytes) are cut into ``q`` parts (allreduce: one per rank; reduce and bcast:
    one per non-root) and every part into steps of ``step`` packs (a multiple of
    :data:`PIPE_STEP_ALIGN`, at most :data:`PIPE_MAX_STEPS` steps a part), so that ``blocks``
    blocks take about ``rounds`` steps each; the grid is ``min(blocks, steps)``.  Both depend
    only on the arguments, equal on every rank.
    """
    q = nranks if op == "allreduce" else max(1, nranks - 1)
    part = -(-(-(-nbytes // 16)) // q)
    step = -(-part // (blocks * rounds))
    step = max(step, -(-part // PIPE_MAX_STEPS))
    step = max(PIPE_STEP_ALIGN, -(-step // PIPE_STEP_ALIGN) * PIPE_STEP_ALIGN)
    return step, max(1, min(blocks, MAX_BLOCKS, -(-part // step)))


def _pipe_chunk(op, nranks, cap):
    """Bytes of one launch of a pipelined kernel: the sources' copies and the gathered parts,
    ``(nranks + q) * part`` packs, within one staging buffer of ``cap`` bytes."""
    q = nranks if op == "allreduce" else max(1, nranks - 1)
    part = cap // 16 // (nranks + q)
    return part * q * 16 // _CHUNK_ALIGN * _CHUNK_ALIGN


def _displs(counts):
    """Element offsets of the parts ``counts`` (``len(counts) + 1`` of them)."""
    return np.concatenate(([0], np.cumsum(counts))).astype(np.int64)


class IPCTransport(Transport):
    """CUDA-IPC collectives among the ranks of one node.

    Parameters
    ----------
    world : Transport
        The host transport of the communicator (set-up data travels over it).
    """

    name = "ipc"
    accepts_device = True
    accepts_host = False

    def __init__(self, world):
        self._world = world
        self.rank = world.rank
        self.size = world.size
        self._broken = None
        self._base = None
        self._opened = []
        self._err_host = None
        self._two_level_parts = None
        self._fallback = None
        self._displs = {}
        self._rs_kernels = {}  # (algorithm, counts, dtype, op) -> reduce-scatter kernels, grid, block
        # what every role of this transport reads (the two-level role below returns before _setup):
        # whether calls wait on the host, the timeout, the error word the hot path polls
        self._sync = device_sync()
        self._timeout = _config.timeout()
        self._err_code = None
        self._order = None  # StreamOrder of this workspace's launches (made with it, in _setup)
        # repeated hot calls on the same arrays replay one-node CUDA graphs (see one_node_graph); a local
        # choice (no peer sees how a kernel was launched): MPIML_IPC_REPLAY=0 launches kernels instead
        self._replay = bool(_config.env_number("MPIML_IPC_REPLAY", 1, minimum=0, maximum=1))
        self._graphs = [0]  # one-node graphs alive (a list: their finalizers count down in it)
        self._capture_stream = None
        err = None
        try:
            import cupy  # noqa: F401  (both needed below)
            from cupy_backends.cuda.api import driver  # noqa: F401
        except Exception as exc:  # no CuPy
            err = f"{type(exc).__name__}: {exc}"
        agree_or_raise(world, err, "the 'ipc' backend needs CuPy and a GPU (pip install cupy-cuda12x)")
        # one GPU per rank, agreed before any device memory is touched (the same refusal everywhere)
        ids = require_exclusive_devices(world, "ipc")
        self.nodes = node_layout(ids, _config.node_size())
        self.multi_node = len(set(self.nodes)) > 1
        if self.multi_node:
            # only two_level (and the NCCL fallback) run across nodes; no workspace here: the
            # node's IPC part is a transport of its own (_two_level), made on first use
            return
        if self.size > MAX_RANKS:
            raise BackendUnavailableError(f"the 'ipc' backend serves at most {MAX_RANKS} ranks; got {self.size}")
        self.cap = _env_bytes("MPIML_IPC_BYTES", 32 << 20) // _CHUNK_ALIGN * _CHUNK_ALIGN
        self.oneshot_max = _env_bytes("MPIML_IPC_ONESHOT_BYTES", 256 << 10)
        self.ll_max = _env_bytes("MPIML_IPC_LL_BYTES", 256 << 10) // 16 * 16
        # one LL slot per source and parity: at least twice the LL kernels' payload (16-byte lines of 8 bytes);
        # the two-shot LL kernels see a parity's slots as one region: with 1 MiB slots (8 MiB a GPU at 4 ranks)
        # a 2 MiB bcast or a 1 MiB reduce / allreduce is one launch there
        self.ll_slot = max(2 * self.ll_max, _env_bytes("MPIML_IPC_LL_SLOT_BYTES", LL_SLOT_DEFAULT) // 16 * 16)
        # the pipelined kernels' grid and steps a block (see _pipe_plan): 128 x 1, every step a block of its own,
        # measured best on 4 x H100 (a step's flag is a system-scope release, which a block pays in series; key
        # pipe_run_2020 of benchmarks/results/vs_nccl_4xh100.json, docs/comm.md)
        self.pipe_blocks = _config.env_number("MPIML_IPC_PIPE_BLOCKS", 128, minimum=1, maximum=MAX_BLOCKS,
                                              unit="blocks")
        self.pipe_rounds = _config.env_number("MPIML_IPC_PIPE_ROUNDS", 1, minimum=1, maximum=64, unit="steps")
        # the LL128 kernels' largest grid (every block resident at once: at most one an SM, see WIDE_LL_MAX_BLOCKS)
        self.ll128_blocks = _config.env_number("MPIML_IPC_LL128_BLOCKS", WIDE_LL_MAX_BLOCKS, minimum=1,
                                               maximum=WIDE_LL_MAX_BLOCKS, unit="blocks")
        # the LL128 relay reduce's and two-shot allreduce's pushing warps a block (the others wait: MpimlLL128's
        # roles, ipc_common.cuh); 0: every warp pushes its lines, then waits for the lines it handles
        self.ll128_split = {op: _config.env_number(f"MPIML_IPC_LL128_{op.upper()}_SPLIT", LL128_SPLIT[op], minimum=0,
                                                   maximum=LL_THREADS // 32 - 1, unit="warps")
                            for op in ("reduce", "allreduce")}
        # the push kernels' block payload, the allgather part from which they split by peer (0: never), and whether
        # they also store the acks at the end (llpush; local choices: no peer depends on them)
        self.llpush_block_bytes = _config.env_number("MPIML_IPC_LLPUSH_BLOCK_BYTES", 4096, minimum=8, maximum=1 << 20,
                                                     unit="bytes")
        self.llpush_split_bytes = _config.env_number("MPIML_IPC_LLPUSH_SPLIT_BYTES", 0, minimum=0, unit="bytes")
        self.llpush_endack = bool(_config.env_number("MPIML_IPC_LLPUSH_ENDACK", 0, minimum=0, maximum=1))
        # programmatic dependent launch of the push kernels' hot calls: on 4 x H200 (2026-11-28, key push4_0727 of
        # benchmarks/results/vs_nccl_4xh200.json) the reduce in graphs took 3.07 / 2.92 / 3.46 / 3.56 us at 4 B / 1 / 16 /
        # 64 KiB with it and 3.26 / 3.18 / 3.55 / 3.97 without (the LL kernel: 3.13 / 3.09 / 3.62 / 3.96)
        self.llpush_pdl = bool(_config.env_number("MPIML_IPC_LLPUSH_PDL", 1, minimum=0, maximum=1))
        # the push kernels' ring of slots of their own (0: the LL slots of the call's parity; 4 or 8: that many calls
        # deep, depth * size more LL slots in the workspace; agreed: part of the layout)
        self.llpush_depth = _config.env_number("MPIML_IPC_LLPUSH_DEPTH", 0, minimum=0, maximum=8, unit="calls")
        if self.llpush_depth not in (0, 4, 8):
            raise ValueError(f"MPIML_IPC_LLPUSH_DEPTH must be 0, 4 or 8; got {self.llpush_depth}")
        # two-shot keeps the sources' copies and the reduced parts (2 n, rounded up to the parts) in a buffer
        self.twoshot_cap = (self.cap // 2 - 16 * (MAX_RANKS + 1)) // _CHUNK_ALIGN * _CHUNK_ALIGN
        # a pushed allgather keeps every rank's part (its packs) in each buffer
        self.push_cap = (self.cap // self.size - 16) // _CHUNK_ALIGN * _CHUNK_ALIGN
        self._setup()

    # ------------------------------------------------------------------ set-up
    def _setup(self):
        import cupy
        from cupy.cuda import runtime

        world = self._world
        handle, err = None, None
        try:
            self._ll_off = DATA_OFF + 2 * self.cap
            self._ll_slot = self.ll_slot
            pipe_off = self._ll_off + 2 * self.size * self._ll_slot  # (the kernels find it there: mpiml_pipe_flag)
            ring = self.llpush_depth * self.size * self._ll_slot  # the push kernels' ring, after the flags
            self._base = runtime.malloc(pipe_off + PIPE_BYTES + ring)
            runtime.memset(self._base, 0, DATA_OFF)
            # no stale flags
            runtime.memset(self._ll_off + self._base, 0, 2 * self.size * self._ll_slot + PIPE_BYTES + ring)
            runtime.deviceSynchronize()
            handle = runtime.ipcGetMemHandle(self._base)
        except Exception as exc:
            err = f"{type(exc).__name__}: {exc}"
        agree_or_raise(world, err, "ipc workspace")
        # the kernels find a peer's buffers and slots at their own offsets: the layout must be the same everywhere
        layout = (self.cap, self.ll_max, self.ll_slot, self.pipe_blocks, self.pipe_rounds, self.ll128_blocks,
                  tuple(self.ll128_split.values()), self.llpush_depth)
        shared = world.allgather_obj((handle, layout))
        handles = [h for h, _ in shared]
        if len({lay for _, lay in shared}) > 1:
            runtime.free(self._base)
            self._base = None
            raise BackendUnavailableError(
                "the ipc workspaces differ between ranks (MPIML_IPC_BYTES, MPIML_IPC_LL_BYTES, "
                "MPIML_IPC_LL_SLOT_BYTES, MPIML_IPC_PIPE_BLOCKS, MPIML_IPC_PIPE_ROUNDS, MPIML_IPC_LL128_BLOCKS, "
                "MPIML_IPC_LL128_REDUCE_SPLIT, MPIML_IPC_LL128_ALLREDUCE_SPLIT, MPIML_IPC_LLPUSH_DEPTH must "
                "be the same on every rank): "
                + ", ".join(f"rank {r}: {lay}" for r, (_, lay) in enumerate(shared)))
        peers, err = [], None
        try:
            for r, h in enumerate(handles):
                if r == self.rank:
                    peers.append(self._base)
                else:
                    ptr = runtime.ipcOpenMemHandle(h, 1)  # cudaIpcMemLazyEnablePeerAccess
                    self._opened.append(ptr)
                    peers.append(ptr)
            # a real write into every peer's workspace; read back after the barrier below
            token = np.array([0x6D70000 + self.rank], dtype=np.int64)
            for r, p in enumerate(peers):
                runtime.memcpy(p + PROBE_OFF + 8 * self.rank, token.ctypes.data, 8, 4)
            runtime.deviceSynchronize()
        except Exception as exc:
            err = f"{type(exc).__name__}: {exc}"
        agree_or_raise(world, err, "ipc peer mapping")
        err = None
        try:
            got = np.zeros(self.size, dtype=np.int64)
            runtime.memcpy(got.ctypes.data, self._base + PROBE_OFF, 8 * self.size, 4)
            want = 0x6D70000 + np.arange(self.size)
            if not np.array_equal(got, want):
                err = f"peer writes did not arrive (read {got.tolist()}, expected {want.tolist()})"
        except Exception as exc:
            err = f"{type(exc).__name__}: {exc}"
        agree_or_raise(world, err, "ipc peer access probe")
        self._peers = peers

        # error record in host-mapped pinned memory: [code, peer, block, epoch]
        self._err_host = runtime.hostAlloc(64, 3)  # cudaHostAllocPortable | cudaHostAllocMapped
        self._err = np.ctypeslib.as_array((ctypes.c_int32 * 16).from_address(self._err_host))
        self._err[:] = 0
        self._err_code = ctypes.c_int32.from_address(self._err_host)  # one cheap read per hot call
        timeout = _config.timeout()
        ctx = np.zeros(MAX_RANKS + 7, dtype=np.int64)
        ctx[:self.size] = peers
        ctx[MAX_RANKS:] = [self.rank, self.size, int(timeout * 1e9) if timeout else 0, self.cap,
                           self._err_host, self._ll_off, self._ll_slot]
        self._ctx = cupy.asarray(ctx)
        cupy.cuda.get_current_stream().synchronize()
        # launch arguments: five 64-bit words and the array of pointers to them
        self._args = np.zeros(5, dtype=np.uint64)
        self._args[0] = self._ctx.data.ptr
        self._argv = np.array([self._args.ctypes.data + 8 * i for i in range(5)], dtype=np.uint64)
        self._argv_ptr = int(self._argv.ctypes.data)
        from cupy_backends.cuda.api import driver

        self._launch_kernel = driver.launchKernel
        # the push kernels' hot launches with programmatic dependent launch (MPIML_IPC_LLPUSH_PDL; None: plain)
        self._pdl_launch = _pdl_launcher(driver.launchKernel) if self.llpush_pdl else None
        self._order = StreamOrder.cuda()
        self._cupy = cupy
        world.native_barrier().wait()  # nobody launches before every peer is mapped
        if self.size > 1:  # (the end of the process is bounded: see mpiml.comm._exit)
            from .. import _exit

            _exit.register(self, self.rank)

    def close(self):
        helpers, self._fallback, self._two_level_parts = self._helpers(), None, None
        self._replay, self._capture_stream = False, None  # (graphs still held by launchers go with them)
        if self._broken is None:  # (a launcher kept by someone reads this before the freed error word)
            self._broken = "closed"
        for t in helpers:  # (the two-level role holds nothing but these)
            t.close()
        if self._base is None and self._err_host is None:
            return
        try:
            from cupy.cuda import runtime

            runtime.deviceSynchronize()
            try:
                self._world.native_barrier().wait()  # peers are done with our workspace
            except Exception:
                pass
            for p in self._opened:
                runtime.ipcCloseMemHandle(p)
            if self._base is not None:
                runtime.free(self._base)
            if self._order is not None:
                self._order.close()
            if self._err_host is not None:
                from ._watchdog import _LOCK

                with _LOCK:  # the watchdog reads the record under this lock: never after the free
                    err_host, self._err_host = self._err_host, None
                    runtime.freeHost(err_host)
        except Exception:
            pass
        self._opened, self._base, self._err_host = [], None, None

    # ------------------------------------------------------------------ launching
    def _check(self, op):
        if self._broken is not None:
            raise CommError(f"{op} on the ipc backend: the communicator is unusable after an earlier "
                            f"failure ({self._broken})")
        if self._err[0]:
            self._fail(op)

    def _error_from_record(self, op):
        """The error the record describes (a timeout, or an abort after a failure elsewhere)."""
        code, peer, block, epoch = (int(v) for v in self._err[0:4])
        if code == ERR_TIMEOUT:
            self._broken = f"rank {self.rank} timed out waiting for rank {peer} (block {block}, call {epoch})"
            return CommTimeoutError(op, peer, self._timeout or 0,
                                    f"ipc kernel on rank {self.rank}, call {epoch}; the communicator "
                                    "cannot be used any more")
        if code == ERR_OVERLAP:
            seen = int(self._err[4])
            self._broken = (f"rank {self.rank}: call {epoch} ran at the same time as another collective of this "
                            f"communicator (call counter {seen} when it gave up)")
            return CommError(f"{op} on the ipc backend: the kernel of call {epoch} on rank {self.rank} ran at the "
                             f"same time as another ipc collective of this communicator on this rank, which moved "
                             f"the call counter to {seen} while it waited for rank {peer} (a CUDA graph holding "
                             "collectives launched on a stream not ordered with the other calls?); the "
                             "communicator cannot be used any more")
        self._broken = self._broken or f"aborted (error code {code})"
        return CommError(f"{op} on the ipc backend: the communicator was aborted ({self._broken})")

    def _fail(self, op):
        raise self._error_from_record(op)

    # ------------------------------------------------------------------ watchdog hooks
    def _helpers(self):
        """The transports this one delegates to (NCCL for ops without a kernel, two-level parts)."""
        return [t for t in (self._fallback, *(self._two_level_parts or ())) if t is not None]

    def poll_failure(self):
        """An exception if a kernel here or in a helper transport recorded a failure, else None.

        The watchdog calls this; ops that went to the NCCL fallback or the
        two-level parts are watched through it as well.
        """
        if self._err_host is not None and self._err_code.value:
            return self._error_from_record(self._last_op)
        for t in self._helpers():
            exc = t.poll_failure()
            if exc is not None:
                return exc
        return None

    def abort(self, why):
        """Make every kernel of this transport (and its helpers) that still waits give up."""
        if self._broken is None:
            self._broken = why
        if self._err_host is not None and not self._err_code.value:
            self._err[3] = -1
            self._err_code.value = ERR_ABORT
        for t in self._helpers():
            t.abort(why)

    _last_op = "ipc collective"

    def _launch(self, fn, grid, inp, outp, n, extra, block=THREADS):
        a = self._args
        a[1] = inp
        a[2] = outp
        a[3] = n
        a[4] = extra
        st = self._cupy.cuda.get_current_stream()
        order = self._order
        if st is not order.last:
            order.before(st)
        self._launch_kernel(fn, grid, 1, 1, block, 1, 1, 0, st.ptr, self._argv_ptr, 0)
        if order.eager:
            order.after(st)

    def _done(self, op):
        """Completion of a call: wait on the host (bounded by the device timeout) or not."""
        if self._sync:
            stream = self._cupy.cuda.get_current_stream()
            if not stream.is_capturing():
                stream.synchronize()
                if self._err[0]:
                    self._fail(op)
        return DONE

    def _chunks(self, n, itemsize, cap=None):
        """``(start, count)`` element ranges of at most one staging buffer (``cap`` bytes) each."""
        step = (cap or self.cap) // itemsize
        return [(s, min(step, n - s)) for s in range(0, n, step)]

    def _kernel(self, family, name, dtype, op, aligned):
        from ...kernels import get_kernel

        return get_kernel(family, name, dtype, op, aligned)

    @staticmethod
    def _reduce_op(op, dtype):
        if dtype == np.bool_:  # or / and on 0-1 bytes
            return {"sum": "max", "prod": "min"}.get(op, op)
        return op

    def _elementwise(self, op_name, family, kernel, sendbuf, recvbuf, op, extra, parts=1):
        """Run an elementwise kernel over ``sendbuf`` in chunks; ``recvbuf`` may be None.

        The grid is a function of the element count alone (equal on every rank);
        alignment only selects 16-byte (8-byte for LL kernels) or element-wise
        access to the user's arrays.
        """
        self._check(op_name)
        self._last_op = op_name
        n = sendbuf.size
        if n == 0:
            return DONE
        dtype = sendbuf.dtype
        isz = dtype.itemsize
        rop = self._reduce_op(op, dtype) if op is not None else None
        sp = sendbuf.data.ptr
        rp = recvbuf.data.ptr if recvbuf is not None and recvbuf.size else 0
        ll = kernel.endswith("_ll")
        mask = 7 if ll else 15
        cap = self.ll_max if ll else self.twoshot_cap if kernel.endswith("_twoshot") else self.cap
        for start, count in self._chunks(n, isz, cap):
            off = start * isz
            aligned = not ((sp + off) & mask or (rp + off if rp else 0) & mask)
            fn = self._kernel(family, kernel, dtype, rop, aligned)
            if ll:
                self._launch(fn, _ll_grid(count * isz), sp + off, (rp + off) if rp else 0, count, extra, LL_THREADS)
            else:
                units = -(-count * isz // 16)
                self._launch(fn, _grid(-(-units // parts)), sp + off, (rp + off) if rp else 0, count, extra)
        return self._done(op_name)

    # ------------------------------------------------------------------ collectives
    def native_allreduce(self, sendbuf, recvbuf, op, algorithm=None):
        if self.multi_node:
            return self._two_level_allreduce(sendbuf, recvbuf, op)
        if algorithm is None:
            algorithm = self._auto_allreduce(sendbuf.nbytes)
        if algorithm == "ll":
            return self._elementwise("allreduce", "allreduce", "mpiml_allreduce_ll", sendbuf, recvbuf, op, 0)
        if algorithm == "oneshot":
            return self._elementwise("allreduce", "allreduce", "mpiml_allreduce_oneshot", sendbuf, recvbuf, op, 0)
        if algorithm == "twoshot":
            return self._elementwise("allreduce", "allreduce", "mpiml_allreduce_twoshot", sendbuf, recvbuf, op, 0,
                                     parts=self.size)
        if algorithm in ("lltwoshot", "ll128"):
            return self._lltwoshot("allreduce", sendbuf, recvbuf, op, 0, algorithm)
        if algorithm == "pipe":
            return self._pipe("allreduce", sendbuf, recvbuf, op, 0)
        if algorithm == "two_level":
            return self._two_level_allreduce(sendbuf, recvbuf, op)
        raise ValueError(f"algorithm {algorithm!r} does not apply to allreduce on the ipc backend "
                         "(ll, oneshot, twoshot, lltwoshot, ll128, pipe, two_level)")

    def _auto_allreduce(self, nbytes):
        if nbytes <= self.ll_max:
            return "ll"
        return "oneshot" if nbytes <= self.oneshot_max else "twoshot"

    def native_reduce(self, sendbuf, recvbuf, op, root, algorithm=None):
        if self.multi_node:
            return self._nccl().native_reduce(sendbuf, recvbuf, op, root)
        out = recvbuf if self.rank == root else None
        if algorithm == "llpush":
            return self._llpush("reduce", sendbuf, out, op, int(root))
        if algorithm == "ll" or (algorithm is None and sendbuf.nbytes <= self.ll_max):
            return self._elementwise("reduce", "reduce", "mpiml_reduce_ll", sendbuf, out, op, int(root))
        if algorithm == "twoshot":
            return self._elementwise("reduce", "reduce", "mpiml_reduce_twoshot", sendbuf, out, op, int(root),
                                     parts=self.size)
        if algorithm == "lltwoshot":
            return self._lltwoshot("reduce", sendbuf, out, op, int(root))
        if algorithm in ("llrelay", "ll128", "ll128direct", "ll128twoshot"):
            return self._lltwoshot("reduce", sendbuf, out, op, int(root), algorithm)
        if algorithm == "pipe" and self.size > 1:  # (one rank: the one-shot copies)
            return self._pipe("reduce", sendbuf, out, op, int(root))
        return self._elementwise("reduce", "reduce", "mpiml_reduce_oneshot", sendbuf, out, op, int(root))

    def native_bcast(self, buf, root, algorithm=None):
        if self.multi_node:
            return self._nccl().native_bcast(buf, root)
        if algorithm == "ll" or (algorithm is None and buf.nbytes <= self.ll_max):
            return self._elementwise("bcast", "bcast", "mpiml_bcast_ll", buf, buf, None, int(root))
        if algorithm == "twoshot":
            return self._elementwise("bcast", "bcast", "mpiml_bcast_twoshot", buf, buf, None, int(root),
                                     parts=self.size)
        if algorithm == "lltwoshot":
            return self._lltwoshot("bcast", buf, buf, None, int(root))
        if algorithm == "pipe":
            return self._pipe("bcast", buf, buf, None, int(root))
        if algorithm == "ll128":
            return self._lltwoshot("bcast", buf, buf, None, int(root), "ll128")
        return self._elementwise("bcast", "bcast", "mpiml_bcast_pull", buf, buf, None, int(root))

    def _llpush(self, op_name, sendbuf, recvbuf, op, arg):
        """The push reduce (``arg``: the root) or allgather (``arg``: the row stride of the result, in elements; see
        ``kernels/comm/small_push.cu``), in chunks of one LL slot's payload (``MPIML_IPC_LL_BYTES``)."""
        self._check(op_name)
        self._last_op = op_name
        n = sendbuf.size
        if n == 0:
            return DONE
        dtype, isz = sendbuf.dtype, sendbuf.dtype.itemsize
        rop = self._reduce_op(op, dtype) if op is not None else None
        gather = op_name == "allgather"
        sp = sendbuf.data.ptr
        rp = recvbuf.data.ptr if recvbuf is not None and recvbuf.size else 0
        for start, count in self._chunks(n, isz, self.ll_max):
            off = start * isz
            aligned = not ((sp + off) & 7 or (rp + off if rp else 0) & 7 or (gather and (n * isz) & 7))
            fn = _push_kernel(f"mpiml_{op_name}_llpush", dtype, rop, aligned)
            grid, block, extra = self._llpush_launch(op_name, count * isz, arg)
            self._launch(fn, grid, sp + off, (rp + off) if rp else 0, count, extra, block)
        return self._done(op_name)

    def _llpush_launch(self, op_name, nbytes, arg):
        """``(grid, block, extra)`` of a push kernel for ``nbytes`` a rank: ``extra`` the root (reduce) or the row
        stride (allgather) with the knobs' flags (``MPIML_PUSH_ENDACK``, ``MPIML_PUSH_SPLIT``, the ring's depth)
        above it."""
        flags, groups = (PUSH_ENDACK if self.llpush_endack else 0) | (self.llpush_depth << PUSH_DEPTH_SHIFT), 1
        if op_name == "allgather" and self.size > 2 and 0 < self.llpush_split_bytes <= nbytes:
            flags, groups = flags | PUSH_SPLIT, self.size - 1
        grid, block = _llpush_plan(nbytes, self.llpush_block_bytes, groups)
        return grid, block, int(arg) | (flags << (48 if op_name == "allgather" else 8))

    def _lltwoshot(self, op_name, sendbuf, recvbuf, op, root, variant="lltwoshot"):
        """The two-shot LL bcast, reduce or allreduce (see the kernels), in chunks of one LL region each."""
        self._check(op_name)
        self._last_op = op_name
        n = sendbuf.size
        if n == 0 or (op_name == "bcast" and self.size == 1):  # (the kernel cuts the lines among the non-roots)
            return DONE
        dtype, isz = sendbuf.dtype, sendbuf.dtype.itemsize
        rop = self._reduce_op(op, dtype) if op is not None else None
        sp = sendbuf.data.ptr
        rp = recvbuf.data.ptr if recvbuf is not None and recvbuf.size else 0
        kernel, plan, tag = self._lltwoshot_variant(op_name, variant)
        chunk_bytes, _ = plan(n * isz)
        for start, count in self._chunks(n, isz, chunk_bytes):
            off = start * isz
            aligned = not ((sp + off) & 7 or (rp + off if rp else 0) & 7)
            fn = self._kernel(op_name, kernel, dtype, rop, aligned)
            _, grid = plan(count * isz)
            self._launch(fn, grid, sp + off, (rp + off) if rp else 0, count, tag | root, LL_THREADS)
        return self._done(op_name)

    def _lltwoshot_variant(self, op_name, variant="lltwoshot"):
        """``(kernel, plan, tag)`` of algorithm ``variant`` of ``op_name``: ``lltwoshot`` (bcast, reduce, allreduce:
        the LL two-shot), ``llrelay`` (reduce: the relay) or ``ll128`` (reduce: the relay, allreduce: the two-shot, in
        LL128 lines, in the staging buffers), ``ll128twoshot`` (reduce: the two-shot in LL128 lines, its parts
        gathered at the root), ``ll128direct`` (reduce: the non-roots' LL128 lines straight to the root);
        ``plan(nbytes)`` is ``(chunk bytes, grid)`` of a launch, ``tag | root`` the kernel's ``extra`` (the
        LL128 kernels' split in its bits above 255).  At one rank, the LL two-shot."""
        size, slot, cap, blocks = self.size, self.ll_slot, self.cap, self.ll128_blocks
        if variant == "ll128" and op_name == "bcast" and size > 1:  # the relay's geometry: nranks - 1 parts
            return "mpiml_bcast_ll128", lambda nbytes: _ll128_plan(nbytes, size, cap, True, blocks=blocks), 0
        if variant == "ll128direct" and op_name == "reduce" and size > 1:
            return ("mpiml_reduce_ll128direct",
                    lambda nbytes: _ll128_plan(nbytes, size, cap, direct=True, blocks=blocks), 0)
        if variant in ("ll128", "ll128twoshot") and size > 1:
            relay, split = op_name == "reduce" and variant == "ll128", self.ll128_split[op_name]
            return (f"mpiml_{op_name}_{variant}",
                    lambda nbytes: _ll128_plan(nbytes, size, cap, relay, blocks=blocks, split=split), split << 8)
        if variant in ("llrelay", "ll128") and op_name == "reduce" and size > 1:
            return "mpiml_reduce_llrelay", lambda nbytes: _lltwoshot_plan(op_name, nbytes, size, slot, True), 0
        return f"mpiml_{op_name}_lltwoshot", lambda nbytes: _lltwoshot_plan(op_name, nbytes, size, slot), 0

    def _pipe(self, op_name, sendbuf, recvbuf, op, root):
        """The pipelined two-shot bcast, reduce or allreduce (see mpiml_pipe), in chunks of one staging buffer."""
        self._check(op_name)
        self._last_op = op_name
        n = sendbuf.size
        if n == 0 or (op_name == "bcast" and self.size == 1):
            return DONE
        dtype, isz = sendbuf.dtype, sendbuf.dtype.itemsize
        rop = self._reduce_op(op, dtype) if op is not None else None
        family = "bcast" if op_name == "bcast" else op_name
        sp = sendbuf.data.ptr
        rp = recvbuf.data.ptr if recvbuf is not None and recvbuf.size else 0
        for start, count in self._chunks(n, isz, _pipe_chunk(op_name, self.size, self.cap)):
            off = start * isz
            aligned = not ((sp + off) & 15 or (rp + off if rp else 0) & 15)
            fn = self._kernel(family, f"mpiml_{op_name}_pipe", dtype, rop, aligned)
            step, grid = _pipe_plan(op_name, count * isz, self.size, self.pipe_blocks, self.pipe_rounds)
            self._launch(fn, grid, sp + off, (rp + off) if rp else 0, count, (step << 4) | root)
        return self._done(op_name)

    def native_scan(self, sendbuf, recvbuf, op):
        if self.multi_node:
            return self._nccl().native_scan(sendbuf, recvbuf, op)
        return self._elementwise("scan", "reduce", "mpiml_scan_oneshot", sendbuf, recvbuf, op, 0)

    def native_exscan(self, sendbuf, recvbuf, op):
        if self.multi_node:
            return self._nccl().native_exscan(sendbuf, recvbuf, op)
        return self._elementwise("exscan", "reduce", "mpiml_scan_oneshot", sendbuf, recvbuf, op, 1)

    def native_allgather(self, sendbuf, recvbuf, algorithm=None):
        if self.multi_node:
            return self._nccl().native_allgather(sendbuf, recvbuf)
        self._check("allgather")
        self._last_op = "allgather"
        n = sendbuf.size
        if n == 0:
            return DONE
        dtype = sendbuf.dtype
        isz = dtype.itemsize
        sp, rp = sendbuf.data.ptr, recvbuf.data.ptr
        if algorithm == "llpush":
            return self._llpush("allgather", sendbuf, recvbuf, None, n)
        if algorithm == "ll" or (algorithm is None and sendbuf.nbytes <= self.ll_max):
            for start, count in self._chunks(n, isz, self.ll_max):
                off = start * isz
                aligned = not ((sp + off) & 7 or (rp + off) & 7 or (n * isz) & 7)
                fn = self._kernel("bcast", "mpiml_allgather_ll", dtype, None, aligned)
                self._launch(fn, _ll_grid(count * isz), sp + off, rp + off, count, n, LL_THREADS)
            return self._done("allgather")
        if algorithm not in (None, "pull", "push"):
            raise ValueError(f"algorithm {algorithm!r} does not apply to allgather on the ipc backend "
                             "(ll, llpush, pull, push)")
        push = algorithm == "push"
        kernel = "mpiml_allgather_push" if push else "mpiml_allgather_pull"
        for start, count in self._chunks(n, isz, self.push_cap if push else None):
            off = start * isz
            aligned = not ((sp + off) & 15 or (rp + off) & 15 or (n * isz) & 15)
            fn = self._kernel("bcast", kernel, dtype, None, aligned)
            self._launch(fn, _grid(-(-count * isz // 16)), sp + off, rp + off, count, n)
        return self._done("allgather")

    def native_reduce_scatter(self, sendbuf, recvbuf, counts, op, algorithm=None):
        if self.multi_node:
            return self._nccl().native_reduce_scatter(sendbuf, recvbuf, counts, op)
        self._check("reduce_scatter")
        self._last_op = "reduce_scatter"
        if sendbuf.size == 0:
            return DONE
        counts = tuple(int(c) for c in counts)
        if algorithm is None:
            algorithm = self._auto_reduce_scatter(counts, sendbuf.dtype.itemsize)
        if not self._reduce_scatter_fits(algorithm, counts, sendbuf.dtype.itemsize):
            # parts larger than one buffer (or one LL slot): NCCL's own reduce-scatter
            return self._nccl().native_reduce_scatter(sendbuf, recvbuf, counts, op)
        sp, rp = sendbuf.data.ptr, (recvbuf.data.ptr if recvbuf.size else 0)
        fn, grid, block = self._reduce_scatter_kernel(algorithm, counts, sendbuf.dtype, op, sp, rp)
        self._launch(fn, grid, sp, rp, sendbuf.size, self._displs_ptr(counts), block)
        return self._done("reduce_scatter")

    def _auto_reduce_scatter(self, counts, itemsize):
        return "ll" if max(counts) * itemsize <= self.ll_max else "oneshot"

    def _reduce_scatter_fits(self, algorithm, counts, itemsize):
        """Whether every part fits one LL slot (ll) or the sources' copies one staging buffer (oneshot, ll128: the
        other ranks' LL128 lines of the part, 120 payload bytes in 128)."""
        if algorithm == "ll":
            return max(counts) * itemsize <= self.ll_max
        if algorithm == "ll128":
            return (self.size - 1) * _ll128_lines(max(counts) * itemsize) * 128 <= self.cap
        if algorithm == "oneshot":
            stride = -(-max(counts) * itemsize // 16)  # packs of the largest part
            return self.size * stride * 16 <= self.cap
        raise ValueError(f"algorithm {algorithm!r} does not apply to reduce_scatter on the ipc backend "
                         "(ll, oneshot, ll128)")

    def _reduce_scatter_kernel(self, algorithm, counts, dtype, op, sp, rp):
        """``(function, grid, block)`` of one reduce-scatter.

        The aligned form only when ``sp``, ``rp`` and every part's start are 8-byte
        (ll, ll128) or 16-byte (oneshot) aligned; with ``rp`` None, the pair
        ``(aligned, unaligned)`` instead of one function (the hot path picks per call).
        """
        mask = 7 if algorithm in ("ll", "ll128") else 15
        key = (algorithm, counts, dtype, op)
        hit = self._rs_kernels.get(key)
        if hit is None:
            isz = dtype.itemsize
            parts_ok = not any(int(d) * isz & mask for d in _displs(counts))
            kernel = f"mpiml_reduce_scatter_{algorithm}"
            rop = self._reduce_op(op, dtype)
            fu = self._kernel("reduce", kernel, dtype, rop, False)
            fa = self._kernel("reduce", kernel, dtype, rop, True) if parts_ok else fu
            if algorithm == "ll":
                grid, block = _ll_grid(max(counts) * isz), LL_THREADS
            elif algorithm == "ll128":  # 8 lanes a line of the largest part
                grid = max(1, min(self.ll128_blocks, -(-8 * _ll128_lines(max(counts) * isz) // LL_THREADS)))
                block = LL_THREADS
            else:
                grid, block = _grid(-(-max(counts) * isz // 16)), THREADS
            hit = self._rs_kernels[key] = (fa, fu, grid, block)
        fa, fu, grid, block = hit
        if rp is None:
            return (fa, fu), grid, block
        return (fu if (sp | rp) & mask else fa), grid, block

    def _displs_ptr(self, counts):
        """Device pointer of the element offsets of ``counts`` (cached per counts; kept while the
        transport lives, since a captured CUDA graph may hold the pointer)."""
        dev = self._displs.get(counts)
        if dev is None:
            dev = self._cupy.asarray(_displs(counts))
            self._displs[counts] = dev
        return dev.data.ptr

    # ops without an IPC kernel: NCCL over the same ranks
    def native_allgatherv(self, sendbuf, recvbuf, counts):
        return self._nccl().native_allgatherv(sendbuf, recvbuf, counts)

    def native_gather(self, sendbuf, recvbuf, root):
        return self._nccl().native_gather(sendbuf, recvbuf, root)

    def native_gatherv(self, sendbuf, recvbuf, counts, root):
        return self._nccl().native_gatherv(sendbuf, recvbuf, counts, root)

    def native_scatter(self, sendbuf, recvbuf, root):
        return self._nccl().native_scatter(sendbuf, recvbuf, root)

    def native_alltoall(self, sendbuf, recvbuf):
        return self._nccl().native_alltoall(sendbuf, recvbuf)

    def isend(self, buf, dest, tag):
        return self._nccl().isend(buf, dest, tag)

    def irecv(self, buf, source, tag):
        return self._nccl().irecv(buf, source, tag)

    _OP_ALGORITHMS = {"allreduce": ("ll", "oneshot", "twoshot", "lltwoshot", "ll128", "pipe"),
                      "reduce": ("ll", "oneshot", "twoshot", "lltwoshot", "llrelay", "ll128", "ll128direct",
                                 "ll128twoshot", "pipe", "llpush"),
                      "scan": ("oneshot",), "exscan": ("oneshot",),
                      "bcast": ("ll", "pull", "twoshot", "lltwoshot", "pipe", "ll128"),
                      "allgather": ("ll", "pull", "push", "llpush"),
                      "reduce_scatter": ("ll", "oneshot", "ll128")}

    def algorithm_names(self, op):
        """The IPC algorithms of ``op`` (what ``mpiml bench comm`` and ``mpiml tune`` time)."""
        names = self._OP_ALGORITHMS.get(op, ())
        return names + ("two_level",) if op == "allreduce" and self.multi_node else names

    def run_algorithm(self, op, name, *args):
        """Run IPC algorithm ``name`` (see the module docstring) for collective ``op``."""
        if name in self._OP_ALGORITHMS.get(op, ()) or (op, name) == ("allreduce", "two_level"):
            if op in ("scan", "exscan"):
                return getattr(self, "native_" + op)(*args)
            return getattr(self, "native_" + op)(*args, algorithm=name)
        raise ValueError(f"algorithm {name!r} does not apply to {op} on the ipc backend "
                         f"(ipc algorithms: {list(IPC_ALGORITHMS)})")

    # ------------------------------------------------------------------ hot path
    def hot_launcher(self, comm, plan, op, name, x, arg):
        """A launcher (see :mod:`mpiml.comm._hotpath`) repeating this call with one kernel, or None.

        For stream-ordered calls (``MPIML_DEVICE_SYNC=0``) that fit in one kernel
        on one node: allreduce (ll, oneshot, twoshot, lltwoshot, ll128, pipe), bcast (ll, pull, twoshot, lltwoshot,
        pipe, ll128), allgather (ll, llpush, pull, push), reduce (ll, oneshot, twoshot, lltwoshot, llrelay, ll128, pipe,
        llpush), reduce_scatter (ll, oneshot).  ``arg`` is the
        reduction, the root, ``(reduction, root)`` or ``(counts, reduction)``.
        Across nodes, the ops that go to NCCL take NCCL's launcher.
        """
        if self.multi_node:
            if op == "allreduce" or self._sync:
                return None
            return self._nccl().hot_launcher(comm, plan, op, "native", x, arg)
        if self._sync or self._err_host is None or not x.size or x.nbytes > self.cap:
            return None
        from .._hotpath import binding, ipc_issue, launcher

        nb, dtype = x.nbytes, x.dtype
        ll_ok = nb <= self.ll_max
        root, red = 0, None
        if op == "allreduce":
            algo = self._auto_allreduce(nb) if name == "native" else name
            red, family, parts = arg, "allreduce", (self.size if algo == "twoshot" else 1)
            if algo not in ("ll", "oneshot", "twoshot", "lltwoshot", "ll128", "pipe"):
                return None
        elif op in ("bcast", "allgather"):
            algo = ("ll" if ll_ok else "pull") if name == "native" else name
            family, parts = "bcast", (self.size if algo == "twoshot" else 1)
            root = int(arg) if op == "bcast" else 0
            if algo not in (("ll", "pull", "twoshot", "lltwoshot", "pipe", "ll128") if op == "bcast" else
                            ("ll", "pull", "push", "llpush")):
                return None
        elif op == "reduce":
            algo = ("ll" if ll_ok else "oneshot") if name == "native" else name
            (red, root), family, parts = arg, "reduce", (self.size if algo == "twoshot" else 1)
            if algo not in ("ll", "oneshot", "twoshot", "lltwoshot", "llrelay", "ll128", "ll128direct", "ll128twoshot",
                            "pipe", "llpush"):
                return None
        elif op == "reduce_scatter" and name in ("native", "ll", "oneshot", "ll128"):
            counts, red = arg
            counts = tuple(int(c) for c in counts)
            algo = self._auto_reduce_scatter(counts, dtype.itemsize) if name == "native" else name
            if not self._reduce_scatter_fits(algo, counts, dtype.itemsize):
                return None
            (fa, fu), grid, block = self._reduce_scatter_kernel(algo, counts, dtype, red, 0, None)
            rows = counts[self.rank] // (x.size // x.shape[0])  # (x has rows: the communicator made it 1-d+)
            issue = ipc_issue(self, op, x, fa, fu, grid, block, 7 if algo in ("ll", "ll128") else 15,
                              self._displs_ptr(counts))
            bind = binding(op, x, rank=self.rank, size=self.size, rows=rows)
            return launcher(comm, self, plan, op, bind, issue, self._err_code)
        else:
            return None
        if algo in ("ll", "llpush") and not ll_ok or algo == "twoshot" and nb > self.twoshot_cap or \
                algo == "push" and nb > self.push_cap:
            return None
        kernel, tag = f"mpiml_{op}_{algo}", 0
        if algo == "llpush":  # (a family of its own: small_push.cu)
            rop = self._reduce_op(red, dtype) if red is not None else None
            fa, fu = (_push_kernel(kernel, dtype, rop, a) for a in (True, False))
            grid, block, extra = self._llpush_launch(op, nb, x.size if op == "allgather" else root)
            if op == "allgather" and nb & 7:
                fa = fu
            plain, pdl = self._launch_kernel, getattr(self, "_pdl_launch", None)
            if pdl is not None:  # (ipc_issue takes the launch function once, here; graphs of one node keep the plain)
                self._launch_kernel = pdl
            try:
                issue = ipc_issue(self, op, x, fa, fu, grid, block, 7, extra)
            finally:
                self._launch_kernel = plain
            bind = binding(op, x, rank=self.rank, size=self.size, root=root)
            return launcher(comm, self, plan, op, bind, issue, self._err_code)
        if algo in ("lltwoshot", "llrelay", "ll128", "ll128direct", "ll128twoshot"):
            if self.size == 1:  # (a bcast among one rank: the full path)
                return None
            kernel, launch_plan, tag = self._lltwoshot_variant(op, algo)  # (not `plan`: the call's, for the launcher)
            chunk, grid = launch_plan(nb)
            if nb > chunk:  # (several launches: the full path)
                return None
            block, mask = LL_THREADS, 7
        elif algo == "ll":
            grid, block, mask = _ll_grid(nb), LL_THREADS, 7
        elif algo == "pipe":
            if nb > _pipe_chunk(op, self.size, self.cap) or self.size == 1:  # (several launches, or one rank)
                return None
            step, grid = _pipe_plan(op, nb, self.size, self.pipe_blocks, self.pipe_rounds)
            block, mask = THREADS, 15
        else:
            grid, block, mask = _grid(-(-(-(-nb // 16)) // parts)), THREADS, 15
        rop = self._reduce_op(red, dtype) if red is not None else None
        fa = self._kernel(family, kernel, dtype, rop, True)
        fu = self._kernel(family, kernel, dtype, rop, False)
        extra = (step << 4) | root if algo == "pipe" else tag | root
        if op == "allgather":
            extra = x.size  # the row stride of the result, in elements
            if nb & mask:
                fa = fu
        issue = ipc_issue(self, op, x, fa, fu, grid, block, mask, extra)
        bind = binding(op, x, rank=self.rank, size=self.size, root=root)
        return launcher(comm, self, plan, op, bind, issue, self._err_code)

    def one_node_graph(self, fn, grid, block, words):
        """A graph of one launch of kernel ``fn`` with argument ``words`` (five 64-bit words), or None.

        Its ``launch(stream)`` replays the launch: one ``cudaGraphLaunch``, which costs the host less
        than the ``cuLaunchKernel`` it replaces (1.4 against 3.2 us with the stream held by a busy
        kernel, 2.5 against 4.5 us in an eager loop; key ``relay_run_2345`` of
        ``benchmarks/results/vs_nccl_4xh100.json``).  The kernel takes its call number and flags from
        the workspace when it runs, as when it is captured into a user's graph, so a replay is the
        same call as a launch.  Captured on a stream of the transport's own in relaxed mode (other
        threads, the watchdog's, go on); at most ``GRAPH_LIMIT`` alive at once; any failure turns
        replays off on this transport (kernel launches from then on).
        """
        if not self._replay or self._graphs[0] >= GRAPH_LIMIT or self._broken is not None:
            return None
        cupy = self._cupy
        try:
            if self._capture_stream is None:
                self._capture_stream = cupy.cuda.Stream(non_blocking=True)
            cs = self._capture_stream
            block_words = (ctypes.c_uint64 * 5)(*words)
            base = ctypes.addressof(block_words)
            argv = (ctypes.c_void_p * 5)(*[base + 8 * i for i in range(5)])
            cs.begin_capture()
            try:
                self._launch_kernel(fn, grid, 1, 1, block, 1, 1, 0, cs.ptr, ctypes.addressof(argv), 0)
            finally:
                graph = cs.end_capture()
        except Exception:  # (no graphs here: kernels are launched as before)
            self._replay = False
            return None
        held = _OneNodeGraph(graph)
        self._graphs[0] += 1
        weakref.finalize(held, _one_graph_gone, self._graphs)
        return held

    # ------------------------------------------------------------------ helpers over other transports
    def _nccl(self):
        if self._fallback is None:
            from .nccl import NCCLTransport

            self._fallback = NCCLTransport(self._world)
        return self._fallback

    def _two_level_allreduce(self, sendbuf, recvbuf, op):
        """Reduce to the node leader over IPC, allreduce among leaders over NCCL, bcast in the node."""
        if self._two_level_parts is None:
            node = self.nodes[self.rank]
            leader = self.nodes.index(node)  # lowest rank of this node
            node_world = self._world.split(node, self.rank)
            lead_world = self._world.split(0 if leader == self.rank else None, self.rank)
            local = IPCTransport(node_world) if node_world.size > 1 else None
            leaders = None
            if lead_world is not None and lead_world.size > 1:
                from .nccl import NCCLTransport

                leaders = NCCLTransport(lead_world)
            self._two_level_parts = (local, leaders)
        local, leaders = self._two_level_parts
        if local is not None:
            local.native_reduce(sendbuf, recvbuf, op, 0)
        elif recvbuf.size:
            recvbuf[...] = sendbuf
        if leaders is not None:
            leaders.native_allreduce(recvbuf, recvbuf, op)
        if local is not None:
            local.native_bcast(recvbuf, 0)
        return DONE
