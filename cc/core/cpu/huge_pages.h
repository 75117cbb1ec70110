// Huge-page memory for a table's big arrays: the row chunks (ChunkArena) and
// the slot arrays (SlotArrayPool) of a large table live in 2 MiB-aligned
// mappings that the kernel is asked to back with transparent huge pages.
//
// Why. A lookup in a big table reads a slot and then a row at random places;
// with 4 KiB pages each of those reads also misses the TLB, and on a virtual
// machine a page walk is two-dimensional (guest and host page tables). 2 MiB
// pages cover a 10M-key table's 480 MiB of dim-8 rows and 128 MiB of slots
// with ~300 TLB entries, and fresh memory takes 512x fewer page faults.
// Measured: docs/benchmarks.md, change 8.
//
// Small tables keep ordinary allocations (RowSlab's first chunks, slot arrays
// under kMinPooledSlotBytes), so a table of a few thousand keys never makes a
// 2 MiB page resident for a few rows.
//
// DYNEMB_HUGE_PAGES=0 in the environment keeps the mappings on 4 KiB pages
// (for hosts where huge-page faults stall on memory compaction, or where a
// fresh 2 MiB page costs more than its TLB reach repays: a VM whose balloon
// reports free 2 MiB blocks to the host gets each new huge page back from the
// host at 4-5 ms, and there a growing table's training step ran 3-13% slower
// with huge pages; docs/benchmarks.md "Fresh memory on this VM"). Advice
// only: a kernel with transparent huge pages off does the same.

#ifndef DYNEMB_CORE_CPU_HUGE_PAGES_H_
#define DYNEMB_CORE_CPU_HUGE_PAGES_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace dynemb {

constexpr size_t kHugePageBytes = size_t{2} << 20;

// Makes room for `extra` more elements in `v` before memory is allocated for
// them, so that the push_backs after the allocation cannot throw (and leak
// it). Grows geometrically, as push_back would: reserve(size() + extra) alone
// reallocates on every call.
template <typename T>
void ReserveForMore(std::vector<T>* v, size_t extra) {
  if (v->size() + extra > v->capacity()) {
    v->reserve(std::max(2 * v->capacity(), v->size() + extra));
  }
}

// `bytes` (a multiple of kHugePageBytes) of zeroed memory starting on a 2 MiB
// boundary, advised for huge pages. Throws std::bad_alloc when the system has
// no memory left (as new[] does).
char* MapHugePages(size_t bytes);
void UnmapHugePages(char* base, size_t bytes);

// The big row chunks of one table, carved from 32 MiB blocks. Chunks are never
// returned one by one (rows are recycled through each shard's free list);
// Release unmaps every block at once (Clear and destruction, when no shard
// holds a chunk any more). Thread-safe: shards allocate chunks under their own
// locks, concurrently.
class ChunkArena {
 public:
  // Blocks are mapped, not touched: only the 2 MiB pages chunks are written
  // to become resident, so a block's unused tail costs address space only.
  static constexpr size_t kBlockBytes = size_t{32} << 20;

  ChunkArena() = default;
  ChunkArena(const ChunkArena&) = delete;
  ChunkArena& operator=(const ChunkArena&) = delete;
  ~ChunkArena() { Release(); }

  // `bytes` of memory aligned to 64 bytes, valid until Release. A chunk larger
  // than a block (very wide rows) gets a block of its own.
  char* Allocate(size_t bytes);

  // Unmaps every block. The caller guarantees no chunk is in use.
  void Release();

 private:
  struct Block {
    char* base;
    size_t bytes;
  };

  std::mutex mu_;
  std::vector<Block> blocks_;
  char* next_ = nullptr;  // the unused tail of the newest block
  size_t left_ = 0;
};

// The slot arrays of one table's shards. Arrays are powers of two and a
// shard's array is replaced by one twice its size when it grows, so at any
// time most shards hold arrays of one or two sizes:
//   - under kMinPooledSlotBytes: new[] (small tables);
//   - up to kHugePageBytes: several arrays of one size share a 2 MiB block,
//     which is unmapped when its last array is freed (after a wave of shard
//     growth every block of the old size empties);
//   - larger: a mapping of their own.
// Thread-safe: shards grow under their own locks, concurrently.
class SlotArrayPool {
 public:
  static constexpr size_t kMinPooledSlotBytes = size_t{64} << 10;

  SlotArrayPool() = default;
  SlotArrayPool(const SlotArrayPool&) = delete;
  SlotArrayPool& operator=(const SlotArrayPool&) = delete;
  ~SlotArrayPool();

  // An uninitialised array of `n` slots (n a power of two).
  uint64_t* Allocate(uint64_t n);
  // Gives back an array Allocate(n) returned.
  void Free(uint64_t* slots, uint64_t n);

 private:
  std::mutex mu_;
  // Free arrays inside partly used 2 MiB blocks, by array size in bytes.
  std::unordered_map<size_t, std::vector<char*>> free_;
  // Arrays in use per shared 2 MiB block, by the block's address.
  std::unordered_map<uintptr_t, int> in_use_;
};

// A shard's slot array: frees itself into the pool it came from.
struct SlotArrayDeleter {
  SlotArrayPool* pool = nullptr;
  uint64_t n = 0;
  void operator()(uint64_t* slots) const { pool->Free(slots, n); }
};

}  // namespace dynemb

#endif  // DYNEMB_CORE_CPU_HUGE_PAGES_H_
