// CRC-32C (Castagnoli), the checksum TF's checkpoint bundles and our table
// files (table_io.h) use, computed with the CPU's CRC32 instruction (SSE4.2)
// where there is one: one 8-byte step per instruction, about 8 GB/s a core,
// several times absl's portable code (TF's wheels are not built for SSE4.2).
// Elsewhere a table-driven loop gives the same values, slower.
//
// No TensorFlow dependency. Thread-safe (pure functions).

#ifndef DYNEMB_CORE_CRC32C_H_
#define DYNEMB_CORE_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace dynemb {

// Whether Crc32c runs on the CPU's instruction (callers with a faster
// fallback of their own, such as TF's bundle reader, use it only then).
bool HaveCrc32cInstruction();

// The CRC-32C of `n` bytes at `data` continued from `crc`, the CRC-32C of the
// bytes before them (0 for none): Crc32cExtend(Crc32c(a), b) == Crc32c(a + b).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

inline uint32_t Crc32c(const void* data, size_t n) { return Crc32cExtend(0, data, n); }

// A CRC stored next to the bytes it covers is "masked" as TF masks it
// (tensorflow/core/lib/hash/crc32c.h): the CRC of a string holding CRCs is
// otherwise weak. Mask/Unmask are the same functions as TF's.
inline uint32_t MaskCrc32c(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}
inline uint32_t UnmaskCrc32c(uint32_t masked) {
  const uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

}  // namespace dynemb

#endif  // DYNEMB_CORE_CRC32C_H_
