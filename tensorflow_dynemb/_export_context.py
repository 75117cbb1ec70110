"""What the export code tells tables, variables and lookups while it traces functions.

A near-leaf module (it imports nothing of the package but the leaf model_mode.py),
so that tables/, variable/ and the lookups can ask it without import cycles. Two
questions:

- `read_only()`: is the function being traced for serving? True while
  `tf.saved_model.save` runs (it retraces every function it exports, because its save
  context is part of tf.function's cache key), while `de.export_static_saved_model`
  traces, and in TFRA's inference mode (`de.enable_inference_mode()`, model_mode.py).
  A serving trace must not change anything: embedding lookups of a trainable
  `de.Variable` then read the tables directly instead of through the trainable view
  (whose buffers every call overwrites, which concurrent calls would race on), lookups
  do not refresh scores, and tables created for a SavedModel never do.
- `frozen(obj)`: the stock-op stand-in for a table or variable while
  `de.export_static_saved_model` retraces its signatures (None otherwise): its
  `lookup` then reads the stand-in instead of calling the custom ops.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Dict, Optional

from tensorflow_dynemb import model_mode

try:  # No public API says "inside tf.saved_model.save"; without it, never read-only.
    from tensorflow.python.saved_model.save_context import in_save_context as _in_save_context
except ImportError:  # pragma: no cover - present in every supported TF (2.16-2.21)
    def _in_save_context() -> bool:
        return False

__all__ = ["in_saved_model_save", "read_only", "frozen", "freezing", "recording"]

_local = threading.local()


def in_saved_model_save() -> bool:
    """Whether `tf.saved_model.save` is running in this thread."""
    return _in_save_context()


def read_only() -> bool:
    """Whether lookups built now are read-only (see the module docstring)."""
    return (
        in_saved_model_save()
        or model_mode.in_inference_mode()
        or getattr(_local, "stand_ins", None) is not None
        or getattr(_local, "seen", None) is not None
    )


def frozen(obj: Any) -> Optional[Any]:
    """The stand-in of the table or variable `obj` during a static export, else None.

    During a discovery trace (`recording`) it records `obj` and returns None, so the
    trace uses the real ops and the caller learns what the function reads.
    """
    seen = getattr(_local, "seen", None)
    if seen is not None:
        seen[id(obj)] = obj
        return None
    stand_ins = getattr(_local, "stand_ins", None)
    if stand_ins is None:
        return None
    return stand_ins.get(id(obj))


@contextlib.contextmanager
def recording():
    """Records every table and variable that `lookup` is called on in this thread;
    yields the `{id: object}` dict it fills."""
    seen: Dict[int, Any] = {}
    previous = getattr(_local, "seen", None)
    _local.seen = seen
    try:
        yield seen
    finally:
        _local.seen = previous


@contextlib.contextmanager
def freezing(stand_ins: Dict[int, Any]):
    """While active in this thread, `frozen(obj)` returns `stand_ins[id(obj)]`."""
    previous = getattr(_local, "stand_ins", None)
    _local.stand_ins = stand_ins
    try:
        yield
    finally:
        _local.stand_ins = previous
