"""What the missing keys of a `de.Variable` read: its `initializer`, resolved once.

Three kinds, chosen when the variable is created:

- constant rows (a number, list, ndarray, `[dim]` tensor, or a Zeros / Ones / Constant
  initializer): the row is the shard tables' `default_value`, so a lookup costs nothing
  extra. As TFRA does, one element is broadcast to `[dim]` and a value of another
  dtype is cast to the value dtype (`0.1` for int rows is 0);
- key-seeded random rows (RandomNormal, RandomUniform, TruncatedNormal from Keras 3,
  `tf_keras`, `tf.*_initializer` or `tf.compat.v1`): the `DynembKeyedRandom` op draws
  row `r(seed, key)`, so every missing key gets its own draw, and the same key gets the
  same row on any shard, in any process and after any restore. With an integer `seed`
  on the initializer (or a global `tf.random.set_seed`) this is fully deterministic;
  without one the seed is drawn once per variable;
- any other callable (user functions, other initializers): called once per lookup as
  `initializer(shape=[n, dim], dtype=value_dtype)` for the `n` distinct keys of the
  lookup (first occurrences in order), and a missing key reads the row at its place
  among them. That is TFRA's call for a lookup of distinct keys on one device (its
  Keras layers look up distinct keys), so a callable gives the rows it gives in TFRA;
  a key repeated in the lookup reads one row.

Why Keras' random initializers are drawn per key rather than called: an initializer
instance returns the same matrix on every call (Keras warns of it when unseeded), so
TFRA's call gives every key the row of its place in the batch: keys of one place share
an initial row across steps and tables, and the row a key gets depends on the rest of
its batch and on the partitioning. A per-key draw depends on the key alone, which is
what keeps restores and changes of shard count exact. (TFRA's rows remain one line
away: pass `lambda shape, dtype: init(shape, dtype)`, a plain callable.)

Initializers whose scale depends on the shape of the whole matrix (the VarianceScaling
family: Glorot*, He*, Lecun*; Orthogonal; Identity) are refused with a `ValueError`: a
dynamic table has no fixed number of rows, so their scale would change with the number
of keys a batch misses (and Keras computes it from a static shape, which a graph does
not have). Use RandomNormal / TruncatedNormal / RandomUniform with an explicit scale.
"""

from __future__ import annotations

import random
from typing import Any, Optional

import numpy as np
import tensorflow as tf

from tensorflow_dynemb import _ops
from tensorflow_dynemb._convert import convert

__all__ = ["RowInitializer", "make_row_initializer"]

# Initializer class names (the same in Keras 3, tf_keras, TF v2 and TF v1) -> the
# DynembKeyedRandom distribution and the config fields of its (a, b) parameters.
_KEYED_DISTRIBUTIONS = {
    "RandomNormal": ("normal", "mean", "stddev"),
    "TruncatedNormal": ("truncated_normal", "mean", "stddev"),
    "RandomUniform": ("uniform", "minval", "maxval"),
}
_CONSTANT_INITIALIZERS = {"Zeros": 0, "Ones": 1}
_DEFAULT_PARAMS = {"mean": 0.0, "stddev": 0.05, "minval": -0.05, "maxval": 0.05}
# What a parameter given as None means: tf.compat.v1.random_uniform_initializer's default
# maxval=None is 1 (for floating rows), as in tf.random.uniform.
_NONE_PARAMS = {"maxval": 1.0}
# Initializers (and their subclasses) whose values depend on the whole matrix's shape.
_SHAPE_DEPENDENT = {"VarianceScaling", "Orthogonal", "OrthogonalInitializer", "Identity"}


class RowInitializer:
    """The initial rows of missing keys.

    Attributes:
      default_row: `[dim]` tensor the shard tables return for missing keys: the
        constant row, or zeros when rows are drawn per key.
      per_key: whether `rows(keys)` must be called for missing keys.
    """

    def __init__(self, default_row: tf.Tensor, per_key: bool):
        self.default_row = default_row
        self.per_key = per_key

    def rows(self, keys: tf.Tensor) -> tf.Tensor:
        """`[n, dim]` initial rows for the 1-D `keys` (here: the constant row each)."""
        return tf.tile(self.default_row[tf.newaxis, :], [tf.size(keys), 1])

    def fill(self, values: tf.Tensor, exists: tf.Tensor, keys: tf.Tensor) -> tf.Tensor:
        """`values` (`[n, dim]`, found for the 1-D `keys`) with the rows of the keys that
        do not `exist` replaced by `rows` of those keys."""
        missing = tf.where(tf.logical_not(exists))
        return tf.tensor_scatter_nd_update(values, missing, self.rows(tf.gather_nd(keys, missing)))


class _KeyedRandomRows(RowInitializer):
    def __init__(self, default_row, dim, value_dtype, distribution, a, b, seed):
        super().__init__(default_row, per_key=True)
        self._dim = dim
        self._value_dtype = value_dtype
        self.distribution = distribution
        self.params = (float(a), float(b))
        self.seed = int(seed)

    def _attrs(self) -> dict:
        """The attrs of the keyed-random ops for this initializer."""
        return dict(dim=self._dim, seed=self.seed, distribution=self.distribution,
                    a=self.params[0], b=self.params[1])

    def rows(self, keys: tf.Tensor) -> tf.Tensor:
        draw_dtype = tf.float64 if self._value_dtype == tf.float64 else tf.float32
        rows = _ops.ops.dynemb_keyed_random(keys, dtype=draw_dtype, **self._attrs())
        return tf.cast(rows, self._value_dtype)

    def fill(self, values: tf.Tensor, exists: tf.Tensor, keys: tf.Tensor) -> tf.Tensor:
        if self._value_dtype not in (tf.float32, tf.float64):
            return super().fill(values, exists, keys)  # drawn in float32, then cast
        # One op, the same rows: no gather of the missing keys, no scatter into a copy.
        return _ops.ops.dynemb_keyed_random_fill(values, exists, keys, **self._attrs())


class _CallableRows(RowInitializer):
    def __init__(self, default_row, dim, value_dtype, fn):
        super().__init__(default_row, per_key=True)
        self._dim = dim
        self._value_dtype = value_dtype
        self._fn = fn

    def rows(self, keys: tf.Tensor) -> tf.Tensor:
        # One row per distinct key (in first-occurrence order), so a key repeated in a
        # batch reads one row, and distinct keys read the rows of their places.
        unique_keys, index = tf.unique(keys)
        shape = tf.stack([tf.size(unique_keys), self._dim])
        rows = tf.cast(tf.reshape(self._fn(shape=shape, dtype=self._value_dtype), shape),
                       self._value_dtype)
        return tf.gather(rows, index)

    def fill(self, values: tf.Tensor, exists: tf.Tensor, keys: tf.Tensor) -> tf.Tensor:
        # Called for all the lookup's keys, not only the missing ones: TFRA's mapping of
        # rows to keys (see the module docstring).
        return tf.where(exists[:, tf.newaxis], values, self.rows(keys))


def _config(initializer: Any) -> Optional[dict]:
    get_config = getattr(initializer, "get_config", None)
    if not callable(get_config):
        return None
    try:
        return dict(get_config())
    except (TypeError, ValueError, NotImplementedError):
        return None


def _constant_row(value: Any, dim: int, value_dtype: tf.dtypes.DType, arg: str) -> tf.Tensor:
    """A constant value as the `[dim]` default row, converted as TFRA converts it: one
    element is broadcast (a scalar, `[1]`, `[[1]]`), `dim` elements in any shape are
    reshaped to `[dim]`, and a value of another dtype is cast (`_cast_value`)."""
    row = _cast_value(value, value_dtype, arg)
    size = row.shape.num_elements()
    if size == 1:
        return tf.fill([dim], tf.reshape(row, []))
    if size == dim:
        return tf.reshape(row, [dim])
    # TFRA fills the row with the first element of any other value; a value of another
    # size is more likely a mistake than a wish for its first element.
    raise ValueError(
        f"`{arg}` must be a scalar, one element, or [dim] = [{dim}] elements (one per "
        f"column), got shape {row.shape}."
    )


def _cast_value(value: Any, value_dtype: tf.dtypes.DType, arg: str) -> tf.Tensor:
    """`value` as a tensor of `value_dtype`: converted exactly where it fits the dtype,
    else cast as TFRA casts initializers (an int64 tensor for int32 rows; 0.1 for int32
    rows is 0, as `tf.cast` truncates). Only numbers and bools are cast.

    Raises:
      TypeError: a value that is no number or bool (or not for such rows).
    """
    try:
        return convert(value, value_dtype, arg)
    except TypeError:
        pass
    try:
        tensor = tf.convert_to_tensor(value)
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"`{arg}` must be a number, a list / ndarray / tensor of numbers, or an "
            f"initializer; got {value!r}."
        ) from e
    numeric = (tensor.dtype, value_dtype)
    if not all(d.is_floating or d.is_integer or d == tf.bool for d in numeric):
        raise TypeError(
            f"`{arg}` of dtype {tensor.dtype.name} cannot be cast to the variable's "
            f"value_dtype {value_dtype.name}."
        )
    return tf.cast(tensor, value_dtype)


def _param(config: dict, field: str) -> Any:
    """A distribution parameter of an initializer's config (missing: Keras' default)."""
    value = config.get(field, _DEFAULT_PARAMS[field])
    return _NONE_PARAMS.get(field, _DEFAULT_PARAMS[field]) if value is None else value


def _seed(config_seed: Any) -> int:
    """The keyed-random seed: the initializer's, else one from TF's global seed, else a
    fresh random one (drawn once per variable)."""
    if isinstance(config_seed, (int, np.integer)) and not isinstance(config_seed, bool):
        return int(config_seed)
    global_seed, op_seed = tf.compat.v1.get_seed(None)
    if global_seed is not None:
        return (int(global_seed) * 1_000_003 + int(op_seed or 0)) % (1 << 63)
    return random.SystemRandom().getrandbits(63)


def make_row_initializer(
    initializer: Any, dim: int, value_dtype: tf.dtypes.DType, arg: str = "initializer"
) -> RowInitializer:
    """Resolves a `de.Variable` `initializer` argument (see the module docstring).

    Raises:
      TypeError: a value that cannot be cast to `value_dtype` (strings for numbers), or
        an object that is neither a value nor a callable initializer.
      ValueError: a value of neither one nor `dim` elements, or an initializer that
        scales by the matrix shape (VarianceScaling family, Orthogonal, Identity).
    """
    if initializer is None:
        initializer = tf.zeros([], value_dtype)  # 0 in any dtype (bool: False)
    name = type(initializer).__name__
    config = _config(initializer) if callable(initializer) else None

    if config is not None and name in _CONSTANT_INITIALIZERS:
        # 0 and 1 mean the same in every value dtype, bool included: cast, not convert.
        constant = tf.cast(_CONSTANT_INITIALIZERS[name], value_dtype)
        row = _constant_row(constant, dim, value_dtype, arg)
        return RowInitializer(row, per_key=False)
    if config is not None and name == "Constant" and "value" in config:
        return RowInitializer(_constant_row(config["value"], dim, value_dtype, arg), per_key=False)
    zeros = tf.zeros([dim], value_dtype)
    if config is not None and name in _KEYED_DISTRIBUTIONS:
        distribution, a_field, b_field = _KEYED_DISTRIBUTIONS[name]
        a, b = (_param(config, field) for field in (a_field, b_field))
        seed = _seed(config.get("seed"))
        return _KeyedRandomRows(zeros, dim, value_dtype, distribution, a, b, seed)
    shape_dependent = {c.__name__ for c in type(initializer).__mro__} & _SHAPE_DEPENDENT
    if shape_dependent:
        raise ValueError(
            f"`{arg}` {name} ({shape_dependent.pop()} family) scales its values by the "
            "shape of the whole matrix, which a dynamic table does not have (its scale "
            "would change with the number of keys a batch misses). Use RandomNormal, "
            "TruncatedNormal or RandomUniform with an explicit scale instead."
        )
    if callable(initializer):
        return _CallableRows(zeros, dim, value_dtype, initializer)
    return RowInitializer(_constant_row(initializer, dim, value_dtype, arg), per_key=False)
