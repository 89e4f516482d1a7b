"""Pruning of grown trees (host arrays, breadth-first nodes): best-first leaves and cost-complexity.

Both act on the per-tree dicts of the grower (``feature``, ``threshold``,
``left``, ``right``, ``value``, ``n_node_samples``, ``weighted_n_node_samples``,
``impurity``, ``decrease``) and return a tree of the kept nodes, still
breadth-first (the kept nodes in their original order are a breadth-first
order of the pruned tree), with the feature importances recomputed from the
kept splits.  Every rank prunes the same replicated trees the same way.
"""

import heapq

import numpy as np

__all__ = ["prune_best_first", "prune_cost_complexity"]

_NODE_KEYS = ("feature", "threshold", "left", "right", "value", "n_node_samples", "weighted_n_node_samples",
              "impurity", "decrease")


def _keep(tree, kept, leaves, n_features):
    """The tree restricted to the sorted node ids ``kept``; ``leaves`` (bool per node) become leaves."""
    kept = np.asarray(kept, dtype=np.int64)
    new_id = np.full(len(tree["feature"]), -1, dtype=np.int64)
    new_id[kept] = np.arange(len(kept))
    out = {key: np.asarray(tree[key])[kept].copy() for key in _NODE_KEYS + ("missing_left",) if key in tree}
    cut = np.asarray(leaves)[kept]
    inner = ~cut & (out["left"] >= 0)
    out["left"] = np.where(inner, new_id[np.where(inner, out["left"], 0)], -1).astype(np.int32)
    out["right"] = np.where(inner, new_id[np.where(inner, out["right"], 0)], -1).astype(np.int32)
    out["feature"] = np.where(inner, out["feature"], -2).astype(np.int32)
    out["threshold"] = np.where(inner, out["threshold"], -2.0)
    out["decrease"] = np.where(inner, out["decrease"], 0.0)
    if "missing_left" in out:
        out["missing_left"] = np.where(inner, out["missing_left"], 0).astype(np.uint8)
    out["importances"] = np.bincount(out["feature"][inner], weights=out["decrease"][inner],
                                     minlength=n_features).astype(np.float64)
    return out


def prune_best_first(tree, max_leaf_nodes, n_features):
    """scikit-learn's best-first growth with at most ``max_leaf_nodes`` leaves, taken from the full tree.

    Starting from the root, the frontier node with the largest impurity
    decrease is expanded until there are ``max_leaf_nodes`` leaves (ties: the
    lower node id).  A node's split does not depend on the other nodes, so the
    result is the tree scikit-learn's best-first builder grows.
    """
    left, right, dec = tree["left"], tree["right"], tree["decrease"]
    if len(left) == 0:
        return tree
    kept, leaves = [0], np.ones(len(left), dtype=bool)
    heap = [(-dec[0], 0)] if left[0] >= 0 else []
    n_leaves = 1
    while heap and n_leaves < max_leaf_nodes:
        _, node = heapq.heappop(heap)
        leaves[node] = False
        n_leaves += 1
        for child in (int(left[node]), int(right[node])):
            kept.append(child)
            if left[child] >= 0:
                heapq.heappush(heap, (-dec[child], child))
    return _keep(tree, sorted(kept), leaves, n_features)


def prune_cost_complexity(tree, ccp_alpha, n_features):
    """Minimal cost-complexity pruning (scikit-learn's ``ccp_alpha``).

    The risk of a node is ``impurity * weighted_n_node_samples / weighted_n_root``;
    the weakest link (smallest ``(R(node) - R(subtree)) / (leaves(subtree) - 1)``,
    ties to the lower node id) is cut while that value is at most ``ccp_alpha``.
    """
    left, right = np.asarray(tree["left"]), np.asarray(tree["right"])
    n = len(left)
    if n <= 1 or ccp_alpha <= 0:
        return tree
    w = np.asarray(tree["weighted_n_node_samples"], dtype=np.float64)
    risk = np.asarray(tree["impurity"], dtype=np.float64) * w / (w[0] if w[0] > 0 else 1.0)
    leaf = left < 0
    parent = np.full(n, -1, dtype=np.int64)
    inner = np.nonzero(~leaf)[0]
    parent[left[inner]] = inner
    parent[right[inner]] = inner
    alive = np.ones(n, dtype=bool)
    while True:
        # subtree risk and leaf counts, children before parents (breadth-first ids: children are larger)
        sub_risk = np.where(leaf, risk, 0.0)
        sub_leaves = leaf.astype(np.int64)
        for node in range(n - 1, 0, -1):
            if alive[node]:
                p = parent[node]
                sub_risk[p] += sub_risk[node]
                sub_leaves[p] += sub_leaves[node]
        cand = np.nonzero(alive & ~leaf)[0]
        if len(cand) == 0:
            break
        alpha = (risk[cand] - sub_risk[cand]) / (sub_leaves[cand] - 1)
        best = int(np.argmin(alpha))
        if alpha[best] > ccp_alpha:
            break
        node = cand[best]
        leaf[node] = True
        stack = [int(left[node]), int(right[node])]
        while stack:                               # everything below the cut dies
            c = stack.pop()
            alive[c] = False
            if left[c] >= 0:
                stack += [int(left[c]), int(right[c])]
    cut = np.asarray(tree["left"]) >= 0
    cut &= leaf                                   # inner nodes that became leaves
    return _keep(tree, np.nonzero(alive)[0], cut | (np.asarray(tree["left"]) < 0), n_features)
