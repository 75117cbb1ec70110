"""Table ops under XLA: refused while the function is traced, with the fix named.

The table ops are TF custom ops over a hash table in host (or device) memory; XLA has
no kernels for them. A function compiled with `jit_compile=True` (`tf.function`, or
tf_keras' `model.compile(jit_compile=True)`) would otherwise fail only when it first
runs, with XLA's "no registered kernel" message naming a `DynembTable*` op. Keras 3
needs no refusal: its `jit_compile` falls back to `False` for a model with a layer
that sets `supports_jit = False`, as our layers do.
"""

from __future__ import annotations

import tensorflow as tf

# Private, but stable across TF 2.16-2.21; it is what `tf.function` itself asks.
from tensorflow.python.ops import control_flow_util

__all__ = ["refuse_xla"]


def refuse_xla(table_name: str) -> None:
    """Raises when an op of table `table_name` is built inside an XLA-compiled function.

    Raises:
      ValueError: the op is being traced under `jit_compile=True`.
    """
    if tf.executing_eagerly():
        return
    if control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        raise ValueError(
            f"de table {table_name!r} is used inside a function compiled with XLA "
            "(jit_compile=True), but hash-table ops cannot be compiled by XLA. Use "
            "jit_compile=False for that function (tf_keras: model.compile(..., "
            "jit_compile=False); Keras 3 falls back to it by itself), or move the "
            "embedding lookup out of the jit-compiled function."
        )
