"""`tf.nn.embedding_lookup*` called with a `de.Variable` (SparseOperationKit's idiom).

SOK users write `tf.nn.embedding_lookup(var, ids)` on its dynamic variables. Through
TensorFlow's public type-based dispatch (`tf.experimental.dispatch_for_api`), the
same call with a `de.Variable` (or a list holding one, TFRA's form) runs the
package's lookup of the same name: `tf.nn.embedding_lookup`,
`tf.nn.embedding_lookup_sparse` and `tf.nn.safe_embedding_lookup_sparse`, in their
TF2 and `tf.compat.v1` forms. The results are the package's functions' results, so
they train through the trainable view as `de.embedding_lookup` does (in a
`tf.function`, a Keras model, or eagerly under a `tf.GradientTape`; the view is
`var.get_trainable_by_name(name)`, named like the function by default).

Arguments that only mean something for a dense table are accepted and ignored as by
the `de.*` functions (`partition_strategy`, `validate_indices`, `allow_fast_lookup`).
`tf.nn.safe_embedding_lookup_sparse` keeps the package's meaning of ids: every id,
negative ones included, is a key (a dense table's lookup prunes ids < 0 as invalid
row numbers; a hash table has no invalid keys).

TensorFlow dispatches on types only when they are registered as dispatchable
(extension types are registered automatically). `de.Variable` is registered here
through `register_dispatchable_type`, TF's registration hook for such types; this
changes nothing for any call that does not pass a `de.Variable`.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Dict, List, Union

import tensorflow as tf

from tensorflow_dynemb.variable.lookup import embedding_lookup
from tensorflow_dynemb.variable.sparse_lookup import (
    embedding_lookup_sparse,
    safe_embedding_lookup_sparse,
)
from tensorflow_dynemb.variable.variable import Variable

try:  # TF's hook for non-extension types (TF 2.16-2.21 all have it).
    from tensorflow.python.util.dispatch import register_dispatchable_type
except ImportError:  # pragma: no cover
    register_dispatchable_type = None

__all__ = ["DISPATCHED_APIS"]

# `params` as TF's functions take it: the variable, or a list holding it.
_VariableParams = Union[Variable, List[Variable]]


def _lookup(arguments: Dict[str, Any]):
    return embedding_lookup(
        arguments["params"], arguments["ids"], name=arguments["name"],
        max_norm=arguments["max_norm"],
    )


def _lookup_sparse(arguments: Dict[str, Any]):
    return embedding_lookup_sparse(
        arguments["params"], arguments["sp_ids"], arguments["sp_weights"],
        name=arguments["name"],
        # TF's default: None means "mean".
        combiner=arguments["combiner"] or "mean",
        max_norm=arguments["max_norm"],
    )


def _safe_lookup_sparse(arguments: Dict[str, Any]):
    return safe_embedding_lookup_sparse(
        arguments["embedding_weights"], arguments["sparse_ids"], arguments["sparse_weights"],
        combiner=arguments["combiner"], default_id=arguments["default_id"],
        name=arguments["name"], max_norm=arguments["max_norm"],
    )


# (TF function, the argument that holds the table, what runs instead).
DISPATCHED_APIS = (
    (tf.nn.embedding_lookup, "params", _lookup),
    (tf.compat.v1.nn.embedding_lookup, "params", _lookup),
    (tf.nn.embedding_lookup_sparse, "params", _lookup_sparse),
    (tf.compat.v1.nn.embedding_lookup_sparse, "params", _lookup_sparse),
    (tf.nn.safe_embedding_lookup_sparse, "embedding_weights", _safe_lookup_sparse),
    (tf.compat.v1.nn.safe_embedding_lookup_sparse, "embedding_weights", _safe_lookup_sparse),
)


def _dispatch_target(api: Callable, ours: Callable[[Dict[str, Any]], Any]) -> Callable:
    """A function with `api`'s signature (which dispatch_for_api requires) that runs
    `ours` on the call's arguments, defaults filled in."""
    signature = inspect.signature(api)

    @functools.wraps(api)
    def target(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return ours(bound.arguments)

    return target


def _register() -> None:
    if register_dispatchable_type is None:  # pragma: no cover
        return
    register_dispatchable_type(Variable)
    for api, table_arg, ours in DISPATCHED_APIS:
        tf.experimental.dispatch_for_api(api, {table_arg: _VariableParams})(
            _dispatch_target(api, ours)
        )


_register()
