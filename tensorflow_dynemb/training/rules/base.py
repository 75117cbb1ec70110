"""Row-wise sparse update rules that reproduce TensorFlow and Keras optimizers.

A dynamic-embedding table holds one parameter row per key, and one row per key in
each optimizer slot (Adam's ``m`` and ``v``, Adagrad's accumulator, ...), all in
hash tables.  An optimizer cannot update such rows itself, so the trainable
wrapper asks this module for the *rule* of the optimizer and applies it to the
rows looked up in a training step::

    rule = get_rule(optimizer)            # SparseRule; TypeError if unsupported
    rule.slots                            # (SlotSpec(name, initial), ...)
    values = rule.step_values(local_step) # once per step, before any apply
    new_rows, new_slots = rule.apply(rows, grad, slot_rows, values)

* ``local_step`` is the 1-based number of the step being taken
  (``iterations`` before the step + 1), as a scalar tensor (float32 or int64).
* ``rows``, ``grad`` and each ``slot_rows[name]`` are ``[n, dim]`` tensors of the
  variable's dtype: the current rows of the ``n`` unique keys, their summed
  gradient (already clipped and unscaled: clipping and loss scaling are the
  wrapper's job), and their slot rows.  A slot row never written starts from
  ``SlotSpec.initial``.
* ``apply`` returns the new rows and a dict with the new rows of every slot.
* ``rule.fused(values, dtype)`` is the same step as the slot-state table applies it
  in one op (`FusedStep`, for `DynembTableApplyRule`), or None for rules and options
  that op does not cover.  Its coefficients come from the same helpers as ``apply``'s
  formulas, and the op repeats the elementwise part operation for operation
  (cc/core/update_rules.h), so both give the same bits.

``apply`` of a rule computes, for each row, exactly what the optimizer's own
dense update would compute for that row (same formula, same order of operations,
same rounding of hyperparameters, so results agree to float round-off).  Rows
that are not passed in are not touched: updates are lazy.  That is the only
intended difference from the dense optimizers, whose decays also shrink the
slots of rows that got no gradient.

Supported optimizer families (told apart by ``isinstance``):

* Keras 3 (``keras.optimizers`` / ``tf.keras.optimizers`` on TF >= 2.16): SGD,
  Adam, AdamW, Adagrad, RMSprop, Adadelta, Adamax, Nadam, Ftrl; ``weight_decay``
  is applied as Keras does, before the update: ``w -= w * weight_decay * lr``.
* tf_keras (Keras 2) ``tf_keras.optimizers``: the same set, same weight decay.
* tf_keras ``tf_keras.optimizers.legacy`` (OptimizerV2): SGD, Adam,
  NonFusedAdam, Adagrad, RMSprop, Adadelta, Adamax, Nadam, Ftrl, including the
  ``decay`` argument (``lr / (1 + decay * iterations)``); the same for TensorFlow's
  own legacy Keras (``tensorflow.python.keras.optimizer_v2``), of which they are a copy.
* ``tf.compat.v1.train``: GradientDescentOptimizer, MomentumOptimizer,
  AdamOptimizer, AdagradOptimizer, AdadeltaOptimizer, RMSPropOptimizer,
  FtrlOptimizer, ProximalAdagradOptimizer, ProximalGradientDescentOptimizer,
  AdagradDAOptimizer (formulas of the ``ResourceSparseApply*`` kernels and of TF1
  Adam's sparse path).

Rules are pure functions of tensors: they create no variables, assign nothing,
and work eagerly, inside ``tf.function`` and in TF1 graph mode.  They read
hyperparameters from the optimizer each time they build their ops, so a changed
learning-rate variable is seen.  Step-dependent quantities (learning-rate
schedules, bias corrections, Nadam's momentum-schedule product) are computed from
``local_step`` in closed form, never from the optimizer's ``iterations``; two TF1
rules read what their optimizer itself reads instead: Adam its ``beta1_power`` /
``beta2_power`` variables (which the TF1 wrapper creates and advances, see
``tf1.py``), AdagradDA its ``global_step``.
float16/bfloat16 rows are updated in float32 and cast back.
"""

from __future__ import annotations

import math
import numbers
import sys
from typing import Dict, NamedTuple, Optional, Tuple

import tensorflow as tf

__all__ = ["FusedStep", "SlotSpec", "SparseRule"]


class SlotSpec(NamedTuple):
    """One optimizer slot kept per row: its name and the value a new row starts from."""

    name: str
    initial: float


class FusedStep(NamedTuple):
    """A rule's step as the slot-state table applies it in one op
    (`DynembTableApplyRule`; formulas in cc/core/update_rules.h)."""

    rule: str  # the op's `rule` attr
    coefficients: Tuple[tf.Tensor, ...]  # scalars of the rows' dtype, in the op's order
    weight_decay: bool  # coefficients start with (weight_decay, lr)


# --------------------------------------------------------------------------------------
# Hyperparameter helpers
# --------------------------------------------------------------------------------------


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_zero(value) -> bool:
    """True for a Python number equal to 0 (a tensor hyperparameter is never "zero")."""
    return _is_number(value) and value == 0


def _call_if_callable(value):
    """The value of a hyperparameter that may be a zero-argument callable."""
    if callable(value) and not isinstance(value, (tf.Variable, tf.Tensor)):
        return value()
    return value


def _mixed(value, dtype):
    """A hyperparameter used as an operand of a tensor op, the way Keras writes
    ``x * self.rho`` or ``sqrt(v) + self.epsilon``: a Python number is converted
    straight to `dtype` (rounded once)."""
    value = _call_if_callable(value)
    if _is_number(value):
        return tf.constant(value, dtype)
    return tf.cast(value, dtype)


def _cast(value, dtype):
    """A hyperparameter passed through ``tf.cast`` / ``keras.ops.cast`` / ``convert_to_tensor``.

    That turns a Python float into a float32 tensor first, so float64 variables see
    the float32-rounded value: Keras' ``ops.cast(self.beta_2, variable.dtype)``,
    TF1's ``convert_to_tensor(beta2)``, legacy Keras' float32 hyperparameter
    variables.  It matters: 1 - beta_2**t differs by 1e-5 relative for beta_2 = 0.999.
    """
    value = _call_if_callable(value)
    return tf.cast(tf.convert_to_tensor(value), dtype)


def _one_minus(value, dtype):
    """``1 - value`` as Keras writes it for a Python number: computed in Python, then
    converted (again: 1 - float32(0.999) != float32(1 - 0.999) by 1e-5 relative)."""
    value = _call_if_callable(value)
    if _is_number(value):
        return tf.constant(1.0 - value, dtype)
    return 1 - _mixed(value, dtype)


def _schedule_classes() -> tuple:
    """The LearningRateSchedule base classes of the Keras packages already imported."""
    classes = []
    keras = sys.modules.get("keras")
    if keras is not None:
        schedules = getattr(getattr(keras, "optimizers", None), "schedules", None)
        if schedules is not None:
            classes.append(schedules.LearningRateSchedule)
    tf_keras = sys.modules.get("tf_keras")
    if tf_keras is not None:
        classes.append(tf_keras.optimizers.schedules.LearningRateSchedule)
    tf_legacy_keras = sys.modules.get("tensorflow.python.keras.optimizer_v2.learning_rate_schedule")
    if tf_legacy_keras is not None:
        classes.append(tf_legacy_keras.LearningRateSchedule)
    return tuple(classes)


def _is_schedule(value) -> bool:
    classes = _schedule_classes()
    return bool(classes) and isinstance(value, classes)


def _nadam_momentum_product(beta_1, exponent: float, step):
    """prod_{i=1..t} beta_1 * (1 - 0.5 * 0.96 ** (exponent * i)), in float64.

    This is Nadam's momentum-schedule product (Keras: `u_product`, exponent 1;
    legacy Keras: `m_cache`, exponent = `schedule_decay`).  Keras keeps it in a
    variable; here it is computed from `step` in O(1):  with q = 0.96**exponent,
        sum_{i=1..t} log(1 - 0.5 q^i) = -sum_{k>=1} (0.5^k / k) q^k (1 - q^(kt)) / (1 - q^k)
    (expand log(1 - x) and sum the geometric series over i); 64 terms reach float64
    precision since the k-th term is below 0.5^k * t.
    """
    step = tf.cast(step, tf.float64)
    log_beta = tf.math.log(_mixed(beta_1, tf.float64))
    log_q = exponent * math.log(0.96)
    if log_q == 0.0:
        # q == 1: every factor is beta_1 * 0.5.
        return tf.exp(step * (log_beta + math.log(0.5)))
    k = tf.range(1, 65, dtype=tf.float64)
    # (1 - q^(kt)) / (1 - q^k) == expm1(k t log q) / expm1(k log q), without cancellation.
    ratio = tf.math.expm1(k * log_q * step) / tf.math.expm1(k * log_q)
    terms = tf.pow(tf.constant(0.5, tf.float64), k) / k * tf.exp(k * log_q) * ratio
    return tf.exp(step * log_beta - tf.reduce_sum(terms))


# --------------------------------------------------------------------------------------
# Base class
# --------------------------------------------------------------------------------------


class SparseRule:
    """The row-wise update rule of one optimizer instance.

    Attributes:
      optimizer: the wrapped optimizer instance (only read, never changed).
      slots: the per-row slots the rule keeps, as `SlotSpec`s.
    """

    def __init__(self, optimizer, slots: Tuple[SlotSpec, ...] = ()):
        self.optimizer = optimizer
        self.slots = tuple(slots)

    def __repr__(self):
        names = ", ".join(slot.name for slot in self.slots)
        return f"<{type(self).__name__} for {type(self.optimizer).__name__}; slots: {names}>"

    def step_values(self, local_step, schedule_step=None) -> Dict[str, tf.Tensor]:
        """Tensors shared by every variable in one training step.

        Called once per step, before any `apply` of that step, with the 1-based
        step number (`iterations` before the step + 1).  Returns at least
        ``"step"`` (float64) and ``"lr"`` (the learning rate of this step, in the
        dtype the optimizer computes it in; schedules are evaluated at
        ``local_step - 1``, the value of `iterations` during the step).  The dict
        is opaque to callers: pass it to `apply` unchanged.  Bias corrections
        are derived from ``"step"`` inside `apply`, in the variable's dtype,
        because that is where the optimizers compute them (1 - beta**t loses
        digits differently in float32 and float64).  ``schedule_step``, when
        given, is where schedules are evaluated instead (Keras' raw step counter
        under gradient accumulation, where ``local_step`` counts updates).
        """
        step = tf.cast(local_step, tf.float64)
        schedule_at = step if schedule_step is None else tf.cast(schedule_step, tf.float64) + 1
        values = {"step": step, "lr": self._learning_rate(schedule_at)}
        values["local_step"] = local_step  # see `_step`
        values.update(self._extra_step_values(step))
        return values

    def apply(
        self, rows, grad, slots: Dict[str, tf.Tensor], values: Dict[str, tf.Tensor],
        use_weight_decay: bool = True,
    ) -> Tuple[tf.Tensor, Dict[str, tf.Tensor]]:
        """Updates `rows` ([n, dim]) given their summed gradient and slot rows.

        Returns ``(new_rows, {slot name: new slot rows})``.  Includes the
        optimizer's weight decay where it has one; pass
        ``use_weight_decay=False`` for a variable the optimizer excludes from
        weight decay (`exclude_from_weight_decay`).
        """
        missing = [slot.name for slot in self.slots if slot.name not in slots]
        if missing:
            raise KeyError(f"{type(self).__name__}.apply: missing slot rows {missing}")
        dtype = _compute_dtype(rows.dtype)
        var = tf.cast(rows, dtype)
        grad = tf.cast(grad, dtype)
        state = {slot.name: tf.cast(slots[slot.name], dtype) for slot in self.slots}
        if use_weight_decay:
            var = self._weight_decay(var, values, dtype)
        var, state = self._update(var, grad, state, values, dtype)
        new_slots = {name: tf.cast(state[name], slots[name].dtype) for name in state}
        return tf.cast(var, rows.dtype), new_slots

    def fused(
        self, values: Dict[str, tf.Tensor], dtype, use_weight_decay: bool = True
    ) -> Optional[FusedStep]:
        """`apply`'s step for rows of `dtype` as the slot-state table applies it in one
        op, or None where that op has no formula for this rule, its options or dtype
        (float16/bfloat16 rows, amsgrad, RMSprop, ...): then use `apply`."""
        if dtype not in (tf.float32, tf.float64):
            return None
        fused = self._fused(values, dtype)
        if fused is None:
            return None
        rule, coefficients = fused
        decay = self._decay_coefficients(values, dtype) if use_weight_decay else None
        if decay is not None:
            coefficients = (*decay, *coefficients)
        return FusedStep(rule, tuple(tf.cast(c, dtype) for c in coefficients), decay is not None)

    # -- hooks for subclasses ----------------------------------------------------------

    def _learning_rate(self, step):
        raise NotImplementedError

    def _extra_step_values(self, step) -> Dict[str, tf.Tensor]:
        return {}

    def _decay_coefficients(self, values, dtype) -> Optional[Tuple[tf.Tensor, tf.Tensor]]:
        """(weight_decay, lr) of a rule that decays rows first (`_weight_decay`), or None."""
        return None

    def _weight_decay(self, var, values, dtype):
        decay = self._decay_coefficients(values, dtype)
        if decay is None:
            return var
        weight_decay, lr = decay
        return var - var * weight_decay * lr

    def _fused(self, values, dtype) -> Optional[Tuple[str, Tuple[tf.Tensor, ...]]]:
        """`(rule, coefficients)` of the fused op for this rule's `_update`, or None."""
        return None

    def _update(self, var, grad, state, values, dtype):
        raise NotImplementedError

    # -- small helpers -----------------------------------------------------------------

    @staticmethod
    def _lr(values, dtype):
        return tf.cast(values["lr"], dtype)

    @staticmethod
    def _step(values, dtype):
        # float64 holds every float16 / bfloat16 / float32 value exactly, so the step
        # as given, where it has `dtype`, is `step` cast back: one Cast op fewer a step.
        local = values.get("local_step")
        if isinstance(local, tf.Tensor) and local.dtype == dtype and dtype.is_floating:
            return local
        return tf.cast(values["step"], dtype)


def _compute_dtype(dtype):
    """float16/bfloat16 rows are updated in float32 and rounded back once: the
    optimizers would compute in the variable dtype, where eps and 1 - beta**t
    underflow or lose most digits."""
    if dtype in (tf.float16, tf.bfloat16):
        return tf.float32
    return dtype
