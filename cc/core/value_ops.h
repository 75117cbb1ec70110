// Element arithmetic on type-erased value rows: half/bfloat16 conversion and
// the row addition used by Accum. No TensorFlow or Eigen dependency.

#ifndef DYNEMB_CORE_VALUE_OPS_H_
#define DYNEMB_CORE_VALUE_OPS_H_

#include <cstdint>

#include "cc/core/table.h"

namespace dynemb {

// IEEE binary16 and bfloat16 <-> float, rounding to nearest even (the same
// results as Eigen::half / Eigen::bfloat16 in TensorFlow).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToBFloat16(float f);

// dst[i] += src[i] for i in [0, n), in the element type. Integers wrap
// (two's complement), bool is logical or, half/bfloat16 round per element.
using AddRowFn = void (*)(void* dst, const void* src, int64_t n);
AddRowFn GetAddRowFn(ValueType type);

}  // namespace dynemb

#endif  // DYNEMB_CORE_VALUE_OPS_H_
