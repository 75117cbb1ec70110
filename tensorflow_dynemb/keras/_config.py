"""JSON-friendly configs of the layers' arguments, for `get_config` / `from_config`.

Keras writes a layer's config to JSON (`model.save`) and rebuilds the layer from it
(`keras.models.load_model`), so every argument must become plain data and come back:

- initializers: Keras' own serialization; a random initializer without a seed is
  saved with the seed its variable drew, so a rebuilt layer gives every unseen id the
  same row as the original;
- functions (`partitioner`, `slot_map_fn`, `gen_scores_fn`): Keras' serialization of
  functions, so they must be registered (`register_keras_serializable`) or passed as
  `custom_objects`, as for any Keras function argument; the default partitioner is
  saved as None;
- `kv_creator`, `restrict_policy`, `admit_policy`: their class name and arguments.
"""

from __future__ import annotations

import functools
from typing import Any, Dict, Optional

import numpy as np
import tensorflow as tf

from tensorflow_dynemb import policies
from tensorflow_dynemb.keras._compat import keras_module
from tensorflow_dynemb.variable.sharding import HashTableCreator, HkvHashTableCreator, default_partition_fn
from tensorflow_dynemb.tables import HkvHashTableConfig

__all__ = [
    "initializer_to_config",
    "initializer_from_config",
    "function_to_config",
    "function_from_config",
    "kv_creator_to_config",
    "kv_creator_from_config",
    "restrict_policy_to_config",
    "restrict_policy_from_config",
    "admit_policy_to_config",
    "admit_policy_from_config",
    "partitioner_to_config",
]

_saving = keras_module.saving


# -- initializers -------------------------------------------------------------------------


def initializer_to_config(initializer: Any, row_initializer: Any) -> Any:
    """`initializer` (as given to the layer) as plain data. `row_initializer` is the
    variable's resolved initializer, whose `seed` pins an unseeded random one."""
    if isinstance(initializer, (int, float, bool)) or initializer is None:
        return initializer
    if isinstance(initializer, (list, tuple, np.ndarray, np.generic)) or tf.is_tensor(initializer):
        return np.asarray(initializer).tolist()
    if isinstance(initializer, keras_module.initializers.Initializer):
        config = keras_module.initializers.serialize(initializer)
        inner = config.get("config", {})
        if "seed" in inner and inner["seed"] is None and hasattr(row_initializer, "seed"):
            inner["seed"] = int(row_initializer.seed)
        return config
    return _saving.serialize_keras_object(initializer)


def initializer_from_config(config: Any) -> Any:
    """The initializer `initializer_to_config` described."""
    if isinstance(config, dict):
        return _saving.deserialize_keras_object(config)
    return config


# -- functions ----------------------------------------------------------------------------


def function_to_config(fn: Any, default: Any = None) -> Any:
    """A function as Keras serializes it; None for None or `default`."""
    if fn is None or fn is default:
        return None
    return _saving.serialize_keras_object(fn)


def function_from_config(config: Any, arg: str) -> Any:
    """The function `function_to_config` described (None stays None)."""
    if config is None:
        return None
    fn = _saving.deserialize_keras_object(config)
    if not callable(fn):
        raise ValueError(
            f"Could not rebuild `{arg}` from its config {config!r}: register the function "
            "with `tf.keras.saving.register_keras_serializable()` or pass it in "
            "`custom_objects`."
        )
    return fn


# -- kv_creator ---------------------------------------------------------------------------


def kv_creator_to_config(kv_creator: Any) -> Optional[Dict[str, Any]]:
    """None for the default unbounded tables; the creator's class and arguments
    otherwise (`track_changes` only where it is off, so older configs read alike)."""
    if kv_creator is None:
        return None
    track = {} if getattr(kv_creator, "track_changes", True) else {"track_changes": False}
    if type(kv_creator) is HashTableCreator:
        return {"class_name": "HashTableCreator", "config": track} if track else None
    if not isinstance(kv_creator, HkvHashTableCreator):
        raise ValueError(
            f"`kv_creator` {kv_creator!r} cannot be saved in a layer config; only "
            "de.HashTableCreator and de.HkvHashTableCreator can."
        )
    c = kv_creator.config
    return {
        "class_name": "HkvHashTableCreator",
        "config": {
            "init_capacity": c.init_capacity,
            "max_capacity": c.max_capacity,
            "max_hbm_for_values": c.max_hbm_for_values,
            "evict_strategy": c.evict_strategy.name,
            "step_per_epoch": c.step_per_epoch,
            "gen_scores_fn": function_to_config(c.gen_scores_fn),
        },
        **track,
    }


def kv_creator_from_config(config: Optional[Dict[str, Any]]) -> Any:
    if config is None:
        return None
    track_changes = config.get("track_changes", True)
    if config["class_name"] == "HashTableCreator":
        return HashTableCreator(track_changes=config["config"].get("track_changes", True))
    fields = dict(config["config"])
    fields["gen_scores_fn"] = function_from_config(fields.get("gen_scores_fn"), "gen_scores_fn")
    return HkvHashTableCreator(HkvHashTableConfig(**fields), track_changes=track_changes)


# -- policies -----------------------------------------------------------------------------


def restrict_policy_to_config(policy: Any) -> Optional[Dict[str, Any]]:
    """A restrict policy class of `de` (or a `functools.partial` of one fixing its
    keyword arguments) as `{"class_name", "config"}`; another class by its Keras
    registered name."""
    if policy is None:
        return None
    cls, kwargs = policy, {}
    if isinstance(policy, functools.partial):
        cls, kwargs = policy.func, dict(policy.keywords)
    if getattr(policies, getattr(cls, "__name__", ""), None) is cls:
        return {"class_name": cls.__name__, "config": kwargs}
    return {"registered_name": _saving.get_registered_name(cls), "config": kwargs}


def restrict_policy_from_config(config: Optional[Dict[str, Any]]) -> Any:
    if config is None:
        return None
    if "class_name" in config:
        cls = getattr(policies, config["class_name"])
    else:
        cls = _saving.get_registered_object(config["registered_name"])
        if cls is None:
            raise ValueError(
                f"Unknown restrict_policy {config['registered_name']!r}: register the class "
                "with `tf.keras.saving.register_keras_serializable()` or pass it in "
                "`custom_objects`."
            )
    return functools.partial(cls, **config["config"]) if config["config"] else cls


def admit_policy_to_config(policy: Any) -> Optional[Dict[str, Any]]:
    if policy is None:
        return None
    if not isinstance(policy, policies.FrequencyAdmitPolicy):
        raise ValueError(
            f"`admit_policy` {policy!r} cannot be saved in a layer config; only "
            "de.FrequencyAdmitPolicy can."
        )
    return {"min_count": policy.min_count, "max_tracked": policy.max_tracked}


def admit_policy_from_config(config: Optional[Dict[str, Any]]) -> Any:
    return None if config is None else policies.FrequencyAdmitPolicy(**config)


def partitioner_to_config(partitioner: Any) -> Any:
    return function_to_config(partitioner, default=default_partition_fn)
