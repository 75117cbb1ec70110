"""Rules of the tf_keras legacy optimizers (`tf_keras.optimizers.legacy`, OptimizerV2)."""

from __future__ import annotations

import tensorflow as tf

from tensorflow_dynemb.training.rules.base import (
    SlotSpec,
    SparseRule,
    _cast,
    _is_schedule,
    _nadam_momentum_product,
)
from tensorflow_dynemb.training.rules.kernels import (
    _kernel_adadelta,
    _kernel_adam,
    _kernel_adam_coefficients,
    _kernel_ftrl,
    _kernel_rmsprop,
)
from tensorflow_dynemb.training.rules.keras import (
    _momentum_rule,
    _momentum_step,
)


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
