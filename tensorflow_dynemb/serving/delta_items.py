"""What a `DeltaExporter` writes and a `DeltaUpdater` applies: the tables and dense
variables of a model, and the identities both sides know them by.

- A table item is a `de.Variable` (its shard tables) or a table held on its own. Its
  identity is its name (what a SavedModel keeps of it: `persistence/identity.py`), its
  second identity its object path from the object exported.
- A dense item is a `tf.Variable` (or a Keras variable) of the model that is not one
  of our trainable views. Its identity is its object path (the path checkpoints use,
  which a SavedModel of the same object keeps); for a Keras model, its second
  identity is `variables/<i>`, its index in `model.variables`, which is where a Keras
  `model.export` archive keeps it.

Optimizers are not walked: their slots are training state, not what serving needs
(`include_slots=True` adds the slot tables of every variable found). Identities are
URL-quoted, so a manifest's fields never hold spaces.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
import urllib.parse
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from tensorflow_dynemb.persistence import identity as saved_identity
from tensorflow_dynemb.tables.base import _DynembTable
from tensorflow_dynemb.variable import trainable
from tensorflow_dynemb.variable.sharding import default_partition_fn
from tensorflow_dynemb.variable.variable import Variable

# Dtypes a dense item may have: those a table file holds (cc/core/table.h).
DENSE_DTYPES = (tf.float32, tf.float64, tf.float16, tf.bfloat16, tf.int8, tf.int32, tf.int64,
                tf.bool)


def quote(text: str) -> str:
    return urllib.parse.quote(text, safe="/-_.:")


@dataclasses.dataclass
class TableItem:
    identity: str
    alt: str
    tables: List[Any]
    key_dtype: tf.dtypes.DType
    value_dtype: tf.dtypes.DType
    dim: int
    partitioner: str  # "default" (routed by de.default_partition_fn) or "custom"

    def line(self, replace: bool) -> str:
        """The item's line of a delta manifest (cc/core/delta.h)."""
        return (f"table {self.identity} {self.alt or '-'} {self.key_dtype.name} "
                f"{self.value_dtype.name} {self.dim} {self.partitioner} "
                f"{len(self.tables)} {'replace' if replace else 'delta'}")

    def signature(self) -> str:
        """What must stay the same for a delta to continue a base."""
        return f"table {self.identity} {self.key_dtype.name} {self.value_dtype.name} {self.dim}"


@dataclasses.dataclass
class DenseItem:
    identity: str
    alt: str
    variable: Any  # a tf.Variable

    def line(self) -> str:
        shape = "x".join(str(d) for d in self.variable.shape) or "scalar"
        return f"dense {self.identity} {self.alt or '-'} {self.variable.dtype.name} {shape}"

    def signature(self) -> str:
        return self.line()


def _optimizer_classes() -> Tuple[type, ...]:
    """The optimizer base classes of every Keras loaded in the process, and TF1's."""
    classes = [tf.compat.v1.train.Optimizer]
    for module_name, attr in (("keras", "optimizers"), ("tf_keras", "optimizers")):
        module = sys.modules.get(module_name)
        base = getattr(getattr(module, attr, None), "Optimizer", None)
        if isinstance(base, type):
            classes.append(base)
    legacy = sys.modules.get("tf_keras.src.optimizers.legacy.optimizer_v2")
    if legacy is not None:
        classes.append(legacy.OptimizerV2)
    return tuple(classes)


def _dense_variable(node) -> Optional[Any]:
    """The tf.Variable a node is or holds (Keras 3 variables hold one), or None."""
    if isinstance(node, tf.Variable):
        return node
    value = getattr(node, "value", None) if type(node).__module__.startswith("keras") else None
    return value if isinstance(value, tf.Variable) else None


def _table_item(obj, path: str) -> TableItem:
    if isinstance(obj, Variable):
        routed = obj.shard_num == 1 or obj._partition_fn is default_partition_fn
        return TableItem(quote(obj.name), quote(path), list(obj.tables), obj.key_dtype,
                         obj.value_dtype, obj.dim, "default" if routed else "custom")
    return TableItem(quote(obj.name), quote(path), [obj], obj.key_dtype, obj.value_dtype,
                     obj.dim, "default")


def collect(obj, include_slots: bool = False) -> Tuple[List[TableItem], List[DenseItem]]:
    """The table and dense items of `obj` (a `de.Variable`, a table, a Keras model or
    any trackable holding them), breadth first, each once.

    Raises:
      ValueError: two tables or variables share a name (their identity), or `obj`
        holds none.
    """
    tables: List[TableItem] = []
    dense: List[DenseItem] = []
    optimizers = _optimizer_classes()
    keras_index = {}
    if hasattr(obj, "variables") and type(obj).__module__.startswith(("keras", "tf_keras")):
        for i, v in enumerate(obj.variables):
            var = _dense_variable(v)
            if var is not None:
                keras_index.setdefault(id(var), i)
    seen = {id(obj)}
    dense_seen = set()  # the tf.Variables taken (a Keras variable and its value are one)
    queue = collections.deque([("", obj)])
    while queue:
        path, node = queue.popleft()
        if isinstance(node, (Variable, _DynembTable)):
            tables.append(_table_item(node, path))
            if include_slots and isinstance(node, Variable):
                for state in node._slots.states:
                    tables.append(_table_item(state, ""))
            continue
        if isinstance(node, optimizers):
            continue
        var = _dense_variable(node)
        if var is not None:
            if (trainable.rows_of(var) is None and var.dtype in DENSE_DTYPES
                    and id(var) not in dense_seen):
                dense_seen.add(id(var))
                alt = f"variables/{keras_index[id(var)]}" if id(var) in keras_index else ""
                dense.append(DenseItem(quote(path), alt, var))
            continue
        for name, child in tf.train.TrackableView.children(node).items():
            if id(child) not in seen:
                seen.add(id(child))
                queue.append((f"{path}/{name}" if path else name, child))
    if not tables:
        raise ValueError(
            f"`obj` {obj!r} holds no de.Variable and no table: there is nothing to export.")
    by_identity: Dict[str, str] = {}
    for item in tables:
        if item.identity in by_identity:
            raise ValueError(
                f"two tables or de.Variables of `obj` are named {item.identity!r} (at "
                f"{by_identity[item.identity]!r} and {item.alt!r}): the name is how a served "
                "model finds each one, so give them distinct names.")
        by_identity[item.identity] = item.alt
    return tables, dense


# -- the loaded side -----------------------------------------------------------------------


def _walk(root, path: str):
    """The object at `path` (as `collect` wrote it) under `root`, or None."""
    node = root
    for part in urllib.parse.unquote(path).split("/"):
        if not part:
            continue
        if isinstance(node, (list, tuple)) or type(node).__name__ == "ListWrapper":
            if not part.isdigit() or int(part) >= len(node):
                return None
            node = node[int(part)]
        elif isinstance(node, dict) or type(node).__name__ == "_DictWrapper":
            node = node.get(part) if part in node else None
        else:
            node = getattr(node, part, None)
        if node is None:
            return None
    return node


def _loaded_tables(loaded) -> Tuple[Dict[str, List[Any]], Dict[str, List[Any]]]:
    """The variables and tables of a loaded SavedModel: `(by saved name, by object
    path)`, each mapping to the shard tables."""
    by_name: Dict[str, List[Any]] = {}
    by_path: Dict[str, List[Any]] = {}
    seen = {id(loaded)}
    queue = collections.deque([("", loaded)])
    while queue:
        path, node = queue.popleft()
        shards = getattr(node, "_tables", None)
        if shards is not None and not hasattr(node, "resource_handle"):
            shards = list(shards)  # a de.Variable
        elif hasattr(node, "resource_handle") and not isinstance(node, tf.Variable):
            shards = [node]  # a table on its own
        else:
            shards = None
        if shards:
            name = saved_identity.saved_name(node)
            if name is not None:
                by_name.setdefault(quote(name), shards)
            by_path.setdefault(quote(path), shards)
        # Tables are walked too: in a Keras archive a variable is a table's child.
        try:
            children = tf.train.TrackableView.children(node)
        except (TypeError, ValueError, AttributeError):
            continue  # a restored object that lists no children
        for name, child in children.items():
            if id(child) not in seen:
                seen.add(id(child))
                queue.append((f"{path}/{name}" if path else name, child))
    return by_name, by_path


def parse_item_line(line: str) -> Dict[str, str]:
    """The fields of a manifest's item line (DynembDeltaState's `items`)."""
    fields = line.split(" ")
    if fields[0] == "table":
        keys = ["kind", "identity", "alt", "key_dtype", "value_dtype", "dim", "partitioner",
                "num_shards", "mode"]
    else:
        keys = ["kind", "identity", "alt", "value_dtype", "shape"]
    item = dict(zip(keys, fields))
    item["alt"] = "" if item.get("alt") == "-" else item.get("alt", "")
    return item


def resolve_loaded(loaded, item_lines: Sequence[str]):
    """The loaded model's objects for the items of a delta manifest: `(tables, dense)`,
    `tables` a list of `(identity, shard tables)`, `dense` of `(identity, tf.Variable)`,
    named by the manifest's identities. Items the model lacks are left out (applying a
    generation that names them then fails, naming them)."""
    by_name, by_path = _loaded_tables(loaded)
    tables, dense = [], []
    for line in item_lines:
        item = parse_item_line(line)
        if item["kind"] == "table":
            shards = by_name.get(item["identity"]) or (by_path.get(item["alt"]) if item["alt"] else None)
            if shards:
                tables.append((item["identity"], shards))
        else:
            for identity in (item["identity"], item["alt"]):
                var = _walk(loaded, identity) if identity else None
                var = _dense_variable(var) if var is not None else None
                if var is not None:
                    dense.append((identity, var))
                    break
    return tables, dense
