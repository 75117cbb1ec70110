// StagedGpuTable (staged_table.h): host buffers in, device buffers through.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <memory>
#include <string>

#include "cc/core/gpu/gpu_table.h"
#include "cc/core/gpu/staged_table.h"

namespace dynemb {
namespace {

#define DYNEMB_CUDA_RETURN(expr, what) DYNEMB_RETURN_IF_ERROR(CudaStatus((expr), (what)))

// Device memory for one call, freed when the call ends: every call ends by
// synchronizing its stream, so nothing queued still uses it (and cudaFree
// waits for the device; TF's allocator is ordered on the stream TF uses).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(GpuAllocator* allocator) : allocator_(allocator) {}
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) allocator_->FreeDevice(ptr_);
  }

  Status Allocate(size_t bytes) {
    return allocator_->AllocateDevice(std::max<size_t>(bytes, 1), &ptr_);
  }
  // Allocates and copies `bytes` from host `src` (nullptr: leaves it null).
  Status Upload(const void* src, size_t bytes, cudaStream_t stream) {
    if (src == nullptr) return Status::Ok();
    DYNEMB_RETURN_IF_ERROR(Allocate(bytes));
    if (bytes == 0) return Status::Ok();
    return CudaStatus(cudaMemcpyAsync(ptr_, src, bytes, cudaMemcpyHostToDevice, stream),
                      "cudaMemcpyAsync (to device)");
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }

 private:
  GpuAllocator* allocator_;
  void* ptr_ = nullptr;
};

Status Download(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (dst == nullptr || bytes == 0) return Status::Ok();
  return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream),
                    "cudaMemcpyAsync (to host)");
}

// Receives a GPU export into device buffers; Finish copies it into the
// caller's host sink.
class DeviceExportSink : public ExportSink {
 public:
  DeviceExportSink(const TableOptions& options, ExportSink* host, GpuAllocator* allocator)
      : options_(options), host_(host), keys_(allocator), values_(allocator), scores_(allocator) {}

  Status Allocate(int64_t n, void** keys, void** values, uint64_t** scores) override {
    n_ = n;
    const size_t rows = static_cast<size_t>(n);
    DYNEMB_RETURN_IF_ERROR(keys_.Allocate(rows * KeyBytes()));
    DYNEMB_RETURN_IF_ERROR(values_.Allocate(rows * options_.value_bytes()));
    DYNEMB_RETURN_IF_ERROR(scores_.Allocate(rows * sizeof(uint64_t)));
    *keys = keys_.get();
    *values = values_.get();
    *scores = scores_.get<uint64_t>();
    return Status::Ok();
  }

  // After the GPU export has finished: hands the entries to the host sink.
  Status Finish(cudaStream_t stream) {
    void* keys = nullptr;
    void* values = nullptr;
    uint64_t* scores = nullptr;
    DYNEMB_RETURN_IF_ERROR(host_->Allocate(n_, &keys, &values, &scores));
    const size_t rows = static_cast<size_t>(n_);
    DYNEMB_RETURN_IF_ERROR(Download(keys, keys_.get(), rows * KeyBytes(), stream));
    DYNEMB_RETURN_IF_ERROR(Download(values, values_.get(), rows * options_.value_bytes(), stream));
    DYNEMB_RETURN_IF_ERROR(Download(scores, scores_.get(), rows * sizeof(uint64_t), stream));
    return CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }

 private:
  size_t KeyBytes() const { return options_.key_type == KeyType::kInt32 ? 4 : 8; }

  const TableOptions& options_;
  ExportSink* host_;
  int64_t n_ = 0;
  DeviceBuffer keys_, values_, scores_;
};

// `gpu` runs on `runner`'s stream with staging buffers from `allocator`.
// `owned` and `owned_stream` (nullable) are what the table owns: a table of
// NewStagedGpuTable owns both, a view of NewStagedGpuView neither.
class StagedTable final : public StagedGpuTable {
 public:
  StagedTable(Table* gpu, const GpuRunner& runner, GpuAllocator* allocator,
              std::unique_ptr<Table> owned, cudaStream_t owned_stream)
      : owned_(std::move(owned)),
        gpu_(gpu),
        runner_(runner),
        stream_(runner.stream()),
        allocator_(allocator),
        owned_stream_(owned_stream) {}
  ~StagedTable() override {
    owned_.reset();
    if (owned_stream_ != nullptr) (void)cudaStreamDestroy(owned_stream_);
  }

  Table& gpu_table() override { return *gpu_; }
  const Runner& gpu_runner() const override { return runner_; }
  Status Synchronize() override {
    return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  Status Assign(const void* keys, int64_t n, const void* values,
                const uint64_t* scores) override {
    GpuTableOps* ops = AsGpuTableOps(gpu_);
    if (ops == nullptr) return InvalidArgument("assign needs a GPU table (NewGpuTable)");
    if (n <= 0 || keys == nullptr || values == nullptr) {
      return ops->Assign(keys, n, values, scores, runner_);  // its checks
    }
    const size_t rows = static_cast<size_t>(n);
    DeviceBuffer d_keys(allocator_), d_values(allocator_), d_scores(allocator_);
    DYNEMB_RETURN_IF_ERROR(d_keys.Upload(keys, rows * KeyBytes(), stream_));
    DYNEMB_RETURN_IF_ERROR(d_values.Upload(values, rows * RowBytes(), stream_));
    DYNEMB_RETURN_IF_ERROR(d_scores.Upload(scores, rows * sizeof(uint64_t), stream_));
    DYNEMB_RETURN_IF_ERROR(ops->Assign(d_keys.get(), n, d_values.get(),
                                       d_scores.get<uint64_t>(), runner_));
    return Synchronize();
  }

  const TableOptions& options() const override { return gpu_->options(); }
  int64_t Size() const override { return gpu_->Size(); }
  int64_t Capacity() const override { return gpu_->Capacity(); }
  int64_t MemoryBytes() const override { return gpu_->MemoryBytes(); }
  TableCounters Counters() const override { return gpu_->Counters(); }
  void Clear() override { gpu_->Clear(); }

  Status FindRows(const void* keys, int64_t n, void* values, bool* exists, const void* defaults,
                  bool default_per_key, bool update_scores, const Runner&) override {
    if (n <= 0 || keys == nullptr || values == nullptr || defaults == nullptr) {
      return gpu_->FindRows(keys, n, values, exists, defaults, default_per_key, update_scores,
                            runner_);  // its error
    }
    const size_t rows = static_cast<size_t>(n);
    DeviceBuffer d_keys(allocator_), d_defaults(allocator_), d_values(allocator_),
        d_exists(allocator_);
    DYNEMB_RETURN_IF_ERROR(d_keys.Upload(keys, rows * KeyBytes(), stream_));
    DYNEMB_RETURN_IF_ERROR(
        d_defaults.Upload(defaults, (default_per_key ? rows : 1) * RowBytes(), stream_));
    DYNEMB_RETURN_IF_ERROR(d_values.Allocate(rows * RowBytes()));
    if (exists != nullptr) DYNEMB_RETURN_IF_ERROR(d_exists.Allocate(rows));
    DYNEMB_RETURN_IF_ERROR(gpu_->FindRows(d_keys.get(), n, d_values.get(), d_exists.get<bool>(),
                                          d_defaults.get(), default_per_key, update_scores,
                                          runner_));
    DYNEMB_RETURN_IF_ERROR(Download(values, d_values.get(), rows * RowBytes(), stream_));
    DYNEMB_RETURN_IF_ERROR(Download(exists, d_exists.get(), rows, stream_));
    return Synchronize();
  }

  Status InsertAndEvict(const void* keys, int64_t n, const void* values, const uint64_t* scores,
                        EvictedEntries* evicted, const Runner&) override {
    if (evicted != nullptr) evicted->count = 0;
    if (n <= 0 || keys == nullptr || values == nullptr) {
      return gpu_->InsertAndEvict(keys, n, values, scores, evicted, runner_);  // its checks
    }
    const size_t rows = static_cast<size_t>(n);
    DeviceBuffer d_keys(allocator_), d_values(allocator_), d_scores(allocator_);
    DYNEMB_RETURN_IF_ERROR(d_keys.Upload(keys, rows * KeyBytes(), stream_));
    DYNEMB_RETURN_IF_ERROR(d_values.Upload(values, rows * RowBytes(), stream_));
    DYNEMB_RETURN_IF_ERROR(d_scores.Upload(scores, rows * sizeof(uint64_t), stream_));
    EvictedOnDevice out(allocator_);
    DYNEMB_RETURN_IF_ERROR(out.Prepare(evicted, rows, KeyBytes(), RowBytes()));
    DYNEMB_RETURN_IF_ERROR(gpu_->InsertAndEvict(d_keys.get(), n, d_values.get(),
                                                d_scores.get<uint64_t>(), out.entries(),
                                                runner_));
    return out.Finish(evicted, KeyBytes(), RowBytes(), stream_);
  }

  Status AccumAndEvict(const void* keys, int64_t n, const void* deltas, const bool* exists,
                       EvictedEntries* evicted, const Runner&) override {
    if (evicted != nullptr) evicted->count = 0;
    if (n <= 0 || keys == nullptr || deltas == nullptr || exists == nullptr) {
      return gpu_->AccumAndEvict(keys, n, deltas, exists, evicted, runner_);  // its checks
    }
    const size_t rows = static_cast<size_t>(n);
    DeviceBuffer d_keys(allocator_), d_deltas(allocator_), d_exists(allocator_);
    DYNEMB_RETURN_IF_ERROR(d_keys.Upload(keys, rows * KeyBytes(), stream_));
    DYNEMB_RETURN_IF_ERROR(d_deltas.Upload(deltas, rows * RowBytes(), stream_));
    DYNEMB_RETURN_IF_ERROR(d_exists.Upload(exists, rows, stream_));
    EvictedOnDevice out(allocator_);
    DYNEMB_RETURN_IF_ERROR(out.Prepare(evicted, rows, KeyBytes(), RowBytes()));
    DYNEMB_RETURN_IF_ERROR(gpu_->AccumAndEvict(d_keys.get(), n, d_deltas.get(),
                                               d_exists.get<bool>(), out.entries(), runner_));
    return out.Finish(evicted, KeyBytes(), RowBytes(), stream_);
  }

  Status ApplyRule(const void* keys, int64_t n, const void* initial, const RuleStep& step,
                   const Runner&) override {
    DYNEMB_RETURN_IF_ERROR(CheckRuleStep(gpu_->options(), keys, n, initial, step));
    if (n == 0) return Status::Ok();
    const size_t param_row_bytes =
        static_cast<size_t>(step.dim) * ValueTypeSize(gpu_->options().value_type);
    const size_t rows = static_cast<size_t>(n);
    DeviceBuffer d_keys(allocator_), d_initial(allocator_), d_rows(allocator_),
        d_grads(allocator_), d_new_rows(allocator_);
    DYNEMB_RETURN_IF_ERROR(d_keys.Upload(keys, rows * KeyBytes(), stream_));
    DYNEMB_RETURN_IF_ERROR(d_initial.Upload(initial, RowBytes(), stream_));
    DYNEMB_RETURN_IF_ERROR(d_rows.Upload(step.rows, rows * param_row_bytes, stream_));
    DYNEMB_RETURN_IF_ERROR(d_grads.Upload(step.grads, rows * param_row_bytes, stream_));
    DYNEMB_RETURN_IF_ERROR(d_new_rows.Allocate(rows * param_row_bytes));
    RuleStep on_device = step;  // coefficients stay in host memory
    on_device.rows = d_rows.get();
    on_device.grads = d_grads.get();
    on_device.new_rows = d_new_rows.get();
    DYNEMB_RETURN_IF_ERROR(
        gpu_->ApplyRule(d_keys.get(), n, d_initial.get(), on_device, runner_));
    DYNEMB_RETURN_IF_ERROR(Download(step.new_rows, d_new_rows.get(), rows * param_row_bytes, stream_));
    return Synchronize();
  }

  Status Remove(const void* keys, int64_t n, const Runner&) override {
    if (n <= 0 || keys == nullptr) return gpu_->Remove(keys, n, runner_);
    DeviceBuffer d_keys(allocator_);
    DYNEMB_RETURN_IF_ERROR(d_keys.Upload(keys, static_cast<size_t>(n) * KeyBytes(), stream_));
    DYNEMB_RETURN_IF_ERROR(gpu_->Remove(d_keys.get(), n, runner_));
    return Synchronize();
  }

  Status Export(ExportSink* sink, const Runner&) override {
    DeviceExportSink staged(gpu_->options(), sink, allocator_);
    DYNEMB_RETURN_IF_ERROR(gpu_->Export(&staged, runner_));
    return staged.Finish(stream_);
  }

  // The GPU table's ExportChunks already hands out host memory.
  Status ExportChunks(int64_t chunk_rows, const ChunkSink& sink) override {
    return gpu_->ExportChunks(chunk_rows, sink);
  }

 private:
  // Device buffers for what a write evicts, mirroring the caller's host ones.
  class EvictedOnDevice {
   public:
    explicit EvictedOnDevice(GpuAllocator* allocator)
        : keys_(allocator), values_(allocator), scores_(allocator) {}
    Status Prepare(const EvictedEntries* host, size_t rows, size_t key_bytes, size_t row_bytes) {
      if (host == nullptr) return Status::Ok();
      wanted_ = true;
      if (host->keys != nullptr) DYNEMB_RETURN_IF_ERROR(keys_.Allocate(rows * key_bytes));
      if (host->values != nullptr) DYNEMB_RETURN_IF_ERROR(values_.Allocate(rows * row_bytes));
      if (host->scores != nullptr) {
        DYNEMB_RETURN_IF_ERROR(scores_.Allocate(rows * sizeof(uint64_t)));
      }
      entries_.keys = keys_.get();
      entries_.values = values_.get();
      entries_.scores = scores_.get<uint64_t>();
      return Status::Ok();
    }
    EvictedEntries* entries() { return wanted_ ? &entries_ : nullptr; }
    Status Finish(EvictedEntries* host, size_t key_bytes, size_t row_bytes, cudaStream_t stream) {
      if (host != nullptr) {
        const size_t m = static_cast<size_t>(entries_.count);
        DYNEMB_RETURN_IF_ERROR(Download(host->keys, keys_.get(), m * key_bytes, stream));
        DYNEMB_RETURN_IF_ERROR(Download(host->values, values_.get(), m * row_bytes, stream));
        DYNEMB_RETURN_IF_ERROR(Download(host->scores, scores_.get(), m * sizeof(uint64_t), stream));
        host->count = entries_.count;
      }
      return CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    }

   private:
    bool wanted_ = false;
    DeviceBuffer keys_, values_, scores_;
    EvictedEntries entries_;
  };

  size_t KeyBytes() const { return gpu_->options().key_type == KeyType::kInt32 ? 4 : 8; }
  size_t RowBytes() const { return gpu_->options().value_bytes(); }

  std::unique_ptr<Table> owned_;
  Table* gpu_;
  GpuRunner runner_;
  cudaStream_t stream_;
  GpuAllocator* allocator_;
  cudaStream_t owned_stream_;
};

}  // namespace

bool GpuAvailable(std::string* reason) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    *reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(error) + " (" +
              cudaGetErrorString(error) + ")";
    (void)cudaGetLastError();
    return false;
  }
  if (count == 0) {
    *reason = "no CUDA device";
    return false;
  }
  reason->clear();
  return true;
}

std::unique_ptr<StagedGpuTable> NewStagedGpuTable(const TableOptions& options, Status* status) {
  *status = options.Validate();
  if (!status->ok()) return nullptr;
  std::string reason;
  if (!GpuAvailable(&reason)) {
    *status = Status(StatusCode::kFailedPrecondition, "no usable GPU: " + reason);
    return nullptr;
  }
  cudaStream_t stream = nullptr;
  *status = CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                       "cudaStreamCreate");
  if (!status->ok()) return nullptr;
  std::unique_ptr<Table> gpu = NewGpuTable(options, CudaAllocator(), status);
  if (gpu == nullptr) {
    (void)cudaStreamDestroy(stream);
    return nullptr;
  }
  Table* table = gpu.get();
  return std::make_unique<StagedTable>(table, GpuRunner(stream), CudaAllocator(), std::move(gpu),
                                       stream);
}

std::unique_ptr<StagedGpuTable> NewStagedGpuView(Table& gpu_table, const Runner& gpu_runner,
                                                 GpuAllocator* allocator, Status* status) {
  const GpuRunner* runner = dynamic_cast<const GpuRunner*>(&gpu_runner);
  if (runner == nullptr) {
    *status = InvalidArgument("a staged GPU view needs a GpuRunner (cc/core/gpu/gpu_table.h)");
    return nullptr;
  }
  if (gpu_table.options().key_type == KeyType::kString) {
    *status = InvalidArgument("a staged GPU view needs a GPU table; string-keyed tables are CPU");
    return nullptr;
  }
  *status = Status::Ok();
  return std::make_unique<StagedTable>(&gpu_table, *runner, allocator, nullptr, nullptr);
}

}  // namespace dynemb
