// The embedding training step on the device (embedding_step.h).

#include "cc/core/gpu/embedding_step.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include "cc/core/gpu/batch_set.cuh"

namespace dynemb {
namespace {

#define DYNEMB_CUDA_RETURN(expr, what) DYNEMB_RETURN_IF_ERROR(CudaStatus((expr), (what)))

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / gpu::kWarpSize;

int GridFor(uint64_t items, int per_block, int num_sms) {
  const uint64_t wanted = (items + per_block - 1) / per_block;
  return static_cast<int>(std::max<uint64_t>(1, std::min<uint64_t>(wanted, uint64_t(num_sms) * 32)));
}

__device__ __forceinline__ uint64_t GlobalThread() {
  return blockIdx.x * uint64_t{blockDim.x} + threadIdx.x;
}
__device__ __forceinline__ uint64_t GridThreads() { return uint64_t{gridDim.x} * blockDim.x; }

// flags[p] = row p is the first row of its id.
template <typename K>
__global__ void FirstRowFlagsKernel(gpu::BatchSet<K> set, uint8_t* flags) {
  for (uint64_t p = GlobalThread(); p < set.n; p += GridThreads()) {
    flags[p] = set.First(set.slot_of_row[p]) == p;
  }
}

// The distinct ids (first-occurrence order), their row counts, and each
// set slot's index among them.
template <typename K>
__global__ void DistinctIdsKernel(gpu::BatchSet<K> set, const uint32_t* first_rows,
                                  const uint32_t* num_unique, K* unique, uint32_t* counts,
                                  uint32_t* index_of_slot) {
  const uint32_t u_end = *num_unique;
  for (uint64_t u = GlobalThread(); u < u_end; u += GridThreads()) {
    const uint32_t p = first_rows[u];
    const uint32_t slot = set.slot_of_row[p];
    unique[u] = set.keys[p];
    counts[u] = set.Count(slot);
    index_of_slot[slot] = static_cast<uint32_t>(u);
  }
}

// inverse[p] = the index of row p's id among the distinct ids; positions[p] = p.
template <typename K>
__global__ void InverseKernel(gpu::BatchSet<K> set, const uint32_t* index_of_slot,
                              uint32_t* inverse, uint32_t* positions) {
  for (uint64_t p = GlobalThread(); p < set.n; p += GridThreads()) {
    inverse[p] = index_of_slot[set.slot_of_row[p]];
    positions[p] = static_cast<uint32_t>(p);
  }
}

// out[p] = rows[inverse[p]], element by element (coalesced along the row).
template <typename T>
__global__ void GatherRowsKernel(const T* rows, const uint32_t* inverse, uint64_t n, int64_t dim,
                                 T* out) {
  const uint64_t total = n * static_cast<uint64_t>(dim);
  for (uint64_t i = GlobalThread(); i < total; i += GridThreads()) {
    const uint64_t p = i / dim;
    out[i] = rows[static_cast<uint64_t>(inverse[p]) * dim + (i - p * dim)];
  }
}

// sums[u] = 0 + grads[first row of u] + ... in batch order: one warp per id,
// rows[offsets[u], offsets[u] + counts[u]) of `sorted_rows`.
template <typename T>
__global__ void SegmentSumKernel(const T* grads, const uint32_t* sorted_rows,
                                 const uint32_t* offsets, const uint32_t* counts,
                                 uint64_t num_unique, int64_t dim, T* sums) {
  const int lane = threadIdx.x % gpu::kWarpSize;
  const uint64_t warps = GridThreads() / gpu::kWarpSize;
  for (uint64_t u = GlobalThread() / gpu::kWarpSize; u < num_unique; u += warps) {
    const uint32_t begin = offsets[u];
    const uint32_t end = begin + counts[u];
    for (int64_t col = lane; col < dim; col += gpu::kWarpSize) {
      T sum = T(0);
      for (uint32_t q = begin; q < end; ++q) {
        sum += grads[static_cast<uint64_t>(sorted_rows[q]) * dim + col];
      }
      sums[u * dim + col] = sum;
    }
  }
}

// Device buffers of one batch size, reallocated when a batch is larger.
class Buffers {
 public:
  explicit Buffers(GpuAllocator* allocator) : allocator_(allocator) {}
  ~Buffers() { Free(); }
  void Free() {
    for (void* p : blocks_) allocator_->FreeDevice(p);
    blocks_.clear();
  }
  template <typename T>
  Status Get(size_t count, T** ptr) {
    void* p = nullptr;
    DYNEMB_RETURN_IF_ERROR(allocator_->AllocateDevice(std::max<size_t>(count * sizeof(T), 1), &p));
    blocks_.push_back(p);
    *ptr = static_cast<T*>(p);
    return Status::Ok();
  }

 private:
  GpuAllocator* allocator_;
  std::vector<void*> blocks_;
};

template <typename K, typename T>
class Step final : public GpuEmbeddingStep {
 public:
  Step(Table* params, Table* slots, const EmbeddingStepOptions& options, GpuAllocator* allocator)
      : params_(params),
        slots_(slots),
        options_(options),
        dim_(params->options().dim),
        allocator_(allocator),
        fixed_(allocator),
        batch_(allocator) {}

  ~Step() override {
    // Queued work may still read the buffers: the allocator's FreeDevice
    // (cudaFree) waits for the device.
  }

  Status Init() {
    int device = 0;
    DYNEMB_CUDA_RETURN(cudaGetDevice(&device), "cudaGetDevice");
    DYNEMB_CUDA_RETURN(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device),
                       "cudaDeviceGetAttribute");
    DYNEMB_RETURN_IF_ERROR(UploadRow(options_.default_row, dim_, &default_row_));
    DYNEMB_RETURN_IF_ERROR(
        UploadRow(options_.initial_state, slots_->options().dim, &initial_state_));
    return Status::Ok();
  }

  int64_t num_unique() const override { return num_unique_; }

  Status Forward(const void* ids, int64_t n, void* out, const GpuRunner& runner) override {
    if (n < 0 || n > int64_t{0x7fffffff}) {
      return InvalidArgument("Forward: n must be in [0, 2^31), got " + std::to_string(n));
    }
    if (n > 0 && (ids == nullptr || out == nullptr)) {
      return InvalidArgument("Forward: ids and out must not be null");
    }
    num_unique_ = 0;
    n_ = n;
    if (n == 0) return Status::Ok();
    const cudaStream_t stream = runner.stream();
    DYNEMB_RETURN_IF_ERROR(Reserve(n));
    const uint64_t un = static_cast<uint64_t>(n);
    // 1. distinct ids, in first-occurrence order
    gpu::BatchSet<K> set;
    set.keys = static_cast<const K*>(ids);
    set.n = static_cast<uint32_t>(n);
    set.capacity = gpu::BatchSetCapacity(un);
    set.slot_of_row = slot_of_row_;
    DYNEMB_CUDA_RETURN(gpu::BuildBatchSet(&set, set_entries_, GridFor(un, kThreads, num_sms_),
                                          stream),
                       "BatchSetKernel");
    FirstRowFlagsKernel<K><<<GridFor(un, kThreads, num_sms_), kThreads, 0, stream>>>(set, flags_);
    DYNEMB_CUDA_RETURN(cudaGetLastError(), "FirstRowFlagsKernel launch");
    size_t temp_bytes = temp_bytes_;
    DYNEMB_CUDA_RETURN(cub::DeviceSelect::Flagged(temp_, temp_bytes, thrust::counting_iterator<uint32_t>(0),
                                                  flags_, first_rows_, d_num_unique_,
                                                  static_cast<int>(n), stream),
                       "cub Select::Flagged");
    uint32_t num_unique = 0;
    DYNEMB_CUDA_RETURN(cudaMemcpyAsync(&num_unique, d_num_unique_, sizeof(num_unique),
                                       cudaMemcpyDeviceToHost, stream),
                       "cudaMemcpyAsync (distinct ids)");
    DYNEMB_CUDA_RETURN(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    num_unique_ = num_unique;
    DistinctIdsKernel<K><<<GridFor(num_unique, kThreads, num_sms_), kThreads, 0, stream>>>(
        set, first_rows_, d_num_unique_, unique_, counts_, index_of_slot_);
    DYNEMB_CUDA_RETURN(cudaGetLastError(), "DistinctIdsKernel launch");
    InverseKernel<K><<<GridFor(un, kThreads, num_sms_), kThreads, 0, stream>>>(
        set, index_of_slot_, inverse_, positions_);
    DYNEMB_CUDA_RETURN(cudaGetLastError(), "InverseKernel launch");
    // 2. their rows, missing ids' initial rows
    DYNEMB_RETURN_IF_ERROR(params_->Find(unique_, num_unique, unique_rows_, exists_, default_row_,
                                         /*default_per_key=*/false, runner));
    if (options_.keyed_init) {
      DYNEMB_RETURN_IF_ERROR((KeyedRandomRowsGpu<K, T>(unique_, num_unique, options_.init,
                                                       exists_, unique_rows_, stream)));
    }
    // 3. each row's
    GatherRowsKernel<T><<<GridFor(un * dim_, kThreads, num_sms_), kThreads, 0, stream>>>(
        unique_rows_, inverse_, un, dim_, static_cast<T*>(out));
    return CudaStatus(cudaGetLastError(), "GatherRowsKernel launch");
  }

  Status Backward(const void* grads, const void* coefficients, const GpuRunner& runner) override {
    if (n_ == 0) return Status::Ok();
    if (grads == nullptr || coefficients == nullptr) {
      return InvalidArgument("Backward: grads and coefficients must not be null");
    }
    const cudaStream_t stream = runner.stream();
    // 4. per distinct id, its gradients summed in batch order
    int end_bit = 1;
    while (end_bit < 32 && (uint64_t{1} << end_bit) < static_cast<uint64_t>(num_unique_)) ++end_bit;
    size_t temp_bytes = temp_bytes_;
    DYNEMB_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(temp_, temp_bytes, inverse_, sorted_inverse_,
                                                       positions_, sorted_rows_,
                                                       static_cast<int>(n_), 0, end_bit, stream),
                       "cub SortPairs (rows by id)");
    temp_bytes = temp_bytes_;
    DYNEMB_CUDA_RETURN(cub::DeviceScan::ExclusiveSum(temp_, temp_bytes, counts_, offsets_,
                                                     static_cast<int>(num_unique_), stream),
                       "cub ExclusiveSum");
    SegmentSumKernel<T><<<GridFor(num_unique_, kWarpsPerBlock, num_sms_), kThreads, 0, stream>>>(
        static_cast<const T*>(grads), sorted_rows_, offsets_, counts_,
        static_cast<uint64_t>(num_unique_), dim_, sums_);
    DYNEMB_CUDA_RETURN(cudaGetLastError(), "SegmentSumKernel launch");
    // 5. the rule on the slot rows
    RuleStep step;
    step.rule = options_.rule;
    step.dim = dim_;
    step.weight_decay = options_.weight_decay;
    step.coefficients = coefficients;
    step.rows = unique_rows_;
    step.grads = sums_;
    step.new_rows = new_rows_;
    // The ids are distinct (step 1): no grouping sort.
    DYNEMB_RETURN_IF_ERROR(AsGpuTableOps(slots_)->ApplyRuleDistinct(unique_, num_unique_,
                                                                    initial_state_, step, runner));
    // 6. write-back
    return params_->Insert(unique_, num_unique_, new_rows_, nullptr, runner);
  }

 private:
  // One row of `dim` elements of T on the device: `bytes` (or zeros when empty).
  Status UploadRow(const std::vector<char>& bytes, int64_t dim, T** out) {
    const size_t row_bytes = static_cast<size_t>(dim) * sizeof(T);
    if (!bytes.empty() && bytes.size() != row_bytes) {
      return InvalidArgument("embedding step: a row of " + std::to_string(dim) + " values (" +
                             std::to_string(row_bytes) + " bytes) was expected, got " +
                             std::to_string(bytes.size()) + " bytes");
    }
    std::vector<char> host(row_bytes, 0);
    if (!bytes.empty()) std::memcpy(host.data(), bytes.data(), row_bytes);
    DYNEMB_RETURN_IF_ERROR(fixed_.Get(static_cast<size_t>(dim), out));
    return CudaStatus(cudaMemcpy(*out, host.data(), row_bytes, cudaMemcpyHostToDevice),
                      "cudaMemcpy (row)");
  }

  // Buffers for batches of up to n ids.
  Status Reserve(int64_t n) {
    if (n <= reserved_) return Status::Ok();
    batch_.Free();
    reserved_ = 0;
    const size_t un = static_cast<size_t>(n);
    const size_t capacity = gpu::BatchSetCapacity(un);
    const size_t rows = un * static_cast<size_t>(dim_);
    DYNEMB_RETURN_IF_ERROR(batch_.Get(capacity, &set_entries_));
    DYNEMB_RETURN_IF_ERROR(batch_.Get(un, &slot_of_row_));
    DYNEMB_RETURN_IF_ERROR(batch_.Get(un, &flags_));
    DYNEMB_RETURN_IF_ERROR(batch_.Get(un, &first_rows_));
    DYNEMB_RETURN_IF_ERROR(batch_.Get(1, &d_num_unique_));
    DYNEMB_RETURN_IF_ERROR(batch_.Get(un, &unique_));
    DYNEMB_RETURN_IF_ERROR(batch_.Get(un, &counts_));
    DYNEMB_RETURN_IF_ERROR(batch_.Get(un, &offsets_));
    DYNEMB_RETURN_IF_ERROR(batch_.Get(capacity, &index_of_slot_));
    DYNEMB_RETURN_IF_ERROR(batch_.Get(un, &inverse_));
    DYNEMB_RETURN_IF_ERROR(batch_.Get(un, &positions_));
    DYNEMB_RETURN_IF_ERROR(batch_.Get(un, &sorted_inverse_));
    DYNEMB_RETURN_IF_ERROR(batch_.Get(un, &sorted_rows_));
    DYNEMB_RETURN_IF_ERROR(batch_.Get(un, &exists_));
    DYNEMB_RETURN_IF_ERROR(batch_.Get(rows, &unique_rows_));
    DYNEMB_RETURN_IF_ERROR(batch_.Get(rows, &sums_));
    DYNEMB_RETURN_IF_ERROR(batch_.Get(rows, &new_rows_));
    // cub's temporary storage: the largest of the three uses.
    size_t select = 0, sort = 0, scan = 0;
    const int in = static_cast<int>(n);
    DYNEMB_CUDA_RETURN(cub::DeviceSelect::Flagged(nullptr, select, thrust::counting_iterator<uint32_t>(0),
                                                  flags_, first_rows_, d_num_unique_, in),
                       "cub Select::Flagged (size)");
    DYNEMB_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(nullptr, sort, inverse_, sorted_inverse_,
                                                       positions_, sorted_rows_, in, 0, 32),
                       "cub SortPairs (size)");
    DYNEMB_CUDA_RETURN(cub::DeviceScan::ExclusiveSum(nullptr, scan, counts_, offsets_, in),
                       "cub ExclusiveSum (size)");
    temp_bytes_ = std::max({select, sort, scan, size_t{1}});
    DYNEMB_RETURN_IF_ERROR(batch_.Get(temp_bytes_, &temp_));
    reserved_ = n;
    return Status::Ok();
  }

  Table* const params_;
  Table* const slots_;
  const EmbeddingStepOptions options_;
  const int64_t dim_;
  GpuAllocator* const allocator_;
  int num_sms_ = 1;
  Buffers fixed_;  // default row, initial state
  Buffers batch_;  // the rest, for batches of up to reserved_ ids
  int64_t reserved_ = 0;
  int64_t n_ = 0;
  int64_t num_unique_ = 0;

  T* default_row_ = nullptr;
  T* initial_state_ = nullptr;
  gpu::BatchSetEntry* set_entries_ = nullptr;
  uint32_t* slot_of_row_ = nullptr;
  uint8_t* flags_ = nullptr;
  uint32_t* first_rows_ = nullptr;
  uint32_t* d_num_unique_ = nullptr;
  K* unique_ = nullptr;
  uint32_t* counts_ = nullptr;
  uint32_t* offsets_ = nullptr;
  uint32_t* index_of_slot_ = nullptr;
  uint32_t* inverse_ = nullptr;
  uint32_t* positions_ = nullptr;
  uint32_t* sorted_inverse_ = nullptr;
  uint32_t* sorted_rows_ = nullptr;
  bool* exists_ = nullptr;
  T* unique_rows_ = nullptr;
  T* sums_ = nullptr;
  T* new_rows_ = nullptr;
  char* temp_ = nullptr;
  size_t temp_bytes_ = 0;
};

Status CheckTables(Table* params, Table* slots, const EmbeddingStepOptions& options) {
  if (params == nullptr || slots == nullptr) {
    return InvalidArgument("embedding step: params and slots must not be null");
  }
  if (AsGpuTableOps(params) == nullptr || AsGpuTableOps(slots) == nullptr) {
    return InvalidArgument("embedding step: params and slots must be GPU tables (NewGpuTable)");
  }
  const TableOptions& p = params->options();
  const TableOptions& s = slots->options();
  if (p.value_type != ValueType::kFloat32 && p.value_type != ValueType::kFloat64) {
    return InvalidArgument(std::string("embedding step: params must hold float32 or float64, got ") +
                           ValueTypeName(p.value_type));
  }
  if (s.key_type != p.key_type || s.value_type != p.value_type) {
    return InvalidArgument("embedding step: slots must have the key and value types of params");
  }
  const int64_t wanted = UpdateRuleSlots(options.rule) * p.dim;
  if (s.dim != wanted) {
    return InvalidArgument(std::string("embedding step: rule ") + UpdateRuleName(options.rule) +
                           " needs slots of dim " + std::to_string(wanted) + ", got " +
                           std::to_string(s.dim));
  }
  if (options.keyed_init && options.init.dim != p.dim) {
    return InvalidArgument("embedding step: init.dim must be the parameter dim " +
                           std::to_string(p.dim) + ", got " + std::to_string(options.init.dim));
  }
  return Status::Ok();
}

template <typename K, typename T>
std::unique_ptr<GpuEmbeddingStep> MakeStep(Table* params, Table* slots,
                                           const EmbeddingStepOptions& options,
                                           GpuAllocator* allocator, Status* status) {
  auto step = std::make_unique<Step<K, T>>(params, slots, options, allocator);
  *status = step->Init();
  if (!status->ok()) return nullptr;
  return step;
}

}  // namespace

std::unique_ptr<GpuEmbeddingStep> NewGpuEmbeddingStep(Table* params, Table* slots,
                                                      const EmbeddingStepOptions& options,
                                                      GpuAllocator* allocator, Status* status) {
  *status = CheckTables(params, slots, options);
  if (!status->ok()) return nullptr;
  if (allocator == nullptr) allocator = CudaAllocator();
  const bool f64 = params->options().value_type == ValueType::kFloat64;
  if (params->options().key_type == KeyType::kInt32) {
    return f64 ? MakeStep<int32_t, double>(params, slots, options, allocator, status)
               : MakeStep<int32_t, float>(params, slots, options, allocator, status);
  }
  return f64 ? MakeStep<int64_t, double>(params, slots, options, allocator, status)
             : MakeStep<int64_t, float>(params, slots, options, allocator, status);
}

}  // namespace dynemb
