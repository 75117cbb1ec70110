// Per-step helpers of the training path: deduplicating a batch of ids and
// summing gradient rows per distinct id. TF has both (Unique,
// UnsortedSegmentSum) but they took ~15% of a training step (docs/benchmarks.md,
// "Step helpers"); these do the same work with the table's hash and plain loops.
// Results are exactly TF's: first-occurrence order, sums in row order.

#ifndef DYNEMB_CORE_DEDUP_H_
#define DYNEMB_CORE_DEDUP_H_

#include <cstdint>
#include <cstring>

#include "cc/core/hash.h"

namespace dynemb {

// The int32 slots DedupKeys needs for n keys: a power of two, at least 2n,
// so probes stay short.
inline int64_t DedupSlots(int64_t n) {
  uint64_t size = 16;
  while (size < 2 * static_cast<uint64_t>(n)) size <<= 1;
  return static_cast<int64_t>(size);
}

// Writes the distinct keys of keys[0, n) to unique[0, m) in order of first
// occurrence and index[i] = position of keys[i] in unique; returns m.
// `unique` has room for n keys; `slots` is the caller's scratch of
// DedupSlots(n) int32 (the caller allocates it, so that a batch too large for
// memory is the allocator's error, not a std::bad_alloc leaving an op). Open
// addressing over the slots (positions in `unique`, -1: empty); the keys
// themselves are compared in `unique`. O(n), one thread: the batch is small
// (~100k ids) and its order is sequential by definition. Key i's hash is
// taken, and its first slot prefetched, kDedupAhead keys before it is placed:
// a training step's 106k ids probe a 1 MiB array at random, and the placing
// loop would otherwise wait on each probe's cache miss in turn.
constexpr int64_t kDedupAhead = 16;

template <typename K, typename Index>
int64_t DedupKeys(const K* keys, int64_t n, K* unique, Index* index, int32_t* slots) {
  const uint64_t size = static_cast<uint64_t>(DedupSlots(n));
  const uint64_t mask = size - 1;
  std::memset(slots, 0xff, size * sizeof(int32_t));  // every slot -1
  // hashes[i % kDedupAhead]: key i's hash, from when it was prefetched.
  uint64_t hashes[kDedupAhead];
  const int64_t ahead = n < kDedupAhead ? n : kDedupAhead;
  for (int64_t i = 0; i < ahead; ++i) {
    hashes[i] = HashKey(keys[i]);
    __builtin_prefetch(&slots[hashes[i] & mask]);
  }
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const K key = keys[i];
    uint64_t pos = hashes[i % kDedupAhead] & mask;
    const int64_t next = i + kDedupAhead;
    if (next < n) {
      const uint64_t h = HashKey(keys[next]);
      hashes[next % kDedupAhead] = h;  // key i's entry, read above
      __builtin_prefetch(&slots[h & mask]);
    }
    while (true) {
      const int32_t at = slots[pos];
      if (at < 0) {
        slots[pos] = static_cast<int32_t>(m);
        unique[m] = key;
        index[i] = static_cast<Index>(m++);
        break;
      }
      if (unique[at] == key) {
        index[i] = static_cast<Index>(at);
        break;
      }
      pos = (pos + 1) & mask;
    }
  }
  return m;
}

// First index i in [0, n) with segment[i] outside [0, num_segments), or -1.
template <typename Index>
int64_t FirstSegmentOutOfRange(const Index* segment, int64_t n, int64_t num_segments) {
  for (int64_t i = 0; i < n; ++i) {
    if (segment[i] < 0 || static_cast<int64_t>(segment[i]) >= num_segments) return i;
  }
  return -1;
}

// For the segments in [first, last): sums[s] = sum of the rows i (of `width`
// values) with segment[i] == s, added in increasing i (so the rounding is
// TF's UnsortedSegmentSum's), and counts[s] = how many there were. Segments
// must be in range (FirstSegmentOutOfRange). Callers split [0, num_segments)
// into disjoint ranges to run them on several threads: each range reads every
// segment id but writes only its own rows.
template <typename T, typename Index>
void SumSegments(const T* rows, const Index* segment, int64_t n, int64_t width, int64_t first,
                 int64_t last, T* sums, Index* counts) {
  std::memset(sums + first * width, 0, sizeof(T) * (last - first) * width);
  std::memset(counts + first, 0, sizeof(Index) * (last - first));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = segment[i];
    if (s < first || s >= last) continue;
    T* __restrict out = sums + s * width;
    const T* __restrict in = rows + i * width;
    for (int64_t j = 0; j < width; ++j) out[j] += in[j];
    ++counts[s];
  }
}

}  // namespace dynemb

#endif  // DYNEMB_CORE_DEDUP_H_
