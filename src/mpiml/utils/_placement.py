"""Where a CPU rank runs: its own block of the node's cores when the launcher left it unbound.

``mpirun --bind-to none`` (how mpiml's own commands and most users launch CPU ranks) leaves every
rank free to run on every core, and each rank's threads then wander over the whole node: a thread
moved to another core leaves its private caches behind, two ranks' threads meet on one core while
another idles, and on a machine of several NUMA nodes or last-level caches a rank's threads read
rows that live in another node's memory.  Once per process (:func:`mpiml.init`, or an estimator's
first use), :mod:`mpiml.utils._threads` asks :func:`plan` for this rank's CPUs and pins every thread
of the rank to them (those started later inherit the set):

* the node's CPUs are grouped by physical core (a core's hardware threads together) and the cores
  ordered by NUMA node, then last-level cache, then package, then number, so that a contiguous run
  of cores is one memory domain and one cache wherever the counts allow;
* rank ``i`` of the ``R`` ranks on the node takes cores ``[i C / R, (i + 1) C / R)`` of the ``C``
  cores that the node's ranks may use (their common affinity set: a job confined by ``taskset`` or
  a cgroup is split within its CPUs), with all their hardware threads (its threads fill the
  physical cores first: the kernel's scheduler places a thread on an idle core before a busy
  core's sibling); Slurm's ``--cpus-per-task`` (``SLURM_CPUS_PER_TASK``), when the blocks fit,
  makes each block that many CPUs;
* this block pinning is opt-in (``MPIML_BIND=auto``; :data:`DEFAULT`); nothing is pinned when the launcher (or
  Slurm) bound the ranks already (their affinity sets differ), or for one rank alone.  Where unbound ranks
  outnumber the physical cores and ``MPIML_BIND`` is unset, :func:`mpiml.utils._threads._round_robin` pins them
  round robin instead (rank ``i`` on core ``i % C``; the ranks beyond the last whole multiple of the cores stay
  unpinned): there this rule's blocks would be fractions of a core.

Data follow the threads that first write them (Linux's first-touch policy): rows made or loaded
after the pinning live in the rank's NUMA node.  :func:`mpiml.init` pins before any data exist;
data made before it stay where they were written.
"""

import os

__all__ = ["online_cpus", "cpu_list", "format_cpus", "node_cores", "plan", "pin", "describe_topology"]

_SYS = "/sys/devices/system"
#: ``MPIML_BIND`` when unset: "auto" pins where the rules allow, "none" pins nothing.  Off by default: on 2 quiet
#: cores of the 64-core host, 2 ranks of one thread pinned a core each took 0.142 s (KMeans) and 0.206 s (k-NN)
#: against 0.088 s and 0.142 s unpinned in the same run (key ``kmeans_knn_0540`` of
#: benchmarks/results/ml_cpu_2core_4xh100.json): a rank's main thread, which waits for its kernels' threads,
#: then shares their cores.
DEFAULT = "none"


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def cpu_list(text):
    """``"0-3,8,10-11"`` -> ``[0, 1, 2, 3, 8, 10, 11]`` (the kernel's list format)."""
    out = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def format_cpus(cpus):
    """``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``."""
    cpus, runs = sorted(cpus), []
    for c in cpus:
        if runs and c == runs[-1][1] + 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)


def online_cpus():
    """The node's online CPUs (``/sys``), else ``range(os.cpu_count())``."""
    cpus = cpu_list(_read(f"{_SYS}/cpu/online"))
    return cpus or list(range(os.cpu_count() or 1))


def _numa_of():
    """CPU -> NUMA node (empty where ``/sys`` has no nodes)."""
    out = {}
    try:
        names = os.listdir(f"{_SYS}/node")
    except OSError:
        return out
    for name in names:
        if name.startswith("node") and name[4:].isdigit():
            for c in cpu_list(_read(f"{_SYS}/node/{name}/cpulist")):
                out[c] = int(name[4:])
    return out


def _last_level_cache(cpu):
    """``(level, the first CPU sharing it)`` of ``cpu``'s last-level cache, or ``(0, 0)``."""
    best = (0, 0)
    base = f"{_SYS}/cpu/cpu{cpu}/cache"
    try:
        names = os.listdir(base)
    except OSError:
        return best
    for name in names:
        if not name.startswith("index"):
            continue
        level, kind = _read(f"{base}/{name}/level"), _read(f"{base}/{name}/type")
        shared = cpu_list(_read(f"{base}/{name}/shared_cpu_list"))
        if level and level.isdigit() and kind in ("Unified", "Data") and shared and int(level) >= best[0]:
            best = (int(level), min(shared))
    return best


def node_cores(cpus):
    """``cpus`` grouped by physical core (its hardware threads together, ascending), the cores ordered by
    NUMA node, last-level cache, package and first CPU; each CPU its own core where ``/sys`` says nothing."""
    numa = _numa_of()
    groups = {}
    for c in cpus:
        sib = _read(f"{_SYS}/cpu/cpu{c}/topology/thread_siblings_list")
        groups.setdefault(sib or str(c), []).append(c)

    def key(core):
        first = min(core)
        package = _read(f"{_SYS}/cpu/cpu{first}/topology/physical_package_id")
        return (numa.get(first, 0), _last_level_cache(first)[1], int(package) if package and package.lstrip("-").isdigit()
                else 0, first)

    return [sorted(g) for g in sorted(groups.values(), key=key)]


def plan(local_rank, local_size, sets, *, threads=None, cores=None, cpus_per_task=None, setting=None):
    """This rank's CPUs, or None, and why: ``(cpus or None, sentence)``.

    Parameters
    ----------
    local_rank, local_size : int
        This rank's index among the node's ranks, and their number.
    sets : list of list of int, or None
        Every node rank's affinity set (from the node's shared-memory split), or None when only this
        rank's is known (then its set must be the whole node to count as unbound).
    threads : int, default=None
        The rank's thread count: a block smaller than it is not pinned (a user's count above the
        rank's share keeps the scheduler's spreading).
    cores : list of list of int, default=None
        :func:`node_cores` of the common set (read from ``/sys`` when None).
    cpus_per_task : int, default=None
        Slurm's ``--cpus-per-task``: each block that many CPUs where ``local_size`` of them fit.
    setting : str, default=None
        ``MPIML_BIND`` (read from the environment when None): ``none`` (also ``0``, ``off``, ``no``)
        pins nothing; anything else (``auto``, ``core``) pins where the rules allow.
    """
    given = os.environ.get("MPIML_BIND", "").strip() if setting is None else setting
    setting = (given or DEFAULT).strip().lower()
    if setting in ("none", "0", "off", "no", "false"):
        return None, f"not pinned (MPIML_BIND={setting})" if given else "not pinned (the default; MPIML_BIND=auto pins)"
    if local_size <= 1:
        return None, "not pinned (one rank on the node)"
    if sets is None:
        mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        if set(mine) != set(online_cpus()):
            return None, f"not pinned (bound by the launcher: CPUs {format_cpus(mine)})"
        common = mine
    else:
        if any(set(s) != set(sets[0]) for s in sets):
            return None, "not pinned (bound by the launcher: the node's ranks have different CPU sets)"
        common = sorted(sets[0])
    if not hasattr(os, "sched_setaffinity"):
        return None, "not pinned (this system cannot set a thread's CPUs)"
    if cores is None:
        cores = node_cores(common)
    if local_size > len(cores):
        return None, f"not pinned ({local_size} ranks on {len(cores)} physical core(s): the scheduler shares them)"
    i, R, C = local_rank, local_size, len(cores)
    flat = [c for core in cores for c in core]
    if cpus_per_task and cpus_per_task * R <= len(flat):
        mine = flat[i * cpus_per_task:(i + 1) * cpus_per_task]
        how = f"block {i} of {cpus_per_task} CPUs (SLURM_CPUS_PER_TASK)"
    else:
        mine = [c for core in cores[i * C // R:(i + 1) * C // R] for c in core]
        how = f"cores {i * C // R}-{(i + 1) * C // R - 1} of the node's {C}"
    if threads and threads > len(mine):
        return None, f"not pinned ({threads} threads a rank, more than the {len(mine)} CPUs of its share)"
    return sorted(mine), f"pinned to CPUs {format_cpus(mine)}: local rank {i} of {R}, {how}"


def pin(cpus):
    """Pin every thread of this process to ``cpus`` (threads started later inherit the set); False when the
    calling thread could not be pinned."""
    tids = os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else []
    for tid in tids:
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:   # a thread that ended meanwhile
            pass
    try:
        os.sched_setaffinity(0, cpus)
    except OSError:
        return False
    return True


def describe_topology():
    """What ``/sys`` says of this node: CPUs, physical cores, hardware threads a core, NUMA nodes, last-level
    caches (their count and size) -- for ``mpiml info`` and the benchmarks' records."""
    cpus = online_cpus()
    cores = node_cores(cpus)
    numa = _numa_of()
    llc = {_last_level_cache(c) for c in cpus}
    size = None
    for name in sorted(os.listdir(f"{_SYS}/cpu/cpu{cpus[0]}/cache")) if os.path.isdir(
            f"{_SYS}/cpu/cpu{cpus[0]}/cache") else []:
        if _read(f"{_SYS}/cpu/cpu{cpus[0]}/cache/{name}/level") == str(max(l for l, _ in llc)):
            size = _read(f"{_SYS}/cpu/cpu{cpus[0]}/cache/{name}/size")
    return {"cpus": len(cpus), "cores": len(cores), "threads_per_core": max(len(c) for c in cores),
            "numa_nodes": len(set(numa.values())) or 1, "llc": {"level": max(l for l, _ in llc), "count": len(llc),
                                                                 "size": size}}
