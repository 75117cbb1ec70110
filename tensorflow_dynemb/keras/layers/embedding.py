"""Keras embedding layers over a `de.Variable`: TFRA's `de.keras.layers`.

- `Embedding` (alias `BasicEmbedding`): the rows of any tensor of ids,
  `ids.shape + [embedding_size]`, as `tf.keras.layers.Embedding` without a vocabulary;
- `SquashedEmbedding`: those rows reduced by `combiner` to one row per example;
- `FieldWiseEmbedding`: the rows of each example reduced per field (`slot_map_fn`
  maps an id to its field), `[batch, nslots, embedding_size]`.
The last two are in reduced.py.

Each layer owns one `de.Variable` (`layer.params`, named `<layer name>-parameter`) and
works with Keras 3 and with tf_keras (whichever `tf.keras` is, see keras/_compat.py).

Training. A call with `training=False` (Keras' `evaluate` and `predict`) reads the
table directly. Any other call looks ids up like `de.embedding_lookup`: through the
variable's trainable view (see variable/trainable.py) when a gradient may be taken (inside a
`tf.function`, or eagerly under a `tf.GradientTape`), directly otherwise. The view has
no fixed shape (`[None, dim]`), so the layer lists it among its (trainable) weights
only where a step can use it: in the graph that looked it up or that reads it through
a function it calls (a `call` decorated with `@tf.function`, a nested helper), or
eagerly until the optimizer has consumed the looked-up rows (also rows a traced
function looked up under a tape). That is where `Model.train_step` and custom loops
read `model.trainable_variables`, after the forward pass; elsewhere (building an
optimizer, `model.summary()`, saving) the layer has no Keras weights. docs/keras.md
("Where training works") lists the contexts, tested in tests/test_training_contexts.py.

Plain optimizers. `de.DynamicEmbeddingOptimizer` is what updates the table. A model
compiled with a plain Keras optimizer (`compile(optimizer="adam")`) is switched to the
wrapped equivalent by the layer itself: a training lookup finds the calling model
(through Keras' call context) and, if its `optimizer` is a plain Keras optimizer,
replaces it by `de.DynamicEmbeddingOptimizer(optimizer)`, which keeps training the dense
variables with the same optimizer object. This happens in the forward pass of the first
training step, before `train_step` applies the gradients. Keras may build the plain
optimizer before that (Keras 3's `fit`, `load_model`): it then sees only the dense
variables, since the view is not listed outside a step.

Saving. `save_own_variables` / `load_own_variables` write the table (and the state
tables of the variable's restrict / admit policies) into Keras weight files
(`model.save`, `save_weights`); `tf.train.Checkpoint` saves them through the variable
itself.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, List, Optional

import numpy as np
import tensorflow as tf

from tensorflow_dynemb import _export_context
from tensorflow_dynemb.keras import _config, _saving
from tensorflow_dynemb.keras.layers.views import ListedViews
from tensorflow_dynemb.keras._compat import (
    IS_KERAS3,
    CallerTracking,
    Layer,
    Untracked,
    ViewWeights,
    computing_output_spec,
    in_stateless_build,
    keras_module,
    leave_symbolic_build,
)
from tensorflow_dynemb.persistence.checkpoint import writing_saved_model
from tensorflow_dynemb.variable.lookup import embedding_lookup, embedding_lookup_unique
from tensorflow_dynemb.variable.sharding import default_partition_fn
from tensorflow_dynemb.variable.step_record import called_by_a_function
from tensorflow_dynemb.variable.trainable import tape_may_record
from tensorflow_dynemb.variable.variable import Variable

# Register the optimizer wrapper of this Keras, so that `load_model` finds it.
if IS_KERAS3:
    import tensorflow_dynemb.training.keras_optimizer  # noqa: F401
else:
    import tensorflow_dynemb.training.tf_keras_optimizer  # noqa: F401

__all__ = ["Embedding", "BasicEmbedding"]

_register = keras_module.saving.register_keras_serializable(package="tensorflow_dynemb")


@_register
class Embedding(ListedViews, ViewWeights, CallerTracking, Layer):
    """The embedding rows of ids of any shape, from a dynamic table (no vocabulary).

    Like `tf.keras.layers.Embedding`, but the table is a `de.Variable`: any id of
    `key_dtype` has a row, ids never collide, and the table grows with the ids that
    training sees. Output: `ids.shape + [embedding_size]`.

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> ids = tf.keras.Input(shape=(2,), dtype="int64")
    >>> x = de.keras.layers.Embedding(4, initializer=0.5, name="user")(ids)
    >>> model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(tf.keras.layers.Flatten()(x)))
    >>> model.compile(optimizer="adam", loss="mse")  # trained with the wrapped Adam
    >>> _ = model.fit(tf.constant([[1, 2], [3, 1]], tf.int64), tf.ones([2, 1]), verbose=0)
    >>> int(model.get_layer("user").params.size())  # ids seen: 1, 2, 3
    3
    """

    def __init__(
        self,
        embedding_size: int,
        key_dtype: Any = tf.int64,
        value_dtype: Any = tf.float32,
        combiner: str = "sum",
        initializer: Any = None,
        devices: Optional[List[str]] = None,
        name: Optional[str] = None,
        with_unique: bool = True,
        short_file_name: bool = False,
        *,
        trainable: bool = True,
        bp_v2: bool = False,
        restrict_policy: Any = None,
        admit_policy: Any = None,
        init_capacity: Optional[int] = None,
        init_size: Optional[int] = None,
        partitioner: Optional[Callable] = None,
        kv_creator: Any = None,
        max_norm: Optional[float] = None,
        checkpoint: bool = True,
        keep_distribution: bool = False,
        distribute_strategy: Any = None,
        **kwargs,
    ):
        """Creates the layer and its `de.Variable` (`self.params`).

        Args:
          embedding_size: the row length (>= 1).
          key_dtype: the id dtype: `tf.int64` (default), `tf.int32` or `tf.string`.
          value_dtype: a floating row dtype (default `tf.float32`); also the layer's dtype.
          combiner: how `SquashedEmbedding` / `FieldWiseEmbedding` reduce rows (see
            them); `Embedding` itself returns every row.
          initializer: what ids without a row read: a Keras initializer (or its name),
            a number, or a `[embedding_size]` vector. Default `RandomNormal()` (TFRA's
            default), drawn per id.
          devices: one table shard per device (default: the variable's default).
          name: the layer name (default: from the class, made unique by Keras); the
            variable is `<name>-parameter`.
          with_unique: look each distinct id of a training call up once (default
            True; TFRA's GPU tables needed it, these tables do not).
          short_file_name: accepted for TFRA compatibility; no effect (file names of
            `save_to_file_system` are chosen there).
          trainable: whether training updates the table.
          bp_v2: write training updates back by adding deltas (`accum`).
          restrict_policy: a restrict policy class, e.g. `de.TimestampRestrictPolicy`.
          admit_policy: a `de.FrequencyAdmitPolicy`.
          init_capacity: ids to reserve room for (TFRA's name; `init_size` is accepted
            as a synonym).
          init_size: see `init_capacity`.
          partitioner: `fn(keys, num_shards) -> shard ids` (default
            `de.default_partition_fn`).
          kv_creator: `de.HashTableCreator()` (default) or `de.HkvHashTableCreator(...)`.
          max_norm: clip each looked-up row to this L2 norm.
          checkpoint: whether checkpoints and Keras weight files hold the table.
          keep_distribution: also save `devices` in the layer config (TFRA); otherwise a
            layer rebuilt from its config uses the default devices, and the saved
            table is resharded into them.
          distribute_strategy: not supported; must be None.
          **kwargs: Keras layer arguments.

        Raises:
          TypeError: a non-integer `embedding_size`, or a non-floating `value_dtype`.
          ValueError: `embedding_size` < 1, an unknown `combiner`, or conflicting
            `init_capacity` / `init_size`.
          NotImplementedError: a `distribute_strategy`.
        """
        del short_file_name  # see Args
        try:
            embedding_size = int(embedding_size)
        except (TypeError, ValueError):
            raise TypeError(
                f"`embedding_size` must be convertible to int, got {embedding_size!r}."
            ) from None
        if embedding_size < 1:
            raise ValueError(f"`embedding_size` must be >= 1, got {embedding_size}.")
        value_dtype = tf.as_dtype(value_dtype)
        if not value_dtype.is_floating:
            raise TypeError(
                f"`value_dtype` of an embedding layer must be floating (it is trained), "
                f"got {value_dtype.name}."
            )
        if distribute_strategy is not None:
            raise NotImplementedError(
                "`distribute_strategy` is not supported by de.keras.layers; train one "
                "replica, or shard the table over `devices`."
            )
        if "dtype" in kwargs:
            raise TypeError("Pass the row dtype as `value_dtype`, not `dtype`.")
        self._check_combiner(combiner)
        init_size = _init_size(init_capacity, init_size)
        if initializer is None:
            initializer = keras_module.initializers.RandomNormal()
        elif isinstance(initializer, (str, dict)):
            initializer = keras_module.initializers.get(initializer)

        super().__init__(name=name, trainable=trainable, dtype=value_dtype.name, **kwargs)
        # The table ops cannot be compiled by XLA (Keras 3 `jit_compile="auto"`).
        self.supports_jit = False
        self.embedding_size = embedding_size
        self.combiner = combiner
        self.with_unique = bool(with_unique)
        self.max_norm = max_norm
        self.keep_distribution = bool(keep_distribution)
        # The arguments the variable resolves, kept as given for `get_config`.
        self._initializer_arg = initializer
        self._restrict_policy_arg = restrict_policy
        self._checkpoint_arg = bool(checkpoint)
        self._init_size = init_size
        # The trainable views this layer looked up: per graph (weakly), eagerly, and the
        # latest one traced in any graph, per tf.distribute replica.
        # Whether this layer's latest trace was Keras 3's symbolic build (see
        # `_listed_views`).
        self._step = Untracked(
            graph_views=weakref.WeakKeyDictionary(), eager_views=[], traced_views={},
            latest_trace_symbolic=False,
        )
        self.params = Variable(
            key_dtype=key_dtype,
            value_dtype=value_dtype,
            dim=embedding_size,
            devices=devices,
            partitioner=partitioner or default_partition_fn,
            name=f"{self.name}-parameter",
            initializer=initializer,
            trainable=True,  # `self.trainable` decides, so that it can be toggled
            checkpoint=checkpoint,
            init_size=init_size,
            kv_creator=kv_creator,
            restrict_policy=restrict_policy,
            bp_v2=bp_v2,
            admit_policy=admit_policy,
        )

    @property
    def variable(self) -> Variable:
        """The layer's `de.Variable`; another name for `params`."""
        return self.params

    @staticmethod
    def _check_combiner(combiner: Any) -> None:
        if not isinstance(combiner, str):
            raise ValueError(f"`combiner` must be a string, got {combiner!r}.")

    # -- call -------------------------------------------------------------------------------

    def call(self, ids, training=None):
        return self._rows(ids, training)

    def compute_output_shape(self, input_shape):
        return tuple(tf.TensorShape(input_shape).as_list()) + (self.embedding_size,)

    def compute_output_spec(self, ids, *args, **kwargs):
        # Keras 3 calls this, not `call`, on a symbolic input (the layer defines
        # compute_output_shape): floating ids (a `keras.Input` without dtype) are refused
        # here, where the model is built, not only at `fit`.
        for tensor in tf.nest.flatten(ids):
            _refuse_floating(tensor)
        return super().compute_output_spec(ids, *args, **kwargs)

    def _rows(self, ids, training) -> tf.Tensor:
        """`ids.shape + [embedding_size]` rows; through the trainable view when this
        call may be trained (see the module docstring)."""
        ids = _checked_ids(ids, self.params.key_dtype)
        if tf.inside_function():
            if in_stateless_build() and called_by_a_function() and not tf.distribute.has_strategy():
                # A decorated `call` first traced by Keras 3's symbolic build: that
                # trace is reused for training (see `leave_symbolic_build`). Not under
                # a strategy: there the build traces in the cross-replica context and
                # training in each replica's, so nothing is reused.
                leave_symbolic_build()
            self._step.latest_trace_symbolic = in_stateless_build()
        if tf.inside_function() and self.trainable:
            # Any trace makes the variables a training trace of the same function will
            # use (the views, the optimizer wrapper): a tf.function creates variables in
            # its first trace only, which may read (Keras 3's symbolic build, a
            # SavedModel's trace, a first inference call).
            self.params._make_views(self.name)
            self._wrap_model_optimizer()
        if not self._may_train(training):
            return self._read_rows(ids)
        if _export_context.read_only():
            # A SavedModel serves: its functions (tf_keras traces training=True ones
            # too) read the table and capture no trainable view.
            return self._read_rows(ids)
        lookup = embedding_lookup_unique if self.with_unique else embedding_lookup
        rows, view = lookup(
            self.params, ids, name=self.name, max_norm=self.max_norm, return_trainable=True
        )
        self._note_view(view)
        self._wrap_model_optimizer()
        return rows

    def _may_train(self, training) -> bool:
        if not self.trainable or (isinstance(training, (bool, np.bool_)) and not training):
            return False
        if tf.executing_eagerly():
            return tape_may_record()
        # tf_keras traces `call` once in its "keras_graph" to build a functional model:
        # nothing is trained there.
        return getattr(tf.compat.v1.get_default_graph(), "name", None) != "keras_graph"

    def _read_rows(self, ids) -> tf.Tensor:
        """The rows of `ids` straight from the table: no copy, nothing inserted (the
        tables take repeated ids as they come, so `with_unique` changes nothing here)."""
        rows = self.params.lookup(ids)
        if self.max_norm is not None:
            rows = tf.clip_by_norm(rows, self.max_norm, axes=[-1])
        return rows

    # -- saving ---------------------------------------------------------------------------

    def _saved_variables(self) -> dict:
        """`{store name: de.Variable}`: the table ("table"), and the state tables of its
        policies by their names relative to the table's."""
        saved = {"table": self.params}
        prefix = self.params.name + "/"
        for module in self.params.submodules:
            if isinstance(module, Variable):
                name = module.name[len(prefix):] if module.name.startswith(prefix) else module.name
                saved[_saving.store_name(name)] = module
        return saved

    def save_own_variables(self, store):
        super().save_own_variables(store)
        _saving.save_tables(store, self._saved_variables())

    def load_own_variables(self, store):
        super().load_own_variables(_saving.numbered_entries(store))
        tables = _saving.read_tables(store)
        for name, variable in self._saved_variables().items():
            if name in tables:
                _saving.restore_table(variable, tables[name])

    # -- config ---------------------------------------------------------------------------

    def get_config(self):
        config = super().get_config()
        config.pop("dtype", None)  # `value_dtype` says it
        params = self.params
        config.update(
            {
                "embedding_size": self.embedding_size,
                "key_dtype": params.key_dtype.name,
                "value_dtype": params.value_dtype.name,
                "combiner": self.combiner,
                "initializer": _config.initializer_to_config(
                    self._initializer_arg, params.initializer
                ),
                "devices": params.devices if self.keep_distribution else None,
                "with_unique": self.with_unique,
                "bp_v2": params.bp_v2,
                "restrict_policy": _config.restrict_policy_to_config(self._restrict_policy_arg),
                "admit_policy": _config.admit_policy_to_config(params.admit_policy),
                "init_capacity": self._init_size,
                "partitioner": _config.partitioner_to_config(params.partition_fn),
                "kv_creator": _config.kv_creator_to_config(params.kv_creator),
                "max_norm": self.max_norm,
                "checkpoint": self._checkpoint_arg,
                "keep_distribution": self.keep_distribution,
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        config["initializer"] = _config.initializer_from_config(config.get("initializer"))
        config["partitioner"] = _config.function_from_config(
            config.get("partitioner"), "partitioner"
        )
        config["kv_creator"] = _config.kv_creator_from_config(config.get("kv_creator"))
        config["restrict_policy"] = _config.restrict_policy_from_config(
            config.get("restrict_policy")
        )
        config["admit_policy"] = _config.admit_policy_from_config(config.get("admit_policy"))
        return cls(**config)


# TFRA's other name for the layer.
BasicEmbedding = Embedding


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------


def _init_size(init_capacity: Optional[int], init_size: Optional[int]) -> int:
    if init_capacity is not None and init_size is not None and init_capacity != init_size:
        raise ValueError(
            f"`init_capacity` ({init_capacity}) and its synonym `init_size` ({init_size}) "
            "differ; pass one."
        )
    for value in (init_capacity, init_size):
        if value is not None:
            return value
    return 0

def _checked_ids(ids, key_dtype: tf.dtypes.DType):
    """`ids`, refused when floating: Keras' default input dtype, not ids; the error
    says how to declare them (casting would silently merge ids above 2**24).

    Except while Keras 3 only computes output specs: its symbolic build of a subclassed
    model under a tf.distribute strategy feeds float32 placeholders for integer data
    (the data itself stays integer). Nothing computed there runs, so placeholders of
    the key dtype stand in for them."""
    if _is_floating(ids) and computing_output_spec():
        return tf.zeros_like(ids, dtype=key_dtype)
    if _is_floating(ids) and IS_KERAS3 and writing_saved_model():
        # Keras 3 traces a subclassed model's default serving function (and the float
        # concrete function of a decorated `call`) with float32 inputs while saving,
        # whatever the data: the save goes on, and such a function fails if it is ever
        # called (no lookup of made-up ids).
        refuse = tf.debugging.Assert(tf.constant(False), [
            "Keras' default serving function of this model takes float ids, which an "
            "embedding cannot look up: serve the signature passed to "
            "tf.saved_model.save(signatures=...), or declare integer model inputs"])
        with tf.control_dependencies([refuse]):
            return tf.zeros_like(ids, dtype=key_dtype)
    _refuse_floating(ids)
    return ids


def _is_floating(ids) -> bool:
    dtype = getattr(ids, "dtype", None)
    return dtype is not None and tf.as_dtype(dtype).is_floating


def _refuse_floating(ids) -> None:
    if _is_floating(ids):
        raise TypeError(
            f"Embedding ids must be integers or strings, got {tf.as_dtype(ids.dtype).name}: "
            "declare the model input with its dtype, e.g. "
            "`keras.Input(shape=(n,), dtype=\"int64\")`."
        )
