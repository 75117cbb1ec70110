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
};

// "keras_adam", "adam_kernel", "keras_adagrad", "adagrad_v2",
// "keras_momentum", "keras_nesterov", "momentum", "nesterov".
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

// Applies `step` to row i: reads rows/grads row i, updates `state` (one state
// row) in place and writes new_rows row i. `coefficients` of type T.
template <typename T>
DYNEMB_HOST_DEVICE inline void ApplyRuleToRow(UpdateRule rule, bool weight_decay,
                                              const T* coefficients, int64_t dim,
                                              const T* row, const T* grad, T* state, T* out) {
  const T* c = coefficients;
  const T decay = weight_decay ? c[0] : T(0);
  const T decay_lr = weight_decay ? c[1] : T(0);
  if (weight_decay) c += 2;
  for (int64_t j = 0; j < dim; ++j) {
    T w = row[j];
    if (weight_decay) w = w - (w * decay) * decay_lr;
    const T g = grad[j];
    switch (rule) {
      case UpdateRule::kKerasAdam: {
        T& m = state[j];
        T& v = state[dim + j];
        m = m + (g - m) * c[1];
        v = v + (g * g - v) * c[2];
        w = w - (m * c[0]) / (std::sqrt(v) + c[3]);
        break;
      }
      case UpdateRule::kAdamKernel: {
        T& m = state[j];
        T& v = state[dim + j];
        m = m * c[1] + g * c[2];
        v = v * c[3] + (g * g) * c[4];
        w = w - (c[0] * m) / (std::sqrt(v) + c[5]);
        break;
      }
      case UpdateRule::kKerasAdagrad: {
        T& acc = state[j];
        acc = acc + g * g;
        w = w - (c[0] * g) / std::sqrt(acc + c[1]);
        break;
      }
      case UpdateRule::kAdagradV2: {
        T& acc = state[j];
        acc = acc + g * g;
        w = w - (c[0] * g) / (std::sqrt(acc) + c[1]);
        break;
      }
      case UpdateRule::kKerasMomentum:
      case UpdateRule::kKerasNesterov: {
        T& m = state[j];
        m = m * c[1] - g * c[0];
        w = rule == UpdateRule::kKerasMomentum ? w + m : w + (m * c[1] - g * c[0]);
        break;
      }
      case UpdateRule::kMomentum:
      case UpdateRule::kNesterov: {
        T& a = state[j];
        a = a * c[1] + g;
        w = rule == UpdateRule::kMomentum ? w - c[0] * a : w - (c[0] * g + c[2] * a);
        break;
      }
    }
    out[j] = w;
  }
}

}  // namespace dynemb

#endif  // DYNEMB_CORE_UPDATE_RULES_H_
