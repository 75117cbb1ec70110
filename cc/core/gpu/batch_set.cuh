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
// the rows) slots with linear probing. A slot is owned by the first row that
// claims it (atomicCAS of the row's position into owner[slot]); a key is
// compared against the batch's own keys (keys[owner[slot]]), which nobody
// writes, so no reader can see a half-written key. first / last / count
// are folded in with atomicMin / atomicMax / atomicAdd, which commute, so
// the result does not depend on the threads' order. slot_of_row[p] keeps
// the slot of row p for the passes that follow.

#ifndef DYNEMB_CORE_GPU_BATCH_SET_CUH_
#define DYNEMB_CORE_GPU_BATCH_SET_CUH_

#include <cstdint>

#include "cc/core/gpu/device_table.cuh"

namespace dynemb {
namespace gpu {

constexpr uint32_t kNoRow = 0xffffffffu;

template <typename K>
struct BatchSet {
  const K* keys = nullptr;         // the batch's keys [n] (not owned)
  uint32_t* owner = nullptr;       // [capacity], kNoRow: empty      } one block, set to 0xff
  uint32_t* first = nullptr;       // [capacity], smallest row       }
  uint32_t* last = nullptr;        // [capacity], largest row        } one block, set to 0
  uint32_t* count = nullptr;       // [capacity], rows of the key    }
  uint32_t* slot_of_row = nullptr; // [n]
  uint64_t capacity = 0;           // a power of two, >= 2n
  uint32_t n = 0;

  // Whether row p is the last row of its key (the one an insert writes).
  __device__ __forceinline__ bool IsLastRow(uint32_t p) const { return last[slot_of_row[p]] == p; }
};

// The set's capacity for n rows: a power of two >= 2n (at most half full, so
// probes stay short), and at least 64.
inline uint64_t BatchSetCapacity(uint64_t n) {
  uint64_t c = 64;
  while (c < 2 * n) c *= 2;
  return c;
}

// One thread per row: finds or claims its key's slot, then folds the row in.
template <typename K>
__global__ void __launch_bounds__(256) BatchSetKernel(BatchSet<K> s) {
  const uint64_t mask = s.capacity - 1;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < s.n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    const uint32_t p = static_cast<uint32_t>(i);
    const K key = s.keys[p];
    uint64_t slot = HashKey(key) & mask;
    for (;;) {
      uint32_t owner = __ldcg(s.owner + slot);
      if (owner == kNoRow) {
        owner = atomicCAS(s.owner + slot, kNoRow, p);
        if (owner == kNoRow) break;  // claimed for this key
      }
      if (s.keys[owner] == key) break;  // the key's slot
      slot = (slot + 1) & mask;
    }
    s.slot_of_row[p] = static_cast<uint32_t>(slot);
    atomicMin(s.first + slot, p);
    atomicMax(s.last + slot, p);
    atomicAdd(s.count + slot, 1u);
  }
}

// Builds the set of `set->keys` [set->n] in `set->capacity` slots
// (BatchSetCapacity): `high` and `low` are 2 * capacity words each (owner and
// first, last and count), slot_of_row has n words. Queued on `stream`.
template <typename K>
cudaError_t BuildBatchSet(BatchSet<K>* set, uint32_t* high, uint32_t* low, int grid,
                          cudaStream_t stream) {
  set->owner = high;
  set->first = high + set->capacity;
  set->last = low;
  set->count = low + set->capacity;
  cudaError_t error = cudaMemsetAsync(high, 0xff, 2 * set->capacity * sizeof(uint32_t), stream);
  if (error == cudaSuccess) {
    error = cudaMemsetAsync(low, 0, 2 * set->capacity * sizeof(uint32_t), stream);
  }
  if (error != cudaSuccess || set->n == 0) return error;
  BatchSetKernel<K><<<grid, 256, 0, stream>>>(*set);
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace dynemb

#endif  // DYNEMB_CORE_GPU_BATCH_SET_CUH_
