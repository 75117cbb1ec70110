"""The training side of a `de.Variable`: its trainable views (trainable.py), the fused
optimizer step on a slot state, and the optimizer slots and companion variables kept
beside it. A mixin of `Variable` (variable.py)."""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional, Sequence

import tensorflow as tf

from tensorflow_dynemb._convert import DTypeLike, TensorLike
from tensorflow_dynemb.persistence.checkpoint import in_tf1_graph
from tensorflow_dynemb.variable.sharding import HashTableCreator, _is_gpu
from tensorflow_dynemb.distribute.model_parallel import ModelParallelRows
from tensorflow_dynemb.variable.trainable import TrainableRows, replica_key


class TrainingState:
    """Trainable views, fused rule steps, slots and companions of a `Variable`."""

    def _can_apply_rules(self) -> bool:
        """Whether `_apply_rule` works here: unbounded shard tables on CPUs, one initial
        row for every key. What a slot state (training/slots.py) is, unless its parameter's
        shards are on GPUs: the GPU kernel exists (bit-equal to the CPU rule in the core's
        tests) but has not yet run under TensorFlow on a GPU (docs/gpu.md)."""
        return (
            not self.bounded
            and not self._initializer.per_key
            and not any(_is_gpu(device) for device in self._devices)
        )

    def _apply_rule(self, keys: tf.Tensor, rows: tf.Tensor, grads: tf.Tensor, step) -> tf.Tensor:
        """One optimizer step with this variable as the slot state of a parameter
        (training/slots.py; see `_can_apply_rules`): per shard, `DynembTableApplyRule` updates the
        state rows of `keys` (1-D) in place from the parameter rows `rows` and their
        gradients `grads` (`[n, dim]`) by the `FusedStep` `step`.

        Returns:
          The new parameter rows, `[n, dim]` in the order of `keys`.
        """
        with tf.name_scope(f"{self._unique_name}_apply_rule"):
            shards, positions = self._route(keys, rows, grads)
            coefficients = tf.stack(step.coefficients)
            initial = self._initializer.default_row
            new_rows = [
                table._apply_rule(k, r, g, initial, coefficients, step.rule, step.weight_decay)
                for table, (k, r, g) in zip(self._tables, shards)
            ]
            return new_rows[0] if positions is None else tf.dynamic_stitch(positions, new_rows)

    def remove_everywhere(self, keys: TensorLike) -> List[Any]:
        """Removes `keys` from the variable and from every optimizer slot of it (what a
        restriction or an eviction must do). Returns the remove operations (empty
        when executing eagerly)."""
        keys = self._flat_keys(keys)
        ops = [self.remove(keys)] + [state.remove(keys) for state in self._slots.states]
        return [op for op in ops if op is not None]

    def companion(
        self,
        suffix: str,
        value_dtype: DTypeLike,
        dim: int,
        initializer: Any,
        kv_creator: Optional[HashTableCreator] = None,
        checkpoint_scores: bool = True,
    ) -> "TrainingState":
        """A non-trainable variable keyed and sharded like this one (same key dtype,
        devices, partitioner and checkpointing), named `<name>/<suffix>`: what optimizer
        slots and policy state are made of, so that a key's companion rows live on the
        key's shard. `checkpoint_scores=False`: its checkpoints leave the scores out
        (a restore gives the keys fresh ones). Companions are training state, not what
        a serving delta carries: their tables track no changes (8 bytes per key less
        in an unbounded table; `de.DeltaExporter(..., include_slots=True)` writes
        them whole)."""
        kv_creator = copy.copy(kv_creator) if kv_creator is not None else HashTableCreator()
        kv_creator.track_changes = False
        companion = type(self)(
            key_dtype=self._key_dtype,
            value_dtype=value_dtype,
            dim=dim,
            devices=self._devices,
            partitioner=self._partition_fn,
            name=f"{self.name}/{suffix}",
            initializer=initializer,
            trainable=False,
            checkpoint=self._checkpoint,
            kv_creator=kv_creator,
        )
        companion._checkpoint_scores = bool(checkpoint_scores)
        # A model-parallel variable's companions hold the same slice: a key's slots
        # live with its row on its owner.
        companion._distribution.group = self.worker_group
        return companion

    @property
    def slot_variables(self) -> List[Any]:
        """The slots (`SlotView`s, e.g. Adam's `m` and `v`) every
        `de.DynamicEmbeddingOptimizer` keeps for this variable."""
        return list(self._slots.views)

    def _register_slots(self, state: "TrainingState", views: Sequence[Any]) -> None:
        """Records an optimizer's slot state of this variable and its slot views."""
        self._slots.states.append(state)
        self._slots.views.extend(views)
        # Slots are training state: an export for serving that reaches their shard
        # tables (Keras 3's `model.export` collects every table under the model, the
        # optimizer's included) must not pull in their content. Checkpoints and
        # `tf.saved_model.save` of an object that holds the optimizer still save them.
        for table in state._tables:
            table._set_owner(None)

    # -- training ------------------------------------------------------------------------

    def _trainable_rows(self, name: str, ids: Optional[tf.Tensor] = None) -> TrainableRows:
        """The trainable view called `name`, created on first use (in a TF1 graph with
        the lookup's `ids`). In a TF1 graph every lookup gets its own view (named
        uniquely in the graph), as its ops do."""
        if in_tf1_graph():
            base, i = name, 1
            while name in self._trainables:
                name, i = f"{base}_{i}", i + 1
        # Under a tf.distribute strategy, every replica has its own view.
        return self._view_of_replica(name, replica_key(), ids)

    def _view_of_replica(self, name: str, replica: Optional[int], ids=None) -> TrainableRows:
        key = _view_key(name, replica)
        rows = self._trainables.get(key)
        if rows is None:
            # A model-parallel variable's view holds the rows this worker owns.
            view_class = TrainableRows if self.worker_group is None else ModelParallelRows
            rows = view_class(self, name, replica=replica, ids=ids)
            self._trainables[key] = rows
        return rows

    def _make_views(self, name: str) -> None:
        """Makes the views called `name` that this function's traces may train through:
        the current replica's and, under a strategy whose replicas are this process's
        devices (MirroredStrategy), every replica's.

        A `tf.function` creates variables in its first trace only, and the first trace
        of a function that trains later may only read (Keras 3's symbolic build of a
        model whose `call` is a `tf.function`; an inference call first): each trace of
        a trainable lookup makes the views, so that the first one does."""
        self._trainable_rows(name)
        if not tf.distribute.has_strategy():
            return
        strategy = tf.distribute.get_strategy()
        if len(strategy.extended.worker_devices) != strategy.num_replicas_in_sync:
            return  # replicas in other processes (MultiWorkerMirrored, PS): not ours
        for replica in range(strategy.num_replicas_in_sync):
            self._view_of_replica(name, replica)

    def _adopt_view(self, rows: TrainableRows) -> None:
        """Makes `rows`, a view made outside `_trainable_rows` (a
        `de.shadow_ops.ShadowVariable`'s), the view called `rows.name`: lookups of that
        name read through it and `get_trainable_by_name` returns its variable. It
        replaces an earlier view of that name, as TFRA's trainable store does."""
        self._trainables[_view_key(rows.name, rows.replica)] = rows

    def get_trainable_by_name(self, name: str):
        """The trainable view (a `tf.Variable`) that lookups called `name` read through,
        or None if no such lookup ran yet. Pass it to an optimizer's `var_list` or to a
        tape. In a TF1 graph every lookup has its own view: the first one called `name`
        is `name`, later ones `name_1`, `name_2`, ..."""
        rows = self._trainables.get(_view_key(name, replica_key()))
        return None if rows is None else rows.variable

    def get_eager_trainable_by_name(self, name: str):
        """The trainable view that eager lookups (and lookups in `tf.function`s) called
        `name` read through, created if needed, so that it can be listed in `var_list`
        before the first lookup runs (seed 004's pattern).

        Raises:
          RuntimeError: not executing eagerly.
        """
        if not tf.executing_eagerly():
            raise RuntimeError(
                "get_eager_trainable_by_name() needs eager execution; in a TF1 graph use "
                "embedding_lookup(..., return_trainable=True) or get_trainable_by_name()."
            )
        return self._trainable_rows(name).variable

    @property
    def trainable_store(self) -> Dict[str, Any]:
        """The trainable views by name (`{name: tf.Variable}`)."""
        return {name: rows.variable for name, rows in self._trainables.items()}

    def get_slot_variables(self, optimizer) -> List[Any]:
        """The optimizer slots (`SlotView`s of this variable's dim, e.g. Adam's `m` and
        `v`; see `tensorflow_dynemb.training.slots`) that the `de.DynamicEmbeddingOptimizer`
        `optimizer` keeps for this variable; empty for any other optimizer or before the
        first training step."""
        applier = getattr(optimizer, "_dynemb", None)
        if applier is None:
            return []
        return list(applier.slot_store.slots_of(self).values())

def _view_key(name: str, replica: Optional[int]) -> str:
    """The key of a trainable view: its lookup name, and its replica under a strategy."""
    return name if replica is None else f"{name}@replica{replica}"

