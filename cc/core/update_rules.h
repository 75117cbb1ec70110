// Optimizer rules applied row by row inside a table (Table::ApplyRule): the
// slot state of a trained embedding (every slot of a key side by side in one
// row, tensorflow_dynemb/training/slots.py) is read, updated and written back under
// the shard's lock in one pass, and the new parameter rows come out.
//
// Each rule is the formula of one family of optimizers written with the SAME
// operations in the SAME order as the Python rule it stands for
// (tensorflow_dynemb/training/rules/), so that, in float32 and float64,
// the results are bit for bit those of TensorFlow's elementwise ops (IEEE
// add, sub, mul, div and sqrt are exactly rounded; this file must not be
// built with -ffast-math or FMA contraction, which the build never enables).
// Everything that depends on the step only (learning rate, bias corrections,
// 1 - beta, ...) is computed by the Python rule with TF ops and arrives here
// as `coefficients`, so no scalar formula exists twice.

#ifndef DYNEMB_CORE_UPDATE_RULES_H_
#define DYNEMB_CORE_UPDATE_RULES_H_

#include <cmath>
#include <cstdint>
#include <string_view>

#include "cc/core/host_device.h"

namespace dynemb {

// The rules, by the optimizers that use them. Coefficients, in order:
enum class UpdateRule : int {
  // Keras 3 / tf_keras Adam, AdamW (no amsgrad). Slots [m | v].
  // [alpha, 1 - beta_1, 1 - beta_2, epsilon]
  //   m += (g - m) * (1 - beta_1);  v += (g * g - v) * (1 - beta_2)
  //   w -= (m * alpha) / (sqrt(v) + epsilon)
  kKerasAdam = 0,
  // TF1 AdamOptimizer and tf_keras legacy Adam (their sparse kernel, no
  // amsgrad). Slots [m | v]. [lr_t, beta_1, 1 - beta_1, beta_2, 1 - beta_2, epsilon]
  //   m = m * beta_1 + g * (1 - beta_1);  v = v * beta_2 + (g * g) * (1 - beta_2)
  //   w -= (lr_t * m) / (sqrt(v) + epsilon)
  kAdamKernel = 1,
  // Keras 3 / tf_keras Adagrad. Slot [accumulator]. [lr, epsilon]
  //   acc += g * g;  w -= (lr * g) / sqrt(acc + epsilon)
  kKerasAdagrad = 2,
  // tf_keras legacy Adagrad (SparseApplyAdagradV2). Slot [accumulator]. [lr, epsilon]
  //   acc += g * g;  w -= (lr * g) / (sqrt(acc) + epsilon)
  kAdagradV2 = 3,
  // Keras 3 / tf_keras / legacy SGD with momentum. Slot [momentum]. [lr, momentum]
  //   m = m * momentum - g * lr;  w += m
  kKerasMomentum = 4,
  // The same with nesterov:  w += m * momentum - g * lr
  kKerasNesterov = 5,
  // TF1 MomentumOptimizer. Slot [accumulation]. [lr, momentum, lr * momentum]
  //   a = a * momentum + g;  w -= lr * a
  kMomentum = 6,
  // The same with use_nesterov:  w -= lr * g + (lr * momentum) * a
  kNesterov = 7,
  // Keras 3 / tf_keras Adam, AdamW with amsgrad. Slots [m | v | vhat].
  // Coefficients as kKerasAdam.
  //   m, v as kKerasAdam;  vhat = max(vhat, v);  w -= (m * alpha) / (sqrt(vhat) + epsilon)
  kKerasAdamAmsgrad = 8,
  // Keras 3 / tf_keras Adamax. Slots [m | u].
  // [lr, 1 - beta_1, beta_2, 1 - beta_1^t, epsilon]
  //   m += (g - m) * (1 - beta_1);  u = max(beta_2 * u, |g|)
  //   w -= (lr * m) / ((1 - beta_1^t) * (u + epsilon))
  kKerasAdamax = 9,
  // Keras 3 RMSprop (tf_keras writes rsqrt, which has no exact C++ twin).
  // Slots [rms], [rms | momentum], [rms | mg], [rms | momentum | mg].
  // [lr, rho, 1 - rho, epsilon] (+ [momentum] for the momentum forms)
  //   rms = rho * rms + (1 - rho) * (g * g)
  //   centered: mg = rho * mg + (1 - rho) * g;  d = rms - mg * mg + epsilon
  //   else d = rms + epsilon;  inc = (lr * g) / sqrt(d)
  //   momentum: mom = momentum * mom + inc;  w -= mom;  else w -= inc
  kKerasRMSprop = 10,
  kKerasRMSpropMomentum = 11,
  kKerasRMSpropCentered = 12,
  kKerasRMSpropCenteredMomentum = 13,
  // Keras 3 Adadelta (tf_keras rounds (1 - rho) * g * g differently).
  // Slots [accum_grad | accum_var]. [lr, rho, 1 - rho, epsilon]
  //   ag = rho * ag + (1 - rho) * (g * g)
  //   delta = -((sqrt(av + epsilon) * g) / sqrt(ag + epsilon))
  //   av = rho * av + (1 - rho) * (delta * delta);  w += lr * delta
  kKerasAdadelta = 14,
  // Keras 3 / tf_keras Nadam. Slots [m | v].
  // [lr, 1 - beta_1, 1 - beta_2, u_{t+1}, 1 - U_{t+1}, 1 - u_t, 1 - U_t,
  //  1 - beta_2^t, epsilon]  (u, U: Nadam's momentum schedule and its product)
  //   m += (g - m) * (1 - beta_1);  v += (g * g - v) * (1 - beta_2)
  //   m_hat = (u_{t+1} * m) / (1 - U_{t+1}) + ((1 - u_t) * g) / (1 - U_t)
  //   w -= (m_hat * lr) / (sqrt(v / (1 - beta_2^t)) + epsilon)
  kKerasNadam = 15,
};

// "keras_adam", "adam_kernel", "keras_adagrad", "adagrad_v2",
// "keras_momentum", "keras_nesterov", "momentum", "nesterov",
// "keras_adam_amsgrad", "keras_adamax", "keras_rmsprop", "keras_rmsprop_momentum",
// "keras_rmsprop_centered", "keras_rmsprop_centered_momentum", "keras_adadelta",
// "keras_nadam".
bool ParseUpdateRule(std::string_view name, UpdateRule* rule);
const char* UpdateRuleName(UpdateRule rule);
// Slots per key (the state row is slots * dim wide) and coefficients of a rule.
int UpdateRuleSlots(UpdateRule rule);
int UpdateRuleCoefficients(UpdateRule rule);

// One step of a rule over a batch, as Table::ApplyRule takes it. Rows are
// [n, dim] arrays of the table's value type (float32 or float64), in the
// table's memory space; `coefficients` lives in host memory.
struct RuleStep {
  UpdateRule rule = UpdateRule::kKerasAdam;
  int64_t dim = 0;              // parameter row width; state rows are slots * dim
  // Keras weight decay first (w -= (w * weight_decay) * lr): the coefficients
  // then start with [weight_decay, lr] before the rule's own.
  bool weight_decay = false;
  const void* coefficients = nullptr;
  const void* rows = nullptr;   // the parameter rows the step read
  const void* grads = nullptr;  // their gradients, summed per key
  void* new_rows = nullptr;     // receives the updated parameter rows
};

// The parameter value a rule starts from: Keras' weight decay first
// (w -= (w * weight_decay) * lr) where the step has it.
template <typename T>
DYNEMB_HOST_DEVICE inline T DecayedWeight(T w, bool weight_decay, T decay, T decay_lr) {
  return weight_decay ? w - (w * decay) * decay_lr : w;
}

template <typename T>
DYNEMB_HOST_DEVICE inline T MaxOf(T a, T b) {  // TF's Maximum: a < b ? b : a
  return a < b ? b : a;
}

// Applies `step` to one key: reads its parameter row `row` and gradient
// `grad` (dim values each), updates its state row `state` (slots * dim
// values) in place and writes the new parameter row to `out`.
// `coefficients` of type T. The rule is chosen once per row and each rule's
// loop is a plain loop over the row, which the compiler vectorizes (IEEE
// vector add, mul, div and sqrt round as the scalar ones do).
template <typename T>
DYNEMB_HOST_DEVICE inline void ApplyRuleToRow(UpdateRule rule, bool weight_decay,
                                              const T* coefficients, int64_t dim,
                                              const T* __restrict row, const T* __restrict grad,
                                              T* __restrict state, T* __restrict out) {
  const T* c = coefficients;
  const T decay = weight_decay ? c[0] : T(0);
  const T decay_lr = weight_decay ? c[1] : T(0);
  if (weight_decay) c += 2;
  // The slots of the state row, side by side (a third, state + 2 * dim, only in
  // the rules that keep three: the pointer must not pass a shorter row's end).
  T* __restrict s0 = state;
  T* __restrict s1 = state + dim;
#define DYNEMB_FOR_EACH_ELEMENT(BODY)                             \
  for (int64_t j = 0; j < dim; ++j) {                             \
    T w = DecayedWeight(row[j], weight_decay, decay, decay_lr);   \
    const T g = grad[j];                                          \
    BODY                                                          \
    out[j] = w;                                                   \
  }
  switch (rule) {
    case UpdateRule::kKerasAdam:
      DYNEMB_FOR_EACH_ELEMENT({
        const T m = s0[j] + (g - s0[j]) * c[1];
        const T v = s1[j] + (g * g - s1[j]) * c[2];
        s0[j] = m;
        s1[j] = v;
        w = w - (m * c[0]) / (std::sqrt(v) + c[3]);
      })
      return;
    case UpdateRule::kKerasAdamAmsgrad: {
      T* __restrict s2 = state + 2 * dim;
      DYNEMB_FOR_EACH_ELEMENT({
        const T m = s0[j] + (g - s0[j]) * c[1];
        const T v = s1[j] + (g * g - s1[j]) * c[2];
        const T vhat = MaxOf(s2[j], v);
        s0[j] = m;
        s1[j] = v;
        s2[j] = vhat;
        w = w - (m * c[0]) / (std::sqrt(vhat) + c[3]);
      })
      return;
    }
    case UpdateRule::kAdamKernel:
      DYNEMB_FOR_EACH_ELEMENT({
        const T m = s0[j] * c[1] + g * c[2];
        const T v = s1[j] * c[3] + (g * g) * c[4];
        s0[j] = m;
        s1[j] = v;
        w = w - (c[0] * m) / (std::sqrt(v) + c[5]);
      })
      return;
    case UpdateRule::kKerasAdagrad:
      DYNEMB_FOR_EACH_ELEMENT({
        const T acc = s0[j] + g * g;
        s0[j] = acc;
        w = w - (c[0] * g) / std::sqrt(acc + c[1]);
      })
      return;
    case UpdateRule::kAdagradV2:
      DYNEMB_FOR_EACH_ELEMENT({
        const T acc = s0[j] + g * g;
        s0[j] = acc;
        w = w - (c[0] * g) / (std::sqrt(acc) + c[1]);
      })
      return;
    case UpdateRule::kKerasMomentum:
      DYNEMB_FOR_EACH_ELEMENT({
        const T m = s0[j] * c[1] - g * c[0];
        s0[j] = m;
        w = w + m;
      })
      return;
    case UpdateRule::kKerasNesterov:
      DYNEMB_FOR_EACH_ELEMENT({
        const T m = s0[j] * c[1] - g * c[0];
        s0[j] = m;
        w = w + (m * c[1] - g * c[0]);
      })
      return;
    case UpdateRule::kMomentum:
      DYNEMB_FOR_EACH_ELEMENT({
        const T a = s0[j] * c[1] + g;
        s0[j] = a;
        w = w - c[0] * a;
      })
      return;
    case UpdateRule::kNesterov:
      DYNEMB_FOR_EACH_ELEMENT({
        const T a = s0[j] * c[1] + g;
        s0[j] = a;
        w = w - (c[0] * g + c[2] * a);
      })
      return;
    case UpdateRule::kKerasAdamax:
      DYNEMB_FOR_EACH_ELEMENT({
        const T m = s0[j] + (g - s0[j]) * c[1];
        const T u = MaxOf(c[2] * s1[j], std::abs(g));
        s0[j] = m;
        s1[j] = u;
        w = w - (c[0] * m) / (c[3] * (u + c[4]));
      })
      return;
    case UpdateRule::kKerasRMSprop:
      DYNEMB_FOR_EACH_ELEMENT({
        const T rms = c[1] * s0[j] + c[2] * (g * g);
        s0[j] = rms;
        w = w - (c[0] * g) / std::sqrt(rms + c[3]);
      })
      return;
    case UpdateRule::kKerasRMSpropMomentum:
      DYNEMB_FOR_EACH_ELEMENT({
        const T rms = c[1] * s0[j] + c[2] * (g * g);
        const T mom = c[4] * s1[j] + (c[0] * g) / std::sqrt(rms + c[3]);
        s0[j] = rms;
        s1[j] = mom;
        w = w - mom;
      })
      return;
    case UpdateRule::kKerasRMSpropCentered:
      DYNEMB_FOR_EACH_ELEMENT({
        const T rms = c[1] * s0[j] + c[2] * (g * g);
        const T mg = c[1] * s1[j] + c[2] * g;
        s0[j] = rms;
        s1[j] = mg;
        w = w - (c[0] * g) / std::sqrt(rms - mg * mg + c[3]);
      })
      return;
    case UpdateRule::kKerasRMSpropCenteredMomentum: {  // slots [rms | momentum | mg]
      T* __restrict s2 = state + 2 * dim;
      DYNEMB_FOR_EACH_ELEMENT({
        const T rms = c[1] * s0[j] + c[2] * (g * g);
        const T mg = c[1] * s2[j] + c[2] * g;
        const T mom = c[4] * s1[j] + (c[0] * g) / std::sqrt(rms - mg * mg + c[3]);
        s0[j] = rms;
        s1[j] = mom;
        s2[j] = mg;
        w = w - mom;
      })
      return;
    }
    case UpdateRule::kKerasAdadelta:
      DYNEMB_FOR_EACH_ELEMENT({
        const T ag = c[1] * s0[j] + c[2] * (g * g);
        const T delta = -((std::sqrt(s1[j] + c[3]) * g) / std::sqrt(ag + c[3]));
        s0[j] = ag;
        s1[j] = c[1] * s1[j] + c[2] * (delta * delta);
        w = w + c[0] * delta;
      })
      return;
    case UpdateRule::kKerasNadam:
      DYNEMB_FOR_EACH_ELEMENT({
        const T m = s0[j] + (g - s0[j]) * c[1];
        const T v = s1[j] + (g * g - s1[j]) * c[2];
        s0[j] = m;
        s1[j] = v;
        const T m_hat = (c[3] * m) / c[4] + (c[5] * g) / c[6];
        w = w - (m_hat * c[0]) / (std::sqrt(v / c[7]) + c[8]);
      })
      return;
  }
#undef DYNEMB_FOR_EACH_ELEMENT
}

}  // namespace dynemb

#endif  // DYNEMB_CORE_UPDATE_RULES_H_
