"""Test-session setup: three logical CPU devices, so that sharding tests can place
each shard of a variable on its own device. It must run before TensorFlow
initialises its devices, hence here, once, for the whole session."""

import tensorflow as tf

NUM_LOGICAL_CPUS = 3

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS
)
