// Key -> shard routing and key-seeded random rows, shared by every machine.
//
// Unlike hash.h (which only has to be good inside one process), these
// functions are part of the package's contract: `de.default_partition_fn`
// must send a key to the same shard on every machine, in every process and
// with every TF build, and a deterministic initializer must give a key the
// same initial row wherever it is looked up (to the last bit, but for the
// libmvec caveat at BoxMullerBatch below). So:
//   - they are written out here byte by byte (no std::hash, no memcpy of
//     multi-byte words, whose result depends on endianness), and
//   - they must never change: changing them re-routes every key of every
//     saved model. Tests pin known values.
// The partition hash is murmur3's 64-bit finaliser, deliberately a different
// mixer from the table's splitmix (hash.h): if both were the same, every key
// of shard i would share the hash bits the table uses for its own shards and
// slots, and each shard's table would fill only a fraction of its slots.

#ifndef DYNEMB_CORE_PARTITION_H_
#define DYNEMB_CORE_PARTITION_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <string_view>

#include "cc/core/host_device.h"

namespace dynemb {

// murmur3 fmix64: a bijection on 64 bits.
DYNEMB_HOST_DEVICE inline uint64_t StableMix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// int32 keys are widened first, so int32 key 5 and int64 key 5 route alike.
DYNEMB_HOST_DEVICE inline uint64_t StableKeyHash(int64_t key) {
  return StableMix64(static_cast<uint64_t>(key));
}
DYNEMB_HOST_DEVICE inline uint64_t StableKeyHash(int32_t key) {
  return StableKeyHash(static_cast<int64_t>(key));
}

// FNV-1a over the bytes, then the finaliser (FNV alone mixes its high bits
// poorly). Strings used as feature ids are short, so byte-at-a-time is fine.
// Host only: string keys never reach the device.
inline uint64_t StableKeyHash(std::string_view key) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : key) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return StableMix64(h ^ static_cast<uint64_t>(key.size()));
}

// The shard of a key hash: its top 32 bits scaled to [0, num_shards)
// (Lemire's multiply-shift: no modulo bias worth speaking of, no division).
// Requires 1 <= num_shards <= 2^31 - 1.
DYNEMB_HOST_DEVICE inline int32_t ShardOfHash(uint64_t hash, int32_t num_shards) {
  const uint64_t top = hash >> 32;
  return static_cast<int32_t>((top * static_cast<uint64_t>(num_shards)) >> 32);
}

// The shard of a key (int32, int64 on host and device; std::string_view on
// the host).
template <typename K>
DYNEMB_HOST_DEVICE inline int32_t ShardOfKey(const K& key, int32_t num_shards) {
  return ShardOfHash(StableKeyHash(key), num_shards);
}

// Distributions a key-seeded row can be drawn from.
enum class KeyedDistribution : int { kUniform = 0, kNormal = 1, kTruncatedNormal = 2 };

// x + y * z with the product and the sum each rounded (never one fused
// multiply-add): the host code is never built with FMA contraction, but nvcc
// contracts by default, and a fused result differs in the last bit.
DYNEMB_HOST_DEVICE inline double AddProductRounded(double x, double y, double z) {
#ifdef __CUDA_ARCH__
  return __dadd_rn(x, __dmul_rn(y, z));
#else
  return x + y * z;
#endif
}

// std::nextafter, callable from device code (CUDA's ::nextafter(f) there).
DYNEMB_HOST_DEVICE inline float NextAfter(float from, float to) {
#ifdef __CUDA_ARCH__
  return ::nextafterf(from, to);
#else
  return std::nextafter(from, to);
#endif
}
DYNEMB_HOST_DEVICE inline double NextAfter(double from, double to) {
#ifdef __CUDA_ARCH__
  return ::nextafter(from, to);
#else
  return std::nextafter(from, to);
#endif
}

// The per-element pieces of a key-seeded row (KeyedRandomRow below), shared
// with the GPU kernels (cc/core/gpu/keyed_gpu.cu): a row is a counter-based
// stream, so every column can be computed on its own.

// The start of a key's stream: depends only on (seed, key hash).
DYNEMB_HOST_DEVICE inline uint64_t KeyedStreamBase(uint64_t seed, uint64_t key_hash) {
  return StableMix64(seed ^ StableMix64(key_hash + 0x9e3779b97f4a7c15ULL));
}

// The j-th 53-bit uniform of the stream starting at `base`, in [0, 1) (exact:
// no rounding anywhere).
DYNEMB_HOST_DEVICE inline double KeyedUniform(uint64_t base, uint64_t j) {
  const uint64_t bits = StableMix64(base + (j + 1) * 0xd1b54a32d192ed03ULL);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

// Box-Muller: sqrt(-2 log u1) * cos(2 pi u2), u1 in (0, 1], u2 in [0, 1).
// (On the device log and cos are CUDA's: within an ulp or two of glibc's.)
DYNEMB_HOST_DEVICE inline double BoxMuller(double u1, double u2) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

// The stream entries of attempt t of column col of a row of `dim` columns:
// 2 * (col + t * dim) and the one after, so columns never share draws.
DYNEMB_HOST_DEVICE inline uint64_t KeyedNormalEntry(int64_t dim, int64_t col, uint64_t t) {
  return 2 * (static_cast<uint64_t>(col) + t * static_cast<uint64_t>(dim));
}

// Box-Muller's inputs for stream entry j (KeyedNormalEntry): u1 = 1 - U is in
// (0, 1], so its log is finite.
DYNEMB_HOST_DEVICE inline double KeyedNormalU1(uint64_t base, uint64_t j) {
  return 1.0 - KeyedUniform(base, j);
}
DYNEMB_HOST_DEVICE inline double KeyedNormalU2(uint64_t base, uint64_t j) {
  return KeyedUniform(base, j + 1);
}

// Attempt t of column col's standard normal draw (scalar log and cos).
DYNEMB_HOST_DEVICE inline double KeyedNormalDraw(uint64_t base, int64_t dim, int64_t col,
                                                 uint64_t t) {
  const uint64_t j = KeyedNormalEntry(dim, col, t);
  return BoxMuller(KeyedNormalU1(base, j), KeyedNormalU2(base, j));
}

// Truncated normal: given column col's first draw, redraws (later attempts,
// rare: ~4.6%) until within 2 stddevs, as TF's truncated_normal.
DYNEMB_HOST_DEVICE inline double KeyedTruncatedDraw(uint64_t base, int64_t dim, int64_t col,
                                                    double first_draw) {
  double draw = first_draw;
  for (uint64_t t = 1; std::fabs(draw) > 2.0; ++t) draw = KeyedNormalDraw(base, dim, col, t);
  return draw;
}

// A uniform column: a + (b - a) * u in T, always < b when b > a (rounding to
// T can reach b itself; uniform draws stay below it, as TF's).
template <typename T>
DYNEMB_HOST_DEVICE inline T KeyedUniformValue(double a, double b, double u) {
  T value = static_cast<T>(AddProductRounded(a, b - a, u));
  if (b > a && !(value < static_cast<T>(b))) value = NextAfter(static_cast<T>(b), static_cast<T>(a));
  return value;
}

// A normal column: mean a, stddev b, from a standard draw.
template <typename T>
DYNEMB_HOST_DEVICE inline T KeyedNormalValue(double a, double b, double draw) {
  return static_cast<T>(AddProductRounded(a, b, draw));
}

// Column col of the row of the stream at `base` with scalar log and cos: what
// KeyedRandomRow<double> computes, and KeyedRandomRow<float> but for its batch
// of first normal draws (BoxMullerBatch).
template <typename T>
DYNEMB_HOST_DEVICE inline T KeyedRandomValue(uint64_t base, int64_t dim, int64_t col,
                                             KeyedDistribution dist, double a, double b) {
  if (dist == KeyedDistribution::kUniform) {
    return KeyedUniformValue<T>(a, b, KeyedUniform(base, static_cast<uint64_t>(col)));
  }
  double draw = KeyedNormalDraw(base, dim, col, 0);
  if (dist == KeyedDistribution::kTruncatedNormal) draw = KeyedTruncatedDraw(base, dim, col, draw);
  return KeyedNormalValue<T>(a, b, draw);
}

// z[i] = BoxMuller(u1[i], u2[i]) for i < n, with glibc's vector log and cos
// (libmvec, 4 doubles per AVX2 instruction; a float32 row of 16 draws ~4.6x
// faster) where the CPU and the C library have them, else BoxMuller. The two
// agree to a few double ulps (max relative difference 8e-16 in 4M draws), so
// only float32 rows use it (KeyedRandomRow): of 32M float32 draws, one came
// out 1 float ulp apart (a value near 0, -7.354865e-07, where cos has lost
// relative precision). So a key's float32 initial row is the same on every
// machine except, about once in 30M values, in its last bit between a machine
// with libmvec + AVX2 and one without; float64 rows stay libm's exactly.
void BoxMullerBatch(const double* u1, const double* u2, int64_t n, double* z);

// Fills row[0..dim) with draws that depend only on (seed, key hash, column):
// a counter-based generator, so any process computes the same row for a key.
// kUniform: a + (b - a) * U[0, 1), always < b. kNormal: mean a, stddev b.
// kTruncatedNormal: mean a, stddev b, redrawn until within 2 stddevs (as TF's
// truncated_normal). Host only; the GPU draws the same columns
// (KeyedRandomValue; cc/core/gpu/keyed_gpu.h).
template <typename T>
void KeyedRandomRow(uint64_t seed, uint64_t key_hash, int64_t dim, KeyedDistribution dist,
                    double a, double b, T* row) {
  const uint64_t base = KeyedStreamBase(seed, key_hash);
  if (dist == KeyedDistribution::kUniform || !std::is_same<T, float>::value) {
    for (int64_t col = 0; col < dim; ++col) row[col] = KeyedRandomValue<T>(base, dim, col, dist, a, b);
    return;
  }
  // float32 normal rows: the first attempts of a block of columns in a batch.
  constexpr int64_t kBlock = 64;
  for (int64_t begin = 0; begin < dim; begin += kBlock) {
    const int64_t count = std::min(kBlock, dim - begin);
    double u1[kBlock], u2[kBlock], z[kBlock];
    for (int64_t k = 0; k < count; ++k) {
      const uint64_t j = KeyedNormalEntry(dim, begin + k, 0);
      u1[k] = KeyedNormalU1(base, j);
      u2[k] = KeyedNormalU2(base, j);
    }
    BoxMullerBatch(u1, u2, count, z);
    for (int64_t k = 0; k < count; ++k) {
      double draw = z[k];
      if (dist == KeyedDistribution::kTruncatedNormal) {
        draw = KeyedTruncatedDraw(base, dim, begin + k, draw);
      }
      row[begin + k] = KeyedNormalValue<T>(a, b, draw);
    }
  }
}

}  // namespace dynemb

#endif  // DYNEMB_CORE_PARTITION_H_
