// The kernels of the GPU table (gpu_table.cu queues them). Each kernel is a
// grid-stride loop in which one warp handles one item (a key, a distinct key
// of a batch, an entry to move or report), except lookups: Find and
// ApplyWrites have each lane look up one key of the warp's run of keys, and
// Remove takes one key per thread. Per-warp counts are summed per
// block in shared memory and added to the global BatchCounters once per
// block, so a million-key batch makes thousands of global atomics, not
// millions.

#ifndef DYNEMB_CORE_GPU_GPU_KERNELS_CUH_
#define DYNEMB_CORE_GPU_GPU_KERNELS_CUH_

#include <cstdint>

#include "cc/core/gpu/batch_set.cuh"
#include "cc/core/gpu/device_table.cuh"
#include "cc/core/gpu/eviction_plan.h"
#include "cc/core/score_rule.h"
#include "cc/core/update_rules.h"

namespace dynemb {
namespace gpu {

constexpr int kBlockThreads = 256;
constexpr int kWarpsPerBlock = kBlockThreads / kWarpSize;
// Blocks per SM that kernels with a lookup per lane ask the compiler to fit
// (at most 85 registers per thread): their speed comes from the lookups in
// flight, so registers are traded for warps.
constexpr int kLookupBlocksPerSm = 3;

// What one write batch did, summed on the device and read once per batch.
struct BatchCounters {
  unsigned long long inserts;    // rows that created a key
  unsigned long long updates;    // rows that wrote a present key
  unsigned long long removes;    // keys removed
  unsigned long long new_empty;  // claims of empty slots (the rest reused deleted ones)
  unsigned long long reused;     // claims of deleted slots
  unsigned long long new_keys;   // first round: distinct absent keys that will insert
  unsigned long long failures;   // claims that found no free slot (a bug if nonzero)
};
constexpr int kNumBatchCounters = sizeof(BatchCounters) / sizeof(unsigned long long);

struct WarpCounts {
  unsigned long long v[kNumBatchCounters] = {};
  __device__ unsigned long long& inserts() { return v[0]; }
  __device__ unsigned long long& updates() { return v[1]; }
  __device__ unsigned long long& removes() { return v[2]; }
  __device__ unsigned long long& new_empty() { return v[3]; }
  __device__ unsigned long long& reused() { return v[4]; }
  __device__ unsigned long long& new_keys() { return v[5]; }
  __device__ unsigned long long& failures() { return v[6]; }
  __device__ void Claimed(bool was_empty) { ++v[was_empty ? 3 : 4]; }
};

// Adds every warp's N counts (held by its lane 0) into out[0, N): one
// shared-memory sum per block, then one global atomic per counter and block.
// Called by all threads of the block at the end of a kernel.
template <int N>
__device__ void FlushCounts(const unsigned long long (&counts)[N], unsigned long long* out) {
  static_assert(N <= kBlockThreads, "one thread per counter");
  __shared__ unsigned long long block_sum[N];
  if (threadIdx.x < N) block_sum[threadIdx.x] = 0;
  __syncthreads();
  if (threadIdx.x % kWarpSize == 0) {
    for (int c = 0; c < N; ++c) {
      if (counts[c] != 0) atomicAdd(&block_sum[c], counts[c]);
    }
  }
  __syncthreads();
  if (threadIdx.x < N && block_sum[threadIdx.x] != 0) atomicAdd(out + threadIdx.x, block_sum[threadIdx.x]);
}

__device__ __forceinline__ int Lane() { return threadIdx.x % kWarpSize; }
__device__ __forceinline__ uint64_t WarpId() {
  return (static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarpSize;
}
__device__ __forceinline__ uint64_t NumWarps() {
  return static_cast<uint64_t>(gridDim.x) * blockDim.x / kWarpSize;
}

// Sums each lane's counts into lane 0's (for kernels whose lanes count on
// their own; FlushCounts takes lane 0's). Called by all 32 lanes.
template <int N>
__device__ void SumCountsIntoLane0(unsigned long long (&counts)[N]) {
  for (int c = 0; c < N; ++c) {
    for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
      counts[c] += __shfl_down_sync(kFullMask, counts[c], offset);
    }
  }
}

// How many items a warp takes from `first` in kernels whose lanes first look
// up one key each (ThreadFind) and then the warp handles the keys one by one:
// items [first, first + count) of n, with first + lane this lane's item.
__device__ __forceinline__ int ChunkCount(uint64_t first, uint64_t n, int per_warp) {
  return static_cast<int>(n - first < uint64_t(per_warp) ? n - first : per_warp);
}

// ---------------------------------------------------------------------------
// A batch grouped by key: sorted_keys / sorted_pos are the batch's keys and
// positions sorted by key (stably: each key's positions ascend), starts[u] is
// where distinct key u's rows begin.
// ---------------------------------------------------------------------------
template <typename K>
struct GroupedBatch {
  const K* sorted_keys = nullptr;
  const uint32_t* sorted_pos = nullptr;
  const uint32_t* starts = nullptr;
  const uint32_t* num_keys = nullptr;  // device scalar: distinct keys
  uint32_t n = 0;

  __device__ void Segment(uint32_t u, uint32_t* begin, uint32_t* end) const {
    *begin = starts[u];
    *end = u + 1 < *num_keys ? starts[u + 1] : n;
  }
};

// Which keys a pass over a grouped batch applies (gpu_table.h "Bounded tables").
enum class ApplyMode : int {
  kAll = 0,          // every key
  kPresentOnly = 1,  // keys present now; absent keys' rows are marked in key_of_row
  kAbsentOnly = 2,   // keys absent now
};

// Distinct key u of a grouped batch, looked up by one thread: its rows
// [*b, *e), the key, its hash and its slot (kNoSlot: absent).
template <typename K>
__device__ __forceinline__ void LookUpGroupedKey(const DeviceTable<K>& t,
                                                 const GroupedBatch<K>& batch, uint64_t u,
                                                 uint32_t* b, uint32_t* e, K* key,
                                                 uint64_t* hash, uint64_t* slot) {
  batch.Segment(static_cast<uint32_t>(u), b, e);
  *key = batch.sorted_keys[*b];
  *hash = HashKey(*key);
  *slot = ThreadFind(t, *key, *hash);
}

// Whether a pass in `mode` leaves a key alone, given whether it is present.
__device__ __forceinline__ bool PassSkips(ApplyMode mode, bool present) {
  return present ? mode == ApplyMode::kAbsentOnly : mode == ApplyMode::kPresentOnly;
}

struct WriteArgs {
  const char* rows = nullptr;         // insert: values; accum: deltas ([n, dim])
  const uint64_t* scores = nullptr;   // insert: explicit scores (nullable)
  const bool* exists = nullptr;       // accum: flags; nullptr for insert
  ScoreRule rule{};
  uint64_t age_base = 0;              // row p is written at age_base + p
  ApplyMode mode = ApplyMode::kAll;
  uint32_t* key_of_row = nullptr;     // kPresentOnly: [n], absent keys' rows get their key id
  ValueType value_type = ValueType::kFloat32;
  int64_t dim = 0;
  uint32_t elem_bytes = 0;
};

// Claims a slot for `key` (absent, and inserted by this warp alone) and
// writes the key into it; the caller writes the rest, then PublishTag.
// Returns kNoSlot, counted as a failure, if no slot is free.
template <typename K>
__device__ uint64_t ClaimNewKey(const DeviceTable<K>& t, K key, uint64_t hash, int lane,
                                WarpCounts* counts) {
  bool was_empty = false;
  const uint64_t slot = WarpClaim(t, hash, lane, &was_empty);
  if (slot == kNoSlot) {
    ++counts->failures();
    return kNoSlot;
  }
  counts->Claimed(was_empty);
  if (lane == 0) t.keys[slot] = key;
  return slot;
}

// The score `rows` insert rows of one distinct key, present at `slot` (or
// absent: kNoSlot), leave, the last of them being row `last`: sequentially
// an explicit score is the last row's, and a rule's score folds over every
// row. With the last row's values, that is all a write of the key needs. One
// thread's work (each lane folds its own key).
template <typename K>
__device__ uint64_t FoldInsertScore(const DeviceTable<K>& t, const WriteArgs& a, uint64_t slot,
                                    uint32_t last, uint32_t rows) {
  if (a.scores != nullptr) return a.scores[last];
  bool seen = slot != kNoSlot;
  uint64_t folded = seen ? t.scores[slot] : 0;
  for (uint32_t r = 0; r < rows; ++r) {
    folded = a.rule.Score(seen, folded);
    seen = true;
  }
  return folded;
}

// Writes the result of insert rows [b, e) of one distinct key, folded by
// FoldInsertScore: `score` and the age of row `last`, into `slot` (or a slot
// claimed for the key when absent: kNoSlot). Returns the slot, whose value
// row the caller then copies from row `last` (rows of several keys at once),
// or kNoSlot if no slot could be claimed. No one reads the row before the
// kernel ends: lookups run in later kernels, and no other warp writes or
// looks for this key.
template <typename K>
__device__ uint64_t WriteInsertedKey(const DeviceTable<K>& t, const WriteArgs& a, K key,
                                     uint64_t hash, uint64_t slot, uint32_t rows, uint64_t score,
                                     uint32_t last, int lane, WarpCounts* counts) {
  const bool existed = slot != kNoSlot;
  if (!existed) {
    slot = ClaimNewKey(t, key, hash, lane, counts);
    if (slot == kNoSlot) return kNoSlot;
    ++counts->inserts();
    counts->updates() += rows - 1;
  } else {
    counts->updates() += rows;
  }
  if (lane == 0) {
    t.scores[slot] = score;
    t.ages[slot] = a.age_base + last;
    if (!existed) PublishTag(t, slot, hash);
  }
  return slot;
}

// Accum rows [b, e) of one distinct key, in batch order: a row with exists
// adds into a present key, a row without inserts an absent one, others do
// nothing.
template <typename K>
__device__ void AccumKeyRows(const DeviceTable<K>& t, const GroupedBatch<K>& batch,
                             const WriteArgs& a, K key, uint64_t hash, uint64_t slot,
                             uint32_t b, uint32_t e, int lane, WarpCounts* counts) {
  bool present = slot != kNoSlot;
  bool claimed = false, written = false;
  uint64_t score = present ? t.scores[slot] : 0;
  uint64_t age = 0;
  for (uint32_t j = b; j < e; ++j) {
    const uint32_t p = batch.sorted_pos[j];
    const char* delta = a.rows + static_cast<uint64_t>(p) * t.value_bytes;
    if (a.exists[p] && present) {
      WarpAddRow(a.value_type, a.elem_bytes, a.dim, t.Row(slot), delta, lane);
      score = a.rule.Score(true, score);
      ++counts->updates();
    } else if (!a.exists[p] && !present) {
      slot = ClaimNewKey(t, key, hash, lane, counts);
      if (slot == kNoSlot) return;
      WarpCopy(t.Row(slot), delta, t.value_bytes, lane);
      score = a.rule.Score(false, 0);
      present = claimed = true;
      ++counts->inserts();
    } else {
      continue;
    }
    age = a.age_base + p;
    written = true;
  }
  if (written && lane == 0) {
    t.scores[slot] = score;
    t.ages[slot] = age;
    if (claimed) PublishTag(t, slot, hash);
  }
}

// Whether distinct key [b, e), absent, inserts (accum: some row has exists = false).
__device__ inline bool WillInsert(const uint32_t* sorted_pos, const bool* exists, uint32_t b,
                                  uint32_t e, int lane) {
  if (exists == nullptr) return true;
  bool any = false;
  for (uint32_t j = b + lane; j < e; j += kWarpSize) any = any || !exists[sorted_pos[j]];
  return __any_sync(kFullMask, any);
}

// Insert: each key a lane k < count wrote (into slot `my_written`; kNoSlot:
// none) gets the value row of its last row `my_last`, copied by the warp.
template <typename K>
__device__ void CopyWrittenRows(const DeviceTable<K>& t, const WriteArgs& a, int count,
                                uint32_t my_last, uint64_t my_written, int lane) {
  const uintptr_t bases = reinterpret_cast<uintptr_t>(a.rows) |
                          reinterpret_cast<uintptr_t>(t.hbm_values) |
                          reinterpret_cast<uintptr_t>(t.host_values);
  WarpCopyRows(
      count, t.value_bytes, bases,
      [&](int k) -> const char* {
        const uint64_t last = __shfl_sync(kFullMask, my_last, k);
        return a.rows + last * t.value_bytes;
      },
      [&](int k) -> char* {
        const uint64_t slot = __shfl_sync(kFullMask, my_written, k);
        return slot != kNoSlot ? t.Row(slot) : nullptr;
      },
      lane);
}

// Each warp takes `per_warp` (1 to 32) distinct keys at a time: every lane
// looks up one (ThreadFind) and, for inserts, folds its rows, then the warp
// applies the keys one after the other. Only this warp writes its keys, so a
// key's slot, looked up ahead, stays right while other warps claim slots for
// theirs.
template <typename K>
__global__ void __launch_bounds__(kBlockThreads, kLookupBlocksPerSm)
    ApplyWritesKernel(DeviceTable<K> t, GroupedBatch<K> batch, WriteArgs a,
                      unsigned long long* counters, int per_warp) {
  WarpCounts counts;
  const int lane = Lane();
  const uint64_t num_keys = *batch.num_keys;
  for (uint64_t first = WarpId() * per_warp; first < num_keys; first += NumWarps() * per_warp) {
    const int count = ChunkCount(first, num_keys, per_warp);
    uint32_t my_b = 0, my_e = 0;
    K my_key{};
    uint64_t my_hash = 0, my_slot = kNoSlot, my_score = 0;
    uint32_t my_last = 0;
    if (lane < count) {
      LookUpGroupedKey(t, batch, first + lane, &my_b, &my_e, &my_key, &my_hash, &my_slot);
      if (a.exists == nullptr && !PassSkips(a.mode, my_slot != kNoSlot)) {
        my_last = batch.sorted_pos[my_e - 1];
        my_score = FoldInsertScore(t, a, my_slot, my_last, my_e - my_b);
      }
    }
    uint64_t my_written = kNoSlot;  // lane j: the slot insert wrote key first + j into
    for (int j = 0; j < count; ++j) {
      const uint64_t u = first + j;
      const uint32_t b = __shfl_sync(kFullMask, my_b, j);
      const uint32_t e = __shfl_sync(kFullMask, my_e, j);
      const K key = __shfl_sync(kFullMask, my_key, j);
      const uint64_t hash = __shfl_sync(kFullMask, my_hash, j);
      const uint64_t slot = __shfl_sync(kFullMask, my_slot, j);
      if (PassSkips(a.mode, slot != kNoSlot)) {
        if (slot == kNoSlot) {  // kPresentOnly: mark the absent key's rows for the next pass
          for (uint32_t r = b + lane; r < e; r += kWarpSize) {
            a.key_of_row[batch.sorted_pos[r]] = static_cast<uint32_t>(u);
          }
          if (WillInsert(batch.sorted_pos, a.exists, b, e, lane)) ++counts.new_keys();
        }
        continue;
      }
      if (a.exists == nullptr) {
        const uint64_t written =
            WriteInsertedKey(t, a, key, hash, slot, e - b, __shfl_sync(kFullMask, my_score, j),
                             __shfl_sync(kFullMask, my_last, j), lane, &counts);
        if (lane == j) my_written = written;
      } else {
        AccumKeyRows(t, batch, a, key, hash, slot, b, e, lane, &counts);
      }
    }
    CopyWrittenRows(t, a, count, my_last, my_written, lane);
  }
  FlushCounts(counts.v, counters);
}

// An insert (mode kAll), an assign (kPresentOnly: present keys only, absent
// ones are left out) or the second pass of an insert that grew the table
// (kAbsentOnly), whose distinct keys come from a BatchSet rather than a sort
// (batch_set.cuh). Each warp takes `per_warp` (1 to 32) consecutive rows at
// a time; a lane whose row is its key's last row looks the key up, folds
// the key's score over its rows and writes the key itself: a present key's
// score and age, or an absent key's claimed slot (ThreadClaim), key, score,
// age and tag. No other thread writes that key, so a slot looked up ahead
// stays right. Then the warp copies the written keys' rows. Rows that a
// later row of the same key overrides do nothing. kPresentOnly counts the
// distinct absent keys in new_keys (what the second pass will insert).
// Counts are per lane here, in 32 bits (a lane counts at most its rows; 64-bit
// counters spilled registers), summed into lane 0 at the end.
template <typename K>
__global__ void __launch_bounds__(kBlockThreads, kLookupBlocksPerSm)
    ApplyLastRowsKernel(DeviceTable<K> t, BatchSet<K> set, WriteArgs a,
                        unsigned long long* counters, int per_warp) {
  struct {
    uint32_t inserts = 0, updates = 0, new_empty = 0, reused = 0, new_keys = 0, failures = 0;
  } lane_counts;
  const int lane = Lane();
  const uint64_t n = set.n;
  for (uint64_t first = WarpId() * per_warp; first < n; first += NumWarps() * per_warp) {
    const int count = ChunkCount(first, n, per_warp);
    const uint32_t my_row = static_cast<uint32_t>(first + lane);
    uint64_t my_written = kNoSlot;
    if (lane < count && set.IsLastRow(my_row)) {
      const K key = set.keys[my_row];
      const uint64_t hash = HashKey(key);
      uint64_t slot = ThreadFind(t, key, hash);
      const bool present = slot != kNoSlot;
      if (!present && a.mode == ApplyMode::kPresentOnly) ++lane_counts.new_keys;
      if (!PassSkips(a.mode, present)) {
        const uint32_t rows = set.Count(set.slot_of_row[my_row]);
        const uint64_t score = FoldInsertScore(t, a, slot, my_row, rows);
        if (!present) {
          bool was_empty = false;
          slot = ThreadClaim(t, hash, &was_empty);
          if (slot == kNoSlot) {
            ++lane_counts.failures;
          } else {
            t.keys[slot] = key;
            ++(was_empty ? lane_counts.new_empty : lane_counts.reused);
            ++lane_counts.inserts;
            lane_counts.updates += rows - 1;
          }
        } else {
          lane_counts.updates += rows;
        }
        if (slot != kNoSlot) {
          t.scores[slot] = score;
          t.ages[slot] = a.age_base + my_row;
          if (!present) PublishTag(t, slot, hash);  // after the key (its fence)
          my_written = slot;
        }
      }
    }
    CopyWrittenRows(t, a, count, my_row, my_written, lane);
  }
  WarpCounts counts;
  counts.inserts() = lane_counts.inserts;
  counts.updates() = lane_counts.updates;
  counts.new_empty() = lane_counts.new_empty;
  counts.reused() = lane_counts.reused;
  counts.new_keys() = lane_counts.new_keys;
  counts.failures() = lane_counts.failures;
  SumCountsIntoLane0(counts.v);
  FlushCounts(counts.v, counters);
}

// The most coefficients a rule step takes: Keras' weight decay (2) and the
// rule's own (Nadam: 9).
constexpr int kMaxRuleCoefficients = 16;

// One ApplyRule step (table.h, update_rules.h) as a kernel takes it. Rows
// are [n, dim] arrays of T in device memory; `initial` is one state row.
template <typename T>
struct RuleArgs {
  UpdateRule rule = UpdateRule::kKerasAdam;
  bool weight_decay = false;
  T coefficients[kMaxRuleCoefficients] = {};
  int slots = 1;     // state row = slots * dim
  int64_t dim = 0;   // parameter row width
  const T* rows = nullptr;
  const T* grads = nullptr;
  T* new_rows = nullptr;
  const T* initial = nullptr;
};

// Applies rows [b, e) of one distinct key (batch order) to its state row
// `state` -- a copy of `initial` first when the key was just inserted -- and
// writes each row's new parameter row. Each lane takes the columns lane,
// lane + 32, ...: a column's slots stay in registers across the key's rows,
// and ApplyRuleToRow runs on one column (dim 1: its slots are then s[0],
// s[1], s[2]), the CPU rule's exact operations. The slot loops run to 3
// with a guard, so that s is indexed by constants and stays in registers (a
// loop to r.slots put it in local memory: a 192-byte stack frame, measured
// by ptxas), and `coefficients` is the block's shared copy (the rule indexes
// them past a runtime offset, which on a kernel parameter forces another
// local copy).
template <typename K, typename T>
__device__ void ApplyRuleToKeyRows(const GroupedBatch<K>& batch, const RuleArgs<T>& r,
                                   const T* coefficients, uint32_t b, uint32_t e, bool existed,
                                   T* state, int lane) {
  const T* from = existed ? state : r.initial;
  for (int64_t col = lane; col < r.dim; col += kWarpSize) {
    T s[3] = {T(0), T(0), T(0)};
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      if (k < r.slots) s[k] = from[k * r.dim + col];
    }
    for (uint32_t q = b; q < e; ++q) {
      const uint64_t at = static_cast<uint64_t>(batch.sorted_pos[q]) * r.dim + col;
      const T w = r.rows[at];
      const T g = r.grads[at];
      T out;
      ApplyRuleToRow<T>(r.rule, r.weight_decay, coefficients, 1, &w, &g, s, &out);
      r.new_rows[at] = out;  // after reading rows[at]: new_rows may alias rows
    }
#pragma unroll
    for (int k = 0; k < 3; ++k) {
      if (k < r.slots) state[k * r.dim + col] = s[k];
    }
  }
  __syncwarp();
}

// ApplyRule over a grouped batch (modes as ApplyWritesKernel; tables that
// take ApplyRule are unbounded, so kPresentOnly only counts the new keys).
// Each warp takes `per_warp` distinct keys: lanes look them up, then the
// warp claims, scores and updates them one by one.
template <typename K, typename T>
__global__ void __launch_bounds__(kBlockThreads, kLookupBlocksPerSm)
    ApplyRuleKernel(DeviceTable<K> t, GroupedBatch<K> batch, WriteArgs a,
                    const __grid_constant__ RuleArgs<T> r,
                    unsigned long long* counters, int per_warp) {
  // The rule's coefficients, shared (ApplyRuleToKeyRows says why).
  __shared__ T coefficients[kMaxRuleCoefficients];
#pragma unroll
  for (int i = 0; i < kMaxRuleCoefficients; ++i) {
    if (threadIdx.x == i) coefficients[i] = r.coefficients[i];
  }
  __syncthreads();
  WarpCounts counts;
  const int lane = Lane();
  const uint64_t num_keys = *batch.num_keys;
  for (uint64_t first = WarpId() * per_warp; first < num_keys; first += NumWarps() * per_warp) {
    const int count = ChunkCount(first, num_keys, per_warp);
    uint32_t my_b = 0, my_e = 0;
    K my_key{};
    uint64_t my_hash = 0, my_slot = kNoSlot;
    if (lane < count) {
      LookUpGroupedKey(t, batch, first + lane, &my_b, &my_e, &my_key, &my_hash, &my_slot);
    }
    for (int j = 0; j < count; ++j) {
      const uint32_t b = __shfl_sync(kFullMask, my_b, j);
      const uint32_t e = __shfl_sync(kFullMask, my_e, j);
      const uint64_t slot = __shfl_sync(kFullMask, my_slot, j);
      const bool existed = slot != kNoSlot;
      if (PassSkips(a.mode, existed)) {
        if (!existed) ++counts.new_keys();
        continue;
      }
      const uint32_t last = batch.sorted_pos[e - 1];
      const uint64_t written = WriteInsertedKey(
          t, a, __shfl_sync(kFullMask, my_key, j), __shfl_sync(kFullMask, my_hash, j), slot,
          e - b, FoldInsertScore(t, a, slot, last, e - b), last, lane, &counts);
      if (written == kNoSlot) continue;
      ApplyRuleToKeyRows(batch, r, coefficients, b, e, existed,
                         reinterpret_cast<T*>(t.Row(written)), lane);
    }
  }
  FlushCounts(counts.v, counters);
}

// Each warp takes `per_warp` (1 to 32) consecutive keys at a time: every
// lane looks up one (ThreadFind), so that a warp has up to 32 lookups in
// flight, then the warp copies their rows (WarpCopyRows: many narrow rows at
// once, wide ones coalesced).
template <typename K>
__global__ void __launch_bounds__(kBlockThreads, kLookupBlocksPerSm)
    FindKernel(DeviceTable<K> t, const K* keys, uint64_t n, char* values, bool* exists,
               const char* defaults, bool default_per_key, bool touch, ScoreRule rule,
               unsigned long long* misses, int per_warp) {
  unsigned long long counts[1] = {0};  // this lane's misses
  const int lane = Lane();
  for (uint64_t first = WarpId() * per_warp; first < n; first += NumWarps() * per_warp) {
    const int count = ChunkCount(first, n, per_warp);
    const uint64_t mine = first + lane;
    uint64_t my_slot = kNoSlot;
    if (lane < count) {
      const K key = keys[mine];
      my_slot = ThreadFind(t, key, HashKey(key));
      const bool found = my_slot != kNoSlot;
      if (exists != nullptr) exists[mine] = found;
      // LRU strategies only (the caller checks): the score does not depend
      // on the old one, so duplicate keys of a batch write the same value.
      if (found && touch) t.scores[my_slot] = rule.Score(true, t.scores[my_slot]);
      if (!found) ++counts[0];
    }
    const uintptr_t bases =
        reinterpret_cast<uintptr_t>(values) | reinterpret_cast<uintptr_t>(defaults) |
        reinterpret_cast<uintptr_t>(t.hbm_values) | reinterpret_cast<uintptr_t>(t.host_values);
    WarpCopyRows(
        count, t.value_bytes, bases,
        [&](int k) -> const char* {
          const uint64_t slot = __shfl_sync(kFullMask, my_slot, k);
          if (slot != kNoSlot) return t.Row(slot);
          return defaults + (default_per_key ? (first + k) * t.value_bytes : 0);
        },
        [&](int k) -> char* { return values + (first + k) * t.value_bytes; }, lane);
  }
  SumCountsIntoLane0(counts);
  FlushCounts(counts, misses);
}

// One thread per key. Two rows of one key find the same slot, and only one
// of them deletes it (TryDeleteTag).
template <typename K>
__global__ void __launch_bounds__(kBlockThreads)
    RemoveKernel(DeviceTable<K> t, const K* keys, uint64_t n, unsigned long long* counters) {
  WarpCounts counts;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const K key = keys[i];
    const uint64_t hash = HashKey(key);
    const uint64_t slot = ThreadFind(t, key, hash);
    if (slot != kNoSlot && TryDeleteTag(t, slot, TagOf(hash))) ++counts.removes();
  }
  SumCountsIntoLane0(counts.v);
  FlushCounts(counts.v, counters);
}

// Moves every occupied slot of `from` into `to` (empty, with room). Each warp
// takes 32 consecutive slots, one tag per lane, and moves the occupied ones.
template <typename K>
__global__ void __launch_bounds__(kBlockThreads)
    RehashKernel(DeviceTable<K> from, DeviceTable<K> to, unsigned long long* counters) {
  WarpCounts counts;
  const int lane = Lane();
  const uint64_t groups = from.num_slots() / kWarpSize;
  for (uint64_t g = WarpId(); g < groups; g += NumWarps()) {
    const uint64_t my_slot = g * kWarpSize + lane;
    unsigned occupied = __ballot_sync(kFullMask, from.tags[my_slot] >= kFirstTag);
    while (occupied != 0) {
      const uint64_t slot = g * kWarpSize + (__ffs(occupied) - 1);
      occupied &= occupied - 1;
      const K key = from.keys[slot];
      const uint64_t hash = HashKey(key);
      const uint64_t dst = ClaimNewKey(to, key, hash, lane, &counts);
      if (dst == kNoSlot) continue;
      WarpCopy(to.Row(dst), from.Row(slot), from.value_bytes, lane);
      if (lane == 0) {
        to.scores[dst] = from.scores[slot];
        to.ages[dst] = from.ages[slot];
        PublishTag(to, dst, hash);
      }
    }
  }
  FlushCounts(counts.v, counters);
}

// Where exported or evicted entries go; any pointer may be null (not wanted).
template <typename K>
struct EntrySink {
  K* keys = nullptr;
  char* values = nullptr;
  uint64_t* scores = nullptr;
};

// Out row i = the entry in `slot`, written by the whole warp.
template <typename K>
__device__ void WarpEmitEntry(const DeviceTable<K>& t, uint64_t slot, uint64_t i,
                              const EntrySink<K>& out, int lane) {
  if (out.values != nullptr) {
    WarpCopy(out.values + i * t.value_bytes, t.Row(slot), t.value_bytes, lane);
  }
  if (lane == 0) {
    if (out.keys != nullptr) out.keys[i] = t.keys[slot];
    if (out.scores != nullptr) out.scores[i] = t.scores[slot];
  }
}

// out[i] = the entry in slots[i], for i < n.
template <typename K>
__global__ void __launch_bounds__(kBlockThreads)
    GatherEntriesKernel(DeviceTable<K> t, const uint32_t* slots, uint64_t n, EntrySink<K> out) {
  const int lane = Lane();
  for (uint64_t i = WarpId(); i < n; i += NumWarps()) WarpEmitEntry(t, slots[i], i, out, lane);
}

// Reports the stored entries in slots[0, n) as evicted (out rows [0, n)) and
// deletes them.
template <typename K>
__global__ void __launch_bounds__(kBlockThreads)
    EvictSlotsKernel(DeviceTable<K> t, const uint32_t* slots, uint64_t n, EntrySink<K> out) {
  const int lane = Lane();
  for (uint64_t i = WarpId(); i < n; i += NumWarps()) {
    const uint64_t slot = slots[i];
    WarpEmitEntry(t, slot, i, out, lane);
    if (lane == 0) SwapTag(t, slot, TagOf(HashKey(t.keys[slot])), kDeletedTag);
  }
}

// Applies the planned stays of the second round (eviction_plan.h): stays[i]
// for i < num_kept are inserted into the table, the others are reported as
// evicted into out row (i - num_kept). A stay's value is what its rows make
// of it: the last row's values (insert), or the first row's delta plus the
// deltas of later rows with exists (accum), in batch order.
template <typename K>
__global__ void __launch_bounds__(kBlockThreads)
    ApplyStaysKernel(DeviceTable<K> t, GroupedBatch<K> batch, WriteArgs a,
                     const PlannedStay* stays, uint64_t num_stays, uint64_t num_kept,
                     EntrySink<K> out, unsigned long long* counters) {
  WarpCounts counts;
  const int lane = Lane();
  for (uint64_t i = WarpId(); i < num_stays; i += NumWarps()) {
    const PlannedStay stay = stays[i];
    uint32_t b, e;
    batch.Segment(stay.key, &b, &e);
    const K key = batch.sorted_keys[b];
    const uint64_t hash = HashKey(key);
    const bool kept = i < num_kept;
    char* dst = nullptr;
    uint64_t slot = kNoSlot;
    if (kept) {
      slot = ClaimNewKey(t, key, hash, lane, &counts);
      if (slot == kNoSlot) continue;
      dst = t.Row(slot);
    } else if (out.values != nullptr) {
      dst = out.values + (i - num_kept) * t.value_bytes;
    }
    if (dst != nullptr) {
      // Insert: the last row's values. Accum: the inserting row's delta, then
      // the later deltas that applied.
      const uint64_t copied = a.exists == nullptr ? stay.last_pos : stay.first_pos;
      WarpCopy(dst, a.rows + copied * t.value_bytes, t.value_bytes, lane);
      if (a.exists != nullptr) {
        for (uint32_t j = b; j < e; ++j) {
          const uint32_t p = batch.sorted_pos[j];
          if (p > stay.first_pos && p <= stay.last_pos && a.exists[p]) {
            WarpAddRow(a.value_type, a.elem_bytes, a.dim, dst,
                       a.rows + static_cast<uint64_t>(p) * t.value_bytes, lane);
          }
        }
      }
    }
    if (lane == 0) {
      if (kept) {
        t.scores[slot] = stay.score;
        t.ages[slot] = stay.age;
        PublishTag(t, slot, hash);
      } else {
        if (out.keys != nullptr) out.keys[i - num_kept] = key;
        if (out.scores != nullptr) out.scores[i - num_kept] = stay.score;
      }
    }
  }
  FlushCounts(counts.v, counters);
}

// Reports rows turned away: out row i = (keys[pos[i]], rows[pos[i]], scores[i]).
template <typename K>
__global__ void __launch_bounds__(kBlockThreads)
    ReportRowsKernel(const K* keys, const char* rows, uint32_t value_bytes, const uint32_t* pos,
                     const uint64_t* scores, uint64_t n, EntrySink<K> out) {
  const int lane = Lane();
  for (uint64_t i = WarpId(); i < n; i += NumWarps()) {
    const uint64_t p = pos[i];
    if (out.values != nullptr) {
      WarpCopy(out.values + i * value_bytes, rows + p * value_bytes, value_bytes, lane);
    }
    if (lane == 0) {
      if (out.keys != nullptr) out.keys[i] = keys[p];
      if (out.scores != nullptr) out.scores[i] = scores[i];
    }
  }
}

// ---------------------------------------------------------------------------
// Small helpers for sorting and selection.
// ---------------------------------------------------------------------------
__global__ void IotaKernel(uint32_t* out, uint64_t n) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    out[i] = static_cast<uint32_t>(i);
  }
}

// flags[i] = sorted[i] starts a new key.
template <typename K>
__global__ void KeyStartKernel(const K* sorted, uint64_t n, uint8_t* flags) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    flags[i] = i == 0 || sorted[i] != sorted[i - 1];
  }
}

// out[i] = values[index[i]].
__global__ void GatherU64Kernel(const uint64_t* values, const uint32_t* index, uint64_t n,
                                uint64_t* out) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    out[i] = values[index[i]];
  }
}

struct IsOccupied {
  const uint8_t* tags;
  __host__ __device__ bool operator()(uint32_t slot) const { return tags[slot] >= kFirstTag; }
};

}  // namespace gpu
}  // namespace dynemb

#endif  // DYNEMB_CORE_GPU_GPU_KERNELS_CUH_
