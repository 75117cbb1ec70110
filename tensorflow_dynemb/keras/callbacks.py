"""Keras callbacks for dynamic embeddings: periodic restriction and table statistics.

Under MultiWorkerMirroredStrategy every worker runs the callbacks at the same steps:
a model-parallel variable's restriction ranks every worker's keys together and its
statistics are summed over the workers and written by the chief.

Both find the model's `de.Variable`s by walking its trackable objects (layers,
sub-models, attributes), so they work with any layer that holds a `de.Variable`, and
skip optimizer slots (which are not trainable and follow their variable). They subclass
`tf.keras.callbacks.Callback`, i.e. Keras 3, or tf_keras when `TF_USE_LEGACY_KERAS=1`.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Union

import tensorflow as tf

from tensorflow_dynemb._convert import check_int
from tensorflow_dynemb.distribute.collectives import gather_rows
from tensorflow_dynemb.variable.variable import Variable

__all__ = ["RestrictCallback", "TableStatsCallback", "variables_of"]


def variables_of(model) -> List[Variable]:
    """The trainable `de.Variable`s reachable from `model`, each once, in a stable order."""
    found, seen = [], set()
    for obj in tf.train.TrackableView(model).descendants():
        if isinstance(obj, Variable) and obj.trainable and id(obj) not in seen:
            seen.add(id(obj))
            found.append(obj)
    return found


class _EveryNSteps(tf.keras.callbacks.Callback):
    """Calls `self._run()` after every `every_n_steps`-th training batch."""

    def __init__(self, every_n_steps: int):
        super().__init__()
        self.every_n_steps = check_int(every_n_steps, "every_n_steps", 1)
        self._steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self._steps += 1
        if self._steps % self.every_n_steps == 0:
            self._run()

    def _run(self) -> None:
        raise NotImplementedError


class RestrictCallback(_EveryNSteps):
    """Restricts the model's variables every `every_n_steps` training steps.

    Each `de.Variable` with a `restrict_policy` keeps its `num_reserved` highest-ranked
    keys once it holds more than `trigger` (see `de.Variable.restrict`); variables
    without a policy are left alone.

    Args:
      num_reserved: keys to keep per variable: one number for all, or
        `{variable name: number}` (variables not named are left alone).
      every_n_steps: how often, in training steps.
      trigger: restrict only above this size (default: `num_reserved`); a number or a
        dict like `num_reserved`.

    Example:

    >>> callback = de.keras.callbacks.RestrictCallback(1_000_000, every_n_steps=1000)
    >>> model.fit(dataset, callbacks=[callback])  # doctest: +SKIP
    """

    def __init__(
        self,
        num_reserved: Union[int, Dict[str, int]],
        every_n_steps: int = 1000,
        trigger: Union[None, int, Dict[str, int]] = None,
    ):
        super().__init__(every_n_steps)
        self.num_reserved = num_reserved
        self.trigger = trigger

    @staticmethod
    def _for(setting, var: Variable) -> Optional[int]:
        if isinstance(setting, dict):
            return setting.get(var.name)
        return setting

    def _run(self) -> None:
        for var in variables_of(self.model):
            num_reserved = self._for(self.num_reserved, var)
            if var.restrict_policy is None or num_reserved is None:
                continue
            var.restrict(num_reserved, trigger=self._for(self.trigger, var))


# What `tf.summary.scalar` attaches (TensorBoard's scalars plugin), written with
# `tf.summary.write` so that logging works without the tensorboard package installed.
_SCALAR_METADATA = tf.compat.v1.SummaryMetadata(
    plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars")
).SerializeToString()


class TableStatsCallback(_EveryNSteps):
    """Writes every `de.Variable`'s `stats()` (size, capacity, load factor, inserts,
    lookups, misses, evictions) to TensorBoard every `every_n_steps` training steps, as
    scalars `dynamic_embedding/<variable name>/<stat>`.

    Args:
      log_dir: the TensorBoard log directory (e.g. the `log_dir` of
        `tf.keras.callbacks.TensorBoard`; the scalars go to `<log_dir>/train`).
      every_n_steps: how often, in training steps.
    """

    def __init__(self, log_dir: str, every_n_steps: int = 100):
        super().__init__(every_n_steps)
        self.log_dir = log_dir
        self._writer = None

    def _run(self) -> None:
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(f"{self.log_dir}/train")
        with self._writer.as_default():
            for var in variables_of(self.model):
                stats, chief = _whole_variable_stats(var)
                if not chief:
                    continue
                for key, value in stats.items():
                    tag = f"dynamic_embedding/{var.name}/{key}"
                    value = tf.cast(value, tf.float32)
                    tf.summary.write(tag, value, step=self._steps, metadata=_SCALAR_METADATA)
        self._writer.flush()

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _whole_variable_stats(var: Variable):
    """`(stats, whether this process writes them)`: the variable's `stats()`, summed
    over the workers for a model-parallel variable (every worker runs the callback at
    the same step), which the chief alone writes; as they are otherwise."""
    stats = var.stats()
    group = var.worker_group
    if group is None:
        return stats, True
    names = [key for key in stats if key != "load_factor"]
    local = tf.stack([tf.cast(stats[key], tf.int64) for key in names])
    total = tf.reduce_sum(
        tf.reshape(gather_rows(group, local[tf.newaxis], name="table_stats"), [-1, len(names)]), 0
    )
    summed = dict(zip(names, tf.unstack(total)))
    summed["load_factor"] = tf.math.divide_no_nan(
        tf.cast(summed["size"], tf.float32), tf.cast(summed["capacity"], tf.float32)
    )
    return summed, group.rank == 0
