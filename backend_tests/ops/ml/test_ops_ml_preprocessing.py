"""Spec tests for the ai.onnx.ml preprocessing and encoding operators: ArrayFeatureExtractor, Binarizer,
CastMap, CategoryMapper, DictVectorizer, FeatureVectorizer, Imputer, LabelEncoder (1, 2, 4), Normalizer,
OneHotEncoder, Scaler, ZipMap; and map values (dict inputs checked against their declared types,
ZipMap's sequence of maps handed back as a list of dicts).

Every expected value is written by hand or computed by a plain formula transcribed from the spec.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import onnx_mini
from onnx_mini.errors import InputError, InvalidNodeError, KernelError
from onnx_mini.inputs import check_value
from onnx_mini.loader import type_info

from helpers import NODE, arr, assert_same, expect_kernel_error, i64, np_type, raises_naming_node, run_node, \
    type_params, versions

ML = "ai.onnx.ml"
S = object        # string tensors are object arrays
F32, F64 = np.float32, np.float64
T = TensorProto


def ml(op, inputs, version=1, **attrs):
    return run_node(op, version, inputs, domain=ML, **attrs)


def strs(values) -> np.ndarray:
    return np.array(values, dtype=object)


def f32(values) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_versions_are_the_ones_covered():
    assert versions("LabelEncoder", ML) == [1, 2, 4]
    for op in ("ArrayFeatureExtractor", "Binarizer", "CastMap", "CategoryMapper", "DictVectorizer",
               "FeatureVectorizer", "Imputer", "Normalizer", "OneHotEncoder", "Scaler", "ZipMap"):
        assert versions(op, ML) == [1], op


# -- map models ------------------------------------------------------------------------------------

def map_model(op, key_type, value_type, version=1, **attrs):
    """One node named NODE reading a map input X of map(key_type, tensor(value_type))."""
    map_type = helper.make_map_type_proto(key_type, helper.make_tensor_type_proto(value_type, None))
    x = helper.make_value_info("X", map_type)
    node = helper.make_node(op, ["X"], ["Y"], name=NODE, domain=ML, **attrs)
    graph = helper.make_graph([node], "g", [x], [helper.make_empty_tensor_value_info("Y")])
    return helper.make_model(graph, ir_version=10,
                             opset_imports=[helper.make_opsetid(ML, version), helper.make_opsetid("", 21)])


def run_map(op, key_type, value_type, value, **attrs):
    """Run through prepare().run and InferenceSession.run; both must agree. The caller's dict is left as it was."""
    model = map_model(op, key_type, value_type, **attrs)
    before = dict(value)
    out = onnx_mini.prepare(model).run([value])[0]
    again = onnx_mini.InferenceSession(model.SerializeToString()).run(None, {"X": value})[0]
    assert_same(again, out)
    assert value == before and type(value) is dict
    return out


# -- ArrayFeatureExtractor -------------------------------------------------------------------------

@pytest.mark.parametrize("version,tname", type_params("ArrayFeatureExtractor", [1], "T", ML))
def test_array_feature_extractor_every_type(version, tname):
    x = arr([[0, 1, 2, 3], [4, 5, 6, 7]], np_type(tname)) if tname != "string" else \
        strs([["a", "b", "c", "d"], ["e", "f", "g", "h"]])
    out = ml("ArrayFeatureExtractor", [x, i64([3, 0, 3])])
    exp = arr([[3, 0, 3], [7, 4, 7]], np_type(tname)) if tname != "string" else strs([["d", "a", "d"], ["h", "e", "h"]])
    assert_same(out, exp)


@pytest.mark.parametrize("shape,indices,expected", [
    ((4,), [2, 1], [[2, 1]]),                                          # 1-D X: one row [1, n]
    ((2, 2, 3), [[2], [0]], [[[2, 0], [5, 3]], [[8, 6], [11, 9]]]),   # Y of any shape: flattened
    ((2, 3), [1], [[1], [4]]),
])
def test_array_feature_extractor_shapes(shape, indices, expected):
    x = np.arange(np.prod(shape), dtype=F32).reshape(shape)
    assert_same(ml("ArrayFeatureExtractor", [x, i64(indices)]), f32(expected))


def test_array_feature_extractor_empty_indices():
    out = ml("ArrayFeatureExtractor", [np.ones((3, 2), F32), np.zeros(0, np.int64)])
    assert_same(out, np.zeros((3, 0), F32))


@pytest.mark.parametrize("indices", [[0, 4], [-1]])
def test_array_feature_extractor_out_of_range(indices):
    expect_kernel_error("ArrayFeatureExtractor", 1, [np.ones((2, 4), F32), i64(indices)], r"out of range",
                        domain=ML)


# -- Binarizer -------------------------------------------------------------------------------------

@pytest.mark.parametrize("version,tname", type_params("Binarizer", [1], "T", ML))
def test_binarizer_every_type(version, tname):
    dt = np_type(tname)
    x = arr([[-2, 0, 1], [2, 3, 1]], dt)
    assert_same(ml("Binarizer", [x], threshold=1.0), arr([[0, 0, 0], [1, 1, 0]], dt))
    assert_same(ml("Binarizer", [x], threshold=0.5), arr([[0, 0, 1], [1, 1, 1]], dt))
    assert_same(ml("Binarizer", [x]), arr([[0, 0, 1], [1, 1, 1]], dt))      # default threshold 0


def test_binarizer_floats():
    x = f32([np.nan, -np.inf, np.inf, 0.25, 0.5, 0.75])
    assert_same(ml("Binarizer", [x], threshold=0.5), f32([0, 0, 1, 0, 0, 1]))
    assert_same(ml("Binarizer", [np.zeros((0, 3), F64)], threshold=0.5), np.zeros((0, 3), F64))


# -- CastMap ---------------------------------------------------------------------------------------

CASTMAP_CASES = [  # (value type, map, attributes, expected)
    (T.FLOAT, {3: 1.5, 1: -2.75, 0: 4.0}, {}, f32([[4.0, -2.75, 1.5]])),
    (T.FLOAT, {3: 1.5, 1: -2.75, 0: 4.0}, {"cast_to": "TO_INT64"}, i64([[4, -2, 1]])),
    (T.FLOAT, {3: 1.5, 1: -2.75}, {"cast_to": "TO_STRING"}, strs([["-2.75", "1.5"]])),
    (T.FLOAT, {3: 1.5, 1: -2.75}, {"map_form": "SPARSE", "max_map": 5}, f32([[0, -2.75, 0, 1.5, 0]])),
    (T.FLOAT, {3: 1.5, 1: -2.75}, {"map_form": "SPARSE", "max_map": 4, "cast_to": "TO_INT64"}, i64([[0, -2, 0, 1]])),
    (T.FLOAT, {2: 0.5}, {"map_form": "SPARSE", "max_map": 3, "cast_to": "TO_STRING"}, strs([["", "", "0.5"]])),
    (T.FLOAT, {}, {}, np.zeros((1, 0), F32)),
    (T.FLOAT, {}, {"map_form": "SPARSE", "max_map": 2}, f32([[0, 0]])),
    (T.STRING, {5: "7", 2: "-3"}, {"cast_to": "TO_INT64"}, i64([[-3, 7]])),
    (T.STRING, {5: "7", 2: "2.5"}, {}, f32([[2.5, 7]])),
    (T.STRING, {5: "b", 2: "a"}, {"cast_to": "TO_STRING"}, strs([["a", "b"]])),
    (T.STRING, {1: "b"}, {"cast_to": "TO_STRING", "map_form": "SPARSE", "max_map": 3}, strs([["", "b", ""]])),
]


@pytest.mark.parametrize("value_type,value,attrs,expected", CASTMAP_CASES)
def test_cast_map(value_type, value, attrs, expected):
    assert_same(run_map("CastMap", T.INT64, value_type, value, **attrs), expected)


@pytest.mark.parametrize("value_type,value,attrs,pattern", [
    (T.FLOAT, {5: 1.0}, {"map_form": "SPARSE", "max_map": 5}, r"key 5 is out of range"),
    (T.FLOAT, {-1: 1.0}, {"map_form": "SPARSE", "max_map": 5}, r"key -1 is out of range"),
    (T.STRING, {1: "abc"}, {}, r"cannot convert"),
])
def test_cast_map_bad_values(value_type, value, attrs, pattern):
    with raises_naming_node(KernelError, pattern):
        run_map("CastMap", T.INT64, value_type, value, **attrs)


@pytest.mark.parametrize("attrs,pattern", [({"cast_to": "TO_DOUBLE"}, "cast_to"), ({"map_form": "FLAT"}, "map_form"),
                                           ({"map_form": "SPARSE", "max_map": 0}, "max_map")])
def test_cast_map_bad_attributes(attrs, pattern):
    with raises_naming_node(InvalidNodeError, pattern):
        onnx_mini.prepare(map_model("CastMap", T.INT64, T.FLOAT, **attrs))


# -- CategoryMapper --------------------------------------------------------------------------------

CATS = {"cats_strings": ["cat", "dog", "cow"], "cats_int64s": [1, 2, 5]}


def test_category_mapper_both_ways():
    assert_same(ml("CategoryMapper", [strs([["dog", "cow"], ["ant", "cat"]])], **CATS), i64([[2, 5], [-1, 1]]))
    assert_same(ml("CategoryMapper", [i64([5, 0, 1, 2])], **CATS), strs(["cow", "_Unused", "cat", "dog"]))
    assert_same(ml("CategoryMapper", [strs(["x", "dog"])], default_int64=42, **CATS), i64([42, 2]))
    assert_same(ml("CategoryMapper", [i64([[3], [2]])], default_string="?", **CATS), strs([["?"], ["dog"]]))
    assert_same(ml("CategoryMapper", [strs([])], **CATS), np.zeros(0, np.int64))


def test_category_mapper_errors():
    expect_kernel_error("CategoryMapper", 1, [f32([1])], "string or int64", domain=ML, **CATS)
    with raises_naming_node(InvalidNodeError, "differ in length"):
        ml("CategoryMapper", [i64([1])], cats_strings=["a"], cats_int64s=[1, 2])


# -- DictVectorizer --------------------------------------------------------------------------------

DICT_CASES = [  # (key type, value type, map, vocabulary attribute, expected)
    (T.STRING, T.INT64, {"c": 8, "a": 4}, {"string_vocabulary": ["a", "c", "b", "z"]}, i64([4, 8, 0, 0])),
    (T.INT64, T.STRING, {7: "x", 2: "y"}, {"int64_vocabulary": [2, 5, 7]}, strs(["y", "", "x"])),
    (T.INT64, T.FLOAT, {7: 1.5, 2: -1.0}, {"int64_vocabulary": [2, 5, 7]}, f32([-1.0, 0, 1.5])),
    (T.INT64, T.DOUBLE, {7: 0.1, 9: 2.0}, {"int64_vocabulary": [9, 7]}, np.array([2.0, 0.1], F64)),
    (T.STRING, T.FLOAT, {"b": 0.25}, {"string_vocabulary": ["a", "b"]}, f32([0, 0.25])),
    (T.STRING, T.DOUBLE, {"b": 0.1, "a": 3.0}, {"string_vocabulary": ["b", "a"]}, np.array([0.1, 3.0], F64)),
    # keys outside the vocabulary are ignored; a repeated vocabulary entry is filled at each place
    (T.STRING, T.FLOAT, {"q": 9.0, "a": 1.0}, {"string_vocabulary": ["a", "b", "a"]}, f32([1, 0, 1])),
    (T.STRING, T.FLOAT, {}, {"string_vocabulary": ["a", "b"]}, f32([0, 0])),
    (T.STRING, T.INT64, {}, {"string_vocabulary": ["a"]}, i64([0])),
]


@pytest.mark.parametrize("key_type,value_type,value,attrs,expected", DICT_CASES)
def test_dict_vectorizer_every_map_type(key_type, value_type, value, attrs, expected):
    assert_same(run_map("DictVectorizer", key_type, value_type, value, **attrs), expected)


def test_dict_vectorizer_key_kind_must_match_vocabulary():
    with raises_naming_node(KernelError, "integer keys but the node sets string_vocabulary"):
        run_map("DictVectorizer", T.INT64, T.FLOAT, {1: 2.0}, string_vocabulary=["a"])
    with raises_naming_node(InvalidNodeError, "exactly one"):
        onnx_mini.prepare(map_model("DictVectorizer", T.INT64, T.FLOAT, string_vocabulary=["a"], int64_vocabulary=[1]))


# -- map inputs ------------------------------------------------------------------------------------

@pytest.mark.parametrize("key_type,value_type,value,pattern", [
    (T.STRING, T.FLOAT, {1: 2.0}, r"key 1 \(int\) is not a string \(declared map\(string,tensor\(float\)\)\)"),
    (T.INT64, T.FLOAT, {"a": 2.0}, r"key 'a' \(str\) is not a int64"),
    (T.INT64, T.FLOAT, {1.0: 2.0}, r"key 1.0 \(float\) is not a int64"),
    (T.INT64, T.FLOAT, {2 ** 63: 2.0}, r"key 9223372036854775808 is out of the range of int64"),
    (T.INT64, T.FLOAT, {1: "x"}, r"value of key 1 'x' \(str\) is not a float"),
    (T.INT64, T.STRING, {1: 2.0}, r"value of key 1 2.0 \(float\) is not a string"),
    (T.STRING, T.INT64, {"a": 2.5}, r"value of key 'a' 2.5 \(float\) is not a int64"),
    (T.STRING, T.INT64, {"a": True}, r"value of key 'a' True \(bool\) is not a int64"),
])
def test_map_input_of_the_wrong_types(key_type, value_type, value, pattern):
    model = map_model("DictVectorizer", key_type, value_type,
                      **({"string_vocabulary": ["a"]} if key_type == T.STRING else {"int64_vocabulary": [1]}))
    with pytest.raises(InputError, match=r"input 'X': map " + pattern):
        onnx_mini.prepare(model).run([value])
    with pytest.raises(InputError, match=pattern):
        onnx_mini.InferenceSession(model).run(None, {"X": value})


def test_map_input_must_be_a_dict():
    model = map_model("DictVectorizer", T.STRING, T.FLOAT, string_vocabulary=["a"])
    with pytest.raises(InputError, match=r"expected a map \(map\(string,tensor\(float\)\)\) given as a dict, "
                                         r"got a tensor"):
        onnx_mini.prepare(model).run([f32([1])])


def test_map_input_accepts_numpy_scalars():
    out = run_map("DictVectorizer", T.INT64, T.FLOAT, {np.int64(2): np.float32(1.5), np.int32(3): 2},
                  int64_vocabulary=[3, 2])
    assert_same(out, f32([2, 1.5]))


def test_check_value_of_maps_and_sequences_of_maps():
    t = type_info(helper.make_sequence_type_proto(
        helper.make_map_type_proto(T.STRING, helper.make_tensor_type_proto(T.FLOAT, []))))
    got = check_value("s", t, ({"a": np.float32(0.5)}, {}))
    assert got == [{"a": 0.5}, {}] and type(got[0]["a"]) is float
    assert got[0].key_dtype == np.dtype(object) and got[1].value_dtype == np.dtype(F32)
    with pytest.raises(InputError, match=r"input 's\[1\]': map key 3"):
        check_value("s", t, [{"a": 1.0}, {3: 1.0}])
    with pytest.raises(InputError, match=r"input 's\[0\]': expected a map"):
        check_value("s", t, [[1.0]])


# -- FeatureVectorizer -----------------------------------------------------------------------------

@pytest.mark.parametrize("version,tname", type_params("FeatureVectorizer", [1], "T1", ML))
def test_feature_vectorizer_every_type(version, tname):
    dt = np_type(tname)
    a = arr([[1, 2, 3], [4, 5, 6]], dt)
    b = arr([[7], [8]], dt)
    # a cut to 2 columns, b padded to 3 columns
    out = ml("FeatureVectorizer", [a, b], inputdimensions=[2, 3])
    assert_same(out, f32([[1, 2, 7, 0, 0], [4, 5, 8, 0, 0]]))


def test_feature_vectorizer_forms():
    a, b = f32([[1, 2], [3, 4]]), np.array([[0.5], [1.5]], F64)
    assert_same(ml("FeatureVectorizer", [a, b]), f32([[1, 2, 0.5], [3, 4, 1.5]]))   # own widths
    assert_same(ml("FeatureVectorizer", [i64([1, 2]), f32([3])], inputdimensions=[2, 1]), f32([[1, 2, 3]]))
    assert_same(ml("FeatureVectorizer", [f32([[[1, 2], [3, 4]]])], inputdimensions=[3]), f32([[1, 2, 3]]))
    assert_same(ml("FeatureVectorizer", [np.zeros((0, 2), F32)], inputdimensions=[2]), np.zeros((0, 2), F32))


def test_feature_vectorizer_errors():
    expect_kernel_error("FeatureVectorizer", 1, [f32([[1], [2]]), f32([[1], [2], [3]])], "different batch sizes",
                        domain=ML)
    with raises_naming_node(InvalidNodeError, "2 entries for 1 inputs"):
        ml("FeatureVectorizer", [f32([[1]])], inputdimensions=[1, 1])


# -- Imputer ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("tname", ["float", "double"])
def test_imputer_floats(tname):
    dt = np_type(tname)
    x = arr([[np.nan, 1, 0], [2, np.nan, -1]], dt)
    # NaN replaced, one imputed value per feature
    out = ml("Imputer", [x], imputed_value_floats=[10, 20, 30], replaced_value_float=float("nan"))
    assert_same(out, arr([[10, 1, 0], [2, 20, -1]], dt))
    # the default replaced value is the schema's 0.0; one imputed value for every feature
    assert_same(ml("Imputer", [x], imputed_value_floats=[-5]), arr([[np.nan, 1, -5], [2, np.nan, -1]], dt))
    assert_same(ml("Imputer", [x], imputed_value_floats=[7], replaced_value_float=-1.0),
                arr([[np.nan, 1, 0], [2, np.nan, 7]], dt))


@pytest.mark.parametrize("tname", ["int64", "int32"])
def test_imputer_integers(tname):
    dt = np_type(tname)
    x = arr([[-1, 1, 0], [2, -1, -1]], dt)
    assert_same(ml("Imputer", [x], imputed_value_int64s=[10, 20, 30], replaced_value_int64=-1),
                arr([[10, 1, 0], [2, 20, 30]], dt))
    assert_same(ml("Imputer", [x], imputed_value_int64s=[9]), arr([[-1, 1, 9], [2, -1, -1]], dt))


def test_imputer_errors():
    expect_kernel_error("Imputer", 1, [f32([[1, 2, 3]])], "1 or one per feature", domain=ML,
                        imputed_value_floats=[1.0, 2.0])
    expect_kernel_error("Imputer", 1, [f32([1])], "needs imputed_value_floats", domain=ML, imputed_value_int64s=[1])
    expect_kernel_error("Imputer", 1, [i64([1])], "needs imputed_value_int64s", domain=ML, imputed_value_floats=[1.0])
    expect_kernel_error("Imputer", 1, [np.zeros(2, np.int32)], "do not fit", domain=ML,
                        imputed_value_int64s=[2 ** 40])
    with raises_naming_node(InvalidNodeError, "exactly one of imputed_value_floats, imputed_value_int64s"):
        ml("Imputer", [f32([1])], imputed_value_floats=[1.0], imputed_value_int64s=[1])


# -- LabelEncoder ----------------------------------------------------------------------------------

def test_label_encoder_1():
    classes = ["a", "b", "c"]
    assert_same(ml("LabelEncoder", [strs([["c", "a"], ["z", "b"]])], classes_strings=classes), i64([[2, 0], [-1, 1]]))
    assert_same(ml("LabelEncoder", [strs(["z"])], classes_strings=classes, default_int64=7), i64([7]))
    assert_same(ml("LabelEncoder", [i64([2, 0, 3, -1])], classes_strings=classes),
                strs(["c", "a", "_Unused", "_Unused"]))
    assert_same(ml("LabelEncoder", [i64([5, 1])], classes_strings=classes, default_string="?"), strs(["?", "b"]))
    expect_kernel_error("LabelEncoder", 1, [f32([1])], "string or int64", domain=ML, classes_strings=classes)


V2_KEYS = {"floats": [1.5, float("nan"), -2.0], "int64s": [3, -7, 0], "strings": ["x", "y", "z"]}
V2_VALUES = {"floats": [0.25, -1.0, 4.0], "int64s": [10, 20, 30], "strings": ["p", "q", "r"]}
V2_DTYPES = {"floats": F32, "int64s": np.int64, "strings": S}
V2_DEFAULTS = {"floats": -0.0, "int64s": -1, "strings": "_Unused"}


@pytest.mark.parametrize("version", [2, 4])
@pytest.mark.parametrize("key", list(V2_KEYS))
@pytest.mark.parametrize("value", list(V2_VALUES))
def test_label_encoder_list_attributes(version, key, value):
    keys, values = V2_KEYS[key], V2_VALUES[value]
    # each key in turn, then a value that is no key
    absent = {"floats": 9.0, "int64s": 99, "strings": "nope"}[key]
    x = np.array([keys[2], keys[0], absent, keys[1]], dtype=V2_DTYPES[key])
    out = ml("LabelEncoder", [x], version, **{f"keys_{key}": keys, f"values_{value}": values})
    exp = np.array([values[2], values[0], V2_DEFAULTS[value], values[1]], dtype=V2_DTYPES[value])
    assert_same(out, exp)
    if value == "floats":
        assert np.signbit(out[2])   # default_float is -0.0


@pytest.mark.parametrize("version", [2, 4])
def test_label_encoder_defaults_and_nan(version):
    x = f32([np.nan, 1.0, 2.0])
    out = ml("LabelEncoder", [x], version, keys_floats=[1.0, float("nan")], values_int64s=[5, 6], default_int64=0)
    assert_same(out, i64([6, 5, 0]))
    # a NaN of another bit pattern still matches the NaN key
    other_nan = np.array([0x7FC00001], np.uint32).view(F32)
    assert_same(ml("LabelEncoder", [other_nan], version, keys_floats=[float("nan")], values_strings=["n"]), strs(["n"]))
    out = ml("LabelEncoder", [strs(["a", "b"])], version, keys_strings=["a"], values_floats=[1.0], default_float=2.5)
    assert_same(out, f32([1.0, 2.5]))
    out = ml("LabelEncoder", [i64([[1], [2]])], version, keys_int64s=[1], values_strings=["one"], default_string="-")
    assert_same(out, strs([["one"], ["-"]]))


LE4_TYPES = type_params("LabelEncoder", [4], "T1", ML)


def le4_keys(dt):
    return strs(["k0", "k1", "k2"]) if dt == S else arr([-3, 7, 0], dt)


def le4_values(dt):
    return strs(["v0", "v1", "v2"]) if dt == S else arr([100, -200, 5], dt)


@pytest.mark.parametrize("key_t", [p.values[1] for p in LE4_TYPES])
@pytest.mark.parametrize("value_t", [p.values[1] for p in LE4_TYPES])
def test_label_encoder_4_every_type_pair(key_t, value_t):
    kd, vd = np.dtype(np_type(key_t)), np.dtype(np_type(value_t))
    keys, values = le4_keys(kd), le4_values(vd)
    absent = strs(["zz"]) if kd == S else arr([1], kd)
    x = np.concatenate([keys[[2, 0]], absent, keys[[1]]]).reshape(2, 2)
    default = {"string": "_Unused", "float": -0.0, "double": -0.0}.get(value_t, -1)
    out = ml("LabelEncoder", [x], 4, keys_tensor=keys, values_tensor=values)
    assert_same(out, np.array([[values[2], values[0]], [default, values[1]]], dtype=vd))
    # with a default_tensor
    d = strs(["D"]) if vd == S else arr([42], vd)
    out = ml("LabelEncoder", [x], 4, keys_tensor=keys, values_tensor=values, default_tensor=d)
    assert_same(out, np.array([[values[2], values[0]], [d[0], values[1]]], dtype=vd))


def test_label_encoder_4_mixed_forms():
    # keys from a list attribute, values from a tensor (the official value-only mapping form)
    out = ml("LabelEncoder", [strs(["b", "q"])], 4, keys_strings=["a", "b"], values_tensor=arr([1, 2], np.int16),
             default_tensor=arr([9], np.int16))
    assert_same(out, arr([2, 9], np.int16))
    # values_tensor without default_tensor: default_* of the values' kind
    out = ml("LabelEncoder", [i64([1, 5])], 4, keys_tensor=i64([1]), values_tensor=arr([0.5], F64), default_float=3.0)
    assert_same(out, np.array([0.5, 3.0], F64))
    out = ml("LabelEncoder", [i64([1, 5])], 4, keys_tensor=i64([1]), values_tensor=arr([4], np.int32), default_int64=8)
    assert_same(out, arr([4, 8], np.int32))
    # a repeated key: the last one wins
    out = ml("LabelEncoder", [i64([1, 2])], 4, keys_int64s=[1, 2, 1], values_int64s=[10, 20, 30])
    assert_same(out, i64([30, 20]))
    # NaN key given as a tensor, empty input
    out = ml("LabelEncoder", [arr([np.nan, 2], F64)], 4, keys_tensor=arr([np.nan], F64), values_tensor=strs(["n"]))
    assert_same(out, strs(["n", "_Unused"]))
    assert_same(ml("LabelEncoder", [np.zeros((0, 2), np.int64)], 4, keys_int64s=[1], values_strings=["a"]),
                np.zeros((0, 2), dtype=object))


@pytest.mark.parametrize("version,attrs,pattern", [
    (2, {"keys_int64s": [1], "values_int64s": [1, 2]}, "differ in length"),
    (2, {"keys_int64s": [1], "keys_strings": ["a"], "values_int64s": [1]}, "exactly one of keys_floats"),
    (2, {"keys_int64s": [1]}, r"exactly one of values_floats, values_int64s, values_strings must be set \(none"),
    (4, {"keys_tensor": i64([1]), "values_int64s": [1], "default_tensor": f32([1])}, "default_tensor is float"),
    (4, {"keys_tensor": i64([1]), "values_int64s": [1], "default_tensor": i64([1, 2])}, "one value"),
    (4, {"keys_tensor": np.ones(1, np.uint8), "values_int64s": [1]}, "element type uint8"),
    (4, {"keys_int64s": [1], "values_tensor": np.ones(1, np.int16), "default_int64": 70000}, "does not fit"),
])
def test_label_encoder_bad_attributes(version, attrs, pattern):
    with raises_naming_node(InvalidNodeError, pattern):
        ml("LabelEncoder", [i64([1])], version, **attrs)


@pytest.mark.parametrize("version", [2, 4])
def test_label_encoder_input_type_must_match_keys(version):
    expect_kernel_error("LabelEncoder", version, [strs(["a"])], "string tensor but the keys are int64", domain=ML,
                        keys_int64s=[1], values_int64s=[2])
    if version == 4:
        expect_kernel_error("LabelEncoder", 4, [np.ones(1, np.int32)], "int32 tensor but the keys are int64",
                            domain=ML, keys_int64s=[1], values_int64s=[2])
    bad = np.empty(2, dtype=object)
    bad[:] = ["a", [1]]
    # an input declared a string tensor holds str() of each element, as in onnxruntime ("[1]"); the
    # kernel's own check guards values reaching it unconverted (onnx_mini.run_node declares no types)
    assert_same(run_node("LabelEncoder", version, [bad], domain=ML, keys_strings=["a", "[1]"], values_int64s=[2, 3]),
                i64([2, 3]))
    node = helper.make_node("LabelEncoder", ["x"], ["y"], name=NODE, domain=ML, keys_strings=["a"], values_int64s=[2])
    with raises_naming_node(KernelError, r"non-string elements \(list\)"):
        onnx_mini.run_node(node, [bad], opset_version=version)


# -- Normalizer ------------------------------------------------------------------------------------

NORM_X = [[-3, 1, 2], [0, 0, 0], [1, 2, 2]]
NORM_CASES = {  # per row: divided by max / sum |x| / sqrt(sum x^2); a zero divisor leaves the row
    "MAX": [[-3 / 2, 1 / 2, 1], [0, 0, 0], [1 / 2, 1, 1]],
    "L1": [[-3 / 6, 1 / 6, 2 / 6], [0, 0, 0], [1 / 5, 2 / 5, 2 / 5]],
    "L2": [[-3 / 14 ** 0.5, 1 / 14 ** 0.5, 2 / 14 ** 0.5], [0, 0, 0], [1 / 3, 2 / 3, 2 / 3]],
}


@pytest.mark.parametrize("version,tname", type_params("Normalizer", [1], "T", ML))
@pytest.mark.parametrize("norm", list(NORM_CASES))
def test_normalizer_every_type(version, tname, norm):
    out = ml("Normalizer", [arr(NORM_X, np_type(tname))], norm=norm)
    assert out.dtype == F32
    np.testing.assert_allclose(out, f32(NORM_CASES[norm]), rtol=1e-6)


def test_normalizer_forms():
    assert_same(ml("Normalizer", [f32([2, 4])]), f32([0.5, 1]))              # default MAX, 1-D: one row
    assert_same(ml("Normalizer", [f32([[0, -4]])], norm="MAX"), f32([[0, -4]]))  # max 0: unchanged
    assert_same(ml("Normalizer", [np.zeros((2, 0), F32)], norm="L2"), np.zeros((2, 0), F32))
    with raises_naming_node(InvalidNodeError, "norm 'L3'"):
        ml("Normalizer", [f32([1])], norm="L3")


# -- OneHotEncoder ---------------------------------------------------------------------------------

@pytest.mark.parametrize("version,tname", type_params("OneHotEncoder", [1], "T", ML))
def test_one_hot_encoder_every_type(version, tname):
    if tname == "string":
        x, attrs = strs([["b", "q"], ["a", "b"]]), {"cats_strings": ["a", "b", "c"]}
    else:
        x, attrs = arr([[5, 8], [2, 5]], np_type(tname)), {"cats_int64s": [2, 5, 7]}
    out = ml("OneHotEncoder", [x], **attrs)
    assert_same(out, f32([[[0, 1, 0], [0, 0, 0]], [[1, 0, 0], [0, 1, 0]]]))


def test_one_hot_encoder_floats_are_cast_to_integers():
    x = np.array([2.9, -1.5, np.nan, np.inf, 7.0], F64)
    out = ml("OneHotEncoder", [x], cats_int64s=[7, 2, -1])
    assert_same(out, f32([[0, 1, 0], [0, 0, 1], [0, 0, 0], [0, 0, 0], [1, 0, 0]]))


def test_one_hot_encoder_zeros_0():
    assert_same(ml("OneHotEncoder", [i64([1])], cats_int64s=[1], zeros=0), f32([[1]]))
    expect_kernel_error("OneHotEncoder", 1, [strs(["a", "zz"])], r"category 'zz' is not in cats_strings.*zeros=0",
                        domain=ML, cats_strings=["a"], zeros=0)
    expect_kernel_error("OneHotEncoder", 1, [i64([3])], "needs cats_int64s", domain=ML, cats_strings=["a"])
    with raises_naming_node(InvalidNodeError, "exactly one of cats_int64s, cats_strings"):
        ml("OneHotEncoder", [i64([3])])


# -- Scaler ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("version,tname", type_params("Scaler", [1], "T", ML))
def test_scaler_every_type(version, tname):
    x = arr([[1, 2, 3], [4, 5, 6]], np_type(tname))
    out = ml("Scaler", [x], offset=[1.0, 2.0, 3.0], scale=[2.0, 0.5, -1.0])
    assert_same(out, f32([[0, 0, 0], [6, 1.5, -3]]))
    assert_same(ml("Scaler", [x], offset=[1.0], scale=[0.5]), f32([[0, 0.5, 1], [1.5, 2, 2.5]]))


def test_scaler_forms():
    assert_same(ml("Scaler", [f32([[1, 2]])], scale=[2.0, 3.0]), f32([[2, 6]]))        # no offset
    assert_same(ml("Scaler", [f32([[[1], [2]]])], offset=[1.0]), f32([[[0], [1]]]))    # no scale, rank 3
    # double input keeps its precision until the final rounding
    assert_same(ml("Scaler", [np.array([1e8 + 1], F64)], offset=[1e8], scale=[1.0]), f32([1]))
    expect_kernel_error("Scaler", 1, [f32([[1, 2, 3]])], "offset has 2 values", domain=ML, offset=[1.0, 2.0],
                        scale=[1.0, 1.0])
    with raises_naming_node(InvalidNodeError, "same length"):
        ml("Scaler", [f32([1])], offset=[1.0, 2.0], scale=[1.0])



def test_scaler_float32_matrices_broadcast_as_the_1d_attributes():
    # a 2-D float32 X takes the [1, n] copies of offset and scale: the same broadcasting as the 1-D ones
    x = f32([[1, 2, 3], [4, 5, 6]])
    assert_same(ml("Scaler", [x], offset=[1.0, 2.0, 3.0], scale=[2.0, 0.5, -1.0]), f32([[0, 0, 0], [6, 1.5, -3]]))
    assert_same(ml("Scaler", [x[:1]], offset=[0.5], scale=[4.0]), f32([[2, 6, 10]]))
    assert_same(ml("Scaler", [x[:, 1:2]], offset=[1.0, 2.0], scale=[1.0, 3.0]), f32([[1, 0], [4, 9]]))  # [2, 1]
    assert_same(ml("Scaler", [x.T], offset=[1.0, 2.0], scale=[1.0, 2.0]), f32([[0, 4], [1, 6], [2, 8]]))
    expect_kernel_error("Scaler", 1, [f32([[1, 2, 3, 4]])], "offset has 3 values", domain=ML,
                        offset=[1.0, 2.0, 3.0])

# -- ZipMap ----------------------------------------------------------------------------------------

def zipmap_model(**attrs):
    key = T.STRING if "classlabels_strings" in attrs else T.INT64
    out = helper.make_value_info("Z", helper.make_sequence_type_proto(
        helper.make_map_type_proto(key, helper.make_tensor_type_proto(T.FLOAT, []))))
    node = helper.make_node("ZipMap", ["X"], ["Z"], name=NODE, domain=ML, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", T.FLOAT, None)], [out])
    return helper.make_model(graph, ir_version=10,
                             opset_imports=[helper.make_opsetid(ML, 1), helper.make_opsetid("", 21)])


@pytest.mark.parametrize("attrs,x,expected", [
    ({"classlabels_strings": ["a", "b"]}, f32([[0.25, 0.75], [1, 0]]), [{"a": 0.25, "b": 0.75}, {"a": 1.0, "b": 0.0}]),
    ({"classlabels_int64s": [3, -1, 7]}, f32([[0.5, 1.5, -2]]), [{3: 0.5, -1: 1.5, 7: -2.0}]),
    ({"classlabels_strings": ["b", "a"]}, f32([[0.125, 0.1]]), [{"b": 0.125, "a": float(np.float32(0.1))}]),
    ({"classlabels_int64s": [1]}, f32([4]), [{1: 4.0}]),            # 1-D: one row
    ({"classlabels_strings": ["a"]}, np.zeros((0, 1), F32), []),
])
def test_zipmap(attrs, x, expected):
    model = zipmap_model(**attrs)
    for out in (onnx_mini.prepare(model).run([x])[0],
                onnx_mini.InferenceSession(model.SerializeToString()).run(None, {"X": x})[0]):
        assert type(out) is list and out == expected
        assert all(type(d) is dict for d in out)
        assert all(type(k) is type(next(iter(expected[0]))) and type(v) is float for d in out for k, v in d.items())
    sess = onnx_mini.InferenceSession(model)
    assert sess.get_outputs()[0].type == f"seq(map({'string' if 'classlabels_strings' in attrs else 'int64'},"\
                                         f"tensor(float)))"


def test_zipmap_results_belong_to_the_caller():
    model = zipmap_model(classlabels_strings=["a"])
    prepared = onnx_mini.prepare(model)
    first = prepared.run([f32([[1]])])[0]
    first[0]["a"] = 99.0
    first.append("junk")
    assert prepared.run([f32([[1]])])[0] == [{"a": 1.0}]


def test_zipmap_errors():
    with raises_naming_node(KernelError, "3 columns but there are 2 class labels"):
        onnx_mini.prepare(zipmap_model(classlabels_strings=["a", "b"])).run([f32([[1, 2, 3]])])
    with raises_naming_node(KernelError, "1-D or 2-D"):
        onnx_mini.prepare(zipmap_model(classlabels_strings=["a"])).run([f32([[[1]]])])
    with raises_naming_node(InvalidNodeError, "exactly one"):
        onnx_mini.prepare(zipmap_model(classlabels_strings=["a"], classlabels_int64s=[1]))
    with raises_naming_node(InvalidNodeError, "repeat a label"):
        onnx_mini.prepare(zipmap_model(classlabels_int64s=[1, 1]))


@pytest.mark.parametrize("labels", [[3, -1], ["a", "b", "c"], list(range(16)), [f"c{j}" for j in range(17)]])
def test_zipmap_many_rows(labels):
    # many rows: one dict per row, keys the labels in their order, values the row's Python floats (up
    # to 16 labels through a dict display written for their count, beyond through zip per row)
    rng = np.random.default_rng(len(labels))
    x = rng.standard_normal((50, len(labels))).astype(F32)
    out = onnx_mini.prepare(zipmap_model(**{"classlabels_strings" if isinstance(labels[0], str)
                                            else "classlabels_int64s": labels})).run([x])[0]
    assert len(out) == 50
    for d, row in zip(out, x):
        assert list(d) == labels
        assert [v for v in d.values()] == [float(v) for v in row]
        assert all(type(v) is float for v in d.values())
    assert out[0] is not out[1]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("k", [1, 2, 3, 5, 7, 8, 9])
def test_row_reduce_is_numpys_reduction(dtype, k):
    # rows of few columns are summed / maxed column by column, left to right: the bits of numpy's
    # reductions over each row (sums of non-negative values; a NaN propagates), across magnitudes
    from onnx_mini.ops.ml._common import row_reduce
    rng = np.random.default_rng(k)
    s = (rng.standard_normal((3000, k)) * 10.0 ** rng.uniform(-8, 8, (3000, k))).astype(dtype)
    s[rng.random(s.shape) < 0.01] = np.nan
    for ufunc, v in ((np.add, np.abs(s)), (np.maximum, s)):
        got = row_reduce(ufunc, v)
        assert got.shape == (3000, 1) and got.dtype == dtype
        np.testing.assert_array_equal(got, ufunc.reduce(v, axis=1, keepdims=True))
    np.testing.assert_array_equal(row_reduce(np.add, np.abs(s[:1])), np.abs(s[:1]).sum(axis=1, keepdims=True))


def test_normalizer_many_narrow_rows():
    # 200 rows of 3 (the column-by-column reductions): each row of NORM_X's cases, repeated
    x = np.tile(f32(NORM_X), (200, 1))
    for norm in ("MAX", "L1"):
        assert_same(ml("Normalizer", [x], norm=norm), np.tile(f32(NORM_CASES[norm]), (200, 1)))
