// A batch's distinct keys, found without sorting: a hash set in scratch
// memory that lives for one operation.
//
// Why: a write must be deterministic when a batch repeats a key (the last
// row wins, scores fold row by row: table.h's sequential semantics). The
// sort that grouped every batch by key (GroupedBatch) cost about as much as
// the write itself, and most batches of a training step repeat no key at
// all. The set answers what an insert needs without any ordering: per
// distinct key, its last row (whose values win), its first row, and how
// many rows it has. Accum and ApplyRule, which add rows in batch order, keep
// the sorted grouping.
//
// Layout: open addressing over `capacity` (a power of two, at least twice
// the rows) entries with linear probing. An entry is 16 bytes -- owner,
// first, last, count -- so that the four atomics a row makes, and the reads
// of last and count that follow, touch one cache sector instead of four.
// (On an H200 that changed little: 82 us for 1M keys with four arrays, 77
// with entries, within the run-to-run spread; the set's time is its
// atomics.) Every field is encoded so that all-zero bytes are the empty
// entry, so one memset clears the set. An entry is owned by
// the first row that claims it (atomicCAS of the row's position + 1 into
// owner); a key is compared against the batch's own keys (keys[owner - 1]),
// which nobody writes, so no reader can see a half-written key. first /
// last / count are folded in with atomicMax / atomicMax / atomicAdd, which
// commute, so the result does not depend on the threads' order.
// slot_of_row[p] keeps the entry of row p for the passes that follow.

#ifndef DYNEMB_CORE_GPU_BATCH_SET_CUH_
#define DYNEMB_CORE_GPU_BATCH_SET_CUH_

#include <cstdint>

#include "cc/core/gpu/device_table.cuh"

namespace dynemb {
namespace gpu {

// One distinct key of the batch; all zero: empty.
struct alignas(16) BatchSetEntry {
  uint32_t owner_plus_1;  // the claiming row + 1
  uint32_t not_first;     // ~(smallest row): atomicMax of ~p keeps the smallest p
  uint32_t last_plus_1;   // largest row + 1
  uint32_t count;         // rows of the key
};

template <typename K>
struct BatchSet {
  const K* keys = nullptr;           // the batch's keys [n] (not owned)
  BatchSetEntry* entries = nullptr;  // [capacity]
  uint32_t* slot_of_row = nullptr;   // [n]
  uint64_t capacity = 0;             // a power of two, >= 2n
  uint32_t n = 0;

  __device__ __forceinline__ uint32_t First(uint32_t slot) const {
    return ~entries[slot].not_first;
  }
  __device__ __forceinline__ uint32_t Last(uint32_t slot) const {
    return entries[slot].last_plus_1 - 1;
  }
  __device__ __forceinline__ uint32_t Count(uint32_t slot) const { return entries[slot].count; }
  // Whether row p is the last row of its key (the one an insert writes).
  __device__ __forceinline__ bool IsLastRow(uint32_t p) const { return Last(slot_of_row[p]) == p; }
};

// The set's capacity for n rows: a power of two >= 2n (at most half full, so
// probes stay short), and at least 64.
inline uint64_t BatchSetCapacity(uint64_t n) {
  uint64_t c = 64;
  while (c < 2 * n) c *= 2;
  return c;
}

// Bytes of the entries of a set of `capacity` (BatchSetCapacity).
inline size_t BatchSetBytes(uint64_t capacity) {
  return static_cast<size_t>(capacity) * sizeof(BatchSetEntry);
}

// One thread per row: finds or claims its key's entry, then folds the row in.
template <typename K>
__global__ void __launch_bounds__(256) BatchSetKernel(BatchSet<K> s) {
  const uint64_t mask = s.capacity - 1;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < s.n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const uint32_t p = static_cast<uint32_t>(i);
    const K key = s.keys[p];
    uint64_t slot = HashKey(key) & mask;
    for (;;) {
      BatchSetEntry& e = s.entries[slot];
      uint32_t owner = __ldcg(&e.owner_plus_1);
      if (owner == 0) {
        owner = atomicCAS(&e.owner_plus_1, 0u, p + 1);
        if (owner == 0) break;  // claimed for this key
      }
      if (s.keys[owner - 1] == key) break;  // the key's entry
      slot = (slot + 1) & mask;
    }
    s.slot_of_row[p] = static_cast<uint32_t>(slot);
    BatchSetEntry& e = s.entries[slot];
    atomicMax(&e.not_first, ~p);
    atomicMax(&e.last_plus_1, p + 1);
    atomicAdd(&e.count, 1u);
  }
}

// Builds the set of `set->keys` [set->n] in `entries`, BatchSetBytes(capacity)
// bytes of device memory, 16-byte aligned; set->capacity is
// BatchSetCapacity(n). slot_of_row has n words. Queued on `stream`.
template <typename K>
cudaError_t BuildBatchSet(BatchSet<K>* set, void* entries, int grid, cudaStream_t stream) {
  set->entries = static_cast<BatchSetEntry*>(entries);
  cudaError_t error = cudaMemsetAsync(entries, 0, BatchSetBytes(set->capacity), stream);
  if (error != cudaSuccess || set->n == 0) return error;
  BatchSetKernel<K><<<grid, 256, 0, stream>>>(*set);
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace dynemb

#endif  // DYNEMB_CORE_GPU_BATCH_SET_CUH_
