#include "cc/core/value_ops.h"

#include <cmath>
#include <cstring>

namespace dynemb {

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float.
    float magnitude = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
    std::memcpy(&bits, &magnitude, 4);
    bits |= sign;
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t abs_bits = x & 0x7fffffffu;
  if (abs_bits >= 0x7f800000u) {  // inf or nan (keep nan quiet and non-zero)
    return sign | 0x7c00 | (abs_bits > 0x7f800000u ? 0x200 | ((abs_bits >> 13) & 0x3ff) : 0);
  }
  if (abs_bits >= 0x477ff000u) return sign | 0x7c00;  // rounds past 65504
  if (abs_bits < 0x38800000u) {
    // Below the smallest normal half (2^-14): a multiple of 2^-24, rounded
    // to nearest even by nearbyint under the default rounding mode.
    float magnitude;
    std::memcpy(&magnitude, &abs_bits, 4);
    return sign | static_cast<uint16_t>(std::nearbyint(magnitude * 16777216.0f));
  }
  const uint32_t mantissa = abs_bits & 0x7fffffu;
  const uint32_t exponent = ((abs_bits >> 23) & 0xff) - 127 + 15;
  uint32_t h = (exponent << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;  // carries into the exponent correctly
  return sign | static_cast<uint16_t>(h);
}

float BFloat16ToFloat(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

uint16_t FloatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet nan
  x += 0x7fffu + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

namespace {

template <typename T>
void AddRow(void* dst, const void* src, int64_t n) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  for (int64_t i = 0; i < n; ++i) d[i] += s[i];
}

// Signed overflow is undefined in C++: add in the unsigned type to wrap.
template <typename T, typename U>
void AddRowWrapping(void* dst, const void* src, int64_t n) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  for (int64_t i = 0; i < n; ++i) {
    d[i] = static_cast<T>(static_cast<U>(static_cast<U>(d[i]) + static_cast<U>(s[i])));
  }
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void AddRow16(void* dst, const void* src, int64_t n) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* s = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) d[i] = FromFloat(ToFloat(d[i]) + ToFloat(s[i]));
}

void AddRowBool(void* dst, const void* src, int64_t n) {
  uint8_t* d = static_cast<uint8_t*>(dst);
  const uint8_t* s = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) d[i] = (d[i] | s[i]) ? 1 : 0;
}

}  // namespace

AddRowFn GetAddRowFn(ValueType type) {
  switch (type) {
    case ValueType::kFloat32: return AddRow<float>;
    case ValueType::kFloat64: return AddRow<double>;
    case ValueType::kFloat16: return AddRow16<HalfToFloat, FloatToHalf>;
    case ValueType::kBFloat16: return AddRow16<BFloat16ToFloat, FloatToBFloat16>;
    case ValueType::kInt8: return AddRowWrapping<int8_t, uint8_t>;
    case ValueType::kInt32: return AddRowWrapping<int32_t, uint32_t>;
    case ValueType::kInt64: return AddRowWrapping<int64_t, uint64_t>;
    case ValueType::kBool: return AddRowBool;
  }
  return nullptr;
}

}  // namespace dynemb
