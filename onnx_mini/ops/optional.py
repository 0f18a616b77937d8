"""Optional operators (onnx/defs/optional): an optional value is None (empty) or its element (a tensor
or a sequence), so wrapping is free and unwrapping is a None check.
"""
from __future__ import annotations

import numpy as np

from ..errors import InvalidValueError
from ..graph import TypeInfo
from ..registry import kernel

_TRUE, _FALSE = np.array(True), np.array(False)
for _a in (_TRUE, _FALSE):
    _a.flags.writeable = False


def _wrap(input=None):
    return input


@kernel("Optional", since=(15, 28), views=True)
def optional_15(*, type=None):
    # Without an input the `type` attribute (a TypeProto) names the empty optional's element type;
    # values carry no static type here, so it is checked, not stored.
    if type is not None and not isinstance(type, TypeInfo):
        raise ValueError("attribute 'type' must be a TypeProto")
    if type is not None and type.kind not in ("tensor", "sequence"):
        raise ValueError(f"attribute 'type': an optional holds a tensor or a sequence, not a {type.kind}")
    return _wrap


@kernel("OptionalHasElement", since=(15, 18, 28))
def optional_has_element_15():
    # 15: the input is an optional; 18+: it may also be a plain tensor/sequence (always true) or omitted.
    return lambda input=None: _FALSE if input is None else _TRUE


@kernel("OptionalGetElement", since=(15, 18, 28), views=True)
def optional_get_element_15():
    def run(input):
        if input is None:
            raise InvalidValueError("the optional input is empty: it holds no element to get "
                                    "(check it with OptionalHasElement first)")
        return input
    return run
