"""`de.get_variable`: a `de.Variable` by name in the current variable scope."""

from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, Optional, Sequence

import tensorflow as tf

from tensorflow_dynemb._convert import DTypeLike
from tensorflow_dynemb.variable.sharding import HashTableCreator, Partitioner, default_partition_fn
from tensorflow_dynemb.variable.variable import Variable

__all__ = ["get_variable"]

# Variables made by `get_variable`, per graph (eager mode uses TF's global graph).
_REGISTRY: "weakref.WeakKeyDictionary[tf.Graph, Dict[str, Variable]]" = (
    weakref.WeakKeyDictionary()
)


def get_variable(
    name: str,
    key_dtype: DTypeLike = tf.int64,
    value_dtype: DTypeLike = tf.float32,
    dim: int = 1,
    devices: Optional[Sequence[str]] = None,
    partitioner: Partitioner = default_partition_fn,
    shared_name: Optional[str] = None,
    initializer: Any = None,
    trainable: bool = True,
    checkpoint: bool = True,
    init_size: int = 0,
    kv_creator: Optional[HashTableCreator] = None,
    restrict_policy: Optional[Callable[[Variable], Any]] = None,
    bp_v2: bool = False,
    admit_policy: Any = None,
) -> Variable:
    """Gets the `de.Variable` called `name` in the current variable scope, or creates it.

    Follows `tf.compat.v1.get_variable`'s reuse rules: in a scope with `reuse=True` the
    variable must exist; with `reuse=tf.compat.v1.AUTO_REUSE` (always the case when
    executing eagerly) an existing one is returned; otherwise creating a name twice is
    an error. The other arguments are `de.Variable`'s.

    Raises:
      ValueError: the variable exists and reuse is not allowed, or it does not exist
        and the scope requires reuse.
    """
    scope = tf.compat.v1.get_variable_scope()
    full_name = f"{scope.name}/{name}" if scope.name else name
    graph = tf.compat.v1.get_default_graph()
    variables = _REGISTRY.setdefault(graph, {})
    existing = variables.get(full_name)
    # Eager code always reuses (as tf.compat.v1.get_variable does); asked explicitly,
    # because a scope first created while tracing a tf.function says reuse=False.
    reuse = tf.compat.v1.AUTO_REUSE if tf.executing_eagerly() else scope.reuse
    if existing is not None:
        if reuse is True or reuse == tf.compat.v1.AUTO_REUSE:
            return existing
        # Worded as TFRA's (and tf.compat.v1.get_variable's) error, which code matches.
        raise ValueError(
            f"Variable {full_name} already exists, disallowed (a de.Variable of this graph). "
            "Did you mean to set reuse=True or reuse=tf.compat.v1.AUTO_REUSE in the "
            "variable scope?"
        )
    if reuse is True:
        raise ValueError(
            f"de.Variable {full_name!r} does not exist, and the variable scope has reuse=True."
        )
    variable = Variable(
        key_dtype=key_dtype,
        value_dtype=value_dtype,
        dim=dim,
        devices=devices,
        partitioner=partitioner,
        shared_name=shared_name,
        name=full_name,
        initializer=initializer,
        trainable=trainable,
        checkpoint=checkpoint,
        init_size=init_size,
        kv_creator=kv_creator,
        restrict_policy=restrict_policy,
        bp_v2=bp_v2,
        admit_policy=admit_policy,
    )
    variables[full_name] = variable
    return variable
