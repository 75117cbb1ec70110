"""Test-session setup: three logical CPU devices, so that sharding tests can place
each shard of a variable on its own device. It must run before TensorFlow
initialises its devices, hence here, once, for the whole session.

Without TensorFlow (e.g. a GPU machine that runs only the TF-free core tests
through tests/core_ext.py and tests/core_gpu_ext.py) there is nothing to set up."""

try:
    import tensorflow as tf
except ImportError:
    tf = None

NUM_LOGICAL_CPUS = 3

if tf is not None:
    _cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        _cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS
    )
