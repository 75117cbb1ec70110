"""Tables and variables listed in a TF1 `tf.compat.v1.train.Saver`'s `var_list`.

Given a trackable in `var_list`, the Saver asks its `_gather_saveables_for_checkpoint()`
first (TF's legacy hook, which nothing else asks of objects that, like ours, have
`_serialize_to_tensors`), and falls back to `_serialize_to_tensors` under the name ""
(so two objects would write the same checkpoint keys). `TF1SaverHooks` answers the
first with a SaveableObject named like the one `register_for_tf1_saver` puts in the
graph collection for `Saver()` without `var_list`, so both write the same checkpoint.
"""

from __future__ import annotations

import functools
from typing import Callable, Dict

import tensorflow as tf


class _Content(tf.__internal__.tracking.Trackable):
    """An object's content as a trackable of its own, for TF to build a SaveableObject
    from: the tensors `serialize()` returns, restored by `restore(tensors)`."""

    def __init__(self, serialize: Callable[[], Dict[str, tf.Tensor]], restore: Callable):
        self._serialize = serialize
        self._restore = restore

    def _serialize_to_tensors(self):
        return self._serialize()

    def _restore_from_tensors(self, restored_tensors):
        return self._restore(restored_tensors)


def saveables_for_tf1_saver(
    name: str, serialize: Callable[[], Dict[str, tf.Tensor]], restore: Callable
) -> Dict[str, Callable]:
    """`_gather_saveables_for_checkpoint()` of an object saved as `name` (a graph-unique
    name in TF1 graphs) with the tensors `serialize()` returns, restored by
    `restore(tensors)`. The SaveableObject is made when the Saver asks for it."""
    content = _Content(serialize, restore)
    (factory,) = tf.__internal__.tracking.saveable_objects_from_trackable(content).values()
    return {"content": functools.partial(factory, name=name)}


class TF1SaverHooks:
    """Mixin of tables and variables: `_gather_saveables_for_checkpoint` for a TF1
    `Saver` given the object in `var_list`.

    Put it after the class defining `_serialize_to_tensors` in the bases: TF takes an
    object's checkpoint hooks from the first class in its MRO defining either method,
    and TF2 checkpoints must keep using `_serialize_to_tensors`.
    """

    def _tf1_saver_name(self) -> str:
        """The name of the object's content in the checkpoint."""
        raise NotImplementedError

    def _tf1_saver_tensors(self) -> Dict[str, tf.Tensor]:
        """The content the Saver writes (what `_restore_from_tensors` takes)."""
        raise NotImplementedError

    def _gather_saveables_for_checkpoint(self):
        return saveables_for_tf1_saver(
            self._tf1_saver_name(), self._tf1_saver_tensors, self._restore_from_tensors
        )
