"""Tree ensembles compiled for evaluation: the `Forest` that every TreeEnsemble* layout becomes (trees.py
parses the attributes into it), and the algorithms that evaluate it.

What a forest computes, whatever the algorithm (the spec's semantics): each tree is walked from its root;
at a branch node the sample goes to the true child when the node's test holds, else to the false child:

    BRANCH_LEQ x <= t   BRANCH_LT x < t   BRANCH_GTE x >= t   BRANCH_GT x > t   BRANCH_EQ x == t
    BRANCH_NEQ x != t   BRANCH_MEMBER x is in the node's set

x is the sample's value of the node's feature, t the node's threshold (rounded to float32 for a float32
or integer input, double for a double input). A NaN x goes to the true child when the node's
missing_value_tracks_true is set; otherwise the test decides (false for every mode but BRANCH_NEQ; a NaN
is never a member). The leaf reached in each tree adds its weights to targets, and the trees' weights are
aggregated per target: SUM, AVERAGE (the sum divided by the number of trees), MIN or MAX (a target that
no reached leaf scores is 0). Sums run in float64. `Forest.test` is that test on arrays; the algorithms
below only decide where it is applied.

Algorithm: all rows and all trees advance one level at a time: an [rows, trees] array of node indices
and one gather per table per level (a loop over the forest's depth, never over rows, trees or nodes).
A leaf's children are itself, so walking `depth` levels brings every tree to its leaf whatever the depth
of each path. The tables are read at doubled indices 2 * node + outcome, so that a level's step is an add
and a gather. Rows go in chunks that keep the [rows, trees] arrays in the CPU cache, and a large batch's
chunks are spread over the threads (parallel.split). A forest whose walk tables outgrow the caches (~40
bytes a node: a 500-tree depth-8 forest's are 10 MB) is walked in blocks of many rows and a group of
trees whose tables fit in the L2 cache, every level of a group before the next group: the deeper levels'
gathers, which spread over all of a tree's nodes, then hit the cache (500 trees of depth 8 at 1000 rows,
one thread: 38-41 against 19-22 ms in a slow spell of this VM, 23 against 19-21 in a fast one; on two
threads, alternating with the chunks over every tree: 0.49-0.80x from 300 rows on, for that forest, a
300-tree extra-trees regressor of depth 27 and a 200-tree random forest of depth 10). The leaves of
each chunk are gathered for all trees before they are summed, in the same order: bit for bit the same.
Measured no faster on the 300-tree, 4310-node forest of bench_apps' skl_gbc, and so not used: every
node's test for every row first, then a walk of the stored outcomes (one row: 22 vs 21 us); feature and
threshold read as one packed record (a chunk of 109 rows: 434 vs 383 us); int32 tables (half the bytes,
the index converted per gather): 0.80-0.86x the int64 time in the chunks over every tree, 0.94-1.8x in
the grouped walk (two runs).

One row: the top levels (up to three) of every tree are decided at once. The tests of a tree's first
seven nodes in heap order (node p's children at 2p and 2p + 1; a leaf's children are itself) fill eight
bytes of a bool array (the eighth a padding copy); viewed as one int64, a multiplication gathers the
seven outcome bytes into the top byte (`_GATHER`), a code 0..127, and a per-tree jump table gives the
node reached three levels down: one gather, one test, a multiply, a shift, an add and a gather, where
the level walk spends six calls per level (a 300-tree depth-3 forest: 8 vs 16 us, under load; packing
the outcomes with np.packbits instead costs 8.5 us alone). When that reaches every leaf and the trees
score one class each, in class order, a classifier's row is summed straight into K Python floats
(row_sums; when the test is one comparison, no missing_value_tracks_true, as in scikit-learn's
forests, a closure with its tables bound: _plain_row_sums).

Many rows, trees no deeper than the top levels (SUM, AVERAGE): the same codes for a chunk of rows at
once. X is transposed to [features, rows], so that gathering the tested nodes' features copies whole
rows ([trees * 7, rows]: a gather along axis 1 of [rows, features] was the walk's costliest step); the
outcomes of eight rows then sit in one uint64 per tested node (seven a tree, no padding), and six shifts
and ors on those build eight rows' codes at once; the codes' bytes, transposed to [rows, trees], index
the jump tables' values, summed as the walk's leaves are (skl_gbc at 1000 rows: 2.1 vs 4.0 ms, fastest
calls under load).

Aggregation (SUM, AVERAGE): when each tree scores a single target (gradient boosting: one tree per class
and round; any single-target regressor), each node holds one value and the trees are ordered by target,
so a chunk's scores are one gather and one add.reduceat; otherwise (random forests: every leaf scores
every class) a [targets, nodes] table is gathered. MIN and MAX gather their table with +-inf where a
leaf does not score a target.
"""
from __future__ import annotations

import sys

import numpy as np

from ... import parallel
from ...errors import InvalidValueError

MODE_NAMES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ",
              "BRANCH_MEMBER", "LEAF")
NEQ, MEMBER, LEAF = 5, 6, 7
_TESTS = (np.less_equal, np.less, np.greater_equal, np.greater, np.equal, np.not_equal)
# truth of each mode for the outcomes 0: x < t, 1: x == t, 2: x > t (member and leaf rows unused)
_TRUTH = np.array([[1, 1, 0], [1, 0, 0], [0, 1, 1], [0, 0, 1], [0, 1, 0], [1, 0, 1], [0, 0, 0], [0, 0, 0]],
                  dtype=bool).reshape(-1)
AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")   # TreeEnsemble-5 numbers them 0..3

# Tuned on this machine (2 cores, under load), numpy 2.4, float32 rows:
# walk chunks of about this many [rows x trees] elements: 100-row chunks of a 300-tree forest ran the
# walk 2.3x faster than the whole 1000-row batch at once, 200-row chunks only 1.5x (cache misses).
_CHUNK = 1 << 15
# ... and, once there are rows enough to fill a block, trees in groups whose walk tables (feature, threshold
# and next node, each at doubled indices) fit in about this many bytes: the deep levels' gathers then hit
# the caches (500 trees of depth 8, 1000 rows, one thread: 38-41 ms in 65-row chunks of every tree, 19-22
# ms in blocks of 1000 rows x 24-32 trees, 25 in 250 x 64; tables of ~20 KB a tree)
_GROUP_TABLE_BYTES = 512 << 10
# ... for forests whose tables are above this size (a 100-tree depth-12 random forest's 1.8 MB: grouped,
# 1.16-1.64x slower at 3000 rows, its chunks' sums left to one thread)
_GROUPED_FROM_BYTES = 4 << 20
# ... in chunks of at most this many bytes of X's rows (the gathers from X stay cached: 30 features at
# 3000 rows, the 300-tree depth-27 forest: 0.59x at 128 KB, 0.71-0.72x at 64 KB and 256 KB)
_BLOCK_ROW_BYTES = 128 << 10
# ... and whose leaves (or their values, 8 bytes a tree) for every tree take at most this many bytes (the
# suite's 500 trees: 2000 rows; a 5000-tree forest 400 rows, groups of 80 trees then)
_REACHED_BYTES = 16 << 20
# a walk goes over the threads in parts of at least this many row x tree x level steps: a 500-tree
# depth-8 forest on 2000 rows ran 1.3x faster on 2 threads, bench_apps' skl_gbc at 1000 rows (900 k
# steps) 1.4x slower, both under load
_PARALLEL_STEPS = 1 << 19

# One row's top levels (see the module's docstring): bytes j = 0..6 of a little-endian int64 (each 0 or
# 1) land at bit 56 + j of its product (wrapping) with this number, the eighth byte nowhere (checked
# exhaustively in the tests); the jump tables hold 128 entries per tree (nodes, and values when the
# trees are no deeper: ~2.3 KB per tree, 0.6 ms to build for 300), built up to this many trees. Index
# arrays stay intp: an int32 one costs a conversion per take (1.2 us on 300 indices)
_TOP_LEVELS = 3
_GATHER = np.int64(sum(1 << (56 - 7 * j) for j in range(7)))   # < 2**63: the product's top bit is 0
_TOP_MAX_TREES = 4096
# many rows' top levels (_top_scores) go in chunks of about this many tested values (trees x 8 x rows):
# skl_gbc's 300 trees at 1000 rows (the level walk: 4.0 ms), chunks of 24 / 48 / 104 / 216 rows 3.5 /
# 2.4 / 2.1 / 7.0 ms with malloc as it comes (the 216-row chunk's temporaries page-faulted), 1.8 ms for
# 216 rows only with ONNX_MINI_MALLOC=tuned (fastest calls, under load)
_TOP_CHUNK = 1 << 18
# ... from this many rows on (skl_gbc's forest: 2 rows 46 vs 29 us for the walk, 8 rows 48 vs 50, 32 rows
# 99 vs 139; fastest calls, under load)
_TOP_MIN_ROWS = 8
_SHIFTS = [np.uint64(j) for j in range(8)]
_LITTLE = sys.byteorder == "little"


def _doubled(values: np.ndarray) -> np.ndarray:
    """values[i] at 2i and 2i+1: a table read at a doubled node index 2 * node + outcome."""
    return np.repeat(values, 2)


class Forest:
    """All trees as flat per-node arrays; a leaf's children are itself.

    Built from feature, threshold, mode (MODE_NAMES index), true_next, false_next, tracks_true per node,
    roots (the root node of each tree), weights [nodes, K] (float64) and has_weight [nodes, K] (what
    each leaf adds to each target), members (the sets of the BRANCH_MEMBER nodes, in node order)."""

    def __init__(self, feature, threshold, mode, true_next, false_next, tracks_true, roots, weights,
                 has_weight, members=None):
        mode = np.asarray(mode, np.int8)
        n = len(mode)
        interior = mode != LEAF
        feature = np.where(interior, np.asarray(feature, np.int64), 0)
        true_next = np.where(interior, np.asarray(true_next, np.int64), np.arange(n))
        false_next = np.where(interior, np.asarray(false_next, np.int64), np.arange(n))
        if n and (true_next.min() < 0 or true_next.max() >= n or false_next.min() < 0 or false_next.max() >= n):
            raise ValueError("a child index is out of range")
        if n and feature.min() < 0:
            raise ValueError(f"a feature id is negative (node {int(np.argmin(feature))})")
        roots = np.asarray(roots, np.int64)
        self.max_feature = int(feature[interior].max()) if interior.any() else -1
        self.feature_node = int(np.nonzero(interior & (feature == self.max_feature))[0][0]) \
            if interior.any() else -1     # named in the error when X has too few features
        self.depth, owner = _structure(roots, true_next, false_next, interior)
        threshold = np.asarray(threshold, np.float64)
        tracks_true = np.asarray(tracks_true, bool) & interior
        weights, has_weight = np.asarray(weights, np.float64), np.asarray(has_weight, bool)

        self.n = n
        self.mode = mode
        self.feature = feature
        self.threshold = {np.dtype(np.float64): threshold, np.dtype(np.float32): threshold.astype(np.float32)}
        self.tracks_true = tracks_true
        self.nan_true = tracks_true | (mode == NEQ)
        self.roots = roots
        self.k = weights.shape[1]
        self.n_trees = roots.size

        branch_modes = set(np.unique(mode[interior]).tolist())
        self.single = _TESTS[branch_modes.pop()] if len(branch_modes) == 1 and MEMBER not in branch_modes else None
        self.any_tracks = bool(self.tracks_true.any())
        # test() when it is one comparison alone: one mode everywhere, no NaN overrides
        self.plain_test = self.single if not self.any_tracks else None
        self.has_members = bool((self.mode == MEMBER).any())
        if self.has_members:
            self._prepare_members(members or [])

        # the walk's tables, read at doubled indices 2 * node + outcome (outcome 1: true)
        self.next_doubled = 2 * np.stack([false_next, true_next], axis=1).reshape(-1)
        self.next_node = self.next_doubled // 2
        self.feature2 = _doubled(self.feature)
        self.threshold2 = {dt: _doubled(t) for dt, t in self.threshold.items()}
        self._aggregation(weights, has_weight, owner)  # may reorder the trees: the roots' tables after it
        self.root_feature = self.feature[self.roots]
        self.root_threshold = {dt: t[self.roots] for dt, t in self.threshold.items()}
        self.roots_doubled = 2 * self.roots
        table_bytes = self.feature2.nbytes + self.next_doubled.nbytes + self.threshold2[np.dtype(np.float32)].nbytes
        self.group_trees = self.n_trees if table_bytes <= _GROUPED_FROM_BYTES else \
            max(1, _GROUP_TABLE_BYTES * self.n_trees // table_bytes)
        self.top_value = None
        self.top = self._top_tables() if _LITTLE and self.depth and self.n_trees <= _TOP_MAX_TREES else None
        if self.top is not None and self.plain_test is not None and self.top_value is not None and \
                self.all_targets_in_order:
            self.row_sums = self._plain_row_sums()     # (shadows the method)

    # -- the test -------------------------------------------------------------------------------------
    def test(self, v: np.ndarray, t: np.ndarray, at, out=None) -> np.ndarray:
        """Whether values v go to the true child of nodes whose thresholds are t; at(table) reads a
        per-node table at those nodes (broadcasting against v). out: an optional bool buffer."""
        if self.single is not None:            # one comparison mode everywhere, no sets
            cond = self.single(v, t, out=out)
            if self.any_tracks:                # a NaN compares false (true for NEQ): tracks_true overrides
                cond |= np.isnan(v) & at(self.tracks_true)
            return cond
        mode = at(self.mode)
        cond = _TRUTH.take(mode * 3 + (v >= t) + (v > t))
        if self.has_members:
            member = np.broadcast_to(mode == MEMBER, v.shape)
            if member.any():
                ordinal = np.broadcast_to(at(self.member_ordinal), v.shape)
                cond[member] = self._in_set(ordinal[member], np.broadcast_to(v, member.shape)[member])
        nan = np.isnan(v)
        return np.where(nan, at(self.nan_true), cond) if nan.any() else cond

    def _prepare_members(self, members):
        is_member = self.mode == MEMBER
        count = int(is_member.sum())
        if len(members) < count:
            raise ValueError(f"{count} nodes are BRANCH_MEMBER but membership_values holds {len(members)} sets")
        self.member_ordinal = np.where(is_member, np.cumsum(is_member) - 1, 0)
        values = [np.asarray(m, np.float64) for m in members[:count]]
        self.member_values = {}
        for dt in (np.float64, np.float32):
            universe = np.unique(np.concatenate([v.astype(dt) for v in values] + [np.zeros(0, dt)]))
            keys = np.unique(np.concatenate(
                [k * (len(universe) + 1) + np.searchsorted(universe, v.astype(dt)) for k, v in enumerate(values)]
                + [np.zeros(0, np.int64)]).astype(np.int64))
            self.member_values[np.dtype(dt)] = (universe, keys)

    def _in_set(self, ordinal, v):
        """Whether v[i] is in the set of BRANCH_MEMBER node number ordinal[i] (sorted keys + searchsorted)."""
        universe, keys = self.member_values[v.dtype]
        if universe.size == 0 or keys.size == 0:
            return np.zeros(v.shape, bool)
        rank = np.searchsorted(universe, v)
        found = universe[np.minimum(rank, universe.size - 1)] == v
        key = ordinal * (universe.size + 1) + rank
        at = np.minimum(np.searchsorted(keys, key), keys.size - 1)
        return found & (keys[at] == key)

    def _top_tables(self):
        """One row's tables for the top levels of every tree (see the module's docstring): (levels,
        tested nodes [trees * 8] (8 per tree), their features, thresholds per float type, flat jump table
        [trees * 128] of the node reached `levels` down, each tree's offset into it)."""
        levels = min(self.depth, _TOP_LEVELS)
        heap = np.empty((self.n_trees, 2 ** (levels + 1)), np.int64)
        heap[:, 1] = self.roots
        for p in range(1, 2 ** levels):
            heap[:, 2 * p] = self.next_node[2 * heap[:, p]]          # false child
            heap[:, 2 * p + 1] = self.next_node[2 * heap[:, p] + 1]  # true child
        tested = np.empty((self.n_trees, 8), np.int64)
        tested[:] = heap[:, 1:2][:, [0]]                   # the padding bytes test the root again
        tested[:, :2 ** levels - 1] = heap[:, 1:2 ** levels]
        # for each code, the heap position reached: bit p - 1 is node p's outcome (bits beyond the
        # tested nodes are padding: never read)
        codes = np.arange(128)
        at = np.ones(128, np.int64)
        for _ in range(levels):
            at = 2 * at + ((codes >> (at - 1)) & 1)
        jump = heap[:, at].reshape(-1).astype(np.intp)
        offsets = np.arange(0, 128 * self.n_trees, 128, dtype=np.int64)
        # trees no deeper than the top levels, one value per node: the reached leaves' values at once
        self.top_value = self.value[jump] if self.value is not None and levels == self.depth else None
        # flat [trees * 8] tables: the outcomes' int64 view is then 1-D [trees], as the jump index
        tested = tested.reshape(-1)
        # many rows (_top_scores): the seven tested nodes of each tree (no padding), their features, and
        # thresholds as [trees * 7, 1] columns
        self.top_tested = tested.reshape(-1, 8)[:, :7].reshape(-1)
        self.top_feature_rows = self.feature[self.top_tested]
        self.top_column = {dt: t[self.top_tested][:, None] for dt, t in self.threshold.items()}
        self.top_chunk_rows = max(8, _TOP_CHUNK // (8 * self.n_trees) // 8 * 8)
        return (levels, tested, self.feature[tested], {dt: t[tested] for dt, t in self.threshold.items()},
                jump, offsets)

    def _top_walk(self, flat: np.ndarray, table: np.ndarray | None = None) -> np.ndarray:
        """One row (flat [F]): [trees] nodes reached `levels` down from the roots (self.top's levels), or
        their entries of `table` (top_value)."""
        _, tested, feature, thresholds, jump, offsets = self.top
        v = flat.take(feature, mode="clip")
        # (test() without its call and table reader when one comparison is the whole test)
        if self.plain_test is not None:
            cond = self.plain_test(v, thresholds[flat.dtype])
        else:
            cond = self.test(v, thresholds[flat.dtype], lambda table: table[tested])
        return (jump if table is None else table).take(_jump_index(cond, offsets), mode="clip")

    def _plain_row_sums(self):
        """row_sums when one comparison is the whole test: _top_walk's steps with their tables bound
        once, no attribute lookups or method calls per row. With test()'s shortcut above and the 1-D
        tables, skl_gbc_b1's TreeEnsembleClassifier 12.8 -> 11.5 us; this alone 12.2 -> 11.7 us
        (fastest calls, under load)."""
        _, _, feature, thresholds, _, offsets = self.top
        compare, value, starts = self.plain_test, self.top_value, self.group_starts
        width, node = self.max_feature, self.feature_node     # (values, not self: no reference cycle)

        def row_sums(x):
            if x.shape[1] <= width:
                _too_few_features(x, width, node)
            flat = x.reshape(-1)
            cond = compare(flat.take(feature, mode="clip"), thresholds[flat.dtype])
            return np.add.reduceat(value.take(_jump_index(cond, offsets), mode="clip"), starts).tolist()
        return row_sums

    # -- evaluation -----------------------------------------------------------------------------------
    def _check_features(self, x: np.ndarray) -> None:
        if x.shape[1] <= self.max_feature:
            _too_few_features(x, self.max_feature, self.feature_node)

    def row_sums(self, x: np.ndarray) -> list | None:
        """One row x [1, F]: its SUM scores as K Python floats (the sums scores() makes) when the trees are
        no deeper than the top levels and each scores one target, every target in order (gradient
        boosting); None otherwise. Skips scores()'s [1, K] array and branches: ~2 us of a 300-tree row."""
        if self.top_value is None or not self.all_targets_in_order:
            return None
        self._check_features(x)
        return np.add.reduceat(self._top_walk(x.reshape(-1), self.top_value), self.group_starts).tolist()

    def scores(self, x: np.ndarray, how: str) -> np.ndarray:
        """x [N, F] float32 or float64 -> [N, K] float64 aggregated scores (how: one of AGGREGATES)."""
        self._check_features(x)
        n = x.shape[0]
        out = np.zeros((n, self.k), np.float64)
        if n == 0 or self.n_trees == 0:
            return out
        x = np.ascontiguousarray(x)
        if self.depth == 0:                    # every tree is a leaf: the same scores for every row
            self._aggregate(self.roots.reshape(1, -1), how, out[:1])
            out[1:] = out[0]
        elif n == 1 and self.top_value is not None and how in ("SUM", "AVERAGE"):
            self._aggregate(None, how, out, self._top_walk(x.reshape(-1), self.top_value).reshape(1, -1))
        elif n >= _TOP_MIN_ROWS and self.top_value is not None and how in ("SUM", "AVERAGE"):
            self._top_scores(x, how, out)
        else:
            self._walk_blocks(x, how, out)
        if how == "AVERAGE":
            out /= self.n_trees
        return out

    def _top_scores(self, x: np.ndarray, how: str, out: np.ndarray) -> None:
        """Rows x [N, F] of trees no deeper than the top levels (top_value): their SUM scores into out
        [N, K] (see the module's docstring, "Many rows"), in chunks spread over the threads."""
        n = x.shape[0]
        offsets, tested = self.top[5], self.top_tested
        trees = self.n_trees
        xt = np.zeros((x.shape[1], n + (-n % 8)), x.dtype)     # features x rows, rows padded to 8k
        xt[:, :n] = x.T
        thresholds = self.top_column[x.dtype]
        rows = self.top_chunk_rows

        def work(lo, hi):
            # the chunks' temporaries allocated once (flat, each chunk's a contiguous front part): fresh
            # blocks per chunk page-faulted (skl_gbc at 1000 rows: 3.8 vs 2.3 ms with malloc tuned)
            tested_values = np.empty(len(tested) * rows, x.dtype)
            outcomes = np.empty(len(tested) * rows, bool)
            index_buffer = np.empty(rows * trees, np.intp)
            value_buffer = np.empty(rows * trees, np.float64)
            for a in range(lo * rows, min(hi * rows, n), rows):
                chunk = xt[:, a:a + rows]
                r = chunk.shape[1]                              # a multiple of 8
                v = tested_values[:len(tested) * r].reshape(-1, r)           # [trees * 7, r]
                chunk.take(self.top_feature_rows, axis=0, out=v, mode="clip")
                cond = outcomes[:len(tested) * r].reshape(-1, r)
                if self.plain_test is not None:
                    self.plain_test(v, thresholds, out=cond)
                else:
                    cond = self.test(v, thresholds, lambda table: table[tested][:, None], out=cond)
                # eight rows' outcomes (bytes 0/1) per uint64: node j's outcome shifted to bit j, the
                # seven or-ed into each row's byte, the 7-bit code
                cond = cond.view(np.uint64).reshape(trees, 7, r // 8)
                code = cond[:, 0].copy()
                for j in range(1, 7):
                    code |= cond[:, j] << _SHIFTS[j]
                index = index_buffer[:r * trees].reshape(r, trees)
                np.add(code.view(np.uint8).T, offsets, out=index)           # [rows, trees] as the walk's
                m = min(r, n - a)
                values = value_buffer[:m * trees].reshape(m, trees)
                self.top_value.take(index[:m], out=values, mode="clip")
                self._aggregate(None, how, out[a:a + m], values)
        per_chunk = rows * trees * self.depth
        parallel.split(work, -(-n // rows), -(-_PARALLEL_STEPS // per_chunk))

    def _walk_blocks(self, x: np.ndarray, how: str, out: np.ndarray) -> None:
        """Rows x [N, F] (contiguous): their scores into out [N, K] (zeros), walked in blocks of about _CHUNK
        [rows, trees] elements. A forest whose walk tables outgrow the caches goes by groups of trees
        (self.group_trees, or more where the rows are too few to fill a block) whose tables stay cached
        through the levels: chunks of rows one after the other, each chunk's groups over the threads (taken
        as they come), its leaves (or their values) gathered for every tree before they are summed, in the
        order a walk of all trees at once sums them. A smaller forest goes by chunks of rows over all its
        trees, the chunks over the threads."""
        n, trees = x.shape[0], self.n_trees
        rows = min(n, max(1, _CHUNK // self.group_trees), max(1, _BLOCK_ROW_BYTES // max(1, x[:1].nbytes)),
                   max(1, _REACHED_BYTES // (8 * trees)))
        rows = -(-n // -(-n // rows))                        # chunks of equal rows
        group = min(trees, max(self.group_trees, _CHUNK // rows))
        if group == trees:
            rows = max(1, _CHUNK // trees)

            def work(lo, hi):
                for a in range(lo * rows, min(hi * rows, n), rows):
                    b = min(a + rows, n)
                    self._aggregate(self._leaves_walk(x[a:b]), how, out[a:b])
            parallel.split(work, -(-n // rows), -(-_PARALLEL_STEPS // (rows * trees * self.depth)))
            return
        groups = -(-trees // group)
        gathered = self.value is not None and how in ("SUM", "AVERAGE")     # the leaves' values, per group
        for a in range(0, n, rows):
            b = min(a + rows, n)
            reached = np.empty((b - a, trees), np.float64 if gathered else np.intp)

            def walk(k):         # (shared returns once every group is done: a, b, reached are this chunk's)
                g = slice(k * group, (k + 1) * group)
                leaves = self._leaves_walk(x[a:b], g)
                reached[:, g] = self.value.take(leaves) if gathered else leaves
            if (b - a) * trees * self.depth >= 2 * _PARALLEL_STEPS:
                parallel.shared(walk, groups)
            else:
                for k in range(groups):
                    walk(k)
            if gathered:
                self._aggregate(None, how, out[a:b], reached)
            else:
                self._aggregate(reached, how, out[a:b])

    def _leaves_walk(self, x: np.ndarray, trees: slice | None = None) -> np.ndarray:
        """[rows, trees] reached leaves, all trees (or the slice `trees` of them) advanced one level at a
        time (x: a contiguous chunk)."""
        rows, f = x.shape
        thresholds = self.threshold2[x.dtype]
        if rows == 1 and self.top is not None and trees is None:
            levels = self.top[0]
            node = self._top_walk(x.reshape(-1))
            if levels == self.depth:
                return node.reshape(1, -1)
            return self._row_walk(x.reshape(-1), 2 * node, levels, thresholds).reshape(1, -1)
        some = slice(None) if trees is None else trees
        roots = self.roots[some]
        width = roots.size
        # level 0: every row at the roots
        v = x.take(self.root_feature[some], axis=1)
        cond = self.test(v, self.root_threshold[x.dtype][some], lambda table: table[roots])
        if self.depth == 1:
            return self.next_node.take(self.roots_doubled[some] + cond)
        idx = self.next_doubled.take(self.roots_doubled[some] + cond)
        flat = x.reshape(-1)
        if rows == 1:
            return self._row_walk(flat, idx, 1, thresholds)
        row = (np.arange(rows, dtype=np.intp) * f)[:, None]
        at_feature = np.empty((rows, width), np.intp)
        value = np.empty((rows, width), x.dtype)
        threshold = np.empty((rows, width), x.dtype)
        cond = np.empty((rows, width), bool)
        for level in range(1, self.depth):
            # mode="clip" (the indices are in range by construction) skips the bounds checks and lets
            # take write into out= without a buffer
            self.feature2.take(idx, out=at_feature, mode="clip")
            np.add(at_feature, row, out=at_feature)
            flat.take(at_feature, out=value, mode="clip")
            thresholds.take(idx, out=threshold, mode="clip")
            idx += self.test(value, threshold, lambda table, idx=idx: table.take(idx // 2), out=cond)
            idx = (self.next_node if level == self.depth - 1 else self.next_doubled).take(idx, mode="clip")
        return idx

    def _row_walk(self, flat: np.ndarray, idx: np.ndarray, level: int, thresholds: np.ndarray) -> np.ndarray:
        """One row (flat [F]) from level `level` down: idx the doubled nodes reached there -> the leaves.
        Tiny arrays: fewer calls matter more than allocations."""
        for level in range(level, self.depth):
            # indices are in range by construction: mode="clip" skips the bounds checks
            v = flat.take(self.feature2.take(idx, mode="clip"), mode="clip")
            idx += self.test(v, thresholds.take(idx, mode="clip"), lambda table, idx=idx: table.take(idx // 2))
            idx = (self.next_node if level == self.depth - 1 else self.next_doubled).take(idx, mode="clip")
        return idx

    # -- aggregation ----------------------------------------------------------------------------------
    def _aggregation(self, weights: np.ndarray, has_weight: np.ndarray, owner: np.ndarray | None) -> None:
        """Choose how leaves' weights are summed (see the module's docstring) and build its tables; owner:
        the tree of each node (-1: unreachable), None when trees share nodes."""
        self.table = np.ascontiguousarray(weights.T)                # [K, nodes]
        self.has_weight = np.ascontiguousarray(has_weight.T)
        self.extreme = {"MIN": np.where(self.has_weight, self.table, np.inf),
                        "MAX": np.where(self.has_weight, self.table, -np.inf)}
        self.value = None
        per_leaf = has_weight.sum(axis=1)
        if owner is None or self.k == 0 or self.n_trees == 0 or per_leaf.max(initial=0) > 1:
            return
        # the target each node scores (-1: none), then each tree's: one target per tree or no fast path
        target = np.where(per_leaf == 1, np.argmax(has_weight, axis=1), -1)
        scored = (target >= 0) & (owner >= 0)          # an unreachable leaf never counts
        tree_target = np.full(self.n_trees, -1, np.int64)
        tree_target[owner[scored]] = target[scored]
        if (tree_target[owner[scored]] != target[scored]).any():
            return                              # a tree scores several targets
        order = np.argsort(tree_target, kind="stable")
        self.roots = self.roots[order]
        tree_target = tree_target[order]
        self.value = np.where(scored, weights[np.arange(self.n), np.maximum(target, 0)], 0.0)
        groups = tree_target >= 0
        firsts = np.nonzero(groups & np.r_[True, tree_target[1:] != tree_target[:-1]])[0]
        self.group_starts = firsts
        self.group_targets = tree_target[firsts]
        self.all_targets_in_order = self.group_targets.tolist() == list(range(self.k)) and firsts.size \
            and firsts[0] == 0

    def _aggregate(self, leaves: np.ndarray | None, how: str, out: np.ndarray, values=None) -> None:
        """Add the reached leaves' weights ([rows, trees] node indices) into out [rows, K] (zeros); values:
        the leaves' values when already gathered (SUM, AVERAGE with one value per node)."""
        if how in ("SUM", "AVERAGE"):
            if self.value is not None:
                if self.group_starts.size == 0:
                    return
                if values is None:
                    values = self.value.take(leaves)
                if self.group_starts.size == 1:
                    out[:, self.group_targets[0]] = values[:, self.group_starts[0]:].sum(axis=1)
                elif self.all_targets_in_order:
                    np.add.reduceat(values, self.group_starts, axis=1, out=out)
                else:
                    out[:, self.group_targets] = np.add.reduceat(values, self.group_starts, axis=1)
                return
            out += self.table.take(leaves, axis=1).sum(axis=2).T
            return
        gathered = self.extreme[how].take(leaves, axis=1)             # [K, rows, trees]
        reduced = (gathered.min(axis=2) if how == "MIN" else gathered.max(axis=2)).T
        scored = self.has_weight.take(leaves, axis=1).any(axis=2).T
        out[...] = np.where(scored, reduced, 0)


def _too_few_features(x: np.ndarray, max_feature: int, node: int):
    raise InvalidValueError(f"node {node} reads feature {max_feature} but X has {x.shape[1]} features "
                            f"(shape {list(x.shape)})")


def _jump_index(cond: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """The tested nodes' outcomes cond [trees * 8] (bool) -> each tree's index into the flat jump
    tables: its seven outcome bytes gathered into a 7-bit code (_GATHER), plus the tree's offset."""
    code = cond.view(np.int64)
    code *= _GATHER
    code >>= 56
    code += offsets
    return code


def _structure(roots, true_next, false_next, interior) -> tuple[int, np.ndarray | None]:
    """(depth, owner): the levels to walk from the roots until every path is at a leaf (ValueError on a
    cycle), and the tree each node belongs to (-1: unreachable; None when trees share a node)."""
    n = len(interior)
    owner = np.full(n, -1, np.int64)
    trees = np.arange(roots.size)
    owner[roots] = trees
    shared = bool((owner[roots] != trees).any())             # a root listed twice
    level, depth = roots, 0
    while True:
        level = level[interior[level]]
        if level.size == 0:
            return depth, None if shared else owner
        depth += 1
        if depth > n:
            raise ValueError("the trees contain a cycle (a node is its own descendant)")
        children = np.concatenate([true_next[level], false_next[level]])
        if not shared:
            parents = np.concatenate([owner[level], owner[level]])
            before = owner[children]
            owner[children] = parents
            shared = bool(((before >= 0) & (before != parents)).any() or (owner[children] != parents).any())
        reached = np.zeros(n, bool)
        reached[children] = True
        level = np.flatnonzero(reached)
