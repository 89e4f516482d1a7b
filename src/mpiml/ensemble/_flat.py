"""Forests as flat arrays, and prediction by walking every tree at once.

A fitted forest keeps its trees concatenated: node ``i`` of tree ``t`` is row
``tree_offsets_[t] + i`` of ``tree_feature_``, ``tree_threshold_``,
``tree_children_left_``, ``tree_children_right_`` and ``tree_value_``.
Children are numbered inside their tree; a leaf has feature -2 and children -1
(scikit-learn's ``tree_`` conventions).  A row goes left when
``x[feature] <= threshold``.

:func:`apply_forest` walks all trees for a block of rows together with array
operations (NumPy or CuPy): one gather per level of the deepest tree.
"""

import numpy as np

__all__ = ["pack_trees", "apply_forest", "TREE_ARRAYS"]

#: The per-node arrays of a fitted forest: (attribute suffix, dtype).
TREE_ARRAYS = (("feature", np.int32), ("threshold", np.float64), ("children_left", np.int32),
               ("children_right", np.int32), ("value", np.float64), ("n_node_samples", np.int64),
               ("weighted_n_node_samples", np.float64), ("impurity", np.float64), ("missing_left", np.uint8))

_KEYS = {"children_left": "left", "children_right": "right"}

#: Rows x trees walked together (bounds the temporaries of prediction).
WALK_ELEMENTS = 1 << 22


def pack_trees(trees, n_values):
    """Concatenate per-tree dicts (from the grower) into flat arrays plus ``offsets``."""
    counts = [len(t["feature"]) for t in trees]
    offsets = np.zeros(len(trees) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(counts)
    out = {"offsets": offsets}
    for name, dtype in TREE_ARRAYS:
        key = _KEYS.get(name, name)
        # trees grown without missing values may lack the missing_left flags: all 0 (missing values go right)
        parts = [np.asarray(t[key] if key in t else np.zeros(len(t["feature"])), dtype=dtype) for t in trees]
        if name == "value":
            parts = [p.reshape(-1, n_values) for p in parts]
            out[name] = _joined(parts) if parts else np.zeros((0, n_values))
        else:
            out[name] = _joined(parts) if parts else np.zeros(0, dtype=dtype)
    return out


def _address(a):
    return a.__array_interface__["data"][0]


def _joined(parts):
    """``np.concatenate(parts)``; without a copy when the parts already lie back to back, in order, in one
    C-contiguous array (the trees of a tree-parallel fit are views of the gathered forest arrays: 270 MB for
    128 full-depth trees of 2e5 rows, written once more on every rank)."""
    base = parts[0].base
    if (len(parts) > 1 and isinstance(base, np.ndarray) and base.flags.c_contiguous and base.dtype == parts[0].dtype
            and all(p.base is base and p.flags.c_contiguous and p.shape[1:] == parts[0].shape[1:] for p in parts)):
        at = _address(parts[0])
        for p in parts:
            if _address(p) != at:
                break
            at += p.nbytes
        else:
            first = (_address(parts[0]) - _address(base)) // base.itemsize
            n = sum(p.size for p in parts)
            return base.reshape(-1)[first:first + n].reshape((-1,) + parts[0].shape[1:])
    return np.concatenate(parts)


def apply_forest(X, feature, threshold, left, right, offsets, xp, missing_left=None):
    """Global node index of the leaf reached by every row in every tree.

    Parameters
    ----------
    X : ndarray of shape (n, n_features)
    feature, threshold, left, right : ndarrays of shape (n_nodes,)
        Flat tree arrays on ``X``'s namespace (children tree-local).
    offsets : ndarray of shape (n_trees + 1,)
    xp : module
    missing_left : ndarray of shape (n_nodes,), default=None
        1 where a split sends missing values (NaN) left; None: every NaN goes right.

    Returns
    -------
    ndarray of shape (n, n_trees), int64
        Indices into the flat node arrays.
    """
    n = X.shape[0]
    offsets_h = np.asarray(offsets.get() if hasattr(offsets, "get") else offsets, dtype=np.int64)
    T = offsets_h.shape[0] - 1
    roots = xp.asarray(offsets_h[:-1])
    base = xp.asarray(np.repeat(offsets_h[:-1], np.diff(offsets_h)))
    gleft = xp.where(left >= 0, left.astype(xp.int64) + base, -1)
    gright = xp.where(right >= 0, right.astype(xp.int64) + base, -1)
    out = xp.empty((n, T), dtype=xp.int64)
    step = max(1, WALK_ELEMENTS // max(T, 1))
    for a in range(0, n, step):
        Xc = X[a:a + step]
        m = Xc.shape[0]
        node = xp.broadcast_to(roots, (m, T)).copy()
        rows = xp.arange(m, dtype=xp.int64)[:, None]
        while True:
            f = feature[node]
            inner = f >= 0
            if not bool(inner.any()):
                break
            x = Xc[rows, xp.where(inner, f, 0)]
            go = x <= threshold[node]
            if missing_left is not None:
                go |= xp.isnan(x) & (missing_left[node] == 1)
            nxt = xp.where(go, gleft[node], gright[node])
            node = xp.where(inner, nxt, node)
        out[a:a + m] = node
    return out
