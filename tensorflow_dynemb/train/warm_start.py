"""`de.warm_start` and `de.WarmStartHook`: start `de.Variable`s from the content another
model saved (TFRA's warm-start utilities for TF1 sessions and Estimators).

A checkpoint holds a variable's content as three tensors, `<name>-keys`,
`<name>-values` and, for most variables, `<name>-scores` (persistence/checkpoint.py).
`<name>` is the variable's name in a checkpoint written by `tf.compat.v1.train.Saver`:
its name made graph-unique, which a Saver may suffix with `_1`, `_2`, ...; in a
`tf.train.Checkpoint` it is the variable's object path followed by `/.ATTRIBUTES/`.
Warm-starting reads those tensors with `RestoreV2` and gives them to the variable's
checkpoint restore (`_restore_from_tensors`), which routes the keys to its own shards:
the saving and the warm-started variable may have different numbers of shards.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Sequence, Union

import tensorflow as tf

from tensorflow_dynemb.persistence.checkpoint import CKPT_KEYS, CKPT_SCORES, CKPT_VALUES
from tensorflow_dynemb.variable.graph_keys import GraphKeys
from tensorflow_dynemb.variable.variable import Variable, _module_name

__all__ = ["warm_start", "WarmStartHook"]

VarsToWarmStart = Union[None, str, Sequence[str], Sequence[Variable]]


def warm_start(
    ckpt_to_initialize_from: Union[str, os.PathLike],
    vars_to_warm_start: VarsToWarmStart = ".*",
    var_name_to_prev_var_name: Optional[Dict[str, str]] = None,
):
    """Replaces the content of `de.Variable`s by the content a checkpoint holds for them.

    Args:
      ckpt_to_initialize_from: a checkpoint prefix, or a directory (its latest
        checkpoint is used).
      vars_to_warm_start: the variables: a list of `de.Variable`s; or a regular
        expression (a string), or a list of them, matched against the names of the
        variables in the graph collection `de.GraphKeys.DYNAMIC_EMBEDDING_VARIABLES`
        (`None`: all of them). `de.Variable`s are not added to that collection by
        themselves (as in TFRA): add them with `tf.compat.v1.add_to_collection`.
      var_name_to_prev_var_name: `{variable name: name in the checkpoint}` for
        variables saved under another name. The name in the checkpoint is the name of
        the saved variable (or its graph-unique form, such as `emb_1`), or its object
        path in a `tf.train.Checkpoint` (such as `model/emb`).

    Returns:
      In a graph, the op that restores them all (run it once the session exists, as
      `WarmStartHook` does); executing eagerly, None (they are restored already).

    Raises:
      ValueError: `vars_to_warm_start` of another kind, or selecting no variable; no
        checkpoint at `ckpt_to_initialize_from`; a variable the checkpoint holds no
        content for, or for which it holds several candidates; content of another
        key dtype, value dtype or dim than the variable's.

    Example (the variable saved with two shards, warm-started with one):

    >>> import tempfile
    >>> import tensorflow as tf
    >>> import tensorflow_dynemb as de
    >>> folder = tempfile.TemporaryDirectory()
    >>> prefix = folder.name + "/model"
    >>> with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
    ...     emb = de.get_variable("emb", dim=1, devices=["/CPU:0"] * 2)
    ...     sess.run(emb.upsert(tf.constant([1, 2], tf.int64), [[1.0], [2.0]]))
    ...     path = tf.compat.v1.train.Saver().save(sess, prefix)
    >>> with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
    ...     emb = de.get_variable("emb", dim=1)
    ...     sess.run(de.warm_start(prefix, vars_to_warm_start=[emb]))
    ...     sess.run(emb.lookup(tf.constant([2, 1], tf.int64))).tolist()
    [[2.0], [1.0]]
    >>> folder.cleanup()
    """
    variables = _selected(vars_to_warm_start)
    renames = dict(var_name_to_prev_var_name or {})
    checkpoint = _checkpoint_file(ckpt_to_initialize_from)
    reader = tf.train.load_checkpoint(checkpoint)
    saved_dtypes = reader.get_variable_to_dtype_map()
    saved_shapes = reader.get_variable_to_shape_map()
    restores = []
    for variable in variables:
        prev_name = renames.get(variable.name, variable.name)
        prefix = _saved_prefix(variable, prev_name, saved_dtypes, checkpoint)
        _check_content(variable, prefix, saved_dtypes, saved_shapes)
        restores.append(_restore(variable, checkpoint, prefix, saved_dtypes))
    if tf.executing_eagerly():
        return None
    return tf.group(*[op for op in restores if op is not None], name="warm_start")


class WarmStartHook(tf.compat.v1.train.SessionRunHook):
    """A `SessionRunHook` that warm-starts `de.Variable`s once its session exists (for
    `tf.estimator` and `MonitoredTrainingSession`): `de.warm_start(...)` with the same
    arguments, built in `begin` and run in `after_create_session`."""

    def __init__(
        self,
        ckpt_to_initialize_from: Union[str, os.PathLike],
        vars_to_warm_start: VarsToWarmStart,
        var_name_to_prev_var_name: Optional[Dict[str, str]] = None,
    ):
        """Args: see `de.warm_start`."""
        self._ckpt_to_initialize_from = ckpt_to_initialize_from
        self._vars_to_warm_start = vars_to_warm_start
        self._var_name_to_prev_var_name = var_name_to_prev_var_name
        self._restore_op = None

    def begin(self):
        self._restore_op = warm_start(
            self._ckpt_to_initialize_from,
            self._vars_to_warm_start,
            self._var_name_to_prev_var_name,
        )

    def after_create_session(self, session, coord):
        del coord
        session.run(self._restore_op)


def _selected(vars_to_warm_start: VarsToWarmStart) -> List[Variable]:
    """The variables `vars_to_warm_start` names (see `warm_start`), each once."""
    if vars_to_warm_start is None or isinstance(vars_to_warm_start, str):
        scopes = [vars_to_warm_start]
    elif isinstance(vars_to_warm_start, (list, tuple)) and all(
        isinstance(v, str) for v in vars_to_warm_start
    ):
        scopes = list(vars_to_warm_start)
    elif isinstance(vars_to_warm_start, (list, tuple)) and all(
        isinstance(v, Variable) for v in vars_to_warm_start
    ):
        return _distinct(vars_to_warm_start)
    else:
        raise ValueError(
            "`vars_to_warm_start` must be a regular expression, a list of them, or a list "
            f"of de.Variables, got {vars_to_warm_start!r:.200}."
        )
    found = []
    for scope in scopes:
        found += tf.compat.v1.get_collection(GraphKeys.DYNAMIC_EMBEDDING_VARIABLES, scope=scope)
    variables = _distinct([v for v in found if isinstance(v, Variable)])
    if not variables:
        raise ValueError(
            f"`vars_to_warm_start`={vars_to_warm_start!r} selects no de.Variable in the "
            f"graph collection de.GraphKeys.DYNAMIC_EMBEDDING_VARIABLES. de.Variables are "
            "not added to it by themselves: add them with tf.compat.v1.add_to_collection, "
            "or pass the variables."
        )
    return variables


def _distinct(variables: Sequence[Variable]) -> List[Variable]:
    seen, out = set(), []
    for variable in variables:
        if id(variable) not in seen:
            seen.add(id(variable))
            out.append(variable)
    return out


def _checkpoint_file(ckpt: Union[str, os.PathLike]) -> str:
    """The checkpoint prefix `ckpt` names: itself, or a directory's latest checkpoint."""
    ckpt = os.fspath(ckpt)
    if tf.io.gfile.isdir(ckpt):
        latest = tf.train.latest_checkpoint(ckpt)
        if latest is None:
            raise ValueError(
                f"`ckpt_to_initialize_from`={ckpt!r} is a directory without a checkpoint "
                "state file; pass a checkpoint prefix."
            )
        return latest
    if not tf.io.gfile.glob(ckpt + ".index"):
        raise ValueError(
            f"`ckpt_to_initialize_from`={ckpt!r} is neither a checkpoint prefix (no "
            f"{ckpt}.index) nor a directory."
        )
    return ckpt


def _saved_prefix(
    variable: Variable, prev_name: str, saved: Dict[str, Any], checkpoint: str
) -> str:
    """The prefix of the checkpoint keys `<prefix>-keys`, ... holding `prev_name`'s
    content: `prev_name` itself, its object path in a tf.train.Checkpoint, or (a TF1
    Saver's graph-unique names) its name as a TF name with a `_<n>` suffix."""
    exact = [p for p in (prev_name, f"{prev_name}/.ATTRIBUTES/") if p + CKPT_KEYS in saved]
    if exact:
        return exact[0]
    unique = re.compile(re.escape(_module_name(prev_name)) + r"(_\d+)?")
    candidates = sorted(
        name[: -len(CKPT_KEYS)]
        for name in saved
        if name.endswith(CKPT_KEYS) and unique.fullmatch(name[: -len(CKPT_KEYS)])
    )
    if len(candidates) == 1:
        return candidates[0]
    renamed = "" if prev_name == variable.name else f" (saved as {prev_name!r})"
    if candidates:
        raise ValueError(
            f"Checkpoint {checkpoint!r} holds several candidates for de.Variable "
            f"{variable.name!r}{renamed}: {candidates}. Name the one to use in "
            "`var_name_to_prev_var_name`."
        )
    held = sorted(name[: -len(CKPT_KEYS)] for name in saved if name.endswith(CKPT_KEYS))
    raise ValueError(
        f"Checkpoint {checkpoint!r} holds no content for de.Variable {variable.name!r}"
        f"{renamed}; the de.Variable contents it holds: {held[:20]}. Map the name with "
        "`var_name_to_prev_var_name`."
    )


def _check_content(
    variable: Variable, prefix: str, dtypes: Dict[str, Any], shapes: Dict[str, Any]
) -> None:
    """Raises ValueError for saved content of another key dtype, value dtype or dim."""
    key_dtype, value_dtype = dtypes.get(prefix + CKPT_KEYS), dtypes.get(prefix + CKPT_VALUES)
    value_shape = shapes.get(prefix + CKPT_VALUES)
    if key_dtype != variable.key_dtype or value_dtype != variable.value_dtype:
        raise ValueError(
            f"de.Variable {variable.name!r} has keys of {variable.key_dtype.name} and values "
            f"of {variable.value_dtype.name}, but checkpoint content {prefix!r} has keys of "
            f"{getattr(key_dtype, 'name', key_dtype)} and values of "
            f"{getattr(value_dtype, 'name', value_dtype)}."
        )
    if value_shape is None or len(value_shape) != 2 or value_shape[1] != variable.dim:
        raise ValueError(
            f"de.Variable {variable.name!r} has dim {variable.dim}, but checkpoint content "
            f"{prefix!r} holds values of shape {value_shape}."
        )


def _restore(variable: Variable, checkpoint: str, prefix: str, saved: Dict[str, Any]):
    """Reads the content under `prefix` and restores it into `variable` (its restore
    op, or None eagerly)."""
    locals_ = [CKPT_KEYS, CKPT_VALUES] + ([CKPT_SCORES] if prefix + CKPT_SCORES in saved else [])
    names = [prefix + local for local in locals_]
    with tf.name_scope(f"warm_start_{variable._unique_name}"), tf.device("/CPU:0"):
        tensors = tf.raw_ops.RestoreV2(
            prefix=checkpoint,
            tensor_names=names,
            shape_and_slices=[""] * len(names),
            dtypes=[saved[name] for name in names],
        )
    return variable._restore_from_tensors(dict(zip(locals_, tensors)))
