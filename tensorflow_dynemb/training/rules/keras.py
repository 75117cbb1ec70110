"""Rules of the Keras 3 and tf_keras (Keras 2 "new") optimizers: same attribute names,
same formulas (see base.py for the contract)."""

from __future__ import annotations

import tensorflow as tf

from tensorflow_dynemb.training.rules.base import (
    SlotSpec,
    SparseRule,
    _call_if_callable,
    _cast,
    _is_schedule,
    _is_zero,
    _mixed,
    _nadam_momentum_product,
    _one_minus,
)


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

    def _rho_coefficients(self, values, dtype):
        """(lr, rho, 1 - rho, epsilon) of this step: RMSprop's and Adadelta's scalars."""
        opt = self.optimizer
        return (self._lr(values, dtype), _mixed(opt.rho, dtype), _one_minus(opt.rho, dtype),
                _mixed(opt.epsilon, dtype))

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
        rule = "keras_adam_amsgrad" if self.optimizer.amsgrad else "keras_adam"
        return rule, self._coefficients(values, dtype)

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

    def _fused(self, values, dtype):
        if self._tf_keras:
            return None  # tf_keras multiplies by rsqrt, which C++ cannot round alike
        opt = self.optimizer
        rule = "keras_rmsprop" + ("_centered" if opt.centered else "")
        coefficients = self._rho_coefficients(values, dtype)
        if opt.momentum > 0:
            return rule + "_momentum", coefficients + (_mixed(opt.momentum, dtype),)
        return rule, coefficients

    def _update(self, var, grad, state, values, dtype):
        opt = self.optimizer
        lr, rho, one_minus_rho, epsilon = self._rho_coefficients(values, dtype)
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

    def _fused(self, values, dtype):
        if self._tf_keras:
            return None  # tf_keras rounds (1 - rho) * g * g, not (1 - rho) * g^2
        return "keras_adadelta", self._rho_coefficients(values, dtype)

    def _update(self, var, grad, state, values, dtype):
        lr, rho, one_minus_rho, epsilon = self._rho_coefficients(values, dtype)
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

    def _coefficients(self, values, dtype):
        """(lr, 1 - beta_1, beta_2, 1 - beta_1^t, epsilon) of this step."""
        opt = self.optimizer
        t = self._step(values, dtype)
        beta_1_power = tf.pow(_cast(opt.beta_1, dtype), t)
        return (self._lr(values, dtype), _one_minus(opt.beta_1, dtype), _mixed(opt.beta_2, dtype),
                1 - beta_1_power, _mixed(opt.epsilon, dtype))

    def _fused(self, values, dtype):
        return "keras_adamax", self._coefficients(values, dtype)

    def _update(self, var, grad, state, values, dtype):
        lr, one_minus_beta_1, beta_2, one_minus_beta_1_power, epsilon = self._coefficients(values, dtype)
        m = state["m"] + (grad - state["m"]) * one_minus_beta_1
        u = tf.maximum(beta_2 * state["u"], tf.abs(grad))
        var = var - (lr * m) / (one_minus_beta_1_power * (u + epsilon))
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

    def _coefficients(self, values, dtype):
        """(lr, 1 - beta_1, 1 - beta_2, u_{t+1}, 1 - U_{t+1}, 1 - u_t, 1 - U_t,
        1 - beta_2^t, epsilon) of this step."""
        opt = self.optimizer
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
        return (self._lr(values, dtype), 1 - beta_1, 1 - beta_2, u_t_1, 1 - u_product_t_1,
                1 - u_t, 1 - u_product_t, 1 - beta_2_power, _mixed(opt.epsilon, dtype))

    def _fused(self, values, dtype):
        return "keras_nadam", self._coefficients(values, dtype)

    def _update(self, var, grad, state, values, dtype):
        (lr, one_minus_beta_1, one_minus_beta_2, u_t_1, one_minus_u_product_t_1, one_minus_u_t,
         one_minus_u_product_t, one_minus_beta_2_power, epsilon) = self._coefficients(values, dtype)
        m = state["m"] + (grad - state["m"]) * one_minus_beta_1
        v = state["v"] + (tf.square(grad) - state["v"]) * one_minus_beta_2
        m_hat = u_t_1 * m / one_minus_u_product_t_1 + one_minus_u_t * grad / one_minus_u_product_t
        v_hat = v / one_minus_beta_2_power
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
