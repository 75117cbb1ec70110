"""Checkpoint plumbing shared by tables and variables.

Both save through the public Trackable hooks (`_serialize_to_tensors` /
`_restore_from_tensors`), which `tf.train.Checkpoint` calls directly. TF1's
`tf.compat.v1.train.Saver` instead looks for SaveableObjects in a graph collection;
`register_for_tf1_saver` puts one there, built from the same hooks.
"""

from __future__ import annotations

import tensorflow as tf

# Checkpoint keys, relative to the object's own checkpoint prefix.
CKPT_KEYS = "-keys"
CKPT_VALUES = "-values"
CKPT_SCORES = "-scores"


class Untracked:
    """Plain attributes for an object to hold out of sight of Keras' and TF's
    attribute tracking (which would wrap dicts and lists, make checkpoint dependencies
    of trackables, and save layers)."""

    def __init__(self, **values):
        self.__dict__.update(values)


def in_tf1_graph() -> bool:
    """True while building a TF1 graph (not eager, not inside a `tf.function`)."""
    return not tf.executing_eagerly() and not tf.inside_function()


def register_for_tf1_saver(trackable, name: str) -> None:
    """Lets `tf.compat.v1.train.Saver` (and `MonitoredTrainingSession`'s default
    Scaffold) save and restore `trackable` under the graph-unique `name`."""
    factories = tf.__internal__.tracking.saveable_objects_from_trackable(trackable)
    (factory,) = factories.values()
    tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS, factory(name=name))
