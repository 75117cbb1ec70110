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
  ``decay`` argument (``lr / (1 + decay * iterations)``).
* ``tf.compat.v1.train``: GradientDescentOptimizer, MomentumOptimizer,
  AdamOptimizer, AdagradOptimizer, AdadeltaOptimizer, RMSPropOptimizer,
  FtrlOptimizer, ProximalAdagradOptimizer (formulas of the
  ``ResourceSparseApply*`` kernels and of TF1 Adam's sparse path).

Rules are pure functions of tensors: they create no variables, assign nothing,
and work eagerly, inside ``tf.function`` and in TF1 graph mode.  They read
hyperparameters from the optimizer each time they build their ops, so a changed
learning-rate variable is seen.  Step-dependent quantities (learning-rate
schedules, bias corrections, Nadam's momentum-schedule product) are computed from
``local_step`` in closed form, never from the optimizer's ``iterations``.
float16/bfloat16 rows are updated in float32 and cast back.
"""

from __future__ import annotations

import math
import numbers
import sys
from typing import Dict, NamedTuple, Optional, Tuple

import tensorflow as tf

__all__ = ["FusedStep", "SlotSpec", "SparseRule", "get_rule"]


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

    def step_values(self, local_step) -> Dict[str, tf.Tensor]:
        """Tensors shared by every variable in one training step.

        Called once per step, before any `apply` of that step, with the 1-based
        step number (`iterations` before the step + 1).  Returns at least
        ``"step"`` (float64) and ``"lr"`` (the learning rate of this step, in the
        dtype the optimizer computes it in; schedules are evaluated at
        ``local_step - 1``, the value of `iterations` during the step).  The dict
        is opaque to callers: pass it to `apply` unchanged.  Bias corrections
        are derived from ``"step"`` inside `apply`, in the variable's dtype,
        because that is where the optimizers compute them (1 - beta**t loses
        digits differently in float32 and float64).
        """
        step = tf.cast(local_step, tf.float64)
        values = {"step": step, "lr": self._learning_rate(step)}
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
        return tf.cast(values["step"], dtype)


def _compute_dtype(dtype):
    """float16/bfloat16 rows are updated in float32 and rounded back once: the
    optimizers would compute in the variable dtype, where eps and 1 - beta**t
    underflow or lose most digits."""
    if dtype in (tf.float16, tf.bfloat16):
        return tf.float32
    return dtype


# --------------------------------------------------------------------------------------
# Keras 3 and tf_keras (Keras 2 "new" optimizers): same attribute names, same formulas
# --------------------------------------------------------------------------------------


class _KerasRule(SparseRule):
    """Keras 3 / tf_keras optimizers: learning rate (variable, callable or schedule)
    and weight decay; the algorithm subclasses read the same public attributes
    (`beta_1`, `epsilon`, `momentum`, ...) in both packages."""

    def __init__(self, optimizer, slots=(), tf_keras: bool = False):
        super().__init__(optimizer, slots)
        # tf_keras writes a few formulas differently (rsqrt in RMSprop, g * g in
        # Adadelta); the flag picks its spelling where round-off could tell.
        self._tf_keras = tf_keras

    def _learning_rate(self, step):
        lr = self.optimizer._learning_rate
        if _is_schedule(lr):
            # Keras evaluates the schedule at `iterations` (int64), the number of
            # steps completed before this one.
            return tf.convert_to_tensor(lr(tf.cast(step - 1, tf.int64)))
        return tf.convert_to_tensor(_call_if_callable(lr))

    def _decay_coefficients(self, values, dtype):
        """Keras: ``variable.assign_sub(variable * wd * lr)`` before update_step."""
        weight_decay = self.optimizer.weight_decay
        if weight_decay is None:
            return None
        # `tf.cast(self.weight_decay, variable.dtype)`: float32-rounded for float64.
        return _cast(weight_decay, dtype), self._lr(values, dtype)


class _KerasSGD(_KerasRule):
    """keras SGD:  m = momentum * m - lr * g;  w += m, or with nesterov
    w += momentum * m - lr * g;  without momentum  w -= lr * g."""

    def __init__(self, optimizer, **kwargs):
        # Keras 3 keeps no slot when momentum == 0 (tf_keras keeps one that stays
        # -lr * g, which gives the same w).
        self._use_momentum = not _is_zero(optimizer.momentum)
        slots = (SlotSpec("momentum", 0.0),) if self._use_momentum else ()
        super().__init__(optimizer, slots, **kwargs)

    def _update(self, var, grad, state, values, dtype):
        lr = self._lr(values, dtype)
        if not self._use_momentum:
            return var - grad * lr, {}
        momentum = _cast(self.optimizer.momentum, dtype)  # Keras casts it
        return _momentum_step(var, grad, state["momentum"], momentum, lr, self.optimizer.nesterov)

    def _fused(self, values, dtype):
        if not self._use_momentum:
            return None  # no slot: nothing to fuse
        momentum = _cast(self.optimizer.momentum, dtype)
        return _momentum_rule(self.optimizer.nesterov), (self._lr(values, dtype), momentum)


def _momentum_rule(nesterov: bool) -> str:
    """The fused rule of `_momentum_step`."""
    return "keras_nesterov" if nesterov else "keras_momentum"


def _momentum_step(var, grad, m, momentum, lr, nesterov: bool):
    """Keras' (3 and 2, legacy too) SGD momentum: m = m * momentum - g * lr;
    w += m, or with nesterov w += m * momentum - g * lr."""
    m = m * momentum - grad * lr
    if nesterov:
        return var + (m * momentum - grad * lr), {"momentum": m}
    return var + m, {"momentum": m}


class _KerasAdam(_KerasRule):
    """keras Adam / AdamW (decay done by _weight_decay):
        alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)
        m += (g - m) * (1 - beta_1);  v += (g^2 - v) * (1 - beta_2)
        vhat = max(vhat, v) (amsgrad, then used for v)
        w -= m * alpha / (sqrt(v) + eps)   (tf_keras adaptive_epsilon: eps * sqrt(1 - beta_2^t))
    """

    def __init__(self, optimizer, **kwargs):
        slots = [SlotSpec("m", 0.0), SlotSpec("v", 0.0)]
        if optimizer.amsgrad:
            slots.append(SlotSpec("vhat", 0.0))
        super().__init__(optimizer, tuple(slots), **kwargs)

    def _coefficients(self, values, dtype):
        """(alpha, 1 - beta_1, 1 - beta_2, epsilon) of this step."""
        opt = self.optimizer
        lr = self._lr(values, dtype)
        t = self._step(values, dtype)
        # Keras: power(cast(beta, dtype), t), while 1 - beta below is Python arithmetic.
        beta_1_power = tf.pow(_cast(opt.beta_1, dtype), t)
        beta_2_power = tf.pow(_cast(opt.beta_2, dtype), t)
        alpha = lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        if getattr(opt, "adaptive_epsilon", False):
            epsilon = opt.epsilon * tf.sqrt(1 - beta_2_power)
        else:
            epsilon = _mixed(opt.epsilon, dtype)
        return alpha, _one_minus(opt.beta_1, dtype), _one_minus(opt.beta_2, dtype), epsilon

    def _fused(self, values, dtype):
        if self.optimizer.amsgrad:
            return None
        return "keras_adam", self._coefficients(values, dtype)

    def _update(self, var, grad, state, values, dtype):
        opt = self.optimizer
        alpha, one_minus_beta_1, one_minus_beta_2, epsilon = self._coefficients(values, dtype)
        m = state["m"] + (grad - state["m"]) * one_minus_beta_1
        v = state["v"] + (tf.square(grad) - state["v"]) * one_minus_beta_2
        new_state = {"m": m, "v": v}
        if opt.amsgrad:
            v = tf.maximum(state["vhat"], v)
            new_state["vhat"] = v
        var = var - (m * alpha) / (tf.sqrt(v) + epsilon)
        return var, new_state


class _KerasAdagrad(_KerasRule):
    """keras Adagrad:  acc += g^2;  w -= lr * g / sqrt(acc + eps)   (eps inside the sqrt)."""

    def __init__(self, optimizer, **kwargs):
        slots = (SlotSpec("accumulator", float(optimizer.initial_accumulator_value)),)
        super().__init__(optimizer, slots, **kwargs)

    def _fused(self, values, dtype):
        return "keras_adagrad", (self._lr(values, dtype), _mixed(self.optimizer.epsilon, dtype))

    def _update(self, var, grad, state, values, dtype):
        lr, epsilon = self._fused(values, dtype)[1]
        accumulator = state["accumulator"] + tf.square(grad)
        var = var - (lr * grad) / tf.sqrt(accumulator + epsilon)
        return var, {"accumulator": accumulator}


class _KerasRMSprop(_KerasRule):
    """keras RMSprop:
        rms = rho * rms + (1 - rho) * g^2;  mg = rho * mg + (1 - rho) * g (centered)
        inc = lr * g / sqrt(rms - mg^2 + eps)      (centered; else sqrt(rms + eps))
        mom = momentum * mom + inc;  w -= mom      (momentum > 0; else w -= inc)
    """

    def __init__(self, optimizer, **kwargs):
        slots = [SlotSpec("rms", 0.0)]
        if optimizer.momentum > 0:
            slots.append(SlotSpec("momentum", 0.0))
        if optimizer.centered:
            slots.append(SlotSpec("mg", 0.0))
        super().__init__(optimizer, tuple(slots), **kwargs)

    def _update(self, var, grad, state, values, dtype):
        opt = self.optimizer
        lr = self._lr(values, dtype)
        rho = _mixed(opt.rho, dtype)
        one_minus_rho = _one_minus(opt.rho, dtype)
        epsilon = _mixed(opt.epsilon, dtype)
        rms = rho * state["rms"] + one_minus_rho * tf.square(grad)
        new_state = {"rms": rms}
        if opt.centered:
            mg = rho * state["mg"] + one_minus_rho * grad
            new_state["mg"] = mg
            denominator = rms - tf.square(mg) + epsilon
        else:
            denominator = rms + epsilon
        if self._tf_keras:
            increment = lr * grad * tf.math.rsqrt(denominator)
        else:
            increment = (lr * grad) / tf.sqrt(denominator)
        if opt.momentum > 0:
            momentum = _mixed(opt.momentum, dtype) * state["momentum"] + increment
            new_state["momentum"] = momentum
            var = var - momentum
        else:
            var = var - increment
        return var, new_state


class _KerasAdadelta(_KerasRule):
    """keras Adadelta:
        acc_g = rho * acc_g + (1 - rho) * g^2
        delta = -sqrt(acc_dw + eps) * g / sqrt(acc_g + eps)
        acc_dw = rho * acc_dw + (1 - rho) * delta^2;  w += lr * delta
    """

    def __init__(self, optimizer, **kwargs):
        slots = (SlotSpec("accum_grad", 0.0), SlotSpec("accum_var", 0.0))
        super().__init__(optimizer, slots, **kwargs)

    def _update(self, var, grad, state, values, dtype):
        opt = self.optimizer
        lr = self._lr(values, dtype)
        rho = _mixed(opt.rho, dtype)
        one_minus_rho = _one_minus(opt.rho, dtype)
        epsilon = _mixed(opt.epsilon, dtype)
        if self._tf_keras:
            accum_grad = rho * state["accum_grad"] + one_minus_rho * grad * grad
        else:
            accum_grad = rho * state["accum_grad"] + one_minus_rho * tf.square(grad)
        delta = -(tf.sqrt(state["accum_var"] + epsilon) * grad / tf.sqrt(accum_grad + epsilon))
        accum_var = rho * state["accum_var"] + one_minus_rho * tf.square(delta)
        var = var + lr * delta
        return var, {"accum_grad": accum_grad, "accum_var": accum_var}


class _KerasAdamax(_KerasRule):
    """keras Adamax:  m += (g - m) * (1 - beta_1);  u = max(beta_2 * u, |g|);
    w -= lr * m / ((1 - beta_1^t) * (u + eps))."""

    def __init__(self, optimizer, **kwargs):
        super().__init__(optimizer, (SlotSpec("m", 0.0), SlotSpec("u", 0.0)), **kwargs)

    def _update(self, var, grad, state, values, dtype):
        opt = self.optimizer
        lr = self._lr(values, dtype)
        t = self._step(values, dtype)
        beta_1_power = tf.pow(_cast(opt.beta_1, dtype), t)
        m = state["m"] + (grad - state["m"]) * _one_minus(opt.beta_1, dtype)
        u = tf.maximum(_mixed(opt.beta_2, dtype) * state["u"], tf.abs(grad))
        epsilon = _mixed(opt.epsilon, dtype)
        var = var - (lr * m) / ((1 - beta_1_power) * (u + epsilon))
        return var, {"m": m, "u": u}


class _KerasNadam(_KerasRule):
    """keras Nadam:
        u_t = beta_1 * (1 - 0.5 * 0.96^t),  u_{t+1} likewise,  U_t = prod_{i<=t} u_i
        m += (g - m) * (1 - beta_1);  v += (g^2 - v) * (1 - beta_2)
        m_hat = u_{t+1} m / (1 - U_t u_{t+1}) + (1 - u_t) g / (1 - U_t)
        w -= lr * m_hat / (sqrt(v / (1 - beta_2^t)) + eps)
    U_t (Keras: the `u_product` variable) comes from step_values, in closed form.
    """

    def __init__(self, optimizer, **kwargs):
        super().__init__(optimizer, (SlotSpec("m", 0.0), SlotSpec("v", 0.0)), **kwargs)

    def _extra_step_values(self, step):
        beta_1 = _call_if_callable(self.optimizer.beta_1)
        return {"u_product": _nadam_momentum_product(beta_1, 1.0, step)}

    def _update(self, var, grad, state, values, dtype):
        opt = self.optimizer
        lr = self._lr(values, dtype)
        t = self._step(values, dtype)
        # Nadam casts 0.96, beta_1 and beta_2 first, then computes 1 - beta in `dtype`.
        decay = _cast(0.96, dtype)
        beta_1 = _cast(opt.beta_1, dtype)
        beta_2 = _cast(opt.beta_2, dtype)
        u_t = beta_1 * (1.0 - 0.5 * tf.pow(decay, t))
        u_t_1 = beta_1 * (1.0 - 0.5 * tf.pow(decay, t + 1))
        u_product_t = tf.cast(values["u_product"], dtype)
        u_product_t_1 = u_product_t * u_t_1
        beta_2_power = tf.pow(beta_2, t)
        m = state["m"] + (grad - state["m"]) * (1 - beta_1)
        v = state["v"] + (tf.square(grad) - state["v"]) * (1 - beta_2)
        m_hat = u_t_1 * m / (1 - u_product_t_1) + (1 - u_t) * grad / (1 - u_product_t)
        v_hat = v / (1 - beta_2_power)
        epsilon = _mixed(opt.epsilon, dtype)
        var = var - (m_hat * lr) / (tf.sqrt(v_hat) + epsilon)
        return var, {"m": m, "v": v}


class _KerasFtrl(_KerasRule):
    """keras Ftrl (p = learning_rate_power, usually -0.5):
        g' = g + 2 * l2_shrinkage * w;  n' = n + g^2
        z += g' - (n'^-p - n^-p) / lr * w
        w = (clip(z, -l1, l1) - z) / (n'^-p / lr + 2 * (l2 + beta / (2 lr)));  n = n'
    """

    def __init__(self, optimizer, **kwargs):
        slots = (
            SlotSpec("accumulator", float(optimizer.initial_accumulator_value)),
            SlotSpec("linear", 0.0),
        )
        super().__init__(optimizer, slots, **kwargs)

    def _update(self, var, grad, state, values, dtype):
        opt = self.optimizer
        lr = self._lr(values, dtype)
        lr_power = _mixed(opt.learning_rate_power, dtype)
        l1 = _mixed(opt.l1_regularization_strength, dtype)
        l2_reg = (
            _mixed(opt.l2_regularization_strength, dtype)
            + _mixed(opt.beta, dtype) / (2.0 * lr)
        )
        shrinkage = _call_if_callable(opt.l2_shrinkage_regularization_strength)
        grad_to_use = grad + _mixed(2 * shrinkage, dtype) * var
        accum, linear = state["accumulator"], state["linear"]
        new_accum = accum + tf.square(grad)
        linear = linear + (
            grad_to_use - (tf.pow(new_accum, -lr_power) - tf.pow(accum, -lr_power)) / lr * var
        )
        quadratic = tf.pow(new_accum, -lr_power) / lr + 2 * l2_reg
        linear_clipped = tf.clip_by_value(linear, -l1, l1)
        var = (linear_clipped - linear) / quadratic
        return var, {"accumulator": new_accum, "linear": linear}


# --------------------------------------------------------------------------------------
# Formulas of the TensorFlow training kernels, shared by TF1 and legacy tf_keras
# --------------------------------------------------------------------------------------


def _kernel_pow(accum, lr_power):
    """accum ** -lr_power; the Ftrl kernels use sqrt when lr_power == -0.5."""
    return tf.where(tf.equal(lr_power, -0.5), tf.sqrt(accum), tf.pow(accum, -lr_power))


def _kernel_ftrl(var, grad, accum, linear, lr, l1, l2, l2_shrinkage, lr_power):
    """(Resource)SparseApplyFtrl(V2) (training_ops.cc, ComputeFtrl):
        g' = g + 2 * l2_shrinkage * w  (V2 only; pass None for ApplyFtrl)
        n' = n + g^2;  z += g' - (n'^-p - n^-p) / lr * w
        w = (clip(z, -l1, l1) - z) / (n'^-p / lr + 2 * l2);  n = n'
    `l2` already includes beta / (2 lr).
    """
    grad_with_shrinkage = grad if l2_shrinkage is None else grad + 2 * l2_shrinkage * var
    new_accum = accum + tf.square(grad)
    linear = linear + (
        grad_with_shrinkage - (_kernel_pow(new_accum, lr_power) - _kernel_pow(accum, lr_power))
        / lr * var
    )
    quadratic = _kernel_pow(new_accum, lr_power) / lr + 2 * l2
    var = (tf.clip_by_value(linear, -l1, l1) - linear) / quadratic
    return var, new_accum, linear


def _kernel_adadelta(var, grad, accum, accum_update, lr, rho, epsilon):
    """(Resource)SparseApplyAdadelta:
        acc = acc * rho + g^2 * (1 - rho)
        upd = sqrt(acc_upd + eps) * rsqrt(acc + eps) * g;  w -= upd * lr
        acc_upd = acc_upd * rho + upd^2 * (1 - rho)
    """
    accum = accum * rho + tf.square(grad) * (1 - rho)
    update = tf.sqrt(accum_update + epsilon) * tf.math.rsqrt(accum + epsilon) * grad
    var = var - update * lr
    accum_update = accum_update * rho + tf.square(update) * (1 - rho)
    return var, accum, accum_update


def _kernel_rmsprop(var, grad, ms, mom, mg, lr, rho, momentum, epsilon):
    """(Resource)SparseApply(Centered)RMSProp (pass mg=None for the plain one):
        ms = ms * rho + g^2 * (1 - rho);  mg = mg * rho + g * (1 - rho)
        mom = mom * momentum + rsqrt(ms + eps - mg^2) * lr * g;  w -= mom
    """
    ms = ms * rho + tf.square(grad) * (1 - rho)
    if mg is None:
        denominator = ms + epsilon
    else:
        mg = mg * rho + grad * (1 - rho)
        denominator = ms + epsilon - tf.square(mg)
    mom = mom * momentum + tf.math.rsqrt(denominator) * lr * grad
    return var - mom, ms, mom, mg


def _kernel_adam_coefficients(lr, beta_1, beta_2, beta_1_power, beta_2_power, epsilon):
    """(lr_t, beta_1, 1 - beta_1, beta_2, 1 - beta_2, epsilon): the scalars of `_kernel_adam`
    (and of the fused rule "adam_kernel")."""
    lr_t = lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)
    return lr_t, beta_1, 1 - beta_1, beta_2, 1 - beta_2, epsilon


def _kernel_adam(var, grad, m, v, vhat, coefficients):
    """Adam's sparse path (TF1 AdamOptimizer._apply_sparse_shared, legacy Keras Adam):
        lr_t = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)
        m = m * beta_1 + g * (1 - beta_1);  v = v * beta_2 + g^2 * (1 - beta_2)
        vhat = max(vhat, v) (amsgrad, then used for v);  w -= lr_t * m / (sqrt(v) + eps)
    `coefficients` from `_kernel_adam_coefficients`.
    """
    lr_t, beta_1, one_minus_beta_1, beta_2, one_minus_beta_2, epsilon = coefficients
    m = m * beta_1 + grad * one_minus_beta_1
    v = v * beta_2 + (grad * grad) * one_minus_beta_2
    v_used = v
    if vhat is not None:
        vhat = tf.maximum(vhat, v)
        v_used = vhat
    var = var - lr_t * m / (tf.sqrt(v_used) + epsilon)
    return var, m, v, vhat


# --------------------------------------------------------------------------------------
# tf_keras legacy optimizers (OptimizerV2)
# --------------------------------------------------------------------------------------


class _LegacyRule(SparseRule):
    """tf_keras.optimizers.legacy: hyperparameters live in `_hyper` (float32 variables)."""

    def _hyper(self, name, dtype):
        # Read `_hyper` directly: `_get_hyper` would create the hyperparameter
        # variables on first use.  A Python value becomes float32 first, as the
        # variable it would become.
        return _cast(self.optimizer._hyper[name], dtype)

    def _learning_rate(self, step):
        """OptimizerV2._decayed_lr: schedule(iterations), then lr / (1 + decay * iterations)."""
        lr = self.optimizer._hyper["learning_rate"]
        iterations = tf.cast(step - 1, tf.float32)
        if _is_schedule(lr):
            lr = tf.cast(lr(iterations), tf.float32)
        else:
            lr = _cast(lr, tf.float32)
        decay = self.optimizer._initial_decay
        if decay > 0.0:
            lr = lr / (1.0 + tf.cast(decay, tf.float32) * iterations)
        return lr


class _LegacySGD(_LegacyRule):
    """legacy SGD, (Resource)SparseApplyKerasMomentum:
        m = m * momentum - g * lr;  w += m, or with nesterov w += m * momentum - g * lr;
        without momentum w -= g * lr.
    """

    def __init__(self, optimizer):
        slots = (SlotSpec("momentum", 0.0),) if optimizer._momentum else ()
        super().__init__(optimizer, slots)

    def _update(self, var, grad, state, values, dtype):
        lr = self._lr(values, dtype)
        if not self.optimizer._momentum:
            return var - grad * lr, {}
        momentum = self._hyper("momentum", dtype)
        return _momentum_step(var, grad, state["momentum"], momentum, lr, self.optimizer.nesterov)

    def _fused(self, values, dtype):
        if not self.optimizer._momentum:
            return None  # no slot: nothing to fuse
        momentum = self._hyper("momentum", dtype)
        return _momentum_rule(self.optimizer.nesterov), (self._lr(values, dtype), momentum)


class _LegacyAdam(_LegacyRule):
    """legacy Adam / NonFusedAdam: `_kernel_adam` with float32 hyperparameters."""

    def __init__(self, optimizer):
        slots = [SlotSpec("m", 0.0), SlotSpec("v", 0.0)]
        if optimizer.amsgrad:
            slots.append(SlotSpec("vhat", 0.0))
        super().__init__(optimizer, tuple(slots))

    def _coefficients(self, values, dtype):
        t = self._step(values, dtype)
        beta_1 = self._hyper("beta_1", dtype)
        beta_2 = self._hyper("beta_2", dtype)
        return _kernel_adam_coefficients(
            self._lr(values, dtype), beta_1, beta_2, tf.pow(beta_1, t), tf.pow(beta_2, t),
            tf.constant(self.optimizer.epsilon, dtype),
        )

    def _fused(self, values, dtype):
        if self.optimizer.amsgrad:
            return None
        return "adam_kernel", self._coefficients(values, dtype)

    def _update(self, var, grad, state, values, dtype):
        var, m, v, vhat = _kernel_adam(
            var, grad, state["m"], state["v"], state.get("vhat"), self._coefficients(values, dtype)
        )
        new_state = {"m": m, "v": v}
        if vhat is not None:
            new_state["vhat"] = vhat
        return var, new_state


class _LegacyAdagrad(_LegacyRule):
    """legacy Adagrad, (Resource)SparseApplyAdagradV2:
        acc += g^2;  w -= lr * g / (sqrt(acc) + eps)   (eps outside the sqrt)."""

    def __init__(self, optimizer):
        initial = float(optimizer._initial_accumulator_value)
        super().__init__(optimizer, (SlotSpec("accumulator", initial),))

    def _fused(self, values, dtype):
        return "adagrad_v2", (self._lr(values, dtype), tf.constant(self.optimizer.epsilon, dtype))

    def _update(self, var, grad, state, values, dtype):
        lr, epsilon = self._fused(values, dtype)[1]
        accumulator = state["accumulator"] + tf.square(grad)
        var = var - lr * grad / (tf.sqrt(accumulator) + epsilon)
        return var, {"accumulator": accumulator}


class _LegacyRMSprop(_LegacyRule):
    """legacy RMSprop.  With momentum: `_kernel_rmsprop` (eps inside the sqrt).
    Without momentum (Python code, eps outside the sqrt):
        rms = rho * rms + (1 - rho) * g^2;  mg = rho * mg + (1 - rho) * g (centered)
        w -= lr * g / (sqrt(rms - mg^2) + eps)
    """

    def __init__(self, optimizer):
        slots = [SlotSpec("rms", 0.0)]
        if optimizer._momentum:
            slots.append(SlotSpec("momentum", 0.0))
        if optimizer.centered:
            slots.append(SlotSpec("mg", 0.0))
        super().__init__(optimizer, tuple(slots))

    def _update(self, var, grad, state, values, dtype):
        opt = self.optimizer
        lr = self._lr(values, dtype)
        rho = self._hyper("rho", dtype)
        epsilon = tf.constant(opt.epsilon, dtype)
        if opt._momentum:
            var, rms, mom, mg = _kernel_rmsprop(
                var, grad, state["rms"], state["momentum"], state.get("mg"), lr, rho,
                self._hyper("momentum", dtype), epsilon,
            )
            new_state = {"rms": rms, "momentum": mom}
            if opt.centered:
                new_state["mg"] = mg
            return var, new_state
        rms = rho * state["rms"] + (1.0 - rho) * tf.square(grad)
        new_state = {"rms": rms}
        denominator = rms
        if opt.centered:
            mg = rho * state["mg"] + (1.0 - rho) * grad
            new_state["mg"] = mg
            denominator = rms - tf.square(mg)
        var = var - lr * grad / (tf.sqrt(denominator) + epsilon)
        return var, new_state


class _LegacyAdadelta(_LegacyRule):
    """legacy Adadelta: `_kernel_adadelta`."""

    def __init__(self, optimizer):
        super().__init__(optimizer, (SlotSpec("accum_grad", 0.0), SlotSpec("accum_var", 0.0)))

    def _update(self, var, grad, state, values, dtype):
        var, accum_grad, accum_var = _kernel_adadelta(
            var, grad, state["accum_grad"], state["accum_var"], self._lr(values, dtype),
            self._hyper("rho", dtype), tf.constant(self.optimizer.epsilon, dtype),
        )
        return var, {"accum_grad": accum_grad, "accum_var": accum_var}


class _LegacyAdamax(_LegacyRule):
    """legacy Adamax (sparse path):
        m = m * beta_1 + g * (1 - beta_1);  v = max(v * beta_2, |g|)
        w += -lr / (1 - beta_1^t) * (m / (v + eps))
    """

    def __init__(self, optimizer):
        super().__init__(optimizer, (SlotSpec("m", 0.0), SlotSpec("v", 0.0)))

    def _update(self, var, grad, state, values, dtype):
        t = self._step(values, dtype)
        beta_1 = self._hyper("beta_1", dtype)
        beta_2 = self._hyper("beta_2", dtype)
        neg_scaled_lr = -self._lr(values, dtype) / (1 - tf.pow(beta_1, t))
        m = state["m"] * beta_1 + grad * (1 - beta_1)
        v = tf.maximum(state["v"] * beta_2, tf.abs(grad))
        var = var + neg_scaled_lr * (m / (v + tf.constant(self.optimizer.epsilon, dtype)))
        return var, {"m": m, "v": v}


class _LegacyNadam(_LegacyRule):
    """legacy Nadam (d = schedule_decay, default 0.004):
        mu_t = beta_1 * (1 - 0.5 * 0.96^(d t)),  M_t = prod_{i<=t} mu_i  (the `m_cache`)
        g' = g / (1 - M_t);  m = beta_1 m + (1 - beta_1) g;  m' = m / (1 - M_t mu_{t+1})
        v = beta_2 v + (1 - beta_2) g^2;  v' = v / (1 - beta_2^t)
        w -= lr * ((1 - mu_t) g' + mu_{t+1} m') / (sqrt(v') + eps)
    The learning rate is the plain hyperparameter (legacy Nadam ignores `decay` for it).
    """

    def __init__(self, optimizer):
        super().__init__(optimizer, (SlotSpec("m", 0.0), SlotSpec("v", 0.0)))

    def _learning_rate(self, step):
        return _cast(self.optimizer._hyper["learning_rate"], tf.float32)

    def _extra_step_values(self, step):
        beta_1 = self._hyper("beta_1", tf.float32)
        product = _nadam_momentum_product(beta_1, float(self.optimizer._initial_decay), step)
        return {"m_schedule": product}

    def _update(self, var, grad, state, values, dtype):
        opt = self.optimizer
        lr = self._lr(values, dtype)
        t = self._step(values, dtype)
        beta_1 = self._hyper("beta_1", dtype)
        beta_2 = self._hyper("beta_2", dtype)
        decay_base = tf.constant(0.96, dtype)
        m_t = beta_1 * (1.0 - 0.5 * tf.pow(decay_base, opt._initial_decay * t))
        m_t_1 = beta_1 * (1.0 - 0.5 * tf.pow(decay_base, opt._initial_decay * (t + 1)))
        m_schedule_new = tf.cast(values["m_schedule"], dtype)
        m_schedule_next = m_schedule_new * m_t_1
        g_prime = grad / (1.0 - m_schedule_new)
        m = state["m"] * beta_1 + grad * (1 - beta_1)
        m_prime = m / (1.0 - m_schedule_next)
        v = state["v"] * beta_2 + (grad * grad) * (1 - beta_2)
        v_prime = v / (1.0 - tf.pow(beta_2, t))
        m_bar = (1.0 - m_t) * g_prime + m_t_1 * m_prime
        var = var + (-lr) * m_bar / (tf.sqrt(v_prime) + tf.constant(opt.epsilon, dtype))
        return var, {"m": m, "v": v}


class _LegacyFtrl(_LegacyRule):
    """legacy Ftrl: `_kernel_ftrl` with l2 + beta / (2 lr); V2 when l2_shrinkage > 0."""

    def __init__(self, optimizer):
        slots = (
            SlotSpec("accumulator", float(optimizer._initial_accumulator_value)),
            SlotSpec("linear", 0.0),
        )
        super().__init__(optimizer, slots)

    def _update(self, var, grad, state, values, dtype):
        opt = self.optimizer
        lr = self._lr(values, dtype)
        l2 = self._hyper("l2_regularization_strength", dtype) + self._hyper("beta", dtype) / (
            2.0 * lr
        )
        shrinkage = None
        if opt._l2_shrinkage_regularization_strength > 0.0:
            shrinkage = tf.cast(opt._l2_shrinkage_regularization_strength, dtype)
        var, accum, linear = _kernel_ftrl(
            var, grad, state["accumulator"], state["linear"], lr,
            self._hyper("l1_regularization_strength", dtype), l2, shrinkage,
            self._hyper("learning_rate_power", dtype),
        )
        return var, {"accumulator": accum, "linear": linear}


# --------------------------------------------------------------------------------------
# tf.compat.v1.train optimizers
# --------------------------------------------------------------------------------------


class _TF1Rule(SparseRule):
    """tf.compat.v1.train: hyperparameters are Python values, tensors or callables,
    converted with `convert_to_tensor` (float32 for Python floats) and cast."""

    _lr_attribute = "_learning_rate"

    def _learning_rate(self, step):
        return tf.convert_to_tensor(_call_if_callable(getattr(self.optimizer, self._lr_attribute)))

    def _const(self, attribute, dtype):
        return _cast(getattr(self.optimizer, attribute), dtype)


class _TF1GradientDescent(_TF1Rule):
    """GradientDescentOptimizer (sparse: scatter_add of -g * lr):  w -= g * lr."""

    def _update(self, var, grad, state, values, dtype):
        return var - grad * self._lr(values, dtype), {}


class _TF1Momentum(_TF1Rule):
    """MomentumOptimizer, (Resource)SparseApplyMomentum:
        a = a * momentum + g;  w -= lr * a, or with nesterov w -= lr * g + lr * momentum * a."""

    def __init__(self, optimizer):
        super().__init__(optimizer, (SlotSpec("momentum", 0.0),))

    def _fused(self, values, dtype):
        lr = self._lr(values, dtype)
        momentum = self._const("_momentum", dtype)
        rule = "nesterov" if self.optimizer._use_nesterov else "momentum"
        return rule, (lr, momentum, lr * momentum)

    def _update(self, var, grad, state, values, dtype):
        lr, momentum, lr_momentum = self._fused(values, dtype)[1]
        accum = state["momentum"] * momentum + grad
        if self.optimizer._use_nesterov:
            var = var - (lr * grad + lr_momentum * accum)
        else:
            var = var - lr * accum
        return var, {"momentum": accum}


class _TF1Adam(_TF1Rule):
    """AdamOptimizer: `_kernel_adam`.  TF1 keeps beta^t in float32 variables,
    multiplied by beta after every step; here it is float32 pow(beta, t) instead.
    The two differ by float32 round-off, which 1 - beta_2^t magnifies while
    beta_2^t is close to 1 (about 1e-5 relative in the step size around t = 3 for
    beta_2 = 0.999, shrinking as t grows)."""

    _lr_attribute = "_lr"

    def __init__(self, optimizer):
        super().__init__(optimizer, (SlotSpec("m", 0.0), SlotSpec("v", 0.0)))

    def _coefficients(self, values, dtype):
        t = tf.cast(values["step"], tf.float32)
        beta_1 = tf.convert_to_tensor(_call_if_callable(self.optimizer._beta1))
        beta_2 = tf.convert_to_tensor(_call_if_callable(self.optimizer._beta2))
        beta_1_power = tf.cast(tf.pow(beta_1, tf.cast(t, beta_1.dtype)), dtype)
        beta_2_power = tf.cast(tf.pow(beta_2, tf.cast(t, beta_2.dtype)), dtype)
        return _kernel_adam_coefficients(
            self._lr(values, dtype), tf.cast(beta_1, dtype), tf.cast(beta_2, dtype),
            beta_1_power, beta_2_power, self._const("_epsilon", dtype),
        )

    def _fused(self, values, dtype):
        return "adam_kernel", self._coefficients(values, dtype)

    def _update(self, var, grad, state, values, dtype):
        var, m, v, _ = _kernel_adam(
            var, grad, state["m"], state["v"], None, self._coefficients(values, dtype)
        )
        return var, {"m": m, "v": v}


class _TF1Adagrad(_TF1Rule):
    """AdagradOptimizer, (Resource)SparseApplyAdagrad:  acc += g^2;  w -= lr * g * rsqrt(acc)."""

    def __init__(self, optimizer):
        initial = float(optimizer._initial_accumulator_value)
        super().__init__(optimizer, (SlotSpec("accumulator", initial),))

    def _update(self, var, grad, state, values, dtype):
        accumulator = state["accumulator"] + tf.square(grad)
        var = var - self._lr(values, dtype) * grad * tf.math.rsqrt(accumulator)
        return var, {"accumulator": accumulator}


class _TF1Adadelta(_TF1Rule):
    """AdadeltaOptimizer: `_kernel_adadelta`."""

    _lr_attribute = "_lr"

    def __init__(self, optimizer):
        super().__init__(optimizer, (SlotSpec("accum_grad", 0.0), SlotSpec("accum_var", 0.0)))

    def _update(self, var, grad, state, values, dtype):
        var, accum_grad, accum_var = _kernel_adadelta(
            var, grad, state["accum_grad"], state["accum_var"], self._lr(values, dtype),
            self._const("_rho", dtype), self._const("_epsilon", dtype),
        )
        return var, {"accum_grad": accum_grad, "accum_var": accum_var}


class _TF1RMSProp(_TF1Rule):
    """RMSPropOptimizer: `_kernel_rmsprop` (always with a momentum slot; the `rms`
    slot starts at 1.0, as TF1 initialises it with ones; `decay` is rho)."""

    def __init__(self, optimizer):
        slots = [SlotSpec("rms", 1.0), SlotSpec("momentum", 0.0)]
        if optimizer._centered:
            slots.append(SlotSpec("mg", 0.0))
        super().__init__(optimizer, tuple(slots))

    def _update(self, var, grad, state, values, dtype):
        var, rms, mom, mg = _kernel_rmsprop(
            var, grad, state["rms"], state["momentum"], state.get("mg"), self._lr(values, dtype),
            self._const("_decay", dtype), self._const("_momentum", dtype),
            self._const("_epsilon", dtype),
        )
        new_state = {"rms": rms, "momentum": mom}
        if self.optimizer._centered:
            new_state["mg"] = mg
        return var, new_state


class _TF1Ftrl(_TF1Rule):
    """FtrlOptimizer: `_kernel_ftrl`, l2 adjusted by beta / (2 max(lr, 1e-36)) as in
    its `_prepare`; V2 (with shrinkage) when l2_shrinkage > 0."""

    def __init__(self, optimizer):
        slots = (
            SlotSpec("accumulator", float(optimizer._initial_accumulator_value)),
            SlotSpec("linear", 0.0),
        )
        super().__init__(optimizer, slots)

    def _update(self, var, grad, state, values, dtype):
        opt = self.optimizer
        lr = opt._learning_rate
        if _is_number(lr):
            # TF1 computes this in Python (double) and converts the result once.
            adjusted_l2 = opt._l2_regularization_strength + opt._beta / (2.0 * max(lr, 1e-36))
        else:
            adjusted_l2 = opt._l2_regularization_strength + opt._beta / (
                2.0 * tf.maximum(lr, 1e-36)
            )
        shrinkage = None
        if opt._l2_shrinkage_regularization_strength > 0.0:
            shrinkage = self._const("_l2_shrinkage_regularization_strength", dtype)
        var, accum, linear = _kernel_ftrl(
            var, grad, state["accumulator"], state["linear"], self._lr(values, dtype),
            self._const("_l1_regularization_strength", dtype), _cast(adjusted_l2, dtype),
            shrinkage, self._const("_learning_rate_power", dtype),
        )
        return var, {"accumulator": accum, "linear": linear}


class _TF1ProximalAdagrad(_TF1Rule):
    """ProximalAdagradOptimizer, (Resource)SparseApplyProximalAdagrad:
        acc += g^2;  a = lr * rsqrt(acc);  p = w - g * a
        w = sign(p) * max(|p| - a * l1, 0) / (1 + l2 * a)
    (the kernel's l1 == 0 branch, p / (1 + l2 * a), gives the same bits: sign(p) * |p| == p).
    """

    def __init__(self, optimizer):
        initial = float(optimizer._initial_accumulator_value)
        super().__init__(optimizer, (SlotSpec("accumulator", initial),))

    def _update(self, var, grad, state, values, dtype):
        l1 = self._const("_l1_regularization_strength", dtype)
        l2 = self._const("_l2_regularization_strength", dtype)
        accumulator = state["accumulator"] + tf.square(grad)
        learning_rate = self._lr(values, dtype) * tf.math.rsqrt(accumulator)
        prox = var - grad * learning_rate
        var = (
            tf.sign(prox) * tf.maximum(tf.abs(prox) - learning_rate * l1, 0.0)
            / (1.0 + l2 * learning_rate)
        )
        return var, {"accumulator": accumulator}


# --------------------------------------------------------------------------------------
# Dispatch
# --------------------------------------------------------------------------------------

_KERAS_RULES = (
    # Most specific first: Keras 3 AdamW subclasses Adam.
    ("AdamW", _KerasAdam),
    ("Adam", _KerasAdam),
    ("SGD", _KerasSGD),
    ("Adagrad", _KerasAdagrad),
    ("RMSprop", _KerasRMSprop),
    ("Adadelta", _KerasAdadelta),
    ("Adamax", _KerasAdamax),
    ("Nadam", _KerasNadam),
    ("Ftrl", _KerasFtrl),
)

_LEGACY_RULES = (
    ("SGD", _LegacySGD),
    ("Adam", _LegacyAdam),
    ("Adagrad", _LegacyAdagrad),
    ("RMSprop", _LegacyRMSprop),
    ("Adadelta", _LegacyAdadelta),
    ("Adamax", _LegacyAdamax),
    ("Nadam", _LegacyNadam),
    ("Ftrl", _LegacyFtrl),
)

_TF1_RULES = (
    ("GradientDescentOptimizer", _TF1GradientDescent),
    ("MomentumOptimizer", _TF1Momentum),
    ("AdamOptimizer", _TF1Adam),
    ("AdagradOptimizer", _TF1Adagrad),
    ("AdadeltaOptimizer", _TF1Adadelta),
    ("RMSPropOptimizer", _TF1RMSProp),
    ("FtrlOptimizer", _TF1Ftrl),
    ("ProximalAdagradOptimizer", _TF1ProximalAdagrad),
)


def _keras3_optimizers():
    """Keras 3's optimizers module, if Keras 3 is imported (else its instances can't exist)."""
    keras = sys.modules.get("keras")
    if keras is None or not str(getattr(keras, "__version__", "")).startswith("3"):
        return None
    return keras.optimizers


def _tf_keras_optimizers():
    """tf_keras's optimizers module, if tf_keras is imported (else its instances can't exist)."""
    tf_keras = sys.modules.get("tf_keras")
    return None if tf_keras is None else tf_keras.optimizers


def _legacy_classes(optimizers):
    classes = [(getattr(optimizers.legacy, name), rule) for name, rule in _LEGACY_RULES]
    legacy_adam = sys.modules.get("tf_keras.src.optimizers.legacy.adam")
    non_fused = getattr(legacy_adam, "NonFusedAdam", None)
    if non_fused is not None:
        classes.append((non_fused, _LegacyAdam))
    return classes


def _check_keras_options(optimizer):
    if getattr(optimizer, "use_ema", False):
        raise ValueError(
            f"{type(optimizer).__name__}(use_ema=True) is not supported by dynamic-embedding "
            "sparse updates yet: create the optimizer without `use_ema`."
        )
    if getattr(optimizer, "gradient_accumulation_steps", None):
        raise ValueError(
            f"{type(optimizer).__name__}(gradient_accumulation_steps="
            f"{optimizer.gradient_accumulation_steps}) is not supported by dynamic-embedding "
            "sparse updates yet: create the optimizer without `gradient_accumulation_steps`."
        )


def _supported_names():
    return (
        [f"keras.optimizers.{name}" for name, _ in _KERAS_RULES]
        + [f"tf_keras.optimizers.{name}" for name, _ in _KERAS_RULES]
        + [f"tf_keras.optimizers.legacy.{name}" for name, _ in _LEGACY_RULES]
        + [f"tf.compat.v1.train.{name}" for name, _ in _TF1_RULES]
    )


def get_rule(optimizer) -> SparseRule:
    """The `SparseRule` reproducing `optimizer`'s update on rows.

    Raises:
      TypeError: the optimizer's class is not supported (the message lists those that are).
      ValueError: the optimizer uses an option rules cannot reproduce
        (`use_ema`, `gradient_accumulation_steps`).
    """
    keras_optimizers = _keras3_optimizers()
    if keras_optimizers is not None:
        for name, rule in _KERAS_RULES:
            if isinstance(optimizer, getattr(keras_optimizers, name)):
                _check_keras_options(optimizer)
                return rule(optimizer)

    tf_keras_optimizers = _tf_keras_optimizers()
    if tf_keras_optimizers is not None:
        for name, rule in _KERAS_RULES:
            if isinstance(optimizer, getattr(tf_keras_optimizers, name)):
                _check_keras_options(optimizer)
                return rule(optimizer, tf_keras=True)
        for cls, rule in _legacy_classes(tf_keras_optimizers):
            if isinstance(optimizer, cls):
                return rule(optimizer)

    for name, rule in _TF1_RULES:
        if isinstance(optimizer, getattr(tf.compat.v1.train, name)):
            return rule(optimizer)

    cls = type(optimizer)
    raise TypeError(
        f"Dynamic-embedding sparse updates do not support the optimizer "
        f"{cls.__module__}.{cls.__qualname__}. Supported: {', '.join(_supported_names())}."
    )
