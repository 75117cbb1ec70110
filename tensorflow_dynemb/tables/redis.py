"""`RedisTable`: a table kept in a Redis server or cluster, in TFRA's key layout, with
TFRA's `RedisTableConfig` and `RedisTableCreator` (docs/tables.md, "Redis").

The rows live in Redis, not in the process: a table can outgrow a parameter server's
memory, outlive the training job, and be shared with other jobs and online services.
Every method of `HashTable` works (the table ops of cc/ops/table_ops.cc serve it); only
its creation op differs (`DynembRedisTable`, cc/ops/redis/redis_ops.cc, whose kernel
reads TFRA's JSON config file and connects: cc/core/redis/redis_table.h).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, Optional

import tensorflow as tf

from tensorflow_dynemb import _ops
from tensorflow_dynemb.tables.base import _DynembTable
from tensorflow_dynemb._convert import DTypeLike, TensorLike
from tensorflow_dynemb.persistence.checkpoint import in_tf1_graph

__all__ = ["RedisTable", "RedisTableConfig", "RedisTableCreator", "redis_available"]

_ENV_DEFAULT = "TFRA_REDIS_CONFIG_PATH"

_NOT_BUILT = (
    "de.RedisTable needs the op library built with hiredis, and this build has no Redis "
    "support (hiredis was not found when it was built). Enable it: install hiredis "
    "(`apt-get install libhiredis-dev`), then rebuild the op library "
    "(`python setup.py build_ext --inplace` in the source checkout, or reinstall the "
    "package from source)."
)


def redis_available() -> bool:
    """Whether the op library was built with the Redis table (hiredis found at build time)."""
    return hasattr(_ops.ops, "dynemb_redis_table")


class RedisTableConfig:
    """Where a `RedisTable` finds its JSON config file (TFRA's `RedisTableConfig`).

    The file holds the connection and layout fields of TFRA's config (docs/tables.md,
    "Redis": `redis_connection_mode`, `redis_host_ip`, `redis_host_port`,
    `redis_password`, `storage_slice`, `model_tag_runtime`, ...). It is looked up as
    TFRA does, first match wins:

    1. the file named by the environment variable `redis_config_abs_dir_env`, when that
       is given (the variable must then be set and the file exist);
    2. the file named by `TFRA_REDIS_CONFIG_PATH`, when that variable is set;
    3. `redis_config_abs_dir`.

    Args:
      redis_config_abs_dir: the path of the config file.
      redis_config_abs_dir_env: the name of an environment variable holding that path
        (so that training and serving can point one graph at different servers).
    """

    def __init__(self, redis_config_abs_dir: Optional[str] = None,
                 redis_config_abs_dir_env: Optional[str] = None):
        self.redis_config_abs_dir = redis_config_abs_dir
        self.redis_config_abs_dir_env = redis_config_abs_dir_env

    def resolve(self) -> str:
        """The config file's path (see the class docstring).

        Raises:
          ValueError: the environment variable named by `redis_config_abs_dir_env` is not
            set, or the file a step names does not exist, or no step names a file.
        """
        env = self.redis_config_abs_dir_env
        if env:
            if env not in os.environ:
                raise ValueError(
                    f"RedisTableConfig.redis_config_abs_dir_env is {env!r}, but the environment "
                    f"variable {env} is not set: set it to the config file's path."
                )
            path, source = os.environ[env], f"the environment variable {env}"
        elif _ENV_DEFAULT in os.environ:
            path, source = os.environ[_ENV_DEFAULT], f"the environment variable {_ENV_DEFAULT}"
        elif self.redis_config_abs_dir:
            path, source = self.redis_config_abs_dir, "RedisTableConfig.redis_config_abs_dir"
        else:
            raise ValueError(
                "RedisTableConfig names no config file: give redis_config_abs_dir (a path) or "
                f"redis_config_abs_dir_env (an environment variable holding one), or set "
                f"{_ENV_DEFAULT}."
            )
        if not os.path.isfile(path):
            raise ValueError(f"the Redis config file {path!r} (from {source}) does not exist.")
        return path

    def __repr__(self) -> str:
        return (f"RedisTableConfig(redis_config_abs_dir={self.redis_config_abs_dir!r}, "
                f"redis_config_abs_dir_env={self.redis_config_abs_dir_env!r})")


def _read_config(path: str) -> Dict[str, Any]:
    """The config file's JSON object: malformed files fail here, before any op runs (the
    kernel parses the file again where the table is created, and checks every field)."""
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"malformed JSON in the Redis config file {path!r} at line {e.lineno}, column "
            f"{e.colno}: {e.msg}."
        ) from None
    if not isinstance(config, dict):
        raise ValueError(
            f"the Redis config file {path!r} must hold a JSON object, got {type(config).__name__}."
        )
    return config


class RedisTable(_DynembTable):
    """A table whose rows live in Redis (TFRA's `RedisTable`, same key layout).

    Keys are `int32`, `int64` or `string`; values any `HashTable` value dtype (accum:
    not float16/bfloat16). The table is unbounded and keeps no scores (exports carry 0).
    A batch is sent as pipelined commands, one round trip per bucket group, not per key.
    A server that cannot be reached, stops answering or refuses a password fails the op
    with `tf.errors.UnavailableError` (or `InvalidArgumentError` for a refused password)
    within the config's timeouts; a Redis at its `maxmemory` that refuses writes fails
    it with `ResourceExhaustedError`.

    Checkpoints (`checkpoint=True`, off by default as in TFRA) keep the content in the
    TF checkpoint (TFRA's `table_store_mode` 0 and 1); with `"table_store_mode": 2` in
    the config they save and restore nothing: the rows stay in Redis.

    Example (with a Redis server on localhost:6379 and its config file at `path`):

    >>> config = de.RedisTableConfig(redis_config_abs_dir=path)       # doctest: +SKIP
    >>> table = de.RedisTable(tf.int64, tf.float32, [0.0, 0.0], config=config)
    >>> table.insert([1, 2], [[1.0, 1.5], [2.0, 2.5]])
    >>> table.lookup([2, 3]).numpy()
    array([[2. , 2.5],
           [0. , 0. ]], dtype=float32)
    """

    def __init__(
        self,
        key_dtype: DTypeLike,
        value_dtype: DTypeLike,
        default_value: TensorLike,
        name: str = "RedisTable",
        checkpoint: bool = False,
        config: Optional[RedisTableConfig] = None,
        device: str = "",
        shard_saveable_object_fn: Any = None,
        shared_name: Optional[str] = None,
    ):
        """Connects to the Redis of `config` and opens the table named `name`.

        Args:
          key_dtype: `tf.int32`, `tf.int64` or `tf.string`.
          value_dtype: the value dtype.
          default_value: what missing keys read: a scalar or a `[dim]` vector.
          name: the table's name; its buckets in Redis are named after the part before
            the first `"_mht_"` (a de.Variable's shards share their variable's name).
          checkpoint: whether checkpoints save and restore the content.
          config: a `de.RedisTableConfig` (default: `RedisTableConfig()`, which reads
            `TFRA_REDIS_CONFIG_PATH`).
          device: where to place the table's ops (a CPU).
          shard_saveable_object_fn: accepted for TFRA compatibility and unused.
          shared_name: share the table by this name within the process.

        Raises:
          NotImplementedError: the op library was built without hiredis.
          TypeError: `config` is not a `RedisTableConfig`.
          ValueError: no config file, a missing file, malformed JSON.
          tf.errors.UnavailableError: (eager) the server cannot be reached.
          tf.errors.InvalidArgumentError: (eager) a bad field value, or a refused password.
        """
        del shard_saveable_object_fn
        if not redis_available():
            raise NotImplementedError(_NOT_BUILT)
        config = RedisTableConfig() if config is None else config
        if not isinstance(config, RedisTableConfig):
            raise TypeError(f"`config` must be a de.RedisTableConfig or None, got {config!r}.")
        self._config = config
        path = config.resolve()
        store_mode = _read_config(path).get("table_store_mode", 1)
        self._embedding_name = name.split("_mht_", 1)[0]
        super().__init__(
            key_dtype,
            value_dtype,
            default_value,
            name=name,
            checkpoint=bool(checkpoint) and store_mode != 2,
            device=device,
            shared_name=shared_name,
            table_attrs=dict(
                embedding_name=self._embedding_name,
                redis_config_abs_dir=path,
                redis_config_abs_dir_env=config.redis_config_abs_dir_env or _ENV_DEFAULT,
            ),
        )

    @property
    def config(self) -> RedisTableConfig:
        return self._config

    @property
    def embedding_name(self) -> str:
        """The name the table's Redis buckets carry."""
        return self._embedding_name

    def _create_resource(self) -> tf.Tensor:
        # Shared and anonymous as the base class decides for in-memory tables.
        anonymous = self._anonymous and not in_tf1_graph()
        return _ops.ops.dynemb_redis_table(
            shared_name=self._shared_name or "",
            use_node_name_sharing=(
                not anonymous and not self._shared_name and (self._checkpoint or in_tf1_graph())
            ),
            anonymous=anonymous,
            key_dtype=self._key_dtype,
            value_dtype=self._value_dtype,
            value_shape=self._value_shape,
            name=self._name,
            **self._table_attrs,
        )


class RedisTableCreator:
    """Creates the shards of a `de.Variable` as `RedisTable`s (TFRA's `RedisTableCreator`).

    A variable's tables are named after it, so a Redis-backed variable takes one shard
    (one device; more raise `ValueError`): Redis spreads the rows itself. Its optimizer
    slots and restrict-policy status are Redis tables too.

    Args:
      config: a `de.RedisTableConfig`.
    """

    def __init__(self, config: Optional[RedisTableConfig] = None):
        if config is not None and not isinstance(config, RedisTableConfig):
            raise TypeError(f"`config` must be a de.RedisTableConfig or None, got {config!r}.")
        self.config = config or RedisTableConfig()
        self.saver = None
        self.track_changes = False

    @property
    def keeps_content_in_checkpoints(self) -> bool:
        """False where the config says `"table_store_mode": 2`: the variable's
        checkpoints then save and restore none of its rows (they stay in Redis)."""
        return _read_config(self.config.resolve()).get("table_store_mode", 1) != 2

    def create(self, key_dtype, value_dtype, default_value, name, init_size, device,
               shared_name) -> RedisTable:
        """One shard table.

        Raises:
          ValueError: the variable has more than one shard (its shards would share its
            buckets: every key would count, export and checkpoint once per shard).
        """
        del init_size  # Redis sizes itself
        match = re.search(r"_mht_\d+of(\d+)$", name)
        if match and int(match.group(1)) > 1:
            raise ValueError(
                f"a Redis-backed de.Variable takes one shard, got {match.group(1)} for table "
                f"{name!r}: its shards would share the variable's Redis buckets (TFRA's layout "
                "names them after the variable), so give it one device. Redis spreads the "
                "rows itself (a cluster, storage_slice)."
            )
        return RedisTable(
            key_dtype,
            value_dtype,
            default_value,
            name=name,
            checkpoint=False,  # the variable checkpoints its content
            config=self.config,
            device=device,
            shared_name=shared_name,
        )
