"""com.microsoft Tokenizer and MurmurHash3 (version 1 each): the text operators skl2onnx writes for
CountVectorizer / TfidfVectorizer and FeatureHasher.

Tokenizer, as onnxruntime runs it:
- `separators` (RE2 patterns) are applied one after the other: the first splits the string, the
  second splits each piece (a piece is a string of its own: `^` matches at its start), and so on. An
  empty match of a separator removes the character after it (so a separator that matches the empty
  string everywhere removes everything); `[""]` alone means one token per character;
- `tokenexp` (RE2): the tokens are its non-empty matches, searched left to right, each search starting
  after the previous token; `"."` means one token per character (newlines included). With
  `tokenexpsplit=1` (an attribute of mlprodict's runtime, not onnxruntime's) the matches separate the
  tokens instead, as a single separator would;
- tokens shorter than `mincharnum` characters are dropped; with `mark`, each row is framed by \\x02
  ... \\x03; rows are padded with `pad_value` to the longest. [C] -> [C, D], [N, C] -> [N, C, D]; when
  no string has a token, D = 0 (no marks); an empty [0] input gives [0], an empty [N, C] gives [N, 0].
Patterns are RE2 translated to Python's re (ops/text.py: RE2's ASCII \\w, \\d, \\s, \\b; RE2's
errors). One difference remains: RE2 runs here in onnxruntime's longest-match mode, re picks the
first alternative that matches, so patterns whose alternatives or optional parts allow a longer
match than the greedy first one ("a|ab", "a(b)??", "a*(ab)?") give shorter tokens here. Character
classes, literals and plain repetitions (what skl2onnx writes: "[a-zA-Z0-9_]+", ".", " ", "[.]")
give the same tokens.

MurmurHash3 is MurmurHash3_x86_32: strings hashed as their UTF-8 bytes, numbers as their
little-endian bytes (4 for int32/uint32/float, 8 for int64/uint64/double; -0.0 and 0.0 differ),
`seed` taken modulo 2**32, uint32 out when positive == 1, else the same bits as int32.
"""
from __future__ import annotations

import itertools
import re

import numpy as np

from ...errors import InvalidValueError
from ...registry import kernel
from .._common import check_shape
from ..text import _sre_parser, compile_re2

MS = "com.microsoft"
START, END = "\x02", "\x03"
_CONTEXT = re.compile(r"[$^]|\\[AbBZz]")    # what makes a match depend on where the string starts or ends


# -- Tokenizer -------------------------------------------------------------------------------------

def _split_on(rx, text: str) -> list[str]:
    """The pieces of text between the matches of rx (some empty). An empty match removes the character
    after it, unless a longer match starts there (re tries one after an empty match; RE2 would take it)."""
    out, pos = [], 0
    for m in rx.finditer(text):
        s, e = m.span()
        if s < pos:                    # the longer match at the place of an empty one: it replaces it
            pos = e
            continue
        out.append(text[pos:s])
        pos = e if e > s else e + 1
    if pos <= len(text):
        out.append(text[pos:])
    return out


def _splitter(rx):
    """text -> its pieces between rx's matches: re's own split when rx cannot match the empty string
    (the same pieces, found in C) and has no group (re.split would return the groups too)."""
    if rx.groups == 0 and _sre_parser.parse(rx.pattern, rx.flags).getwidth()[0] > 0:
        return rx.split
    return lambda text: _split_on(rx, text)


def _tokenizer_mode(separators, tokenexp, tokenexpsplit):
    """text -> its tokens (empty ones included), for the attributes; ValueError when they are invalid."""
    if separators:
        if separators == [""]:
            return None
        if not all(isinstance(s, str) for s in separators):
            raise ValueError("separators must be a list of UTF-8 strings")
        compiled = [compile_re2(s, "separator") for s in separators]
        first = _splitter(compiled[0])
        # (search, split, whether a match in a piece is a match in the whole string: no anchor, no \b)
        then = [(rx.search, _splitter(rx), not _CONTEXT.search(rx.pattern)) for rx in compiled[1:]]

        def split(text):
            pieces = first(text)
            for search, sep, free in then:
                if free and search(text) is None:      # in no piece either: skip the pieces
                    continue
                pieces = [p for piece in pieces if piece for p in sep(piece)]
            return pieces
        return split
    if tokenexp is None:
        raise ValueError("one of the attributes separators and tokenexp must be set")
    if not isinstance(tokenexp, str) or not tokenexp:
        raise ValueError(f"tokenexp must be a non-empty UTF-8 string, got {tokenexp!r}")
    if tokenexpsplit:
        return _splitter(compile_re2(tokenexp, "tokenexp"))
    if tokenexp == ".":
        return None
    rx = compile_re2(tokenexp, "tokenexp")
    if rx.groups == 0:                 # findall gives the whole matches, found in C
        return rx.findall
    return lambda text: [m.group() for m in rx.finditer(text)]


@kernel("Tokenizer", since=1, domain=MS)
def tokenizer_1(*, mark, pad_value, mincharnum, separators=None, tokenexp=None, tokenexpsplit=0):
    if not isinstance(mark, int) or not isinstance(mincharnum, int):
        raise ValueError(f"mark and mincharnum must be integers, got {mark!r} and {mincharnum!r}")
    if mincharnum < 1:
        raise ValueError(f"mincharnum must be positive, got {mincharnum}")
    if not isinstance(pad_value, str):
        raise ValueError("pad_value must be a UTF-8 string")
    split = _tokenizer_mode(separators, tokenexp, tokenexpsplit)
    if split is None:                  # one token per character
        if mincharnum > 1:
            raise ValueError(f"mincharnum={mincharnum} drops every token of character tokenization")
        split = list
    framed = 1 if mark else 0

    def tokens(s) -> list:
        if isinstance(s, bytes):       # not UTF-8: tokenized with its bytes kept, as RegexFullMatch does
            return [t.encode("utf-8", "surrogateescape")
                    for t in tokens(s.decode("utf-8", "surrogateescape"))]
        if not isinstance(s, str):
            raise InvalidValueError(f"X must hold strings, got {type(s).__name__}")
        if mincharnum == 1:
            return list(filter(None, split(s)))
        return [t for t in split(s) if len(t) >= mincharnum]

    def run(x):
        if x.dtype != object:
            raise InvalidValueError(f"X must be a string tensor, got {x.dtype}")
        if x.ndim not in (1, 2):
            raise InvalidValueError(f"X must have shape [C] or [N, C], got {list(x.shape)}")
        if x.size == 0:
            return np.empty(x.shape[:1] + (0,) * (x.ndim - 1), dtype=object)
        found = [tokens(s) for s in x.reshape(-1).tolist()]
        counts = list(map(len, found))
        most = max(counts)
        if most == 0:
            return np.empty(x.shape + (0,), dtype=object)
        n, width = len(found), most + 2 * framed
        check_shape((n, width), object, "Tokenizer output")
        # each string's tokens (framed) and its padding, laid end to end: [n, width] in one array call
        pad = itertools.repeat
        if framed:
            rows = (itertools.chain((START,), t, (END,), pad(pad_value, most - c)) for t, c in zip(found, counts))
        else:
            rows = (itertools.chain(t, pad(pad_value, most - c)) for t, c in zip(found, counts))
        flat = itertools.chain.from_iterable(rows)
        y = np.fromiter(flat, dtype=object, count=n * width)
        return y.reshape(x.shape + (width,))
    return run


# -- MurmurHash3 -----------------------------------------------------------------------------------

_C1, _C2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)
_TAIL_MASK = np.array([0, 0xFF, 0xFFFF, 0xFFFFFF], np.uint32)
_NUMBERS = frozenset(np.dtype(t) for t in (np.int32, np.uint32, np.int64, np.uint64, np.float32, np.float64))


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _scramble(k: np.ndarray) -> np.ndarray:
    return _rotl(k * _C1, 15) * _C2


def _block(h: np.ndarray, k: np.ndarray) -> np.ndarray:
    """h after one 4-byte block k (uint32 arrays, elementwise)."""
    return _rotl(h ^ _scramble(k), 13) * np.uint32(5) + np.uint32(0xE6546B64)


def _finish(h: np.ndarray, lengths) -> np.ndarray:
    h = h ^ np.asarray(lengths).astype(np.uint32)
    h = (h ^ (h >> np.uint32(16))) * np.uint32(0x85EBCA6B)
    h = (h ^ (h >> np.uint32(13))) * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def _hash_numbers(x: np.ndarray, seed: int) -> np.ndarray:
    """Every element of a fixed-width tensor hashed as its little-endian bytes."""
    little = np.ascontiguousarray(x, dtype=x.dtype.newbyteorder("<"))
    words = little.reshape(-1).view("<u4").astype(np.uint32).reshape(x.size, x.dtype.itemsize // 4)
    h = np.full(x.size, seed, np.uint32)
    for j in range(words.shape[1]):
        h = _block(h, words[:, j])
    return _finish(h, x.dtype.itemsize)


def _hash_bytes(keys: list[bytes], seed: int) -> np.ndarray:
    """Each key hashed, the block steps vectorised over the keys that still have a block."""
    n = len(keys)
    lengths = np.fromiter(map(len, keys), np.int64, n)
    starts = np.cumsum(lengths) - lengths
    raw = np.frombuffer(b"".join(keys) + b"\0\0\0", np.uint8).astype(np.uint32)
    # the little-endian word starting at every byte (the 3 zeros let the last ones start anywhere)
    words = raw[:-3] | (raw[1:-2] << np.uint32(8)) | (raw[2:-1] << np.uint32(16)) | (raw[3:] << np.uint32(24))
    blocks = lengths // 4
    order = np.argsort(-blocks, kind="stable")           # longest keys first: the active keys are a prefix
    first, left = starts[order], blocks[order]
    h = np.full(n, seed, np.uint32)
    for j in range(int(left[0]) if n else 0):
        active = int(np.searchsorted(-left, -j))           # keys with more than j blocks
        h[:active] = _block(h[:active], words[first[:active] + 4 * j])
    tail = lengths[order] & 3
    if words.size:                                       # 1 to 3 trailing bytes, zero-padded
        k = words[np.minimum(first + 4 * left, words.size - 1)] & _TAIL_MASK[tail]
        h ^= _scramble(k)                                # a key without a tail has k = 0: no change
    out = np.empty(n, np.uint32)
    out[order] = _finish(h, lengths[order])
    return out


@kernel("MurmurHash3", since=1, domain=MS)
def murmur_hash3_1(*, positive=1, seed=0):
    seed &= 0xFFFFFFFF                 # an unsigned 32-bit seed (as onnxruntime reads it)
    out_type = np.uint32 if positive == 1 else np.int32

    def key(s):
        if isinstance(s, str):
            return s.encode("utf-8", "surrogatepass")
        if isinstance(s, bytes):
            return s
        raise InvalidValueError(f"X must hold strings, got {type(s).__name__}")

    def run(x):
        if x.dtype == object:
            flat = x.reshape(-1).tolist()
            try:
                keys = [s.encode("utf-8", "surrogatepass") for s in flat]
            except AttributeError:     # bytes (text that is not UTF-8) or not a string
                keys = [key(s) for s in flat]
            h = _hash_bytes(keys, seed)
        elif x.dtype in _NUMBERS:
            h = _hash_numbers(x, seed)
        else:
            raise InvalidValueError(f"X must be a string, int32, uint32, int64, uint64, float or double tensor, "
                                    f"got {x.dtype}")
        return h.view(out_type).reshape(x.shape)
    return run
