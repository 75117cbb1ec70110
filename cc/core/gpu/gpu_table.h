// The CUDA implementation of dynemb::Table (cc/core/table.h): the same
// semantics as the CPU table, checked by the same conformance tests through
// the pybind11 module tensorflow_dynemb._core_gpu.
//
// STATUS: compiled with nvcc (sm_80, sm_90); run on an H200 (docs/gpu.md
// says which parts ran where and when).
//
// Contract (differences from the CPU table are in how memory is passed only)
//   * Every pointer passed to a method -- keys, values, defaults, exists,
//     scores, deltas, EvictedEntries buffers, and the buffers an ExportSink
//     hands out -- is DEVICE memory (or memory the device can address).
//     Exception: ExportChunks hands its ChunkSink HOST pointers, since its
//     consumers (SaveTable's file writers) are host code.
//   * The Runner must be a GpuRunner: work is queued on its stream, with
//     scratch from its GpuScratch when it has one.
//   * Find is asynchronous: it returns once queued; read the results after
//     synchronizing the stream. So are Insert, Accum, ApplyRule and Assign
//     when the batch fits: when every row could be a new key without growth
//     or eviction (counting the keys that earlier unsynchronized writes may
//     have added). Their counts stay on the device ("pending") until
//     something needs them exact -- Size, Counters, export, Remove, or a
//     batch that may grow or evict -- which synchronizes once. A batch that
//     may grow or evict synchronizes once or twice (the number of new keys
//     decides growth and eviction; the evicted count is on the host when it
//     returns). Remove synchronizes. Export and ExportChunks have finished when
//     they return; the sink's buffers are filled on the table's stream (see
//     NewGpuTable), which Export synchronizes.
//   * Keys are int32 or int64 (string tables are refused with a clear
//     status); values are any ValueType; dim is a runtime value.
//   * Operations are thread-safe: a table serializes its operations (a host
//     mutex while queuing, and a CUDA event that each operation waits for, so
//     operations on different streams also run in order on the device).
//
// Layout
//   Open addressing over buckets of 128 slots. A slot i has a tag byte
//   tags[i] (0: empty, 1: deleted, 2: being written, 3..255: occupied, the
//   value being 3 + an 8-bit digest of the key's hash), the key keys[i], its
//   score, its age (when it was last written, as in table.h) and its value
//   row i. Occupancy lives in the tag, so every key value is valid. A key's
//   home bucket comes from its hash; when a bucket has no free slot an insert
//   moves on to the next bucket, so a lookup stops at the first bucket with an
//   empty slot. Removal leaves a "deleted" tag (reused by inserts; dropped by
//   the next rehash). One thread looks up one key: it reads the bucket's 128
//   tags (one 128-byte line) and compares keys only where the digest matches;
//   each lane of a warp looks up its own key, then the warp copies the value
//   rows one key after the other.
//   Value rows: row i of the first `max_hbm_for_values / row bytes` slots is
//   in device memory, the rest in mapped pinned host memory; kernels reach
//   both through one row-address function.
//   The table rehashes into twice the buckets when occupied + deleted slots
//   would pass 3/4 of the slots (bounded tables stop growing once 3/4 of the
//   slots cover max_capacity, and then rehash in place to drop deleted tags).
//
// Batches (sequential semantics, table.h)
//   An insert or assign finds its distinct keys with a hash set of the batch
//   (batch_set.cuh): per key its last row, whose values win, and its number
//   of rows, over which its score folds. No sort: the lane holding a key's
//   last row writes the key (claiming a slot for it by itself, ThreadClaim),
//   and the result does not depend on thread order. An insert that may grow
//   the table runs the set twice: present keys (counting the absent ones, one
//   host sync), growth, absent keys. Accum, ApplyRule and writes to a bounded
//   table that may evict add rows in batch order, so they sort instead
//   (ApplyRuleDistinct, for keys known to be distinct, needs no grouping):
//   keys are sorted with their batch positions (cub radix sort, stable), so
//   every distinct key's rows are adjacent and in batch order; one warp then
//   applies all rows of one key in order (last insert wins, accum deltas add
//   up in batch order, scores fold row by row), after its lanes have looked
//   up (and, for insert, folded) up to 32 keys at once. No two warps write
//   one key.
//
// Bounded tables (exactly the CPU core's rule, in batch order)
//   A batch that cannot fill the table is applied as above. Otherwise, as on
//   the CPU, the rows of keys present at the start run first; then the rows of
//   absent keys run one by one: each one that needs room evicts the entry of
//   lowest (score, age) of the whole table, or is turned away if its own score
//   is lower still. The entries present before this second round do not
//   change during it, so the ones it evicts are the lowest-ranked ones, in
//   order: the table's entries are sorted by (score, age) on the device (cost:
//   O(table size) per such batch), the lowest m (m = rows of absent keys) and
//   the rows' scores go to the host, and a sequential replay on the host
//   (eviction_plan.h, O(m log m)) decides every row's fate. The device then
//   writes the outcome: evicted entries reported and deleted, new keys
//   inserted or reported. Exact and deterministic; the cost is paid only by
//   batches that evict.
//   (The CPU table replays the second round shard by shard rather than in
//   batch order: the two differ only where new keys of one batch compete with
//   each other for the same room.)

#ifndef DYNEMB_CORE_GPU_GPU_TABLE_H_
#define DYNEMB_CORE_GPU_GPU_TABLE_H_

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>

#include "cc/core/gpu/allocator.h"
#include "cc/core/table.h"

namespace dynemb {

// Temporary device memory for one operation: sort buffers, the batch set or
// grouping, a write's first-round marks. A table takes blocks while it queues
// an operation and never frees them; the caller keeps them valid, and unused
// by anything else, until every CUDA work queued on the runner's stream by
// that operation is done -- which a write that fits does not wait for before
// it returns (see "Find is asynchronous" above). Inside TF the blocks are
// ctx->allocate_temp tensors, which TF's allocator hands out again only in
// the stream's order. Blocks are aligned to at least 64 bytes.
class GpuScratch {
 public:
  virtual ~GpuScratch() = default;
  // A block of `bytes` (> 0). Failure (out of memory included) is a Status.
  virtual Status Allocate(size_t bytes, void** ptr) = 0;
};

// A Runner whose work is CUDA work on `stream`. Host-side helper work
// (ParallelFor) runs on the calling thread. `scratch` (nullable, not owned)
// is where operations run with this runner take their temporary device
// memory; without it a table uses a pool of its own, kept between operations.
class GpuRunner : public Runner {
 public:
  explicit GpuRunner(cudaStream_t stream, GpuScratch* scratch = nullptr)
      : stream_(stream), scratch_(scratch) {}
  cudaStream_t stream() const { return stream_; }
  GpuScratch* scratch() const { return scratch_; }
  void ParallelFor(int64_t n, int64_t cost_per_unit,
                   const std::function<void(int64_t, int64_t)>& fn) const override {
    (void)cost_per_unit;
    if (n > 0) fn(0, n);
  }

 private:
  cudaStream_t stream_;
  GpuScratch* scratch_;
};

// ApplyRule (table.h) runs on the device: one warp per distinct key, its
// rows in batch order, each column's slots in registers, update_rules.h's
// ApplyRuleToRow on one column at a time -- the CPU rule's operations, so in
// float32 and float64 the results are the CPU's bit for bit (the CUDA code is
// built with -fmad=false: no contraction into fused multiply-adds).

// Operations a GPU table has beyond Table (HKV has them too). Every table
// NewGpuTable makes implements it: AsGpuTableOps.
class GpuTableOps {
 public:
  virtual ~GpuTableOps() = default;
  // Insert's write for the keys the table holds -- values, and scores
  // (explicit, or the strategy's for an update) -- and nothing for the
  // others: no growth, no eviction, no host sync. Duplicate keys: the last
  // row wins, as in Insert. Pointers and stream as Insert's.
  virtual Status Assign(const void* keys, int64_t n, const void* values, const uint64_t* scores,
                        const Runner& runner) = 0;
  // ApplyRule (table.h) for a batch whose keys are all distinct, as the
  // embedding step's are (it deduplicates them first): the batch is its own
  // grouping, so ApplyRule's sort of the keys (a 64-bit radix sort, the
  // largest kernel of a training step after the rule itself) is skipped.
  // The device does not check that the keys are distinct: a repeated key
  // would be inserted twice. Only callers that deduplicated them use it.
  virtual Status ApplyRuleDistinct(const void* keys, int64_t n, const void* initial,
                                   const RuleStep& step, const Runner& runner) = 0;
};

// The GpuTableOps of a table NewGpuTable made; nullptr for any other table.
GpuTableOps* AsGpuTableOps(Table* table);

// Creates a GPU table on the current CUDA device, with memory from
// `allocator` (not owned; it must outlive the table; nullptr: CudaAllocator()).
// `stream` (not owned; nullptr: a stream the table creates) is where the
// operations that take no Runner run -- the table's set-up, Clear, Export,
// ExportChunks -- and their scratch comes from the table's pool (released
// after each export: an export's scratch is O(size)). Inside TF it is the
// device's compute stream, so that every use of memory from TF's allocator
// is ordered on the stream that allocator assumes.
// Returns nullptr and sets *status on invalid options (string keys included)
// or when CUDA or the allocator fails.
std::unique_ptr<Table> NewGpuTable(const TableOptions& options, GpuAllocator* allocator,
                                   Status* status, cudaStream_t stream = nullptr);

// Converts a CUDA error into a Status naming `what` (kResourceExhausted for
// out-of-memory, kInternal otherwise); Ok for cudaSuccess.
Status CudaStatus(cudaError_t error, const char* what);

}  // namespace dynemb

#endif  // DYNEMB_CORE_GPU_GPU_TABLE_H_
