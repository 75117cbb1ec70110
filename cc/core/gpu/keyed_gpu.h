// Key partitioning and key-seeded random rows on the GPU: the device versions
// of ShardOfKey and KeyedRandomRow (cc/core/partition.h), so that a GPU op
// routes keys and draws initial rows without copying ids to the host. Both
// compute each element with partition.h's own DYNEMB_HOST_DEVICE functions.
//
// What equals the CPU (cc/core/partition.h), bit for bit: shard ids, and
// uniform rows (float32 and float64). Normal and truncated-normal rows use
// CUDA's double log and cos instead of glibc's (and libmvec's for float32
// rows on the CPU), which differ by an ulp or so: float64 values agree to a
// few ulps, float32 values almost always exactly, else by one ulp
// (tests/test_core_gpu_keyed.py measures it; docs/gpu.md). A truncated-normal
// column whose first draw lands within an ulp of +-2 stddevs could, in
// principle, be redrawn on one side and not the other.
//
// Host-includable (no CUDA device code): the kernels are in keyed_gpu.cu.

#ifndef DYNEMB_CORE_GPU_KEYED_GPU_H_
#define DYNEMB_CORE_GPU_KEYED_GPU_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cc/core/partition.h"
#include "cc/core/table.h"

namespace dynemb {

// What a key's row depends on besides the key (DynembKeyedRandom's attrs).
struct KeyedRandomSpec {
  uint64_t seed = 0;
  KeyedDistribution dist = KeyedDistribution::kNormal;
  double a = 0, b = 1;  // uniform [a, b); normal/truncated: mean a, stddev b
  int64_t dim = 1;
};

// shard_ids[i] = ShardOfKey(keys[i], num_shards) for i < n, on `stream`
// (asynchronous). K: int32_t, int64_t. All pointers are device memory.
// Errors (InvalidArgument): n < 0, num_shards < 1, a null pointer with n > 0;
// a failed kernel launch (Internal).
template <typename K>
Status PartitionKeysGpu(const K* keys, int64_t n, int32_t num_shards, int32_t* shard_ids,
                        cudaStream_t stream);

// rows[i*dim .. +dim) = the key-seeded row of keys[i] (as KeyedRandomRow draws
// it), for every i < n when `exists` is null, else only where exists[i] is
// false (other rows untouched). Asynchronous. K: int32_t, int64_t; T: float,
// double. All pointers are device memory.
// Errors (InvalidArgument): n < 0, spec.dim < 1, n * dim past int64, an
// unknown spec.dist, a null keys or rows with n > 0; a failed kernel launch
// (Internal).
template <typename K, typename T>
Status KeyedRandomRowsGpu(const K* keys, int64_t n, const KeyedRandomSpec& spec,
                          const bool* exists, T* rows, cudaStream_t stream);

}  // namespace dynemb

#endif  // DYNEMB_CORE_GPU_KEYED_GPU_H_
