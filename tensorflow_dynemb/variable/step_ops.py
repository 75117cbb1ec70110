"""The training step's deduplication and per-id gradient sums, on the package's ops.

`unique` is `tf.unique` and `segment_sum_with_counts` is `tf.math.unsorted_segment_sum`
plus the number of rows per segment; both give exactly TF's results (first-occurrence
order; rows added in row order). Where the `DynembUnique` / `DynembSegmentSum` kernels
cover the dtypes (integer ids; float32 / float64 rows) they run those, which took a
quarter to a half of TF's time in the training step (docs/benchmarks.md, "Step
helpers"); other dtypes fall back to the TF ops.
"""

from __future__ import annotations

from typing import Tuple

import tensorflow as tf

from tensorflow_dynemb import _ops

__all__ = ["unique", "segment_sum_with_counts"]

_UNIQUE_KEY_DTYPES = (tf.int32, tf.int64)
_SUM_DTYPES = (tf.float32, tf.float64)


def unique(ids: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """`tf.unique(ids)` of the 1-D `ids`: the distinct ids in order of first occurrence,
    and each id's position among them (int32)."""
    if ids.dtype in _UNIQUE_KEY_DTYPES:
        return _ops.ops.dynemb_unique(ids)
    return tf.unique(ids)


def segment_sum_with_counts(
    values: tf.Tensor, segment_ids: tf.Tensor, num_segments: tf.Tensor
) -> Tuple[tf.Tensor, tf.Tensor]:
    """`tf.math.unsorted_segment_sum(values, segment_ids, num_segments)` for 1-D
    `segment_ids` (one per row of `values`), and how many rows each segment received."""
    if values.dtype in _SUM_DTYPES:
        num_segments = tf.cast(num_segments, segment_ids.dtype)
        return _ops.ops.dynemb_segment_sum(values, segment_ids, num_segments)
    sums = tf.math.unsorted_segment_sum(values, segment_ids, num_segments)
    counts = tf.math.unsorted_segment_sum(tf.ones_like(segment_ids), segment_ids, num_segments)
    return sums, counts
