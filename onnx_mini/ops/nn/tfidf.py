"""TfIdfVectorizer (9): counts of pool n-grams (with skips) in a 1-D sequence or each row of a 2-D batch.

The factory turns the pool into a vocabulary (sorted distinct tokens) and, per n-gram length n, a
sorted table of keys of the pool's n-grams (the n-gram -> pool entry lookup, built once). A key is the
n-gram's vocabulary ids read as one base-(V+1) integer, or, when V^n does not fit in int64, the ids'
bytes. At run time every token becomes its vocabulary id (an unknown token gets the id V, which no
pool n-gram uses), the n-grams of each length and skip are strided windows over those ids, and one
binary search per window finds its pool entry.

An n-gram of length n with skip s takes the items i, i + (s+1), ..., i + (n-1)(s+1) of a row (n-grams
never span two rows); every skip from 0 to max_skip_count is counted for n >= 2, a 1-gram once.
TF: counts; IDF: counts truncated to 1, times the weight; TFIDF: counts times the weight (several pool
n-grams sharing one output coordinate add up).
"""
from __future__ import annotations

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel


class _Keys:
    """Keys of rows of n vocabulary ids (each in [0, V]) that sort and compare like the rows."""

    def __init__(self, vocab_size: int, n: int):
        base = vocab_size + 1
        self.as_int = base ** n < 2 ** 63
        self.radix = np.array([base ** (n - 1 - j) for j in range(n)], dtype=np.int64) if self.as_int else None

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        """(..., n) int64 ids -> (...) keys."""
        if self.as_int:
            return ids @ self.radix
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        return ids.view(np.dtype((np.void, 8 * ids.shape[-1])))[..., 0]


class _Pool:
    """The pool: its vocabulary; per length n, levels[n] = (key function, sorted keys of the pool's
    n-grams, their numbers in the pool); per pool n-gram, its output slot and weight."""

    def __init__(self, pool: list, ngram_counts: list, ngram_indexes: list, weights, strings: bool):
        tokens = np.array(pool, dtype=object if strings else np.int64)
        self.vocab = np.unique(tokens) if tokens.size else tokens
        self.levels: dict[int, tuple] = {}
        starts = [int(s) for s in ngram_counts]
        if any(b < a for a, b in zip(starts, starts[1:])) or any(not 0 <= s <= len(pool) for s in starts):
            raise ValueError(f"ngram_counts {starts} must be non-decreasing start offsets within the pool "
                             f"of {len(pool)} items")
        first = 0                                     # number of n-grams of the lengths before n
        for level, begin in enumerate(starts):
            n = level + 1
            end = starts[level + 1] if level + 1 < len(starts) else len(pool)
            if (end - begin) % n:
                raise ValueError(f"the pool's {n}-grams span {end - begin} items, not a multiple of {n}")
            k = (end - begin) // n
            if k:
                keys = _Keys(len(self.vocab), n)
                ids = np.searchsorted(self.vocab, tokens[begin:end]).reshape(k, n)
                sorted_keys, first_pos = np.unique(keys(ids), return_index=True)  # a repeated n-gram: first entry
                self.levels[n] = (keys, sorted_keys, first + first_pos)
            first += k
        if first != len(ngram_indexes):
            raise ValueError(f"ngram_indexes has {len(ngram_indexes)} entries but the pool holds {first} n-grams")
        self.size = first
        self.slots = np.asarray(ngram_indexes, dtype=np.int64)
        self.weights = np.asarray(weights, dtype=np.float32)

    def ids(self, x: np.ndarray) -> np.ndarray:
        """Vocabulary id of each token; len(vocab) for a token not in the pool."""
        v = len(self.vocab)
        if v == 0:
            return np.zeros(x.shape, dtype=np.int64)
        try:
            pos = np.searchsorted(self.vocab, x)
        except TypeError as e:       # e.g. bytes (non-UTF-8 strings) next to str
            raise InvalidValueError(f"cannot compare the input strings with the pool: {e}") from None
        pos = np.minimum(pos, v - 1)
        return np.where(self.vocab[pos] == x, pos, v)

    def find(self, ids: np.ndarray, n: int, skip: int):
        """(rows, pool n-gram numbers) of every n-gram with this skip found in the rows of `ids`."""
        keys, table, numbers = self.levels[n]
        span = (n - 1) * (skip + 1) + 1
        # windows[r, i, j] = ids[r, i + j * (skip + 1)]
        windows = keys(np.lib.stride_tricks.sliding_window_view(ids, span, axis=1)[:, :, ::skip + 1])
        at = np.minimum(np.searchsorted(table, windows), len(table) - 1)
        hit = table[at] == windows
        return np.nonzero(hit)[0], numbers[at[hit]]


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
    # (n, skip) pairs to look for; a 1-gram has no skip
    searches = [(n, s) for n in range(min_gram_length, max_gram_length + 1) if n in pool.levels
                for s in range(max_skip_count + 1 if n > 1 else 1)]

    def run(X):
        if strings != (X.dtype == object):
            raise InvalidValueError(f"the pool holds {'strings' if strings else 'integers'} but the input is "
                                    f"{'strings' if X.dtype == object else X.dtype}")
        if X.ndim not in (1, 2):
            raise InvalidValueError(f"X must be 1-D or 2-D, got shape {list(X.shape)}")
        rows = X.reshape(1 if X.ndim == 1 else X.shape[0], X.shape[-1])
        n_rows, length = rows.shape
        ids = pool.ids(rows)
        found = [pool.find(ids, n, s) for n, s in searches if (n - 1) * (s + 1) < length]
        size = n_rows * width
        if not found:
            out = np.zeros(size, dtype=np.float32)
        else:
            row = np.concatenate([f[0] for f in found])
            gram = np.concatenate([f[1] for f in found])
            if mode == "IDF":                  # each n-gram found in a row counts once
                pairs = np.unique(row * pool.size + gram)
                row, gram = np.divmod(pairs, pool.size)
            where = row * width + pool.slots[gram]
            if mode == "TF":
                out = np.bincount(where, minlength=size).astype(np.float32)
            else:
                out = np.bincount(where, weights=pool.weights[gram], minlength=size).astype(np.float32)
        return out.reshape(width) if X.ndim == 1 else out.reshape(n_rows, width)
    return run
