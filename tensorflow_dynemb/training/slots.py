"""Optimizer slots of `de.Variable`s: one state table per variable, one view per slot.

A `de.DynamicEmbeddingOptimizer` keeps, per trained variable, every slot of its rule
(Adam's `m` and `v`, Adagrad's accumulator, ...) in the rows of one companion
`de.Variable` (the variable's *slot state*): a key's row there is its slots' rows side by
side, `[m | v]` for Adam, so `dim * number of slots` wide. Compared with one table per
slot, the key, its score and its index entry are stored once instead of once per slot
(Adam at dim 16, 10M keys: 258 instead of 290 resident bytes per key with the parameter,
see docs/benchmarks.md), and a training step reads and writes all slots of its keys with
one lookup and one upsert.

Users see each slot as a `SlotView` (what `get_slot_variables` returns): a variable-like
object of the parameter's dim, whose reads and writes touch only its own columns of the
state rows.

Checkpoints save the state variable (by the name `<variable name>-<slot names>` in the
optimizer's `dynamic_embedding_slots` module): keys and rows, without scores. The slot
state is an unbounded table that nothing ranks or evicts by score (the parameter's
evictions and restrictions remove slot rows by key), so its scores carry no
information, and leaving them out keeps checkpoints at the payload's size.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from tensorflow_dynemb._convert import TensorLike, convert, flat_rows
from tensorflow_dynemb.persistence.checkpoint import Untracked

__all__ = ["SlotStore", "SlotView"]


class SlotView:
    """One optimizer slot of a `de.Variable` (e.g. Adam's `m`): columns
    `[index * dim, (index + 1) * dim)` of the variable's slot state rows.

    Keyed, sharded and placed like the variable; reads and writes take and return rows
    of the variable's `dim`. A key absent from the state reads the slot's initial value.
    `remove` and `clear` act on the whole state row, i.e. on every slot of the key
    (slot rows only ever leave together: when the variable loses a key).
    """

    def __init__(self, state, index: int, dim: int, name: str):
        self._state = state
        self._begin = index * dim
        self._dim = dim
        self._name = name

    # -- properties ----------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def key_dtype(self) -> tf.dtypes.DType:
        return self._state.key_dtype

    @property
    def value_dtype(self) -> tf.dtypes.DType:
        return self._state.value_dtype

    @property
    def devices(self) -> List[str]:
        return self._state.devices

    @property
    def shard_num(self) -> int:
        return self._state.shard_num

    @property
    def tables(self) -> List[Any]:
        """The slot state's shard tables (rows of every slot of the variable)."""
        return self._state.tables

    @property
    def state(self):
        """The `de.Variable` holding every slot of the variable, side by side."""
        return self._state

    @property
    def params(self):
        """The slot as a variable: the view itself. For TFRA code, whose optimizers'
        `get_slot(trainable, name)` return a trainable whose `params` is the slot."""
        return self

    # -- reads ---------------------------------------------------------------------------

    def _columns(self, rows: tf.Tensor) -> tf.Tensor:
        return rows[..., self._begin : self._begin + self._dim]

    def lookup(self, keys: TensorLike, return_exists: bool = False, name: Optional[str] = None):
        """This slot's rows of `keys` (`keys.shape + [dim]`); absent keys read the slot's
        initial value. With `return_exists`, also whether each key has a row."""
        with tf.name_scope(name or "slot_lookup"):
            rows, exists = self._state.lookup(keys, return_exists=True)
            values = self._columns(rows)
            return (values, exists) if return_exists else values

    def size(self, index: Optional[int] = None, name: Optional[str] = None) -> tf.Tensor:
        """Keys with slot rows (of shard `index`, or of all shards)."""
        return self._state.size(index, name=name)

    def export_with_scores(self, name: Optional[str] = None):
        """`(keys [n], values [n, dim], scores int64 [n])` of every key, order unspecified."""
        keys, rows, scores = self._state.export_with_scores(name=name)
        return keys, self._columns(rows), scores

    def export(self, name: Optional[str] = None) -> Tuple[tf.Tensor, tf.Tensor]:
        """`(keys [n], values [n, dim])` of every key, order unspecified."""
        keys, rows = self._state.export(name=name)
        return keys, self._columns(rows)

    # -- writes --------------------------------------------------------------------------

    def upsert(self, keys: TensorLike, values: TensorLike, name: Optional[str] = None):
        """Sets this slot's rows of `keys` to `values` (`keys.shape + [dim]`); the key's
        other slots keep their rows (or start from their initial values). A read, then a
        write of the whole state row: a concurrent write of the same key's other slots
        between the two may be lost (training steps write all slots at once).

        Returns:
          The write operation (None when executing eagerly).
        """
        with tf.name_scope(name or "slot_upsert"):
            keys = tf.reshape(convert(keys, self.key_dtype, "keys"), [-1])
            new = flat_rows(keys, values, self._dim, self.value_dtype, "values")
            rows = self._state.lookup(keys)
            end = self._begin + self._dim
            return self._state.upsert(keys, tf.concat([rows[:, : self._begin], new, rows[:, end:]], 1))

    def remove(self, keys: TensorLike, name: Optional[str] = None):
        """Removes the state rows of `keys`: every slot of those keys."""
        return self._state.remove(keys, name=name)

    def clear(self, name: Optional[str] = None):
        """Removes every state row: every slot of every key."""
        return self._state.clear(name=name)

    def __repr__(self) -> str:
        return (
            f"<de slot name={self._name!r} key_dtype={self.key_dtype.name} "
            f"value_dtype={self.value_dtype.name} dim={self._dim} shards={self.shard_num}>"
        )


class SlotStore(tf.Module):
    """Holds the slot states (`de.Variable`s) as attributes, so that checkpoints of the
    optimizer (which tracks this module) save and restore them, by a name stable across
    processes: `<variable name>-<slot names joined by _>` (`emb-m_v` for Adam)."""

    def __init__(self):
        super().__init__(name="dynamic_embedding_slots")
        # id(params) -> (params, state, {slot name -> SlotView}); in a plain holder,
        # because checkpoints track the states by attribute name, not through this index.
        # `accumulators`: id(params) -> (params, gradient accumulator), the same way.
        self._index = Untracked(by_params={}, accumulators={})

    def state_of(self, params) -> Optional[Any]:
        """The slot state of `params`, or None before its slots exist."""
        entry = self._entry(params)
        return entry[1] if entry is not None else None

    def slots_of(self, params) -> Dict[str, SlotView]:
        """`{slot name: SlotView}` of `params` (empty before its slots exist)."""
        entry = self._entry(params)
        return entry[2] if entry is not None else {}

    def _entry(self, params):
        entry = self._index.by_params.get(id(params))
        return entry if entry is not None and entry[0] is params else None

    def create(self, params, specs: Sequence[Any], optimizer_name: str) -> Dict[str, SlotView]:
        """Creates the slot state of `params` for the slots `specs` (`SlotSpec`s, in the
        order of their columns) and returns the slot views."""
        names = [spec.name for spec in specs]
        joined = "_".join(names)
        initial = [float(spec.initial) for spec in specs for _ in range(params.dim)]
        with tf.init_scope():  # long-lived tables even when first traced in a tf.function
            state = params.companion(
                f"{optimizer_name}/{joined}",
                value_dtype=params.value_dtype,
                dim=params.dim * len(specs),
                initializer=initial,
                # Slots of a bounded variable are unbounded: they lose exactly the
                # keys the variable evicts (SparseApplier removes them), never others.
                kv_creator=None if params.bounded else params.kv_creator,
                checkpoint_scores=False,
            )
        views = {
            name: SlotView(state, i, params.dim, f"{params.name}/{optimizer_name}/{name}")
            for i, name in enumerate(names)
        }
        params._register_slots(state, list(views.values()))
        setattr(self, self._attribute_name(params, joined), state)
        self._index.by_params[id(params)] = (params, state, views)
        return views

    def accumulators(self) -> List[Tuple[Any, Any]]:
        """`(params, gradient accumulator)` of every variable that has one, in the
        order they were created (see accumulation.py)."""
        return list(self._index.accumulators.values())

    def accumulator_of(self, params, dtype: tf.dtypes.DType, optimizer_name: str):
        """The gradient accumulator of `params` (accumulation.py): a companion
        `de.Variable` of `dim + 1` columns (the summed gradient, then the summed
        occurrence count), created on first use and saved with the optimizer as
        `<variable name>-gradient_accumulator`."""
        entry = self._index.accumulators.get(id(params))
        if entry is not None and entry[0] is params:
            return entry[1]
        with tf.init_scope():  # long-lived, also when first reached in a tf.function
            accumulator = params.companion(
                f"{optimizer_name}/gradient_accumulator",
                value_dtype=dtype,
                dim=params.dim + 1,
                initializer=0.0,
                # Unbounded, like the slots: it must never lose a key's gradient.
                kv_creator=None if params.bounded else params.kv_creator,
                checkpoint_scores=False,
            )
        setattr(self, self._attribute_name(params, "gradient_accumulator"), accumulator)
        self._index.accumulators[id(params)] = (params, accumulator)
        return accumulator

    def _attribute_name(self, params, slot_names: str) -> str:
        base = re.sub(r"\W", "_", f"{params.name}-{slot_names}")
        name, i = base, 1
        while name in self.__dict__:  # two variables of one name: number them in order
            name, i = f"{base}_{i}", i + 1
        return name


def split_state(rows: tf.Tensor, names: Sequence[str]) -> Dict[str, tf.Tensor]:
    """`{slot name: [n, dim] rows}` of `[n, len(names) * dim]` state rows."""
    if len(names) == 1:
        return {names[0]: rows}
    return dict(zip(names, tf.split(rows, len(names), axis=1)))


def join_state(slot_rows: Dict[str, tf.Tensor], names: Sequence[str]) -> tf.Tensor:
    """The state rows of `{slot name: [n, dim] rows}`, columns in the order of `names`."""
    if len(names) == 1:
        return slot_rows[names[0]]
    return tf.concat([slot_rows[name] for name in names], 1)
