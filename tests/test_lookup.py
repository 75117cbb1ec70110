"""de.embedding_lookup* against tf.nn.embedding_lookup* on a dense table of the same rows.

Each `de.Variable` holds arbitrary keys (edge values, large and negative ids, strings);
the reference is a dense `[n + 1, dim]` matrix whose row `i` is the value of the `i`-th
stored key and whose last row is the variable's constant initializer, so a missing key
maps to that last row.
"""

from __future__ import annotations

import doctest
import functools
import os
from typing import Any, List, Optional

import numpy as np
import pytest
import tensorflow as tf

import tensorflow_dynemb as de
from _tables_util import dtype_id, make_keys, norm_key, rng_for, run_python
from tensorflow_dynemb.variable import lookup as lookup_module
from tensorflow_dynemb.variable import sparse_lookup as sparse_lookup_module

COMBINERS = ["sum", "mean", "sqrtn"]
LOOKUPS = ["embedding_lookup", "embedding_lookup_unique"]
ALL_FUNCTIONS = LOOKUPS + ["embedding_lookup_sparse", "safe_embedding_lookup_sparse"]
NUM_STORED, NUM_MISSING = 24, 6
# (shards, dim, max_norm): 1, 2 and 3 shards; dims 1 and 5; with and without clipping.
LAYOUTS = [(1, 1, None), (2, 5, None), (3, 5, 1.5), (3, 1, 1.5)]


def assert_close(got, want):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)


class Reference:
    """A de.Variable and the dense matrix holding the same rows."""

    def __init__(self, key_dtype, shards: int, dim: int, value_dtype=tf.float32, devices=None):
        rng = rng_for("lookup", key_dtype.name, shards, dim, value_dtype.name)
        all_keys = make_keys(rng, key_dtype, NUM_STORED + NUM_MISSING)
        self.key_dtype, self.dim = key_dtype, dim
        self.stored, self.missing = all_keys[:NUM_STORED], all_keys[NUM_STORED:]
        self.pool = all_keys
        values = (rng.normal(size=(NUM_STORED, dim)) * 2).astype(value_dtype.as_numpy_dtype)
        init = (np.arange(dim) * 0.25 - 0.5).astype(value_dtype.as_numpy_dtype)
        self.var = de.Variable(
            key_dtype,
            value_dtype,
            dim=dim,
            devices=devices or ["/CPU:0"] * shards,
            name=f"lookup_{key_dtype.name}_{shards}_{dim}",
            initializer=init.tolist(),
        )
        self.var.upsert(tf.constant(self.stored, key_dtype), tf.constant(values))
        self.dense = tf.constant(np.concatenate([values, init[np.newaxis]]))
        self.index = {norm_key(k): i for i, k in enumerate(self.stored)}

    def dense_ids(self, keys) -> np.ndarray:
        """The dense row of each key (missing keys: the initializer row). Negative keys
        are keys like any other: they map to their rows, never to an invalid index."""
        # dtype=object: NumPy's bytes arrays would drop trailing NUL bytes.
        keys = np.asarray(keys, dtype=object if self.key_dtype == tf.string else None)

        def row(k):
            return self.index.get(norm_key(k), NUM_STORED)

        return np.array([row(k) for k in keys.reshape(-1)], np.int64).reshape(keys.shape)

    def sample(self, rng: np.random.Generator, shape) -> np.ndarray:
        return rng.choice(self.pool, size=shape)

    def negative_keys(self) -> List[Any]:
        return [k for k in self.pool if self.key_dtype.is_integer and k < 0]


@functools.lru_cache(maxsize=None)
def reference(key_dtype=tf.int64, shards: int = 2, dim: int = 5, value_dtype=tf.float32):
    return Reference(key_dtype, shards, dim, value_dtype)


# ----------------------------------------------------------------------------------------
# Sparse inputs
# ----------------------------------------------------------------------------------------


def to_sparse(rows: List[list], dtype, num_rows: Optional[int] = None) -> tf.SparseTensor:
    indices = [[r, j] for r, row in enumerate(rows) for j in range(len(row))]
    values = [v for row in rows for v in row]
    width = max(len(row) for row in rows)
    return tf.SparseTensor(
        tf.constant(indices, tf.int64, shape=[len(indices), 2]),
        tf.constant(values, dtype, shape=[len(values)]),
        [num_rows or len(rows), width],
    )


def to_ragged(rows: List[list], dtype) -> tf.RaggedTensor:
    values = [v for row in rows for v in row]
    return tf.RaggedTensor.from_row_lengths(
        tf.constant(values, dtype, shape=[len(values)]), [len(row) for row in rows]
    )


def build(kind: str, rows: List[list], dtype):
    return to_sparse(rows, dtype) if kind == "sparse" else to_ragged(rows, dtype)


def make_rows(ref: Reference, rng: np.random.Generator, num_rows: int = 8):
    """Rows of keys (row 0 repeats a key, row 2 is empty, the last row is not)."""
    lengths = rng.integers(1, 6, num_rows)
    rows = [list(ref.sample(rng, n)) for n in lengths]
    rows[0] = [ref.stored[0], ref.missing[0], ref.stored[0], ref.stored[1]]
    rows[2] = []
    return rows


def make_weights(rows: List[list], rng: np.random.Generator, non_positive: bool = False):
    """Weights in [0.25, 2); with `non_positive`, some are 0 or negative."""
    weights = [list(rng.uniform(0.25, 2.0, len(row))) for row in rows]
    if non_positive:
        for row in weights:
            for j in range(len(row)):
                if j % 3 == 1:
                    row[j] = 0.0 if j % 2 else -0.5
    return weights


def paired_inputs(ref: Reference, kind: str, rows, weights):
    """(ids, weights) for de and (dense ids, weights) for tf.nn, as `kind` tensors."""
    ids = build(kind, rows, ref.key_dtype)
    dense_ids = build(kind, [list(ref.dense_ids(row)) for row in rows], tf.int64)
    w = None if weights is None else build(kind, weights, tf.float32)
    return ids, dense_ids, w


# ----------------------------------------------------------------------------------------
# embedding_lookup / embedding_lookup_unique
# ----------------------------------------------------------------------------------------

SHAPES = {1: (40,), 2: (5, 6), 3: (2, 3, 4)}


@pytest.mark.parametrize("max_norm", [None, 1.5])
@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("shards,dim", [(1, 1), (1, 5), (2, 1), (2, 5), (3, 1), (3, 8)])
@pytest.mark.parametrize("fn", LOOKUPS)
def test_lookup_matches_tf_nn(fn, shards, dim, rank, max_norm):
    ref = reference(tf.int64, shards, dim)
    ids = ref.sample(rng_for(fn, shards, dim, rank), SHAPES[rank])
    got = getattr(de, fn)(ref.var, tf.constant(ids, tf.int64), max_norm=max_norm)
    want = tf.nn.embedding_lookup(ref.dense, ref.dense_ids(ids), max_norm=max_norm)
    assert got.shape == ids.shape + (dim,)
    assert_close(got, want)


@pytest.mark.parametrize("fn", LOOKUPS)
def test_lookup_of_missing_keys_reads_the_initializer_and_inserts_nothing(fn):
    ref = reference(tf.int64, 2, 5)
    got = getattr(de, fn)(ref.var, tf.constant(ref.missing, tf.int64))
    init = np.arange(5) * 0.25 - 0.5
    assert_close(got, np.tile(init, (NUM_MISSING, 1)))
    assert int(ref.var.size()) == NUM_STORED


@pytest.mark.parametrize("fn", LOOKUPS)
def test_lookup_of_duplicates_and_empty_ids(fn):
    ref = reference(tf.int64, 3, 5)
    key = ref.stored[3]
    got = getattr(de, fn)(ref.var, tf.constant([[key, key], [key, key]], tf.int64))
    assert_close(got, np.broadcast_to(ref.dense.numpy()[3], (2, 2, 5)))
    empty = getattr(de, fn)(ref.var, tf.zeros([0, 3], tf.int64))
    assert empty.shape == (0, 3, 5)


@pytest.mark.parametrize("fn", LOOKUPS)
def test_lookup_of_ragged_ids_is_ragged(fn):
    ref = reference(tf.int64, 3, 5)
    rows = make_rows(ref, rng_for("ragged_ids", fn))
    got = getattr(de, fn)(ref.var, to_ragged(rows, tf.int64), max_norm=1.5)
    want = tf.nn.embedding_lookup(
        ref.dense, to_ragged([list(ref.dense_ids(r)) for r in rows], tf.int64), max_norm=1.5
    )
    assert isinstance(got, tf.RaggedTensor)
    np.testing.assert_array_equal(got.row_lengths(), want.row_lengths())
    assert_close(got.flat_values, want.flat_values)
    with pytest.raises(TypeError, match="`ids` must be a dense tensor or a RaggedTensor"):
        getattr(de, fn)(ref.var, tf.sparse.from_dense(tf.constant([[1, 2]], tf.int64)))


@pytest.mark.parametrize("key_dtype", [tf.int32, tf.string], ids=dtype_id)
def test_other_key_dtypes(key_dtype):
    ref = reference(key_dtype, 2, 3)
    rng = rng_for("keys", key_dtype.name)
    ids = ref.sample(rng, (4, 5))
    want = tf.nn.embedding_lookup(ref.dense, ref.dense_ids(ids))
    for fn in LOOKUPS:
        assert_close(getattr(de, fn)(ref.var, tf.constant(ids, key_dtype)), want)

    rows = make_rows(ref, rng)
    weights = make_weights(rows, rng, non_positive=True)
    ids, dense_ids, w = paired_inputs(ref, "ragged", rows, weights)
    got = de.embedding_lookup_sparse(ref.var, ids, w, combiner="sqrtn")
    assert_close(got, tf.nn.embedding_lookup_sparse(ref.dense, dense_ids, w, combiner="sqrtn"))

    # Safe lookup: negative int32 ids are valid keys (no key value is reserved).
    ids, dense_ids, w = paired_inputs(ref, "sparse", rows, weights)
    default = ref.stored[5]
    got = de.safe_embedding_lookup_sparse(ref.var, ids, w, default_id=default)
    want = tf.nn.safe_embedding_lookup_sparse(
        ref.dense, dense_ids, w, default_id=ref.dense_ids(default)
    )
    assert_close(got, want)


@pytest.mark.parametrize("value_dtype", [tf.float64, tf.float16], ids=dtype_id)
def test_other_value_dtypes(value_dtype):
    ref = reference(tf.int64, 2, 4, value_dtype)
    rng = rng_for("values", value_dtype.name)
    ids = ref.sample(rng, (10,))
    got = de.embedding_lookup(ref.var, tf.constant(ids, tf.int64), max_norm=1.5)
    assert got.dtype == value_dtype
    assert_close(got, tf.nn.embedding_lookup(ref.dense, ref.dense_ids(ids), max_norm=1.5))

    rows = make_rows(ref, rng)
    weights = make_weights(rows, rng)
    ids, dense_ids, w = paired_inputs(ref, "sparse", rows, weights)
    w = tf.SparseTensor(w.indices, tf.cast(w.values, value_dtype), w.dense_shape)
    got = de.embedding_lookup_sparse(ref.var, ids, w, combiner="mean")
    assert got.dtype == value_dtype
    assert_close(got, tf.nn.embedding_lookup_sparse(ref.dense, dense_ids, w, combiner="mean"))


# ----------------------------------------------------------------------------------------
# embedding_lookup_sparse
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("kind", ["sparse", "ragged"])
@pytest.mark.parametrize("shards,dim,max_norm", LAYOUTS)
def test_embedding_lookup_sparse_matches_tf_nn(shards, dim, max_norm, kind, combiner, weighted):
    ref = reference(tf.int64, shards, dim)
    rng = rng_for("sparse", shards, dim, kind, combiner, weighted)
    rows = make_rows(ref, rng)
    weights = make_weights(rows, rng) if weighted else None
    ids, dense_ids, w = paired_inputs(ref, kind, rows, weights)
    got = de.embedding_lookup_sparse(ref.var, ids, w, combiner=combiner, max_norm=max_norm)
    want = tf.nn.embedding_lookup_sparse(
        ref.dense, dense_ids, w, combiner=combiner, max_norm=max_norm
    )
    assert got.shape == (len(rows), dim)
    assert_close(got, want)
    assert np.all(got.numpy()[2] == 0)  # the empty row


@pytest.mark.parametrize("kind", ["sparse", "ragged"])
def test_embedding_lookup_sparse_has_a_row_per_input_row(kind):
    """Trailing empty rows are zeros (tf.nn's result would stop at the last id)."""
    ref = reference(tf.int64, 2, 5)
    rows = make_rows(ref, rng_for("trailing", kind), num_rows=5)
    padded = rows + [[], []]
    if kind == "sparse":
        ids = to_sparse(rows, tf.int64, num_rows=len(padded))
    else:
        ids = to_ragged(padded, tf.int64)
    got = de.embedding_lookup_sparse(ref.var, ids, None, combiner="sum").numpy()
    want = tf.nn.embedding_lookup_sparse(
        ref.dense, to_ragged([list(ref.dense_ids(r)) for r in rows], tf.int64), None, "sum"
    )
    assert got.shape == (7, 5)
    assert_close(got[:5], want)
    assert np.all(got[5:] == 0)


def test_embedding_lookup_sparse_unordered_and_rank3_sparse_ids():
    ref = reference(tf.int64, 3, 5)
    rng = rng_for("unordered")
    rows = make_rows(ref, rng)
    weights = make_weights(rows, rng)
    ids, dense_ids, w = paired_inputs(ref, "sparse", rows, weights)
    want = tf.nn.embedding_lookup_sparse(ref.dense, dense_ids, w, combiner="mean")

    order = rng.permutation(int(ids.values.shape[0]))
    shuffled = tf.SparseTensor(
        tf.gather(ids.indices, order), tf.gather(ids.values, order), ids.dense_shape
    )
    shuffled_w = tf.SparseTensor(shuffled.indices, tf.gather(w.values, order), w.dense_shape)
    assert_close(de.embedding_lookup_sparse(ref.var, shuffled, shuffled_w), want)

    # Rank 3: ids combine per first index, as in tf.nn.
    def rank3(sp):
        indices = tf.stack([sp.indices[:, 0], sp.indices[:, 1] % 2, sp.indices[:, 1]], 1)
        shape = tf.concat([sp.dense_shape[:1], [2], sp.dense_shape[1:]], 0)
        return tf.SparseTensor(indices, sp.values, shape)

    got = de.embedding_lookup_sparse(ref.var, rank3(ids), rank3(w))
    assert_close(got, tf.nn.embedding_lookup_sparse(ref.dense, rank3(dense_ids), rank3(w)))


# ----------------------------------------------------------------------------------------
# safe_embedding_lookup_sparse
# ----------------------------------------------------------------------------------------


def safe_rows(ref: Reference, rng: np.random.Generator):
    """make_rows plus negative ids, which are valid keys (tf.nn would prune negative
    *indices*; a hash table reserves no key value): row 4 holds only negative ids."""
    rows = make_rows(ref, rng)
    negative = ref.negative_keys()
    rows[4] = negative[:2]
    rows[5] = rows[5] + [negative[2]]
    return rows


@pytest.mark.parametrize("default", [None, "stored"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("combiner", COMBINERS)
@pytest.mark.parametrize("kind", ["sparse", "ragged"])
@pytest.mark.parametrize("shards,dim,max_norm", [(1, 5, None), (3, 5, 1.5)])
def test_safe_embedding_lookup_sparse_matches_tf_nn(
    shards, dim, max_norm, kind, combiner, weighted, default
):
    ref = reference(tf.int64, shards, dim)
    rng = rng_for("safe", shards, dim, kind, combiner, weighted, default)
    rows = safe_rows(ref, rng)
    weights = None
    if weighted:
        weights = make_weights(rows, rng, non_positive=True)
        weights[6] = [0.0] * len(rows[6])  # empty once pruned, unless combiner="sum"
    ids, dense_ids, w = paired_inputs(ref, kind, rows, weights)
    default_id = None if default is None else ref.stored[7]
    got = de.safe_embedding_lookup_sparse(
        ref.var, ids, w, combiner=combiner, default_id=default_id, max_norm=max_norm
    )
    want = tf.nn.safe_embedding_lookup_sparse(
        ref.dense,
        dense_ids,
        w,
        combiner=combiner,
        default_id=None if default is None else ref.dense_ids(default_id),
        max_norm=max_norm,
    )
    assert got.shape == (len(rows), dim)
    assert_close(got, want)
    if default is None:
        assert np.all(got.numpy()[2] == 0)
    assert np.any(got.numpy()[4] != 0)  # only negative ids: valid keys, not pruned


def test_safe_embedding_lookup_sparse_missing_default_id_reads_the_initializer():
    ref = reference(tf.int64, 2, 5)
    ids = to_sparse([[ref.stored[0]], [], [-5]], tf.int64)
    got = de.safe_embedding_lookup_sparse([ref.var], ids, default_id=ref.missing[-1])
    init = np.arange(5) * 0.25 - 0.5
    assert_close(got, [ref.dense.numpy()[0], init, init])
    assert int(ref.var.size()) == NUM_STORED


@pytest.mark.parametrize("default", [None, "missing"])
def test_safe_embedding_lookup_sparse_rank3_ids(default):
    ref = reference(tf.int64, 3, 5)
    rng = rng_for("safe_rank3", default)
    shape = [3, 4, 5]
    indices = [[a, b, c] for a in range(3) for b in range(4) for c in range(5)]
    indices = [i for i in indices if rng.random() < 0.3 and i[:2] != [1, 2]]  # (1, 2): empty
    keys = list(ref.sample(rng, len(indices)))
    keys[0] = ref.negative_keys()[0]
    weights = rng.uniform(-0.5, 2.0, len(indices)).astype(np.float32)

    def sparse(values, dtype):
        return tf.SparseTensor(tf.constant(indices, tf.int64), tf.constant(values, dtype), shape)

    default_id = None if default is None else ref.missing[1]
    got = de.safe_embedding_lookup_sparse(
        ref.var, sparse(keys, tf.int64), sparse(weights, tf.float32), default_id=default_id
    )
    want = tf.nn.safe_embedding_lookup_sparse(
        ref.dense,
        sparse(ref.dense_ids(keys), tf.int64),
        sparse(weights, tf.float32),
        default_id=None if default is None else ref.dense_ids(default_id),
    )
    assert got.shape == (3, 4, 5)
    assert_close(got, want)


def test_shards_on_distinct_cpu_devices():
    cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
    if len(cpus) < 3:
        pytest.skip("needs 3 logical CPU devices (set up by the session's conftest.py)")
    ref = Reference(tf.int64, 3, 4, devices=cpus[:3])
    rng = rng_for("devices")
    ids = ref.sample(rng, (6, 5))
    assert_close(
        de.embedding_lookup_unique(ref.var, tf.constant(ids, tf.int64)),
        tf.nn.embedding_lookup(ref.dense, ref.dense_ids(ids)),
    )
    rows = safe_rows(ref, rng)
    ids, dense_ids, _ = paired_inputs(ref, "ragged", rows, None)
    got = de.safe_embedding_lookup_sparse(ref.var, ids, combiner="sqrtn")
    assert_close(got, tf.nn.safe_embedding_lookup_sparse(ref.dense, dense_ids, combiner="sqrtn"))


# ----------------------------------------------------------------------------------------
# tf.function and TF1 graph mode
# ----------------------------------------------------------------------------------------


def test_inside_tf_function_with_unknown_shapes():
    ref = reference(tf.int64, 2, 5)
    rng = rng_for("function")
    ids = ref.sample(rng, (3, 4))
    rows = safe_rows(ref, rng)
    weights = make_weights(rows, rng, non_positive=True)
    sp_ids, dense_sp_ids, sp_w = paired_inputs(ref, "sparse", rows, weights)
    _, safe_dense_ids, _ = paired_inputs(ref, "sparse", rows, weights)
    rt_ids, dense_rt_ids, rt_w = paired_inputs(ref, "ragged", rows, weights)
    sparse_spec = tf.SparseTensorSpec([None, None], tf.int64)
    weights_spec = tf.SparseTensorSpec([None, None], tf.float32)

    @tf.function(
        input_signature=[
            tf.TensorSpec(None, tf.int64),
            sparse_spec,
            weights_spec,
            tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1),
            tf.RaggedTensorSpec([None, None], tf.float32, ragged_rank=1),
        ]
    )
    def run(ids, sp_ids, sp_w, rt_ids, rt_w):
        return (
            de.embedding_lookup(ref.var, ids, max_norm=1.0),
            de.embedding_lookup_unique(ref.var, ids),
            de.embedding_lookup_sparse(ref.var, sp_ids, sp_w, combiner="sqrtn"),
            de.embedding_lookup_sparse(ref.var, rt_ids, rt_w, combiner="sum"),
            de.safe_embedding_lookup_sparse(ref.var, sp_ids, sp_w, default_id=ref.stored[2]),
        )

    got = run(tf.constant(ids, tf.int64), sp_ids, sp_w, rt_ids, rt_w)
    dense_ids = ref.dense_ids(ids)
    want = (
        tf.nn.embedding_lookup(ref.dense, dense_ids, max_norm=1.0),
        tf.nn.embedding_lookup(ref.dense, dense_ids),
        tf.nn.embedding_lookup_sparse(ref.dense, dense_sp_ids, sp_w, combiner="sqrtn"),
        tf.nn.embedding_lookup_sparse(ref.dense, dense_rt_ids, rt_w, combiner="sum"),
        tf.nn.safe_embedding_lookup_sparse(
            ref.dense, safe_dense_ids, sp_w, default_id=ref.dense_ids(ref.stored[2])
        ),
    )
    for g, w in zip(got, want):
        assert_close(g, w)


def check_tf1_graph_session():
    """Builds every lookup in a TF1 graph and runs it in a Session against tf.nn."""
    rng = rng_for("graph")
    stored = make_keys(rng, tf.int64, 12)
    values = rng.normal(size=(12, 3)).astype(np.float32)
    dense = np.concatenate([values, np.full((1, 3), 0.5, np.float32)])
    rows = [[stored[0], stored[0], 99], [], [stored[-1], -7, stored[3]]]
    weights = [[1.0, 0.5, 2.0], [], [1.5, 1.0, -1.0]]
    index = {int(k): i for i, k in enumerate(stored)}

    def dense_id(k):
        return index.get(int(k), 12)

    with tf.Graph().as_default() as graph:
        var = de.Variable(tf.int64, tf.float32, dim=3, devices=["/CPU:0"] * 2, initializer=0.5)
        upsert = var.upsert(tf.constant(stored), tf.constant(values))
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        sp_w = to_sparse(weights, tf.float32)
        got = [
            de.embedding_lookup(var, ids, max_norm=1.0),
            de.embedding_lookup_unique(var, ids),
            de.embedding_lookup_sparse(var, to_sparse(rows, tf.int64), sp_w),
            de.safe_embedding_lookup_sparse(var, to_sparse(rows, tf.int64), sp_w, "sum", 99),
        ]
        dense_ids = [dense_id(k) for row in rows for k in row]
        want = [
            tf.nn.embedding_lookup(dense, dense_ids, max_norm=1.0),
            tf.nn.embedding_lookup(dense, dense_ids),
            tf.nn.embedding_lookup_sparse(
                dense, to_sparse([[dense_id(k) for k in r] for r in rows], tf.int64), sp_w
            ),
            tf.nn.safe_embedding_lookup_sparse(
                dense,
                to_sparse([[dense_id(k) for k in r] for r in rows], tf.int64),
                sp_w,
                "sum",
                12,
            ),
        ]
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(upsert)
            feed = {ids: [k for row in rows for k in row]}
            got_values, want_values = sess.run([got, want], feed_dict=feed)
    for g, w in zip(got_values, want_values):
        assert_close(g, w)


def test_tf1_graph_mode_session():
    check_tf1_graph_session()


def test_tf1_graph_mode_with_eager_execution_disabled(tmp_path):
    """The same in a process running `tf.compat.v1.disable_eager_execution()`."""
    script = tmp_path / "graph_mode.py"
    script.write_text(
        "import sys\n"
        "import tensorflow as tf\n"
        "tf.compat.v1.disable_eager_execution()\n"
        f"sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})\n"
        "import test_lookup\n"
        "assert not tf.executing_eagerly()\n"
        "test_lookup.check_tf1_graph_session()\n"
        "print('graph mode ok')\n"
    )
    assert "graph mode ok" in run_python(str(script)).stdout


# ----------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------


def all_lookups(params, ids, **kwargs):
    """Calls of each function on `params` with int64-like `ids` ([2, 2] keys)."""
    sp = tf.sparse.from_dense(ids)
    return {
        "embedding_lookup": lambda: de.embedding_lookup(params, ids, **kwargs),
        "embedding_lookup_unique": lambda: de.embedding_lookup_unique(params, ids, **kwargs),
        "embedding_lookup_sparse": lambda: de.embedding_lookup_sparse(params, sp, None, **kwargs),
        "safe_embedding_lookup_sparse": lambda: de.safe_embedding_lookup_sparse(
            params, sp, **kwargs
        ),
    }


@pytest.mark.parametrize("fn", ALL_FUNCTIONS)
def test_wrong_id_dtype_raises_type_error_before_any_op(fn):
    with tf.Graph().as_default() as graph:
        var = de.Variable(tf.int64, tf.float32, dim=2)
        ids = tf.constant([[1, 2], [3, 4]], tf.int32)
        call = all_lookups(var, ids)[fn]
        num_ops = len(graph.get_operations())
        with pytest.raises(TypeError, match="int64.*int32"):
            call()
        assert len(graph.get_operations()) == num_ops


@pytest.mark.parametrize("fn", ALL_FUNCTIONS)
def test_params_must_be_a_variable(fn):
    ref = reference(tf.int64, 1, 1)
    ids = tf.constant([[1, 2], [3, 4]], tf.int64)
    arg = "embedding_weights" if fn.startswith("safe") else "params"
    for params in (tf.Variable(tf.zeros([5, 1])), [ref.var, ref.var], ref.dense):
        with pytest.raises(TypeError, match=f"`{arg}` must be a de.Variable.*got"):
            all_lookups(params, ids)[fn]()
    # A list of one variable is accepted, as TFRA does.
    assert all_lookups([ref.var], ids)[fn]().shape[-1] == 1


def dense_lookups(table, dense_ids):
    """The tf.nn counterparts of `all_lookups` on a dense table."""
    sp = tf.sparse.from_dense(dense_ids + 1)  # from_dense drops zeros: shift, then undo
    sp = tf.SparseTensor(sp.indices, sp.values - 1, sp.dense_shape)
    return {
        "embedding_lookup": lambda: tf.nn.embedding_lookup(table, dense_ids),
        "embedding_lookup_unique": lambda: tf.nn.embedding_lookup(table, dense_ids),
        "embedding_lookup_sparse": lambda: tf.nn.embedding_lookup_sparse(table, sp, None),
        "safe_embedding_lookup_sparse": lambda: tf.nn.safe_embedding_lookup_sparse(table, sp),
    }


@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.parametrize("fn", ALL_FUNCTIONS)
def test_return_trainable_gives_the_dense_gradient(fn, shards):
    """`(result, trainable)`: the result is the plain lookup's, and the gradient of a
    loss with respect to `trainable`, summed per key, is the dense table's gradient."""
    ref = reference(tf.int64, shards, 3)
    a, b, c = [k for k in ref.stored if k != 0][:3]  # all_lookups' from_dense drops key 0
    keys = np.array([[a, b], [a, c]])
    ids = tf.constant(keys, tf.int64)
    plain = all_lookups(ref.var, ids)[fn]()
    scale = tf.constant(rng_for("trainable", fn).normal(size=plain.shape), tf.float32)
    with tf.GradientTape() as tape:
        result, trainable = all_lookups(ref.var, ids, return_trainable=True)[fn]()
        loss = tf.reduce_sum(result * scale)
    assert isinstance(trainable, tf.Variable) and trainable.trainable
    assert trainable is ref.var.get_trainable_by_name(fn)
    assert_close(result, plain)
    grad = tape.gradient(loss, trainable)
    assert isinstance(grad, tf.IndexedSlices)
    # Row i of `trainable` holds the key the lookup stored there.
    row_keys = trainable._dynemb_trainable_rows.ids.numpy()
    got = {}
    for i, g in zip(grad.indices.numpy(), grad.values.numpy()):
        got[row_keys[i]] = got.get(row_keys[i], 0) + g

    table = tf.Variable(ref.dense)
    with tf.GradientTape() as tape:
        want_loss = tf.reduce_sum(dense_lookups(table, ref.dense_ids(keys))[fn]() * scale)
    want = tf.convert_to_tensor(tape.gradient(want_loss, table)).numpy()
    assert_close(want_loss, loss)
    assert sorted(got) == sorted(set(keys.reshape(-1).tolist()))
    for key, g in got.items():
        assert_close(g, want[ref.index[key]])


def test_bad_sparse_arguments():
    ref = reference(tf.int64, 1, 1)
    sp = tf.sparse.from_dense(tf.constant([[1, 2], [3, 0]], tf.int64))
    rt = tf.ragged.constant([[1, 2], [3]], tf.int64)
    for fn in (de.embedding_lookup_sparse, de.safe_embedding_lookup_sparse):
        with pytest.raises(ValueError, match="`combiner` must be one of.*'max'"):
            fn(ref.var, sp, None, combiner="max")
        with pytest.raises(TypeError, match="tf.SparseTensor or a 2-D tf.RaggedTensor.*Tensor"):
            fn(ref.var, tf.constant([[1, 2]], tf.int64), None)
        with pytest.raises(TypeError, match="must be None or a SparseTensor.*RaggedTensor"):
            fn(ref.var, sp, tf.ragged.constant([[1.0, 1.0], [1.0]]))
        with pytest.raises(TypeError, match="floating-point weights, got int64"):
            fn(ref.var, sp, sp)
        with pytest.raises(ValueError, match="one weight per id"):
            fn(ref.var, rt, tf.ragged.constant([[1.0], [1.0]]))
        with pytest.raises(ValueError, match="2-D RaggedTensor"):
            fn(ref.var, tf.ragged.constant([[[1]], [[2, 3]]], tf.int64), None)
        with pytest.raises(TypeError, match="int64.*int32"):
            fn(ref.var, tf.ragged.constant([[1, 2], [3]], tf.int32), None)
        with pytest.raises(ValueError, match="`max_norm` must be > 0"):
            fn(ref.var, sp, None, max_norm=0.0)
    with pytest.raises(TypeError, match="`default_id`.*int64.*int32"):
        de.safe_embedding_lookup_sparse(ref.var, sp, default_id=tf.constant(1, tf.int32))
    with pytest.raises(ValueError, match="`default_id` must be a scalar"):
        de.safe_embedding_lookup_sparse(ref.var, sp, default_id=[1, 2])


def test_integer_variables_look_up_but_do_not_combine_or_clip():
    var = de.Variable(tf.int64, tf.int32, dim=2, initializer=7)
    var.upsert([1], [[1, 2]])
    np.testing.assert_array_equal(de.embedding_lookup(var, [1, 5]).numpy(), [[1, 2], [7, 7]])
    with pytest.raises(TypeError, match="`max_norm` needs a floating-point value_dtype.*int32"):
        de.embedding_lookup(var, [1], max_norm=1.0)
    sp = tf.sparse.from_dense(tf.constant([[1]], tf.int64))
    with pytest.raises(TypeError, match="combining rows needs a floating-point value_dtype"):
        de.embedding_lookup_sparse(var, sp, None, combiner="sum")


@pytest.mark.parametrize("module", [lookup_module, sparse_lookup_module], ids=["dense", "sparse"])
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted >= 2 and result.failed == 0
