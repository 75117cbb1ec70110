"""Rules of the `tf.compat.v1.train` optimizers (formulas of the `ResourceSparseApply*`
kernels and of TF1 Adam's sparse path)."""

from __future__ import annotations

import tensorflow as tf

from tensorflow_dynemb.training.rules.base import (
    SlotSpec,
    SparseRule,
    _call_if_callable,
    _cast,
    _is_number,
)
from tensorflow_dynemb.training.rules.kernels import (
    _kernel_adadelta,
    _kernel_adam,
    _kernel_adam_coefficients,
    _kernel_ftrl,
    _kernel_rmsprop,
)


class _TF1Rule(SparseRule):
    """tf.compat.v1.train: hyperparameters are Python values, tensors or callables,
    converted with `convert_to_tensor` (float32 for Python floats) and cast."""

    _lr_attribute = "_learning_rate"

    def _learning_rate(self, step):
        return tf.convert_to_tensor(_call_if_callable(getattr(self.optimizer, self._lr_attribute)))

    def _const(self, attribute, dtype):
        return _cast(getattr(self.optimizer, attribute), dtype)

    def create_non_slot_variables(self, colocate_with) -> None:
        """Creates the optimizer's own per-step variables that the rule reads (none
        but Adam's beta powers), as its `_create_slots` would."""

    def finish_step(self) -> list:
        """The optimizer's `_finish` for a step that applied no dense gradient (the
        optimizer then does not run it): the ops advancing its per-step variables."""
        return []


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
    """AdamOptimizer: `_kernel_adam`, with the bias corrections of the optimizer's own
    `beta1_power` / `beta2_power` variables.

    TF1 keeps beta^t in float32 variables, multiplied by beta after every step (in
    `_finish`); float32 pow(beta, t) rounds differently, and 1 - beta_2^t magnifies
    that while beta_2^t is close to 1 (rows 3e-6 apart after 10 steps of lr 1.0). So
    the rule reads those variables, shared with the dense variables as in TFRA: the
    TF1 wrapper creates them (`create_non_slot_variables`) and advances them in a step
    that applies no dense gradient, where the optimizer's `_finish` does not run
    (`finish_step`). A rule used on its own, without them, computes pow(beta, t)."""

    _lr_attribute = "_lr"

    def __init__(self, optimizer):
        super().__init__(optimizer, (SlotSpec("m", 0.0), SlotSpec("v", 0.0)))

    def create_non_slot_variables(self, colocate_with) -> None:
        # What AdamOptimizer._create_slots creates (it finds them made if it runs later).
        opt = self.optimizer
        opt._create_non_slot_variable(opt._beta1, name="beta1_power", colocate_with=colocate_with)
        opt._create_non_slot_variable(opt._beta2, name="beta2_power", colocate_with=colocate_with)

    def finish_step(self) -> list:
        # AdamOptimizer._finish: beta^(t+1) = beta^t * beta, in float32.
        beta_1_power, beta_2_power = self.optimizer._get_beta_accumulators()
        return [
            beta_1_power.assign(beta_1_power * self._beta("_beta1")),
            beta_2_power.assign(beta_2_power * self._beta("_beta2")),
        ]

    def _beta(self, attribute):
        return tf.convert_to_tensor(_call_if_callable(getattr(self.optimizer, attribute)))

    def _extra_step_values(self, step):
        powers = self.optimizer._get_beta_accumulators()
        if any(power is None for power in powers):  # a rule used on its own
            powers = [
                tf.pow(beta, tf.cast(step, beta.dtype))
                for beta in (self._beta("_beta1"), self._beta("_beta2"))
            ]
        else:
            powers = [tf.identity(power) for power in powers]
        return {"beta_1_power": powers[0], "beta_2_power": powers[1]}

    def _coefficients(self, values, dtype):
        return _kernel_adam_coefficients(
            self._lr(values, dtype), _cast(self._beta("_beta1"), dtype),
            _cast(self._beta("_beta2"), dtype), tf.cast(values["beta_1_power"], dtype),
            tf.cast(values["beta_2_power"], dtype), self._const("_epsilon", dtype),
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
    """AdadeltaOptimizer: `_kernel_adadelta` (slots named as TF1's: `accum`, `accum_update`)."""

    _lr_attribute = "_lr"

    def __init__(self, optimizer):
        super().__init__(optimizer, (SlotSpec("accum", 0.0), SlotSpec("accum_update", 0.0)))

    def _update(self, var, grad, state, values, dtype):
        var, accum, accum_update = _kernel_adadelta(
            var, grad, state["accum"], state["accum_update"], self._lr(values, dtype),
            self._const("_rho", dtype), self._const("_epsilon", dtype),
        )
        return var, {"accum": accum, "accum_update": accum_update}


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
    its `_prepare`; V2 (with shrinkage) when l2_shrinkage > 0. Slots named as TF1's:
    `accum`, `linear`."""

    def __init__(self, optimizer):
        slots = (
            SlotSpec("accum", float(optimizer._initial_accumulator_value)),
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
            var, grad, state["accum"], state["linear"], self._lr(values, dtype),
            self._const("_l1_regularization_strength", dtype), _cast(adjusted_l2, dtype),
            shrinkage, self._const("_learning_rate_power", dtype),
        )
        return var, {"accum": accum, "linear": linear}


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


class _TF1ProximalGradientDescent(_TF1Rule):
    """ProximalGradientDescentOptimizer, (Resource)SparseApplyProximalGradientDescent:
        p = w - g * lr
        w = sign(p) * max(|p| - lr * l1, 0) / (1 + l2 * lr)   (l1 > 0)
        w = p / (1 + l2 * lr)                                  (l1 == 0)
    The kernel computes rows of one element (dim 1) on another path, which divides in
    double by 1.0 + l2 * lr (a double): so does the rule for dim 1.
    """

    def _update(self, var, grad, state, values, dtype):
        lr = self._lr(values, dtype)
        l1 = self._const("_l1_regularization_strength", dtype)
        l2 = self._const("_l2_regularization_strength", dtype)
        prox = var - grad * lr
        shrunk = tf.where(l1 > 0, tf.sign(prox) * tf.maximum(tf.abs(prox) - lr * l1, 0.0), prox)
        if var.shape[-1] == 1:
            denominator = 1.0 + tf.cast(l2 * lr, tf.float64)
            return tf.cast(tf.cast(shrunk, tf.float64) / denominator, dtype), {}
        return shrunk / (1.0 + l2 * lr), {}


class _TF1AdagradDA(_TF1Rule):
    """AdagradDAOptimizer, (Resource)SparseApplyAdagradDA, with T = the optimizer's
    `global_step` + 1 (read before this step advances it, as its `_prepare` does):
        ga += g;  da += g^2
        w = -sign(ga) * max(|ga| / T - l1, 0) / (l2 + sqrt(da) / (T * lr))   (l1 > 0)
        w = -(ga / T) / (l2 + sqrt(da) / (T * lr))                          (l1 == 0)
    For rows of one element (dim 1) the kernel takes another path, in double, with
    the same value arranged differently: w = -ga * lr / (T * l2 * lr + sqrt(da)) (and
    sign(-ga) * lr * max(|ga| - T * l1, 0) / (...) for l1 > 0); so does the rule.
    """

    def __init__(self, optimizer):
        initial = float(optimizer._initial_gradient_squared_accumulator_value)
        slots = (
            SlotSpec("gradient_accumulator", 0.0),
            SlotSpec("gradient_squared_accumulator", initial),
        )
        super().__init__(optimizer, slots)

    def _extra_step_values(self, step):
        global_step = tf.cast(tf.identity(self.optimizer._global_step), tf.int64)
        return {"global_step": global_step + 1}

    def _update(self, var, grad, state, values, dtype):
        lr = self._lr(values, dtype)
        l1 = self._const("_l1_regularization_strength", dtype)
        l2 = self._const("_l2_regularization_strength", dtype)
        ga, da = state["gradient_accumulator"], state["gradient_squared_accumulator"]
        if var.shape[-1] == 1:
            var, ga, da = self._one_column(ga, da, grad, lr, l1, l2, values["global_step"], dtype)
        else:
            ga = ga + grad
            da = da + tf.square(grad)
            steps = tf.cast(values["global_step"], dtype)
            denominator = l2 + tf.sqrt(da) / (steps * lr)
            numerator = tf.where(
                l1 > 0, -tf.sign(ga) * tf.maximum(tf.abs(ga) / steps - l1, 0.0), -(ga / steps)
            )
            var = numerator / denominator
        return var, {"gradient_accumulator": ga, "gradient_squared_accumulator": da}

    @staticmethod
    def _one_column(ga, da, grad, lr, l1, l2, global_step, dtype):
        """The kernel's path for dim 1: doubles, rounded to `dtype` where it stores."""
        f64 = tf.float64
        g = tf.cast(grad, f64)
        ga = tf.cast(tf.cast(ga, f64) + g, dtype)
        da = tf.cast(tf.cast(da, f64) + g * g, dtype)
        lr, l1, l2, steps = (tf.cast(x, f64) for x in (lr, l1, l2, global_step))
        denominator = steps * l2 * lr + tf.cast(tf.sqrt(da), f64)
        with_l1 = (
            tf.cast(tf.sign(-ga), f64) * lr * tf.maximum(tf.cast(tf.abs(ga), f64) - steps * l1, 0.0)
        )
        numerator = tf.where(l1 > 0, with_l1, tf.cast(-ga, f64) * lr)
        return tf.cast(numerator / denominator, dtype), ga, da
