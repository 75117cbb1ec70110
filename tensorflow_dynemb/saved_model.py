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

A frozen table (`FrozenTable`) is a `tf.lookup.experimental.MutableHashTable` from key
to row number plus the rows in dense variables. Both live in the SavedModel's
variables checkpoint, not in its graph, so tables of any size export (a graph is
limited to 2 GiB); the rows are split into variables of at most `MAX_SHARD_BYTES`
each. Serving only calls `lookup` on the hash table (`LookupTableFindV2`, read-only).

Missing keys read:
- in a table: its `default_value` (or the `dynamic_default_values` the lookup passes);
- in a `de.Variable` with a constant initializer: that row;
- in a `de.Variable` with a key-seeded random initializer (RandomNormal, RandomUniform,
  TruncatedNormal): the same per-key row as the live variable, computed with stock ops
  (`keyed_random_rows`, a transcription of `DynembKeyedRandom`);
- in a `de.Variable` with any other callable initializer (a user function), whose
  live rows are fresh draws at every lookup, so that no frozen value can match them:
  zeros, deterministic.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from tensorflow_dynemb import _export_context, _ops
from tensorflow_dynemb.initializers import _KeyedRandomRows
from tensorflow_dynemb.tables import _DynembTable
from tensorflow_dynemb.variable import Variable

__all__ = [
    "export_static_saved_model",
    "FrozenTable",
    "FrozenVariable",
    "keyed_random_rows",
    "MAX_SHARD_BYTES",
]

# The most bytes one row variable of a frozen table holds; larger tables are split
# into several (read with `tf.nn.embedding_lookup`'s "div" strategy). Far below the
# 2 GiB limit of a single graph constant or proto, and small enough to place.
MAX_SHARD_BYTES = 1 << 30


# ---------------------------------------------------------------------------------------
# Frozen tables: stock TF objects holding an exported table
# ---------------------------------------------------------------------------------------


def _identifier(name: str) -> str:
    """`name` as a valid tf.Module / op name (letters, digits, underscores)."""
    cleaned = re.sub(r"\W", "_", name)
    return cleaned if cleaned[:1].isalpha() else f"t_{cleaned}"


def _shard_sizes(num_rows: int, row_bytes: int, max_bytes: int) -> List[int]:
    """Row counts of the variables holding `num_rows` rows: each at most `max_bytes`
    (at least one row), split as `np.array_split` does (the first `num_rows % shards`
    get one row more), which is the layout `tf.nn.embedding_lookup`'s default "div"
    strategy reads."""
    rows_per_shard = max(1, max_bytes // max(1, row_bytes))
    shards = max(1, math.ceil(num_rows / rows_per_shard))
    base, extra = divmod(num_rows, shards)
    return [base + 1 if i < extra else base for i in range(shards)]


def _index_dtype(key_dtype: tf.dtypes.DType) -> tf.dtypes.DType:
    # The stock hash table has no int32 -> int64 kernel: int32 keys are widened.
    return tf.int64 if key_dtype == tf.int32 else key_dtype


def _index_keys(keys: tf.Tensor) -> tf.Tensor:
    return tf.cast(keys, tf.int64) if keys.dtype == tf.int32 else keys


class FrozenTable(tf.Module):
    """A table's entries in stock TF objects: `index` maps each key to its row number,
    `shards` hold the rows (`[rows] + value_shape`, split by `MAX_SHARD_BYTES`).

    Lookups only read: concurrent calls are safe and see the same entries forever.
    """

    def __init__(self, keys: tf.Tensor, values: tf.Tensor, default_value: tf.Tensor,
                 name: str):
        """Freezes `keys` `[n]` and their `values` `[n] + value_shape`.

        Args:
          keys: the exported keys (unique).
          values: their rows.
          default_value: what missing keys read when `find` gets no defaults
            (`value_shape`).
          name: a name for the module and its objects.
        """
        super().__init__(name=_identifier(name))
        num_rows = int(keys.shape[0])
        self._value_shape = values.shape[1:]
        self.default_value = tf.constant(default_value)
        self.index = tf.lookup.experimental.MutableHashTable(
            _index_dtype(keys.dtype), tf.int64, default_value=-1, name=f"{self.name}_index"
        )
        self.index.insert(_index_keys(keys), tf.range(num_rows, dtype=tf.int64))
        row_bytes = self._value_shape.num_elements() * values.dtype.size
        self.shards = []
        start = 0
        for i, size in enumerate(_shard_sizes(num_rows, row_bytes, MAX_SHARD_BYTES)):
            if size == 0:  # an empty table: no rows to read
                break
            self.shards.append(
                tf.Variable(values[start:start + size], trainable=False,
                            name=f"{self.name}_rows_{i}")
            )
            start += size

    def find(self, keys: tf.Tensor, defaults: Optional[tf.Tensor] = None
             ) -> Tuple[tf.Tensor, tf.Tensor]:
        """`(values, exists)` of `keys` (any shape), as `DynembTableFind` gives them.

        Args:
          keys: keys of the frozen key dtype.
          defaults: what missing keys read: one row (`value_shape`) or one per key
            (`keys.shape + value_shape`); default `default_value`.
        """
        defaults = self.default_value if defaults is None else defaults
        value_shape = tf.constant(self._value_shape.as_list(), tf.int32)
        out_shape = tf.concat([tf.shape(keys), value_shape], 0)
        if not self.shards:
            values = tf.broadcast_to(defaults, out_shape)
            return values, tf.zeros(tf.shape(keys), tf.bool)
        index = self.index.lookup(_index_keys(keys))
        exists = index >= 0
        rows = tf.nn.embedding_lookup(self.shards, tf.maximum(index, 0))
        # `exists` broadcast over the value axes.
        mask = tf.reshape(exists, tf.concat(
            [tf.shape(exists), tf.ones([self._value_shape.rank], tf.int32)], 0))
        return tf.where(mask, rows, defaults), exists


class FrozenVariable(tf.Module):
    """A `de.Variable`'s entries in stock TF objects (one `FrozenTable` for all its
    shards, so no partition op is needed), with its initializer's rows for missing
    keys (see the module docstring)."""

    def __init__(self, variable: Variable, name: str):
        super().__init__(name=_identifier(name))
        keys, values = variable.export()
        initializer = variable.initializer
        self.table = FrozenTable(keys, values, initializer.default_row, name=f"{self.name}_rows")
        self._keyed = initializer if isinstance(initializer, _KeyedRandomRows) else None
        self._dim = variable.dim
        self._value_dtype = variable.value_dtype

    def find(self, flat_keys: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        """`([n, dim] rows, [n] exists)` of the 1-D `flat_keys`, as `Variable.lookup`."""
        values, exists = self.table.find(flat_keys)
        if self._keyed is not None:
            missing = tf.where(tf.logical_not(exists))
            rows = keyed_random_rows(
                tf.gather_nd(flat_keys, missing),
                dim=self._dim,
                seed=self._keyed.seed,
                distribution=self._keyed.distribution,
                a=self._keyed.params[0],
                b=self._keyed.params[1],
                dtype=self._value_dtype,
            )
            values = tf.tensor_scatter_nd_update(values, missing, rows)
        return values, exists


# ---------------------------------------------------------------------------------------
# Key-seeded random rows in stock ops (cc/core/partition.h, transcribed)
# ---------------------------------------------------------------------------------------

_MIX_MUL_1 = 0xFF51AFD7ED558CCD
_MIX_MUL_2 = 0xC4CEB9FE1A85EC53
_KEY_OFFSET = 0x9E3779B97F4A7C15
_STREAM_STEP = 0xD1B54A32D192ED03
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_TWO_PI = 6.283185307179586476925286766559


def _u64(value: int) -> tf.Tensor:
    return tf.constant(value, tf.uint64)


def _xor_shift(x: tf.Tensor, bits: int) -> tf.Tensor:
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, _u64(bits)))


def _mix64(x: tf.Tensor) -> tf.Tensor:
    """murmur3's fmix64 (`StableMix64`) on uint64 tensors (multiplication wraps)."""
    x = _xor_shift(x, 33) * _u64(_MIX_MUL_1)
    x = _xor_shift(x, 33) * _u64(_MIX_MUL_2)
    return _xor_shift(x, 33)


def _string_hash(keys: tf.Tensor) -> tf.Tensor:
    """`StableKeyHash` of 1-D string keys: FNV-1a over the bytes, then fmix64 of the
    hash xor the length."""
    lengths = tf.strings.length(keys)  # bytes
    width = tf.reduce_max(tf.concat([lengths, [1]], 0))
    data = tf.cast(tf.io.decode_raw(keys, tf.uint8, fixed_length=width), tf.uint64)

    def step(i, h):
        hashed = tf.bitwise.bitwise_xor(h, data[:, i]) * _u64(_FNV_PRIME)
        return i + 1, tf.where(i < lengths, hashed, h)

    start = tf.fill(tf.shape(keys), _u64(_FNV_OFFSET))
    _, h = tf.while_loop(lambda i, h: i < width, step, [tf.constant(0), start])
    return _mix64(tf.bitwise.bitwise_xor(h, tf.cast(lengths, tf.uint64)))


def _key_hash(keys: tf.Tensor) -> tf.Tensor:
    """`StableKeyHash` of 1-D keys (int32 keys widened to int64 first)."""
    if keys.dtype == tf.string:
        return _string_hash(keys)
    return _mix64(tf.bitcast(tf.cast(keys, tf.int64), tf.uint64))


def keyed_random_rows(keys: tf.Tensor, dim: int, seed: int, distribution: str,
                      a: float, b: float, dtype: tf.dtypes.DType) -> tf.Tensor:
    """The `[n, dim]` rows `DynembKeyedRandom` draws for the 1-D `keys`, in stock ops.

    Row `(seed, key)`, column `c`: uniform `a + (b - a) * U` (kept below `b`), or normal
    / truncated normal of mean `a`, stddev `b` by Box-Muller, where the `j`-th uniform
    of a key's stream is `fmix64(base + (j + 1) * step) >> 11` scaled to `[0, 1)`.
    Computed in float64 like the op, so values match it to the last bit of `dtype`
    except where TF's and the C library's `log` / `cos` round differently (at most a
    float64 ulp before the cast).

    Args:
      keys: int32, int64 or string keys.
      dim: columns per row.
      seed: the initializer's seed.
      distribution: "uniform", "normal" or "truncated_normal".
      a, b: (minval, maxval) or (mean, stddev).
      dtype: the value dtype of the rows.
    """
    # The op's a and b attributes are float32; draws are made in float64 from them.
    a, b = float(np.float32(a)), float(np.float32(b))
    seed_bits = tf.bitcast(tf.constant(seed, tf.int64), tf.uint64)
    base = _mix64(tf.bitwise.bitwise_xor(seed_bits, _mix64(_key_hash(keys) + _u64(_KEY_OFFSET))))
    columns = tf.cast(tf.range(dim, dtype=tf.int64), tf.uint64)

    def uniform(j: tf.Tensor) -> tf.Tensor:  # j: [dim] or [n, dim] stream positions
        bits = _mix64(base[:, tf.newaxis] + (j + _u64(1)) * _u64(_STREAM_STEP))
        return tf.cast(tf.bitwise.right_shift(bits, _u64(11)), tf.float64) * 2.0**-53

    def normal(attempt: tf.Tensor) -> tf.Tensor:
        # Attempt t of column c reads stream entries 2 * (c + t * dim) and the next.
        j = _u64(2) * (columns + attempt * _u64(dim))
        u1 = 1.0 - uniform(j)
        return tf.sqrt(-2.0 * tf.math.log(u1)) * tf.cos(_TWO_PI * uniform(j + _u64(1)))

    if distribution == "uniform":
        draw = a + (b - a) * uniform(columns)
    elif distribution in ("normal", "truncated_normal"):
        z = normal(_u64(0))
        if distribution == "truncated_normal":
            z = _redraw_outside_two_stddevs(z, normal)
        draw = a + b * z
    else:
        raise ValueError(f"Unknown keyed distribution {distribution!r}.")

    draw_dtype = tf.float64 if dtype == tf.float64 else tf.float32
    rows = tf.cast(draw, draw_dtype)
    if distribution == "uniform" and b > a:
        # Rounding to the draw dtype can reach b itself; the op keeps draws below it.
        upper = tf.constant(b, draw_dtype)
        below = tf.math.nextafter(upper, tf.constant(a, draw_dtype))
        rows = tf.where(rows < upper, rows, below)
    return tf.cast(rows, dtype)


def _redraw_outside_two_stddevs(z: tf.Tensor, normal: Callable[[tf.Tensor], tf.Tensor]):
    """`z` with every draw beyond 2 stddevs replaced by the first later attempt
    within them (the op's rejection loop, for all entries at once)."""

    def step(attempt, z, done):
        attempt = attempt + _u64(1)
        redrawn = normal(attempt)
        z = tf.where(done, z, redrawn)
        return attempt, z, done | (tf.abs(redrawn) <= 2.0)

    done = tf.abs(z) <= 2.0
    _, z, _ = tf.while_loop(
        lambda attempt, z, done: tf.logical_not(tf.reduce_all(done)),
        step,
        [_u64(0), z, done],
    )
    return z


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
