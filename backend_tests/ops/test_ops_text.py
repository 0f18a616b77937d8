"""Spec tests for the text operators: StringNormalizer, StringConcat, StringSplit, RegexFullMatch.

Every expected value is written out by hand (including non-ASCII text).
"""
from __future__ import annotations

import locale

import numpy as np
import pytest
from onnx import helper

import onnx_mini
from onnx_mini.errors import InvalidNodeError, KernelError
from onnx_mini.ops.text import re2_to_python

from helpers import assert_same, run_op


def S(values) -> np.ndarray:
    return np.array(values, dtype=object)


def run2(op, version, x, **attrs):
    """A one-node model with two outputs (StringSplit)."""
    node = helper.make_node(op, ["x"], ["y", "z"], name=f"my_{op}", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 8, x.shape)],
                              [helper.make_empty_tensor_value_info("y"), helper.make_empty_tensor_value_info("z")])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", version)], ir_version=10)
    return list(onnx_mini.prepare(m).run([x]))


# -- StringNormalizer ------------------------------------------------------------------------------

DAYS = S(["Monday", "tuesday", "WEDNESDAY", "monday", "Éclair"])


@pytest.mark.parametrize("attrs,expected", [
    ({}, ["Monday", "tuesday", "WEDNESDAY", "monday", "Éclair"]),
    ({"case_change_action": "NONE"}, ["Monday", "tuesday", "WEDNESDAY", "monday", "Éclair"]),
    ({"case_change_action": "LOWER"}, ["monday", "tuesday", "wednesday", "monday", "éclair"]),
    ({"case_change_action": "UPPER"}, ["MONDAY", "TUESDAY", "WEDNESDAY", "MONDAY", "ÉCLAIR"]),
    # stopwords: case-insensitive by default
    ({"stopwords": ["monday"]}, ["tuesday", "WEDNESDAY", "Éclair"]),
    ({"stopwords": ["MONDAY", "éclair"], "case_change_action": "UPPER"}, ["TUESDAY", "WEDNESDAY"]),
    ({"stopwords": ["monday"], "is_case_sensitive": 1}, ["Monday", "tuesday", "WEDNESDAY", "Éclair"]),
    ({"stopwords": ["Monday", "Éclair"], "is_case_sensitive": 1, "case_change_action": "LOWER"},
     ["tuesday", "wednesday", "monday"]),
    ({"stopwords": ["ÉCLAIR"], "is_case_sensitive": 0}, ["Monday", "tuesday", "WEDNESDAY", "monday"]),
    ({"stopwords": ["ÉCLAIR"], "is_case_sensitive": 1}, ["Monday", "tuesday", "WEDNESDAY", "monday", "Éclair"]),
])
def test_string_normalizer_1d_and_2d(attrs, expected):
    assert_same(run_op("StringNormalizer", 10, [DAYS], **attrs), S(expected))
    assert_same(run_op("StringNormalizer", 10, [DAYS.reshape(1, -1)], **attrs), S([expected]))


def test_string_normalizer_all_dropped_gives_one_empty_string():
    stop = {"stopwords": ["a", "b"], "case_change_action": "UPPER"}
    assert_same(run_op("StringNormalizer", 10, [S(["a", "B", "a"])], **stop), S([""]))
    assert_same(run_op("StringNormalizer", 10, [S([["b", "A"]])], **stop), S([[""]]))
    assert_same(run_op("StringNormalizer", 10, [S([])], **stop), S([""]))


def test_string_normalizer_non_ascii_case_mapping():
    # Python's full Unicode mapping: ß -> SS, final sigma, dotted capital I, Cyrillic, Greek
    x = S(["straße", "ΣΊΣΥΦΟΣ", "İstanbul", "Привет", "ǅ", "日本"])
    assert_same(run_op("StringNormalizer", 10, [x], case_change_action="UPPER"),
                S(["STRASSE", "ΣΊΣΥΦΟΣ", "İSTANBUL", "ПРИВЕТ", "Ǆ", "日本"]))
    assert_same(run_op("StringNormalizer", 10, [x], case_change_action="LOWER"),
                S(["straße", "σίσυφος", "i̇stanbul", "привет", "ǆ", "日本"]))
    # stopword matching folds case with the same mapping
    assert_same(run_op("StringNormalizer", 10, [x], stopwords=["ПРИВЕТ", "σίσυφος"]),
                S(["straße", "İstanbul", "ǅ", "日本"]))


@pytest.mark.parametrize("loc", [None, "", "en_US.UTF-8", "tr_TR.UTF-8", "C", "de_DE"])
def test_string_normalizer_does_not_depend_on_locale(loc):
    # the Turkish locale would lower-case I to dotless ı in a C-library implementation, and the C locale
    # would leave É alone; the locale attribute and the process locale change nothing here
    attrs = {} if loc is None else {"locale": loc}
    old = locale.setlocale(locale.LC_CTYPE)
    try:
        locale.setlocale(locale.LC_CTYPE, "C")
        out = run_op("StringNormalizer", 10, [S(["IŞIK", "ÉTÉ"])], case_change_action="LOWER", **attrs)
    finally:
        locale.setlocale(locale.LC_CTYPE, old)
    assert_same(out, S(["işik", "été"]))


def test_string_normalizer_errors():
    with pytest.raises(KernelError, match=r"shape \[C\] or \[1, C\], got \[2, 2\]"):
        run_op("StringNormalizer", 10, [S([["a", "b"], ["c", "d"]])])
    with pytest.raises(KernelError, match=r"got \[\]"):
        run_op("StringNormalizer", 10, [S("a")])
    with pytest.raises(InvalidNodeError, match="case_change_action.*'lower'"):
        run_op("StringNormalizer", 10, [S(["a"])], case_change_action="lower")
    with pytest.raises(KernelError, match="string tensor, got int64"):
        run_op("StringNormalizer", 10, [np.array([1, 2])])


def test_string_normalizer_leaves_the_input_alone():
    x = S(["A", "b"])
    out = run_op("StringNormalizer", 10, [x], case_change_action="LOWER")
    assert x.tolist() == ["A", "b"] and out.tolist() == ["a", "b"]


# -- StringConcat ----------------------------------------------------------------------------------

@pytest.mark.parametrize("x,y,expected", [
    (["abc", "def"], [".com", ".net"], ["abc.com", "def.net"]),
    (["cat", "dog"], ["s"], ["cats", "dogs"]),
    ("cat", "s", "cats"),                                              # 0-d
    (["a", ""], ["", "b"], ["a", "b"]),
    (["的", "中"], ["的", "中"], ["的的", "中中"]),
    ([["x"], ["y"]], ["1", "2", "3"], [["x1", "x2", "x3"], ["y1", "y2", "y3"]]),  # 2x1 with 3
    ("pre-", [["é", "ß"]], [["pre-é", "pre-ß"]]),
    ([], ["z"], []),
    (np.empty((0, 2), object), ["a", "b"], np.empty((0, 2), object)),
])
def test_string_concat(x, y, expected):
    out = run_op("StringConcat", 20, [S(x), S(y)])
    assert_same(out, S(expected) if not isinstance(expected, np.ndarray) else expected)


def test_string_concat_errors():
    with pytest.raises(KernelError, match=r"shapes \[2\] and \[3\] do not broadcast"):
        run_op("StringConcat", 20, [S(["a", "b"]), S(["a", "b", "c"])])
    with pytest.raises(KernelError, match="Y must be a string tensor"):
        run_op("StringConcat", 20, [S(["a"]), np.array([1])])


# -- StringSplit -----------------------------------------------------------------------------------

@pytest.mark.parametrize("x,attrs,substrings,lengths", [
    (["abc.com", "def.net"], {"delimiter": "."}, [["abc", "com"], ["def", "net"]], [2, 2]),
    (["o-n-n--x-", "o-n----nx"], {"delimiter": "-"},
     [["o", "n", "n", "", "x", ""], ["o", "n", "", "", "", "nx"]], [6, 6]),
    # no delimiter / "": runs of whitespace, trimmed at both ends
    (["hello world !", "  hello   world !", " hello world   ! "], {},
     [["hello", "world", "!"]] * 3, [3, 3, 3]),
    (["a\tb\n c", "x"], {"delimiter": ""}, [["a", "b", "c"], ["x", "", ""]], [3, 1]),
    (["a\u3000b"], {}, [["a", "b"]], [2]),                               # ideographic space is whitespace
    ([["hello world", "def.net"], ["o n n x", "the quick brown fox"]], {"maxsplit": 2},
     [[["hello", "world", ""], ["def.net", "", ""]], [["o", "n", "n x"], ["the", "quick", "brown fox"]]],
     [[2, 1], [3, 3]]),
    (["a,b,c", "d"], {"delimiter": ",", "maxsplit": 1}, [["a", "b,c"], ["d", ""]], [2, 1]),
    (["a,b"], {"delimiter": ",", "maxsplit": 0}, [["a,b"]], [1]),
    (["1<>2<>", "<>"], {"delimiter": "<>"}, [["1", "2", ""], ["", "", ""]], [3, 2]),  # multi-character
    (["日本語、テキスト"], {"delimiter": "、"}, [["日本語", "テキスト"]], [2]),
    (["", "a b"], {}, [["", ""], ["a", "b"]], [0, 2]),                  # an empty string has no substrings
    (["", ""], {"delimiter": ","}, [[], []], [0, 0]),
    (["   "], {}, [[]], [0]),
])
def test_string_split(x, attrs, substrings, lengths):
    y, z = run2("StringSplit", 20, S(x), **attrs)
    exp_y = S(substrings) if np.asarray(substrings, dtype=object).size else np.empty((len(x), 0), dtype=object)
    assert_same(y, exp_y)
    assert_same(z, np.array(lengths, np.int64))


def test_string_split_empty_inputs():
    y, z = run2("StringSplit", 20, S([]))
    assert_same(y, np.empty((0, 0), object))
    assert_same(z, np.empty((0,), np.int64))
    y, z = run2("StringSplit", 20, np.empty((2, 0), object), delimiter=",")
    assert_same(y, np.empty((2, 0, 0), object))
    assert_same(z, np.empty((2, 0), np.int64))
    y, z = run2("StringSplit", 20, S("a b"))                            # 0-d input: shape [2] / []
    assert_same(y, S(["a", "b"]))
    assert_same(z, np.array(2, np.int64))


def test_string_split_errors():
    with pytest.raises(InvalidNodeError, match="my_StringSplit.*maxsplit must be >= 0"):
        run2("StringSplit", 20, S(["a"]), maxsplit=-3)


# -- RegexFullMatch --------------------------------------------------------------------------------

@pytest.mark.parametrize("pattern,x,expected", [
    (r"www\.[\w.-]+\.\bcom\b", ["www.google.com", "www.facebook.com", "www.bbc.co.uk"], [True, True, False]),
    (r"(\W|^)[\w.\-]{0,25}@(yahoo|gmail)\.com(\W|$)", [["account@gmail.com", "account@hotmail.com"],
                                                         ["not email", "account2@yahoo.com"]],
     [[True, False], [False, True]]),
    (r"a+", ["aaa", "aab", "", "baa"], [True, False, False, False]),          # full match, not search
    (r"\d+", ["123", "١٢٣", "12a"], [True, False, False]),                   # \d is ASCII in RE2
    (r"\w+", ["abc_9", "été"], [True, False]),                               # so is \w
    (r".+", ["été", "日本", "a\nb"], [True, True, False]),                    # . is any character but \n
    (r"(?s).+", ["a\nb"], [True]),
    (r"(?i)straße", ["STRAßE", "straße"], [True, True]),
    (r"[[:alpha:]]+[[:digit:]]", ["abc1", "ab12"], [True, False]),
    (r"\Qa.b\E", ["a.b", "axb"], [True, False]),
    (r"a$", ["a", "a\n"], [True, False]),                                     # $ is the end of text
    (r"(?P<x>a)(?<y>b)", ["ab"], [True]),
    (r"\x{65e5}\x41", ["日A"], [True]),
    (r"\101\0", ["A\0"], [True]),                                             # octal escapes
    (r"", ["", "a"], [True, False]),
    (r"x*", [[], []], np.zeros((2, 0), bool)),
])
def test_regex_full_match(pattern, x, expected):
    out = run_op("RegexFullMatch", 20, [S(x)], pattern=pattern)
    assert_same(out, np.array(expected, dtype=bool))


@pytest.mark.parametrize("pattern,reason", [
    (r"(a)\1", "backreference"),
    (r"(?=a)a", "lookaround"),
    (r"(?!b)a", "lookaround"),
    (r"(?<=a)b", "lookaround"),
    (r"(?<!a)b", "lookaround"),
    (r"(?P<n>a)(?P=n)", "backreference"),
    (r"a++", "possessive"),
    (r"(?>a)", r"\(\?> groups"),
    (r"\pL", "Unicode class"),
    (r"(?U)a*", "ungreedy"),
    (r"[[:nope:]]", r"\[:nope:\]"),
    (r"(a", "missing"),
])
def test_regex_full_match_rejects_what_re2_lacks(pattern, reason):
    with pytest.raises(InvalidNodeError, match=f"rx.*not a supported RE2 regular expression.*{reason}"):
        node = helper.make_node("RegexFullMatch", ["x"], ["y"], name="rx", pattern=pattern)
        onnx_mini.run_node(node, [S(["a"])])


def test_regex_translation_keeps_python_meaning_out():
    # Python-only syntax that is not RE2 is not silently accepted either
    for pattern in (r"\Z", r"(?#comment)"):
        with pytest.raises(ValueError):
            re2_to_python(pattern)
    assert re2_to_python(r"\z") == r"\Z"


def test_regex_full_match_errors():
    with pytest.raises(InvalidNodeError, match="'pattern' is required"):
        run_op("RegexFullMatch", 20, [S(["a"])])
    with pytest.raises(KernelError, match="string tensor, got float32"):
        run_op("RegexFullMatch", 20, [np.zeros(2, np.float32)], pattern="a")
