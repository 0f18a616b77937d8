"""Text operators (onnx/defs/text): StringNormalizer, StringConcat, StringSplit, RegexFullMatch.

String tensors are numpy `object` arrays of Python str (bytes for text that is not UTF-8). Per-string
work goes through `np.frompyfunc` ufuncs; case mapping is Python's str.lower/upper (full Unicode case
mapping), so results never depend on the C library's locale.
"""
from __future__ import annotations

import itertools
import re

try:                                  # the parser of Python's own re module (3.11+; sre_parse before)
    from re import _constants as _SRE, _parser as _sre_parser
except ImportError:                   # pragma: no cover
    import sre_constants as _SRE
    import sre_parse as _sre_parser

import numpy as np

from ..errors import InvalidValueError
from ..registry import kernel
from ..dtypes import check_size
from ._common import check_shape

_lower = np.frompyfunc(lambda s: s.lower(), 1, 1)
_upper = np.frompyfunc(lambda s: s.upper(), 1, 1)
_length = np.frompyfunc(len, 1, 1)
_REPEATS = (_SRE.MAX_REPEAT, _SRE.MIN_REPEAT, getattr(_SRE, "POSSESSIVE_REPEAT", _SRE.MAX_REPEAT))


def _strings(x: np.ndarray, what: str = "input") -> np.ndarray:
    if x.dtype != object:
        raise InvalidValueError(f"{what} must be a string tensor, got {x.dtype}")
    return x


def _objects(result) -> np.ndarray:
    """A frompyfunc / object-ufunc result as an object ndarray (0-d inputs give a bare str)."""
    return result if result.__class__ is np.ndarray else np.array(result, dtype=object)


# -- StringNormalizer ------------------------------------------------------------------------------

@kernel("StringNormalizer", since=10, views=True)
def string_normalizer_10(*, case_change_action="NONE", is_case_sensitive=0, stopwords=None, locale=None):
    # locale only names the case mapping of the platform's C library; Python's Unicode mapping is used
    # for every locale so that results are the same everywhere.
    change = {"NONE": None, "LOWER": _lower, "UPPER": _upper}.get(case_change_action, False)
    if change is False:
        raise ValueError(f"case_change_action must be LOWER, UPPER or NONE, got {case_change_action!r}")
    if locale is not None and not isinstance(locale, str):
        raise ValueError("locale must be a string")
    words = [w if isinstance(w, str) else w.decode("utf-8", "surrogateescape") for w in stopwords or ()]
    fold = (lambda s: s) if is_case_sensitive else (lambda s: s.lower())
    stop = frozenset(map(fold, words))
    is_stop = np.frompyfunc(lambda s: fold(s) in stop, 1, 1) if stop else None

    def run(x):
        _strings(x)
        if not (x.ndim == 1 or (x.ndim == 2 and x.shape[0] == 1)):
            raise InvalidValueError(f"the input must have shape [C] or [1, C], got {list(x.shape)}")
        flat = x.reshape(-1)
        if is_stop is not None and flat.size:
            flat = flat[~_objects(is_stop(flat)).astype(bool)]
        if flat.size == 0:       # everything dropped (or nothing given): a single empty string
            flat = np.array([""], dtype=object)
        elif change is not None:
            flat = _objects(change(flat))
        return flat if x.ndim == 1 else flat.reshape(1, -1)
    return run


# -- StringConcat ----------------------------------------------------------------------------------

@kernel("StringConcat", since=20)
def string_concat_20():
    def run(x, y):
        _strings(x, "X")
        _strings(y, "Y")
        try:
            shape = np.broadcast_shapes(x.shape, y.shape)
        except ValueError:
            raise InvalidValueError(f"shapes {list(x.shape)} and {list(y.shape)} do not broadcast") from None
        count = check_size(shape, object, "StringConcat output")
        if count > x.size + y.size:       # broadcasting repeats strings: bound the characters it makes
            chars = sum(int(np.asarray(_length(v)).sum()) * (count // v.size) for v in (x, y) if v.size)
            check_size((chars,), np.uint8, f"StringConcat output (shape {list(shape)}, characters)")
        return _objects(np.add(x, y))
    return run


# -- StringSplit -----------------------------------------------------------------------------------

@kernel("StringSplit", since=20)
def string_split_20(*, delimiter=None, maxsplit=None):
    sep = delimiter or None              # unset or "": split on runs of whitespace, trimmed
    limit = -1 if maxsplit is None else maxsplit
    if limit < -1:
        raise ValueError(f"maxsplit must be >= 0, got {maxsplit}")
    # an empty string has no substrings, whatever the delimiter (as onnxruntime counts them)
    split = np.frompyfunc(lambda s: s.split(sep if isinstance(s, str) or sep is None else sep.encode(), limit)
                          if s else [], 1, 1)

    def run(x):
        _strings(x)
        flat = x.reshape(-1)        # 1-D, so that each split result stays one object (a list)
        parts = split(flat) if flat.size else flat
        counts = _length(parts).astype(np.int64) if flat.size else np.zeros(0, np.int64)
        width = int(counts.max()) if counts.size else 0
        y = np.full(check_shape((flat.size, width), object, "StringSplit output"), "", dtype=object)
        total = int(counts.sum())
        if total:
            rows = np.repeat(np.arange(flat.size), counts)
            cols = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
            y[rows, cols] = np.fromiter(itertools.chain.from_iterable(parts), dtype=object, count=total)
        return y.reshape(*x.shape, width), counts.reshape(x.shape)
    return run


# -- RegexFullMatch --------------------------------------------------------------------------------

# RE2 classes are ASCII-only; written out so that the rest of the pattern keeps Unicode semantics.
_IN_SET = {"d": "0-9", "w": "0-9A-Za-z_", "s": "\\t\\n\\f\\r ",
           "D": "\\x00-/:-\\U0010ffff", "W": "\\x00-/:-@\\[-\\^`{-\\U0010ffff",
           "S": "\\x00-\\x08\\x0b\\x0e-\\x1f!-\\U0010ffff"}
_CLASS = {"d": "[0-9]", "w": "[0-9A-Za-z_]", "s": "[\\t\\n\\f\\r ]", "D": "[^0-9]", "W": "[^0-9A-Za-z_]",
          "S": "[^\\t\\n\\f\\r ]", "b": "(?a:\\b)", "B": "(?a:\\B)"}
_POSIX = {"alnum": "0-9A-Za-z", "alpha": "A-Za-z", "ascii": "\\x00-\\x7f", "blank": "\\t ",
          "cntrl": "\\x00-\\x1f\\x7f", "digit": "0-9", "graph": "!-~", "lower": "a-z", "print": " -~",
          "punct": "!-/:-@\\[-`{-~", "space": "\\t\\n\\v\\f\\r ", "upper": "A-Z", "word": "0-9A-Za-z_",
          "xdigit": "0-9A-Fa-f"}
_PASS = set("afnrtvAx") | set("\\.+*?()|[]{}^$-/ ")  # escapes that mean the same in Python


def re2_to_python(pattern: str) -> str:
    """Translate an RE2 pattern to Python `re` syntax with RE2's meaning; ValueError for what RE2 lacks
    (backreferences, lookarounds, atomic groups, conditionals, possessive quantifiers) or what
    Python's re cannot express (\\p classes, \\C)."""
    out: list[str] = []
    multiline = bool(re.search(r"\(\?[a-zA-Z]*m", pattern))
    i, n = 0, len(pattern)

    def escape(j: int, in_set: bool) -> tuple[str, int]:
        """The Python text for the escape starting at pattern[j] == '\\', and the index after it."""
        if j + 1 >= n:
            raise ValueError("trailing backslash")
        c = pattern[j + 1]
        if c == "0" or (c in "1234567" and j + 2 < n and pattern[j + 2] in "01234567"):  # octal
            m = re.match(r"[0-7]{1,3}", pattern[j + 1:])
            return f"\\U{int(m.group(), 8):08x}", j + 1 + m.end()
        if c.isdigit():
            raise ValueError(f"backreference \\{c} (RE2 has no backreferences)")
        if c == "x" and j + 2 < n and pattern[j + 2] == "{":
            end = pattern.find("}", j + 3)
            if end < 0:
                raise ValueError("unterminated \\x{...}")
            return f"\\U{int(pattern[j + 3:end], 16):08x}", end + 1
        if c == "Q":
            end = pattern.find("\\E", j + 2)
            end = n if end < 0 else end
            text = pattern[j + 2:end]
            return (re.escape(text) if not in_set else "".join("\\" + ch for ch in text)), min(end + 2, n)
        if c == "E":
            return "", j + 2
        if c == "z" and not in_set:
            return "\\Z", j + 2
        if c in _IN_SET:
            return (_IN_SET[c] if in_set else _CLASS[c]), j + 2
        if c in "bB" and not in_set:
            return _CLASS[c], j + 2
        if c in "pP":
            raise ValueError(f"Unicode class \\{c} is not supported")
        if c in "CGKkZXRNgh":
            raise ValueError(f"\\{c} is not RE2 syntax (or not supported)")
        if c in _PASS or not c.isalnum():
            return "\\" + c, j + 2
        raise ValueError(f"unknown escape \\{c}")

    while i < n:
        c = pattern[i]
        if c == "\\":
            text, i = escape(i, False)
            out.append(text)
        elif c == "[":
            j = i + 1
            body = ["["]
            if j < n and pattern[j] == "^":
                body.append("^")
                j += 1
            first = True
            while j < n and (pattern[j] != "]" or first):
                first = False
                if pattern[j] == "\\":
                    text, j = escape(j, True)
                    body.append(text)
                elif pattern.startswith("[:", j):
                    end = pattern.find(":]", j + 2)
                    name = pattern[j + 2:end] if end > 0 else ""
                    if name not in _POSIX:
                        raise ValueError(f"unsupported character class [:{name}:]")
                    body.append(_POSIX[name])
                    j = end + 2
                elif pattern[j] in "[&~|":  # literal in RE2; Python warns about nested sets / set operations
                    body.append("\\" + pattern[j])
                    j += 1
                else:
                    body.append(pattern[j])
                    j += 1
            if j >= n:
                raise ValueError("missing ]")
            out.append("".join(body) + "]")
            i = j + 1
        elif c == "(" and pattern.startswith("(?", i):
            rest = pattern[i + 2:]
            if rest.startswith(("=", "!", "<=", "<!")):
                raise ValueError("lookaround assertions are not supported by RE2")
            if rest.startswith(("P=", "P>")):
                raise ValueError("named backreferences are not supported by RE2")
            if rest.startswith((">", "(", "#", "|")):
                raise ValueError(f"(?{rest[0]} groups are not supported by RE2")
            if rest.startswith(("<", "P<")):  # named group: (?<name>re) or (?P<name>re)
                out.append("(?P<")
                i += 3 if rest[0] == "<" else 4
                continue
            m = re.match(r"[a-zA-Z-]*", rest)
            if set(m.group()) - set("imsU-"):
                raise ValueError(f"unknown flag(s) in (?{m.group()}")
            if "U" in m.group():
                raise ValueError("the U (ungreedy) flag is not supported")
            out.append("(?")
            i += 2
        elif i + 1 < n and pattern[i + 1] == "+" and (c in "*+?" or (c == "}" and _closes_repeat(out))):
            raise ValueError("possessive quantifiers are not supported by RE2")
        elif c == "$" and not multiline:
            out.append("\\Z")  # RE2's $ is the end of the text, not "before a final newline"
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _closes_repeat(out: list[str]) -> bool:
    """The '}' about to be copied ends a {n}, {n,} or {n,m} repetition."""
    return re.search(r"\{\d+(,\d*)?$", "".join(out[-12:])) is not None


# Python's re backtracks and has no time limit: a pattern like (a+)+b takes 2**n steps on "a"*n. RE2
# (the spec's engine) never backtracks; we refuse, when the model is prepared, what makes re blow up:
MAX_PATTERN_LENGTH = 4096        # characters of the RE2 pattern
MAX_PATTERN_DEPTH = 64           # nested groups and repetitions


def check_pattern(python_pattern: str) -> None:
    """ValueError for a (translated) pattern that nests groups deeper than MAX_PATTERN_DEPTH or puts a
    variable repetition inside a repetition ((a+)+, (a*b?)*, (x{1,5}){2,}: exponential backtracking)."""
    try:
        tree = _sre_parser.parse(python_pattern)
    except RecursionError:
        raise ValueError(f"groups are nested deeper than {MAX_PATTERN_DEPTH} levels") from None
    # (subpattern, depth, inside a repetition that may repeat more than once)
    stack = [(tree, 0, False)]
    while stack:
        items, depth, repeated = stack.pop()
        if depth > MAX_PATTERN_DEPTH:
            raise ValueError(f"groups are nested deeper than {MAX_PATTERN_DEPTH} levels")
        for op, av in items:
            if op in _REPEATS:
                low, high, body = av
                if repeated and low != high:
                    raise ValueError("a variable repetition inside a repetition (as in (a+)+) can make the "
                                     "matcher backtrack exponentially; onnx_mini refuses nested quantifiers")
                stack.append((body, depth + 1, repeated or high > 1))
            elif op is _SRE.SUBPATTERN:
                stack.append((av[-1], depth + 1, repeated))
            elif op is _SRE.BRANCH:
                stack.extend((branch, depth + 1, repeated) for branch in av[1])
            elif op is _SRE.ATOMIC_GROUP:
                stack.append((av, depth + 1, repeated))


def compile_re2(pattern: str, what: str = "pattern") -> re.Pattern:
    """An RE2 pattern compiled with Python's re (re2_to_python, check_pattern); ValueError naming
    `what` for a pattern that is too long, not RE2 or not supported."""
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise ValueError(f"{what} of {len(pattern):,} characters is longer than onnx_mini accepts "
                         f"({MAX_PATTERN_LENGTH:,})")
    try:
        translated = re2_to_python(pattern)
        check_pattern(translated)
        return re.compile(translated)
    except (ValueError, re.error, RecursionError) as e:
        raise ValueError(f"{what} {pattern!r} is not a supported RE2 regular expression: {e}") from None


@kernel("RegexFullMatch", since=20)
def regex_full_match_20(*, pattern=None):
    if pattern is None:
        raise ValueError("attribute 'pattern' is required")
    compiled = compile_re2(pattern)

    def match(s):
        if isinstance(s, bytes):
            s = s.decode("utf-8", "surrogateescape")
        return compiled.fullmatch(s) is not None

    matcher = np.frompyfunc(match, 1, 1)

    def run(x):
        _strings(x)
        return _objects(matcher(x)).astype(bool) if x.size else np.zeros(x.shape, dtype=bool)
    return run
