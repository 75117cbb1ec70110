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

namespace dynemb {

// murmur3 fmix64: a bijection on 64 bits.
inline uint64_t StableMix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// int32 keys are widened first, so int32 key 5 and int64 key 5 route alike.
inline uint64_t StableKeyHash(int64_t key) { return StableMix64(static_cast<uint64_t>(key)); }
inline uint64_t StableKeyHash(int32_t key) { return StableKeyHash(static_cast<int64_t>(key)); }

// FNV-1a over the bytes, then the finaliser (FNV alone mixes its high bits
// poorly). Strings used as feature ids are short, so byte-at-a-time is fine.
inline uint64_t StableKeyHash(std::string_view key) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : key) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return StableMix64(h ^ static_cast<uint64_t>(key.size()));
}

// The shard of a key: the top 32 bits of its hash scaled to [0, num_shards)
// (Lemire's multiply-shift: no modulo bias worth speaking of, no division).
// Requires 1 <= num_shards <= 2^31 - 1.
template <typename K>
inline int32_t ShardOfKey(const K& key, int32_t num_shards) {
  const uint64_t top = StableKeyHash(key) >> 32;
  return static_cast<int32_t>((top * static_cast<uint64_t>(num_shards)) >> 32);
}

// Distributions a key-seeded row can be drawn from.
enum class KeyedDistribution : int { kUniform = 0, kNormal = 1, kTruncatedNormal = 2 };

// Box-Muller: sqrt(-2 log u1) * cos(2 pi u2), u1 in (0, 1], u2 in [0, 1).
inline double BoxMuller(double u1, double u2) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
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
// truncated_normal).
template <typename T>
void KeyedRandomRow(uint64_t seed, uint64_t key_hash, int64_t dim, KeyedDistribution dist,
                    double a, double b, T* row) {
  const uint64_t base = StableMix64(seed ^ StableMix64(key_hash + 0x9e3779b97f4a7c15ULL));
  // The j-th 53-bit uniform of this row's stream, in [0, 1).
  auto uniform = [base](uint64_t j) {
    const uint64_t bits = StableMix64(base + (j + 1) * 0xd1b54a32d192ed03ULL);
    return static_cast<double>(bits >> 11) * 0x1.0p-53;
  };
  // Box-Muller; attempt t of column col uses stream entries 2 * (col + t * dim)
  // and the one after, so columns never share draws. u1 = 1 - U is in (0, 1]:
  // its log is finite.
  auto normal = [&](int64_t col, uint64_t t) {
    const uint64_t j = 2 * (static_cast<uint64_t>(col) + t * static_cast<uint64_t>(dim));
    return BoxMuller(1.0 - uniform(j), uniform(j + 1));
  };
  if (dist == KeyedDistribution::kUniform) {
    for (int64_t col = 0; col < dim; ++col) {
      row[col] = static_cast<T>(a + (b - a) * uniform(static_cast<uint64_t>(col)));
      // Rounding to T can reach b itself; uniform draws stay below it, as TF's.
      if (b > a && !(row[col] < static_cast<T>(b))) {
        row[col] = std::nextafter(static_cast<T>(b), static_cast<T>(a));
      }
    }
    return;
  }
  constexpr int64_t kBlock = 64;
  for (int64_t begin = 0; begin < dim; begin += kBlock) {
    const int64_t count = std::min(kBlock, dim - begin);
    // First attempts of the block's columns, in a batch for float rows.
    double z[kBlock];
    if (std::is_same<T, float>::value) {
      double u1[kBlock], u2[kBlock];
      for (int64_t k = 0; k < count; ++k) {
        const uint64_t j = 2 * static_cast<uint64_t>(begin + k);
        u1[k] = 1.0 - uniform(j);
        u2[k] = uniform(j + 1);
      }
      BoxMullerBatch(u1, u2, count, z);
    } else {
      for (int64_t k = 0; k < count; ++k) z[k] = normal(begin + k, 0);
    }
    for (int64_t k = 0; k < count; ++k) {
      double draw = z[k];
      // Truncated: redraw (later attempts, rare: ~4.6%) until within 2 stddevs.
      for (uint64_t t = 1; dist == KeyedDistribution::kTruncatedNormal && std::fabs(draw) > 2.0;
           ++t) {
        draw = normal(begin + k, t);
      }
      row[begin + k] = static_cast<T>(a + b * draw);
    }
  }
}

}  // namespace dynemb

#endif  // DYNEMB_CORE_PARTITION_H_
