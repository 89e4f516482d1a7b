"""Threads per rank: each CPU rank uses its share of the node's cores, not all of them.

Every BLAS / OpenMP pool (and Numba's) starts with one thread per core.  With R ranks on
one node that is R x cores threads fighting over the cores: two ranks ran slower than one.
Here, once per process (at :func:`mpiml.init` or when an estimator first validates its
data, whichever comes first), the pools of this rank are limited through
``threadpoolctl`` to

    threads = max(1, cores of the node // ranks on the node)

unless the user chose: ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS`` or ``OPENBLAS_NUM_THREADS``
set (the libraries read them; nothing is changed), or Slurm's ``SLURM_CPUS_PER_TASK``
(``--cpus-per-task``), which is applied as the limit.

Ranks on the node: at :func:`mpiml.init` (called by every rank) an MPI shared-memory
split of the world (``MPI.COMM_TYPE_SHARED``, one cheap collective); at an estimator's
first use, whose communicator may be a part of the world, the launcher's count (Open MPI,
MPICH's Hydra, MVAPICH set one: no communication), else the split of that communicator.  Cores are this process's affinity set (``os.sched_getaffinity``); after a split,
the union of the node's ranks' sets (a launcher that binds each rank to its own cores
leaves each rank its own set).

Placement (``MPIML_BIND=auto``; off by default, see :data:`mpiml.utils._placement.DEFAULT`): a CPU rank that the launcher left unbound
pins every thread it has, and those it starts later, to its own block of the node's physical cores
(all their hardware threads; cores ordered by NUMA node and last-level cache): local rank ``i`` of
``R`` takes the ``i``-th ``R``-th of the cores, as ``mpirun --bind-to core --map-by slot:PE=...``
would.  A binding by the launcher or Slurm is kept; see :mod:`mpiml.utils._placement` for the rules.
``thread_info()["placement"]`` says what was done and why, ``["bound_to"]`` lists the CPUs.  With
``MPIML_BIND`` unset, unbound ranks that outnumber the node's physical cores are pinned round robin, rank
``i`` on core ``i % C``, but for the ``R % C`` last ones, which take ``C / (R % C)`` threads over every core
(:func:`_round_robin`).

Idle BLAS threads: OpenBLAS's workers spin for ``2**OPENBLAS_THREAD_TIMEOUT`` cycles after every
call (default 2**28, about 0.1 s) before they sleep, so between BLAS calls (a logistic loss's
element-wise work, the optimiser's steps) they hold the cores the calling thread needs: a
LogisticRegression fit of one rank of 2 threads on 2 cores took 0.33 s (0.64 CPU-s) against
0.11 s (0.13 CPU-s) when they sleep at once.  OpenBLAS reads the variable once, when it loads, so
``import mpiml`` sets ``OPENBLAS_THREAD_TIMEOUT=4`` (unless set) before it imports NumPy; the ranks
that ``mpiml run`` and ``mpiml bench`` launch inherit it.  A script that imports NumPy before mpiml
keeps the spinning unless it sets the variable itself.
"""

import os
import sys
import threading

__all__ = ["limit_threads", "thread_info", "one_blas_thread", "child_env", "one_node_comm", "node_workers",
           "quota_cpus", "USER_VARS"]

#: Variables by which a user sets the thread count themselves; their value wins.
USER_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
#: Launchers' count of the ranks of this node (no communication needed).
_LOCAL_SIZE_VARS = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE",
                    "PMI_LOCAL_SIZE")

_STATE = {}  # once set: threads, ranks_on_node, cores, source (a sentence), applied (bool)
_LIMITER = []  # the threadpool_limits object (kept so the limit is not garbage collected)
_CONTROLLER = []  # a threadpoolctl ThreadpoolController, made once (finding the libraries costs milliseconds)
_OURS = {}  # variables this module put in os.environ (name -> value), which are not the user's choice
_TLS = threading.local()  # one_blas: this thread is inside one_blas_thread()
_NODE = {}  # id of an mpi4py communicator -> (the communicator, whether its ranks share one node)
_SHAPE = []  # the node's shape found by limit_threads (for a placement decided later)
_WORKERS = {}  # id of an mpi4py communicator of one node -> (the communicator, how many of its ranks compute)


def _put_env(name, value):
    """``os.environ[name] = value`` unless set; remembered as ours (see :func:`child_env`)."""
    if not os.environ.get(name):
        os.environ[name] = value
        _OURS[name] = value


def child_env(env=None):
    """``env`` (default ``os.environ``) without the thread variables this process set for itself: processes
    it launches (the ranks of ``mpiml run`` and ``mpiml bench``) choose their own share, and would take
    this process's for the user's."""
    env = dict(os.environ if env is None else env)
    for name, value in _OURS.items():
        if env.get(name) == value:
            del env[name]
    return env


def _affinity():
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS, Windows
        return list(range(os.cpu_count() or 1))


def quota_cpus(root="/sys/fs/cgroup", proc="/proc/self/cgroup"):
    """The CPUs this process's cgroup CPU quota allows (the quota over its period, rounded up), or None where there
    is none (or it cannot be read).  cgroup v2 (``cpu.max``: ``"max 100000"`` or ``"200000 100000"``) and v1
    (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, -1: none), at the process's own cgroup and every one above it
    (a container's limit usually sits at its root): the smallest.  A container limited to 2 CPUs of a 64-core host
    still sees 64 cores in its affinity set; sharing those 64 out would start 32 times the threads it can run."""
    try:
        with open(proc) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    best = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        controllers, path = parts[1].split(","), parts[2].strip("/")
        if parts[1] == "":
            base, names = root, ("cpu.max",)
        elif "cpu" in controllers:
            base = os.path.join(root, parts[1]) if os.path.isdir(os.path.join(root, parts[1])) else \
                os.path.join(root, "cpu")
            names = ("cpu.cfs_quota_us", "cpu.cfs_period_us")
        else:
            continue
        steps = path.split("/") if path else []
        for depth in range(len(steps), -1, -1):
            here = os.path.join(base, *steps[:depth])
            cpus = _read_quota(here, names)
            if cpus is not None:
                best = cpus if best is None else min(best, cpus)
    return best


def _read_quota(here, names):
    import math

    try:
        if len(names) == 1:
            with open(os.path.join(here, names[0])) as f:
                quota, _, period = f.read().strip().partition(" ")
        else:
            with open(os.path.join(here, names[0])) as f:
                quota = f.read().strip()
            with open(os.path.join(here, names[1])) as f:
                period = f.read().strip()
        if quota in ("max", "-1") or not period:
            return None
        q, p = int(quota), int(period)
    except (OSError, ValueError):
        return None
    return max(1, math.ceil(q / p)) if q > 0 and p > 0 else None


def _user_setting():
    """``(threads, "NAME=value")`` when the user chose a thread count, else ``(None, None)``."""
    for var in USER_VARS:
        value = os.environ.get(var, "").strip()
        if value:
            first = value.split(",")[0]  # OpenMP accepts a list per nesting level
            return (int(first) if first.isdigit() and int(first) > 0 else None), f"{var}={value}"
    value = os.environ.get("SLURM_CPUS_PER_TASK", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value), f"SLURM_CPUS_PER_TASK={value}"
    return None, None


def _raw_mpi(comm):
    """The mpi4py communicator under ``comm``, or None (size-1 or non-MPI communicator)."""
    if comm is None:
        from ..comm import launched_by_mpi

        if not launched_by_mpi():
            return None
        from ..comm.backends.mpi import mpi_module

        return mpi_module().COMM_WORLD
    if comm.size == 1:
        return None
    return getattr(getattr(comm, "_world", None), "comm", None)


#: Launchers' index of this rank among the node's ranks.
_LOCAL_RANK_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK", "PMI_LOCAL_RANK")


def _local_rank(raw):
    """This rank's index among the node's ranks: the launcher's, else the shared-memory split of ``raw``."""
    for var in _LOCAL_RANK_VARS:
        value = os.environ.get(var, "")
        if value.isdigit():
            return int(value)
    if raw is None:
        return 0
    from ..comm.backends.mpi import mpi_module

    node = raw.Split_type(mpi_module().COMM_TYPE_SHARED)
    try:
        return node.Get_rank()
    finally:
        node.Free()


def _node_shape(comm):
    """``{"ranks", "cores", "how", "local_rank", "sets"}``: the ranks on this node, the cores of the node for
    them, how that was learnt, this rank's index among them and every node rank's affinity set (None when
    only this rank's is known).

    The world (``comm=None``, called by every rank from :func:`mpiml.init`): the
    shared-memory split.  An estimator's communicator (perhaps a part of the world):
    the launcher's count first, the split of that communicator where there is none.
    """
    mine = _affinity()
    raw = _raw_mpi(comm)
    for var in _LOCAL_SIZE_VARS if comm is not None or raw is None else ():
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return {"ranks": int(value), "cores": len(mine), "how": var, "local_rank": _local_rank(None),
                    "sets": None}
    if raw is None:
        return {"ranks": 1, "cores": len(mine), "how": "one process", "local_rank": 0, "sets": [mine]}
    from ..comm.backends.mpi import mpi_module

    MPI = mpi_module()
    node = raw.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        sets, local = node.allgather(mine), node.Get_rank()
    finally:
        node.Free()
    union = set().union(*map(set, sets))
    return {"ranks": len(sets), "cores": len(union), "how": "MPI shared-memory split", "local_rank": local,
            "sets": sets}


def _place(shape, threads):
    """Pin this rank to its block of the node's cores where the launcher left it unbound
    (:mod:`mpiml.utils._placement`); returns ``(CPUs or None, sentence)``."""
    from . import _placement

    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "").strip()
    try:
        cpus, why = _round_robin(shape, threads, _placement) if not os.environ.get("MPIML_BIND", "").strip() \
            else (None, None)
        if why is None:
            cpus, why = _placement.plan(shape["local_rank"], shape["ranks"], shape["sets"], threads=threads,
                                        cpus_per_task=int(slurm) if slurm.isdigit() else None)
    except (OSError, ValueError) as exc:  # an unreadable /sys: leave the rank as it is
        return None, f"not pinned ({type(exc).__name__}: {exc})"
    if cpus is not None and not _placement.pin(cpus):
        return None, "not pinned (sched_setaffinity refused)"
    return cpus, why


def _leftover(shape, cores):
    """Whether this rank is one of the ``R % C`` ranks beyond the last whole multiple of the node's ``C`` cores
    (rank 2 of 3 on 2 cores), where the ranks outnumber the cores: see :func:`_round_robin`."""
    ranks = shape["ranks"]
    return ranks > cores > 0 and ranks % cores and shape["local_rank"] >= ranks - ranks % cores


def _round_robin(shape, threads, placement):
    """``(CPUs, sentence)`` where the node's unbound ranks outnumber its physical cores: local rank ``i`` on core
    ``i % C`` (all its hardware threads), else ``(None, None)`` (the placement's rules decide).

    Four unbound ranks of one thread on 2 cores: at every sum of their partial results (a LogisticRegression fit
    makes 22) the ranks that arrive first sleep, and the last one's wake-up puts them back where the scheduler
    finds room, three on one core at times, until its balancing moves one (every few ms): each step then took
    as long as three ranks' shares on one core.  Pinned two a core, each core runs its two ranks' shares in every
    step: 0.33 s against 0.40 s a fit, medians of 7 fits, two alternating rounds (2-core VM, 4e5 x 64).  Rank
    ``i`` on core ``i % C`` puts the ranks that compute where the others wait (``node_workers``: ranks
    ``0 .. C - 1``; the forest's growers, the k-means and k-NN steps in node memory) on cores of their own.
    Where the ranks are no whole multiple of the cores, the ``R % C`` ranks beyond the last multiple (rank 2 of
    3 on 2 cores) stay unpinned with ``C / (R % C)`` threads each (:func:`_leftover`, in :func:`limit_threads`),
    whose parts their threads share: every core then runs one pinned rank's share and an equal part of the
    leftover rank's, where 3 ranks pinned round robin ran two shares on one core and one on the other (no faster
    than unpinned: 0.43-0.45 s both).  ``MPIML_BIND`` set (``none``, ``auto``): the user's rule instead.

    (A gate that let only ``C`` ranks compute at once, a futex semaphore in node memory taken for a quarter of a
    pass at a time, was slower on the 2-core VM: 0.53-0.63 s against 0.41-0.49 at 4 ranks; every hand-over
    waits for a wake-up, 0.2-0.3 ms each there.)"""
    ranks, sets = shape["ranks"], shape["sets"]
    if ranks <= 1 or threads is None or not hasattr(os, "sched_setaffinity"):
        return None, None
    if sets is None:
        common = _affinity()
        if set(common) != set(placement.online_cpus()):
            return None, None                  # bound by the launcher (only this rank's set is known)
    elif any(set(x) != set(sets[0]) for x in sets):
        return None, None
    else:
        common = sorted(sets[0])
    cores = placement.node_cores(common)
    C, i = len(cores), shape["local_rank"]
    if ranks <= C or (quota_cpus() or C) < C:
        return None, None
    if _leftover(shape, C):
        return None, (f"not pinned: local rank {i} of {ranks}, beyond the last whole multiple of the node's {C} "
                      f"cores ({threads} threads over them)")
    if threads > len(cores[0]):
        return None, None
    mine = cores[i % C]
    return sorted(mine), (f"pinned to CPUs {placement.format_cpus(mine)}: local rank {i} of {ranks} on core {i % C} "
                          f"of the node's {C} (more ranks than cores: round robin)")


def _set_numba_threads(n):
    """Numba's threads: this rank's share, on the workqueue layer (before anything launches a layer).

    The pool itself is sized to the share (``NUMBA_NUM_THREADS``, read when Numba is imported), not only
    the count in use: the workqueue layer starts every parallel region with a task on *every* thread of
    its pool (it synchronises their per-thread counts), so a pool of all the node's cores in each of R
    ranks woke R x cores threads at every kernel launch (8 ranks x 64 on a 64-core host; 64 threads a
    rank on 2 cores under ``taskset``).  The user's ``NUMBA_NUM_THREADS`` wins.
    """
    numba = sys.modules.get("numba")
    if numba is None:
        # whoever imports Numba later (a kernel module, or a library) reads the layer and the pool's size
        # from here; the user's choice (the variable set) wins
        _put_env("NUMBA_THREADING_LAYER", "workqueue")
        if n is not None:
            _put_env("NUMBA_NUM_THREADS", str(max(1, int(n))))
        return
    if not os.environ.get("NUMBA_THREADING_LAYER"):
        # A rank alternates BLAS products and Numba loops; OpenMP's threads spin between parallel
        # regions and took the cores from BLAS (measured: a KMeans fit of one rank of 2 threads 4x
        # slower in wall time, 3x more CPU time than on the workqueue layer, whose threads sleep)
        numba.config.THREADING_LAYER = "workqueue"
    if n is None:
        return
    try:
        numba.set_num_threads(max(1, min(int(n), int(numba.config.NUMBA_NUM_THREADS))))
    except Exception:  # a threading layer that cannot change its count: leave it as it is
        pass


def limit_threads(comm=None, place=True):
    """Limit this rank's thread pools once per process; return :func:`thread_info`.

    Parameters
    ----------
    comm : Communicator, default=None
        Whose ranks share the node when the launcher does not say; None: the world (when
        launched by MPI).  Without launcher variables this is a collective of ``comm``.
    place : bool, default=True
        Pin a CPU rank to its block of cores (:mod:`mpiml.utils._placement`), now or, when a
        call before said False, at this call.  False: not yet (:func:`mpiml.init` before it
        knows whether the rank drives a GPU; a GPU rank's threads stay free).

    Returns
    -------
    info : dict
        ``threads`` (per rank), ``ranks_on_node``, ``cores``, ``source`` (why this count),
        ``applied`` (False when the user's variables decide), ``local_rank``, ``placement`` (where
        the rank's threads run, and why) and, when pinned, ``bound_to`` (the CPUs).
    """
    if _STATE:
        if place and _STATE.get("placement") is None:
            _apply_placement()
        return dict(_STATE)
    user, var = _user_setting()
    shape = _node_shape(comm)
    ranks, cores, how = shape["ranks"], shape["cores"], shape["how"]
    quota = quota_cpus()
    if quota is not None and quota < cores:
        cores, how = quota, f"{how}; the cgroup's CPU quota"
    if var is not None and not var.startswith("SLURM"):
        threads, applied, source = user, False, f"set by the user ({var})"
    elif var is not None:
        threads, applied, source = user, True, f"set by Slurm ({var})"
    else:
        threads, applied = max(1, cores // ranks), True
        source = f"{cores} core(s) / {ranks} rank(s) on the node ({how})"
        if _leftover(shape, cores) and quota is None and not os.environ.get("MPIML_BIND", "").strip():
            threads = cores // (ranks % cores)
            source += f"; a rank beyond the last whole multiple of the cores: {threads} threads over them"
    if applied:
        try:
            from threadpoolctl import threadpool_limits

            _LIMITER.append(threadpool_limits(limits=threads))
        except ImportError:  # threadpoolctl comes with scikit-learn; without it, the pools stay as they are
            applied = False
            source += "; threadpoolctl is not installed, pools not limited"
        for v in USER_VARS:  # for libraries loaded later (OpenMP runtimes read it when they start)
            _put_env(v, str(threads))
    _set_numba_threads(threads)
    _STATE.update(threads=threads, ranks_on_node=ranks, cores=cores, source=source, applied=applied,
                  wait_spin_ms=_set_wait_spin(ranks, cores), placement=None, local_rank=shape["local_rank"])
    _SHAPE[:] = [shape]
    from ..comm import _profile

    _profile.set_context(cpu_threads=f"{threads} ({source})")
    if place:
        _apply_placement()
    return dict(_STATE)


def _apply_placement():
    """Pin this CPU rank (once) with the node's shape found by :func:`limit_threads`."""
    bound, placement = _place(_SHAPE[0], _STATE["threads"])
    _STATE["placement"] = placement
    if bound:
        _STATE["bound_to"] = bound
    from ..comm import _profile

    _profile.set_context(cpu_placement=placement)


def note_gpu_rank():
    """This rank drives a GPU (:func:`mpiml.init`): its threads are not pinned (said by the placement)."""
    if _STATE and _STATE.get("placement") is None:
        _STATE["placement"] = "not pinned (a GPU rank)"
        from ..comm import _profile

        _profile.set_context(cpu_placement=_STATE["placement"])


#: How long a rank with a core of its own spins in a wait before sleeping (see _set_wait_spin).
_OWN_CORE_SPIN = 0.05
#: Where ranks outnumber the node's cores a wait does not spin: it naps 20 us between polls for its first
#: _SHARED_CORE_SHORT seconds, then naps doubling up to _SHARED_CORE_NAP.
_SHARED_CORE_SHORT = 2e-3
_SHARED_CORE_NAP = 2e-4


def _set_wait_spin(ranks, cores):
    """The spin of this rank's waits (:func:`mpiml.comm._request.set_default_spin`), in ms.

    A waiting rank's own threads are idle, so where every rank has a core of the node to itself it
    spins up to 50 ms (longer than a k-means step's skew between ranks) instead of 1 ms: a rank asleep
    (20-200 us a nap, plus the kernel's timer slack) delayed each of the six rounds of a binomial
    allreduce of 8 ranks that passed through it.

    Where ranks outnumber cores (4 ranks on 2 cores) a waiting rank does not spin at all: it naps 20 us
    between polls for 2 ms, then naps doubling up to 200 us.  Its spin (1 ms before, yielding the core at
    each turn) held a core that a rank still computing needed whenever the scheduler put the two on
    different cores, and the naps that followed grew to 200 us at once, each holding up the rounds of a
    collective that pass through the napping rank: 4 ranks on the 2-core VM took 0.2-2.0 ms an allreduce of
    8 doubles from one minute to the next with the spin, 0.43-0.50 ms with 20 us naps at once (1.5 against
    0.34 ms at 3 ranks).  20 us naps for long cost 15 % of a core a waiting rank (5 % at 200 us), hence the
    doubling after 2 ms.  Fits alternating the two policies in one run (benchmarks/ml/wait_policy.py, keys
    ``wait*`` of benchmarks/results/ml_cpu_vm.json): KMeans 245 -> 189, 114 -> 98 ms at 4 ranks, 184 -> 147 at 3,
    the other estimators within the VM's noise, with less or equal CPU time.
    """
    from ..comm import _request

    if cores // max(1, ranks) >= 1:
        _request.set_default_spin(_OWN_CORE_SPIN)
        return 1e3 * _OWN_CORE_SPIN
    _request.set_default_spin(0.0, nap=_SHARED_CORE_NAP, short=_SHARED_CORE_SHORT)
    return 0.0  # (MPIML_SPIN_US, when set, still wins in every wait)


def thread_info():
    """The limit chosen by :func:`limit_threads` (``{}`` before it ran), plus the pools seen now."""
    out = dict(_STATE)
    if out:
        out["openblas_thread_timeout"] = os.environ.get("OPENBLAS_THREAD_TIMEOUT")
        try:
            from threadpoolctl import threadpool_info

            out["pools"] = [f"{p.get('internal_api')}:{p.get('num_threads')}" for p in threadpool_info()]
        except ImportError:
            out["pools"] = []
    return out


def numba_threads():
    """Threads a Numba kernel of this rank should use: the limit, else Numba's own count."""
    return _STATE.get("threads")


def one_blas_thread():
    """A context in which BLAS calls run on the calling thread alone.

    For compiled kernels whose own threads (this rank's share) each call BLAS on their block:
    BLAS's pool would otherwise start its threads inside every one of them.  Entering it costs
    tens of microseconds (threadpoolctl reads and sets every BLAS library's count, and restores
    it after), so a caller that runs many kernels (a fit's iterations) enters it once around them:
    inside one, another costs nothing.  Without threadpoolctl it changes nothing.
    """
    import contextlib

    if getattr(_TLS, "one_blas", False):
        return contextlib.nullcontext()
    if not _CONTROLLER:
        try:
            from threadpoolctl import ThreadpoolController

            _CONTROLLER.append(ThreadpoolController())
        except ImportError:
            _CONTROLLER.append(None)
    if _CONTROLLER[0] is None:
        return contextlib.nullcontext()
    return _one_blas(_CONTROLLER[0])


def _one_blas(controller):
    import contextlib

    @contextlib.contextmanager
    def held():
        _TLS.one_blas = True
        try:
            with controller.limit(limits=1, user_api="blas"):
                yield
        finally:
            _TLS.one_blas = False

    return held()


def one_node_comm(comm):
    """The mpi4py communicator under ``comm`` when all its ranks share one node, else None (one rank, not MPI, or
    ranks on several nodes).  A collective the first time per communicator (a shared-memory split); used by the
    CPU paths that share node memory between ranks (the k-NN search)."""
    raw = getattr(getattr(comm, "_world", None), "comm", None)
    if raw is None or comm.size == 1:
        return None
    try:
        if raw.Get_size() != comm.size or raw.Get_rank() != comm.rank:
            return None
    except Exception:  # not an mpi4py communicator
        return None
    known = _NODE.get(id(raw))
    if known is None or known[0] is not raw:
        from ..comm.backends.mpi import mpi_module

        node = raw.Split_type(mpi_module().COMM_TYPE_SHARED)
        try:
            together = node.Get_size() == raw.Get_size()
        finally:
            node.Free()
        known = _NODE[id(raw)] = (raw, together)
    return raw if known[1] else None


def node_workers(comm, raw):
    """How many of ``comm``'s ranks (all on one node, ``raw`` its mpi4py communicator) put threads into work they
    share in node memory (the k-means step over the node's rows, the k-NN search): ranks ``0 .. n - 1``.

    One rank a core of the node for them at most: where ranks outnumber the cores they may run on (4 ranks on 2
    cores, unbound), a rank beyond the cores only waits (asleep) while the others' threads take its share of the
    parts, since every thread that takes a part while another thread holds its core holds up the step's end
    until the scheduler gives its core back (4 ranks' threads on 2 cores searched the k-NN blocks in 0.19 s where
    2 ranks' took 0.11).  The node's cores: the union of its ranks' affinity sets (ranks a launcher bound to cores
    of their own all compute), within the cgroup's CPU quota (:func:`quota_cpus`).  ``MPIML_OVERSUBSCRIBED=compute``:
    every rank computes (the behaviour before; A/B runs).  Collective over ``raw`` the first time per communicator
    (an allgather of the affinity sets); the same answer on every rank."""
    if os.environ.get("MPIML_OVERSUBSCRIBED", "").strip().lower() == "compute":
        return comm.size
    known = _WORKERS.get(id(raw))
    if known is None or known[0] is not raw:
        sets = raw.allgather(_affinity())
        cores = len(set().union(*map(set, sets)))
        quota = quota_cpus()
        if quota is not None:
            cores = min(cores, quota)
        known = _WORKERS[id(raw)] = (raw, int(max(1, min(comm.size, cores))))
    return known[1]


def not_one_node(raw):
    """Remember that ``raw``'s ranks cannot open a shared window (agreed by them): :func:`one_node_comm` then
    returns None for it."""
    _NODE[id(raw)] = (raw, False)
