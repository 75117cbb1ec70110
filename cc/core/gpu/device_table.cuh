// Device-side view of a GPU table's storage and the warp-level operations on
// it (find, claim, publish, delete, row copy and add). Layout: gpu_table.h.
// Every function taking `lane` is called by all 32 lanes of a warp together,
// with the same arguments, and returns the same result in every lane.

#ifndef DYNEMB_CORE_GPU_DEVICE_TABLE_CUH_
#define DYNEMB_CORE_GPU_DEVICE_TABLE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cc/core/hash.h"
#include "cc/core/table.h"

namespace dynemb {
namespace gpu {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kBucketSlots = 128;  // 32 lanes x 4 tag bytes: one 32-bit load per lane
constexpr uint64_t kNoSlot = ~uint64_t{0};

// Tag bytes. Occupied slots hold kFirstTag + an 8-bit digest of the hash, so
// occupancy needs no reserved key value.
constexpr uint8_t kEmptyTag = 0;    // never used since the last rehash: ends a lookup
constexpr uint8_t kDeletedTag = 1;  // removed: free for inserts, does not end a lookup
constexpr uint8_t kBusyTag = 2;     // claimed by an insert that has not published yet
constexpr uint8_t kFirstTag = 3;

__device__ __forceinline__ uint8_t TagOf(uint64_t hash) {
  // The top byte, folded onto the 253 occupied tag values; the bucket comes
  // from the low bits, so the two are independent.
  return static_cast<uint8_t>(kFirstTag + (hash >> 56) % 253);
}

__device__ __forceinline__ uint32_t Repeat4(uint8_t byte) { return byte * 0x01010101u; }

template <typename K>
struct DeviceTable {
  uint8_t* tags = nullptr;      // [slots]
  K* keys = nullptr;            // [slots]
  uint64_t* scores = nullptr;   // [slots]
  uint64_t* ages = nullptr;     // [slots]
  char* hbm_values = nullptr;   // rows [0, hbm_rows), device memory
  char* host_values = nullptr;  // rows [hbm_rows, slots), mapped host memory (device address)
  uint64_t num_buckets = 0;     // a power of two
  uint64_t hbm_rows = 0;
  uint32_t value_bytes = 0;

  __host__ __device__ uint64_t num_slots() const { return num_buckets * kBucketSlots; }

  // The one place a value row's address is computed: device or host part.
  __device__ __forceinline__ char* Row(uint64_t slot) const {
    return slot < hbm_rows ? hbm_values + slot * value_bytes
                           : host_values + (slot - hbm_rows) * value_bytes;
  }

  __device__ __forceinline__ uint32_t* TagWords(uint64_t bucket) const {
    return reinterpret_cast<uint32_t*>(tags + bucket * kBucketSlots);
  }
};

// The bucket a key's probe starts at.
template <typename K>
__device__ __forceinline__ uint64_t HomeBucket(const DeviceTable<K>& t, uint64_t hash) {
  return hash & (t.num_buckets - 1);
}

// The slot holding `key`, or kNoSlot, looked up by one thread (kernels look
// up 32 keys per warp at once this way, keeping many lookups in flight).
// Probes buckets from the key's home bucket until one that has an empty slot
// (inserts never pass such a bucket). A bucket's 128 tags are one 128-byte
// line, read as eight 16-byte loads issued together.
template <typename K>
__device__ uint64_t ThreadFind(const DeviceTable<K>& t, K key, uint64_t hash) {
  constexpr int kWords = kBucketSlots / 4;
  const uint32_t want = Repeat4(TagOf(hash));
  const uint64_t mask = t.num_buckets - 1;
  uint64_t bucket = HomeBucket(t, hash);
  for (uint64_t probe = 0; probe < t.num_buckets; ++probe, bucket = (bucket + 1) & mask) {
    const uint4* line = reinterpret_cast<const uint4*>(t.TagWords(bucket));
    uint32_t words[kWords];
#pragma unroll
    for (int q = 0; q < kWords / 4; ++q) {
      const uint4 v = line[q];
      words[4 * q] = v.x;
      words[4 * q + 1] = v.y;
      words[4 * q + 2] = v.z;
      words[4 * q + 3] = v.w;
    }
    bool has_empty = false;
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
      uint32_t match = __vcmpeq4(words[w], want);  // 0xff in each matching byte
      while (match != 0) {
        const int byte = (__ffs(match) - 1) / 8;
        match &= ~(0xffu << (8 * byte));
        const uint64_t slot = bucket * kBucketSlots + 4 * w + byte;
        if (t.keys[slot] == key) return slot;
      }
      has_empty = has_empty || __vcmpeq4(words[w], 0) != 0;
    }
    if (has_empty) return kNoSlot;
  }
  return kNoSlot;
}

// Claims the first free (empty or deleted) slot on the probe path of `hash`
// and marks it kBusyTag; the caller writes the entry, then PublishTag. The
// caller has established that the key is absent and no other warp inserts it.
// A lookup never passes a bucket with an empty slot, and an empty slot only
// ever becomes busy or occupied, so placing the key in the first free slot
// keeps it reachable. *was_empty: the slot was empty (not deleted) before.
// Returns kNoSlot only when every slot is taken (growth prevents that).
template <typename K>
__device__ uint64_t WarpClaim(const DeviceTable<K>& t, uint64_t hash, int lane, bool* was_empty) {
  const uint64_t mask = t.num_buckets - 1;
  uint64_t bucket = HomeBucket(t, hash);
  for (uint64_t probe = 0; probe < t.num_buckets; ++probe, bucket = (bucket + 1) & mask) {
    uint32_t* words = t.TagWords(bucket);
    // Bypass L1: other warps claim slots in this word concurrently.
    uint32_t word = __ldcg(words + lane);
    for (;;) {
      const uint32_t free_bytes = __vcmpeq4(word, 0) | __vcmpeq4(word, Repeat4(kDeletedTag));
      const unsigned lanes = __ballot_sync(kFullMask, free_bytes != 0);
      if (lanes == 0) break;  // no free slot left in this bucket
      const int winner = __ffs(lanes) - 1;
      uint64_t claimed = kNoSlot;
      int empty = 0;
      if (lane == winner) {
        const int byte = (__ffs(free_bytes) - 1) / 8;
        const uint32_t shift = 8 * byte;
        const uint32_t desired = (word & ~(0xffu << shift)) | (uint32_t{kBusyTag} << shift);
        const uint32_t seen = atomicCAS(words + lane, word, desired);
        if (seen == word) {
          claimed = bucket * kBucketSlots + static_cast<uint64_t>(lane) * 4 + byte;
          empty = ((word >> shift) & 0xff) == kEmptyTag;
        } else {
          word = seen;  // another warp took a slot of this word: look again
        }
      }
      claimed = __shfl_sync(kFullMask, claimed, winner);
      if (claimed != kNoSlot) {
        *was_empty = __shfl_sync(kFullMask, empty, winner) != 0;
        return claimed;
      }
    }
  }
  *was_empty = false;
  return kNoSlot;
}

// WarpClaim by one thread: each lane claims a slot for its own key, so a
// warp's claims are in flight together instead of one after the other (an
// insert of new keys spent most of its time in the warp-serial claims).
// Same rule: the first free slot on the probe path, marked kBusyTag; a
// failed atomicCAS (another thread took a slot of the word) looks at the
// word again. Tags are read through L2 (__ldcg): other threads claim
// concurrently.
template <typename K>
__device__ uint64_t ThreadClaim(const DeviceTable<K>& t, uint64_t hash, bool* was_empty) {
  constexpr int kWords = kBucketSlots / 4;
  const uint32_t deleted = Repeat4(kDeletedTag);
  const uint64_t mask = t.num_buckets - 1;
  uint64_t bucket = HomeBucket(t, hash);
  for (uint64_t probe = 0; probe < t.num_buckets; ++probe, bucket = (bucket + 1) & mask) {
    uint32_t* words = t.TagWords(bucket);
    const uint4* line = reinterpret_cast<const uint4*>(words);
    for (int q = 0; q < kWords / 4; ++q) {
      const uint4 v = __ldcg(line + q);
      const uint32_t four[4] = {v.x, v.y, v.z, v.w};
      for (int i = 0; i < 4; ++i) {
        uint32_t word = four[i];
        for (;;) {
          const uint32_t free_bytes = __vcmpeq4(word, 0) | __vcmpeq4(word, deleted);
          if (free_bytes == 0) break;
          const uint32_t shift = 8 * ((__ffs(free_bytes) - 1) / 8);
          const uint32_t desired = (word & ~(0xffu << shift)) | (uint32_t{kBusyTag} << shift);
          const uint32_t seen = atomicCAS(words + 4 * q + i, word, desired);
          if (seen == word) {
            *was_empty = ((word >> shift) & 0xff) == kEmptyTag;
            return bucket * kBucketSlots + static_cast<uint64_t>(4 * q + i) * 4 + shift / 8;
          }
          word = seen;
        }
      }
    }
  }
  *was_empty = false;
  return kNoSlot;
}

// Changes the tag byte of `slot` from `from` to `to` atomically (the other
// bytes of its word belong to other slots, which other warps may be claiming).
template <typename K>
__device__ __forceinline__ void SwapTag(const DeviceTable<K>& t, uint64_t slot, uint8_t from,
                                        uint8_t to) {
  uint32_t* word = reinterpret_cast<uint32_t*>(t.tags + (slot & ~uint64_t{3}));
  atomicXor(word, static_cast<uint32_t>(from ^ to) << (8 * (slot & 3)));
}

// Makes a claimed slot visible to lookups, after its key was written (by the
// calling lane: the fence orders the key before the tag).
template <typename K>
__device__ __forceinline__ void PublishTag(const DeviceTable<K>& t, uint64_t slot,
                                           uint64_t hash) {
  __threadfence();
  SwapTag(t, slot, kBusyTag, TagOf(hash));
}

// Marks occupied `slot` deleted unless another lane got there first (two rows
// of one key in a Remove batch); returns whether this call deleted it.
template <typename K>
__device__ bool TryDeleteTag(const DeviceTable<K>& t, uint64_t slot, uint8_t tag) {
  uint32_t* word = reinterpret_cast<uint32_t*>(t.tags + (slot & ~uint64_t{3}));
  const uint32_t shift = 8 * (slot & 3);
  uint32_t current = __ldcg(word);
  for (;;) {
    if (((current >> shift) & 0xff) != tag) return false;
    const uint32_t desired = current ^ (static_cast<uint32_t>(tag ^ kDeletedTag) << shift);
    const uint32_t seen = atomicCAS(word, current, desired);
    if (seen == current) return true;
    current = seen;
  }
}

// The widest unit of a copy (16, 4 or 1 bytes) that the OR of its addresses
// and size allows.
__device__ __forceinline__ uint32_t CopyUnit(uintptr_t bits) {
  return bits % 16 == 0 ? 16 : bits % 4 == 0 ? 4 : 1;
}

// dst[0, bytes) = src[0, bytes), by the whole warp, in the widest unit both
// addresses and the size allow.
__device__ __forceinline__ void WarpCopy(char* dst, const char* src, uint32_t bytes, int lane) {
  const uint32_t unit = CopyUnit(reinterpret_cast<uintptr_t>(dst) |
                                 reinterpret_cast<uintptr_t>(src) | bytes);
  if (unit == 16) {
    for (uint32_t i = lane; i < bytes / 16; i += kWarpSize) {
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
    }
  } else if (unit == 4) {
    for (uint32_t i = lane; i < bytes / 4; i += kWarpSize) {
      reinterpret_cast<uint32_t*>(dst)[i] = reinterpret_cast<const uint32_t*>(src)[i];
    }
  } else {
    for (uint32_t i = lane; i < bytes; i += kWarpSize) dst[i] = src[i];
  }
  __syncwarp();
}

constexpr int kCopyBatch = 4;  // units a lane loads before it stores any

// dst[u] = src[u] for this lane's units part, part + group, ... below
// `units`, loading up to kCopyBatch of them before storing: a load waits a
// memory latency, and several in flight wait it once.
template <typename U>
__device__ __forceinline__ void CopyUnits(U* dst, const U* src, uint32_t units, uint32_t part,
                                          uint32_t group) {
  for (uint32_t first = part; first < units; first += group * kCopyBatch) {
    U buffer[kCopyBatch];
#pragma unroll
    for (int b = 0; b < kCopyBatch; ++b) {
      if (first + b * group < units) buffer[b] = src[first + b * group];
    }
#pragma unroll
    for (int b = 0; b < kCopyBatch; ++b) {
      if (first + b * group < units) dst[first + b * group] = buffer[b];
    }
  }
}

// Copies up to 32 rows of `bytes` bytes, by the whole warp: row k < count from
// src(k) to dst(k), skipped where either is null. Every lane calls src and dst
// with some row below count, so they may shuffle. `address_bits` ORs the base
// addresses the rows lie at, to pick the widest unit they allow. The lanes
// split into groups just wide enough for a row at kCopyBatch units per lane,
// so that narrow rows copy many at a time with all their loads in flight
// (WarpCopy row after row waits a memory latency per row).
template <typename Src, typename Dst>
__device__ void WarpCopyRows(int count, uint32_t bytes, uintptr_t address_bits, Src src, Dst dst,
                             int lane) {
  const uint32_t unit = CopyUnit(address_bits | bytes);
  const uint32_t units = bytes / unit;
  uint32_t group = 1;
  while (group < kWarpSize && group * kCopyBatch < units) group *= 2;
  const int rows_per_pass = kWarpSize / static_cast<int>(group);
  const uint32_t part = lane % group;
  for (int first = 0; first < count; first += rows_per_pass) {
    const int k = first + lane / static_cast<int>(group);
    const int row = k < count ? k : count - 1;
    const char* from = src(row);
    char* to = dst(row);
    if (k >= count || from == nullptr || to == nullptr) continue;
    if (unit == 16) {
      CopyUnits(reinterpret_cast<uint4*>(to), reinterpret_cast<const uint4*>(from), units, part,
                group);
    } else if (unit == 4) {
      CopyUnits(reinterpret_cast<uint32_t*>(to), reinterpret_cast<const uint32_t*>(from), units,
                part, group);
    } else {
      CopyUnits(to, from, units, part, group);
    }
  }
  __syncwarp();
}

// *d += *s for one element, with the CPU core's rules (value_ops.h): floats
// in their type (half and bfloat16 through float, rounded to nearest even),
// integers wrap, bool is logical or.
__device__ __forceinline__ void AddElement(ValueType type, char* d, const char* s) {
  switch (type) {
    case ValueType::kFloat32:
      *reinterpret_cast<float*>(d) += *reinterpret_cast<const float*>(s);
      return;
    case ValueType::kFloat64:
      *reinterpret_cast<double*>(d) += *reinterpret_cast<const double*>(s);
      return;
    case ValueType::kFloat16: {
      uint16_t* dh = reinterpret_cast<uint16_t*>(d);
      const float sum = __half2float(__ushort_as_half(*dh)) +
                        __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t*>(s)));
      *dh = __half_as_ushort(__float2half_rn(sum));
      return;
    }
    case ValueType::kBFloat16: {
      uint16_t* db = reinterpret_cast<uint16_t*>(d);
      const float sum =
          __bfloat162float(__ushort_as_bfloat16(*db)) +
          __bfloat162float(__ushort_as_bfloat16(*reinterpret_cast<const uint16_t*>(s)));
      *db = __bfloat16_as_ushort(__float2bfloat16_rn(sum));
      return;
    }
    case ValueType::kInt8:
      *reinterpret_cast<uint8_t*>(d) = static_cast<uint8_t>(
          *reinterpret_cast<uint8_t*>(d) + *reinterpret_cast<const uint8_t*>(s));
      return;
    case ValueType::kInt32:
      *reinterpret_cast<uint32_t*>(d) += *reinterpret_cast<const uint32_t*>(s);
      return;
    case ValueType::kInt64:
      *reinterpret_cast<uint64_t*>(d) += *reinterpret_cast<const uint64_t*>(s);
      return;
    case ValueType::kBool:
      *reinterpret_cast<uint8_t*>(d) =
          (*reinterpret_cast<uint8_t*>(d) | *reinterpret_cast<const uint8_t*>(s)) ? 1 : 0;
      return;
  }
}

// dst += src elementwise over a row of `dim` elements of `elem` bytes.
__device__ __forceinline__ void WarpAddRow(ValueType type, uint32_t elem, int64_t dim, char* dst,
                                           const char* src, int lane) {
  for (int64_t e = lane; e < dim; e += kWarpSize) AddElement(type, dst + e * elem, src + e * elem);
  __syncwarp();
}

}  // namespace gpu
}  // namespace dynemb

#endif  // DYNEMB_CORE_GPU_DEVICE_TABLE_CUH_
