"""Errors are clear, raised early, and leave the table unchanged."""

from __future__ import annotations

import os
import re
import struct

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de
from _tables_util import exported_dict, graph_mode_results, scenario_result

SHAPE_ERRORS = (tf.errors.InvalidArgumentError, ValueError)


@pytest.fixture(params=["HashTable", "HkvHashTable"])
def table(request):
    """An int64 -> float32 [2] table holding {1: [1, 1], 2: [2, 2]}."""
    t = getattr(de, request.param)(tf.int64, tf.float32, [0.0, 0.0])
    t.insert([1, 2], [[1.0, 1.0], [2.0, 2.0]])
    return t


def assert_unchanged(table):
    """Content as the fixture made it, and the table (and process) still work."""
    got = exported_dict(*table.export())
    assert set(got) == {1, 2}
    np.testing.assert_array_equal(got[1], [1.0, 1.0])
    np.testing.assert_array_equal(got[2], [2.0, 2.0])
    table.insert([3], [[3.0, 3.0]])
    assert int(table.size()) == 3


# ----------------------------------------------------------------------------------------
# dtypes: TypeError before any op runs
# ----------------------------------------------------------------------------------------

WRONG_KEY_CALLS = {
    "insert": lambda t, k: t.insert(k, tf.zeros([2, 2])),
    "lookup": lambda t, k: t.lookup(k),
    "getitem": lambda t, k: t[k],
    "accum": lambda t, k: t.accum(k, tf.zeros([2, 2]), tf.constant([True, True])),
    "remove": lambda t, k: t.remove(k),
    "import_": lambda t, k: t.import_(k, tf.zeros([2, 2])),
}


@pytest.mark.parametrize("method", sorted(WRONG_KEY_CALLS))
@pytest.mark.parametrize(
    "keys",
    [tf.constant([1, 2], tf.int32), tf.constant(["1", "2"]), tf.constant([1.0, 2.0])],
    ids=["int32", "string", "float32"],
)
def test_wrong_key_dtype_is_type_error(table, method, keys):
    with pytest.raises(TypeError, match=r"`keys`.*int64.*got.*" + keys.dtype.name):
        WRONG_KEY_CALLS[method](table, keys)
    assert_unchanged(table)


WRONG_VALUE_CALLS = {
    "insert": lambda t, v: t.insert(tf.constant([5, 6], tf.int64), v),
    "accum": lambda t, v: t.accum(tf.constant([5, 6], tf.int64), v, [False, False]),
    "import_": lambda t, v: t.import_(tf.constant([5, 6], tf.int64), v),
    "lookup_default": lambda t, v: t.lookup(tf.constant([5, 6], tf.int64), v),
}


@pytest.mark.parametrize("method", sorted(WRONG_VALUE_CALLS))
@pytest.mark.parametrize("dtype", [tf.float64, tf.float16, tf.int32, tf.bool], ids=lambda d: d.name)
def test_wrong_value_dtype_is_type_error(table, method, dtype):
    with pytest.raises(TypeError, match=r"float32.*got.*" + dtype.name):
        WRONG_VALUE_CALLS[method](table, tf.zeros([2, 2], dtype))
    assert_unchanged(table)


@pytest.mark.parametrize("make_table, call, conversion", [
    (lambda: de.HashTable(tf.int64, tf.float32, 0.0),
     lambda t: t.insert(tf.constant([1], tf.int32), [1.0]), "tf.cast(keys, tf.int64)"),
    (lambda: de.HashTable(tf.int64, tf.float32, 0.0),
     lambda t: t.insert([1], tf.constant([1.0], tf.float64)), "tf.cast(values, tf.float32)"),
    (lambda: de.HashTable(tf.int64, tf.float32, 0.0),
     lambda t: t.lookup(tf.constant(["1"])), "tf.strings.to_number(keys, tf.int64)"),
    (lambda: de.HashTable(tf.string, tf.float32, 0.0),
     lambda t: t.lookup(tf.constant([1], tf.int64)), "tf.strings.as_string(keys)"),
], ids=["int32_keys", "float64_values", "string_keys", "int_keys_of_string_table"])
def test_a_dtype_error_names_the_conversion(make_table, call, conversion):
    with pytest.raises(TypeError, match=r"; convert it with " + re.escape(conversion) + r"\.$"):
        call(make_table())


def test_wrong_exists_and_scores_dtype(table):
    with pytest.raises(TypeError, match="`exists`"):
        table.accum([5], [[1.0, 1.0]], tf.constant([1], tf.int32))
    with pytest.raises(TypeError, match="`scores`"):
        table.insert([5], [[1.0, 1.0]], scores=tf.constant([1.5]))
    assert_unchanged(table)


def test_unconvertible_python_inputs():
    t = de.HashTable(tf.int32, tf.int8, [0])
    with pytest.raises(TypeError, match="`keys`"):
        t.insert([1.5], [[1]])
    with pytest.raises(TypeError, match="`keys`"):
        t.insert(["a"], [[1]])
    with pytest.raises(ValueError, match="`keys`.*out of the range"):
        t.insert([2**40], [[1]])
    with pytest.raises(ValueError, match="`values`.*out of the range"):
        t.insert([1], [[300]])
    with pytest.raises(TypeError, match="`values`"):
        t.insert([1], [[0.5]])
    assert int(t.size()) == 0


# ----------------------------------------------------------------------------------------
# shapes: "Expected shape", eager and tf.function, table unchanged
# ----------------------------------------------------------------------------------------

WRONG_SHAPE_CALLS = {
    "insert_values": lambda t, k: t.insert(k, tf.zeros([2, 3])),
    "insert_values_rank": lambda t, k: t.insert(k, tf.zeros([2])),
    "insert_values_rows": lambda t, k: t.insert(k, tf.zeros([3, 2])),
    "insert_scores": lambda t, k: t.insert(
        k, tf.zeros([2, 2]), scores=tf.constant([1, 2, 3], tf.int64)
    ),
    "accum_values": lambda t, k: t.accum(k, tf.zeros([2, 5]), tf.constant([False, False])),
    "accum_exists": lambda t, k: t.accum(k, tf.zeros([2, 2]), tf.constant([False, False, True])),
    "import_values": lambda t, k: t.import_(k, tf.zeros([2, 1])),
    "lookup_default": lambda t, k: t.lookup(k, tf.zeros([3, 2])),
    "lookup_default_row": lambda t, k: t.lookup(k, tf.zeros([3])),
}


# Where the shapes are known (eagerly, or while tracing with static shapes), checked in
# Python before any op runs, naming the argument as the caller wrote it.
PYTHON_SHAPE_MESSAGES = {
    "insert_values":
        r"Expected shape \(2, 2\) \(keys.shape \+ value_shape\) for `values`, got \(2, 3\)$",
    "insert_values_rank": r"Expected shape \(2, 2\) .* for `values`, got \(2,\)$",
    "insert_scores": r"Expected shape \(2,\) \(keys.shape\) for `scores`, got \(3,\)$",
    "accum_values": r"Expected shape \(2, 2\) .* for `values_or_deltas`, got \(2, 5\)$",
    "accum_exists": r"Expected shape \(2,\) \(keys.shape\) for `exists`, got \(3,\)$",
    "import_values": r"Expected shape \(2, 2\) .* for `values`, got \(2, 1\)$",
}


@pytest.mark.parametrize("call", sorted(PYTHON_SHAPE_MESSAGES))
def test_a_known_wrong_shape_is_raised_in_python_naming_the_argument(table, call):
    keys = tf.constant([7, 8], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match=PYTHON_SHAPE_MESSAGES[call]) as info:
        WRONG_SHAPE_CALLS[call](table, keys)
    assert info.value.op is None  # not an op's error ("{{function_node ...}} ...")

    def trace(k):
        WRONG_SHAPE_CALLS[call](table, k)

    with pytest.raises(ValueError, match=PYTHON_SHAPE_MESSAGES[call]):
        tf.function(trace).get_concrete_function(tf.TensorSpec([2], tf.int64))
    assert_unchanged(table)


@pytest.mark.parametrize("mode", ["eager", "function", "function_dynamic_shapes"])
@pytest.mark.parametrize("call", sorted(WRONG_SHAPE_CALLS))
def test_wrong_shape_says_expected_shape(table, call, mode):
    keys = tf.constant([7, 8], tf.int64)

    def call_and_return_nothing(k):
        WRONG_SHAPE_CALLS[call](table, k)

    if mode == "eager":
        run = lambda: call_and_return_nothing(keys)  # noqa: E731
    elif mode == "function":
        run = lambda: tf.function(call_and_return_nothing)(keys)  # noqa: E731
    else:
        # Unknown shapes at trace time: the kernel (not the shape function) checks.
        traced = tf.function(
            call_and_return_nothing, input_signature=[tf.TensorSpec(None, tf.int64)]
        )
        run = lambda: traced(keys)  # noqa: E731
    with pytest.raises(SHAPE_ERRORS, match="Expected shape"):
        run()
    assert_unchanged(table)


@pytest.mark.parametrize("default", [np.zeros([2, 2]), np.zeros([0]), np.zeros([1, 0])], ids=str)
def test_bad_default_value_shape(default):
    with pytest.raises(ValueError, match="default_value"):
        de.HashTable(tf.int64, tf.float32, default.astype(np.float32))


def test_default_value_dtype_mismatch():
    with pytest.raises(TypeError, match="default_value"):
        de.HashTable(tf.int64, tf.float32, tf.constant([0.0], tf.float64))


@pytest.mark.parametrize(
    "key_dtype,value_dtype,match",
    [
        (tf.float32, tf.float32, "key_dtype"),
        (tf.int8, tf.float32, "key_dtype"),
        (tf.int64, tf.string, "value_dtype"),
        (tf.int64, tf.complex64, "value_dtype"),
        ("not a dtype", tf.float32, "key_dtype"),
    ],
)
def test_unsupported_dtypes(key_dtype, value_dtype, match):
    with pytest.raises(TypeError, match=match):
        de.HashTable(key_dtype, value_dtype, 0)


# ----------------------------------------------------------------------------------------
# HKV configuration
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(init_capacity=0, max_capacity=5), ValueError, r"init_capacity.*>= 1.*0"),
        (dict(init_capacity=1, max_capacity=-3), ValueError, r"max_capacity.*>= 1.*-3"),
        (dict(init_capacity=1.5, max_capacity=5), TypeError, r"init_capacity.*integer.*1.5"),
        (dict(max_hbm_for_values=-1), ValueError, "max_hbm_for_values"),
        (dict(evict_strategy="fifo"), ValueError, r"evict_strategy.*LRU.*CUSTOMIZED.*fifo"),
        (dict(evict_strategy=9), ValueError, r"evict_strategy.*9"),
        (dict(step_per_epoch=-1), ValueError, "step_per_epoch"),
        (dict(gen_scores_fn=5), TypeError, "gen_scores_fn"),
        (dict(config={"max_capacity": 5}), TypeError, "config"),
    ],
    ids=lambda x: str(x)[:40] if not isinstance(x, type) else x.__name__,
)
def test_bad_hkv_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        de.HkvHashTable(tf.int64, tf.float32, 0.0, **kwargs)


@pytest.mark.parametrize(
    "config_kwargs,error,match",
    [
        (dict(max_capacity=0), ValueError, "max_capacity"),
        (dict(evict_strategy="most_recent"), ValueError, "evict_strategy"),
    ],
)
def test_bad_hkv_config(config_kwargs, error, match):
    with pytest.raises(error, match=match):
        de.HkvHashTable(tf.int64, tf.float32, 0.0, config=de.HkvHashTableConfig(**config_kwargs))


@pytest.mark.parametrize(
    "make",
    [
        lambda: de.HkvHashTable(tf.int64, tf.float32, 0.0, max_capacity=99_999),
        lambda: de.HkvHashTable(tf.int64, tf.float32, 0.0, init_capacity=64, max_capacity=8),
        lambda: de.HkvHashTable(
            tf.int64, tf.float32, 0.0, config=de.HkvHashTableConfig(max_capacity=99_999)
        ),
    ],
    ids=["default-init", "larger-init", "config"],
)
def test_init_capacity_above_max_capacity_is_clamped_as_in_tfra(make):
    """TFRA takes min(init_capacity, max_capacity), so a small max_capacity alone (with
    the default init_capacity, 1,048,576) is a valid table."""
    table = make()
    assert table.init_capacity == table.max_capacity
    keys = tf.range(table.max_capacity + 5, dtype=tf.int64)
    table.insert(keys, tf.zeros([table.max_capacity + 5]))
    assert int(table.size()) == table.max_capacity


def test_init_capacity_beyond_the_machines_memory_is_an_error():
    # A new table writes its slot arrays at once (>= 8 bytes a key): asked for as many
    # keys as the machine has bytes, it would be killed for memory, not raise.
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=rf"init_capacity {memory} needs \d+ MiB of slot arrays at once, "
                             rf"more than this machine's {memory >> 20} MiB"):
        de.HkvHashTable(tf.int64, tf.float32, 0.0, init_capacity=memory, max_capacity=memory)


# ----------------------------------------------------------------------------------------
# files
# ----------------------------------------------------------------------------------------


def test_value_rows_beyond_2_pow_24_elements_are_an_error():
    # Their batches' shapes would overflow (TF ends the process on that).
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"dim must be in \[1, 2\^24\], got 4611686018427387904"):
        de._ops.ops.dynemb_hash_table(key_dtype=tf.int64, value_dtype=tf.float32,
                                      value_shape=[2**62], anonymous=True)


def test_a_non_scalar_path_is_an_error(table, tmp_path):
    @tf.function(input_signature=[tf.TensorSpec(None, tf.string)])
    def save(directory):
        table.save_to_file_system(directory)

    with pytest.raises(tf.errors.InvalidArgumentError, match=r"path must be a scalar string, got string \[2\]"):
        save(tf.constant([str(tmp_path / "a"), str(tmp_path / "b")]))
    assert_unchanged(table)


def test_a_record_claiming_more_rows_than_its_file_is_data_loss(table, tmp_path):
    # A damaged row count and a huge chunk_rows once sized the read buffer by the count.
    header = b"DYNEMB\x00\x01" + struct.pack("<IIIIq", 1, 1, 0, 0, 2)  # v1, int64, float32, dim 2
    (tmp_path / "t.dynemb").write_bytes(header + struct.pack("<Q", 2**62))
    with pytest.raises(tf.errors.DataLossError, match="ends early"):
        table.load_from_file_system(str(tmp_path), file_name="t.dynemb", chunk_rows=2**62)
    assert_unchanged(table)


def test_load_missing_file_leaves_table_unchanged(table, tmp_path):
    with pytest.raises(tf.errors.OpError):
        table.load_from_file_system(str(tmp_path), file_name="missing.dynemb")
    assert_unchanged(table)


@pytest.mark.parametrize(
    "other",
    [
        lambda: de.HashTable(tf.int64, tf.float32, [0.0, 0.0, 0.0]),  # other dim
        lambda: de.HashTable(tf.int64, tf.float64, [0.0, 0.0]),  # other value dtype
        lambda: de.HashTable(tf.int32, tf.float32, [0.0, 0.0]),  # other key dtype
    ],
    ids=["dim", "value_dtype", "key_dtype"],
)
def test_load_mismatched_file_leaves_table_unchanged(table, other, tmp_path):
    writer = other()
    writer.save_to_file_system(str(tmp_path), file_name="other.dynemb")
    with pytest.raises(tf.errors.OpError):
        table.load_from_file_system(str(tmp_path), file_name="other.dynemb")
    assert_unchanged(table)


def test_bad_chunk_rows(table, tmp_path):
    with pytest.raises(ValueError, match="chunk_rows"):
        table.save_to_file_system(str(tmp_path), chunk_rows=0)


# ----------------------------------------------------------------------------------------
# TF1 graph mode
# ----------------------------------------------------------------------------------------


def test_graph_mode_errors():
    result = scenario_result(graph_mode_results(), "graph_errors")
    kind, message = result["static_shape"]
    assert kind == "ValueError" and "Expected shape" in message
    kind, message = result["key_dtype"]
    assert kind == "TypeError" and "int32" in message
    kind, message = result["dynamic_shape"]
    assert kind == "InvalidArgumentError" and "Expected shape" in message
    export = {int(k): v[0] for k, v in result["export_after_errors"].items()}
    assert export == {1: [1.0, 1.0], 2: [2.0, 2.0]}


def test_truncated_file_leaves_table_unchanged(tmp_path):
    source = de.HashTable(tf.int64, tf.float32, [0.0, 0.0])
    source.insert(np.arange(1000, dtype=np.int64), np.ones([1000, 2], np.float32))
    source.save_to_file_system(str(tmp_path), file_name="t.dynemb")
    path = tmp_path / "t.dynemb"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])

    target = de.HashTable(tf.int64, tf.float32, [0.0, 0.0])
    target.insert([-7], [[3.0, 4.0]])
    with pytest.raises(tf.errors.DataLossError):
        target.load_from_file_system(str(tmp_path), file_name="t.dynemb")
    keys, values = target.export()
    assert keys.numpy().tolist() == [-7]
    np.testing.assert_array_equal(values.numpy(), [[3.0, 4.0]])


def test_a_dtype_mismatch_is_a_type_error_and_for_tfra_code_a_value_error():
    table = de.HashTable(tf.int64, tf.int32, default_value=-1)
    for error in (TypeError, ValueError):
        with pytest.raises(error, match="`keys` must have dtype int64"):
            table.insert(tf.constant([4.0, 5.0]), tf.constant([1, 2], tf.int32))
    var = de.Variable(tf.int64, tf.int32, dim=1)
    with pytest.raises(ValueError, match="`values` must have dtype int32"):
        var.upsert(tf.constant([1], tf.int64), tf.constant([["a"]]))
