// The GPU table (gpu_table.h): storage, the batch pipelines, and the Table
// interface. Kernels are in gpu_kernels.cuh, warp-level helpers in
// device_table.cuh, the bounded second-round replay in eviction_plan.h.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include "cc/core/gpu/eviction_plan.h"
#include "cc/core/gpu/gpu_kernels.cuh"
#include "cc/core/gpu/gpu_table.h"
#include "cc/core/score_rule.h"

namespace dynemb {
namespace {

using gpu::BatchCounters;
using gpu::DeviceTable;
using gpu::EntrySink;
using gpu::GroupedBatch;
using gpu::kBlockThreads;
using gpu::kBucketSlots;
using gpu::kNumBatchCounters;
using gpu::kWarpsPerBlock;
using gpu::WriteArgs;

#define DYNEMB_CUDA_RETURN(expr, what) DYNEMB_RETURN_IF_ERROR(CudaStatus((expr), (what)))

// Rehash when occupied + deleted slots would pass 3/4 of the slots.
constexpr uint64_t kLoadNum = 3, kLoadDen = 4;
// Slot indices are uint32 in sort and selection buffers: at most 2^31 slots.
constexpr uint64_t kMaxBuckets = (uint64_t{1} << 31) / kBucketSlots;
// Scratch blocks are 256-byte aligned (cub and vector loads want alignment).
constexpr size_t kAlign = 256;

size_t AlignUp(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }

uint64_t SlotsLimit(uint64_t buckets) { return buckets * kBucketSlots * kLoadNum / kLoadDen; }

// The fewest buckets (a power of two) whose load limit holds `keys`.
uint64_t BucketsFor(uint64_t keys) {
  uint64_t buckets = 1;
  while (buckets < kMaxBuckets && SlotsLimit(buckets) < keys) buckets *= 2;
  return buckets;
}

// Grid size for a grid-stride kernel in which one warp handles one item.
int WarpGrid(uint64_t items, int num_sms) {
  const uint64_t wanted = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<int>(std::max<uint64_t>(1, std::min<uint64_t>(wanted, uint64_t(num_sms) * 32)));
}
// ... and one thread one item.
int ThreadGrid(uint64_t items, int num_sms) {
  const uint64_t wanted = (items + kBlockThreads - 1) / kBlockThreads;
  return static_cast<int>(std::max<uint64_t>(1, std::min<uint64_t>(wanted, uint64_t(num_sms) * 32)));
}
// Keys per warp for a kernel whose warps take runs of consecutive keys (up
// to a warp's 32 lanes): as many as still leave about two warps per warp slot
// of the GPU (64 per SM), so that small batches keep the GPU busy.
int KeysPerWarp(uint64_t n, int num_sms) {
  const uint64_t warps_wanted = uint64_t(num_sms) * 64 * 2;
  const uint64_t per_warp = std::max<uint64_t>(1, n / warps_wanted);
  return static_cast<int>(std::min<uint64_t>(gpu::kWarpSize, per_warp));
}

// ---------------------------------------------------------------------------
// Scratch: device memory for one operation, from the runner's GpuScratch
// (inside TF: allocate_temp) or else taken from a pool of blocks the table
// keeps between operations (operations are serialized, so a block is never
// used by two at once; see "Operations are thread-safe" in gpu_table.h).
// ---------------------------------------------------------------------------
class ScratchPool {
 public:
  explicit ScratchPool(GpuAllocator* allocator) : allocator_(allocator) {}
  ~ScratchPool() { Release(); }

  // Takes a free block of at least `bytes` (allocating one if none fits).
  Status Take(size_t bytes, void** ptr) {
    bytes = AlignUp(std::max<size_t>(bytes, 1));
    Block* best = nullptr;
    for (Block& b : blocks_) {
      if (!b.in_use && b.bytes >= bytes && (best == nullptr || b.bytes < best->bytes)) best = &b;
    }
    if (best == nullptr) {
      void* p = nullptr;
      DYNEMB_RETURN_IF_ERROR(allocator_->AllocateDevice(bytes, &p));
      blocks_.push_back(Block{p, bytes, false});
      best = &blocks_.back();
    }
    best->in_use = true;
    *ptr = best->ptr;
    return Status::Ok();
  }
  // Returns every block to the pool (at the end of an operation).
  void ReturnAll() {
    for (Block& b : blocks_) b.in_use = false;
  }
  // Frees every block (Clear, destruction).
  void Release() {
    for (Block& b : blocks_) allocator_->FreeDevice(b.ptr);
    blocks_.clear();
  }
  int64_t bytes() const {
    int64_t total = 0;
    for (const Block& b : blocks_) total += static_cast<int64_t>(b.bytes);
    return total;
  }

 private:
  struct Block {
    void* ptr = nullptr;
    size_t bytes;
    bool in_use;
  };
  GpuAllocator* allocator_ = nullptr;
  std::vector<Block> blocks_;
};

// Typed scratch for one operation: from the caller's GpuScratch when the
// runner has one, else from the pool (its blocks go back when done).
class Scratch {
 public:
  Scratch(ScratchPool* pool, GpuScratch* external) : pool_(pool), external_(external) {}
  ~Scratch() { pool_->ReturnAll(); }
  template <typename T>
  Status Get(size_t count, T** ptr) {
    void* p = nullptr;
    const size_t bytes = std::max<size_t>(count * sizeof(T), 1);
    DYNEMB_RETURN_IF_ERROR(external_ != nullptr ? external_->Allocate(bytes, &p)
                                                : pool_->Take(bytes, &p));
    *ptr = static_cast<T*>(p);
    return Status::Ok();
  }

 private:
  ScratchPool* pool_ = nullptr;
  GpuScratch* external_ = nullptr;
};

// Makes the table's device current for a scope, and the caller's again
// after: a table may be destroyed on any thread (TF deletes a resource where
// its last reference goes).
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&saved_) == cudaSuccess && saved_ != device) {
      restore_ = cudaSetDevice(device) == cudaSuccess;
    }
  }
  ~ScopedDevice() {
    if (restore_) (void)cudaSetDevice(saved_);
  }

 private:
  int saved_ = 0;
  bool restore_ = false;
};

// A table's storage: the device view kernels get, and the host address of
// its mapped host rows (to free them).
template <typename K>
struct Storage {
  DeviceTable<K> t;
  void* mapped_host = nullptr;
};

template <typename K>
class GpuTable final : public Table, public GpuTableOps {
 public:
  // `stream`: see NewGpuTable (nullptr: Init creates one, owned).
  GpuTable(const TableOptions& options, GpuAllocator* allocator, cudaStream_t stream)
      : options_(options),
        allocator_(allocator),
        pool_(allocator),
        value_bytes_(options.value_bytes()),
        bounded_(options.max_capacity > 0),
        stream_(stream),
        owns_stream_(stream == nullptr) {}

  ~GpuTable() override {
    ScopedDevice on_device(device_);
    if (done_ != nullptr) (void)cudaEventSynchronize(done_);
    FreeStorage(&storage_);
    pool_.Release();
    if (batch_counters_ != nullptr) allocator_->FreeDevice(batch_counters_);
    if (misses_ != nullptr) allocator_->FreeDevice(misses_);
    if (host_counters_ != nullptr) allocator_->FreeMappedHost(host_counters_);
    if (owns_stream_ && stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    if (done_ != nullptr) (void)cudaEventDestroy(done_);
  }

  Status Init() {
    DYNEMB_CUDA_RETURN(cudaGetDevice(&device_), "cudaGetDevice");
    DYNEMB_CUDA_RETURN(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device_),
                       "cudaDeviceGetAttribute");
    if (owns_stream_) {
      DYNEMB_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                         "cudaStreamCreate");
    }
    DYNEMB_CUDA_RETURN(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming),
                       "cudaEventCreate");
    void* p = nullptr;
    DYNEMB_RETURN_IF_ERROR(allocator_->AllocateDevice(sizeof(BatchCounters), &p));
    batch_counters_ = static_cast<unsigned long long*>(p);
    DYNEMB_RETURN_IF_ERROR(allocator_->AllocateDevice(sizeof(unsigned long long), &p));
    misses_ = static_cast<unsigned long long*>(p);
    DYNEMB_CUDA_RETURN(cudaMemsetAsync(misses_, 0, sizeof(unsigned long long), stream_),
                       "cudaMemsetAsync");
    // Writes add into the batch counters and fold them later (pending counts):
    // they must start at zero, which cudaMalloc'ed memory does not.
    DYNEMB_RETURN_IF_ERROR(ResetBatchCounters(stream_));
    DYNEMB_RETURN_IF_ERROR(allocator_->AllocateMappedHost(sizeof(BatchCounters), &p));
    host_counters_ = static_cast<BatchCounters*>(p);
    DYNEMB_RETURN_IF_ERROR(AllocateStorage(InitialBuckets(), stream_, &storage_));
    DYNEMB_CUDA_RETURN(cudaEventRecord(done_, stream_), "cudaEventRecord");
    return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

  const TableOptions& options() const override { return options_; }

  // Size() cannot report an error; a failed fold leaves its counts pending
  // and the next operation (or CheckedSize) reports it.
  int64_t Size() const override {
    int64_t size = 0;
    (void)CheckedSize(&size);
    return size;
  }

  Status CheckedSize(int64_t* size) const override {
    std::lock_guard<std::mutex> lock(mu_);
    const Status status = Mutable()->FoldPendingOrdered();
    *size = size_;
    return status;
  }

  int64_t Capacity() const override {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t limit = static_cast<int64_t>(SlotsLimit(storage_.t.num_buckets));
    return bounded_ ? std::min(limit, options_.max_capacity) : limit;
  }

  int64_t MemoryBytes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t per_slot = 1 + sizeof(K) + 2 * sizeof(uint64_t) + value_bytes_;
    return static_cast<int64_t>(sizeof(*this)) +
           static_cast<int64_t>(storage_.t.num_slots()) * per_slot + pool_.bytes();
  }

  TableCounters Counters() const override {
    std::lock_guard<std::mutex> lock(mu_);
    (void)Mutable()->FoldPendingOrdered();
    TableCounters c = counters_;
    c.lookups = lookups_;
    // Find's misses are counted on the device; wait for queued finds.
    unsigned long long misses = 0;
    if (cudaEventSynchronize(done_) == cudaSuccess &&
        cudaMemcpy(&misses, misses_, sizeof(misses), cudaMemcpyDeviceToHost) == cudaSuccess) {
      c.misses = misses;
    }
    return c;
  }

  Status FindRows(const void* keys, int64_t n, void* values, bool* exists, const void* defaults,
                  bool default_per_key, bool update_scores, const Runner& runner) override {
    if (n == 0) return Status::Ok();
    DYNEMB_RETURN_IF_ERROR(CheckBatch(keys, n, values, "values"));
    if (defaults == nullptr) return InvalidArgument("Find: defaults must not be null");
    cudaStream_t stream = nullptr;
    DYNEMB_RETURN_IF_ERROR(StreamOf(runner, &stream));
    std::lock_guard<std::mutex> lock(mu_);
    // Asynchronous: the caller synchronizes its stream.
    return Ordered(stream, [&] {
      const bool touch = update_scores && options_.find_updates_scores &&
                         (options_.strategy == EvictStrategy::kLru ||
                          options_.strategy == EvictStrategy::kEpochLru);
      const ScoreRule rule{options_.strategy, touch ? NextClock() : 0, CurrentEpoch()};
      const int per_warp = KeysPerWarp(n, num_sms_);
      gpu::FindKernel<K>
          <<<WarpGrid((n + per_warp - 1) / per_warp, num_sms_), kBlockThreads, 0, stream>>>(
          storage_.t, static_cast<const K*>(keys), static_cast<uint64_t>(n),
          static_cast<char*>(values), exists, static_cast<const char*>(defaults),
          default_per_key, touch, rule, misses_, per_warp);
      lookups_ += static_cast<uint64_t>(n);
      return CudaStatus(cudaGetLastError(), "FindKernel launch");
    });
  }

  Status InsertAndEvict(const void* keys, int64_t n, const void* values, const uint64_t* scores,
                        EvictedEntries* evicted, const Runner& runner) override {
    if (evicted != nullptr) evicted->count = 0;
    if (n == 0) return Status::Ok();
    DYNEMB_RETURN_IF_ERROR(CheckBatch(keys, n, values, "values"));
    WriteArgs a;
    a.rows = static_cast<const char*>(values);
    a.scores = scores;
    return Write(static_cast<const K*>(keys), n, a, /*is_insert=*/true, evicted, runner);
  }

  Status AccumAndEvict(const void* keys, int64_t n, const void* deltas, const bool* exists,
                       EvictedEntries* evicted, const Runner& runner) override {
    if (evicted != nullptr) evicted->count = 0;
    if (n == 0) return Status::Ok();
    DYNEMB_RETURN_IF_ERROR(CheckBatch(keys, n, deltas, "deltas"));
    if (exists == nullptr) return InvalidArgument("Accum: exists must not be null");
    WriteArgs a;
    a.rows = static_cast<const char*>(deltas);
    a.exists = exists;
    return Write(static_cast<const K*>(keys), n, a, /*is_insert=*/false, evicted, runner);
  }

  // gpu_table.h "ApplyRule": grouped by a sort, so that a key's rows apply
  // in batch order; each key's rows are applied by one warp.
  Status ApplyRule(const void* keys, int64_t n, const void* initial, const RuleStep& step,
                   const Runner& runner) override {
    return ApplyRuleGrouped(keys, n, initial, step, runner, /*distinct=*/false);
  }
  // gpu_table.h "ApplyRuleDistinct": the batch is its own grouping.
  Status ApplyRuleDistinct(const void* keys, int64_t n, const void* initial,
                           const RuleStep& step, const Runner& runner) override {
    return ApplyRuleGrouped(keys, n, initial, step, runner, /*distinct=*/true);
  }
  Status ApplyRuleGrouped(const void* keys, int64_t n, const void* initial, const RuleStep& step,
                          const Runner& runner, bool distinct) {
    DYNEMB_RETURN_IF_ERROR(CheckRuleStep(options_, keys, n, initial, step));
    if (n == 0) return Status::Ok();
    const GpuRunner* gpu_runner = nullptr;
    DYNEMB_RETURN_IF_ERROR(GpuRunnerOf(runner, &gpu_runner));
    const cudaStream_t stream = gpu_runner->stream();
    std::lock_guard<std::mutex> lock(mu_);
    return Ordered(stream, [&] {
      return options_.value_type == ValueType::kFloat64
                 ? ApplyRuleLocked<double>(static_cast<const K*>(keys), n, initial, step,
                                           distinct, stream, gpu_runner->scratch())
                 : ApplyRuleLocked<float>(static_cast<const K*>(keys), n, initial, step,
                                          distinct, stream, gpu_runner->scratch());
    });
  }

  // gpu_table.h "Assign": insert's write for the keys present, nothing for
  // the others. Never grows or evicts, so it never synchronizes.
  Status Assign(const void* keys, int64_t n, const void* values, const uint64_t* scores,
                const Runner& runner) override {
    if (n == 0) return Status::Ok();
    DYNEMB_RETURN_IF_ERROR(CheckBatch(keys, n, values, "values"));
    const GpuRunner* gpu_runner = nullptr;
    DYNEMB_RETURN_IF_ERROR(GpuRunnerOf(runner, &gpu_runner));
    const cudaStream_t stream = gpu_runner->stream();
    std::lock_guard<std::mutex> lock(mu_);
    return Ordered(stream, [&] {
      WriteArgs a;
      a.rows = static_cast<const char*>(values);
      a.scores = scores;
      DYNEMB_RETURN_IF_ERROR(PrepareWrite(scores, n, /*is_insert=*/true, stream, &a));
      Scratch scratch(&pool_, gpu_runner->scratch());
      a.mode = gpu::ApplyMode::kPresentOnly;
      return ApplyLastRows(static_cast<const K*>(keys), n, a, stream, &scratch);
    });
  }

  Status Remove(const void* keys, int64_t n, const Runner& runner) override {
    if (n == 0) return Status::Ok();
    DYNEMB_RETURN_IF_ERROR(CheckBatch(keys, n, keys, "keys"));
    cudaStream_t stream = nullptr;
    DYNEMB_RETURN_IF_ERROR(StreamOf(runner, &stream));
    std::lock_guard<std::mutex> lock(mu_);
    return Ordered(stream, [&] {
      // The device counters may hold pending writes' counts: they fold in with
      // this batch's (ReadBatchCounters).
      gpu::RemoveKernel<K><<<ThreadGrid(n, num_sms_), kBlockThreads, 0, stream>>>(
          storage_.t, static_cast<const K*>(keys), static_cast<uint64_t>(n), batch_counters_);
      DYNEMB_CUDA_RETURN(cudaGetLastError(), "RemoveKernel launch");
      return ReadBatchCounters(stream);  // host sync: Size() is kept on the host
    });
  }

  void Clear() override {
    std::lock_guard<std::mutex> lock(mu_);
    // Clear cannot report an error (table.h); on a CUDA error the table keeps
    // its content and the next operation reports the error.
    if (!Begin(stream_).ok() || !CudaStatus(cudaStreamSynchronize(stream_), "Clear").ok()) return;
    FreeStorage(&storage_);  // first, so that the memory is free for the new table
    pool_.Release();
    // Pending writes' counts fold in first (the counters of operations keep
    // them); whatever a failed fold left on the device is dropped.
    (void)FoldPending(stream_);
    (void)ResetBatchCounters(stream_);
    pending_ = false;
    pending_rows_ = 0;
    if (!AllocateStorage(InitialBuckets(), stream_, &storage_).ok()) {
      // No memory for the initial table: try one bucket. If even that fails
      // the table has no buckets and write operations report the error.
      (void)AllocateStorage(1, stream_, &storage_);
    }
    size_ = 0;
    used_ = 0;
    (void)End(stream_);
  }

  // Runs on the table's stream, whatever `runner` is.
  Status Export(ExportSink* sink, const Runner&) override {
    std::lock_guard<std::mutex> lock(mu_);
    const Status status = Ordered(stream_, [&] { return ExportLocked(sink); });
    ReleaseExportScratch();
    return status;
  }

  // Gathers the whole table into device scratch, then hands it to the sink in
  // host chunks: device memory O(size), host memory O(chunk_rows).
  Status ExportChunks(int64_t chunk_rows, const ChunkSink& sink) override {
    if (chunk_rows < 1) {
      return InvalidArgument("chunk_rows must be >= 1, got " + std::to_string(chunk_rows));
    }
    std::lock_guard<std::mutex> lock(mu_);
    const Status status = Ordered(stream_, [&] { return ExportChunksLocked(chunk_rows, sink); });
    ReleaseExportScratch();
    return status;
  }

 private:
  // An export's scratch holds the whole table (and its sort buffers): give it
  // back rather than keep a second copy of the table in device memory. After
  // an error, queued work may still use it: wait for the stream first.
  void ReleaseExportScratch() {
    (void)cudaStreamSynchronize(stream_);
    pool_.Release();
  }

  Status ExportLocked(ExportSink* sink) {
    DYNEMB_RETURN_IF_ERROR(FoldPending(stream_));
    const int64_t n = size_;
    void* keys = nullptr;
    void* values = nullptr;
    uint64_t* scores = nullptr;
    DYNEMB_RETURN_IF_ERROR(sink->Allocate(n, &keys, &values, &scores));
    Scratch scratch(&pool_, nullptr);
    DYNEMB_RETURN_IF_ERROR(GatherAll(n, EntrySink<K>{static_cast<K*>(keys),
                                                     static_cast<char*>(values), scores},
                                     &scratch));
    return CudaStatus(cudaStreamSynchronize(stream_), "Export");
  }

  Status ExportChunksLocked(int64_t chunk_rows, const ChunkSink& sink) {
    DYNEMB_RETURN_IF_ERROR(FoldPending(stream_));
    const int64_t n = size_;
    Scratch scratch(&pool_, nullptr);
    EntrySink<K> all;
    DYNEMB_RETURN_IF_ERROR(scratch.Get(std::max<int64_t>(n, 1), &all.keys));
    DYNEMB_RETURN_IF_ERROR(scratch.Get(std::max<int64_t>(n, 1) * value_bytes_, &all.values));
    DYNEMB_RETURN_IF_ERROR(scratch.Get(std::max<int64_t>(n, 1), &all.scores));
    DYNEMB_RETURN_IF_ERROR(GatherAll(n, all, &scratch));
    const size_t cap = static_cast<size_t>(std::min<int64_t>(std::max<int64_t>(n, 1), chunk_rows));
    std::vector<K> keys(cap);
    std::vector<char> values(cap * value_bytes_);
    std::vector<uint64_t> scores(cap);
    for (int64_t begin = 0; begin < n; begin += static_cast<int64_t>(cap)) {
      const size_t m = static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(cap), n - begin));
      DYNEMB_RETURN_IF_ERROR(CopyToHostOn(stream_, keys.data(), all.keys + begin, m * sizeof(K)));
      DYNEMB_RETURN_IF_ERROR(
          CopyToHostOn(stream_, values.data(), all.values + begin * value_bytes_, m * value_bytes_));
      DYNEMB_RETURN_IF_ERROR(CopyToHostOn(stream_, scores.data(), all.scores + begin, m * sizeof(uint64_t)));
      DYNEMB_RETURN_IF_ERROR(
          sink(keys.data(), static_cast<int64_t>(m), values.data(), scores.data()));
    }
    return Status::Ok();
  }

  // ------------------------------------------------------------------ checks
  Status CheckBatch(const void* keys, int64_t n, const void* data, const char* what) const {
    return CheckBatchArgs(keys, n, data, what, int64_t{0x7fffffff}, "[0, 2^31) on the GPU");
  }

  static Status GpuRunnerOf(const Runner& runner, const GpuRunner** out) {
    *out = dynamic_cast<const GpuRunner*>(&runner);
    if (*out == nullptr) {
      return InvalidArgument("a GPU table needs a GpuRunner (cc/core/gpu/gpu_table.h)");
    }
    return Status::Ok();
  }
  static Status StreamOf(const Runner& runner, cudaStream_t* stream) {
    const GpuRunner* gpu_runner = nullptr;
    DYNEMB_RETURN_IF_ERROR(GpuRunnerOf(runner, &gpu_runner));
    *stream = gpu_runner->stream();
    return Status::Ok();
  }

  // Every operation runs after the previous one on the device, whatever
  // stream each is queued on: it waits for `done_`, and records it when queued.
  Status Begin(cudaStream_t stream) {
    return CudaStatus(cudaStreamWaitEvent(stream, done_, 0), "cudaStreamWaitEvent");
  }
  Status End(cudaStream_t stream) {
    return CudaStatus(cudaEventRecord(done_, stream), "cudaEventRecord");
  }
  // Runs body() (which queues work on `stream`) between Begin and End; End is
  // recorded after an error too, so the next operation still orders after
  // whatever body() queued.
  template <typename Body>
  Status Ordered(cudaStream_t stream, Body&& body) {
    DYNEMB_RETURN_IF_ERROR(Begin(stream));
    const Status status = body();
    const Status ended = End(stream);
    return status.ok() ? ended : status;
  }

  // ----------------------------------------------------------------- storage
  uint64_t MaxBuckets() const {
    // Bounded tables stop growing where max_capacity fits in half the slots,
    // so that deleted tags (evictions) leave room before a rehash.
    return bounded_ ? std::min(kMaxBuckets, BucketsFor(2 * static_cast<uint64_t>(
                                                               options_.max_capacity)))
                    : kMaxBuckets;
  }
  uint64_t InitialBuckets() const {
    return std::min(MaxBuckets(), BucketsFor(static_cast<uint64_t>(options_.init_capacity)));
  }

  Status AllocateStorage(uint64_t buckets, cudaStream_t stream, Storage<K>* out) {
    Storage<K> s;
    s.t.num_buckets = buckets;
    s.t.value_bytes = static_cast<uint32_t>(value_bytes_);
    const uint64_t slots = s.t.num_slots();
    s.t.hbm_rows = options_.max_hbm_for_values < 0
                       ? slots
                       : std::min<uint64_t>(slots, static_cast<uint64_t>(
                                                       options_.max_hbm_for_values) / value_bytes_);
    Status status = AllocateArrays(&s);
    if (status.ok()) {
      status = CudaStatus(cudaMemsetAsync(s.t.tags, 0, slots, stream), "cudaMemsetAsync");
    }
    if (!status.ok()) {
      FreeStorage(&s);
      return status;
    }
    *out = s;
    return Status::Ok();
  }

  // Tags, keys, scores, ages, and the value rows: device memory for the
  // first hbm_rows, mapped pinned host memory for the rest.
  Status AllocateArrays(Storage<K>* s) {
    DeviceTable<K>& t = s->t;
    const uint64_t slots = t.num_slots();
    DYNEMB_RETURN_IF_ERROR(AllocateDeviceArray(slots, &t.tags));
    DYNEMB_RETURN_IF_ERROR(AllocateDeviceArray(slots, &t.keys));
    DYNEMB_RETURN_IF_ERROR(AllocateDeviceArray(slots, &t.scores));
    DYNEMB_RETURN_IF_ERROR(AllocateDeviceArray(slots, &t.ages));
    if (t.hbm_rows > 0) {
      DYNEMB_RETURN_IF_ERROR(AllocateDeviceArray(t.hbm_rows * value_bytes_, &t.hbm_values));
    }
    if (t.hbm_rows < slots) {
      DYNEMB_RETURN_IF_ERROR(
          allocator_->AllocateMappedHost((slots - t.hbm_rows) * value_bytes_, &s->mapped_host));
      void* device_view = nullptr;
      DYNEMB_CUDA_RETURN(cudaHostGetDevicePointer(&device_view, s->mapped_host, 0),
                         "cudaHostGetDevicePointer");
      t.host_values = static_cast<char*>(device_view);
    }
    return Status::Ok();
  }

  template <typename T>
  Status AllocateDeviceArray(uint64_t count, T** ptr) {
    void* p = nullptr;
    DYNEMB_RETURN_IF_ERROR(allocator_->AllocateDevice(count * sizeof(T), &p));
    *ptr = static_cast<T*>(p);
    return Status::Ok();
  }

  void FreeStorage(Storage<K>* s) {
    allocator_->FreeDevice(s->t.tags);
    allocator_->FreeDevice(s->t.keys);
    allocator_->FreeDevice(s->t.scores);
    allocator_->FreeDevice(s->t.ages);
    allocator_->FreeDevice(s->t.hbm_values);
    allocator_->FreeMappedHost(s->mapped_host);
    *s = Storage<K>();
  }

  // Makes room for `new_keys` more keys: rehashes (into more buckets when
  // needed, up to MaxBuckets) when occupied + deleted slots would pass the
  // load limit. Rehashing drops the deleted tags.
  Status EnsureRoom(uint64_t new_keys, cudaStream_t stream) {
    const uint64_t need = static_cast<uint64_t>(used_) + new_keys;
    if (need <= SlotsLimit(storage_.t.num_buckets)) return Status::Ok();
    const uint64_t keys = static_cast<uint64_t>(size_) + new_keys;
    uint64_t buckets = std::max<uint64_t>(1, storage_.t.num_buckets);  // 0 after a failed Clear
    // Growing: aim for half the load limit, so growth is amortized.
    while (buckets < MaxBuckets() && SlotsLimit(buckets) < 2 * keys) buckets *= 2;
    if (SlotsLimit(buckets) < keys) {
      return Status(StatusCode::kResourceExhausted,
                    "GPU table cannot hold " + std::to_string(keys) + " keys (at most " +
                        std::to_string(SlotsLimit(buckets)) + " in " +
                        std::to_string(buckets) + " buckets)");
    }
    return Rehash(buckets, stream);
  }

  // Moves every entry into new storage of `buckets` buckets.
  Status Rehash(uint64_t buckets, cudaStream_t stream) {
    Storage<K> next;
    DYNEMB_RETURN_IF_ERROR(AllocateStorage(buckets, stream, &next));
    Status status = ResetBatchCounters(stream);
    const uint64_t groups = storage_.t.num_slots() / gpu::kWarpSize;
    if (status.ok()) {
      gpu::RehashKernel<K><<<WarpGrid(groups, num_sms_), kBlockThreads, 0, stream>>>(
          storage_.t, next.t, batch_counters_);
      status = CudaStatus(cudaGetLastError(), "RehashKernel launch");
    }
    if (status.ok()) status = CopyCountersToHost(stream);  // host sync
    if (status.ok() && host_counters_->failures != 0) {
      status = Status(StatusCode::kInternal, "GPU table rehash found no free slot");
    }
    if (status.ok()) status = ResetBatchCounters(stream);
    if (!status.ok()) {
      FreeStorage(&next);
      return status;
    }
    FreeStorage(&storage_);
    storage_ = next;
    used_ = size_;
    return Status::Ok();
  }

  // ------------------------------------------------------------ batch state
  Status ResetBatchCounters(cudaStream_t stream) {
    return CudaStatus(cudaMemsetAsync(batch_counters_, 0, sizeof(BatchCounters), stream),
                      "cudaMemsetAsync");
  }
  // Host sync: the batch counters reach the host.
  Status CopyCountersToHost(cudaStream_t stream) {
    DYNEMB_CUDA_RETURN(cudaMemcpyAsync(host_counters_, batch_counters_, sizeof(BatchCounters),
                                       cudaMemcpyDeviceToHost, stream),
                       "cudaMemcpyAsync (counters)");
    return CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
  // Reads what a pass did into the table's host state, and zeroes it.
  // On failure the counts are dropped as well (reported once).
  Status ReadBatchCounters(cudaStream_t stream) {
    DYNEMB_RETURN_IF_ERROR(CopyCountersToHost(stream));
    const BatchCounters c = *host_counters_;
    if (c.failures != 0) {
      pending_ = false;
      pending_rows_ = 0;
      (void)ResetBatchCounters(stream);
      return Status(StatusCode::kInternal, "GPU table: an insert found no free slot");
    }
    counters_.inserts += c.inserts;
    counters_.updates += c.updates;
    counters_.removes += c.removes;
    size_ += static_cast<int64_t>(c.inserts) - static_cast<int64_t>(c.removes);
    used_ += static_cast<int64_t>(c.new_empty);
    pending_ = false;
    pending_rows_ = 0;
    return ResetBatchCounters(stream);
  }

  // ------------------------------------------------------- pending counts
  // A write that fits (FitsNewKeys) returns without a host sync: its counts
  // stay on the device, "pending", and pending_rows_ bounds the keys it may
  // have added. They fold into size_, used_ and counters_ when something
  // needs them exact: growth, eviction, Remove, Size, Counters, export.

  // Whether n more rows, each possibly a new key, fit without growth or
  // eviction, counting every pending row as a new key too.
  bool FitsNewKeys(uint64_t n) const {
    const uint64_t upper = static_cast<uint64_t>(size_) + pending_rows_ + n;
    return static_cast<uint64_t>(used_) + pending_rows_ + n <= SlotsLimit(storage_.t.num_buckets) &&
           (!bounded_ || upper <= static_cast<uint64_t>(options_.max_capacity));
  }
  // Host sync, only when counts are pending (a stream-ordered part of an
  // operation: between Begin and End).
  Status FoldPending(cudaStream_t stream) {
    return pending_ ? ReadBatchCounters(stream) : Status::Ok();
  }
  // FoldPending as an operation of its own, on the table's stream.
  Status FoldPendingOrdered() {
    if (!pending_) return Status::Ok();
    return Ordered(stream_, [&] { return FoldPending(stream_); });
  }
  // Folding pending counts changes no observable state, so the const
  // accessors (Size, Counters) may do it.
  GpuTable* Mutable() const { return const_cast<GpuTable*>(this); }

  // The score rule, ages and value layout of a write batch of n rows.
  Status PrepareWrite(const uint64_t* scores, int64_t n, bool is_insert, cudaStream_t stream,
                      WriteArgs* a) {
    DYNEMB_RETURN_IF_ERROR(WriteRule(scores, n, is_insert, stream, &a->rule));
    a->age_base = rows_written_;
    rows_written_ += static_cast<uint64_t>(n);
    a->value_type = options_.value_type;
    a->dim = options_.dim;
    a->elem_bytes = static_cast<uint32_t>(ValueTypeSize(options_.value_type));
    return Status::Ok();
  }

  // Finds the batch's distinct keys with a BatchSet (batch_set.cuh).
  Status BuildBatchSet(const K* keys, int64_t n, cudaStream_t stream, Scratch* scratch,
                       gpu::BatchSet<K>* out) {
    gpu::BatchSet<K> set;
    set.keys = keys;
    set.n = static_cast<uint32_t>(n);
    set.capacity = gpu::BatchSetCapacity(static_cast<uint64_t>(n));
    gpu::BatchSetEntry* entries = nullptr;
    DYNEMB_RETURN_IF_ERROR(scratch->Get(static_cast<size_t>(set.capacity), &entries));
    DYNEMB_RETURN_IF_ERROR(scratch->Get(static_cast<size_t>(n), &set.slot_of_row));
    DYNEMB_CUDA_RETURN(gpu::BuildBatchSet(&set, entries, ThreadGrid(set.n, num_sms_), stream),
                       "BatchSetKernel");
    *out = set;
    return Status::Ok();
  }

  // An insert that fits, or an assign (a.mode), without sort or host sync;
  // its counts stay pending.
  Status ApplyLastRows(const K* keys, int64_t n, const WriteArgs& a, cudaStream_t stream,
                       Scratch* scratch) {
    gpu::BatchSet<K> set;
    DYNEMB_RETURN_IF_ERROR(BuildBatchSet(keys, n, stream, scratch, &set));
    DYNEMB_RETURN_IF_ERROR(LaunchApplyLastRows(set, a, stream));
    pending_ = true;
    return Status::Ok();
  }
  Status LaunchApplyLastRows(const gpu::BatchSet<K>& set, const WriteArgs& a,
                             cudaStream_t stream) {
    const int per_warp = KeysPerWarp(set.n, num_sms_);
    gpu::ApplyLastRowsKernel<K>
        <<<WarpGrid((set.n + per_warp - 1) / per_warp, num_sms_), kBlockThreads, 0, stream>>>(
            storage_.t, set, a, batch_counters_, per_warp);
    return CudaStatus(cudaGetLastError(), "ApplyLastRowsKernel launch");
  }

  // An insert into an unbounded table that may have to grow: the keys
  // present are written first (the BatchSet pass counts the distinct absent
  // ones), then the table makes room for those (one host sync) and a second
  // pass over the same set inserts them. No sort.
  Status InsertGrowing(const K* keys, int64_t n, WriteArgs a, cudaStream_t stream,
                       Scratch* scratch) {
    gpu::BatchSet<K> set;
    DYNEMB_RETURN_IF_ERROR(BuildBatchSet(keys, n, stream, scratch, &set));
    a.mode = gpu::ApplyMode::kPresentOnly;
    DYNEMB_RETURN_IF_ERROR(LaunchApplyLastRows(set, a, stream));
    DYNEMB_RETURN_IF_ERROR(ReadBatchCounters(stream));  // host sync: the new keys
    const uint64_t new_keys = host_counters_->new_keys;
    if (new_keys == 0) return Status::Ok();  // a table at its load limit, keys all present
    DYNEMB_RETURN_IF_ERROR(EnsureRoom(new_keys, stream));
    a.mode = gpu::ApplyMode::kAbsentOnly;
    DYNEMB_RETURN_IF_ERROR(LaunchApplyLastRows(set, a, stream));
    return ReadBatchCounters(stream);
  }

  // ------------------------------------------------------------ ApplyRule
  template <typename T>
  Status ApplyRuleLocked(const K* keys, int64_t n, const void* initial, const RuleStep& step,
                         bool distinct, cudaStream_t stream, GpuScratch* external) {
    gpu::RuleArgs<T> r;
    r.rule = step.rule;
    r.weight_decay = step.weight_decay;
    const int num_coefficients = UpdateRuleCoefficients(step.rule) + (step.weight_decay ? 2 : 0);
    if (num_coefficients > gpu::kMaxRuleCoefficients) {
      return Status(StatusCode::kInternal, "ApplyRule: a rule with more coefficients than " +
                                               std::to_string(gpu::kMaxRuleCoefficients));
    }
    std::memcpy(r.coefficients, step.coefficients, num_coefficients * sizeof(T));  // host memory
    r.slots = UpdateRuleSlots(step.rule);
    r.dim = step.dim;
    r.rows = static_cast<const T*>(step.rows);
    r.grads = static_cast<const T*>(step.grads);
    r.new_rows = static_cast<T*>(step.new_rows);
    r.initial = static_cast<const T*>(initial);

    WriteArgs a;
    DYNEMB_RETURN_IF_ERROR(PrepareWrite(nullptr, n, /*is_insert=*/true, stream, &a));
    Scratch scratch(&pool_, external);
    GroupedBatch<K> batch;
    DYNEMB_RETURN_IF_ERROR(distinct ? GroupDistinct(keys, n, stream, &scratch, &batch)
                                    : Group(keys, n, stream, &scratch, &batch));
    const uint64_t un = static_cast<uint64_t>(n);
    if (!FitsNewKeys(un)) DYNEMB_RETURN_IF_ERROR(FoldPending(stream));
    if (FitsNewKeys(un)) {
      a.mode = gpu::ApplyMode::kAll;
      DYNEMB_RETURN_IF_ERROR(LaunchApplyRule(batch, a, r, stream));
      pending_ = true;
      pending_rows_ += un;
      return Status::Ok();
    }
    // Growth (the table is unbounded): count the new keys, make room, then
    // apply the present keys' rows and the new keys' rows.
    a.mode = gpu::ApplyMode::kPresentOnly;
    DYNEMB_RETURN_IF_ERROR(LaunchApplyRule(batch, a, r, stream));
    DYNEMB_RETURN_IF_ERROR(ReadBatchCounters(stream));  // host sync
    DYNEMB_RETURN_IF_ERROR(EnsureRoom(host_counters_->new_keys, stream));
    a.mode = gpu::ApplyMode::kAbsentOnly;
    DYNEMB_RETURN_IF_ERROR(LaunchApplyRule(batch, a, r, stream));
    return ReadBatchCounters(stream);
  }

  template <typename T>
  Status LaunchApplyRule(const GroupedBatch<K>& batch, const WriteArgs& a,
                         const gpu::RuleArgs<T>& r, cudaStream_t stream) {
    const int per_warp = KeysPerWarp(batch.n, num_sms_);
    gpu::ApplyRuleKernel<K, T>
        <<<WarpGrid((batch.n + per_warp - 1) / per_warp, num_sms_), kBlockThreads, 0, stream>>>(
            storage_.t, batch, a, r, batch_counters_, per_warp);
    return CudaStatus(cudaGetLastError(), "ApplyRuleKernel launch");
  }

  // Advances the clock by one, saturating (as the CPU table does).
  uint64_t NextClock() {
    if (clock_ != ~uint64_t{0}) ++clock_;
    return clock_;
  }
  uint64_t CurrentEpoch() const {
    if (options_.step_per_epoch <= 0) return epoch_floor_;
    return std::max(epoch_floor_, insert_batches_ / static_cast<uint64_t>(options_.step_per_epoch));
  }

  // The batch's score rule; explicit scores (import, restore) first move the
  // clock and epoch past them (table.h), which needs them on the host.
  Status WriteRule(const uint64_t* scores, int64_t n, bool is_insert, cudaStream_t stream,
                   ScoreRule* rule) {
    const bool epochs = options_.strategy == EvictStrategy::kEpochLru ||
                        options_.strategy == EvictStrategy::kEpochLfu;
    if (scores != nullptr && (epochs || options_.strategy == EvictStrategy::kLru)) {
      std::vector<uint64_t> host(static_cast<size_t>(n));
      DYNEMB_CUDA_RETURN(cudaMemcpyAsync(host.data(), scores, n * sizeof(uint64_t),
                                         cudaMemcpyDeviceToHost, stream),
                         "cudaMemcpyAsync (scores)");
      DYNEMB_CUDA_RETURN(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      uint64_t max_clock = 0, max_epoch = 0;
      for (uint64_t s : host) {
        max_clock = std::max(max_clock, epochs ? (s & 0xffffffffu) : s);
        max_epoch = std::max(max_epoch, s >> 32);
      }
      if (options_.strategy != EvictStrategy::kEpochLfu) clock_ = std::max(clock_, max_clock);
      if (epochs) epoch_floor_ = std::max(epoch_floor_, max_epoch);
    }
    *rule = ScoreRule{options_.strategy, NextClock(), CurrentEpoch()};
    if (is_insert) ++insert_batches_;
    return Status::Ok();
  }

  // Sorts the batch's keys with their positions and finds where each
  // distinct key's rows begin.
  Status Group(const K* keys, int64_t n, cudaStream_t stream, Scratch* scratch,
               GroupedBatch<K>* out) {
    const uint64_t un = static_cast<uint64_t>(n);
    uint32_t* positions = nullptr;
    K* sorted_keys = nullptr;
    uint32_t* sorted_pos = nullptr;
    uint8_t* flags = nullptr;
    uint32_t* starts = nullptr;
    uint32_t* num_keys = nullptr;
    DYNEMB_RETURN_IF_ERROR(scratch->Get(un, &positions));
    DYNEMB_RETURN_IF_ERROR(scratch->Get(un, &sorted_keys));
    DYNEMB_RETURN_IF_ERROR(scratch->Get(un, &sorted_pos));
    DYNEMB_RETURN_IF_ERROR(scratch->Get(un, &flags));
    DYNEMB_RETURN_IF_ERROR(scratch->Get(un, &starts));
    DYNEMB_RETURN_IF_ERROR(scratch->Get(1, &num_keys));
    gpu::IotaKernel<<<ThreadGrid(un, num_sms_), kBlockThreads, 0, stream>>>(positions, un);
    DYNEMB_CUDA_RETURN(cudaGetLastError(), "IotaKernel launch");
    // Radix sort is stable: each key's positions stay ascending.
    size_t sort_bytes = 0, select_bytes = 0;
    DYNEMB_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, sorted_keys,
                                                       positions, sorted_pos, static_cast<int>(n),
                                                       0, static_cast<int>(sizeof(K) * 8), stream),
                       "cub SortPairs (size)");
    thrust::counting_iterator<uint32_t> index(0);
    DYNEMB_CUDA_RETURN(cub::DeviceSelect::Flagged(nullptr, select_bytes, index, flags, starts,
                                                  num_keys, static_cast<int>(n), stream),
                       "cub Flagged (size)");
    char* temp = nullptr;
    DYNEMB_RETURN_IF_ERROR(scratch->Get(std::max(sort_bytes, select_bytes), &temp));
    DYNEMB_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(temp, sort_bytes, keys, sorted_keys,
                                                       positions, sorted_pos, static_cast<int>(n),
                                                       0, static_cast<int>(sizeof(K) * 8), stream),
                       "cub SortPairs");
    gpu::KeyStartKernel<K><<<ThreadGrid(un, num_sms_), kBlockThreads, 0, stream>>>(sorted_keys,
                                                                                   un, flags);
    DYNEMB_CUDA_RETURN(cudaGetLastError(), "KeyStartKernel launch");
    DYNEMB_CUDA_RETURN(cub::DeviceSelect::Flagged(temp, select_bytes, index, flags, starts,
                                                  num_keys, static_cast<int>(n), stream),
                       "cub Flagged");
    out->sorted_keys = sorted_keys;
    out->sorted_pos = sorted_pos;
    out->starts = starts;
    out->num_keys = num_keys;
    out->n = static_cast<uint32_t>(n);
    return Status::Ok();
  }

  // The grouping of a batch of distinct keys: itself. positions [0, n] is
  // both sorted_pos and starts (key u is row u), and its last element, n, is
  // the device count of keys.
  Status GroupDistinct(const K* keys, int64_t n, cudaStream_t stream, Scratch* scratch,
                       GroupedBatch<K>* out) {
    const uint64_t un = static_cast<uint64_t>(n);
    uint32_t* positions = nullptr;
    DYNEMB_RETURN_IF_ERROR(scratch->Get(un + 1, &positions));
    gpu::IotaKernel<<<ThreadGrid(un + 1, num_sms_), kBlockThreads, 0, stream>>>(positions,
                                                                                  un + 1);
    DYNEMB_CUDA_RETURN(cudaGetLastError(), "IotaKernel launch");
    out->sorted_keys = keys;
    out->sorted_pos = positions;
    out->starts = positions;
    out->num_keys = positions + un;
    out->n = static_cast<uint32_t>(n);
    return Status::Ok();
  }

  Status Apply(const GroupedBatch<K>& batch, const WriteArgs& a, cudaStream_t stream) {
    // batch.n bounds the distinct keys (their count stays on the device).
    const int per_warp = KeysPerWarp(batch.n, num_sms_);
    gpu::ApplyWritesKernel<K>
        <<<WarpGrid((batch.n + per_warp - 1) / per_warp, num_sms_), kBlockThreads, 0, stream>>>(
            storage_.t, batch, a, batch_counters_, per_warp);
    return CudaStatus(cudaGetLastError(), "ApplyWritesKernel launch");
  }

  // ------------------------------------------------------------ write batch
  Status Write(const K* keys, int64_t n, WriteArgs a, bool is_insert, EvictedEntries* evicted,
               const Runner& runner) {
    const GpuRunner* gpu_runner = nullptr;
    DYNEMB_RETURN_IF_ERROR(GpuRunnerOf(runner, &gpu_runner));
    const cudaStream_t stream = gpu_runner->stream();
    std::lock_guard<std::mutex> lock(mu_);
    return Ordered(stream, [&] {
      return WriteLocked(keys, n, a, is_insert, evicted, stream, gpu_runner->scratch());
    });
  }

  Status WriteLocked(const K* keys, int64_t n, WriteArgs a, bool is_insert,
                     EvictedEntries* evicted, cudaStream_t stream, GpuScratch* external) {
    DYNEMB_RETURN_IF_ERROR(PrepareWrite(a.scores, n, is_insert, stream, &a));
    Scratch scratch(&pool_, external);
    const uint64_t un = static_cast<uint64_t>(n);
    // Whether there is room for every row to be a new key: first against the
    // pending writes' upper bound, then, if that fails, exactly.
    if (!FitsNewKeys(un)) DYNEMB_RETURN_IF_ERROR(FoldPending(stream));
    if (FitsNewKeys(un)) {
      a.mode = gpu::ApplyMode::kAll;
      if (a.exists == nullptr) {  // insert: no sort, no host sync
        DYNEMB_RETURN_IF_ERROR(ApplyLastRows(keys, n, a, stream, &scratch));
      } else {  // accum adds rows in batch order: sorted grouping
        GroupedBatch<K> batch;
        DYNEMB_RETURN_IF_ERROR(Group(keys, n, stream, &scratch, &batch));
        DYNEMB_RETURN_IF_ERROR(Apply(batch, a, stream));
        pending_ = true;
      }
      pending_rows_ += un;
      return Status::Ok();
    }
    // Growth or eviction: the counts are exact here (FoldPending above).
    if (!bounded_ && a.exists == nullptr) return InsertGrowing(keys, n, a, stream, &scratch);
    GroupedBatch<K> batch;
    DYNEMB_RETURN_IF_ERROR(Group(keys, n, stream, &scratch, &batch));
    // First round: keys present now. Rows of absent keys are marked, and the
    // distinct absent keys that will insert are counted.
    uint32_t* key_of_row = nullptr;
    DYNEMB_RETURN_IF_ERROR(scratch.Get(un, &key_of_row));
    DYNEMB_CUDA_RETURN(cudaMemsetAsync(key_of_row, 0xff, un * sizeof(uint32_t), stream),
                       "cudaMemsetAsync");
    a.mode = gpu::ApplyMode::kPresentOnly;
    a.key_of_row = key_of_row;
    DYNEMB_RETURN_IF_ERROR(Apply(batch, a, stream));
    // Host sync: how many new keys decides growth and eviction.
    DYNEMB_RETURN_IF_ERROR(ReadBatchCounters(stream));
    const uint64_t new_keys = host_counters_->new_keys;
    if (!bounded_ || size_ + static_cast<int64_t>(new_keys) <= options_.max_capacity) {
      DYNEMB_RETURN_IF_ERROR(EnsureRoom(new_keys, stream));
      a.mode = gpu::ApplyMode::kAbsentOnly;
      DYNEMB_RETURN_IF_ERROR(Apply(batch, a, stream));
      return ReadBatchCounters(stream);
    }
    return EvictingRound(keys, n, a, batch, evicted, stream, &scratch);
  }

  // ------------------------------------------------- bounded second round
  // The rows of keys absent at the start of a batch that fills the table
  // (gpu_table.h "Bounded tables"; the rule is in eviction_plan.h).
  Status EvictingRound(const K* keys, int64_t n, const WriteArgs& a,
                       const GroupedBatch<K>& batch, EvictedEntries* evicted,
                       cudaStream_t stream, Scratch* scratch) {
    const size_t un = static_cast<size_t>(n);
    // The round's rows, and their flags and scores, on the host.
    std::vector<uint32_t> key_of_row(un);
    std::vector<uint64_t> scores;
    std::unique_ptr<bool[]> exists;
    DYNEMB_RETURN_IF_ERROR(CopyToHostOn(stream, key_of_row.data(), a.key_of_row, un * 4));
    if (a.scores != nullptr) {
      scores.resize(un);
      DYNEMB_RETURN_IF_ERROR(CopyToHostOn(stream, scores.data(), a.scores, un * 8));
    }
    if (a.exists != nullptr) {
      exists.reset(new bool[un]);
      DYNEMB_RETURN_IF_ERROR(CopyToHostOn(stream, exists.get(), a.exists, un));
    }
    uint32_t num_keys = 0;
    DYNEMB_RETURN_IF_ERROR(CopyToHostOn(stream, &num_keys, batch.num_keys, sizeof(num_keys)));
    int64_t round_rows = 0;
    for (uint32_t k : key_of_row) round_rows += k != EvictionInput::kNotInRound;

    // The stored entries that may be evicted: the lowest round_rows by (score, age).
    const int64_t num_lowest = std::min<int64_t>(size_, round_rows);
    uint32_t* lowest_slots = nullptr;
    std::vector<uint64_t> lowest_scores(static_cast<size_t>(num_lowest));
    std::vector<uint64_t> lowest_ages(static_cast<size_t>(num_lowest));
    DYNEMB_RETURN_IF_ERROR(SortedSlots(/*by_score=*/true, stream, scratch, &lowest_slots));
    if (num_lowest > 0) {
      uint64_t* tmp = nullptr;
      DYNEMB_RETURN_IF_ERROR(scratch->Get(static_cast<size_t>(num_lowest), &tmp));
      DYNEMB_RETURN_IF_ERROR(GatherU64(storage_.t.scores, lowest_slots, num_lowest, tmp, stream));
      DYNEMB_RETURN_IF_ERROR(CopyToHostOn(stream, lowest_scores.data(), tmp, num_lowest * 8));
      DYNEMB_RETURN_IF_ERROR(GatherU64(storage_.t.ages, lowest_slots, num_lowest, tmp, stream));
      DYNEMB_RETURN_IF_ERROR(CopyToHostOn(stream, lowest_ages.data(), tmp, num_lowest * 8));
    }

    EvictionInput in;
    in.n = n;
    in.key_of_row = key_of_row.data();
    in.num_keys = num_keys;
    in.explicit_scores = a.scores != nullptr ? scores.data() : nullptr;
    in.exists = exists.get();
    in.lowest_scores = lowest_scores.data();
    in.lowest_ages = lowest_ages.data();
    in.num_lowest = num_lowest;
    in.free_room = std::max<int64_t>(0, options_.max_capacity - size_);
    in.rule = a.rule;
    in.age_base = a.age_base;
    const EvictionPlan plan = PlanEvictions(in);
    return ApplyPlan(keys, a, batch, plan, lowest_slots, evicted, stream, scratch);
  }

  Status ApplyPlan(const K* keys, const WriteArgs& a, const GroupedBatch<K>& batch,
                   const EvictionPlan& plan, const uint32_t* lowest_slots,
                   EvictedEntries* evicted, cudaStream_t stream, Scratch* scratch) {
    EntrySink<K> out;
    if (evicted != nullptr) {
      out.keys = static_cast<K*>(evicted->keys);
      out.values = static_cast<char*>(evicted->values);
      out.scores = evicted->scores;
    }
    const uint64_t stored = static_cast<uint64_t>(plan.stored_evicted);
    // 1. Stored entries evicted: reported in rows [0, stored), then deleted.
    if (stored > 0) {
      gpu::EvictSlotsKernel<K><<<WarpGrid(stored, num_sms_), kBlockThreads, 0, stream>>>(
          storage_.t, lowest_slots, stored, out);
      DYNEMB_CUDA_RETURN(cudaGetLastError(), "EvictSlotsKernel launch");
    }
    size_ -= static_cast<int64_t>(stored);
    // 2. Stays: the kept ones inserted, the evicted ones reported after.
    std::vector<PlannedStay> stays(plan.kept);
    stays.insert(stays.end(), plan.evicted.begin(), plan.evicted.end());
    DYNEMB_RETURN_IF_ERROR(EnsureRoom(plan.kept.size(), stream));
    if (!stays.empty()) {
      PlannedStay* d_stays = nullptr;
      DYNEMB_RETURN_IF_ERROR(scratch->Get(stays.size(), &d_stays));
      DYNEMB_RETURN_IF_ERROR(CopyToDevice(d_stays, stays.data(), stays.size() * sizeof(PlannedStay), stream));
      gpu::ApplyStaysKernel<K><<<WarpGrid(stays.size(), num_sms_), kBlockThreads, 0, stream>>>(
          storage_.t, batch, a, d_stays, stays.size(), plan.kept.size(), Offset(out, stored),
          batch_counters_);
      DYNEMB_CUDA_RETURN(cudaGetLastError(), "ApplyStaysKernel launch");
    }
    // 3. Rows turned away, reported last.
    const uint64_t turned = plan.turned_away_pos.size();
    if (turned > 0 && evicted != nullptr) {
      uint32_t* d_pos = nullptr;
      uint64_t* d_scores = nullptr;
      DYNEMB_RETURN_IF_ERROR(scratch->Get(turned, &d_pos));
      DYNEMB_RETURN_IF_ERROR(scratch->Get(turned, &d_scores));
      DYNEMB_RETURN_IF_ERROR(CopyToDevice(d_pos, plan.turned_away_pos.data(), turned * 4, stream));
      DYNEMB_RETURN_IF_ERROR(
          CopyToDevice(d_scores, plan.turned_away_scores.data(), turned * 8, stream));
      gpu::ReportRowsKernel<K><<<WarpGrid(turned, num_sms_), kBlockThreads, 0, stream>>>(
          keys, a.rows, storage_.t.value_bytes, d_pos, d_scores, turned,
          Offset(out, stored + plan.evicted.size()));
      DYNEMB_CUDA_RETURN(cudaGetLastError(), "ReportRowsKernel launch");
    }
    DYNEMB_RETURN_IF_ERROR(CopyCountersToHost(stream));
    if (host_counters_->failures != 0) {
      return Status(StatusCode::kInternal, "GPU table: an insert found no free slot");
    }
    // The plan counted the round's rows; the kernels counted slot claims.
    counters_.inserts += plan.inserts;
    counters_.updates += plan.updates;
    counters_.evictions += plan.evictions;
    size_ += static_cast<int64_t>(plan.kept.size());
    used_ += static_cast<int64_t>(host_counters_->new_empty);
    if (evicted != nullptr) evicted->count = static_cast<int64_t>(stored + plan.evicted.size() + turned);
    return ResetBatchCounters(stream);
  }

  // `out` from row `rows` on (null pointers stay null).
  EntrySink<K> Offset(EntrySink<K> out, uint64_t rows) const {
    if (out.keys != nullptr) out.keys += rows;
    if (out.values != nullptr) out.values += rows * value_bytes_;
    if (out.scores != nullptr) out.scores += rows;
    return out;
  }

  // Host sync: waits for the stream, then the bytes are on the host.
  Status CopyToHostOn(cudaStream_t stream, void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return Status::Ok();
    DYNEMB_CUDA_RETURN(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream),
                       "cudaMemcpyAsync (to host)");
    return CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
  // From pageable host memory: cudaMemcpyAsync returns once the data is staged.
  Status CopyToDevice(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream),
                      "cudaMemcpyAsync (to device)");
  }

  Status GatherU64(const uint64_t* values, const uint32_t* index, int64_t n, uint64_t* out,
                   cudaStream_t stream) {
    gpu::GatherU64Kernel<<<ThreadGrid(n, num_sms_), kBlockThreads, 0, stream>>>(values, index,
                                                                                 n, out);
    return CudaStatus(cudaGetLastError(), "GatherU64Kernel launch");
  }

  // The occupied slots (size_ of them) sorted by age, or by (score, age):
  // radix sorts are stable, so sorting by age and then by score orders by
  // (score, age).
  Status SortedSlots(bool by_score, cudaStream_t stream, Scratch* scratch, uint32_t** out) {
    const int n = static_cast<int>(size_);
    const uint64_t slots = storage_.t.num_slots();
    uint32_t *a = nullptr, *b = nullptr, *count = nullptr;
    uint64_t *key_a = nullptr, *key_b = nullptr;
    // `a` has room for every slot, so a size_ that disagreed with the tags
    // (a bug) is reported below rather than overrunning a buffer.
    DYNEMB_RETURN_IF_ERROR(scratch->Get(slots, &a));
    DYNEMB_RETURN_IF_ERROR(scratch->Get(std::max(n, 1), &b));
    DYNEMB_RETURN_IF_ERROR(scratch->Get(1, &count));
    DYNEMB_RETURN_IF_ERROR(scratch->Get(std::max(n, 1), &key_a));
    DYNEMB_RETURN_IF_ERROR(scratch->Get(std::max(n, 1), &key_b));
    *out = a;
    if (n == 0) return Status::Ok();
    thrust::counting_iterator<uint32_t> index(0);
    const gpu::IsOccupied occupied{storage_.t.tags};
    size_t select_bytes = 0, sort_bytes = 0;
    DYNEMB_CUDA_RETURN(cub::DeviceSelect::If(nullptr, select_bytes, index, a, count,
                                             static_cast<int64_t>(slots), occupied, stream),
                       "cub Select::If (size)");
    DYNEMB_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, key_a, key_b, a, b,
                                                       n, 0, 64, stream),
                       "cub SortPairs (size)");
    char* temp = nullptr;
    DYNEMB_RETURN_IF_ERROR(scratch->Get(std::max(select_bytes, sort_bytes), &temp));
    DYNEMB_CUDA_RETURN(cub::DeviceSelect::If(temp, select_bytes, index, a, count,
                                             static_cast<int64_t>(slots), occupied, stream),
                       "cub Select::If");
    // The buffers hold size_ slots: check that the table agrees (host sync).
    uint32_t selected = 0;
    DYNEMB_RETURN_IF_ERROR(CopyToHostOn(stream, &selected, count, sizeof(selected)));
    if (selected != static_cast<uint32_t>(n)) {
      return Status(StatusCode::kInternal, "GPU table: " + std::to_string(selected) +
                                               " occupied slots, but size is " +
                                               std::to_string(n));
    }
    // Ages are unique: sorting the occupied slots by age orders them oldest first.
    DYNEMB_RETURN_IF_ERROR(GatherU64(storage_.t.ages, a, n, key_a, stream));
    DYNEMB_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(temp, sort_bytes, key_a, key_b, a, b, n,
                                                       0, 64, stream),
                       "cub SortPairs (ages)");
    if (!by_score) {
      *out = b;
      return Status::Ok();
    }
    DYNEMB_RETURN_IF_ERROR(GatherU64(storage_.t.scores, b, n, key_a, stream));
    DYNEMB_CUDA_RETURN(cub::DeviceRadixSort::SortPairs(temp, sort_bytes, key_a, key_b, b, a, n,
                                                       0, 64, stream),
                       "cub SortPairs (scores)");
    *out = a;
    return Status::Ok();
  }

  // Writes all n = size_ entries into `out`: bounded tables oldest write
  // first (table.h: a restored table then breaks ties as this one would).
  Status GatherAll(int64_t n, const EntrySink<K>& out, Scratch* scratch) {
    if (n == 0) return Status::Ok();
    uint32_t* slots = nullptr;
    DYNEMB_RETURN_IF_ERROR(SortedSlots(/*by_score=*/false, stream_, scratch, &slots));
    gpu::GatherEntriesKernel<K><<<WarpGrid(n, num_sms_), kBlockThreads, 0, stream_>>>(
        storage_.t, slots, static_cast<uint64_t>(n), out);
    return CudaStatus(cudaGetLastError(), "GatherEntriesKernel launch");
  }

  const TableOptions options_;
  GpuAllocator* const allocator_;
  ScratchPool pool_;
  const size_t value_bytes_;
  const bool bounded_;
  int num_sms_ = 1;

  int device_ = 0;  // the CUDA device the table lives on

  mutable std::mutex mu_;    // serializes operations (gpu_table.h)
  cudaStream_t stream_ = nullptr;  // for operations without a Runner (NewGpuTable)
  const bool owns_stream_;
  cudaEvent_t done_ = nullptr;     // the last queued operation

  Storage<K> storage_;
  unsigned long long* batch_counters_ = nullptr;  // device BatchCounters
  unsigned long long* misses_ = nullptr;          // device: Find's misses, ever
  BatchCounters* host_counters_ = nullptr;        // pinned host copy

  // Exact once pending counts are folded (FoldPending).
  int64_t size_ = 0;  // keys stored
  int64_t used_ = 0;  // occupied + deleted slots
  bool pending_ = false;       // the device counters hold writes not yet folded
  uint64_t pending_rows_ = 0;  // rows of those writes: a bound on the keys they added
  TableCounters counters_;
  uint64_t lookups_ = 0;
  uint64_t clock_ = 0;
  uint64_t insert_batches_ = 0;
  uint64_t epoch_floor_ = 0;
  uint64_t rows_written_ = 0;  // the next batch's first age
};

}  // namespace

GpuTableOps* AsGpuTableOps(Table* table) { return dynamic_cast<GpuTableOps*>(table); }

std::unique_ptr<Table> NewGpuTable(const TableOptions& options, GpuAllocator* allocator,
                                   Status* status, cudaStream_t stream) {
  *status = options.Validate();
  if (!status->ok()) return nullptr;
  if (allocator == nullptr) allocator = CudaAllocator();
  std::unique_ptr<Table> table;
  switch (options.key_type) {
    case KeyType::kInt32: {
      auto t = std::make_unique<GpuTable<int32_t>>(options, allocator, stream);
      *status = t->Init();
      table = std::move(t);
      break;
    }
    case KeyType::kInt64: {
      auto t = std::make_unique<GpuTable<int64_t>>(options, allocator, stream);
      *status = t->Init();
      table = std::move(t);
      break;
    }
    case KeyType::kString:
      *status = InvalidArgument(
          "key_type string is not supported by GPU tables (int32 and int64 keys are); "
          "string-keyed tables stay on the CPU");
      return nullptr;
  }
  if (!status->ok()) return nullptr;
  return table;
}

}  // namespace dynemb
