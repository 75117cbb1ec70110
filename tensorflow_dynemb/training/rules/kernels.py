"""Formulas of the TensorFlow training kernels (`ResourceSparseApply*`), shared by the
TF1 and the legacy tf_keras rules."""

from __future__ import annotations

import tensorflow as tf




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
