// PartitionKeysGpu and KeyedRandomRowsGpu (keyed_gpu.h): ShardOfKey and
// KeyedRandomRow of cc/core/partition.h on the device.
//
// Design
//   Partition: one thread per key, grid-stride. A key's shard is a few
//   integer operations on the key alone.
//   Random rows: one thread per (key, column) element, grid-stride over the
//   n * dim elements of the output in memory order. partition.h's generator
//   is counter-based: column col of a key's row depends only on (seed, key
//   hash, col) -- its first attempt uses stream entries 2 * col and
//   2 * col + 1, attempt t entries 2 * (col + t * dim) and the one after --
//   so no column waits for another, and the only per-key work, the stream's
//   start (three 64-bit mixes), is cheap enough to redo per element. Flat
//   elements give consecutive threads consecutive addresses whatever dim is
//   (a warp per key would leave most lanes idle for the usual dim of 8-64,
//   and a thread per key would write rows with a stride of dim), and
//   distribution branches are uniform across the grid. The truncated
//   normal's redraws (~4.6% of columns, rarely more than one) are the only
//   divergence. Rows whose key exists are skipped element by element (the
//   flag is one byte per key, read by the row's threads from the same line).
//   Each element is partition.h's own DYNEMB_HOST_DEVICE function
//   (ShardOfKey, KeyedRandomValue), so the rule exists once. Their device
//   arithmetic is explicitly rounded where a product meets a sum
//   (AddProductRounded), so nvcc's FMA contraction cannot change a bit of a
//   uniform row, with or without -fmad=false.

#include "cc/core/gpu/keyed_gpu.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "cc/core/gpu/gpu_table.h"  // CudaStatus

namespace dynemb {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill any current GPU several times over; larger batches
// are covered by the grid-stride loops.
constexpr uint64_t kMaxBlocks = 8192;

int Blocks(uint64_t items) {
  return static_cast<int>(
      std::max<uint64_t>(1, std::min<uint64_t>((items + kThreads - 1) / kThreads, kMaxBlocks)));
}

template <typename K>
__global__ void __launch_bounds__(kThreads)
    PartitionKernel(const K* keys, uint64_t n, int32_t num_shards, int32_t* shard_ids) {
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    shard_ids[i] = ShardOfKey(keys[i], num_shards);
  }
}

template <typename K, typename T>
__global__ void __launch_bounds__(kThreads)
    KeyedRandomKernel(const K* keys, uint64_t n, uint64_t dim, uint64_t seed,
                      KeyedDistribution dist, double a, double b, const bool* exists, T* rows) {
  const uint64_t total = n * dim;
  for (uint64_t e = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; e < total;
       e += uint64_t{gridDim.x} * blockDim.x) {
    const uint64_t i = e / dim;
    if (exists != nullptr && exists[i]) continue;
    const uint64_t base = KeyedStreamBase(seed, StableKeyHash(keys[i]));
    rows[e] = KeyedRandomValue<T>(base, static_cast<int64_t>(dim), static_cast<int64_t>(e - i * dim),
                                  dist, a, b);
  }
}

Status Invalid(const char* fn, const std::string& what) {
  return InvalidArgument(std::string(fn) + ": " + what);
}

}  // namespace

template <typename K>
Status PartitionKeysGpu(const K* keys, int64_t n, int32_t num_shards, int32_t* shard_ids,
                        cudaStream_t stream) {
  constexpr const char* kFn = "PartitionKeysGpu";
  if (n < 0) return Invalid(kFn, "n must be >= 0, got " + std::to_string(n));
  if (num_shards < 1) {
    return Invalid(kFn, "num_shards must be >= 1, got " + std::to_string(num_shards));
  }
  if (n == 0) return Status::Ok();
  if (keys == nullptr) return Invalid(kFn, "keys must be a device pointer, got null (n > 0)");
  if (shard_ids == nullptr) {
    return Invalid(kFn, "shard_ids must be a device pointer, got null (n > 0)");
  }
  const uint64_t items = static_cast<uint64_t>(n);
  PartitionKernel<K><<<Blocks(items), kThreads, 0, stream>>>(keys, items, num_shards, shard_ids);
  return CudaStatus(cudaGetLastError(), "PartitionKeysGpu: kernel launch");
}

template <typename K, typename T>
Status KeyedRandomRowsGpu(const K* keys, int64_t n, const KeyedRandomSpec& spec,
                          const bool* exists, T* rows, cudaStream_t stream) {
  constexpr const char* kFn = "KeyedRandomRowsGpu";
  if (n < 0) return Invalid(kFn, "n must be >= 0, got " + std::to_string(n));
  if (spec.dim < 1) return Invalid(kFn, "dim must be >= 1, got " + std::to_string(spec.dim));
  const int dist = static_cast<int>(spec.dist);
  if (dist < static_cast<int>(KeyedDistribution::kUniform) ||
      dist > static_cast<int>(KeyedDistribution::kTruncatedNormal)) {
    return Invalid(kFn, "dist must be kUniform (0), kNormal (1) or kTruncatedNormal (2), got " +
                            std::to_string(dist));
  }
  if (n > std::numeric_limits<int64_t>::max() / spec.dim) {
    return Invalid(kFn, "n * dim must fit in int64, got n = " + std::to_string(n) +
                            ", dim = " + std::to_string(spec.dim));
  }
  if (n == 0) return Status::Ok();
  if (keys == nullptr) return Invalid(kFn, "keys must be a device pointer, got null (n > 0)");
  if (rows == nullptr) return Invalid(kFn, "rows must be a device pointer, got null (n > 0)");
  const uint64_t items = static_cast<uint64_t>(n);
  const uint64_t dim = static_cast<uint64_t>(spec.dim);
  KeyedRandomKernel<K, T><<<Blocks(items * dim), kThreads, 0, stream>>>(
      keys, items, dim, spec.seed, spec.dist, spec.a, spec.b, exists, rows);
  return CudaStatus(cudaGetLastError(), "KeyedRandomRowsGpu: kernel launch");
}

template Status PartitionKeysGpu<int32_t>(const int32_t*, int64_t, int32_t, int32_t*, cudaStream_t);
template Status PartitionKeysGpu<int64_t>(const int64_t*, int64_t, int32_t, int32_t*, cudaStream_t);
template Status KeyedRandomRowsGpu<int32_t, float>(const int32_t*, int64_t, const KeyedRandomSpec&,
                                                   const bool*, float*, cudaStream_t);
template Status KeyedRandomRowsGpu<int32_t, double>(const int32_t*, int64_t, const KeyedRandomSpec&,
                                                    const bool*, double*, cudaStream_t);
template Status KeyedRandomRowsGpu<int64_t, float>(const int64_t*, int64_t, const KeyedRandomSpec&,
                                                   const bool*, float*, cudaStream_t);
template Status KeyedRandomRowsGpu<int64_t, double>(const int64_t*, int64_t, const KeyedRandomSpec&,
                                                    const bool*, double*, cudaStream_t);

}  // namespace dynemb
