"""`de.math`: TFRA's `dynamic_embedding.math` namespace (sparse_ops.py).

TFRA shipped GPU kernels of these three ops when TensorFlow had none; TensorFlow's own
ops run on CPU and GPU now, so these functions are TensorFlow's, under TFRA's names and
argument order, with TensorFlow's gradients.
"""

from tensorflow_dynemb.math.sparse_ops import (
    sparse_fill_empty_rows,
    sparse_reshape,
    sparse_segment_sum,
)

__all__ = ["sparse_segment_sum", "sparse_fill_empty_rows", "sparse_reshape"]
