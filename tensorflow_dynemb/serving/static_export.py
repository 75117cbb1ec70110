"""SavedModel export of models that hold dynamic-embedding tables (see docs/serving.md).

Two exports:

- `tf.saved_model.save(obj, export_dir)`: the tables and `de.Variable`s keep their custom
  ops. The SavedModel holds their content and loads in any process that ran
  `import tensorflow_dynemb` first (or in a TF Serving built with the op library).
  Functions traced for it are read-only (see `_export_context`): embedding lookups
  bypass the trainable view, and its tables never refresh scores on lookup.
- `export_static_saved_model(obj, export_dir)` (this module): every table a signature
  looks up is frozen into stock TF objects, so the SavedModel loads in a stock
  TensorFlow or TF Serving without the op library. It serves the ids it was exported
  with and can learn no new ones.

A frozen table (`FrozenTable`, frozen.py) is a `tf.lookup.experimental.MutableHashTable` from key
to row number plus the rows in dense variables. Both live in the SavedModel's
variables checkpoint, not in its graph, so tables of any size export (a graph is
limited to 2 GiB); the rows are split into variables of at most `MAX_SHARD_BYTES`
each. Serving only calls `lookup` on the hash table (`LookupTableFindV2`, read-only).

Missing keys read:
- in a table: its `default_value` (or the `dynamic_default_values` the lookup passes);
- in a `de.Variable` with a constant initializer: that row;
- in a `de.Variable` with a key-seeded random initializer (RandomNormal, RandomUniform,
  TruncatedNormal): the same per-key row as the live variable, computed with stock ops
  (`keyed_random_rows`, keyed_random.py: a transcription of `DynembKeyedRandom`);
- in a `de.Variable` with any other callable initializer (a user function), whose
  live rows are fresh draws at every lookup, so that no frozen value can match them:
  zeros, deterministic.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

import tensorflow as tf

from tensorflow_dynemb import _export_context, _ops
from tensorflow_dynemb.tables.base import _DynembTable
from tensorflow_dynemb.variable.variable import Variable
from tensorflow_dynemb.serving.frozen import FrozenTable, FrozenVariable

__all__ = ["export_static_saved_model"]


# ---------------------------------------------------------------------------------------
# Which functions become signatures
# ---------------------------------------------------------------------------------------


class _Signature(NamedTuple):
    """What a signature is retraced from."""

    python_function: Callable[..., Any]
    input_signature: Sequence[Any]
    autograph: bool


_DEFAULT_KEY = "serving_default"


def _from_tf_function(name: str, fn: Any) -> _Signature:
    if isinstance(fn, tf.types.experimental.ConcreteFunction):
        raise TypeError(
            f"Signature {name!r}: got a concrete function; pass the tf.function itself "
            "(with an input_signature): the static export retraces its Python function."
        )
    if not isinstance(fn, tf.types.experimental.PolymorphicFunction):
        raise TypeError(f"Signature {name!r}: expected a tf.function, got {fn!r:.200}.")
    if fn.input_signature is None:
        raise ValueError(
            f"Signature {name!r}: the tf.function {fn.name!r} has no input_signature; "
            "give it one (`@tf.function(input_signature=[...])`)."
        )
    return _Signature(fn.python_function, fn.input_signature, getattr(fn, "_autograph", True))


def _tf_function_attributes(obj: Any) -> Dict[str, Any]:
    """`obj`'s tf.function attributes that have an input_signature, by attribute name
    (methods decorated in its class, then functions assigned to the instance)."""
    found = {}
    for klass in reversed(type(obj).__mro__):
        for name, value in vars(klass).items():
            if isinstance(value, tf.types.experimental.PolymorphicFunction):
                found[name] = getattr(obj, name)
    for name, value in getattr(obj, "__dict__", {}).items():
        if isinstance(value, tf.types.experimental.PolymorphicFunction):
            found[name] = value
    return {name: fn for name, fn in found.items() if fn.input_signature is not None}


def _keras_signature(model: Any) -> Optional[_Signature]:
    """`model(inputs, training=False)` on the inputs of a built functional Keras model,
    or None when `model` has no symbolic inputs."""
    if not callable(model) or not getattr(model, "inputs", None):
        return None

    def spec(tensor):
        return tf.TensorSpec(tensor.shape, tf.as_dtype(tensor.dtype), name=tensor.name)

    input_spec = tf.nest.map_structure(spec, model.input)

    def call(inputs):
        return model(inputs, training=False)

    return _Signature(call, [input_spec], True)


def _default_signatures(obj: Any) -> Dict[str, _Signature]:
    """The signatures for `signatures=None` (see `export_static_saved_model`)."""
    functions = _tf_function_attributes(obj)
    if not functions:
        keras = _keras_signature(obj)
        if keras is None:
            raise ValueError(
                f"{type(obj).__name__} has no tf.function with an input_signature and is "
                "not a Keras model with inputs: pass `signatures=`."
            )
        return {_DEFAULT_KEY: keras}
    signatures = {
        ("call" if name == "__call__" else name): _from_tf_function(name, fn)
        for name, fn in functions.items()
    }
    default = next((functions[n] for n in ("serve", "__call__") if n in functions), None)
    if default is None and len(functions) == 1:
        (default,) = functions.values()
    if default is not None and _DEFAULT_KEY not in signatures:
        signatures[_DEFAULT_KEY] = _from_tf_function(_DEFAULT_KEY, default)
    return signatures


# Attributes of the exported module besides the signatures.
_MODULE_ATTRIBUTES = ("frozen_tables", "captured_objects")


def _requested_signatures(obj: Any, signatures: Any) -> Dict[str, _Signature]:
    if signatures is None:
        requested = _default_signatures(obj)
    elif isinstance(signatures, dict):
        if not signatures:
            raise ValueError("`signatures` must not be empty.")
        requested = {
            str(name): _from_tf_function(str(name), fn) for name, fn in signatures.items()
        }
    else:
        requested = {_DEFAULT_KEY: _from_tf_function(_DEFAULT_KEY, signatures)}
    for name in requested:
        if name in _MODULE_ATTRIBUTES or not name.isidentifier():
            raise ValueError(
                f"Signature name {name!r} must be a Python identifier other than "
                f"{' and '.join(_MODULE_ATTRIBUTES)} (it names an attribute of the model)."
            )
    return requested


def _traced(signature: _Signature) -> tf.types.experimental.PolymorphicFunction:
    return tf.function(
        signature.python_function,
        input_signature=signature.input_signature,
        autograph=signature.autograph,
    )


# ---------------------------------------------------------------------------------------
# The export
# ---------------------------------------------------------------------------------------


def _looked_up(signatures: Dict[str, _Signature]) -> List[Any]:
    """The tables and variables the signatures look up (a trace with the real ops);
    the shard tables of a variable that is looked up are left out."""
    with _export_context.recording() as seen:
        for signature in signatures.values():
            _traced(signature).get_concrete_function()
    variables = [obj for obj in seen.values() if isinstance(obj, Variable)]
    shard_tables = {id(table) for variable in variables for table in variable.tables}
    tables = [
        obj for obj in seen.values()
        if isinstance(obj, _DynembTable) and id(obj) not in shard_tables
    ]
    return variables + tables


def _freeze(obj: Any, index: int) -> tf.Module:
    """The stock-op stand-in of a table or variable, with its current content."""
    name = f"{obj.name}_{index}"
    if isinstance(obj, Variable):
        return FrozenVariable(obj, name)
    keys, values = obj.export()
    return FrozenTable(keys, values, obj.default_value, name)


def _check_stock_ops(name: str, concrete: Any, custom_ops: set) -> None:
    """Raises if the traced signature `name` still calls an op of our library."""
    graph_def = concrete.graph.as_graph_def()
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes.extend(function.node_def)
    used = sorted({node.op for node in nodes if node.op in custom_ops})
    if used:
        raise ValueError(
            f"Signature {name!r} still calls {', '.join(used)} after freezing: a static "
            "SavedModel can only look tables and variables up (lookup, embedding_lookup*); "
            "it cannot insert, remove, export, count or partition keys."
        )


def _captured_trackables(concrete: Any) -> List[Any]:
    """The TF objects (variables, stock tables) whose handles `concrete` captures:
    the static model must track them for `tf.saved_model.save` to save them."""
    found = list(concrete.variables)
    for tensor in concrete.captured_inputs:
        parent = getattr(tensor, "_parent_trackable", None)
        trackable = parent() if parent is not None else None
        if trackable is not None:
            found.append(trackable)
    return found


def export_static_saved_model(
    obj: Any,
    export_dir: str,
    signatures: Any = None,
    options: Optional[tf.saved_model.SaveOptions] = None,
) -> List[str]:
    """Writes a SavedModel of `obj` that needs no custom op: every table and
    `de.Variable` its signatures look up is frozen into stock TF objects.

    The signature functions are traced again while each table's and variable's
    `lookup` reads a `FrozenTable` holding its current entries (lookups only: a
    signature that inserts, removes, exports or counts keys raises). The SavedModel
    holds a new `tf.Module` with the frozen tables (`frozen_tables`), the other TF
    objects the signatures read (`captured_objects`: dense variables, Keras weights),
    and the signatures as tf.function attributes of the same names; nothing else of
    `obj`.

    Missing keys read the table's default or the variable's initializer, see the
    module docstring (key-seeded random rows are reproduced exactly; other random
    initializers give zeros).

    Args:
      obj: a `tf.Module`, Keras model or any trackable object whose functions look up
        `de.HashTable`s, `de.HkvHashTable`s or `de.Variable`s (Keras layers holding a
        `de.Variable` in `params` included).
      export_dir: the directory to write.
      signatures: a tf.function with an `input_signature` (exported as
        "serving_default"), or a dict of them by signature name. Default: every
        tf.function attribute of `obj` with an `input_signature`, by attribute name
        (`__call__` as "call"); the one named `serve`, else `__call__`, else the only
        one, is also "serving_default". An `obj` without any, that is a functional
        Keras model, exports `obj(inputs, training=False)` as "serving_default".
      options: `tf.saved_model.SaveOptions` for `tf.saved_model.save`.

    Returns:
      The names of the tables and variables that were frozen (those the signatures
      look up).

    Raises:
      RuntimeError: not executing eagerly.
      TypeError / ValueError: a signature that is not a tf.function with an
        input_signature, or that calls a custom op other than a lookup.
    """
    if not tf.executing_eagerly():
        raise RuntimeError("export_static_saved_model needs eager execution (TF2).")
    requested = _requested_signatures(obj, signatures)
    originals = _looked_up(requested)
    stand_ins = {id(original): _freeze(original, i) for i, original in enumerate(originals)}

    static = tf.Module(name="static_model")
    static.frozen_tables = list(stand_ins.values())
    # Every op of the library is named Dynemb* (the generated module lists them).
    custom_ops = {name for name in dir(_ops.load_op_library()) if name.startswith("Dynemb")}
    with _export_context.freezing(stand_ins):
        captured = []
        for name, signature in requested.items():
            function = _traced(signature)
            setattr(static, name, function)
            concrete = function.get_concrete_function()
            _check_stock_ops(name, concrete, custom_ops)
            captured.extend(_captured_trackables(concrete))
        static.captured_objects = captured
        # tf.saved_model.save traces the functions again (in its save context): also
        # with the stand-ins.
        tf.saved_model.save(
            static,
            export_dir,
            signatures={name: getattr(static, name) for name in requested},
            options=options,
        )
    return [original.name for original in originals]
