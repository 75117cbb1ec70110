"""The same table behaviour inside `tf.function` and in TF1 graph mode."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de
from _tables_util import (
    KEY_DTYPES,
    DictModel,
    assert_table_matches,
    comparable,
    dtype_id,
    graph_mode_results,
    make_keys,
    make_values,
    rng_for,
    scenario_result,
)

# ----------------------------------------------------------------------------------------
# tf.function
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("signature", ["static", "dynamic"])
@pytest.mark.parametrize("value_dtype", [tf.float32, tf.int8, tf.bool], ids=dtype_id)
@pytest.mark.parametrize("kind", ["HashTable", "HkvHashTable"])
@pytest.mark.parametrize("key_dtype", KEY_DTYPES, ids=dtype_id)
def test_methods_inside_tf_function(key_dtype, kind, value_dtype, signature):
    rng = rng_for("function", key_dtype, kind, value_dtype, signature)
    default = make_values(rng, value_dtype, (4,))
    table = getattr(de, kind)(key_dtype, value_dtype, default)
    model = DictModel(value_dtype, (4,), default)

    if signature == "dynamic":
        keys_spec = tf.TensorSpec([None], key_dtype)
        values_spec = tf.TensorSpec([None, None], value_dtype)
        exists_spec = tf.TensorSpec([None], tf.bool)
        wrap = lambda *specs: tf.function(input_signature=list(specs))  # noqa: E731
    else:
        keys_spec = values_spec = exists_spec = None
        wrap = lambda *specs: tf.function  # noqa: E731

    @wrap(keys_spec, values_spec)
    def insert(k, v):
        table.insert(k, v)
        return table.size()

    @wrap(keys_spec)
    def lookup(k):
        return table.lookup(k, return_exists=True)

    @wrap(keys_spec, values_spec, exists_spec)
    def accum(k, v, e):
        table.accum(k, v, e)
        return table.size()

    @wrap(keys_spec)
    def remove(k):
        table.remove(k)
        return table.size()

    @tf.function
    def export():
        return table.export_with_scores()

    keys = make_keys(rng, key_dtype, 16)
    values = make_values(rng, value_dtype, (16, 4))
    keys_t, values_t = tf.constant(keys, key_dtype), tf.constant(values, value_dtype)
    assert int(insert(keys_t[:12], values_t[:12])) == 12
    model.insert(keys[:12], values[:12])
    assert_table_matches(table, model)

    got, found = lookup(keys_t)
    want, want_found = model.lookup(keys)
    np.testing.assert_array_equal(comparable(got), comparable(want))
    np.testing.assert_array_equal(found.numpy(), want_found)

    deltas = make_values(rng, value_dtype, (16, 4))
    accum(keys_t, tf.constant(deltas, value_dtype), found)
    model.accum(keys, deltas, want_found)
    assert_table_matches(table, model)

    assert int(remove(keys_t[:5])) == 11
    model.remove(keys[:5])
    exported_keys, exported_values, scores = export()
    assert exported_keys.shape[0] == 11 and scores.shape[0] == 11
    assert_table_matches(table, model)


def test_module_with_function_methods_and_import():
    class Model(tf.Module):
        def __init__(self):
            super().__init__()
            self.table = de.HashTable(tf.int64, tf.float32, [0.0, 0.0])

        @tf.function(input_signature=[tf.TensorSpec([None], tf.int64)])
        def __call__(self, keys):
            return tf.reduce_sum(self.table.lookup(keys), axis=-1)

        @tf.function
        def reset(self, keys, values):
            self.table.import_(keys, values)
            self.table.clear()
            self.table.import_(keys, values)
            return self.table.size()

    model = Model()
    keys = tf.constant([5, -5], tf.int64)
    assert int(model.reset(keys, tf.constant([[1.0, 2.0], [3.0, 4.0]]))) == 2
    np.testing.assert_array_equal(model(tf.constant([-5, 5, 6], tf.int64)).numpy(), [7.0, 3.0, 0.0])


def test_file_system_inside_tf_function(tmp_path):
    table = de.HashTable(tf.int64, tf.float32, [0.0])
    table.insert([1, 2], [[1.0], [2.0]])
    dirpath = str(tmp_path / "fn")

    @tf.function
    def save_and_reload():
        table.save_to_file_system(dirpath, file_name="t.dynemb")
        return tf.constant(0)

    save_and_reload()
    other = de.HashTable(tf.int64, tf.float32, [0.0])

    @tf.function
    def load():
        other.load_from_file_system(dirpath, file_name="t.dynemb")
        return other.size()

    assert int(load()) == 2
    np.testing.assert_array_equal(other.lookup([2, 1]).numpy(), [[2.0], [1.0]])


# ----------------------------------------------------------------------------------------
# TF1 graph mode (one subprocess for every scenario: disable_eager_execution is global)
# ----------------------------------------------------------------------------------------


def graph_result(name):
    return scenario_result(graph_mode_results(), name)


def test_graph_mode_basic():
    result = graph_result("graph_basic")
    assert result["name"] == "HashTable"
    assert result["size_after_insert"] == 4
    values, exists = result["lookup"]
    assert values == [[3.0, 4.0, 5.0], [-1.0, -1.0, -1.0], [9.0, 10.0, 11.0]]
    assert exists == [True, False, True]
    assert result["rank2_lookup"] == [
        [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]],
        [[6.0, 7.0, 8.0], [-1.0, -1.0, -1.0]],
    ]
    export = {int(k): v[0] for k, v in result["export"].items()}
    # accum: key 1 gets +1 twice, key 7 is inserted; key 3 removed.
    assert export == {
        1: [2.0, 3.0, 4.0],
        2: [3.0, 4.0, 5.0],
        -1: [9.0, 10.0, 11.0],
        7: [1.0, 1.0, 1.0],
    }
    assert result["size_after_clear"] == 0


def test_graph_mode_hkv_string_keys_and_scores():
    result = graph_result("graph_hkv_string_keys")
    assert result["lookup"] == [2, -7, 3]
    assert result["export"] == {"a": [1, 30], "": [2, 10], "b": [3, 20]}


def test_graph_mode_tables_with_default_names_are_distinct():
    result = graph_result("graph_tables_with_default_names_are_distinct")
    assert result["names"][0] != result["names"][1]
    assert result["sizes"] == [2, 0]


def test_graph_mode_unshared_tables_are_distinct():
    result = graph_result("graph_uncheckpointed_tables_are_distinct")
    assert result["sizes"] == [2, 0]


def test_graph_mode_file_system():
    result = graph_result("graph_file_system")
    assert result["files"] == ["gfile.dynemb"]
    export = {int(k): v[0] for k, v in result["export"].items()}
    assert export == {5: [1.0, 2.0], 6: [3.0, 4.0]}
