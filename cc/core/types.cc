// Names, sizes and option validation for the core's enums (table.h).

#include <string>

#include "cc/core/table.h"

namespace dynemb {
namespace {

struct ValueTypeInfo {
  ValueType type;
  const char* name;
  size_t size;
};

constexpr ValueTypeInfo kValueTypes[] = {
    {ValueType::kFloat32, "float32", 4}, {ValueType::kFloat64, "float64", 8},
    {ValueType::kFloat16, "float16", 2}, {ValueType::kBFloat16, "bfloat16", 2},
    {ValueType::kInt8, "int8", 1},       {ValueType::kInt32, "int32", 4},
    {ValueType::kInt64, "int64", 8},     {ValueType::kBool, "bool", 1},
};

constexpr const char* kKeyTypeNames[] = {"int32", "int64", "string"};
constexpr const char* kStrategyNames[] = {"lru", "lfu", "epoch_lru", "epoch_lfu", "customized"};

}  // namespace

size_t ValueTypeSize(ValueType type) {
  for (const auto& info : kValueTypes)
    if (info.type == type) return info.size;
  return 0;
}

const char* ValueTypeName(ValueType type) {
  for (const auto& info : kValueTypes)
    if (info.type == type) return info.name;
  return "unknown";
}

bool ParseValueType(std::string_view name, ValueType* type) {
  for (const auto& info : kValueTypes) {
    if (name == info.name) {
      *type = info.type;
      return true;
    }
  }
  return false;
}

const char* KeyTypeName(KeyType type) {
  int i = static_cast<int>(type);
  return (i >= 0 && i < 3) ? kKeyTypeNames[i] : "unknown";
}

bool ParseKeyType(std::string_view name, KeyType* type) {
  for (int i = 0; i < 3; ++i) {
    if (name == kKeyTypeNames[i]) {
      *type = static_cast<KeyType>(i);
      return true;
    }
  }
  return false;
}

const char* EvictStrategyName(EvictStrategy strategy) {
  int i = static_cast<int>(strategy);
  return (i >= 0 && i < 5) ? kStrategyNames[i] : "unknown";
}

bool ParseEvictStrategy(std::string_view name, EvictStrategy* strategy) {
  for (int i = 0; i < 5; ++i) {
    if (name == kStrategyNames[i]) {
      *strategy = static_cast<EvictStrategy>(i);
      return true;
    }
  }
  return false;
}

Status CheckBatchArgs(const void* keys, int64_t n, const void* data, const char* what,
                      int64_t max_rows, const char* limit) {
  if (n < 0 || n > max_rows) {
    return InvalidArgument(std::string("batch size must be in ") + limit + ", got " +
                           std::to_string(n));
  }
  if (keys == nullptr || data == nullptr) {
    return InvalidArgument(std::string("keys and ") + what + " must not be null");
  }
  return Status::Ok();
}

Status CheckDim(int64_t dim) {
  if (dim < 1 || dim > kMaxDim) {
    return InvalidArgument("dim must be in [1, 2^24], got " + std::to_string(dim));
  }
  return Status::Ok();
}

Status TableOptions::Validate() const {
  DYNEMB_RETURN_IF_ERROR(CheckDim(dim));
  if (ValueTypeSize(value_type) == 0) {
    return InvalidArgument("value_type is not a supported value type (got enum " +
                           std::to_string(static_cast<int>(value_type)) + ")");
  }
  if (std::string(KeyTypeName(key_type)) == "unknown") {
    return InvalidArgument("key_type is not int32, int64 or string (got enum " +
                           std::to_string(static_cast<int>(key_type)) + ")");
  }
  if (init_capacity < 0) {
    return InvalidArgument("init_capacity must be >= 0, got " + std::to_string(init_capacity));
  }
  if (max_capacity < 0) {
    return InvalidArgument("max_capacity must be >= 0 (0 = unbounded), got " +
                           std::to_string(max_capacity));
  }
  if (max_capacity > 0 && init_capacity > max_capacity) {
    return InvalidArgument("init_capacity (" + std::to_string(init_capacity) +
                           ") must be <= max_capacity (" + std::to_string(max_capacity) + ")");
  }
  if (step_per_epoch < 0) {
    return InvalidArgument("step_per_epoch must be >= 0, got " + std::to_string(step_per_epoch));
  }
  if (max_hbm_for_values < -1) {
    return InvalidArgument("max_hbm_for_values must be >= 0 bytes, or -1 for no limit, got " +
                           std::to_string(max_hbm_for_values));
  }
  if (std::string(EvictStrategyName(strategy)) == "unknown") {
    return InvalidArgument("strategy is not a known EvictStrategy (got enum " +
                           std::to_string(static_cast<int>(strategy)) + ")");
  }
  return Status::Ok();
}

}  // namespace dynemb
