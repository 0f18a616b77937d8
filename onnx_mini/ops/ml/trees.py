"""Tree ensembles (ai.onnx.ml): TreeEnsembleRegressor 1/3/5, TreeEnsembleClassifier 1/3/5, TreeEnsemble 5.

Every layout is compiled in the factory into one `Forest` (forest.py: the spec's test and aggregation,
and the algorithms evaluating them): per-node numpy arrays over all trees (feature, threshold, mode, both
children, NaN direction), leaves pointing at themselves, and the leaves' weights per target. This module
reads the attributes: the (tree id, node id) layout of the legacy operators, TreeEnsemble-5's
node/leaf arrays, base values, class labels and the post transform, all checked once here.
"""
from __future__ import annotations

import numpy as np

from ...registry import kernel
from ._common import ROW_SCORES, binary_scores, class_labels, features_2d, label_picker, row_top_softmax
from ._common import transform_name
from ._common import post_transform as apply_transform
from .forest import AGGREGATES, LEAF, MEMBER, MODE_NAMES, Forest

ML = "ai.onnx.ml"


def _same_length(what: dict) -> int:
    lengths = {k: len(v) for k, v in what.items() if v is not None}
    if len(set(lengths.values())) > 1:
        raise ValueError("attributes must have the same length: " + ", ".join(f"{k}={n}" for k, n in lengths.items()))
    return next(iter(lengths.values()), 0)


def _floats(values, tensor):
    """The double tensor variant of an attribute when given, else the float list (None when neither)."""
    if tensor is not None:
        return np.asarray(tensor, np.float64).reshape(-1)
    if values is not None:
        return np.asarray(values, np.float64)
    return None


class _NodeIndex:
    """Positions of (tree id, node id) pairs, looked up many at a time (sorted keys + searchsorted)."""

    def __init__(self, treeids: np.ndarray, nodeids: np.ndarray):
        self.trees, tree_code = np.unique(treeids, return_inverse=True)
        self.low = int(nodeids.min()) if nodeids.size else 0
        self.span = (int(nodeids.max()) - self.low + 1) if nodeids.size else 1
        keys = tree_code.astype(np.int64) * self.span + (nodeids - self.low)
        self.order = np.argsort(keys, kind="stable")
        self.keys = keys[self.order]
        dup = np.nonzero(self.keys[1:] == self.keys[:-1])[0]
        if dup.size:
            i = int(self.order[dup[0] + 1])
            raise ValueError(f"node (tree {treeids[i]}, id {nodeids[i]}) is defined twice")

    def find(self, treeids: np.ndarray, nodeids: np.ndarray) -> np.ndarray:
        """Position of each pair, -1 where no node has it."""
        t = np.minimum(np.searchsorted(self.trees, treeids), max(self.trees.size - 1, 0))
        ok = (self.trees.size > 0) & (self.trees[t] == treeids) & (nodeids >= self.low) & \
            (nodeids < self.low + self.span)
        keys = t.astype(np.int64) * self.span + (nodeids - self.low)
        at = np.minimum(np.searchsorted(self.keys, keys), max(self.keys.size - 1, 0))
        ok &= (self.keys.size > 0) & (self.keys[at] == keys)
        return np.where(ok, self.order[at] if self.keys.size else 0, -1)


def _legacy_forest(*, treeids, nodeids, featureids, modes, values, truenodeids, falsenodeids, tracks,
                   w_treeids, w_nodeids, w_ids, w_weights, n_targets, prefix) -> Forest:
    """The (tree id, node id) layout of TreeEnsembleRegressor / TreeEnsembleClassifier."""
    for name, v in (("nodes_treeids", treeids), ("nodes_nodeids", nodeids), ("nodes_modes", modes)):
        if v is None:
            raise ValueError(f"attribute {name} is required")
    n = _same_length({"nodes_treeids": treeids, "nodes_nodeids": nodeids, "nodes_featureids": featureids,
                      "nodes_modes": modes, "nodes_values": values, "nodes_truenodeids": truenodeids,
                      "nodes_falsenodeids": falsenodeids, "nodes_missing_value_tracks_true": tracks or None})
    _same_length({f"{prefix}_treeids": w_treeids, f"{prefix}_nodeids": w_nodeids,
                  f"{prefix}_ids": w_ids, f"{prefix}_weights": w_weights})
    codes = {name: k for k, name in enumerate(MODE_NAMES) if k != MEMBER}
    unknown = sorted(set(modes) - set(codes))
    if unknown:
        raise ValueError(f"nodes_modes must be among {', '.join(codes)}, got {unknown}")
    mode = np.fromiter(map(codes.__getitem__, modes), np.int8, len(modes)).reshape(n)
    interior = mode != LEAF
    for name, v in (("nodes_featureids", featureids), ("nodes_values", values),
                    ("nodes_truenodeids", truenodeids), ("nodes_falsenodeids", falsenodeids)):
        if v is None and interior.any():
            raise ValueError(f"attribute {name} is required for branch nodes")
    trees, nodes = np.asarray(treeids, np.int64), np.asarray(nodeids, np.int64)
    index = _NodeIndex(trees, nodes)

    def children(ids, side):
        ids = np.asarray(ids if ids is not None else [0] * n, np.int64)
        pos = index.find(trees, ids)
        bad = np.nonzero(interior & (pos < 0))[0]
        if bad.size:
            i = int(bad[0])
            raise ValueError(f"node (tree {trees[i]}, id {nodes[i]}) has {side} child id {ids[i]}, "
                             f"which tree {trees[i]} does not define")
        return np.where(interior, pos, np.arange(n))

    _, first = np.unique(trees, return_index=True)
    roots = np.sort(first)                      # each tree's first node, in order of appearance
    weights = np.zeros((n, n_targets), np.float64)
    has = np.zeros((n, n_targets), bool)
    w_trees, w_nodes = np.asarray(w_treeids, np.int64), np.asarray(w_nodeids, np.int64)
    w_ids, w_weights = np.asarray(w_ids, np.int64), np.asarray(w_weights, np.float64)
    at = index.find(w_trees, w_nodes)
    if (at < 0).any():
        j = int(np.nonzero(at < 0)[0][0])
        raise ValueError(f"{prefix}_nodeids[{j}] refers to node (tree {w_trees[j]}, id {w_nodes[j]}), "
                         "which is not defined")
    if w_ids.size and (w_ids.min() < 0 or w_ids.max() >= n_targets):
        j = int(np.nonzero((w_ids < 0) | (w_ids >= n_targets))[0][0])
        raise ValueError(f"{prefix}_ids[{j}] = {w_ids[j]} is out of range [0, {n_targets})")
    np.add.at(weights, (at, w_ids), w_weights)
    has[at, w_ids] = True
    return Forest(featureids if featureids is not None else [0] * n,
                  values if values is not None else np.zeros(n), mode, children(truenodeids, "true"),
                  children(falsenodeids, "false"), tracks if tracks else [0] * n, roots, weights, has)


def _base(base, k: int) -> np.ndarray:
    if base is None or len(base) == 0:
        return np.zeros(k, np.float64)
    if len(base) != k:
        raise ValueError(f"base_values has {len(base)} values, expected {k} (one per target or class)")
    return np.asarray(base, np.float64)


def _regressor(forest: Forest, how: str, base: np.ndarray, transform: str, out_dtype=np.float32):
    def run(x):
        scores = forest.scores(features_2d(x), how)
        scores += base
        return apply_transform(transform, scores).astype(out_dtype)
    return run


# -- TreeEnsembleRegressor -------------------------------------------------------------------------

def _tree_regressor(*, aggregate_function, base_values, n_targets, nodes_falsenodeids, nodes_featureids,
                    nodes_missing_value_tracks_true, nodes_modes, nodes_nodeids, nodes_treeids,
                    nodes_truenodeids, nodes_values, post_transform, target_ids, target_nodeids,
                    target_treeids, target_weights):
    if aggregate_function not in AGGREGATES:
        raise ValueError(f"aggregate_function must be one of {', '.join(AGGREGATES)}, got {aggregate_function!r}")
    transform = transform_name(post_transform)
    if n_targets is None:
        n_targets = max(target_ids) + 1 if target_ids else 1
    if n_targets < 1:
        raise ValueError(f"n_targets must be positive, got {n_targets}")
    forest = _legacy_forest(treeids=nodes_treeids, nodeids=nodes_nodeids, featureids=nodes_featureids,
                            modes=nodes_modes, values=nodes_values, truenodeids=nodes_truenodeids,
                            falsenodeids=nodes_falsenodeids, tracks=nodes_missing_value_tracks_true,
                            w_treeids=target_treeids or [], w_nodeids=target_nodeids or [],
                            w_ids=target_ids or [], w_weights=target_weights if target_weights is not None else [],
                            n_targets=n_targets, prefix="target")
    return _regressor(forest, aggregate_function, _base(base_values, n_targets), transform)


@kernel("TreeEnsembleRegressor", since=1, domain=ML)
def tree_ensemble_regressor_1(*, aggregate_function="SUM", base_values=None, n_targets=None,
                              nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                              nodes_missing_value_tracks_true=None, nodes_modes=None, nodes_nodeids=None,
                              nodes_treeids=None, nodes_truenodeids=None, nodes_values=None,
                              post_transform="NONE", target_ids=None, target_nodeids=None, target_treeids=None,
                              target_weights=None):
    return _tree_regressor(
        aggregate_function=aggregate_function, base_values=base_values, n_targets=n_targets,
        nodes_falsenodeids=nodes_falsenodeids, nodes_featureids=nodes_featureids,
        nodes_missing_value_tracks_true=nodes_missing_value_tracks_true, nodes_modes=nodes_modes,
        nodes_nodeids=nodes_nodeids, nodes_treeids=nodes_treeids, nodes_truenodeids=nodes_truenodeids,
        nodes_values=nodes_values, post_transform=post_transform, target_ids=target_ids,
        target_nodeids=target_nodeids, target_treeids=target_treeids, target_weights=target_weights)


@kernel("TreeEnsembleRegressor", since=(3, 5), domain=ML)
def tree_ensemble_regressor_3(*, aggregate_function="SUM", base_values=None, base_values_as_tensor=None,
                              n_targets=None, nodes_falsenodeids=None, nodes_featureids=None,
                              nodes_hitrates=None, nodes_hitrates_as_tensor=None,
                              nodes_missing_value_tracks_true=None, nodes_modes=None, nodes_nodeids=None,
                              nodes_treeids=None, nodes_truenodeids=None, nodes_values=None,
                              nodes_values_as_tensor=None, post_transform="NONE", target_ids=None,
                              target_nodeids=None, target_treeids=None, target_weights=None,
                              target_weights_as_tensor=None):
    return _tree_regressor(
        aggregate_function=aggregate_function, base_values=_floats(base_values, base_values_as_tensor),
        n_targets=n_targets, nodes_falsenodeids=nodes_falsenodeids, nodes_featureids=nodes_featureids,
        nodes_missing_value_tracks_true=nodes_missing_value_tracks_true, nodes_modes=nodes_modes,
        nodes_nodeids=nodes_nodeids, nodes_treeids=nodes_treeids, nodes_truenodeids=nodes_truenodeids,
        nodes_values=_floats(nodes_values, nodes_values_as_tensor), post_transform=post_transform,
        target_ids=target_ids, target_nodeids=target_nodeids, target_treeids=target_treeids,
        target_weights=_floats(target_weights, target_weights_as_tensor))


# -- TreeEnsembleClassifier ------------------------------------------------------------------------

def _tree_classifier(*, base_values, class_ids, class_nodeids, class_treeids, class_weights,
                     classlabels_int64s, classlabels_strings, nodes_falsenodeids, nodes_featureids,
                     nodes_missing_value_tracks_true, nodes_modes, nodes_nodeids, nodes_treeids,
                     nodes_truenodeids, nodes_values, post_transform):
    labels = class_labels(classlabels_int64s, classlabels_strings, "classlabels_int64s")
    transform = transform_name(post_transform)
    k = len(labels)
    class_ids = class_ids or []
    weights = class_weights if class_weights is not None else []
    forest = _legacy_forest(treeids=nodes_treeids, nodeids=nodes_nodeids, featureids=nodes_featureids,
                            modes=nodes_modes, values=nodes_values, truenodeids=nodes_truenodeids,
                            falsenodeids=nodes_falsenodeids, tracks=nodes_missing_value_tracks_true,
                            w_treeids=class_treeids or [], w_nodeids=class_nodeids or [], w_ids=class_ids,
                            w_weights=weights, n_targets=k, prefix="class")
    base = np.asarray(base_values if base_values is not None else [], np.float64)
    used = sorted(set(class_ids))
    if k == 2 and len(used) == 1:
        # Binary case: the trees score one class only; that score s goes to the second class and the
        # first gets its complement (1 - s for non-negative weights, -s otherwise).
        c = used[0]
        if len(base) not in (0, 1, 2):
            raise ValueError(f"base_values has {len(base)} values, expected at most 2 for a binary classifier")
        offset = base[0] if len(base) == 1 else (base[c] if len(base) == 2 else 0.0)
        positive = bool(np.all(np.asarray(weights) >= 0))
        cut = 0.5 if positive else 0.0

        def run_binary(x):
            s = forest.scores(features_2d(x), "SUM")[:, c] + offset
            return labels[np.where(s > cut, 1, 0)], binary_scores(s, transform, positive).astype(np.float32)
        return run_binary
    base = _base(base, k)
    pick = label_picker(labels)
    by_row = transform == "SOFTMAX" and 2 <= k <= ROW_SCORES
    base_list = base.tolist()
    singles = [labels[j:j + 1] for j in range(k)]      # batch 1's label, copied per run

    def run(x):
        x = features_2d(x)
        if by_row and len(x) == 1:             # batch 1 (_common.ROW_SCORES), base added in float64 too
            sums = forest.row_sums(x)
            if sums is None:
                sums = forest.scores(x, "SUM").tolist()[0]
            found = row_top_softmax([s + b for s, b in zip(sums, base_list)])
            if found is not None:
                return singles[found[0]].copy(), found[1]
        scores = forest.scores(x, "SUM")
        scores += base
        top = scores.argmax(axis=1) if k else np.zeros(len(scores), np.int64)
        return pick(top), apply_transform(transform, scores).astype(np.float32)
    return run


@kernel("TreeEnsembleClassifier", since=1, domain=ML)
def tree_ensemble_classifier_1(*, base_values=None, class_ids=None, class_nodeids=None, class_treeids=None,
                               class_weights=None, classlabels_int64s=None, classlabels_strings=None,
                               nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                               nodes_missing_value_tracks_true=None, nodes_modes=None, nodes_nodeids=None,
                               nodes_treeids=None, nodes_truenodeids=None, nodes_values=None,
                               post_transform="NONE"):
    return _tree_classifier(
        base_values=base_values, class_ids=class_ids, class_nodeids=class_nodeids, class_treeids=class_treeids,
        class_weights=class_weights, classlabels_int64s=classlabels_int64s,
        classlabels_strings=classlabels_strings, nodes_falsenodeids=nodes_falsenodeids,
        nodes_featureids=nodes_featureids, nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
        nodes_modes=nodes_modes, nodes_nodeids=nodes_nodeids, nodes_treeids=nodes_treeids,
        nodes_truenodeids=nodes_truenodeids, nodes_values=nodes_values, post_transform=post_transform)


@kernel("TreeEnsembleClassifier", since=(3, 5), domain=ML)
def tree_ensemble_classifier_3(*, base_values=None, base_values_as_tensor=None, class_ids=None,
                               class_nodeids=None, class_treeids=None, class_weights=None,
                               class_weights_as_tensor=None, classlabels_int64s=None, classlabels_strings=None,
                               nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                               nodes_hitrates_as_tensor=None, nodes_missing_value_tracks_true=None,
                               nodes_modes=None, nodes_nodeids=None, nodes_treeids=None,
                               nodes_truenodeids=None, nodes_values=None, nodes_values_as_tensor=None,
                               post_transform="NONE"):
    return _tree_classifier(
        base_values=_floats(base_values, base_values_as_tensor), class_ids=class_ids,
        class_nodeids=class_nodeids, class_treeids=class_treeids,
        class_weights=_floats(class_weights, class_weights_as_tensor), classlabels_int64s=classlabels_int64s,
        classlabels_strings=classlabels_strings, nodes_falsenodeids=nodes_falsenodeids,
        nodes_featureids=nodes_featureids, nodes_missing_value_tracks_true=nodes_missing_value_tracks_true,
        nodes_modes=nodes_modes, nodes_nodeids=nodes_nodeids, nodes_treeids=nodes_treeids,
        nodes_truenodeids=nodes_truenodeids, nodes_values=_floats(nodes_values, nodes_values_as_tensor),
        post_transform=post_transform)


# -- TreeEnsemble ----------------------------------------------------------------------------------

def _member_sets(values) -> list:
    """membership_values: the sets of the BRANCH_MEMBER nodes in node order, each ended by a NaN."""
    if values is None:
        return []
    flat = np.asarray(values, np.float64).reshape(-1)
    cuts = np.nonzero(np.isnan(flat))[0]
    sets = np.split(flat, cuts)
    sets = [sets[0]] + [s[1:] for s in sets[1:]]
    if len(sets) > 1 and sets[-1].size == 0:
        sets.pop()
    return sets


@kernel("TreeEnsemble", since=5, domain=ML)
def tree_ensemble_5(*, aggregate_function=1, leaf_targetids, leaf_weights, membership_values=None,
                    n_targets=None, nodes_falseleafs, nodes_falsenodeids, nodes_featureids, nodes_hitrates=None,
                    nodes_missing_value_tracks_true=None, nodes_modes, nodes_splits, nodes_trueleafs,
                    nodes_truenodeids, post_transform=0, tree_roots):
    if not 0 <= aggregate_function < len(AGGREGATES):
        raise ValueError(f"aggregate_function must be in [0, 3], got {aggregate_function}")
    how = AGGREGATES[aggregate_function]
    transform = transform_name(post_transform)
    modes = np.asarray(nodes_modes).reshape(-1).astype(np.int64)
    splits = np.asarray(nodes_splits).reshape(-1)
    weights = np.asarray(leaf_weights).reshape(-1)
    n = _same_length({"nodes_featureids": nodes_featureids, "nodes_modes": modes, "nodes_splits": splits,
                      "nodes_truenodeids": nodes_truenodeids, "nodes_trueleafs": nodes_trueleafs,
                      "nodes_falsenodeids": nodes_falsenodeids, "nodes_falseleafs": nodes_falseleafs,
                      "nodes_missing_value_tracks_true": nodes_missing_value_tracks_true or None})
    n_leaves = _same_length({"leaf_targetids": leaf_targetids, "leaf_weights": weights})
    if n and (modes.min() < 0 or modes.max() > MEMBER):
        raise ValueError(f"nodes_modes must be in [0, {MEMBER}], got {sorted(set(modes.tolist()))}")
    targets = np.asarray(leaf_targetids, np.int64)
    if n_targets is None:
        n_targets = int(targets.max()) + 1 if n_leaves else 1
    if n_leaves and (targets.min() < 0 or targets.max() >= n_targets):
        raise ValueError(f"leaf_targetids must be in [0, {n_targets}), got {sorted(set(targets.tolist()))}")
    roots = np.asarray(tree_roots, np.int64)
    if roots.size and (roots.min() < 0 or roots.max() >= n):
        raise ValueError(f"tree_roots must index nodes_* in [0, {n}), got {roots.tolist()}")

    def successor(ids, is_leaf, what):
        ids, is_leaf = np.asarray(ids, np.int64), np.asarray(is_leaf, bool)
        bound = np.where(is_leaf, n_leaves, n)
        bad = (ids < 0) | (ids >= bound)
        if bad.any():
            i = int(np.nonzero(bad)[0][0])
            kind = "leaf" if is_leaf[i] else "node"
            raise ValueError(f"{what}[{i}] = {ids[i]} is not a valid {kind} index (there are {bound[i]})")
        return np.where(is_leaf, ids + n, ids)

    total = n + n_leaves
    no_child = np.zeros(n_leaves, np.int64)      # leaves point to themselves (set by Forest)
    table = np.zeros((total, n_targets), np.float64)
    has = np.zeros((total, n_targets), bool)
    table[n + np.arange(n_leaves), targets] = weights.astype(np.float64)
    has[n + np.arange(n_leaves), targets] = True
    forest = Forest(
        np.concatenate([np.asarray(nodes_featureids, np.int64), np.zeros(n_leaves, np.int64)]),
        np.concatenate([splits.astype(np.float64), np.zeros(n_leaves)]),
        np.concatenate([modes, np.full(n_leaves, LEAF)]),
        np.concatenate([successor(nodes_truenodeids, nodes_trueleafs, "nodes_truenodeids"), no_child]),
        np.concatenate([successor(nodes_falsenodeids, nodes_falseleafs, "nodes_falsenodeids"), no_child]),
        np.concatenate([np.asarray(nodes_missing_value_tracks_true or [0] * n, bool), np.zeros(n_leaves, bool)]),
        roots, table, has, _member_sets(membership_values))

    def run(x):
        scores = forest.scores(features_2d(x), how)
        return apply_transform(transform, scores).astype(x.dtype)
    return run
