"""Tree ensembles (ai.onnx.ml): TreeEnsembleRegressor 1/3/5, TreeEnsembleClassifier 1/3/5, TreeEnsemble 5.

Every layout is compiled in the factory into one `Forest`: per-node numpy arrays over all trees (feature,
threshold, mode, both children, NaN direction), with leaves pointing at themselves, and a dense matrix of
leaf weights per target. At run time all samples walk all trees at once: an [N, trees] array of node
indices advanced level by level with numpy (a loop over the forest's depth, never over samples or nodes),
then the reached leaves' weights are aggregated (SUM, AVERAGE, MIN, MAX) and base values added.

Comparisons: a float32 (or float16 / integer) input is compared with thresholds rounded to float32, a
double input with double thresholds (the *_as_tensor attributes keep full precision). A NaN feature goes
to the true branch when the node's missing_value_tracks_true is set, otherwise the comparison decides
(false for every mode but BRANCH_NEQ; a NaN is never a member of a set).
"""
from __future__ import annotations

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from ._common import binary_scores, class_labels, features_2d, transform_name
from ._common import post_transform as apply_transform

ML = "ai.onnx.ml"
MODE_NAMES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ",
              "BRANCH_MEMBER", "LEAF")
NEQ, MEMBER, LEAF = 5, 6, 7
_OPS = (np.less_equal, np.less, np.greater_equal, np.greater, np.equal, np.not_equal)
# truth of each mode for the outcomes 0: x < t, 1: x == t, 2: x > t (member and leaf rows unused)
_TRUTH = np.array([[1, 1, 0], [1, 0, 0], [0, 1, 1], [0, 0, 1], [0, 1, 0], [1, 0, 1], [0, 0, 0], [0, 0, 0]],
                  dtype=bool).reshape(-1)
AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")   # TreeEnsemble-5 numbers them 0..3
_CHUNK = 1 << 22                                  # elements gathered at once when aggregating


class Forest:
    """All trees as flat per-node arrays; a leaf's children are itself.

    feature, threshold (float64), mode (MODE_NAMES index), true_next, false_next, tracks_true: per node;
    roots: the root node of each tree; weights [nodes, K] (float64) and has_weight [nodes, K]: what each
    leaf adds to each target; members: for BRANCH_MEMBER nodes, the set of each (list of float arrays,
    in node order)."""

    def __init__(self, feature, threshold, mode, true_next, false_next, tracks_true, roots, weights,
                 has_weight, members=None):
        n = len(mode)
        self.mode = np.asarray(mode, np.int8)
        interior = self.mode != LEAF
        self.feature = np.where(interior, np.asarray(feature, np.int64), 0)
        true_next = np.where(interior, np.asarray(true_next, np.int64), np.arange(n))
        false_next = np.where(interior, np.asarray(false_next, np.int64), np.arange(n))
        if n and (true_next.min() < 0 or true_next.max() >= n or false_next.min() < 0 or false_next.max() >= n):
            raise ValueError("a child index is out of range")
        if n and self.feature.min() < 0:
            raise ValueError(f"a feature id is negative (node {int(np.argmin(self.feature))})")
        self.children = np.stack([false_next, true_next], axis=1).reshape(-1)   # [2 * node + cond]
        self.threshold64 = np.asarray(threshold, np.float64)
        self.threshold32 = self.threshold64.astype(np.float32)
        self.tracks_true = np.asarray(tracks_true, bool) & interior
        self.nan_true = self.tracks_true | (self.mode == NEQ)
        self.roots = np.asarray(roots, np.int64)
        self.weights = np.asarray(weights, np.float64)
        self.has_weight = np.asarray(has_weight, bool)
        self.extreme_tables = {"MIN": np.where(self.has_weight, self.weights, np.inf),
                               "MAX": np.where(self.has_weight, self.weights, -np.inf)}
        modes = set(np.unique(self.mode[interior]).tolist())
        self.single_op = _OPS[modes.pop()] if len(modes) == 1 and MEMBER not in modes else None
        self.any_tracks = bool(self.tracks_true.any())
        self.max_feature = int(self.feature[interior].max()) if interior.any() else -1
        self.feature_node = int(np.nonzero(interior & (self.feature == self.max_feature))[0][0]) \
            if interior.any() else -1
        self.depth = self._depth(true_next, false_next, interior)
        self.has_members = bool((self.mode == MEMBER).any())
        if self.has_members:
            self._prepare_members(members or [])

    def _depth(self, true_next, false_next, interior) -> int:
        """Levels to walk from the roots until every path is at a leaf (ValueError on a cycle)."""
        n = len(self.mode)
        level, depth = np.unique(self.roots), 0
        while True:
            level = level[interior[level]]
            if level.size == 0:
                return depth
            depth += 1
            if depth > n:
                raise ValueError("the trees contain a cycle (a node is its own descendant)")
            level = np.unique(np.concatenate([true_next[level], false_next[level]]))

    def _prepare_members(self, members):
        ordinal = np.cumsum(self.mode == MEMBER) - 1
        count = int(ordinal[-1]) + 1
        if len(members) < count:
            raise ValueError(f"{count} nodes are BRANCH_MEMBER but membership_values holds {len(members)} sets")
        self.member_ordinal = np.where(self.mode == MEMBER, ordinal, 0)
        values = [np.asarray(m, np.float64) for m in members[:count]]
        self.member_values = {}
        for dt in (np.float64, np.float32):
            universe = np.unique(np.concatenate([v.astype(dt) for v in values] + [np.zeros(0, dt)]))
            keys = np.unique(np.concatenate(
                [k * (len(universe) + 1) + np.searchsorted(universe, v.astype(dt)) for k, v in enumerate(values)]
                + [np.zeros(0, np.int64)]).astype(np.int64))
            self.member_values[np.dtype(dt)] = (universe, keys)

    def _in_set(self, nodes, v):
        universe, keys = self.member_values[v.dtype]
        if universe.size == 0 or keys.size == 0:
            return np.zeros(v.shape, bool)
        rank = np.searchsorted(universe, v)
        found = universe[np.minimum(rank, universe.size - 1)] == v
        key = self.member_ordinal[nodes] * (universe.size + 1) + rank
        at = np.minimum(np.searchsorted(keys, key), keys.size - 1)
        return found & (keys[at] == key)

    def leaves(self, x: np.ndarray) -> np.ndarray:
        """x [N, F] float32 or float64 -> the leaf each sample reaches in each tree, [N, trees]."""
        n, f = x.shape
        if f <= self.max_feature:
            raise InvalidValueError(f"node {self.feature_node} reads feature {self.max_feature} but X has "
                                    f"{f} features (shape {list(x.shape)})")
        idx = np.broadcast_to(self.roots, (n, self.roots.size)).copy()
        if n == 0 or self.roots.size == 0:
            return idx
        flat = np.ascontiguousarray(x).reshape(-1)
        offsets = (np.arange(n, dtype=np.int64) * f)[:, None]
        thresholds = self.threshold64 if x.dtype == np.float64 else self.threshold32
        has_nan = bool(np.isnan(flat).any())
        for _ in range(self.depth):
            v = flat.take(offsets + self.feature.take(idx))
            t = thresholds.take(idx)
            if self.single_op is not None:
                cond = self.single_op(v, t)
                if has_nan and self.any_tracks:
                    cond |= np.isnan(v) & self.tracks_true.take(idx)
            else:
                mode = self.mode.take(idx)
                cond = _TRUTH.take(mode * 3 + (v >= t) + (v > t))
                if self.has_members:
                    member = mode == MEMBER
                    if member.any():
                        cond[member] = self._in_set(idx[member], v[member])
                if has_nan:
                    cond = np.where(np.isnan(v), self.nan_true.take(idx), cond)
            idx = self.children.take(2 * idx + cond)
        return idx

    def aggregate(self, leaves: np.ndarray, how: str) -> np.ndarray:
        """[N, trees] leaves -> [N, K] float64 scores (a target that no reached leaf scores stays 0)."""
        n, trees = leaves.shape
        k = self.weights.shape[1]
        out = np.zeros((n, k), np.float64)
        if trees == 0 or n == 0:
            return out
        step = max(1, _CHUNK // max(1, trees * k))
        if how in ("SUM", "AVERAGE"):
            for lo in range(0, n, step):
                out[lo:lo + step] = self.weights[leaves[lo:lo + step]].sum(axis=1)
            return out / trees if how == "AVERAGE" else out
        table = self.extreme_tables[how]
        reduce = np.min if how == "MIN" else np.max
        for lo in range(0, n, step):
            part = leaves[lo:lo + step]
            scored = self.has_weight[part].any(axis=1)
            out[lo:lo + step] = np.where(scored, reduce(table[part], axis=1), 0)
        return out


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
    mode = np.array([codes[s] for s in modes], np.int8).reshape(n)
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
        xf = features_2d(x)
        scores = forest.aggregate(forest.leaves(xf), how) + base
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
            s = forest.aggregate(forest.leaves(features_2d(x)), "SUM")[:, c] + offset
            return labels[np.where(s > cut, 1, 0)], binary_scores(s, transform, positive).astype(np.float32)
        return run_binary
    base = _base(base, k)

    def run(x):
        scores = forest.aggregate(forest.leaves(features_2d(x)), "SUM") + base
        top = np.argmax(scores, axis=1) if k else np.zeros(len(scores), np.int64)
        return labels[top], apply_transform(transform, scores).astype(np.float32)
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
        scores = forest.aggregate(forest.leaves(features_2d(x)), how)
        return apply_transform(transform, scores).astype(x.dtype)
    return run
