// Names, slot and coefficient counts of the rules in update_rules.h.

#include "cc/core/update_rules.h"

#include <string>
#include <string_view>

#include "cc/core/table.h"

namespace dynemb {
namespace {

struct RuleInfo {
  UpdateRule rule;
  const char* name;
  int slots;
  int coefficients;
};

constexpr RuleInfo kRules[] = {
    {UpdateRule::kKerasAdam, "keras_adam", 2, 4},
    {UpdateRule::kAdamKernel, "adam_kernel", 2, 6},
    {UpdateRule::kKerasAdagrad, "keras_adagrad", 1, 2},
    {UpdateRule::kAdagradV2, "adagrad_v2", 1, 2},
    {UpdateRule::kKerasMomentum, "keras_momentum", 1, 2},
    {UpdateRule::kKerasNesterov, "keras_nesterov", 1, 2},
    {UpdateRule::kMomentum, "momentum", 1, 3},
    {UpdateRule::kNesterov, "nesterov", 1, 3},
    {UpdateRule::kKerasAdamAmsgrad, "keras_adam_amsgrad", 3, 4},
    {UpdateRule::kKerasAdamax, "keras_adamax", 2, 5},
    {UpdateRule::kKerasRMSprop, "keras_rmsprop", 1, 4},
    {UpdateRule::kKerasRMSpropMomentum, "keras_rmsprop_momentum", 2, 5},
    {UpdateRule::kKerasRMSpropCentered, "keras_rmsprop_centered", 2, 4},
    {UpdateRule::kKerasRMSpropCenteredMomentum, "keras_rmsprop_centered_momentum", 3, 5},
    {UpdateRule::kKerasAdadelta, "keras_adadelta", 2, 4},
    {UpdateRule::kKerasNadam, "keras_nadam", 2, 9},
};

const RuleInfo* Info(UpdateRule rule) {
  for (const RuleInfo& info : kRules) {
    if (info.rule == rule) return &info;
  }
  return nullptr;
}

}  // namespace

bool ParseUpdateRule(std::string_view name, UpdateRule* rule) {
  for (const RuleInfo& info : kRules) {
    if (name == info.name) {
      *rule = info.rule;
      return true;
    }
  }
  return false;
}

const char* UpdateRuleName(UpdateRule rule) {
  const RuleInfo* info = Info(rule);
  return info != nullptr ? info->name : "unknown";
}

int UpdateRuleSlots(UpdateRule rule) {
  const RuleInfo* info = Info(rule);
  return info != nullptr ? info->slots : 0;
}

int UpdateRuleCoefficients(UpdateRule rule) {
  const RuleInfo* info = Info(rule);
  return info != nullptr ? info->coefficients : 0;
}

Status CheckRuleStep(const TableOptions& options, const void* keys, int64_t n,
                     const void* initial, const RuleStep& step) {
  const int slots = UpdateRuleSlots(step.rule);
  if (slots == 0) {
    return InvalidArgument("ApplyRule: unknown rule (enum " +
                           std::to_string(static_cast<int>(step.rule)) + ")");
  }
  if (options.value_type != ValueType::kFloat32 && options.value_type != ValueType::kFloat64) {
    return InvalidArgument(std::string("ApplyRule needs a float32 or float64 table, got ") +
                           ValueTypeName(options.value_type));
  }
  if (step.dim < 1 || options.dim != slots * step.dim) {
    return InvalidArgument(std::string("ApplyRule: rule ") + UpdateRuleName(step.rule) +
                           " keeps " + std::to_string(slots) + " slot(s) of the parameter's dim " +
                           std::to_string(step.dim) + " per key, so the table's dim must be " +
                           std::to_string(slots * step.dim) + ", got " +
                           std::to_string(options.dim));
  }
  if (options.max_capacity > 0) {
    return Status(StatusCode::kFailedPrecondition,
                  "ApplyRule needs an unbounded table (max_capacity 0): a step must not evict "
                  "slot rows, got max_capacity " + std::to_string(options.max_capacity));
  }
  if (n > 0 && (keys == nullptr || initial == nullptr || step.coefficients == nullptr ||
                step.rows == nullptr || step.grads == nullptr || step.new_rows == nullptr)) {
    return InvalidArgument(
        "ApplyRule: keys, initial, coefficients, rows, grads and new_rows must not be null");
  }
  return Status::Ok();
}

}  // namespace dynemb
