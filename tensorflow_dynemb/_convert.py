"""Input conversion shared by the table, variable and lookup layers.

Python lists, scalars and NumPy arrays are converted to the table's dtype; a tensor of
another dtype is a `TypeError` (never a silent cast), raised before any op runs. Errors
name the argument, the value received and what was expected.
"""

from __future__ import annotations

from typing import Any, Tuple, Union

import numpy as np
import tensorflow as tf

# Anything `tf.convert_to_tensor` accepts: tensors, variables, NumPy arrays, Python
# scalars and (nested) lists.
TensorLike = Any
DTypeLike = Union[tf.dtypes.DType, str, type, np.dtype]

KEY_DTYPES = (tf.int32, tf.int64, tf.string)
VALUE_DTYPES = (
    tf.float32,
    tf.float64,
    tf.float16,
    tf.bfloat16,
    tf.int8,
    tf.int32,
    tf.int64,
    tf.bool,
)


class DTypeError(TypeError, ValueError):
    """A tensor of another dtype than the table's (`convert`).

    A `TypeError`, as API.md promises; also a `ValueError`, which is what TFRA raises
    for a dtype mismatch, so that TFRA code catching `ValueError` keeps working."""


def _is_tensor_like(value: Any) -> bool:
    """True for TF tensors, TF/Keras variables and other objects that carry a TF dtype."""
    if isinstance(value, (np.ndarray, np.generic)):
        return False
    return tf.is_tensor(value) or isinstance(value, tf.Variable) or hasattr(value, "dtype")


def _accepted_numpy_kinds(dtype: tf.dtypes.DType) -> str:
    """NumPy dtype kinds that convert to `dtype` without changing any value's meaning."""
    if dtype == tf.string:
        return "USO"
    if dtype == tf.bool:
        return "bO"
    if dtype.is_integer:
        return "biuO"
    return "biufVO"  # floating point ("V": ml_dtypes' bfloat16)


def _conversion_hint(arg: str, received: tf.dtypes.DType, dtype: tf.dtypes.DType) -> str:
    """How to convert a tensor of dtype `received` to `dtype` (never done silently: a
    narrowing cast may change values)."""
    if dtype == tf.string and received != tf.string:
        return f"; convert it with tf.strings.as_string({arg})"
    if received == tf.string:
        if dtype.is_integer or dtype.is_floating:
            return f"; convert it with tf.strings.to_number({arg}, tf.{dtype.name})"
        return ""
    return f"; convert it with tf.cast({arg}, tf.{dtype.name})"


def convert(value: TensorLike, dtype: tf.dtypes.DType, arg: str) -> tf.Tensor:
    """Converts `value` to a tensor of `dtype`, raising `TypeError` on a dtype mismatch.

    A tensor (or variable) must already have `dtype`: it is never cast silently. Python
    lists, scalars and NumPy arrays are converted, unless the conversion would change a
    value (a float or string into an integer, an integer out of the range of `dtype`).

    Raises:
      DTypeError (a `TypeError` and a `ValueError`): `value` has another dtype.
      ValueError: an integer out of the range of `dtype`.
    """
    if _is_tensor_like(value):
        try:
            received = tf.as_dtype(value.dtype)
        except TypeError as e:
            raise DTypeError(
                f"`{arg}` must be a tensor of dtype {dtype.name}; got {type(value).__name__} "
                f"with dtype {value.dtype!r}."
            ) from e
        if received != dtype:
            raise DTypeError(
                f"`{arg}` must have dtype {dtype.name} (the table's dtype), "
                f"got a tensor of dtype {received.name}{_conversion_hint(arg, received, dtype)}."
            )
        return tf.convert_to_tensor(value, dtype=dtype, name=arg)

    array = np.asarray(value) if not isinstance(value, (str, bytes)) else None
    if array is not None and array.size > 0:
        if array.dtype.kind not in _accepted_numpy_kinds(dtype):
            raise DTypeError(
                f"`{arg}` must hold values convertible to {dtype.name} (the table's dtype), "
                f"got {type(value).__name__} of NumPy dtype {array.dtype}."
            )
        if dtype.is_integer and array.dtype.kind in "iu":
            info = np.iinfo(dtype.as_numpy_dtype)
            low, high = array.min(), array.max()
            if low < info.min or high > info.max:
                raise ValueError(
                    f"`{arg}` holds values out of the range of {dtype.name} "
                    f"([{info.min}, {info.max}]): min {low}, max {high}."
                )
    try:
        return tf.convert_to_tensor(value, dtype=dtype, name=arg)
    except (TypeError, ValueError) as e:
        raise DTypeError(
            f"`{arg}` could not be converted to {dtype.name} (the table's dtype): {e}"
        ) from e


def convert_scores(scores: TensorLike, arg: str = "scores") -> tf.Tensor:
    """Scores are int64; integer tensors of a narrower type are widened."""
    if _is_tensor_like(scores):
        received = tf.as_dtype(scores.dtype)
        if received != tf.int64 and received.is_integer and received.size < 8:
            return tf.cast(scores, tf.int64)
    return convert(scores, tf.int64, arg)


def as_dtype(
    dtype: DTypeLike, arg: str, supported: Tuple[tf.dtypes.DType, ...]
) -> tf.dtypes.DType:
    """`tf.as_dtype(dtype)`, which must be one of `supported`; else `TypeError`."""
    try:
        result = tf.as_dtype(dtype)
    except TypeError as e:
        raise TypeError(f"`{arg}` must be a TensorFlow dtype, got {dtype!r}.") from e
    if result not in supported:
        raise TypeError(
            f"`{arg}` must be one of {[d.name for d in supported]}, got {result.name}."
        )
    return result


def check_int(value: Any, arg: str, minimum: int) -> int:
    """`value` as an int >= `minimum`: `TypeError` if not an integer, else `ValueError`."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"`{arg}` must be an integer, got {value!r}.")
    if value < minimum:
        raise ValueError(f"`{arg}` must be >= {minimum}, got {value}.")
    return int(value)


def check_shape(tensor: tf.Tensor, expected: tf.TensorShape, arg: str, relation: str) -> str:
    """Raises when `tensor`'s shape is known to differ from `expected` (`relation` says
    how it is derived, e.g. "keys.shape + [dim]"): `InvalidArgumentError` eagerly,
    `ValueError` while building a graph, before any op runs. Returns the message, which
    starts with "Expected shape", for a check at run time of a shape not known yet.
    """
    message = f"Expected shape {expected} ({relation}) for `{arg}`, got {tensor.shape}"
    if not tensor.shape.is_compatible_with(expected):
        if tf.executing_eagerly():
            raise tf.errors.InvalidArgumentError(None, None, message)
        raise ValueError(message)
    return message


def as_vector(tensor: tf.Tensor) -> tf.Tensor:
    """`tensor` as a vector: itself when it is one already (no op), else a reshape."""
    return tensor if tensor.shape.rank == 1 else tf.reshape(tensor, [-1])


def keyed_rows(rows: tf.Tensor, ids: tf.Tensor, dim: int) -> tf.Tensor:
    """The `[n, dim]` rows of `as_vector(ids)` as `ids.shape + [dim]`: the rows themselves
    for 1-D ids (their shape already), a reshape to a constant shape where `ids`' shape
    is known, one computed from `tf.shape(ids)` otherwise. Each op of a training step
    costs executor time, which at small batches is most of the step (issue 35)."""
    target = ids.shape.concatenate([dim])
    if ids.shape.rank == 1:
        rows.set_shape(target)
        return rows
    if target.is_fully_defined():
        return tf.reshape(rows, target.as_list())
    rows = tf.reshape(rows, tf.concat([tf.shape(ids), [dim]], 0))
    rows.set_shape(target)
    return rows


def flat_rows(keys: tf.Tensor, values: TensorLike, dim: int, dtype: tf.dtypes.DType, arg: str) -> tf.Tensor:
    """`values` converted to `dtype` and checked to be `keys.shape + [dim]`, as `[n, dim]`.

    A shape known to differ is an error before any op runs (`InvalidArgumentError`
    eagerly, `ValueError` while building a graph); a shape known only at run time is
    checked by an op the result depends on. The message starts with "Expected shape".
    """
    values = convert(values, dtype, arg)
    message = check_shape(values, keys.shape.concatenate([dim]), arg, "keys.shape + [dim]")
    if not values.shape.is_fully_defined() or not keys.shape.is_fully_defined():
        want = tf.concat([tf.shape(keys), [dim]], 0)
        check = tf.debugging.assert_equal(tf.shape(values), want, message=message)
        with tf.control_dependencies([check]):
            values = tf.identity(values)
    if values.shape.rank == 2 and values.shape[1] == dim:
        return values  # `[n, dim]` already
    return tf.reshape(values, [-1, dim])


def flat_keyed(keys: tf.Tensor, tensor: TensorLike, dtype: tf.dtypes.DType, arg: str) -> tf.Tensor:
    """`tensor` converted to `dtype` and checked to be `keys.shape` (one entry per key,
    like `exists`), as a vector.

    Checked as `flat_rows` checks rows: a shape known to differ is an error before any
    op runs; a shape known only at run time (a `tf.function` with unknown shapes) is
    checked by an op the result depends on, before the flattening hides it (a
    `[3, 1]` tensor has as many entries as `[3]` keys). The message starts with
    "Expected shape".
    """
    tensor = convert(tensor, dtype, arg)
    message = check_shape(tensor, keys.shape, arg, "keys.shape")
    if not tensor.shape.is_fully_defined() or not keys.shape.is_fully_defined():
        check = tf.debugging.assert_equal(
            tf.size(tf.shape(tensor)), tf.size(tf.shape(keys)), message=message
        )
        with tf.control_dependencies([check]):
            # Equal ranks first: assert_equal of two shapes of other ranks would fail
            # on the comparison, not with this message.
            same = tf.debugging.assert_equal(
                tf.shape(tensor),
                tf.reshape(tf.shape(keys), tf.shape(tf.shape(tensor))),
                message=message,
            )
        with tf.control_dependencies([same]):
            tensor = tf.identity(tensor)
    return tf.reshape(tensor, [-1])
