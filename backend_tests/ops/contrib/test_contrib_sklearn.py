"""com.microsoft operators skl2onnx writes (onnx_mini/ops/contrib/{text,linalg}.py): Tokenizer,
MurmurHash3, CDist and Solve.

Expected values are written here by hand from onnxruntime's ContribOperators documentation (and, for
Solve, which onnxruntime lacks, scipy.linalg.solve's definition), or computed with formulas written in
this file: a scalar MurmurHash3_x86_32 on Python ints, distances by explicit loops. When onnxruntime is
installed, the same nodes are also cross-checked against it (skipped when it is absent or does not run
the operator)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import onnx_mini
from onnx_mini.errors import InvalidNodeError, KernelError
from onnx_mini.ops.contrib import linalg

from helpers import elem_type, raises_naming_node, run_node

MS = "com.microsoft"


def ms(op, inputs, **attrs):
    return run_node(op, 1, inputs, domain=MS, **attrs)


def strings(values):
    return np.array(values, dtype=object)


def tokenize(x, mark=0, pad_value="#", mincharnum=1, **attrs):
    return ms("Tokenizer", [strings(x)], mark=mark, pad_value=pad_value, mincharnum=mincharnum, **attrs)


def ort_run(op, inputs, **attrs):
    """The node run by onnxruntime (skips when it is absent or does not run the operator)."""
    ort = pytest.importorskip("onnxruntime")
    names = [f"in{k}" for k in range(len(inputs))]
    node = helper.make_node(op, names, ["out"], domain=MS, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, elem_type(x.dtype), None)
                                            for n, x in zip(names, inputs)],
                              [helper.make_empty_tensor_value_info("out")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)],
                              ir_version=8)
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:
        if "not a registered function/op" in str(e):
            pytest.skip(f"onnxruntime has no {MS}.{op}")
        raise
    return session.run(None, dict(zip(names, inputs)))[0]


# -- Tokenizer -------------------------------------------------------------------------------------

def test_tokenizer_separators_documented_example():
    y = tokenize(["Hello World", "I love computer science !"], separators=[" "])
    assert y.dtype == object and y.shape == (2, 5)
    assert y.tolist() == [["Hello", "World", "#", "#", "#"], ["I", "love", "computer", "science", "!"]]


def test_tokenizer_marks_frame_each_row_and_padding_goes_outside():
    y = tokenize([["Hello World", "a b c"], ["x", ""]], separators=[" "], mark=1, pad_value="P")
    assert y.shape == (2, 2, 5)          # [N, C, D + 2]
    assert y.tolist() == [[["\x02", "Hello", "World", "\x03", "P"], ["\x02", "a", "b", "c", "\x03"]],
                          [["\x02", "x", "\x03", "P", "P"], ["\x02", "\x03", "P", "P", "P"]]]


def test_tokenizer_mincharnum_drops_short_tokens():
    assert tokenize(["ab a abc", "é ab ééé"], separators=[" "], mincharnum=2).tolist() == \
        [["ab", "abc"], ["ab", "ééé"]]           # characters are counted, not UTF-8 bytes
    assert tokenize(["ab a abc"], separators=[" "], mincharnum=3, mark=1).tolist() == [["\x02", "abc", "\x03"]]


@pytest.mark.parametrize("mark", [0, 1])
def test_tokenizer_no_token_at_all_gives_an_empty_last_axis(mark):
    y = tokenize(["a b", "c"], separators=[" "], mincharnum=5, mark=mark)
    assert y.shape == (2, 0)              # [C][0], no marks
    assert tokenize([[""], [" "]], separators=[" "], mark=mark).shape == (2, 1, 0)


@pytest.mark.parametrize("shape,expected", [((0,), (0,)), ((2, 0), (2, 0)), ((0, 3), (0, 0))])
def test_tokenizer_empty_input(shape, expected):
    y = tokenize(np.empty(shape, object), separators=[" "])
    assert y.dtype == object and y.shape == expected


def test_tokenizer_character_modes():
    by_char = [["a", "b", "\n", "é", " ", "d"]]
    assert tokenize(["ab\né d"], separators=[""]).tolist() == by_char
    assert tokenize(["ab\né d"], tokenexp=".").tolist() == by_char    # "." here includes the newline
    assert tokenize(["abc", "de"], separators=[""], mark=1).tolist() == \
        [["\x02", "a", "b", "c", "\x03"], ["\x02", "d", "e", "\x03", "#"]]


def test_tokenizer_separators_apply_one_after_the_other():
    # the first separator splits the string, the next ones split each piece
    assert tokenize(["xabybz"], separators=["ab", "b"]).tolist() == [["x", "y", "z"]]
    assert tokenize(["xabybz"], separators=["b", "ab"]).tolist() == [["xa", "y", "z"]]
    assert tokenize(["abcabc"], separators=["ca", "bc"]).tolist() == [["ab"]]
    # each piece is a string of its own: ^ matches at its start
    assert tokenize(["ab ac"], separators=[" ", "^a"]).tolist() == [["b", "c"]]


def test_tokenizer_separators_are_re2_patterns():
    text = ['Some text. With, punct; here: and? there! (x) "q" it\'s - [b] @c\nnew']
    seps = [" ", "[.]", "\\?", ",", ";", ":", "\\!", "\\(", "\\)", "\n", '\\"', "'", "-", "\\[", "\\]", "@"]
    assert tokenize(text, separators=seps).tolist() == \
        [["Some", "text", "With", "punct", "here", "and", "there", "x", "q", "it", "s", "b", "c", "new"]]
    assert tokenize(["aXbYc", "Ab aB"], separators=["[XY]", "(?i)a"]).tolist() == [["b", "c"], ["b ", "B"]]


def test_tokenizer_empty_separator_match_removes_the_next_character():
    assert tokenize(["ab cd ef"], separators=["\\b"]).tolist() == [["b", "d", "f"]]
    assert tokenize(["abc"], separators=["^"]).tolist() == [["bc"]]
    assert tokenize(["abc"], separators=["$"]).tolist() == [["abc"]]
    assert tokenize(["xay", "q"], separators=["a*"]).shape == (2, 0)    # everything removed


def test_tokenizer_tokenexp():
    x = ["Hello, world! 12 ab_c", "the cat"]
    assert tokenize(x, tokenexp="[a-zA-Z0-9_]+").tolist() == [["Hello", "world", "12", "ab_c"],
                                                              ["the", "cat", "#", "#"]]
    assert tokenize(x, tokenexp="[a-z]+").tolist() == [["ello", "world", "ab", "c"], ["the", "cat", "#", "#"]]
    assert tokenize(["héllo wörld"], tokenexp="\\w+").tolist() == [["h", "llo", "w", "rld"]]   # RE2's ASCII \w
    assert tokenize(["ab cd"], tokenexp="^\\w").tolist() == [["a"]]      # each search sees the whole string
    assert tokenize(["ab cd"], tokenexp="\\b\\w").tolist() == [["a", "c"]]
    assert tokenize(["abcbb", "x"], tokenexp="b*").tolist() == [["b", "bb"], ["#", "#"]]   # empty matches dropped
    assert tokenize(["y"], tokenexp="x*|y").tolist() == [["y"]]


def test_tokenizer_alternatives_take_the_first_match_not_the_longest():
    # documented difference: RE2 in onnxruntime's longest-match mode gives ["ab", "ab"]
    assert tokenize(["abab"], tokenexp="a|ab").tolist() == [["a", "a"]]


def test_tokenizer_tokenexpsplit_makes_matches_separators():
    assert tokenize(["abc ef zoo", "abc,d"], tokenexp="[a-c]+", tokenexpsplit=1).tolist() == \
        [[" ef zoo"], [",d"]]


def test_tokenizer_separators_win_over_tokenexp():
    assert tokenize(["Hello World"], separators=[" "], tokenexp="o").tolist() == [["Hello", "World"]]


def test_tokenizer_text_that_is_not_utf8_keeps_its_bytes():
    y = tokenize(strings([b"ab\xff cd"]), separators=[" "])
    assert y.tolist() == [[b"ab\xff", b"cd"]]


@pytest.mark.parametrize("attrs,pattern", [
    (dict(), "separators and tokenexp"),
    (dict(separators=[" "], mincharnum=0), "mincharnum"),
    (dict(tokenexp=""), "tokenexp"),
    (dict(separators=[""], mincharnum=2), "mincharnum"),
    (dict(tokenexp="(?u)\\b\\w\\w+\\b"), "not a supported RE2"),     # onnxruntime's RE2 refuses (?u) too
    (dict(separators=[" ", "(a+)+"]), "separator"),
])
def test_tokenizer_bad_attributes(attrs, pattern):
    attrs = {"mark": 0, "pad_value": "#", "mincharnum": 1, **attrs}
    with raises_naming_node(InvalidNodeError, pattern):
        ms("Tokenizer", [strings(["a"])], **attrs)


def test_tokenizer_required_attributes():
    with raises_naming_node(InvalidNodeError, "pad_value"):
        ms("Tokenizer", [strings(["a"])], mark=0, mincharnum=1, separators=[" "])


@pytest.mark.parametrize("x,pattern", [
    (np.array([[["a"]]], object), "shape"),
    (np.array([1.0], np.float32), "string tensor"),
])
def test_tokenizer_bad_input(x, pattern):
    with raises_naming_node(KernelError, pattern):
        ms("Tokenizer", [x], mark=0, pad_value="#", mincharnum=1, separators=[" "])


ORT_TOKENIZER_CASES = [
    (["Hello World", "I love computer science !"], dict(separators=[" "], mark=1)),
    ([["Hello  World", "  lead"], [" ", "a,b;;c"]], dict(separators=[" ", ",", ";"])),
    (["xabybz", "abcabc"], dict(separators=["b", "ab", "ca"])),
    (["ab cd ef", "abc"], dict(separators=["\\b"])),
    (["xy zz"], dict(separators=["z*"])),
    (["héllo wörld", "a\nb"], dict(separators=[""], mark=1)),
    (["héllo wörld", "a\nb"], dict(tokenexp=".")),
    (["Hello, world! 12 ab_c", "", "x"], dict(tokenexp="[a-zA-Z0-9_]+", mincharnum=2)),
    (["abcbb", "ab cd"], dict(tokenexp="b*|\\b\\w")),
    (["a b", "c"], dict(separators=[" "], mincharnum=5, mark=1)),
    (np.empty((3, 0), object), dict(separators=[" "])),
]


@pytest.mark.parametrize("x,attrs", ORT_TOKENIZER_CASES)
def test_tokenizer_matches_onnxruntime(x, attrs):
    attrs = {"mark": 0, "pad_value": "#", "mincharnum": 1, **attrs}
    x = strings(x)
    expected = ort_run("Tokenizer", [x], **attrs)
    got = ms("Tokenizer", [x], **attrs)
    assert got.shape == expected.shape and got.tolist() == expected.tolist()


# -- MurmurHash3 -----------------------------------------------------------------------------------

def murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3_x86_32 on Python ints, byte by byte from its definition."""
    mask = 0xFFFFFFFF

    def rotl(x, r):
        return ((x << r) | (x >> (32 - r))) & mask

    def scramble(k):
        return (rotl((k * 0xCC9E2D51) & mask, 15) * 0x1B873593) & mask

    h = seed & mask
    full = len(data) // 4 * 4
    for i in range(0, full, 4):
        h ^= scramble(int.from_bytes(data[i:i + 4], "little"))
        h = (rotl(h, 13) * 5 + 0xE6546B64) & mask
    if len(data) > full:
        h ^= scramble(int.from_bytes(data[full:], "little"))
    h ^= len(data)
    h = ((h ^ (h >> 16)) * 0x85EBCA6B) & mask
    h = ((h ^ (h >> 13)) * 0xC2B2AE35) & mask
    return h ^ (h >> 16)


# published MurmurHash3_x86_32 test vectors
VECTORS = [("", 0, 0), ("", 1, 0x514E28B7), ("", 0xFFFFFFFF, 0x81F16F39), ("\0\0\0\0", 0, 0x2362F9DE),
           ("aaaa", 0x9747B28C, 0x5A97808A), ("Hello, world!", 0x9747B28C, 0x24884CBA),
           ("The quick brown fox jumps over the lazy dog", 0, 0x2E4FF723), ("hello", 0, 0x248BFA47)]


@pytest.mark.parametrize("text,seed,expected", VECTORS)
def test_murmur_known_vectors(text, seed, expected):
    assert murmur3_32(text.encode(), seed) == expected          # the reference of this file
    signed_seed = seed - (1 << 32) if seed >= 1 << 31 else seed   # an INT attribute is signed
    y = ms("MurmurHash3", [strings([text])], seed=signed_seed)
    assert y.dtype == np.uint32 and y.shape == (1,) and int(y[0]) == expected


def random_texts(n, seed=0):
    rng = np.random.default_rng(seed)
    alphabet = list("abcXYZ 019,.é€😀")
    return [''.join(rng.choice(alphabet, size=int(rng.integers(0, 23)))) for _ in range(n)]


@pytest.mark.parametrize("seed", [0, 42, -1])
def test_murmur_strings_against_the_reference(seed):
    texts = random_texts(200) + ["a" * 1000, "b"]
    y = ms("MurmurHash3", [strings(texts).reshape(2, -1)], seed=seed)
    assert y.dtype == np.uint32 and y.shape == (2, 101)
    assert y.reshape(-1).tolist() == [murmur3_32(t.encode("utf-8"), seed) for t in texts]


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.int64, np.uint64, np.float32, np.float64])
def test_murmur_numbers_hash_their_little_endian_bytes(dtype):
    x = np.array([[0, 1, 7], [123456789, 3, 250]]).astype(dtype)
    if dtype in (np.float32, np.float64):
        x[0, 0], x[0, 2] = -0.0, 1.5
    y = ms("MurmurHash3", [x[:, ::-1]], seed=5)            # a non-contiguous view
    assert y.dtype == np.uint32 and y.shape == (2, 3)
    expected = [murmur3_32(v.astype(np.dtype(dtype).newbyteorder("<")).tobytes(), 5) for v in x[:, ::-1].reshape(-1)]
    assert y.reshape(-1).tolist() == expected


def test_murmur_signed_output_and_shapes():
    x = strings(random_texts(12, seed=3)).reshape(3, 4)
    unsigned = ms("MurmurHash3", [x])
    signed = ms("MurmurHash3", [x], positive=0)
    assert signed.dtype == np.int32 and signed.shape == (3, 4)
    assert signed.view(np.uint32).tolist() == unsigned.tolist()
    scalar = ms("MurmurHash3", [np.array("hello", object)])
    assert scalar.shape == () and int(scalar) == 0x248BFA47
    assert ms("MurmurHash3", [np.empty((0, 2), object)]).shape == (0, 2)
    assert ms("MurmurHash3", [np.empty((2, 0), np.int64)]).shape == (2, 0)
    assert ms("MurmurHash3", [strings([b"\xff\xfe"])]).tolist() == [murmur3_32(b"\xff\xfe")]


def test_murmur_unsupported_type():
    with raises_naming_node(KernelError, "int8"):
        ms("MurmurHash3", [np.array([1], np.int8)])


@pytest.mark.parametrize("x", [strings(random_texts(50, seed=1)), np.arange(-5, 5, dtype=np.int64),
                               np.linspace(-2, 2, 7).astype(np.float32)], ids=["string", "int64", "float"])
@pytest.mark.parametrize("positive,seed", [(1, 0), (0, 77), (1, -3)])
def test_murmur_matches_onnxruntime(x, positive, seed):
    expected = ort_run("MurmurHash3", [x], positive=positive, seed=seed)
    got = ms("MurmurHash3", [x], positive=positive, seed=seed)
    assert got.dtype == expected.dtype and got.tolist() == expected.tolist()


# -- CDist -----------------------------------------------------------------------------------------

def loop_cdist(a, b, metric, p=2.0):
    """scipy's definitions, pair by pair, in float64."""
    out = np.zeros((len(a), len(b)))
    for i, u in enumerate(a.astype(np.float64)):
        for j, v in enumerate(b.astype(np.float64)):
            d = np.abs(u - v)
            out[i, j] = {"sqeuclidean": lambda: (d * d).sum(), "euclidean": lambda: math.sqrt((d * d).sum()),
                         "minkowski": lambda: (d ** p).sum() ** (1 / p), "cityblock": lambda: d.sum(),
                         "manhattan": lambda: d.sum(), "chebyshev": lambda: d.max(initial=0.0)}[metric]()
    return out


def test_cdist_by_hand():
    a = np.array([[0, 0], [1, 1], [3, 4]], np.float32)
    b = np.array([[0, 0], [1, 0]], np.float32)
    y = ms("CDist", [a, b])                                 # default: sqeuclidean
    assert y.dtype == np.float32 and y.tolist() == [[0, 1], [2, 1], [25, 20]]
    np.testing.assert_allclose(ms("CDist", [a, b], metric="euclidean"),
                               np.sqrt([[0, 1], [2, 1], [25, 20]]).astype(np.float32), rtol=1e-7)
    assert ms("CDist", [a, b], metric="cityblock").tolist() == [[0, 1], [2, 1], [7, 6]]
    assert ms("CDist", [a, b], metric="chebyshev").tolist() == [[0, 1], [1, 1], [4, 4]]


@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-6), (np.float64, 1e-12)])
@pytest.mark.parametrize("metric,attrs", [("sqeuclidean", {}), ("euclidean", {}), ("minkowski", {}),
                                          ("minkowski", dict(p=3.0)), ("minkowski", dict(p=1)),
                                          ("minkowski", dict(p=0.5)), ("cityblock", {}), ("manhattan", {}),
                                          ("chebyshev", {})])
def test_cdist_against_loops(metric, attrs, dtype, tol):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((9, 5)) + 2).astype(dtype)
    b = rng.standard_normal((7, 5)).astype(dtype)
    y = ms("CDist", [a, b], metric=metric, **attrs)
    assert y.dtype == dtype and y.shape == (9, 7)
    expected = loop_cdist(a, b, metric, float(attrs.get("p", 2.0)))
    np.testing.assert_allclose(y.astype(np.float64), expected, rtol=tol, atol=tol)


def test_cdist_is_never_negative_and_zero_for_equal_rows():
    a = np.array([[1000.1, 1000.2], [1000.3, 999.9], [1e4, -1e4]], np.float32)
    y = ms("CDist", [a, a.copy()])
    assert (y >= 0).all()
    np.testing.assert_allclose(np.diag(y), 0, atol=1e-7 * 2e8)     # float64's cancellation error on |a|^2
    np.testing.assert_allclose(y, loop_cdist(a, a, "sqeuclidean").astype(np.float32), rtol=1e-6, atol=2e-5)


def test_cdist_in_row_blocks(monkeypatch):
    monkeypatch.setattr(linalg, "BLOCK", 7)                  # a few rows per |a - b| block
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((11, 3)), rng.standard_normal((4, 3))
    np.testing.assert_allclose(ms("CDist", [a, b], metric="minkowski", p=3.0),
                               loop_cdist(a, b, "minkowski", 3.0), rtol=1e-12)


def test_cdist_constant_b_is_prepared_once_and_same_as_fed():
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((5, 4)).astype(np.float32)
    node = helper.make_node("CDist", ["A", "B"], ["Y"], domain=MS, metric="euclidean")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, None)],
                              [helper.make_empty_tensor_value_info("Y")], [numpy_helper.from_array(b, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)],
                              ir_version=10)
    prepared = onnx_mini.prepare(model)
    for k in range(2):
        x = a + k
        (y,) = prepared.run([x])
        np.testing.assert_array_equal(y, ms("CDist", [x, b], metric="euclidean"))


@pytest.mark.parametrize("na,nb,k", [(0, 3, 2), (3, 0, 2), (2, 3, 0)])
def test_cdist_empty(na, nb, k):
    y = ms("CDist", [np.ones((na, k), np.float32), np.ones((nb, k), np.float32)], metric="euclidean")
    assert y.dtype == np.float32 and y.shape == (na, nb) and not y.any()
    assert ms("CDist", [np.ones((na, k)), np.ones((nb, k))], metric="chebyshev").shape == (na, nb)


@pytest.mark.parametrize("attrs,pattern", [(dict(metric="cosine"), "cosine.*not supported"),
                                           (dict(metric="euclidean", p=2.0), "'minkowski' only"),
                                           (dict(metric="minkowski", p=0.0), "positive"),
                                           (dict(metric="minkowski", p=-1), "positive")])
def test_cdist_bad_attributes(attrs, pattern):
    with raises_naming_node(InvalidNodeError, pattern):
        ms("CDist", [np.ones((2, 2), np.float32)] * 2, **attrs)


@pytest.mark.parametrize("a,b,pattern", [
    (np.ones((2, 3), np.float32), np.ones((2, 4), np.float32), "same number of columns"),
    (np.ones((2, 3), np.float32), np.ones((2, 3), np.float64), "same element type"),
    (np.ones((2, 3), np.int64), np.ones((2, 3), np.int64), "float or double"),
    (np.ones(3, np.float32), np.ones((2, 3), np.float32), "2-D"),
])
def test_cdist_bad_inputs(a, b, pattern):
    with raises_naming_node(KernelError, pattern):
        ms("CDist", [a, b])


@pytest.mark.parametrize("metric", ["sqeuclidean", "euclidean"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cdist_matches_onnxruntime(metric, dtype):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((8, 6)).astype(dtype), rng.standard_normal((5, 6)).astype(dtype)
    expected = ort_run("CDist", [a, b], metric=metric)
    got = ms("CDist", [a, b], metric=metric)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    tol = 1e-5 if dtype == np.float32 else 1e-12        # onnxruntime expands in the input type
    np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)


# -- Solve -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("transposed,expected", [(0, [0.5, 1.0]), (1, [1.0, 0.0])])
def test_solve_by_hand(transposed, expected):
    # [[2, 1], [0, 1]] x = [2, 1]  ->  x = [0.5, 1];  its transpose [[2, 0], [1, 1]] x = [2, 1]  ->  [1, 0]
    a, y = np.array([[2, 1], [0, 1]], np.float32), np.array([2, 1], np.float32)
    x = ms("Solve", [a, y], transposed=transposed)
    assert x.dtype == np.float32 and x.tolist() == expected


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-4), (np.float64, 1e-10)])
@pytest.mark.parametrize("transposed", [0, 1])
@pytest.mark.parametrize("lower", [0, 1])
@pytest.mark.parametrize("shape", [(6,), (6, 3)])
def test_solve_satisfies_the_system(shape, lower, transposed, dtype, tol):
    rng = np.random.default_rng(4)
    a = (rng.standard_normal((6, 6)) + 6 * np.eye(6)).astype(dtype)     # general: lower is not used
    y = rng.standard_normal(shape).astype(dtype)
    x = ms("Solve", [a, y], lower=lower, transposed=transposed)
    assert x.dtype == dtype and x.shape == shape
    m = (a.T if transposed else a).astype(np.float64)
    np.testing.assert_allclose(m @ x.astype(np.float64), y, rtol=tol, atol=tol)


def test_solve_triangular_factor_as_skl2onnx_writes_it():
    rng = np.random.default_rng(5)
    low = np.tril(rng.standard_normal((5, 5))) + 4 * np.eye(5)
    y = rng.standard_normal((5, 2))
    x = ms("Solve", [low, y])
    expected = np.zeros_like(y)                     # forward substitution, row by row
    for i in range(5):
        expected[i] = (y[i] - low[i, :i] @ expected[:i]) / low[i, i]
    np.testing.assert_allclose(x, expected, rtol=1e-12, atol=1e-12)


def test_solve_empty_system():
    x = ms("Solve", [np.empty((0, 0)), np.empty((0, 2))])
    assert x.shape == (0, 2) and x.dtype == np.float64


@pytest.mark.parametrize("a,y,pattern", [
    (np.zeros((2, 2)), np.ones(2), "singular"),
    (np.ones((2, 3)), np.ones(2), "square"),
    (np.eye(2), np.ones(3), "shape"),
    (np.eye(2), np.ones((2, 2, 1)), "shape"),
    (np.eye(2, dtype=np.float32), np.ones(2), "same element type"),
    (np.eye(2, dtype=np.int64), np.ones(2, np.int64), "float or double"),
])
def test_solve_bad_inputs(a, y, pattern):
    with raises_naming_node(KernelError, pattern):
        ms("Solve", [a, y])


def test_solve_against_onnxruntime_when_it_has_the_op():
    a, y = np.array([[2, 1], [0, 1]], np.float32), np.array([2, 1], np.float32)
    expected = ort_run("Solve", [a, y])          # onnxruntime 1.32 has no Solve: skipped there
    np.testing.assert_allclose(ms("Solve", [a, y]), expected, rtol=1e-6)
