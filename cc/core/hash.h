// Key hashing for the CPU and GPU tables. The hash only has to be good within one
// process (it is never persisted), but it must spread consecutive integer ids
// evenly over shards and slots, hence a full 64-bit finaliser.

#ifndef DYNEMB_CORE_HASH_H_
#define DYNEMB_CORE_HASH_H_

#include <cstdint>
#include <cstring>
#include <string_view>

#include "cc/core/host_device.h"

namespace dynemb {

// splitmix64's finaliser: a bijection, so distinct integer keys never collide
// in the full 64-bit hash.
DYNEMB_HOST_DEVICE inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

DYNEMB_HOST_DEVICE inline uint64_t HashKey(int64_t key) { return Mix64(static_cast<uint64_t>(key)); }
DYNEMB_HOST_DEVICE inline uint64_t HashKey(int32_t key) { return Mix64(static_cast<uint64_t>(static_cast<int64_t>(key))); }

inline uint64_t HashKey(std::string_view key) {
  const char* p = key.data();
  size_t n = key.size();
  uint64_t h = 0x9e3779b97f4a7c15ULL ^ (static_cast<uint64_t>(n) * 0xff51afd7ed558ccdULL);
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    h = (h ^ Mix64(word)) * 0x9e3779b97f4a7c15ULL;
    h = (h << 29) | (h >> 35);
    p += 8;
    n -= 8;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, p, n);
  return Mix64(h ^ tail ^ (static_cast<uint64_t>(n) << 56));
}

}  // namespace dynemb

#endif  // DYNEMB_CORE_HASH_H_
