"""TfIdfVectorizer (9): counts of pool n-grams (with skips) in a 1-D sequence or each row of a 2-D batch.

An n-gram of length n with skip s takes the items i, i + (s+1), ..., i + (n-1)(s+1) of a row (n-grams
never span two rows); every skip from 0 to max_skip_count is counted for n >= 2, a 1-gram once.
TF: counts; IDF: counts truncated to 1, times the weight; TFIDF: counts times the weight (several pool
n-grams sharing one output coordinate add up).

How (the factory builds the lookups once): every token becomes its vocabulary id (the pool's distinct
tokens; an unknown token gets the id V, which no pool n-gram uses): a dict for strings, a sorted array
and a binary search for integers. An n-gram is then found one item at a time: the code of its first k
items is the position of (code of the first k-1 items, k-th id) among the k-item prefixes of the pool's
n-grams (sorted integer keys code * (V+1) + id, one binary search per window), or "none" when no pool
n-gram starts so. Codes stay below the pool's size, so keys never overflow, whatever n and V. The
windows of one length and skip are strided slices of the ids, so each item of each (length, skip) is a
few numpy calls over all the rows at once. One row (batch 1) looks its n-grams up in dicts keyed by their
items instead (a token, or a tuple of tokens): the same numbers in fewer calls.
"""
from __future__ import annotations

import itertools

import numpy as np

from ... import memory
from ...errors import InvalidValueError
from ...registry import kernel


class _Pool:
    """The pool compiled: its vocabulary; prefixes[k] = (sorted keys of the k-item prefixes of the pool's
    n-grams followed by a sentinel no key equals, the pool n-gram number of each prefix that is itself a
    pool k-gram, else -1 (and -1 for "none")); per pool n-gram, its output slot and weight."""

    def __init__(self, pool: list, ngram_counts: list, ngram_indexes: list, weights, strings: bool):
        self.strings = strings
        if strings:       # ids in order of first appearance: a dict, no sort of Python strings
            self.lookup = {t: i for i, t in enumerate(dict.fromkeys(pool))}
            self.v = v = len(self.lookup)
            pool_ids = np.fromiter(map(self.lookup.__getitem__, pool), np.int64, len(pool))
        else:
            tokens = np.asarray(pool, dtype=np.int64)
            self.vocab = np.unique(tokens)
            self.v = v = len(self.vocab)
            pool_ids = np.searchsorted(self.vocab, tokens)
        starts = [int(s) for s in ngram_counts]
        if any(b < a for a, b in zip(starts, starts[1:])) or any(not 0 <= s <= len(pool) for s in starts):
            raise ValueError(f"ngram_counts {starts} must be non-decreasing start offsets within the pool "
                             f"of {len(pool)} items")
        grams: dict[int, tuple[np.ndarray, np.ndarray]] = {}    # n -> (ids [k, n], pool numbers [k])
        first = 0                                     # number of n-grams of the lengths before n
        for level, begin in enumerate(starts):
            n = level + 1
            end = starts[level + 1] if level + 1 < len(starts) else len(pool)
            if (end - begin) % n:
                raise ValueError(f"the pool's {n}-grams span {end - begin} items, not a multiple of {n}")
            k = (end - begin) // n
            if k:
                ids = pool_ids[begin:end].reshape(k, n)
                grams[n] = (ids, first + np.arange(k))
            first += k
        if first != len(ngram_indexes):
            raise ValueError(f"ngram_indexes has {len(ngram_indexes)} entries but the pool holds {first} n-grams")
        self.size = first
        self.lengths = set(grams)
        self.slots = np.asarray(ngram_indexes, dtype=np.int64)
        self.weights = np.asarray(weights, dtype=np.float32)
        # 1-item prefixes: the ids themselves; number1[id] = the pool 1-gram of that token, or -1
        self.number1 = np.full(v + 1, -1, np.int64)
        if 1 in grams:
            ids, numbers = grams[1]
            _first_numbers(self.number1, ids[:, 0], numbers)
        # one row: each pool n-gram by its items (a token, or the tuple of its n tokens) -> its number,
        # the first listed winning as in _first_numbers
        tokens = list(self.lookup) if strings else self.vocab.tolist()
        self.by_items: dict[int, dict] = {}
        for n, (ids, numbers) in grams.items():
            items = [[tokens[i] for i in column] for column in ids.T.tolist()]
            table = self.by_items[n] = {}
            for key, number in zip(items[0] if n == 1 else zip(*items), numbers.tolist()):
                table.setdefault(key, number)
        self.prefixes: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        codes = {n: ids[:, 0] for n, (ids, _) in grams.items()}     # each pool n-gram's prefix code so far
        for k in range(2, max(grams, default=1) + 1):
            longer = [n for n in grams if n >= k]
            keys = {n: codes[n] * (v + 1) + grams[n][0][:, k - 1] for n in longer}
            table = np.unique(np.concatenate([keys[n] for n in longer]))
            number = np.full(table.size + 1, -1, np.int64)
            if k in grams:
                _first_numbers(number, np.searchsorted(table, keys[k]), grams[k][1])
            for n in longer:
                codes[n] = np.searchsorted(table, keys[n])
            self.prefixes[k] = (np.append(table, np.iinfo(np.int64).max), number)

    def ids(self, x: np.ndarray) -> np.ndarray:
        """Vocabulary id of each token (x 2-D); V for a token not in the pool."""
        if self.strings:
            flat = x.reshape(-1).tolist()
            found = np.fromiter(map(self.lookup.get, flat, itertools.repeat(self.v)), np.int64, len(flat))
            return found.reshape(x.shape)
        if self.v == 0:
            return np.zeros(x.shape, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.vocab, x), self.v - 1)
        return np.where(self.vocab[pos] == x, pos, self.v)

    def row_numbers(self, tokens: list, searches) -> np.ndarray:
        """One row's tokens (a list): the pool number of every n-gram of each (length, skip) of
        `searches`, window after window (-1 where not in the pool), concatenated in that order: what
        numbers() gives for a row, found by dict lookups of the items."""
        found = []
        for n, skip in searches:
            step = skip + 1
            keys = tokens if n == 1 else zip(*[tokens[j * step:] for j in range(n)])
            found += map(self.by_items[n].get, keys, itertools.repeat(-1))
        return np.fromiter(found, np.int64, len(found))

    def numbers(self, ids: np.ndarray, n: int, skip: int) -> np.ndarray:
        """[rows, windows]: the pool number of the n-gram of length n with this skip starting at each
        window of each row of `ids`, -1 where it is not in the pool."""
        if n == 1:
            return self.number1.take(ids)
        step = skip + 1
        windows = ids.shape[1] - (n - 1) * step
        code = ids[:, :windows]
        for k in range(2, n + 1):
            table, number = self.prefixes[k]
            key = code * (self.v + 1) + ids[:, (k - 1) * step:(k - 1) * step + windows]
            pos = table.searchsorted(key)                 # < table.size: the sentinel is above every key
            code = np.where(table.take(pos) == key, pos, table.size - 1)    # table.size - 1: "none"
        return number.take(code)


# add.at's fast loop wants its values in the output's type: a float32 1, not a Python float (23 adds
# into a 5136-slot row: 2.6 vs 4.7 us; bench_apps' skl_tfidf_svc at 1000 rows, 23 k adds: 0.7 vs 5.4 ms)
_ONE = np.float32(1)


def _first_numbers(out: np.ndarray, at: np.ndarray, numbers: np.ndarray) -> None:
    """out[at[i]] = numbers[i], the first i winning where `at` repeats (a pool n-gram listed twice)."""
    unique, first = np.unique(at, return_index=True)
    out[unique] = numbers[first]


@kernel("TfIdfVectorizer", since=9)
def tfidf_vectorizer_9(*, max_gram_length, max_skip_count, min_gram_length, mode, ngram_counts,
                       ngram_indexes, pool_int64s=None, pool_strings=None, weights=None):
    if mode not in ("TF", "IDF", "TFIDF"):
        raise ValueError(f"mode must be 'TF', 'IDF' or 'TFIDF', got {mode!r}")
    if (pool_int64s is None) == (pool_strings is None):
        raise ValueError("exactly one of pool_int64s and pool_strings must be set")
    if not 1 <= min_gram_length <= max_gram_length:
        raise ValueError(f"need 1 <= min_gram_length <= max_gram_length, got {min_gram_length}, {max_gram_length}")
    if max_skip_count < 0:
        raise ValueError(f"max_skip_count must be >= 0, got {max_skip_count}")
    if any(i < 0 for i in ngram_indexes):
        raise ValueError(f"ngram_indexes must be >= 0, got {list(ngram_indexes)}")
    if weights is not None and len(weights) != len(ngram_indexes):
        raise ValueError(f"weights has {len(weights)} entries, ngram_indexes {len(ngram_indexes)}")
    strings = pool_strings is not None
    pool = _Pool(pool_strings if strings else pool_int64s, ngram_counts, ngram_indexes,
                 [1.0] * len(ngram_indexes) if weights is None else weights, strings)
    width = max(ngram_indexes, default=-1) + 1
    spare_slots = np.append(pool.slots, width)     # read at -1 (no pool n-gram): the spare slot past the row
    spare_weights = np.append(pool.weights, np.float32(0))
    # (n, skip) pairs to look for; a 1-gram has no skip
    searches = [(n, s) for n in range(min_gram_length, max_gram_length + 1) if n in pool.lengths
                for s in range(max_skip_count + 1 if n > 1 else 1)]

    def run(X):
        if strings != (X.dtype == object):
            raise InvalidValueError(f"the pool holds {'strings' if strings else 'integers'} but the input is "
                                    f"{'strings' if X.dtype == object else X.dtype}")
        if X.ndim not in (1, 2):
            raise InvalidValueError(f"X must be 1-D or 2-D, got shape {list(X.shape)}")
        rows = X.reshape(1 if X.ndim == 1 else X.shape[0], X.shape[-1])
        n_rows, length = rows.shape
        shape = (width,) if X.ndim == 1 else (n_rows, width)
        if rows.size and n_rows == 1:
            # batch 1: the n-grams looked up in dicts by their items, not by ids and binary searches (the
            # same numbers); the batch's float32 adds, a missing n-gram (-1) adding in a spare slot past
            # the row, dropped: no filter (for TF no slower than a bincount and its float32 copy). A
            # 12-token row, 1-2 grams, 5136 slots: 12-14 vs 20-24 us for the kernel (under load)
            number = pool.row_numbers(rows.reshape(-1).tolist(), searches)
            if mode == "IDF":                      # each n-gram found in a row counts once
                number = np.unique(number)
            out = np.zeros(width + 1, dtype=np.float32)
            np.add.at(out, spare_slots.take(number), _ONE if mode == "TF" else spare_weights.take(number))
            return out[:width].reshape(shape)
        if rows.size:
            ids = pool.ids(rows)
            found = [pool.numbers(ids, n, s) for n, s in searches if (n - 1) * (s + 1) < length]
            if found:
                number = np.concatenate(found, axis=1) if len(found) > 1 else found[0]
                row, col = np.nonzero(number >= 0)
                gram = number[row, col]
                if mode == "IDF":                  # each n-gram found in a row counts once
                    pairs = np.unique(row * pool.size + gram)
                    row, gram = np.divmod(pairs, pool.size)
                # float32 adds of small counts (and of weights: what onnxruntime adds) into the zeros
                out = memory.zeros(n_rows * width, np.float32)      # (memory.py: 20 MB at 1000 rows)
                np.add.at(out, row * width + pool.slots.take(gram), _ONE if mode == "TF" else pool.weights.take(gram))
                return out.reshape(shape)
        return np.zeros(shape, dtype=np.float32)
    return run
