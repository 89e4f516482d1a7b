"""Progress of the long parts of ``mpiml run``: trees grown, query blocks searched, with what remains.

Rank 0 prints; every rank takes the same steps (each step is collective), so the step
counts are agreed before the first one.
"""

import time

import numpy as np

__all__ = ["Progress", "fit_forest_in_batches", "blocked_knn_accuracy", "scale_hint", "prepare_cpu_kernels"]


def prepare_cpu_kernels(fit_small, comm, say):
    """Rank 0 alone fits a small sample (``fit_small()``, on its own communicator) before the timed fit, the
    others waiting: the first run on a machine compiles the estimator's CPU kernels there (Numba, 10-20 s
    for a forest on 2 cores) with a line saying so, instead of every rank compiling the same kernels at
    once inside the fit with nothing shown; then the other ranks fit it too, loading the kernels from the
    cache (a fraction of a second, which a fit of milliseconds would otherwise include).
    Returns the seconds it took."""
    t0 = time.perf_counter()
    if comm.rank == 0:
        say("CPU kernels: loading (compiled on the first run on this machine, then cached) ...")
        fit_small()
    if comm.size > 1:
        comm.barrier()
        if comm.rank != 0:   # the others load them from the cache now, not inside the timed fit (~0.5-1 s a rank)
            fit_small()
        comm.barrier()
    seconds = time.perf_counter() - t0
    say(f"CPU kernels ready in {seconds:.1f} s")
    return seconds


class Progress:
    """``done/total what, elapsed, about N s left`` lines at most every ``every`` seconds (and at the end)."""

    def __init__(self, total, what, say, every=1.0):
        self.total, self.what, self.say, self.every = int(total), what, say, every
        self.t0 = self.last = time.perf_counter()

    def step(self, done):
        now = time.perf_counter()
        if done < self.total and now - self.last < self.every:
            return
        self.last = now
        elapsed = now - self.t0
        left = elapsed / max(done, 1) * (self.total - done)
        tail = f", about {left:.1f} s left" if done < self.total else ""
        self.say(f"  {done}/{self.total} {self.what}, {elapsed:.1f} s{tail}")


def fit_forest_in_batches(est, X, y, say, batches=5):
    """Grow ``est.n_estimators`` trees in up to ``batches`` warm-started fits, a line after each.

    The trees are the ones a single fit grows (each tree's randomness is keyed by its
    ``random_state``, the tree's draw of the forest's ``random_state`` stream, which a warm
    start continues); only the features' bins are computed again per batch.
    """
    total = int(est.n_estimators)
    sizes = np.diff(np.linspace(0, total, min(batches, total) + 1).round().astype(int))
    progress = Progress(total, "trees grown", say, every=0.0)
    grown = 0
    warm = est.warm_start
    try:
        for size in sizes:
            grown += int(size)
            est.set_params(n_estimators=grown, warm_start=grown > sizes[0])
            est.fit(X, y)
            progress.step(grown)
    finally:
        est.set_params(n_estimators=total, warm_start=warm)
    return est


def blocked_knn_accuracy(est, X, y, comm, say, block_rows=2048):
    """Global accuracy of ``est.predict`` on every rank's rows, searched in query blocks with progress.

    Every rank runs the same number of blocks (the largest rank's), a rank short of rows
    passing empty ones: each search is collective (the index travels around the ring).
    """
    n_local = int(X.shape[0])
    blocks = max(1, -(-n_local // block_rows))
    blocks = int(comm.allreduce_obj(blocks, op="max")) if comm.size > 1 else blocks
    progress = Progress(blocks, "query blocks searched", say)
    correct = 0
    for b in range(blocks):
        lo, hi = min(n_local, b * block_rows), min(n_local, (b + 1) * block_rows)
        pred = est.predict(X[lo:hi])
        correct += int((pred == y[lo:hi]).sum())
        progress.step(b + 1)
    total = comm.allreduce_obj(correct) if comm.size > 1 else correct
    n = comm.allreduce_obj(n_local) if comm.size > 1 else n_local
    return total / max(n, 1)


def scale_hint(command, data_kind, n, seconds, exponent, ranks):
    """How to scale the run up, with the time the same machine would take (``time ~ n^exponent``)."""
    bigger = n * 10
    guess = seconds * 10 ** exponent
    return (f"to scale up: --data {data_kind}:n={bigger} (about {guess:.0f} s on these {ranks} rank(s)"
            f"{'; the search grows as n^2' if exponent == 2 else ''}), more ranks with --np N "
            f"(mpiexec -n N python -m mpiml run {command} ... on a cluster), GPUs with --device gpu")
