"""Training works in every context users write it in, or fails loudly (issue 34).

Each scenario of `context_scenarios.py` trains the same model on the same batches in
another context (a `@tf.function` `call`, nested helper functions, Sequential /
functional / subclassed, `run_eagerly`, custom steps and loops). Each must store every
id it saw, move every row from its initial value, and end with the very table and dense
weights that the eager functional model ends with. Keras 3 runs in this process,
tf_keras in a subprocess (`TF_USE_LEGACY_KERAS=1`). The strategies' contexts are tested
with their clusters: MirroredStrategy in test_distributed.py, ParameterServerStrategy
and MultiWorkerMirroredStrategy in test_distributed.py / test_multi_worker.py (each with
a model whose `call` is a `tf.function`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import context_scenarios
from test_keras_layers import result as keras_layers_result

FLAVORS = ["keras3", "tf_keras"]
CONTEXTS = [
    name
    for name in context_scenarios.SCENARIOS
    if name not in ("reference", "jit_compile", "function_jit_compile", "issue_34_reproduction")
]


def result(name: str, flavor: str) -> Any:
    return keras_layers_result(name, flavor, "context_scenarios")


def distinct_ids() -> list:
    return sorted(np.unique(context_scenarios.IDS).tolist())


@pytest.mark.parametrize("flavor", FLAVORS)
def test_reference_stores_and_trains_every_id(flavor):
    got = result("reference", flavor)
    assert got["size"] == len(distinct_ids())
    assert got["keys"] == distinct_ids()
    moved = np.abs(np.subtract(got["rows"], got["initial_rows"])).max(axis=1)
    assert (moved > 1e-3).all(), f"rows left untrained: {moved}"


@pytest.mark.parametrize("flavor", FLAVORS)
@pytest.mark.parametrize("context", CONTEXTS)
def test_context_trains_as_the_eager_reference(flavor, context):
    reference, got = result("reference", flavor), result(context, flavor)
    assert got["size"] == len(distinct_ids()), f"{context}: the table holds {got['size']} ids"
    assert got["keys"] == reference["keys"]
    np.testing.assert_allclose(got["rows"], reference["rows"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["kernel"], reference["kernel"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("flavor", FLAVORS)
def test_jit_compile_true_in_compile(flavor):
    """Keras 3 trains without XLA (the layers have `supports_jit = False`); tf_keras
    compiles with XLA, and the table refuses at trace time, naming jit_compile."""
    got = result("jit_compile", flavor)
    if flavor == "keras3":
        reference = result("reference", flavor)
        np.testing.assert_allclose(got["rows"], reference["rows"], rtol=1e-5, atol=1e-6)
    else:
        assert "jit_compile=True" in got["error_message"]
        assert got["size"] == 0


@pytest.mark.parametrize("flavor", FLAVORS)
def test_tf_function_with_jit_compile_is_refused_at_trace_time(flavor):
    got = result("function_jit_compile", flavor)
    assert "jit_compile=True" in got["error_message"]
    assert "cannot be compiled by XLA" in got["error_message"]
    assert got["size"] == 0


@pytest.mark.parametrize("flavor", FLAVORS)
def test_issue_34_reproduction_stores_and_trains_its_ids(flavor):
    got = result("issue_34_reproduction", flavor)
    assert got["size"] == 4
    assert min(got["moved"]) > 1e-3, got["moved"]


def test_a_decorated_call_leaves_no_symbolic_build_behind():
    """Keras 3's symbolic build of a model whose `call` is a `tf.function` is left early
    (`leave_symbolic_build`). That must not mark the eager context as a build: float ids
    in a later eager call were turned into zeros (key 0) instead of refused."""
    import tensorflow as tf  # noqa: PLC0415 (Keras 3 runs in this process)

    from tensorflow_dynemb.keras import layers  # noqa: PLC0415

    result("issue_34_reproduction", "keras3")  # runs in this process
    with pytest.raises(TypeError, match="keras.Input"):
        layers.Embedding(2)(tf.constant([1.0, 2.0]))
