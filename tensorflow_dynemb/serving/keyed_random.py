"""Key-seeded random rows in stock TF ops: a transcription of `DynembKeyedRandom`
(cc/core/partition.h), so that a static SavedModel reads, for a missing key, the row the
live `de.Variable` would."""

from __future__ import annotations

from typing import Callable

import numpy as np
import tensorflow as tf


__all__ = ["keyed_random_rows"]


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
