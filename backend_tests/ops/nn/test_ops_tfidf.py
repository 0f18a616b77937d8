"""Spec tests for TfIdfVectorizer (9): n-gram and skip-gram counts worked out by hand.

The sequence [1, 2, 3, 1, 2, 3, 1] and the pool (in order) 1 | 3 | (1, 2) | (3, 1) | (1, 3) | (1, 2, 3):
  1-grams: 1 at 0, 3, 6 -> 3; 3 at 2, 5 -> 2 (a 1-gram is counted once whatever max_skip_count)
  2-grams, skip 0: (1,2) (2,3) (3,1) (1,2) (2,3) (3,1) -> (1,2) 2, (3,1) 2
           skip 1 (items i, i+2): (1,3) (2,1) (3,2) (1,3) (2,1) -> (1,3) 2
           skip 2 (items i, i+3): (1,1) (2,2) (3,3) (1,1) -> none
           skip 3 (items i, i+4): (1,2) (2,3) (3,1) -> (1,2) 1, (3,1) 1
           skip 4 (items i, i+5): (1,3) (2,1) -> (1,3) 1;  skip 5: (1,1) -> none
  3-grams, skip 0: (1,2,3) (2,3,1) (3,1,2) (1,2,3) (2,3,1) -> (1,2,3) 2
           skip 1 (i, i+2, i+4): (1,3,2) (2,1,3) (3,2,1) -> none;  skip 2: (1,1,1) -> none
"""
from __future__ import annotations

import numpy as np
import pytest

from onnx_mini.errors import InvalidNodeError, KernelError

from helpers import NODE, assert_same, np_type, run_node, type_params

SEQ = [1, 2, 3, 1, 2, 3, 1]
POOL = [1, 3, 1, 2, 3, 1, 1, 3, 1, 2, 3]
COUNTS = [0, 2, 8]                       # 1-grams from 0, 2-grams from 2, 3-grams from 8
WORDS = {1: "a", 2: "b", 3: "c", 9: "zz"}


def f32(values) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def tfidf(x, *, pool=POOL, strings=False, **attrs):
    attrs.setdefault("ngram_counts", COUNTS)
    attrs.setdefault("ngram_indexes", list(range(6)))
    attrs.setdefault("mode", "TF")
    attrs.setdefault("max_skip_count", 0)
    if strings:
        attrs["pool_strings"] = [WORDS[t] for t in pool]
    else:
        attrs["pool_int64s"] = pool
    return run_node("TfIdfVectorizer", 9, [x], **attrs)


@pytest.mark.parametrize("min_n,max_n,skip,expected", [
    (1, 3, 0, [3, 2, 2, 2, 0, 2]),
    (1, 3, 1, [3, 2, 2, 2, 2, 2]),
    (1, 3, 5, [3, 2, 3, 3, 3, 2]),
    (1, 1, 4, [3, 2, 0, 0, 0, 0]),
    (2, 2, 0, [0, 0, 2, 2, 0, 0]),
    (2, 2, 2, [0, 0, 2, 2, 2, 0]),
    (3, 3, 0, [0, 0, 0, 0, 0, 2]),
    (2, 3, 1, [0, 0, 2, 2, 2, 2]),
])
def test_tf_counts(min_n, max_n, skip, expected):
    x = np.array(SEQ, np.int64)
    attrs = dict(min_gram_length=min_n, max_gram_length=max_n, max_skip_count=skip)
    assert_same(tfidf(x, **attrs), f32(expected))
    words = np.array([WORDS[t] for t in SEQ], dtype=object)
    assert_same(tfidf(words, strings=True, **attrs), f32(expected))
    # one row is looked up by its items, a batch by ids and binary searches: the same counts
    assert_same(tfidf(np.array([SEQ, SEQ], np.int64), **attrs), f32([expected, expected]))
    assert_same(tfidf(np.array([words, words]), strings=True, **attrs), f32([expected, expected]))


@pytest.mark.parametrize("tname", [p.values[1] for p in type_params("TfIdfVectorizer", [9], "T")])
def test_every_input_type(tname):
    strings = tname == "string"
    rows = [SEQ[:6], [3, 1, 3, 9, 9, 1]]   # no n-gram spans two rows: (3, 1) would join row 0's end to row 1
    x = np.array([[WORDS[t] for t in r] for r in rows], dtype=object) if strings \
        else np.array(rows).astype(np_type(tname))
    # row 0 [1 2 3 1 2 3]: 1 x2, 3 x2, (1,2) x2, (3,1) x1, (1,3) skip 1 x2, (1,2,3) x2
    # row 1 [3 1 3 9 9 1]: 1 x2, 3 x2, (3,1) x1, (1,3) x1 (9 is in no n-gram)
    assert_same(tfidf(x, strings=strings, min_gram_length=1, max_gram_length=3, max_skip_count=1),
                f32([[2, 2, 2, 1, 2, 2], [2, 2, 0, 1, 1, 0]]))


def test_ngram_indexes_place_the_outputs():
    # output width = max(ngram_indexes) + 1; slot 4 belongs to no n-gram
    got = tfidf(np.array(SEQ, np.int32), min_gram_length=1, max_gram_length=3, max_skip_count=1,
                ngram_indexes=[5, 0, 2, 6, 1, 3])
    assert_same(got, f32([2, 2, 2, 2, 0, 3, 2]))


WEIGHTS = [0.5, 2.0, 1.5, 0.25, 3.0, 1.0]


@pytest.mark.parametrize("mode,expected", [
    ("TF", [3, 2, 2, 2, 0, 2]),                             # weights are ignored
    ("IDF", [0.5, 2.0, 1.5, 0.25, 0, 1.0]),                 # min(count, 1) * weight
    ("TFIDF", [1.5, 4.0, 3.0, 0.5, 0, 2.0]),                # count * weight
])
def test_modes_and_weights(mode, expected):
    x = np.array(SEQ, np.int64)
    assert_same(tfidf(x, mode=mode, weights=WEIGHTS, min_gram_length=1, max_gram_length=3), f32(expected))


def test_idf_without_weights_is_presence():
    x = np.array(SEQ, np.int64)
    assert_same(tfidf(x, mode="IDF", min_gram_length=1, max_gram_length=3), f32([1, 1, 1, 1, 0, 1]))


def test_levels_missing_from_the_pool():
    # ngram_counts [0, 0]: no 1-gram, the pool holds 2-grams only; 3-grams asked for but absent
    x = np.array([5, 6, 7, 8, 6, 7], np.int64)
    got = tfidf(x, pool=[5, 6, 7, 8, 6, 7], ngram_counts=[0, 0], ngram_indexes=[0, 1, 2],
                min_gram_length=1, max_gram_length=3)
    assert_same(got, f32([1, 1, 2]))           # (5,6), (7,8), (6,7) twice


def test_empty_inputs():
    assert_same(tfidf(np.zeros(0, np.int64), min_gram_length=1, max_gram_length=2), np.zeros(6, np.float32))
    assert_same(tfidf(np.zeros((2, 0), np.int32), min_gram_length=1, max_gram_length=2),
                np.zeros((2, 6), np.float32))
    assert_same(tfidf(np.zeros((0, 4), np.int64), min_gram_length=1, max_gram_length=2),
                np.zeros((0, 6), np.float32))
    # a sequence shorter than every n-gram asked for
    assert_same(tfidf(np.array([1, 2], np.int64), min_gram_length=3, max_gram_length=3),
                np.zeros(6, np.float32))


@pytest.mark.parametrize("x,strings,pattern", [
    (np.array(["a", "b"], dtype=object), False, "input"),
    (np.array([1, 2], np.int64), True, "input"),
    (np.zeros((1, 2, 3), np.int64), False, "1-D or 2-D"),
])
def test_bad_inputs(x, strings, pattern):
    with pytest.raises(KernelError, match=f"{NODE}.*{pattern}"):
        tfidf(x, strings=strings, min_gram_length=1, max_gram_length=2)


@pytest.mark.parametrize("attrs,pattern", [
    ({"mode": "BM25"}, "mode"),
    ({"min_gram_length": 3, "max_gram_length": 2}, "min_gram_length"),
    ({"min_gram_length": 0}, "min_gram_length"),
    ({"max_skip_count": -1}, "max_skip_count"),
    ({"ngram_indexes": [0, 1, 2]}, "ngram_indexes"),
    ({"weights": [1.0, 2.0]}, "weights"),
    ({"ngram_counts": [0, 3, 8]}, "2-grams"),                 # 5 items cannot be 2-grams
    ({"pool_strings": ["a"]}, "pool_strings"),                # both pools
])
def test_bad_attributes(attrs, pattern):
    attrs = {"min_gram_length": 1, "max_gram_length": 3, **attrs}
    with pytest.raises(InvalidNodeError, match=f"{NODE}.*{pattern}"):
        tfidf(np.array(SEQ, np.int64), **attrs)


def test_no_pool():
    with pytest.raises(InvalidNodeError, match=f"{NODE}.*pool_int64s"):
        run_node("TfIdfVectorizer", 9, [np.array(SEQ, np.int64)], mode="TF", min_gram_length=1, max_gram_length=1,
                 max_skip_count=0, ngram_counts=[0], ngram_indexes=[0])


@pytest.mark.parametrize("tname", ["int64", "string"])
def test_long_ngrams_of_a_large_vocabulary(tname):
    # 300 distinct tokens and 8-grams: 301^8 > 2^63, so an 8-gram read as one base-301 number overflows int64
    pool = list(range(300)) + [1, 2, 3, 4, 5, 6, 7, 8]
    seq = [1, 2, 3, 4, 5, 6, 7, 8, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0, 7, 0, 8, 299]
    name = {k: f"t{k}" for k in range(300)}
    x = np.array([name[t] for t in seq], dtype=object) if tname == "string" else np.array(seq, np.int64)
    attrs = dict(mode="TF", ngram_counts=[0, 300, 300, 300, 300, 300, 300, 300], ngram_indexes=list(range(301)),
                 max_gram_length=8, max_skip_count=1)
    if tname == "string":
        attrs["pool_strings"] = [name[t] for t in pool]
    else:
        attrs["pool_int64s"] = pool
    # skip 0 finds the 8-gram at 0, skip 1 at 8; 1-grams: 0 x7, 1..8 twice each, 299 once
    expected = np.zeros(301, np.float32)
    expected[300] = 2
    assert_same(run_node("TfIdfVectorizer", 9, [x], min_gram_length=8, **attrs), expected)
    expected[0], expected[1:9], expected[299] = 7, 2, 1
    assert_same(run_node("TfIdfVectorizer", 9, [x], min_gram_length=1, **attrs), expected)


def test_shared_output_slots_add_up():
    # two pool n-grams write to the same output coordinate: their (weighted) counts add
    x = np.array(SEQ, np.int64)
    attrs = dict(min_gram_length=1, max_gram_length=3, ngram_indexes=[0, 0, 1, 1, 2, 2], weights=WEIGHTS)
    assert_same(tfidf(x, mode="TF", **attrs), f32([5, 4, 2]))
    assert_same(tfidf(x, mode="TFIDF", **attrs), f32([3 * 0.5 + 2 * 2.0, 2 * 1.5 + 2 * 0.25, 0 + 2 * 1.0]))
    assert_same(tfidf(x, mode="IDF", **attrs), f32([0.5 + 2.0, 1.5 + 0.25, 1.0]))


@pytest.mark.parametrize("mode", ["TF", "IDF", "TFIDF"])
def test_one_row_is_the_row_of_the_batch(mode):
    # batch 1 looks n-grams up by their items and adds the misses in a spare slot: alone, [L] or [1, L],
    # a row gives what it gives inside a batch; 9 is in no pool n-gram, the last row matches nothing
    x = np.array([SEQ, [3, 1, 2, 9, 1, 3, 3], [9, 9, 9, 9, 9, 9, 9]], np.int64)
    attrs = dict(min_gram_length=1, max_gram_length=3, max_skip_count=1, ngram_indexes=[0, 0, 1, 2, 3, 4],
                 weights=WEIGHTS, mode=mode)
    batch = tfidf(x, **attrs)
    assert batch[2].tolist() == [0] * 5
    for i in range(len(x)):
        assert_same(tfidf(x[i:i + 1], **attrs), batch[i:i + 1])
        assert_same(tfidf(x[i], **attrs), batch[i])
        words = np.array([WORDS[t] for t in x[i]], dtype=object)
        assert_same(tfidf(words, strings=True, **attrs), batch[i])


@pytest.mark.parametrize("strings", [False, True])
def test_a_pool_ngram_listed_twice_counts_at_its_first_place(strings):
    # the pool lists 1 and (1, 2) twice each: every occurrence counts at the first listing's output slot
    pool, counts = [1, 3, 1, 1, 2, 1, 2], [0, 3]
    attrs = dict(pool=pool, strings=strings, ngram_counts=counts, ngram_indexes=[0, 1, 2, 3, 4],
                 min_gram_length=1, max_gram_length=2)
    seq = [WORDS[t] for t in SEQ] if strings else SEQ
    x = np.array(seq, dtype=object if strings else np.int64)
    expected = [3, 2, 0, 2, 0]             # 1 three times, 3 twice, (1, 2) twice
    assert_same(tfidf(x, **attrs), f32(expected))
    assert_same(tfidf(np.array([seq, seq], dtype=x.dtype), **attrs), f32([expected, expected]))
