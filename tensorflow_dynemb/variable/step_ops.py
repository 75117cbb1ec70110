"""The training step's deduplication, row gather and per-id gradient sums, on the
package's ops.

`unique` is `tf.unique`, `gather_rows` is `variable.sparse_read` and
`segment_sum_with_counts` is `tf.math.unsorted_segment_sum` plus the number of rows per
segment; all give exactly TF's results (first-occurrence order; the rows themselves;
rows added in row order), and `gather_rows` has `sparse_read`'s gradient. Where the
`DynembUnique` / `DynembGatherRows` / `DynembSegmentSum` kernels cover the case (integer
ids; float32 / float64 rows; a resource variable on the CPU) they run those, which took
a quarter to a half of TF's time in the training step (docs/benchmarks.md, "Step
helpers" and issue 35); otherwise the TF ops run.
"""

from __future__ import annotations

from typing import Tuple

import tensorflow as tf
from tensorflow.python.ops import resource_variable_ops

from tensorflow_dynemb import _ops

__all__ = ["unique", "gather_rows", "segment_sum_with_counts"]

_UNIQUE_KEY_DTYPES = (tf.int32, tf.int64)
_SUM_DTYPES = (tf.float32, tf.float64)


def unique(ids: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """`tf.unique(ids)` of the 1-D `ids`: the distinct ids in order of first occurrence,
    and each id's position among them (int32)."""
    if ids.dtype in _UNIQUE_KEY_DTYPES:
        return _ops.ops.dynemb_unique(ids)
    return tf.unique(ids)


def gather_rows(variable, index: tf.Tensor) -> tf.Tensor:
    """`variable.sparse_read(index)` for a 1-D `index` (int32 or int64), with the same
    gradient (an `IndexedSlices` of `variable`, indices `index`)."""
    if not _gathers_on_cpu(variable, index):
        return variable.sparse_read(index)
    with tf.name_scope("Gather"):
        # What sparse_read does first: a tape that records this read watches the
        # variable, and so differentiates with respect to it.
        resource_variable_ops.variable_accessed(variable)
        return _ops.ops.dynemb_gather_rows(variable.handle, index, dtype=variable.dtype)


def _gathers_on_cpu(variable, index: tf.Tensor) -> bool:
    """Whether `DynembGatherRows` reads `variable` at `index`: a resource variable whose
    `sparse_read` is the plain ResourceGather of its handle (a `tf.function`'s
    variables are a subclass; distributed variables read elsewhere), of float32 /
    float64 rows on a CPU, read at a 1-D int32 / int64 index."""
    base = resource_variable_ops.BaseResourceVariable
    return (
        isinstance(variable, base)
        and type(variable).sparse_read is base.sparse_read
        and variable.dtype in _SUM_DTYPES
        and index.dtype in _UNIQUE_KEY_DTYPES
        and index.shape.rank == 1
        and _on_cpu(variable.device)
    )


def _on_cpu(device: str) -> bool:
    """Whether a variable placed at `device` is on a CPU (an unplaced one is where no
    GPU is)."""
    device_type = tf.DeviceSpec.from_string(device or "").device_type
    if device_type is None:
        return not tf.config.list_logical_devices("GPU")
    return device_type == "CPU"


@tf.RegisterGradient("DynembGatherRows")
def _gather_rows_gradient(op, grad):
    """ResourceGather's gradient for a 1-D index: the incoming rows at `indices`."""
    handle, indices = op.inputs
    dense_shape = tf.raw_ops.VariableShape(input=handle)
    # The indices as a tensor of the gradient's own graph (ResourceGather's gradient
    # reshapes them): a function's backward graph that returned the forward op's
    # input itself failed to build ("node id ... is >= than number of nodes").
    return tf.IndexedSlices(grad, tf.identity(indices), dense_shape), None


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
