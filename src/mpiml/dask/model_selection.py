"""Adaptive hyperparameter search over ``partial_fit`` on a Dask cluster.

:class:`HyperbandSearchCV` (Li et al., "Hyperband: a novel bandit-based
approach to hyperparameter optimization", JMLR 2018) and its building block
:class:`SuccessiveHalvingSearchCV`, for any estimator with ``partial_fit`` and
``score`` (mpiml's ``KMeans``, scikit-learn's ``SGDClassifier``, ...).

Each candidate is an ordinary single-process estimator living on one worker
(as in dask-ml: models are spread over the workers, one ``partial_fit`` task
per call, one training block per call); an mpiml estimator runs there with the
size-1 ``self`` communicator. dask-ml's own ``HyperbandSearchCV`` cannot be
used with dask >= 2025: its coroutine calls the blocking ``dask.persist``
inside the client's event loop, which dask now refuses ("Attempting to use an
asynchronous Client in a synchronous context of `dask.compute`",
dask-ml 2025.1.0 with dask 2026.8).

The data: ``X`` and ``y`` are dask arrays (or dataframes); ``test_size`` of
the rows of every block (a seeded draw) are held out. The test set is
gathered on one worker (it must fit there); each training block is used by
``partial_fit`` calls in turn.
"""

from __future__ import annotations

import copy
import math
import time

import numpy as np
from sklearn.base import BaseEstimator, clone

__all__ = ["HyperbandSearchCV", "SuccessiveHalvingSearchCV", "IncrementalSearchCV", "hyperband_brackets"]


# ---------------------------------------------------------------------- tasks (run on workers)
def _with_self_comm(model, call):
    """Run ``call(model)`` with mpiml's size-1 communicator when the model takes one."""
    if "comm" in getattr(model, "__dict__", {}) and model.comm is None:
        from ..comm import get_comm

        model.comm = get_comm("self")
        try:
            return call(model)
        finally:
            model.comm = None
    return call(model)


def _create(estimator, params):
    return clone(estimator).set_params(**params)


def _partial_fit(model, X, y, fit_params):
    model = copy.deepcopy(model)  # the previous call's result stays what it was
    return _with_self_comm(model, lambda m: m.partial_fit(X, y, **fit_params))


def _score(model, X, y, scoring):
    if scoring is None:
        return float(_with_self_comm(model, lambda m: m.score(X, y)))
    from sklearn.metrics import get_scorer

    scorer = get_scorer(scoring)
    return float(_with_self_comm(model, lambda m: scorer(m, X, y)))


def _split_block(block, seed, test_size, test):
    rng = np.random.default_rng(seed)
    mask = rng.random(block.shape[0]) < test_size
    if hasattr(block, "__cuda_array_interface__"):
        import cupy

        mask = cupy.asarray(mask)
    return block[mask] if test else block[~mask]


# ---------------------------------------------------------------------- the schedule
def hyperband_brackets(max_iter, aggressiveness=3):
    """Hyperband's brackets: ``[(s, n_models, first_calls), ...]``, most aggressive first.

    ``s_max = floor(log_eta(max_iter))``; bracket ``s`` starts
    ``ceil((s_max + 1) / (s + 1) * eta**s)`` models with ``max_iter * eta**-s``
    ``partial_fit`` calls each, then keeps the best ``1/eta`` and gives them ``eta``
    times the calls, ``s`` times, so that its last models reach ``max_iter`` calls.
    """
    eta = aggressiveness
    s_max = int(math.floor(math.log(max_iter) / math.log(eta) + 1e-9))
    out = []
    for s in range(s_max, -1, -1):
        n = int(math.ceil((s_max + 1) / (s + 1) * eta ** s))
        r = max(1, int(round(max_iter * eta ** -s)))
        out.append((s, n, r))
    return out


def _halving_rounds(n, r, s, eta, max_iter):
    """``[(models kept, calls each), ...]`` of one successive-halving bracket."""
    rounds = []
    for i in range(s + 1):
        n_i = max(1, int(math.floor(n * eta ** -i)))
        r_i = min(max_iter, max(1, int(round(r * eta ** i))))
        rounds.append((n_i, r_i))
    return rounds


class _Bracket:
    def __init__(self, ident, model_ids, rounds):
        self.ident = ident
        self.alive = list(model_ids)
        self.rounds = rounds
        self.round = 0

    @property
    def done(self):
        return self.round >= len(self.rounds) or not self.alive


# ---------------------------------------------------------------------- the searches
class _AdaptiveSearch(BaseEstimator):
    """Shared machinery: models as futures, training chains, scoring, results."""

    def _brackets(self):
        raise NotImplementedError

    def fit(self, X, y=None, **fit_params):
        """Run the search on dask arrays (or dataframes) ``X`` and ``y``.

        Returns
        -------
        self
        """
        from distributed import default_client, wait
        from sklearn.model_selection import ParameterSampler

        from ._estimator import _align_rows, _as_dask_array

        client = default_client()
        start = time.perf_counter()
        X = _as_dask_array(X, "X")
        y = _align_rows(_as_dask_array(y, "y", rows_only=True), X, "y")
        rng = np.random.RandomState(self.random_state)
        split_seed = int(rng.randint(2**31 - 1))
        brackets = self._brackets()
        n_models = sum(n for _, n, _ in brackets)
        params = list(ParameterSampler(self.parameters, n_models, random_state=rng))
        if len(params) < n_models:  # a small grid: cycle through it
            params = [params[i % len(params)] for i in range(n_models)]

        def split(arr, test):
            if arr is None:
                return None
            seeds = [split_seed + i for i in range(arr.numblocks[0])]
            parts = [arr.blocks[i].map_blocks(_split_block, seeds[i], self.test_size, test, dtype=arr.dtype,
                                              chunks=((np.nan,),) + arr.chunks[1:])
                     for i in range(arr.numblocks[0])]
            import dask.array as da

            return da.concatenate(parts, axis=0, allow_unknown_chunksizes=True)

        X_train, X_test = split(X, False), split(X, True)
        y_train, y_test = split(y, False), split(y, True)
        X_train, y_train = client.persist([X_train, y_train]) if y is not None else (client.persist(X_train), None)
        train_x = _futures_in_order(X_train)
        train_y = None if y is None else _futures_in_order(y_train)
        test_x = client.compute(X_test)
        test_y = None if y is None else client.compute(y_test)

        estimator = self.estimator
        models, calls, history, model_history = {}, {}, [], {}
        ident = 0
        states = []
        for b, (s, n, r) in enumerate(brackets):
            ids = list(range(ident, ident + n))
            ident += n
            for i in ids:
                models[i] = client.submit(_create, estimator, params[i], pure=False)
                calls[i] = 0
                model_history[i] = []
            states.append(_Bracket(b, ids, self._rounds(n, r, s)))

        n_blocks = len(train_x)
        best = None  # (score, -model id, model future at that evaluation)
        while not all(st.done for st in states):
            scores = {}
            for st in states:
                if st.done:
                    continue
                _, target = st.rounds[st.round]
                for i in st.alive:
                    while calls[i] < target:
                        k = calls[i] % n_blocks
                        models[i] = client.submit(_partial_fit, models[i], train_x[k],
                                                  None if train_y is None else train_y[k], fit_params, pure=False)
                        calls[i] += 1
                    scores[i] = client.submit(_score, models[i], test_x, test_y, self.scoring, pure=False)
            wait(list(scores.values()))
            values = dict(zip(scores, client.gather(list(scores.values()))))
            elapsed = time.perf_counter() - start
            for st in states:
                if st.done:
                    continue
                for i in st.alive:
                    record = {"model_id": i, "bracket": st.ident, "params": params[i],
                              "partial_fit_calls": calls[i], "score": values[i], "elapsed_wall_time": elapsed}
                    history.append(record)
                    model_history[i].append(record)
                    if best is None or (values[i], -i) > best[:2]:
                        best = (values[i], -i, models[i])
                st.round += 1
                if not st.done:
                    kept = self._survivors(st, values, model_history)
                    for i in set(st.alive) - set(kept):
                        models.pop(i)  # drops the future: the worker frees the model
                    st.alive = kept

        last = {i: h[-1] for i, h in model_history.items()}
        self.best_index_ = -best[1]
        self.best_params_ = params[self.best_index_]
        self.best_score_ = best[0]
        self.best_estimator_ = best[2].result()
        self.history_ = history
        self.model_history_ = model_history
        self.cv_results_ = {
            "model_id": np.array(sorted(last)),
            "params": [params[i] for i in sorted(last)],
            "test_score": np.array([last[i]["score"] for i in sorted(last)]),
            "partial_fit_calls": np.array([last[i]["partial_fit_calls"] for i in sorted(last)]),
            "bracket": np.array([last[i]["bracket"] for i in sorted(last)]),
        }
        self.metadata_ = {"n_models": n_models, "partial_fit_calls": int(sum(calls.values())),
                          "brackets": [{"bracket": b, "n_models": n, "partial_fit_calls_first": r}
                                       for b, (_, n, r) in enumerate(brackets)],
                          "wall_time": time.perf_counter() - start}
        self.n_blocks_ = n_blocks
        return self

    def _survivors(self, bracket, scores, model_history):
        """Models of ``bracket`` that go on to its next round: the best ones (successive halving)."""
        keep, _ = bracket.rounds[bracket.round]
        return sorted(bracket.alive, key=lambda i: (-scores[i], i))[:keep]

    def predict(self, X):
        """``best_estimator_.predict`` (in this process)."""
        return self.best_estimator_.predict(X)

    def score(self, X, y=None):
        """``best_estimator_.score`` (in this process)."""
        return self.best_estimator_.score(X, y)


def _futures_in_order(arr):
    from distributed import futures_of

    from ._estimator import _row_block_keys

    by_key = {f.key: f for f in futures_of(arr)}
    return [by_key[k] for k in _row_block_keys(arr)]


class HyperbandSearchCV(_AdaptiveSearch):
    """Hyperband over ``partial_fit``: brackets of successive halving, run together.

    Parameters
    ----------
    estimator : estimator with ``partial_fit`` and ``score``
        Cloned for every candidate; an mpiml estimator runs with the size-1
        communicator on the worker that holds it.
    parameters : dict
        Lists of values or scipy.stats distributions, as for
        :class:`sklearn.model_selection.RandomizedSearchCV`.
    max_iter : int, default=81
        ``partial_fit`` calls given to the best models.
    aggressiveness : int, default=3
        ``eta``: each halving keeps ``1/eta`` of the models.
    test_size : float, default=0.15
        Share of every block's rows held out for scoring.
    random_state : int or None, default=None
        Seeds the parameter draws and the split.
    scoring : str or None, default=None
        A scikit-learn scorer name; None uses ``estimator.score``.

    Attributes
    ----------
    best_estimator_, best_params_, best_score_, best_index_
        The best evaluation seen (the model as it was then) and its model id.
    cv_results_ : dict of arrays
        One entry per model, at its last evaluation.
    history_ : list of dict
        Every evaluation: model_id, bracket, params, partial_fit_calls, score, elapsed_wall_time.
    model_history_ : dict
    metadata_ : dict
        n_models, partial_fit_calls, brackets, wall_time.
    """

    def __init__(self, estimator, parameters, *, max_iter=81, aggressiveness=3, test_size=0.15,
                 random_state=None, scoring=None):
        self.estimator = estimator
        self.parameters = parameters
        self.max_iter = max_iter
        self.aggressiveness = aggressiveness
        self.test_size = test_size
        self.random_state = random_state
        self.scoring = scoring

    def _brackets(self):
        if self.max_iter < 1 or self.aggressiveness < 2:
            raise ValueError(f"max_iter must be >= 1 and aggressiveness >= 2; got {self.max_iter} and "
                             f"{self.aggressiveness}")
        return hyperband_brackets(self.max_iter, self.aggressiveness)

    def _rounds(self, n, r, s):
        return _halving_rounds(n, r, s, self.aggressiveness, self.max_iter)


class SuccessiveHalvingSearchCV(HyperbandSearchCV):
    """One bracket of Hyperband: ``n_initial_parameters`` models, halved until ``max_iter`` calls.

    Parameters are those of :class:`HyperbandSearchCV`, plus
    ``n_initial_parameters`` (default 9): the models started; each halving keeps
    ``1/aggressiveness`` of them and multiplies their calls by ``aggressiveness``.
    """

    def __init__(self, estimator, parameters, *, n_initial_parameters=9, max_iter=81, aggressiveness=3,
                 test_size=0.15, random_state=None, scoring=None):
        super().__init__(estimator, parameters, max_iter=max_iter, aggressiveness=aggressiveness,
                         test_size=test_size, random_state=random_state, scoring=scoring)
        self.n_initial_parameters = n_initial_parameters

    def _brackets(self):
        super()._brackets()
        n, eta = self.n_initial_parameters, self.aggressiveness
        s = max(0, int(math.floor(math.log(n) / math.log(eta) + 1e-9)))
        return [(s, n, max(1, int(round(self.max_iter * eta ** -s))))]


class IncrementalSearchCV(_AdaptiveSearch):
    """Passive search: every candidate trained to ``max_iter`` calls, unless it stops improving.

    Parameters
    ----------
    estimator, parameters, test_size, random_state, scoring
        As for :class:`HyperbandSearchCV`.
    n_initial_parameters : int, default=10
        Candidates drawn from ``parameters``.
    max_iter : int, default=100
        Most ``partial_fit`` calls per candidate.
    fits_per_score : int, default=1
        ``partial_fit`` calls between two scorings.
    patience : int or False, default=False
        Stop a candidate whose best score of its last ``patience`` scorings is not
        above its best before them by more than ``tol``.
    tol : float, default=0.001
    """

    def __init__(self, estimator, parameters, *, n_initial_parameters=10, max_iter=100, fits_per_score=1,
                 patience=False, tol=0.001, test_size=0.15, random_state=None, scoring=None):
        self.estimator = estimator
        self.parameters = parameters
        self.n_initial_parameters = n_initial_parameters
        self.max_iter = max_iter
        self.fits_per_score = fits_per_score
        self.patience = patience
        self.tol = tol
        self.test_size = test_size
        self.random_state = random_state
        self.scoring = scoring

    def _brackets(self):
        if self.max_iter < 1 or self.fits_per_score < 1 or self.n_initial_parameters < 1:
            raise ValueError("max_iter, fits_per_score and n_initial_parameters must be >= 1; got "
                             f"{self.max_iter}, {self.fits_per_score}, {self.n_initial_parameters}")
        return [(0, self.n_initial_parameters, self.fits_per_score)]

    def _rounds(self, n, r, s):
        targets = list(range(self.fits_per_score, self.max_iter + 1, self.fits_per_score))
        if not targets or targets[-1] != self.max_iter:
            targets.append(self.max_iter)
        return [(n, t) for t in targets]

    def _survivors(self, bracket, scores, model_history):
        if not self.patience:
            return list(bracket.alive)
        p = int(self.patience)
        kept = []
        for i in bracket.alive:
            seen = [h["score"] for h in model_history[i]]
            if len(seen) <= p or max(seen[-p:]) > max(seen[:-p]) + self.tol:
                kept.append(i)
        return kept
