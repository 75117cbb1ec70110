"""`de.Variable` contents in Keras weight stores (`.keras`, `.weights.h5`).

Keras saves a layer or an optimizer by handing its `save_own_variables(store)` a
dict-like store of NumPy arrays, backed by HDF5 (or `.npz`). A table has no fixed
shape, so each one is written as a few arrays named `<table>.<field>`:

- `keys`: the keys (int32 / int64); string keys, which HDF5 cannot hold as NumPy
  object arrays, are written as `key_bytes` (every key's bytes, concatenated, uint8)
  and `key_lengths` (int64 byte length of each key) instead;
- `values`: `[n, dim]` rows (bfloat16 as float32: exact, and every store accepts it);
- `scores`: int64 eviction scores (HkvHashTable), so a bounded table keeps its order.

Contents go through the variable's checkpoint hooks (`_serialize_to_tensors` /
`_restore_from_tensors`), so a table is saved only when the variable is checkpointed
(`checkpoint=True`), and restores into any number of shards, as with
`tf.train.Checkpoint`.

`SlotTablesSaving` gives a `de.DynamicEmbeddingOptimizer` wrapper the same for its slot
tables (Adam's `m` and `v`, ...).
"""

from __future__ import annotations

import re
import weakref
from typing import Any, Dict

import numpy as np
import tensorflow as tf

from tensorflow_dynemb.persistence.checkpoint import CKPT_KEYS, CKPT_SCORES, CKPT_VALUES
from tensorflow_dynemb.keras._compat import Layer, Untracked

__all__ = [
    "store_name",
    "save_tables",
    "read_tables",
    "restore_table",
    "SlotTables",
    "SlotTablesSaving",
]

_FIELDS = ("keys", "key_bytes", "key_lengths", "values", "scores")


def store_name(name: str) -> str:
    """`name` as one store entry name: HDF5 would read "/" as a nested group."""
    return re.sub(r"[/\\]", ":", name)


def _arrays(variable) -> Dict[str, np.ndarray]:
    """The content of `variable` as store arrays (empty when it is not checkpointed)."""
    tensors = variable._serialize_to_tensors()
    if not tensors:
        return {}
    keys = tensors[CKPT_KEYS].numpy()
    values = tensors[CKPT_VALUES]
    if values.dtype == tf.bfloat16:
        values = tf.cast(values, tf.float32)
    arrays = {"values": values.numpy()}
    if CKPT_SCORES in tensors:  # slot states save no scores (training/slots.py)
        arrays["scores"] = tensors[CKPT_SCORES].numpy()
    if variable.key_dtype == tf.string:
        arrays["key_bytes"] = np.frombuffer(b"".join(keys.tolist()), np.uint8)
        arrays["key_lengths"] = np.array([len(k) for k in keys.tolist()], np.int64)
    else:
        arrays["keys"] = keys
    return arrays


def save_tables(store, variables: Dict[str, Any]) -> None:
    """Writes each `de.Variable` of `{name: variable}` into `store` as `<name>.<field>`."""
    for name, variable in variables.items():
        for field, array in _arrays(variable).items():
            store[f"{name}.{field}"] = array


def read_tables(store) -> Dict[str, Dict[str, np.ndarray]]:
    """`{name: {field: array}}` of every table in `store` (other entries are ignored)."""
    tables: Dict[str, Dict[str, np.ndarray]] = {}
    for key in list(store.keys()):
        name, dot, field = key.rpartition(".")
        if dot and field in _FIELDS:
            tables.setdefault(name, {})[field] = np.asarray(store[key])
    return tables


def _keys(arrays: Dict[str, np.ndarray], key_dtype: tf.dtypes.DType) -> tf.Tensor:
    if "key_bytes" not in arrays:
        return tf.constant(arrays["keys"], key_dtype)
    data = arrays["key_bytes"].tobytes()
    ends = np.cumsum(arrays["key_lengths"])
    starts = ends - arrays["key_lengths"]
    keys = [data[s:e] for s, e in zip(starts.tolist(), ends.tolist())]
    return tf.constant(keys, tf.string, shape=[len(keys)])


def restore_table(variable, arrays: Dict[str, np.ndarray]) -> None:
    """Replaces the content of `variable` with the arrays `read_tables` returned for it."""
    tensors = {
        CKPT_KEYS: _keys(arrays, variable.key_dtype),
        CKPT_VALUES: tf.cast(arrays["values"], variable.value_dtype),
    }
    if "scores" in arrays:
        tensors[CKPT_SCORES] = tf.constant(arrays["scores"], tf.int64)
    variable._restore_from_tensors(tensors)


def numbered_entries(store) -> Dict[str, Any]:
    """The entries of `store` Keras' own `load_own_variables` reads ("0", "1", ...)."""
    return {key: store[key] for key in store.keys() if key.isdigit()}


class SlotTables(Layer):
    """The slot tables of a `de.DynamicEmbeddingOptimizer` wrapper in Keras weight
    files, by slot name: Keras saves it as a child of the optimizer
    (`<optimizer>/dynamic_embedding_slots`), next to the optimizer's own variables.

    A separate child, so that the optimizer's own entries stay exactly those of the
    optimizer it wraps, which a model compiled with the plain optimizer can load. A
    Keras layer only because that is what Keras saves as a child; it is never called.

    A slot table is created at the first training step of its variable, which may come
    after loading (`keras.models.load_model` builds the optimizer before any step):
    such contents wait, and are restored when their slots are created, before the step
    reads them.
    """

    def __init__(self, optimizer):
        super().__init__(name="dynamic_embedding_slots")
        self._state = Untracked(optimizer=weakref.ref(optimizer), pending={})

    def _slots(self) -> Dict[str, Any]:
        """`{name: slot state de.Variable}`, named as in TF checkpoints (`SlotStore`'s
        attribute names, `<variable name>-<slot names>`, e.g. `emb-m_v`): unlike the
        states' own names, they do not depend on the optimizer's name, which Keras makes
        unique per process.
        """
        from tensorflow_dynemb.variable.variable import Variable

        slot_store = self._state.optimizer()._slot_store
        return {name: v for name, v in vars(slot_store).items() if isinstance(v, Variable)}

    def save_own_variables(self, store):
        save_tables(store, self._slots())

    def load_own_variables(self, store):
        self._state.pending.update(read_tables(store))
        self.restore_pending()

    def restore_pending(self) -> None:
        """Restores the waiting contents whose slots exist now."""
        if not self._state.pending:
            return
        with tf.init_scope():  # once, eagerly, even when first reached while tracing
            for name, slot in self._slots().items():
                arrays = self._state.pending.pop(name, None)
                if arrays is not None:
                    restore_table(slot, arrays)


class SlotTablesSaving:
    """Mixin of a `de.DynamicEmbeddingOptimizer` wrapper (Keras 3 or tf_keras; first in
    its bases): saves its slot tables in Keras weight files through `SlotTables`."""

    @property
    def dynamic_embedding_slots(self) -> SlotTables:
        """The `SlotTables` child Keras saves (found by Keras' walk over attributes; a
        property, so that `tf.train.Checkpoint`, which saves the slots itself, does not
        see it)."""
        holder = self.__dict__.get("_dynemb_slot_tables")
        if holder is None:
            holder = Untracked(tables=SlotTables(self))
            self._dynemb_slot_tables = holder
        return holder.tables

    def _apply_pairs(self, pairs, apply_dense):
        # Create this step's slots first, so that contents waiting since a load are in
        # place before the step reads them.
        self._dynemb.create_slots([v for g, v in pairs if g is not None])
        self.dynamic_embedding_slots.restore_pending()
        return super()._apply_pairs(pairs, apply_dense)
