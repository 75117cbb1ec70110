"""The name a SavedModel keeps of each `de.Variable` and table: a function
`_dynemb_name` among its SavedModel children that returns the name.

A loaded SavedModel holds no Python attributes of the objects saved, only their
children; `de.serving.DeltaUpdater` finds the variables and tables of a loaded model
by the names `de.DeltaExporter` wrote (docs/online_learning.md), also in a Keras
`model.export` archive, where the objects between the archive and the tables are
gone. Checkpoints are not affected: the function is a SavedModel child only.
"""

from __future__ import annotations

import weakref

import tensorflow as tf

NAME_FUNCTION = "_dynemb_name"

# One function per object, kept outside the object: an attribute holding a
# tf.function would be saved a second time under the attribute's name.
_functions: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def add_name_function(obj, name: str, children: dict) -> dict:
    """Adds `obj`'s name function to its SavedModel `children`; returns them."""
    fn = _functions.get(obj)
    if fn is None:
        fn = tf.function(lambda: tf.constant(name), input_signature=[], autograph=False)
        _functions[obj] = fn
    children[NAME_FUNCTION] = fn
    return children


def saved_name(loaded_obj):
    """The name a loaded object's `_dynemb_name` function returns, or None when it has
    none (not one of ours, or saved before the function existed)."""
    fn = getattr(loaded_obj, NAME_FUNCTION, None)
    if fn is None or not callable(fn):
        return None
    return fn().numpy().decode("utf-8")
