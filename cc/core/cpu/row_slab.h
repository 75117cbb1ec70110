// RowSlab: one shard's value rows, allocated in chunks so that no key costs an
// allocation and rows never move (growing the slot array moves only slots).
//
// Chunk k holds 16 << k rows up to 1024 rows per chunk, so a shard with few
// keys stays small (a table of a thousand keys spread over 256 shards does
// not reserve 256 big chunks) while a large shard wastes < 1024 rows. The
// small chunks are the slab's own allocations; the 1024-row ones come from the
// table's ChunkArena (huge pages), which owns and frees them.
// Not thread-safe: the owning shard's lock protects it.

#ifndef DYNEMB_CORE_CPU_ROW_SLAB_H_
#define DYNEMB_CORE_CPU_ROW_SLAB_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include "cc/core/cpu/huge_pages.h"

namespace dynemb {

class RowSlab {
 public:
  // Row indices are uint32; this one is never handed out (it marks empty slots).
  static constexpr uint32_t kInvalidRow = 0xffffffffu;

  // `arena` supplies the big chunks and must outlive the slab's rows.
  void Init(size_t stride, ChunkArena* arena) {
    stride_ = stride;
    arena_ = arena;
  }
  size_t stride() const { return stride_; }

  char* Row(uint32_t index) const {
    uint32_t chunk, offset;
    Locate(index, &chunk, &offset);
    return chunks_[chunk] + static_cast<size_t>(offset) * stride_;
  }

  // Whether `index` is a row of the slab (allocated at some point since the
  // last Reset; it may be free now).
  bool Contains(uint32_t index) const { return index < high_water_; }

  // Calls fn(row) for every row index handed out since the last Reset, live
  // or free, in index order: chunk by chunk, so the scan reads memory
  // sequentially (change tracking scans rows this way instead of probing).
  template <typename Fn>
  void ForEachRow(Fn&& fn) const {
    uint32_t index = 0;
    for (size_t k = 0; k < chunks_.size() && index < high_water_; ++k) {
      const uint32_t n = std::min<uint32_t>(static_cast<uint32_t>(ChunkRows(k)), high_water_ - index);
      const char* row = chunks_[k];
      for (uint32_t j = 0; j < n; ++j, row += stride_) fn(row);
      index += n;
    }
  }

  // Hands out a free row (recycled first). Returns false when the shard has
  // used every row index.
  bool Allocate(uint32_t* index) {
    if (!free_.empty()) {
      *index = free_.back();
      free_.pop_back();
      return true;
    }
    if (high_water_ == kInvalidRow) return false;
    uint32_t chunk, offset;
    Locate(high_water_, &chunk, &offset);
    if (chunk == chunks_.size()) AddChunk(chunk);
    *index = high_water_++;
    return true;
  }

  // Never throws: without memory for the free list the row is not recycled
  // (a row's bytes lost beats a shard left half-updated by an exception).
  void Free(uint32_t index) noexcept {
    try {
      free_.push_back(index);
    } catch (const std::bad_alloc&) {
    }
  }

  // Releases every row (the caller has destroyed non-trivial keys). The big
  // chunks stay mapped until the caller releases the arena.
  void Reset() {
    chunks_.clear();
    chunks_.shrink_to_fit();
    small_chunks_.clear();
    small_chunks_.shrink_to_fit();
    free_.clear();
    free_.shrink_to_fit();
    high_water_ = 0;
  }

  int64_t MemoryBytes() const {
    int64_t bytes = static_cast<int64_t>(free_.capacity() * sizeof(uint32_t) +
                                         chunks_.capacity() * sizeof(chunks_[0]) +
                                         small_chunks_.capacity() * sizeof(small_chunks_[0]));
    for (size_t k = 0; k < chunks_.size(); ++k) bytes += ChunkRows(k) * stride_;
    return bytes;
  }

 private:
  static constexpr uint32_t kFirstChunkRows = 16;
  static constexpr uint32_t kGrowingChunks = 6;  // 16, 32, ..., 512 rows
  static constexpr uint32_t kBigChunkRows = 1024;
  static constexpr uint32_t kRowsBeforeBigChunks = kFirstChunkRows * ((1u << kGrowingChunks) - 1);

  static size_t ChunkRows(size_t chunk) {
    return chunk < kGrowingChunks ? (kFirstChunkRows << chunk) : kBigChunkRows;
  }

  void AddChunk(size_t chunk) {
    const size_t bytes = ChunkRows(chunk) * stride_;
    ReserveForMore(&chunks_, 1);
    if (chunk < kGrowingChunks) {
      ReserveForMore(&small_chunks_, 1);
      small_chunks_.emplace_back(new char[bytes]);  // cannot throw after new[]: room reserved
      chunks_.push_back(small_chunks_.back().get());
    } else {
      chunks_.push_back(arena_->Allocate(bytes));
    }
  }

  static void Locate(uint32_t index, uint32_t* chunk, uint32_t* offset) {
    if (index < kRowsBeforeBigChunks) {
      // Chunk k covers [16 * (2^k - 1), 16 * (2^(k+1) - 1)).
      uint32_t k = 31 - __builtin_clz((index >> 4) + 1);
      *chunk = k;
      *offset = index - kFirstChunkRows * ((1u << k) - 1);
    } else {
      uint32_t rest = index - kRowsBeforeBigChunks;
      *chunk = kGrowingChunks + rest / kBigChunkRows;
      *offset = rest % kBigChunkRows;
    }
  }

  size_t stride_ = 0;
  ChunkArena* arena_ = nullptr;
  std::vector<char*> chunks_;  // every chunk, in row order
  std::vector<std::unique_ptr<char[]>> small_chunks_;  // the first kGrowingChunks, owned here
  std::vector<uint32_t> free_;
  uint32_t high_water_ = 0;
};

}  // namespace dynemb

#endif  // DYNEMB_CORE_CPU_ROW_SLAB_H_
