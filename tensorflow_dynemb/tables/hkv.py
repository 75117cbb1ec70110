"""`HkvHashTable`: the bounded table with cache semantics, its `HkvHashTableConfig` and
`HkvEvictStrategy`."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf

from tensorflow_dynemb.tables.base import _DynembTable
from tensorflow_dynemb._convert import DTypeLike, TensorLike, check_int, convert_scores

__all__ = ["HkvHashTable", "HkvHashTableConfig", "HkvEvictStrategy"]

KHkvHashTableInitCapacity = 1024 * 1024
KHkvHashTableMaxCapacity = 1024 * 1024
KHkvHashTableMaxHbmForValuesByBytes = 1024 * 1024 * 1024


class HkvEvictStrategy(enum.IntEnum):
    """How an `HkvHashTable` scores keys; the lowest score is evicted first.

    LRU: a logical clock advanced by each insert or lookup batch that touches the key.
    LFU: how often the key was inserted or accumulated.
    EPOCHLRU / EPOCHLFU: the epoch (advanced every `step_per_epoch` insert calls) in the
    high 32 bits, LRU / LFU in the low bits.
    CUSTOMIZED: given by the caller: `insert` needs `scores=` or the config's
    `gen_scores_fn(keys)` (else `ValueError`). `accum` takes no scores: a key it
    inserts gets 0, a key it updates keeps its score.
    """

    LRU = 0
    LFU = 1
    EPOCHLRU = 2
    EPOCHLFU = 3
    CUSTOMIZED = 4

    @property
    def op_value(self) -> str:
        """The `evict_strategy` attribute of the `DynembHashTable` op."""
        return {0: "lru", 1: "lfu", 2: "epoch_lru", 3: "epoch_lfu", 4: "customized"}[
            int(self)
        ]

    @classmethod
    def coerce(cls, value: Any, arg: str = "evict_strategy") -> "HkvEvictStrategy":
        """An `HkvEvictStrategy` from a member, its int value or its name (any case,
        with or without underscores: "epoch_lru", "EPOCHLRU")."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            key = value.replace("_", "").upper()
            if key in cls.__members__:
                return cls[key]
        elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            if int(value) in {int(m) for m in cls}:
                return cls(int(value))
        raise ValueError(
            f"`{arg}` must be one of de.HkvEvictStrategy.{{{', '.join(cls.__members__)}}}, "
            f"got {value!r}."
        )


@dataclasses.dataclass
class HkvHashTableConfig:
    """Configuration of an `HkvHashTable` (its values override the table's arguments).

    Attributes:
      init_capacity: keys to reserve room for up front (>= 1; more than max_capacity
        means max_capacity, as in TFRA).
      max_capacity: the most keys the table holds.
      max_hbm_for_values: device-memory budget for values on GPU, in bytes; ignored on
        CPU.
      evict_strategy: an `HkvEvictStrategy`.
      step_per_epoch: insert calls per epoch for the EPOCH* strategies (0: never
        advance).
      gen_scores_fn: for CUSTOMIZED, `fn(keys) -> int64 scores of keys.shape`, called by
        `insert` when it gets no `scores`.
      reserved_key_start_bit: accepted for TFRA compatibility and ignored: no key value
        is reserved in this implementation.
    """

    init_capacity: int = KHkvHashTableInitCapacity
    max_capacity: int = KHkvHashTableMaxCapacity
    max_hbm_for_values: int = KHkvHashTableMaxHbmForValuesByBytes
    evict_strategy: HkvEvictStrategy = HkvEvictStrategy.LRU
    step_per_epoch: int = 0
    gen_scores_fn: Optional[Callable[[tf.Tensor], TensorLike]] = None
    reserved_key_start_bit: int = 0

    def __post_init__(self):
        self.init_capacity = check_int(
            self.init_capacity, "HkvHashTableConfig.init_capacity", 1
        )
        self.max_capacity = check_int(self.max_capacity, "HkvHashTableConfig.max_capacity", 1)
        # As TFRA does (its tables take min(init_capacity, max_capacity)): a config of a
        # small max_capacity leaves init_capacity at its default, 1,048,576.
        self.init_capacity = min(self.init_capacity, self.max_capacity)
        self.max_hbm_for_values = check_int(
            self.max_hbm_for_values, "HkvHashTableConfig.max_hbm_for_values", 0
        )
        self.step_per_epoch = check_int(
            self.step_per_epoch, "HkvHashTableConfig.step_per_epoch", 0
        )
        self.evict_strategy = HkvEvictStrategy.coerce(
            self.evict_strategy, "HkvHashTableConfig.evict_strategy"
        )
        if self.gen_scores_fn is not None and not callable(self.gen_scores_fn):
            raise TypeError(
                "`HkvHashTableConfig.gen_scores_fn` must be callable or None, "
                f"got {self.gen_scores_fn!r}."
            )


class HkvHashTable(_DynembTable):
    """A bounded hash table with cache semantics (HierarchicalKV's API, on CPU too).

    It holds at most `max_capacity` keys. Below that, nothing is evicted; when full,
    each new key (from `insert`, `insert_and_evict`, `accum`, `accum_and_evict` or
    `import_`) evicts the entry with the lowest score in the table, scored by
    `config.evict_strategy` (see `HkvEvictStrategy`; among equal scores, the entry
    written longest ago), or is itself not inserted if its own score is lower still.
    `insert_and_evict` and `accum_and_evict` return what was evicted. Every entry
    carries an int64 score, which `export_with_scores`, `import_` and checkpoints
    carry along, so a restored table goes on evicting as the saved one would have.
    Otherwise it behaves exactly like `HashTable`.

    Example:

    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> config = de.HkvHashTableConfig(
    ...     init_capacity=1024, max_capacity=4096,
    ...     evict_strategy=de.HkvEvictStrategy.CUSTOMIZED)
    >>> table = de.HkvHashTable(tf.int64, tf.float32, default_value=-1.0, config=config)
    >>> table.insert([7, 8], [0.5, 0.25], scores=[100, 200])
    >>> table.lookup([8, 9]).numpy()
    array([ 0.25, -1.  ], dtype=float32)
    >>> sorted(table.export_with_scores()[2].numpy().tolist())
    [100, 200]
    """

    def __init__(
        self,
        key_dtype: DTypeLike,
        value_dtype: DTypeLike,
        default_value: TensorLike,
        name: str = "HkvHashTable",
        checkpoint: bool = True,
        init_capacity: int = KHkvHashTableInitCapacity,
        max_capacity: int = KHkvHashTableMaxCapacity,
        max_hbm_for_values: int = KHkvHashTableMaxHbmForValuesByBytes,
        config: Optional[HkvHashTableConfig] = None,
        device: str = "",
        shared_name: Optional[str] = None,
        evict_strategy: Any = HkvEvictStrategy.LRU,
        step_per_epoch: int = 0,
        gen_scores_fn: Optional[Callable[[tf.Tensor], TensorLike]] = None,
        track_changes: bool = True,
    ):
        """Creates an empty table.

        Args:
          key_dtype: the key dtype: `tf.int32`, `tf.int64` or `tf.string`.
          value_dtype: the value dtype.
          default_value: what missing keys read: a scalar or a `[dim]` vector.
          name: a name for the table (and its ops).
          checkpoint: whether checkpoints save and restore the content (with scores).
          init_capacity: keys to reserve room for up front (>= 1; more than
            max_capacity means max_capacity, as in TFRA).
          max_capacity: the most keys the table holds.
          max_hbm_for_values: device-memory budget for values on GPU, in bytes (the
            rows beyond it live in pinned host memory the GPU reads over the bus);
            ignored on CPU.
          config: an `HkvHashTableConfig`; when given, its fields override
            `init_capacity`, `max_capacity`, `max_hbm_for_values`, `evict_strategy`,
            `step_per_epoch` and `gen_scores_fn` (as in TFRA).
          device: where to place the table and its ops (default: TF's placer); see
            `HashTable`.
          shared_name: share the table by this name (default: not shared). Dtypes,
            value shape, `max_capacity`, `evict_strategy` and `step_per_epoch` must
            match the existing table's (`init_capacity` may differ), or the op raises
            `InvalidArgumentError`.
          evict_strategy: used when no `config` is given.
          step_per_epoch: used when no `config` is given.
          gen_scores_fn: used when no `config` is given.
          track_changes: keep the keys removed or evicted, so that a
            `de.DeltaExporter` writes only what changed (docs/online_learning.md;
            the rows' write stamps cost a bounded table nothing: they are its
            eviction ages).

        Raises:
          TypeError: an unsupported dtype, or a non-integer capacity.
          ValueError: a capacity < 1, an unknown
            eviction strategy, or a bad `default_value`.
        """
        if config is not None:
            if not isinstance(config, HkvHashTableConfig):
                raise TypeError(
                    f"`config` must be a de.HkvHashTableConfig or None, got {config!r}."
                )
            init_capacity = config.init_capacity
            max_capacity = config.max_capacity
            max_hbm_for_values = config.max_hbm_for_values
            evict_strategy = config.evict_strategy
            step_per_epoch = config.step_per_epoch
            gen_scores_fn = config.gen_scores_fn
        init_capacity = check_int(init_capacity, "init_capacity", 1)
        max_capacity = check_int(max_capacity, "max_capacity", 1)
        # As TFRA does: HkvHashTable(max_capacity=99_999) keeps the default init_capacity.
        init_capacity = min(init_capacity, max_capacity)
        self._max_hbm_for_values = check_int(max_hbm_for_values, "max_hbm_for_values", 0)
        strategy = HkvEvictStrategy.coerce(evict_strategy)
        step_per_epoch = check_int(step_per_epoch, "step_per_epoch", 0)
        if gen_scores_fn is not None and not callable(gen_scores_fn):
            raise TypeError(f"`gen_scores_fn` must be callable or None, got {gen_scores_fn!r}.")
        self._evict_strategy = strategy
        self._gen_scores_fn = gen_scores_fn
        self._init_capacity = init_capacity
        self._max_capacity = max_capacity
        self._step_per_epoch = step_per_epoch
        super().__init__(
            key_dtype,
            value_dtype,
            default_value,
            name=name,
            checkpoint=checkpoint,
            device=device,
            shared_name=shared_name,
            table_attrs=dict(
                init_capacity=init_capacity,
                max_capacity=max_capacity,
                evict_strategy=strategy.op_value,
                step_per_epoch=step_per_epoch,
                find_updates_scores=strategy
                in (HkvEvictStrategy.LRU, HkvEvictStrategy.EPOCHLRU),
                max_hbm_for_values=self._max_hbm_for_values,
                track_changes=bool(track_changes),
            ),
        )

    @property
    def evict_strategy(self) -> HkvEvictStrategy:
        return self._evict_strategy

    @property
    def init_capacity(self) -> int:
        return self._init_capacity

    @property
    def max_capacity(self) -> int:
        return self._max_capacity

    @property
    def max_hbm_for_values(self) -> int:
        return self._max_hbm_for_values

    def _default_scores(self, keys: tf.Tensor) -> Optional[tf.Tensor]:
        if self._evict_strategy != HkvEvictStrategy.CUSTOMIZED:
            return None
        if self._gen_scores_fn is None:
            # Without scores every new key would get 0: the lowest, first to go.
            raise ValueError(
                f"HkvHashTable {self._name!r} uses evict_strategy CUSTOMIZED, which needs "
                "scores= or gen_scores_fn: insert got scores=None and the table has no "
                "gen_scores_fn."
            )
        return convert_scores(self._gen_scores_fn(keys), "scores returned by gen_scores_fn")
