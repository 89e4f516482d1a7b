"""Threads per rank (mpiml.utils._threads) under real mpiexec at 1-4 ranks.

The multi-rank checks run as cases of one launch per rank count (``tests/_spmd_cases.py``; they were 14
launches): the forest-first "kernels" case first, where Numba is not yet imported, then the others,
each undoing the limit of the one before (``threads_spmd_script.forget_earlier_limit``).
"""

import os

import pytest

from _spmd_cases import CaseLaunches

SCRIPT = os.path.join(os.path.dirname(__file__), "threads_spmd_script.py")
#: Every variable by which a user chooses the count, blanked (run_mpi sets two of them to 1).
UNSET = {"OMP_NUM_THREADS": "", "MKL_NUM_THREADS": "", "OPENBLAS_NUM_THREADS": "", "SLURM_CPUS_PER_TASK": "",
         "NUMBA_THREADING_LAYER": "", "NUMBA_NUM_THREADS": ""}
#: The same for a case of a launch under way: Numba's variables stay (its pool is launched by then).
USER_UNSET = {k: v for k, v in UNSET.items() if not k.startswith("NUMBA_")}
MODES = ("kernels", "init", "estimator")   # "kernels" first: the first import of Numba in the launch


def _cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _cases():
    cases = {}
    for n in (1, 2, 3, 4):
        want = max(1, _cores() // n)
        cases[n] = [{"name": mode, "script": SCRIPT, "args": [mode, want, 1, want], "env": USER_UNSET}
                    for mode in MODES]
        if n in (1, 2):
            # the user's count, even above cores / ranks, is left to the libraries: nothing is limited
            threads = str(_cores() + 1)
            cases[n].append({"name": "user", "script": SCRIPT, "args": ["init", threads, 0, -1],
                             "env": dict(USER_UNSET, OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads)})
        if n == 2:
            cases[n].append({"name": "slurm", "script": SCRIPT, "args": ["estimator", 2, 1, 2],
                             "env": dict(USER_UNSET, SLURM_CPUS_PER_TASK="2")})
    for n_cases in cases.values():
        for case in n_cases:
            case["args"] = [str(a) for a in case["args"]]
    return cases


@pytest.fixture(scope="module")
def launches(tmp_path_factory):
    return CaseLaunches(_cases(), tmp_path_factory, timeout=300, env=UNSET)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("mode", MODES)
def test_limit_is_cores_over_ranks(launches, n, mode):
    launches.verdict(n, mode)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [1, 2])
def test_user_variable_wins(launches, n):
    launches.verdict(n, "user")


@pytest.mark.mpi
def test_slurm_cpus_per_task_is_applied(launches):
    launches.verdict(2, "slurm")


def test_one_blas_thread_is_a_context():
    # kernels that call BLAS from their own threads hold BLAS to one thread, and give the pool back after
    from threadpoolctl import threadpool_info

    from mpiml.utils._threads import one_blas_thread

    def blas():
        return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]

    before = blas()
    with one_blas_thread():
        assert set(blas()) <= {1}
    assert blas() == before


@pytest.mark.parametrize("preset", [None, "20"])
def test_import_makes_idle_openblas_threads_sleep(preset):
    # set before NumPy loads OpenBLAS (which reads it once); a user's value is kept
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if preset:
        env["OPENBLAS_THREAD_TIMEOUT"] = preset
    code = ("import sys; import mpiml, os; "
            "print(os.environ['OPENBLAS_THREAD_TIMEOUT'], 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=True).stdout.split()
    assert out == [preset or "4", "True"]


def test_child_env_drops_only_what_the_limit_set(monkeypatch):
    # launchers (mpiml run, mpiml bench) give their ranks the environment without this process's own limit,
    # which the ranks would otherwise read as the user's choice; the user's variables stay
    from mpiml.utils import _threads

    monkeypatch.setattr(_threads, "_OURS", {})
    for name in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "3")
    _threads._put_env("NUMBA_NUM_THREADS", "8")
    _threads._put_env("MKL_NUM_THREADS", "8")        # the user's 3 is kept, and is not ours
    env = _threads.child_env()
    assert os.environ["NUMBA_NUM_THREADS"] == "8" and "NUMBA_NUM_THREADS" not in env
    assert env["MKL_NUM_THREADS"] == "3"


def test_one_blas_thread_nests():
    # a fit holds BLAS at one thread around its iterations; the steps' own contexts inside change nothing
    from threadpoolctl import threadpool_info

    from mpiml.utils._threads import one_blas_thread

    def blas():
        return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]

    before = blas()
    with one_blas_thread():
        with one_blas_thread():
            assert set(blas()) <= {1}
        assert set(blas()) <= {1}  # the inner exit restores nothing
    assert blas() == before


def test_placement_gives_each_rank_its_block_of_physical_cores():
    # rank i of R takes the i-th R-th of the cores, all their hardware threads; 4 cores of 2 hardware threads
    from mpiml.utils._placement import plan

    cores = [[c, c + 4] for c in range(4)]
    node = [list(range(8))] * 2
    assert plan(1, 2, node, cores=cores, setting="auto")[0] == [2, 3, 6, 7]
    assert plan(0, 2, node, cores=cores, setting="auto")[0] == [0, 1, 4, 5]
    # three ranks on four cores: blocks of 1, 1, 2 cores, together every core once
    blocks = [plan(i, 3, [list(range(8))] * 3, cores=cores, setting="auto")[0] for i in range(3)]
    assert sorted(c for b in blocks for c in b) == list(range(8))
    # Slurm's --cpus-per-task: blocks of that many CPUs, physical cores first in the order of the cores
    assert plan(1, 2, node, cores=cores, cpus_per_task=2, setting="auto")[0] == [1, 5]


def test_placement_leaves_bound_or_crowded_ranks_alone():
    from mpiml.utils._placement import plan

    cores = [[c] for c in range(4)]
    every = [list(range(4))] * 2
    assert plan(0, 2, every, cores=cores, setting="none") == (None, "not pinned (MPIML_BIND=none)")
    cpus, why = plan(0, 1, [list(range(4))], cores=cores, setting="auto")
    assert cpus is None and "one rank" in why
    cpus, why = plan(0, 2, [[0, 1], [2, 3]], cores=cores, setting="auto")   # the launcher bound them
    assert cpus is None and "bound by the launcher" in why
    cpus, why = plan(0, 8, [list(range(4))] * 8, cores=cores, setting="auto")   # more ranks than cores
    assert cpus is None and "8 ranks on 4" in why
    cpus, why = plan(0, 2, every, cores=cores, threads=3, setting="auto")   # the user's threads exceed the block
    assert cpus is None and "3 threads" in why
    # a job confined by taskset (every rank the same smaller set) is split within it
    assert plan(1, 2, [[2, 3]] * 2, cores=[[2], [3]], setting="auto")[0] == [3]


def test_node_cores_orders_by_memory_domain(monkeypatch):
    # cores are grouped by hardware threads and ordered NUMA node first: CPUs numbered across two nodes
    # alternately (0, 2, 4, ... on node 0) still give each half of the ranks one node
    from mpiml.utils import _placement

    numa = {c: c % 2 for c in range(8)}
    monkeypatch.setattr(_placement, "_numa_of", lambda: numa)
    monkeypatch.setattr(_placement, "_last_level_cache", lambda c: (3, c % 2))
    monkeypatch.setattr(_placement, "_read", lambda path: None)
    cores = _placement.node_cores(list(range(8)))
    assert cores == [[0], [2], [4], [6], [1], [3], [5], [7]]
    assert _placement.plan(1, 2, [list(range(8))] * 2, cores=cores, setting="auto")[0] == [1, 3, 5, 7]


def test_node_cores_covers_this_machine():
    from mpiml.utils import _placement

    cpus = sorted(os.sched_getaffinity(0))
    groups = _placement.node_cores(cpus)
    assert sorted(c for g in groups for c in g) == cpus
    assert _placement.cpu_list(_placement.format_cpus([0, 1, 2, 5, 7, 8])) == [0, 1, 2, 5, 7, 8]
    assert _placement.format_cpus([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


def test_waits_spin_with_a_core_each_and_nap_briefly_where_ranks_outnumber_cores():
    from mpiml.comm import _request
    from mpiml.utils import _threads

    before = _request._DEFAULT_SPIN[0], *_request._NAP
    try:
        assert _threads._set_wait_spin(2, 2) == 50.0          # a core each: spin 50 ms, then naps up to 200 us
        assert (_request._DEFAULT_SPIN[0], _request._NAP) == (0.05, [_request._MAX_SLEEP, 0.0])
        assert _threads._set_wait_spin(4, 2) == 0.0           # 4 ranks on 2 cores: no spin, 20 us naps for 2 ms
        assert (_request._DEFAULT_SPIN[0], _request._NAP) == (0.0, [2e-4, 2e-3])
        # a wait still completes (and still times out) under the no-spin policy
        calls = []
        _request.poll_until(lambda: calls.append(1) or len(calls) > 3, op="test", peer=0, timeout=5)
        assert len(calls) == 4
        with pytest.raises(Exception, match="test"):
            _request.poll_until(lambda: False, op="test", peer=0, timeout=0.01)
    finally:
        _request.set_default_spin(*before)
