#include "cc/core/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace dynemb {
namespace {

// The byte-at-a-time table of the reflected Castagnoli polynomial, for CPUs
// without the instruction.
constexpr uint32_t kPoly = 0x82f63b78u;

std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    table[i] = c;
  }
  return table;
}

uint32_t PortableExtend(uint32_t crc, const unsigned char* p, size_t n) {
  static const std::array<uint32_t, 256> table = MakeTable();
  uint32_t c = ~crc;
  for (; n > 0; ++p, --n) c = table[(c ^ *p) & 0xff] ^ (c >> 8);
  return ~c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t HardwareExtend(uint32_t crc, const unsigned char* p,
                                                          size_t n) {
  uint64_t c = static_cast<uint32_t>(~crc);
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; ++p, --n) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}
#endif

}  // namespace

bool HaveCrc32cInstruction() {
#if defined(__x86_64__)
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
#else
  return false;
#endif
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
#if defined(__x86_64__)
  if (HaveCrc32cInstruction()) return HardwareExtend(crc, p, n);
#endif
  return PortableExtend(crc, p, n);
}

}  // namespace dynemb
