// One embedding training step on the device, in the core: the forward pass
// (dedup of a batch's ids, find with the variable's initializer, gather) and
// the backward pass (segment sum of the gradients, the optimizer rule,
// write-back), over two GPU tables: the parameter table (rows of dim D) and
// its slot-state table (rows of UpdateRuleSlots(rule) * D, unbounded). The
// same computation as the CPU path of the Python layer (DynembUnique, Find +
// DynembKeyedRandomFill, gather; DynembSegmentSum, ApplyRule, Insert), with
// the ids and rows never leaving the device.
//
// Forward(ids [n]) -> out [n, D]
//   1. Distinct ids: a BatchSet of the ids (batch_set.cuh); the rows that are
//      their id's first row, selected in batch order (cub Select), are the
//      distinct ids in first-occurrence order (as tf.unique); each row's
//      index among them is `inverse`. One host sync: the number of distinct
//      ids, which sizes the rest.
//   2. Their rows: Find on the parameter table; a missing id gets its initial
//      row, key-seeded (KeyedRandomRowsGpu, as DynembKeyedRandomFill) or a
//      constant default row. Nothing is inserted yet: a row exists once the
//      backward pass writes it (as on the CPU).
//   3. out[p] = rows[inverse[p]].
// Backward(grads [n, D], coefficients) -- after Forward, same batch
//   4. Per distinct id, the sum of its rows' gradients in batch order,
//      starting from zero (a stable radix sort of the rows by inverse groups
//      them; one warp sums one id, each lane its columns).
//   5. ApplyRule on the slot table (update_rules.h, bit-equal to the CPU
//      rule): new parameter rows. Slot rows of new ids start from
//      `initial_state`.
//   6. Insert of the new rows into the parameter table (the BatchSet path of
//      gpu_table.h: no sort, no host sync while the table has room).
// Buffers are kept between steps and grow with the batch.

#ifndef DYNEMB_CORE_GPU_EMBEDDING_STEP_H_
#define DYNEMB_CORE_GPU_EMBEDDING_STEP_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "cc/core/gpu/allocator.h"
#include "cc/core/gpu/gpu_table.h"
#include "cc/core/gpu/keyed_gpu.h"
#include "cc/core/table.h"
#include "cc/core/update_rules.h"

namespace dynemb {

struct EmbeddingStepOptions {
  UpdateRule rule = UpdateRule::kKerasAdam;
  bool weight_decay = false;
  // A missing id's initial parameter row: key-seeded (keyed_init; init.dim
  // must be D), else `default_row` (host bytes of one row; empty: zeros).
  bool keyed_init = false;
  KeyedRandomSpec init;
  std::vector<char> default_row;
  // A new id's slot-state row (host bytes of one row; empty: zeros).
  std::vector<char> initial_state;
};

class GpuEmbeddingStep {
 public:
  virtual ~GpuEmbeddingStep() = default;
  // ids [n] -> out [n, D], device memory, queued on the runner's stream;
  // returns after one host sync (the number of distinct ids).
  virtual Status Forward(const void* ids, int64_t n, void* out, const GpuRunner& runner) = 0;
  // grads [n, D] (device) of the last Forward's out; `coefficients` (host)
  // as RuleStep's. Asynchronous while the tables have room (gpu_table.h).
  virtual Status Backward(const void* grads, const void* coefficients,
                          const GpuRunner& runner) = 0;
  // Distinct ids of the last Forward.
  virtual int64_t num_unique() const = 0;
};

// A step over `params` and `slots` (NewGpuTable tables on the current device,
// not owned, outliving the step), with device memory from `allocator`
// (nullptr: CudaAllocator()). Returns nullptr and sets *status when the
// tables or options do not fit together (the message names what).
std::unique_ptr<GpuEmbeddingStep> NewGpuEmbeddingStep(Table* params, Table* slots,
                                                      const EmbeddingStepOptions& options,
                                                      GpuAllocator* allocator, Status* status);

}  // namespace dynemb

#endif  // DYNEMB_CORE_GPU_EMBEDDING_STEP_H_
