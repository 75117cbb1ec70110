"""The GPU core's training pieces against the CPU core, bit for bit.

* `apply_rule` (Table::ApplyRule, cc/core/update_rules.h) on a GPU slot-state table
  equals the CPU table's for every rule, float32 and float64, with duplicate keys and
  new keys, over several steps (the CUDA build has no FMA contraction: -fmad=false).
* `assign` (HKV's update of present keys) writes the keys present and nothing else.
* Inserts that take the BatchSet path (no sort, no host sync) keep the sequential
  semantics for repeated keys, and sizes and counters stay exact.
* `EmbeddingStep` (cc/core/gpu/embedding_step.h): forward (dedup, find with a default
  or key-seeded initial row, gather) and backward (segment sum in batch order,
  ApplyRule, write-back) equal the same step composed from CPU core calls and NumPy.

Everything skips where there is no GPU (tests/core_gpu_ext.py). No TensorFlow needed.
"""

from __future__ import annotations

import os
import zlib
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
import core_ext  # noqa: E402
import core_gpu_ext  # noqa: E402

# TensorFlow is not used here: CI runs these with its first TensorFlow only (.ci/run).
pytestmark = pytest.mark.once_in_ci

# rule: (slots, coefficients), from cc/core/update_rules.h.
RULES = {
    "keras_adam": (2, 4), "adam_kernel": (2, 6), "keras_adagrad": (1, 2),
    "adagrad_v2": (1, 2), "keras_momentum": (1, 2), "keras_nesterov": (1, 2),
    "momentum": (1, 3), "nesterov": (1, 3), "keras_adam_amsgrad": (3, 4),
    "keras_adamax": (2, 5), "keras_rmsprop": (1, 4), "keras_rmsprop_momentum": (2, 5),
    "keras_rmsprop_centered": (2, 4), "keras_rmsprop_centered_momentum": (3, 5),
    "keras_adadelta": (2, 4), "keras_nadam": (2, 9),
}


@pytest.fixture(scope="module")
def gpu():
    return core_gpu_ext.load_core_gpu()


@pytest.fixture(scope="module")
def cpu():
    return core_ext.load_core()


def _state(table):
    keys, values, _ = table.export()
    order = np.argsort(keys)
    return keys[order], values[order]


def _same_bits(a, b) -> bool:
    """Equal bit for bit, except that any NaN equals any NaN: x86 and CUDA give sqrt of a
    negative number different NaN bit patterns (RMSprop centered can take one)."""
    a, b = np.asarray(a), np.asarray(b)
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    return (a.shape == b.shape and np.array_equal(nan_a, nan_b)
            and np.where(nan_a, 0, a).tobytes() == np.where(nan_b, 0, b).tobytes())


def _assert_same_tables(a, b):
    ka, va = _state(a)
    kb, vb = _state(b)
    np.testing.assert_array_equal(ka, kb)
    assert _same_bits(va, vb)


def _coefficients(rng, count, weight_decay, dtype):
    # Positive, below 1 (rates, betas, epsilons); Adamax's 1 - beta_1^t stays away from 0.
    c = rng.uniform(0.05, 0.95, size=count + (2 if weight_decay else 0))
    return c.astype(dtype)


@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_apply_rule_equals_the_cpu_rule_bit_for_bit(gpu, cpu, rule, dtype):
    slots, count = RULES[rule]
    dim = 37  # not a multiple of the warp: lanes with one or two columns
    rng = np.random.default_rng(zlib.crc32(rule.encode()))
    weight_decay = rule in ("keras_adam", "keras_adamw", "keras_nadam")
    tables = [m.Table("int64", dtype, slots * dim) for m in (cpu, gpu)]
    initial = rng.uniform(0.0, 0.5, size=slots * dim).astype(dtype)  # positive: no NaN
    universe = rng.integers(-(2**40), 2**40, size=300)
    seen = set()
    for step in range(4):
        keys = rng.choice(universe, size=400)  # duplicates, and new keys every step
        rows = rng.standard_normal((400, dim)).astype(dtype)
        grads = (0.1 * rng.standard_normal((400, dim))).astype(dtype)
        c = _coefficients(rng, count, weight_decay, dtype)
        outs = [t.apply_rule(keys, rule, rows, grads, initial, c, weight_decay) for t in tables]
        assert _same_bits(*outs), f"{rule} step {step}: new rows differ"
        _assert_same_tables(*tables)
        seen.update(keys.tolist())
        assert tables[0].size() == tables[1].size() == len(seen)
    assert tables[0].counters()["inserts"] == tables[1].counters()["inserts"]
    assert tables[0].counters()["updates"] == tables[1].counters()["updates"]


def test_apply_rule_grows_the_table(gpu, cpu):
    """A step with more new keys than the table has room for takes the growth path."""
    dim = 8
    tables = [m.Table("int32", "float32", 2 * dim, init_capacity=16) for m in (cpu, gpu)]
    rng = np.random.default_rng(1)
    keys = np.arange(5000, dtype=np.int32) * 7919
    rows = rng.standard_normal((5000, dim)).astype(np.float32)
    grads = rng.standard_normal((5000, dim)).astype(np.float32)
    c = np.array([0.01, 0.1, 0.001, 1e-7], np.float32)
    init = np.zeros(2 * dim, np.float32)
    outs = [t.apply_rule(keys, "keras_adam", rows, grads, init, c) for t in tables]
    assert outs[0].tobytes() == outs[1].tobytes()
    assert tables[1].size() == 5000
    _assert_same_tables(*tables)


def test_apply_rule_errors(gpu):
    t = gpu.Table("int64", "float32", 8)
    with pytest.raises(ValueError, match="rule"):
        t.apply_rule([1], "adamm", np.zeros((1, 4), np.float32), np.zeros((1, 4), np.float32),
                     np.zeros(8, np.float32), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="coefficients"):
        t.apply_rule([1], "keras_adam", np.zeros((1, 4), np.float32),
                     np.zeros((1, 4), np.float32), np.zeros(8, np.float32),
                     np.zeros(3, np.float32))
    bounded = gpu.Table("int64", "float32", 8, max_capacity=100)
    with pytest.raises(ValueError, match="unbounded"):
        bounded.apply_rule([1], "keras_adam", np.zeros((1, 4), np.float32),
                           np.zeros((1, 4), np.float32), np.zeros(8, np.float32),
                           np.zeros(4, np.float32))
    assert t.size() == 0 and bounded.size() == 0


@pytest.mark.parametrize("key_dtype", ["int32", "int64"])
def test_assign_updates_present_keys_only(gpu, key_dtype):
    dim = 6
    t = gpu.Table(key_dtype, "float32", dim, strategy="lfu")
    present = np.arange(0, 2000, 2).astype(key_dtype)
    t.insert(present, np.zeros((len(present), dim), np.float32))
    before = t.counters()
    keys = np.concatenate([np.arange(0, 4000, 3), np.arange(0, 4000, 3)]).astype(key_dtype)
    values = np.arange(len(keys) * dim, dtype=np.float32).reshape(-1, dim)
    t.assign(keys, values)
    assert t.size() == len(present)  # nothing inserted
    got, exists = t.find(np.arange(0, 4000).astype(key_dtype))
    stored = set(present.tolist())
    for k in range(4000):
        if k not in stored:  # odd, or never inserted (>= 2000): assign inserts nothing
            assert not exists[k], k
            continue
        assert exists[k], k
        rows = np.flatnonzero(keys == k)
        want = values[rows[-1]] if len(rows) else np.zeros(dim, np.float32)
        np.testing.assert_array_equal(got[k], want)  # the last row wins
    _, _, scores = t.export()
    assert sorted(set(scores.tolist())) == [1, 3]  # lfu: 1 on insert, +2 for two rows
    after = t.counters()
    assert after["inserts"] == before["inserts"]
    assert after["updates"] - before["updates"] == 2 * len(np.intersect1d(keys, present))


def test_unsynchronized_inserts_keep_sizes_and_last_rows(gpu, cpu):
    """Many inserts that fit queue without a host sync; size, counters, find and export
    are exact afterwards, and repeated keys keep the last row (the CPU's results)."""
    rng = np.random.default_rng(5)
    dim = 4
    tables = [m.Table("int64", "float32", dim, strategy="lfu", init_capacity=100000)
              for m in (cpu, gpu)]
    for _ in range(30):
        keys = rng.integers(0, 20000, size=3000)
        values = rng.standard_normal((3000, dim)).astype(np.float32)
        for t in tables:
            t.insert(keys, values)
    assert tables[0].size() == tables[1].size()
    for name in ("inserts", "updates"):
        assert tables[0].counters()[name] == tables[1].counters()[name]
    ka, va = _state(tables[0])
    kb, vb = _state(tables[1])
    np.testing.assert_array_equal(ka, kb)
    np.testing.assert_array_equal(va, vb)
    sa = dict(zip(*tables[0].export()[::2]))
    sb = dict(zip(*tables[1].export()[::2]))
    assert sa == sb  # lfu scores fold over every row


@pytest.mark.parametrize("strategy", ["lru", "lfu"])
def test_inserts_at_the_load_limit_and_growing_equal_the_cpu(gpu, cpu, strategy):
    """Inserts that may not fit take the two-pass BatchSet path (present keys, one host
    sync, room for the new ones, absent keys): batches of present keys only at the load
    limit (the second pass is skipped), mixed batches with repeats, and batches that make
    the table grow several times keep the CPU's sizes, counters, rows and scores."""
    rng = np.random.default_rng(11)
    dim = 3
    tables = [m.Table("int64", "float32", dim, strategy=strategy, init_capacity=64)
              for m in (cpu, gpu)]
    gpu_table = tables[1]
    stored = rng.permutation(1 << 20)[:gpu_table.capacity()].astype(np.int64) * 13
    for t in tables:
        t.insert(stored, np.zeros((len(stored), dim), np.float32))
    assert gpu_table.size() == gpu_table.capacity()  # at its load limit
    capacity = gpu_table.capacity()
    batches = [rng.choice(stored, size=3 * len(stored)),  # present only, repeated
               np.concatenate([rng.choice(stored, 200), np.arange(1, 300) * 7 + 5,
                               np.arange(1, 300) * 7 + 5]),  # mixed: grows
               rng.integers(0, 1 << 40, size=5000) * 2 + 1]  # new keys: grows again
    for keys in batches:
        keys = keys.astype(np.int64)
        values = rng.standard_normal((len(keys), dim)).astype(np.float32)
        for t in tables:
            t.insert(keys, values)
        assert tables[0].size() == tables[1].size()
        for name in ("inserts", "updates"):
            assert tables[0].counters()[name] == tables[1].counters()[name], name
        ka, va = _state(tables[0])
        kb, vb = _state(tables[1])
        np.testing.assert_array_equal(ka, kb)
        np.testing.assert_array_equal(va, vb)
    assert gpu_table.capacity() > capacity  # it grew
    if strategy == "lfu":  # lru scores are clock values of each table's own clock
        sa = dict(zip(*tables[0].export()[::2]))
        sb = dict(zip(*tables[1].export()[::2]))
        assert sa == sb


def _reference_step(gpu, params, slots, rule, ids, grads, coefficients, default_row,
                    initial_state, keyed):
    """The step from CPU core calls and NumPy: what the Python layer does on the CPU."""
    unique, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    order = np.argsort(first)  # first-occurrence order, as tf.unique
    unique = unique[order]
    inverse = np.argsort(order)[inverse]
    rows, exists = params.find(unique, default_row)
    if keyed is not None:
        seed, dist, a, b = keyed
        drawn = gpu.keyed_random_host(unique, rows.shape[1], seed, dist, a, b, rows.dtype.name)
        rows = np.where(exists[:, None], rows, drawn)
    out = rows[inverse]
    sums = np.zeros_like(rows)
    for p in range(len(ids)):  # batch order, from zero
        sums[inverse[p]] += grads[p]
    new_rows = slots.apply_rule(unique, rule, rows, sums, initial_state, coefficients)
    params.insert(unique, new_rows)
    return out


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("keyed", [None, (7, "uniform", -0.05, 0.05)])
def test_embedding_step_equals_the_cpu_composition(gpu, cpu, dtype, keyed):
    rng = np.random.default_rng(11)
    dim = 16
    rule = "keras_adam"
    cpu_params = cpu.Table("int64", dtype, dim)
    cpu_slots = cpu.Table("int64", dtype, 2 * dim)
    params = gpu.Table("int64", dtype, dim)
    slots = gpu.Table("int64", dtype, 2 * dim)
    default_row = np.full(dim, 0.25, dtype)
    initial_state = np.zeros(2 * dim, dtype)
    step = gpu.EmbeddingStep(params, slots, rule, default_row=default_row,
                             initial_state=initial_state, keyed_init=keyed)
    for i in range(5):
        ids = rng.zipf(1.3, size=2000).astype(np.int64) % 5000
        grads = rng.standard_normal((2000, dim)).astype(dtype)
        coefficients = np.array([0.01 * (i + 1), 0.1, 0.001, 1e-7], dtype)
        want = _reference_step(gpu, cpu_params, cpu_slots, rule, ids, grads, coefficients,
                               default_row, initial_state, keyed)
        got = step.forward(ids)
        assert step.num_unique == len(np.unique(ids))
        np.testing.assert_array_equal(got, want)
        step.backward(grads, coefficients)
        _assert_same_tables(cpu_params, params)
        _assert_same_tables(cpu_slots, slots)


def test_embedding_step_errors(gpu):
    params = gpu.Table("int64", "float32", 8)
    with pytest.raises(ValueError, match="dim 16"):
        gpu.EmbeddingStep(params, gpu.Table("int64", "float32", 8), "keras_adam")
    with pytest.raises(ValueError, match="rule"):
        gpu.EmbeddingStep(params, gpu.Table("int64", "float32", 16), "adamm")
    with pytest.raises(ValueError, match="default_row"):
        gpu.EmbeddingStep(params, gpu.Table("int64", "float32", 16), "keras_adam",
                          default_row=np.zeros(3, np.float32))
