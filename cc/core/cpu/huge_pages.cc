#include "cc/core/cpu/huge_pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

namespace dynemb {
namespace {

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Read once: whether mappings are advised for transparent huge pages.
bool HugePagesWanted() {
  static const bool wanted = [] {
    const char* env = std::getenv("DYNEMB_HUGE_PAGES");
    return env == nullptr || std::strcmp(env, "0") != 0;
  }();
  return wanted;
}

}  // namespace

char* MapHugePages(size_t bytes) {
  // Map one huge page more than needed and trim both ends, so the mapping
  // starts on a 2 MiB boundary (mmap only promises 4 KiB alignment) and every
  // 2 MiB of it can be one huge page.
  const size_t span = bytes + kHugePageBytes;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = RoundUp(start, kHugePageBytes);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = aligned + bytes;
  if (start + span > end) munmap(reinterpret_cast<void*>(end), start + span - end);
  char* base = reinterpret_cast<char*>(aligned);
  if (HugePagesWanted()) madvise(base, bytes, MADV_HUGEPAGE);
  return base;
}

void UnmapHugePages(char* base, size_t bytes) { munmap(base, bytes); }

char* ChunkArena::Allocate(size_t bytes) {
  bytes = RoundUp(bytes, 64);
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > left_) {
    const size_t block_bytes = RoundUp(std::max(bytes, kBlockBytes), kHugePageBytes);
    ReserveForMore(&blocks_, 1);
    Block block{MapHugePages(block_bytes), block_bytes};
    blocks_.push_back(block);
    next_ = block.base;
    left_ = block.bytes;
  }
  char* chunk = next_;
  next_ += bytes;
  left_ -= bytes;
  return chunk;
}

void ChunkArena::Release() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Block& block : blocks_) UnmapHugePages(block.base, block.bytes);
  blocks_.clear();
  blocks_.shrink_to_fit();
  next_ = nullptr;
  left_ = 0;
}

SlotArrayPool::~SlotArrayPool() {
  // Every shard has freed its array by now, so every shared block is gone.
  for (const auto& block : in_use_) {
    UnmapHugePages(reinterpret_cast<char*>(block.first), kHugePageBytes);
  }
}

uint64_t* SlotArrayPool::Allocate(uint64_t n) {
  const size_t bytes = n * sizeof(uint64_t);
  if (bytes < kMinPooledSlotBytes) return new uint64_t[n];
  if (bytes >= kHugePageBytes) return reinterpret_cast<uint64_t*>(MapHugePages(bytes));
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<char*>& free = free_[bytes];
  if (free.empty()) {
    // A new shared block: the first array is handed out, the rest kept.
    ReserveForMore(&free, kHugePageBytes / bytes);
    char* block = MapHugePages(kHugePageBytes);
    for (size_t offset = kHugePageBytes - bytes; offset > 0; offset -= bytes) {
      free.push_back(block + offset);
    }
    free.push_back(block);
  }
  char* array = free.back();
  // Counted before it leaves the free list: if the count's insertion throws,
  // the array is still the pool's.
  ++in_use_[reinterpret_cast<uintptr_t>(array) & ~(kHugePageBytes - 1)];
  free.pop_back();
  return reinterpret_cast<uint64_t*>(array);
}

void SlotArrayPool::Free(uint64_t* slots, uint64_t n) {
  const size_t bytes = n * sizeof(uint64_t);
  if (bytes < kMinPooledSlotBytes) {
    delete[] slots;
    return;
  }
  char* array = reinterpret_cast<char*>(slots);
  if (bytes >= kHugePageBytes) {
    UnmapHugePages(array, bytes);
    return;
  }
  std::lock_guard<std::mutex> lock(mu_);
  const uintptr_t block = reinterpret_cast<uintptr_t>(array) & ~(kHugePageBytes - 1);
  std::vector<char*>& free = free_[bytes];
  if (--in_use_[block] > 0) {
    free.push_back(array);
    return;
  }
  // The block's last array: drop its other arrays from the free list, unmap.
  in_use_.erase(block);
  free.erase(std::remove_if(free.begin(), free.end(),
                            [block](char* a) {
                              return (reinterpret_cast<uintptr_t>(a) & ~(kHugePageBytes - 1)) == block;
                            }),
             free.end());
  UnmapHugePages(reinterpret_cast<char*>(block), kHugePageBytes);
}

}  // namespace dynemb
