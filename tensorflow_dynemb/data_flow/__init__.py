"""`de.data_flow`: TFRA's `dynamic_embedding.data_flow` namespace (partition.py).

TFRA added GPU kernels of these two ops (with `bool` data) to builds with CUDA and used
TensorFlow's otherwise; these functions are TensorFlow's ops (CPU and GPU kernels) under
TFRA's names and arguments, with TensorFlow's gradients.
"""

from tensorflow_dynemb.data_flow.partition import dynamic_partition, dynamic_stitch

__all__ = ["dynamic_partition", "dynamic_stitch"]
