// The CPU implementation of dynemb::Table. The design (sharding, slot layout,
// row slab, locking, scores) is described at the top of cc/core/table.h.

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bitset>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "cc/core/cpu/row_slab.h"
#include "cc/core/hash.h"
#include "cc/core/out_of_memory.h"
#include "cc/core/score_rule.h"
#include "cc/core/table.h"
#include "cc/core/update_rules.h"
#include "cc/core/value_ops.h"

namespace dynemb {
namespace {

constexpr int kShardBits = 8;
constexpr int kNumShards = 1 << kShardBits;
static_assert(kNumShards <= 65536, "ForEachShard lists shard ids as uint16_t");
constexpr uint64_t kMinShardSlots = 8;
// Batches below this many keys run on the calling thread: handing a few
// hundred keys to a thread pool costs more than it saves.
constexpr int64_t kParallelMinKeys = 4096;
// Blocks a large batch is cut into to hash and group it by shard in parallel.
constexpr int64_t kPlanBlocks = 16;
// How far ahead of use the batch loops prefetch.
// (1M keys, 1 thread, dim 8: 8 -> 16 took find from ~28 to ~33 M keys/s;
// 24 was no better.)
constexpr int64_t kPrefetchDistance = 16;
// Lines of one row (or output row) prefetched at most: enough for dim 128
// float32 rows; longer rows are streamed by the hardware prefetcher.
constexpr int kMaxPrefetchLines = 9;
// (score, age): what eviction ranks entries by, lowest first (see HeapEntry).
struct RankKey {
  uint64_t score;
  uint64_t age;
  bool operator<(const RankKey& o) const {
    return score != o.score ? score < o.score : age < o.age;
  }
};
// The hint of a shard without entries: above every live entry's key (a live
// row's age is never kDeadAge, defined below as all ones).
constexpr RankKey kNoEntryKey{~uint64_t{0}, ~uint64_t{0}};
// try_lock attempts on a lower-index shard before eviction looks elsewhere
// (blocking there could deadlock; see "Locking" in table.h).
constexpr int kEvictLockTries = 4;
// Attempts to find room for a new key in a full table whose budget is all
// reserved by other threads' passes, before the key is turned away.
constexpr int kNoVictimRetries = 16;
// Why a call failed when the table's memory ran out (std::bad_alloc). The
// table stays consistent: it keeps what it held and the rows the batch
// applied before.
//
// Both errors a new key can meet are made once, when the library loads:
// returning a copy allocates nothing (table.h, Status), which matters where
// memory has just run out.
const Status kOutOfMemory(
    StatusCode::kResourceExhausted,
    "out of memory: the table could not allocate memory for this call; free memory, or "
    "bound the table with HkvHashTable's max_capacity");
const Status kOutOfRowIndices(StatusCode::kResourceExhausted,
                              "a table shard ran out of row indices (2^32 - 1 keys per shard)");

// Runs body(), which returns a Status; std::bad_alloc becomes kOutOfMemory
// (out_of_memory.h).
template <typename Body>
Status GuardMemory(Body&& body) {
  return CatchOutOfMemory(kOutOfMemory, std::forward<Body>(body));
}

// The first error of calls that may run on several threads. Adding an error
// allocates nothing (table.h, Status), so it serves where memory ran out.
class FirstError {
 public:
  void Add(const Status& status) {
    if (status.ok()) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (first_.ok()) first_ = status;
  }
  Status Get() {
    std::lock_guard<std::mutex> lock(mu_);
    return first_;
  }

 private:
  std::mutex mu_;
  Status first_;
};

// ---------------------------------------------------------------------------
// Key traits: how a key type is stored in a row, viewed in a batch, compared.
// ---------------------------------------------------------------------------
template <typename K>
struct KeyTraits {
  using Stored = K;
  using In = K;
  static void Construct(void* p, In key) { new (p) Stored(key); }
  static void Destroy(void*) {}
  static bool Equal(const void* p, In key) { return *static_cast<const Stored*>(p) == key; }
  static In View(const void* p) { return *static_cast<const Stored*>(p); }
  static constexpr bool kTrivial = true;
};

template <>
struct KeyTraits<std::string> {
  using Stored = std::string;
  using In = std::string_view;
  static void Construct(void* p, In key) { new (p) Stored(key.data(), key.size()); }
  static void Destroy(void* p) { static_cast<Stored*>(p)->~Stored(); }
  static bool Equal(const void* p, In key) { return *static_cast<const Stored*>(p) == key; }
  static In View(const void* p) { return *static_cast<const Stored*>(p); }
  static constexpr bool kTrivial = false;
};

// ---------------------------------------------------------------------------
// Slots: uint64 = (row index << 32) | low 32 bits of the key's hash. The hash
// bits give the home position (so growth and deletion never touch rows) and
// filter key comparisons. A row index of kInvalidRow marks an empty slot, so
// an all-ones word is empty and no key value is reserved.
// ---------------------------------------------------------------------------
constexpr uint64_t kEmptySlot = ~uint64_t{0};
inline uint64_t MakeSlot(uint32_t hash32, uint32_t row) {
  return (static_cast<uint64_t>(row) << 32) | hash32;
}
inline uint32_t SlotRow(uint64_t slot) { return static_cast<uint32_t>(slot >> 32); }
inline uint32_t SlotHash(uint64_t slot) { return static_cast<uint32_t>(slot); }
inline bool SlotEmpty(uint64_t slot) { return SlotRow(slot) == RowSlab::kInvalidRow; }

inline int ShardOf(uint64_t hash) { return static_cast<int>(hash >> (64 - kShardBits)); }

inline uint64_t AtomicLoadScore(const char* p) {
  return __atomic_load_n(reinterpret_cast<const uint64_t*>(p), __ATOMIC_RELAXED);
}
inline void AtomicStoreScore(char* p, uint64_t score) {
  __atomic_store_n(reinterpret_cast<uint64_t*>(p), score, __ATOMIC_RELAXED);
}

// A bounded table's rows carry an age besides the score: when the row was
// last written (inserted, overwritten, accumulated; not refreshed by Find),
// counted in rows written to the table, so ages compare across shards and
// row i of a batch is older than row i + 1. Among equal scores the oldest
// write goes first. A freed row's age is kDeadAge, so a heap entry can tell
// a dead row.
constexpr uint64_t kDeadAge = ~uint64_t{0};

// An entry of a shard's eviction heap (bounded tables). Lazy: (score, age) is
// the row's when the entry was pushed. Outside the writer's lock scores only
// rise (a Find refreshing LRU scores); a writer's write makes the row's age
// newer, and one that lowers its score pushes a new entry. So every live row
// has an entry at or below its current (score, age), and an entry whose row
// died or moved is dropped or re-pushed when it reaches the top (ValidateTop).
struct HeapEntry {
  uint64_t score;
  uint64_t age;
  uint32_t row;
};

// Min-heap order: the lowest (score, age) on top. Ties go by age, not by a
// fixed content order such as the key's hash: with a fixed order, under LFU
// (where many keys tie at count 1) the same keys would always lose the tie
// and could never stay long enough to be counted up.
struct HeapAfter {
  bool operator()(const HeapEntry& a, const HeapEntry& b) const {
    return a.score != b.score ? a.score > b.score : a.age > b.age;
  }
};

struct alignas(64) Shard {
  mutable std::shared_mutex mu;
  SlotArrayPool* slot_pool = nullptr;  // the table's; set once, before ResetSlots
  std::unique_ptr<uint64_t[], SlotArrayDeleter> slots;
  uint64_t num_slots = 0;  // a power of two
  std::atomic<int64_t> size{0};
  RowSlab rows;
  // Bounded tables: built the first time the shard is asked for a victim
  // (so tables that never fill never pay for it), then kept up to date.
  std::vector<HeapEntry> heap;
  bool heap_built = false;

  uint64_t mask() const { return num_slots - 1; }
  // Keep the load factor at or below 3/4: linear probing stays short.
  static bool Overloaded(int64_t keys, uint64_t slots) {
    return static_cast<uint64_t>(keys) * 4 > slots * 3;
  }
  // The smallest power-of-two multiple of `slots` that holds `keys`.
  static uint64_t SlotsToHold(int64_t keys, uint64_t slots) {
    while (Overloaded(keys, slots)) slots *= 2;
    return slots;
  }
  bool NeedsGrowthFor(int64_t keys) const { return Overloaded(keys, num_slots); }
  void ResetSlots(uint64_t n) {
    slots = std::unique_ptr<uint64_t[], SlotArrayDeleter>(slot_pool->Allocate(n),
                                                          SlotArrayDeleter{slot_pool, n});
    std::fill_n(slots.get(), n, kEmptySlot);
    num_slots = n;
  }
};

// The locks of the shards in [first, end) that a batch touches (begin[s] !=
// begin[s + 1]: see BatchPlan), shared for readers or exclusive for writers,
// taken in ascending order (the global lock order of table.h "Locking") and
// released when it goes.
template <bool kExclusive>
class ShardRangeLocks {
 public:
  ShardRangeLocks(Shard* all, int first, int end, const std::array<uint32_t, kNumShards + 1>& begin)
      : all_(all) {
    for (int s = first; s < end; ++s) {
      if (begin[s] == begin[s + 1]) continue;
      if (kExclusive) {
        all_[s].mu.lock();
      } else {
        all_[s].mu.lock_shared();
      }
      locked_[count_++] = static_cast<uint16_t>(s);
    }
  }
  ~ShardRangeLocks() {
    for (int i = count_; i-- > 0;) {
      if (kExclusive) {
        all_[locked_[i]].mu.unlock();
      } else {
        all_[locked_[i]].mu.unlock_shared();
      }
    }
  }
  ShardRangeLocks(const ShardRangeLocks&) = delete;
  ShardRangeLocks& operator=(const ShardRangeLocks&) = delete;

 private:
  Shard* const all_;
  std::array<uint16_t, kNumShards> locked_;
  int count_ = 0;
};

// The slot array each shard starts with for a table of init_capacity keys.
uint64_t InitialShardSlotsFor(int64_t init_capacity) {
  return Shard::SlotsToHold((init_capacity + kNumShards - 1) / kNumShards, kMinShardSlots);
}

// A batch hashed once and grouped by shard: order[begin[s] .. begin[s+1]) are
// the batch indices of the keys of shard s, in batch order (counting sort is
// stable), which is what makes duplicate keys behave sequentially.
//
// With groups > 0 the shards form `groups` runs of consecutive shards
// (GroupFirstShard), and order[begin[first] .. begin[end]) lists the indices
// of a group's keys in batch order, whatever their shard: a loop over a
// group then reads and writes the caller's arrays (values, gradients,
// outputs) in address order, which the hardware prefetcher streams, where
// shard order makes each of them one more random cache line per key.
// begin[] still counts each shard's keys.
struct BatchPlan {
  std::vector<uint64_t> hashes;
  std::vector<uint32_t> order;
  std::array<uint32_t, kNumShards + 1> begin;
  int groups = 0;
};

// The first shard of group g of `groups` (g == groups: kNumShards).
inline int GroupFirstShard(int g, int groups) {
  return static_cast<int>(static_cast<int64_t>(g) * kNumShards / groups);
}

// Per-batch score state (see EvictStrategy in table.h).
struct ScoreContext {
  EvictStrategy strategy;
  uint64_t clock;
  uint64_t epoch;
  const uint64_t* explicit_scores;  // nullable

  uint64_t Score(int64_t i, bool existed, uint64_t old) const {
    if (explicit_scores != nullptr) return explicit_scores[i];
    return ScoreRule{strategy, clock, epoch}.Score(existed, old);
  }
};

// Counters a shard pass collects locally and publishes once.
struct PassCounters {
  uint64_t inserts = 0, updates = 0, lookups = 0, misses = 0, removes = 0, evictions = 0;
};

// A shard and a lower bound of its lowest (score, age); the queue FindVictim
// keeps is a min-heap of these (ties by shard index, so it is deterministic).
struct ShardKey {
  RankKey key;
  int shard;
};
struct ShardKeyAfter {
  bool operator()(const ShardKey& a, const ShardKey& b) const {
    if (a.key < b.key) return false;
    if (b.key < a.key) return true;
    return a.shard > b.shard;
  }
};

// One writing pass over one shard (Insert, Accum, Remove), made while holding
// the shard's exclusive lock; published when it ends.
struct WritePass {
  explicit WritePass(int s) : shard(s) {}
  int shard;
  PassCounters pc;
  int64_t size_delta = 0;  // keys the pass added to the table, net of removals
  int64_t stash = 0;       // bounded tables: budget reserved and not used yet
  int64_t released = 0;    // bounded tables: budget units freed by removals
  // Eviction: the other shards keyed by lower bounds of their minimum (see
  // FindVictim), built on the pass's first eviction.
  std::vector<ShardKey> candidates;
  bool candidates_built = false;
};

// Where a first-round pass of WriteBatch puts the rows it defers: its shard's
// part of the batch's deferred list.
struct DeferredRows {
  uint32_t* rows;
  uint32_t count;
  void Add(uint32_t i) { rows[count++] = i; }
};

// What making room for a new key in a bounded table did.
enum class Room {
  kFree,             // a reserved unit of the budget was free
  kEvictedHere,      // an entry of the key's own shard was evicted (slots moved)
  kEvictedElsewhere, // an entry of another shard was evicted
  kTurnedAway,       // the new key had the lowest score: it is not inserted
};

// A shard's tombstone log holds at most max(kMinTombstones, keys / 2)
// entries before its older half is dropped (see "Change tracking" in table.h).
constexpr size_t kMinTombstones = 64;

// A new table epoch: unique in the process, and unlikely to repeat another
// process's (the start is random), so a mark is never mistaken for another
// table's.
uint64_t NewEpoch() {
  static std::atomic<uint64_t> next{[] {
    std::random_device random;
    return (static_cast<uint64_t>(random()) << 32) ^ random() ^
           static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }()};
  return next.fetch_add(1, std::memory_order_relaxed);
}

// The entry chosen for eviction: its shard (whose heap has it on top) and key.
struct Victim {
  int shard = -1;
  RankKey key{0, 0};
};

template <typename K>
class CpuTable final : public Table {
 public:
  using Traits = KeyTraits<K>;
  using In = typename Traits::In;

  explicit CpuTable(const TableOptions& options)
      : options_(options),
        value_bytes_(options.value_bytes()),
        add_row_(GetAddRowFn(options.value_type)),
        bounded_(options.max_capacity > 0),
        tracking_(options.track_changes),
        stamped_(bounded_ || tracking_),
        shards_(new Shard[kNumShards]),
        tombstones_(new std::vector<Tombstone>[kNumShards]),
        epoch_(NewEpoch()) {
    score_offset_ = RoundUp8(sizeof(typename Traits::Stored));
    // Rows are [key | score | values]; bounded tables' and tables that track
    // changes [key | score | age | values] (the age is the write stamp).
    age_offset_ = score_offset_ + sizeof(uint64_t);
    value_offset_ = age_offset_ + (stamped_ ? sizeof(uint64_t) : 0);
    stride_ = RoundUp8(value_offset_ + value_bytes_);
    for (int s = 0; s < kNumShards; ++s) {
      shards_[s].rows.Init(stride_, &chunk_arena_);
      shards_[s].slot_pool = &slot_pool_;
      shards_[s].ResetSlots(InitialShardSlots());
      SetHint(s, kNoEntryKey);
    }
  }

  ~CpuTable() override {
    for (int s = 0; s < kNumShards; ++s) DestroyKeys(shards_[s]);
  }

  const TableOptions& options() const override { return options_; }

  // Published by each pass when it ends, so it never counts a key a pass is
  // still inserting under a reservation (and thus never exceeds max_capacity).
  int64_t Size() const override { return size_.load(std::memory_order_relaxed); }

  int64_t Capacity() const override {
    int64_t total = 0;
    for (int s = 0; s < kNumShards; ++s) {
      std::shared_lock<std::shared_mutex> lock(shards_[s].mu);
      total += static_cast<int64_t>(shards_[s].num_slots * 3 / 4);
    }
    return bounded_ ? std::min(total, options_.max_capacity) : total;
  }

  int64_t MemoryBytes() const override {
    int64_t bytes = sizeof(*this) + kNumShards * sizeof(Shard);
    for (int s = 0; s < kNumShards; ++s) {
      std::shared_lock<std::shared_mutex> lock(shards_[s].mu);
      bytes += shards_[s].num_slots * sizeof(uint64_t) + shards_[s].rows.MemoryBytes() +
               shards_[s].heap.capacity() * sizeof(HeapEntry) +
               tombstones_[s].capacity() * sizeof(Tombstone);
      if (!Traits::kTrivial) bytes += StringHeapBytes(shards_[s]);
    }
    return bytes;
  }

  TableCounters Counters() const override {
    TableCounters c;
    c.inserts = inserts_.load(std::memory_order_relaxed);
    c.updates = updates_.load(std::memory_order_relaxed);
    c.lookups = lookups_.load(std::memory_order_relaxed);
    c.misses = misses_.load(std::memory_order_relaxed);
    c.removes = removes_.load(std::memory_order_relaxed);
    c.evictions = evictions_.load(std::memory_order_relaxed);
    return c;
  }

  // These calls run their ...Body under GuardMemory: running out of memory
  // anywhere in one is an error status, never an exception (the core's
  // callers, TF kernels among them, do not catch). None allocates through
  // TF (see Export).
  Status FindRows(const void* keys, int64_t n, void* values, bool* exists, const void* defaults,
                  bool default_per_key, bool update_scores, const Runner& runner) override {
    return GuardMemory([&] {
      return FindBody(keys, n, values, exists, defaults, default_per_key, update_scores, runner);
    });
  }
  Status InsertAndEvict(const void* keys, int64_t n, const void* values, const uint64_t* scores,
                        EvictedEntries* evicted, const Runner& runner) override {
    return GuardMemory(
        [&] { return InsertAndEvictBody(keys, n, values, scores, evicted, runner); });
  }
  Status AccumAndEvict(const void* keys, int64_t n, const void* deltas, const bool* exists,
                       EvictedEntries* evicted, const Runner& runner) override {
    return GuardMemory(
        [&] { return AccumAndEvictBody(keys, n, deltas, exists, evicted, runner); });
  }
  Status ApplyRule(const void* keys, int64_t n, const void* initial, const RuleStep& step,
                   const Runner& runner) override {
    return GuardMemory([&] { return ApplyRuleBody(keys, n, initial, step, runner); });
  }
  Status Remove(const void* keys, int64_t n, const Runner& runner) override {
    return GuardMemory([&] { return RemoveBody(keys, n, runner); });
  }
  Status Snapshot(std::unique_ptr<TableSnapshot>* snapshot) override {
    return GuardMemory([&] { return SnapshotBody(snapshot); });
  }
  Status ExportChunks(int64_t chunk_rows, const ChunkSink& sink) override {
    return GuardMemory([&] { return ExportChunksBody(chunk_rows, sink); });
  }
  Status ExportChanges(const ChangeMark& since, const ChangeMark& until, int64_t chunk_rows,
                       const ChunkSink& rows, const KeySink& removed, bool* complete) override {
    return GuardMemory(
        [&] { return ExportChangesBody(since, until, chunk_rows, rows, removed, complete); });
  }

  // See "Change tracking" in table.h: closes the write gate, waits for the
  // batches in flight, reads the rows-written counter.
  Status Mark(ChangeMark* mark) override {
    if (!tracking_) return NotTracked();
    std::lock_guard<std::mutex> lock(mark_mu_);
    marking_.store(true, std::memory_order_seq_cst);
    while (writers_.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
    mark->stamp = rows_written_.load(std::memory_order_seq_cst);
    mark->epoch = epoch_.load(std::memory_order_seq_cst);
    marking_.store(false, std::memory_order_seq_cst);
    return Status::Ok();
  }

  Status FindBody(const void* keys, int64_t n, void* values, bool* exists, const void* defaults,
                  bool default_per_key, bool update_scores, const Runner& runner) {
    if (n == 0) return Status::Ok();
    DYNEMB_RETURN_IF_ERROR(CheckBatch(keys, n, values, "values"));
    if (defaults == nullptr) return InvalidArgument("Find: defaults must not be null");
    const In* in = static_cast<const In*>(keys);
    BatchPlan plan;
    // A large batch by shard: a shard's keys share its slot array's pages (a
    // Find reads no caller rows, and in batch order it ran 2.2-2.3 -> 2.9-3.0 ms
    // in the steady shared step); a small one in one group (GroupsFor).
    const bool large = n >= kParallelMinKeys;
    BuildPlan(in, n, runner, &plan, large ? 0 : GroupsFor(n, runner));
    const bool touch = update_scores && options_.find_updates_scores &&
                       (options_.strategy == EvictStrategy::kLru ||
                        options_.strategy == EvictStrategy::kEpochLru);
    ScoreContext ctx{options_.strategy, touch ? NextClock() : 0, CurrentEpoch(), nullptr};
    char* out = static_cast<char*>(values);
    const char* def = static_cast<const char*>(defaults);
    const uint64_t* hashes = plan.hashes.data();
    const ScoreContext* scores = touch ? &ctx : nullptr;
    if (large) {
      // Shards in parallel, a pipeline per shard.
      return ForEachShard(plan, n, runner, [&](int, Shard& shard, const uint32_t* idx, int64_t count) {
        std::shared_lock<std::shared_mutex> lock(shard.mu);
        FindKeys([&](uint32_t) -> const Shard& { return shard; }, hashes, idx, count, in, out, exists,
                 def, default_per_key, scores);
        return Status::Ok();
      });
    }
    // One group: its keys in batch order, in one pipeline (see BatchPlan).
    return ForEachGroup(plan, runner, [&](int first, int end, const uint32_t* idx, int64_t count) {
      const ShardRangeLocks</*kExclusive=*/false> locks(shards_.get(), first, end, plan.begin);
      FindKeys([&](uint32_t i) -> const Shard& { return shards_[ShardOf(hashes[i])]; }, hashes, idx,
               count, in, out, exists, def, default_per_key, scores);
      return Status::Ok();
    });
  }

  Status InsertAndEvictBody(const void* keys, int64_t n, const void* values, const uint64_t* scores,
                            EvictedEntries* evicted, const Runner& runner) {
    if (evicted != nullptr) evicted->count = 0;
    if (n == 0) return Status::Ok();
    DYNEMB_RETURN_IF_ERROR(CheckBatch(keys, n, values, "values"));
    const In* in = static_cast<const In*>(keys);
    BatchPlan plan;
    BuildWritePlan(in, n, runner, &plan);
    const WriteGate gate(this);
    ScoreContext ctx = WriteScoreContext(scores, n, /*is_insert=*/true);
    const uint64_t age_base = AgeBase(n);
    const char* src = static_cast<const char*>(values);
    EvictedWriter out(evicted, value_bytes_);
    Status result = WriteBatch(plan, n, runner, /*presize=*/true,
                               [&](WritePass& pass, auto&& shard_at, const uint32_t* idx,
                                   int64_t count, DeferredRows* deferred) {
      Status status;
      const auto ahead = [&](int64_t b) {
        PrefetchSpan<0>(src + static_cast<size_t>(idx[b]) * value_bytes_, value_bytes_);
      };
      PipelinedLoopAt(shard_at, plan.hashes.data(), idx, count, ahead, [&](int64_t p, uint32_t) {
        if (!status.ok()) return;
        const uint32_t i = idx[p];
        const uint64_t hash = plan.hashes[i];
        Shard& shard = shard_at(i);
        pass.shard = ShardOf(hash);
        const char* value = src + i * value_bytes_;
        const uint64_t pos = FindPosition(shard, hash, in[i]);
        const uint64_t slot = shard.slots[pos];
        if (!SlotEmpty(slot)) {
          char* r = shard.rows.Row(SlotRow(slot));
          CopyValues(r + value_offset_, value);
          const uint64_t old = AtomicLoadScore(r + score_offset_);
          Rescore(pass.shard, SlotRow(slot), r, old, ctx.Score(i, true, old), age_base + i);
          ++pass.pc.updates;
        } else if (deferred != nullptr) {
          deferred->Add(i);
        } else {
          InsertNew(pass, count - p, hash, in[i], pos, value, ctx.Score(i, false, 0),
                    age_base + i, &out, &status);
        }
      });
      return status;
    });
    if (evicted != nullptr) evicted->count = out.count();
    return result;
  }

  Status AccumAndEvictBody(const void* keys, int64_t n, const void* deltas, const bool* exists,
                           EvictedEntries* evicted, const Runner& runner) {
    if (evicted != nullptr) evicted->count = 0;
    if (n == 0) return Status::Ok();
    DYNEMB_RETURN_IF_ERROR(CheckBatch(keys, n, deltas, "deltas"));
    if (exists == nullptr) return InvalidArgument("Accum: exists must not be null");
    const In* in = static_cast<const In*>(keys);
    BatchPlan plan;
    BuildWritePlan(in, n, runner, &plan);
    const WriteGate gate(this);
    ScoreContext ctx = WriteScoreContext(nullptr, n, /*is_insert=*/false);
    const uint64_t age_base = AgeBase(n);
    const char* src = static_cast<const char*>(deltas);
    EvictedWriter out(evicted, value_bytes_);
    Status result = WriteBatch(plan, n, runner, /*presize=*/false,
                               [&](WritePass& pass, auto&& shard_at, const uint32_t* idx,
                                   int64_t count, DeferredRows* deferred) {
      Status status;
      const auto ahead = [&](int64_t b) {
        PrefetchSpan<0>(src + static_cast<size_t>(idx[b]) * value_bytes_, value_bytes_);
      };
      PipelinedLoopAt(shard_at, plan.hashes.data(), idx, count, ahead, [&](int64_t p, uint32_t) {
        if (!status.ok()) return;
        const uint32_t i = idx[p];
        const uint64_t hash = plan.hashes[i];
        Shard& shard = shard_at(i);
        pass.shard = ShardOf(hash);
        const char* delta = src + i * value_bytes_;
        const uint64_t pos = FindPosition(shard, hash, in[i]);
        const uint64_t slot = shard.slots[pos];
        if (!SlotEmpty(slot)) {
          if (exists[i]) {
            char* r = shard.rows.Row(SlotRow(slot));
            add_row_(r + value_offset_, delta, options_.dim);
            const uint64_t old = AtomicLoadScore(r + score_offset_);
            Rescore(pass.shard, SlotRow(slot), r, old, ctx.Score(i, true, old), age_base + i);
            ++pass.pc.updates;
          }
        } else if (deferred != nullptr) {
          // Absent: deferred whatever exists[i] says, so that all rows of a
          // key stay in one round, in batch order.
          deferred->Add(i);
        } else if (!exists[i]) {
          InsertNew(pass, count - p, hash, in[i], pos, delta, ctx.Score(i, false, 0),
                    age_base + i, &out, &status);
        }
      });
      return status;
    });
    if (evicted != nullptr) evicted->count = out.count();
    return result;
  }

  Status ApplyRuleBody(const void* keys, int64_t n, const void* initial, const RuleStep& step,
                       const Runner& runner) {
    DYNEMB_RETURN_IF_ERROR(CheckRuleStep(options_, keys, n, initial, step));
    if (n == 0) return Status::Ok();
    DYNEMB_RETURN_IF_ERROR(CheckBatch(keys, n, initial, "initial"));
    const In* in = static_cast<const In*>(keys);
    const char* init = static_cast<const char*>(initial);
    if (options_.value_type == ValueType::kFloat64) {
      return ApplyRuleAs<double>(in, n, init, step, runner);
    }
    return ApplyRuleAs<float>(in, n, init, step, runner);
  }

  Status RemoveBody(const void* keys, int64_t n, const Runner& runner) {
    if (n == 0) return Status::Ok();
    DYNEMB_RETURN_IF_ERROR(CheckBatch(keys, n, keys, "keys"));
    const In* in = static_cast<const In*>(keys);
    BatchPlan plan;
    BuildPlan(in, n, runner, &plan);
    const WriteGate gate(this);
    // Removals take stamps from the same counter as writes, so a window of
    // marks orders them with the writes (a tombstone's stamp).
    const uint64_t stamp_base = tracking_ ? AgeBase(n) : 0;
    return ForEachShard(
        plan, n, runner, [&](int s, Shard& shard, const uint32_t* idx, int64_t count) {
          std::unique_lock<std::shared_mutex> lock(shard.mu);
          WritePass pass(s);
          PipelinedLoop(shard, plan.hashes.data(), idx, count, [&](int64_t p, uint32_t) {
            const uint32_t i = idx[p];
            const uint64_t pos = FindPosition(shard, plan.hashes[i], in[i]);
            if (SlotEmpty(shard.slots[pos])) return;
            RecordRemoval(s, in[i], stamp_base + i);
            EraseAt(shard, pos);
            ++pass.pc.removes;
            --pass.size_delta;
            ++pass.released;
          });
          Publish(pass);
          return Status::Ok();
        });
  }

  void Clear() override {
    // Through the write gate, so that a Mark sees the table before or after.
    const WriteGate gate(this);
    std::vector<std::unique_lock<std::shared_mutex>> locks = LockAll<std::unique_lock>();
    int64_t removed = 0;
    for (int s = 0; s < kNumShards; ++s) {
      Shard& shard = shards_[s];
      removed += shard.size.load(std::memory_order_relaxed);
      DestroyKeys(shard);
      shard.rows.Reset();
      // The old array goes first, so its memory can serve the new one; short
      // of memory for init_capacity's array, the smallest will do (it grows
      // with inserts like any other). Clear cannot fail.
      shard.slots.reset();
      try {
        shard.ResetSlots(InitialShardSlots());
      } catch (const std::bad_alloc&) {
        shard.ResetSlots(kMinShardSlots);
      }
      shard.size.store(0, std::memory_order_relaxed);
      shard.heap.clear();
      shard.heap.shrink_to_fit();
      shard.heap_built = false;
      SetHint(s, kNoEntryKey);
      std::vector<Tombstone>().swap(tombstones_[s]);
    }
    // The keys just removed have no tombstones: marks of the old epoch no
    // longer tell what changed.
    epoch_.store(NewEpoch(), std::memory_order_seq_cst);
    chunk_arena_.Release();  // every shard's rows are gone
    // Subtract rather than store 0: with every lock held no pass is running,
    // but the order of the two counters must stay size_ <= reserved_.
    size_.fetch_sub(removed, std::memory_order_relaxed);
    if (bounded_) reserved_.fetch_sub(removed, std::memory_order_relaxed);
  }

  // Not under GuardMemory as a whole: sink->Allocate is TF's allocator,
  // which holds its lock when it throws, so catching its std::bad_alloc
  // would trade the process's end for a deadlock at the next deallocation.
  Status Export(ExportSink* sink, const Runner& runner) override {
    std::vector<std::shared_lock<std::shared_mutex>> locks = LockAll<std::shared_lock>();
    // Shard s's entries go to [offset[s], offset[s + 1]), so shards copy in parallel.
    std::array<int64_t, kNumShards + 1> offset;
    offset[0] = 0;
    for (int s = 0; s < kNumShards; ++s) {
      offset[s + 1] = offset[s] + shards_[s].size.load(std::memory_order_relaxed);
    }
    const int64_t n = offset[kNumShards];
    void* keys = nullptr;
    void* values = nullptr;
    uint64_t* scores = nullptr;
    DYNEMB_RETURN_IF_ERROR(sink->Allocate(n, &keys, &values, &scores));
    const auto emit = [&](int64_t i, const char* r) {
      WriteKey(sink, keys, i, r);
      if (values != nullptr) {
        CopyValues(static_cast<char*>(values) + i * value_bytes_, r + value_offset_);
      }
      if (scores != nullptr) scores[i] = AtomicLoadScore(r + score_offset_);
    };
    // The copy is mostly first touches of the output (a checkpoint's worth of
    // new memory), which two threads fault in nearly twice as fast as one.
    const auto parallel = [&](int64_t units, const std::function<void(int64_t, int64_t)>& fn) {
      if (n < kParallelMinKeys) {
        fn(0, units);
      } else {
        runner.ParallelFor(units, std::max<int64_t>(1, n / units) * 100, fn);
      }
    };
    if (!bounded_) {
      parallel(kNumShards, [&](int64_t first, int64_t last) {
        for (int64_t s = first; s < last; ++s) {
          int64_t i = offset[s];
          ForEachRowInSlotOrder(shards_[s], [&](const char* r) { emit(i++, r); });
        }
      });
      return Status::Ok();
    }
    std::vector<std::pair<uint64_t, const char*>> order;
    DYNEMB_RETURN_IF_ERROR(GuardMemory([&] {
      order = RowsOldestFirst(n);
      return Status::Ok();
    }));
    parallel(n, [&](int64_t first, int64_t last) {
      for (int64_t i = first; i < last; ++i) emit(i, order[i].second);
    });
    return Status::Ok();
  }

  Status ExportChangesBody(const ChangeMark& since, const ChangeMark& until, int64_t chunk_rows,
                           const ChunkSink& rows, const KeySink& removed, bool* complete) {
    *complete = false;
    if (!tracking_) return NotTracked();
    if (chunk_rows < 1) {
      return InvalidArgument("chunk_rows must be >= 1, got " + std::to_string(chunk_rows));
    }
    // Marks of two epochs: a Clear came between them, whose removals are unknown.
    if (since.epoch != until.epoch) return Status::Ok();
    if (since.stamp > until.stamp) {
      return InvalidArgument("ExportChanges: `until` must be a mark taken after `since`, got "
                             "since stamp " + std::to_string(since.stamp) + ", until stamp " +
                             std::to_string(until.stamp));
    }
    for (int s = 0; s < kNumShards; ++s) {
      const Shard& shard = shards_[s];
      std::shared_lock<std::shared_mutex> lock(shard.mu);
      // Under the lock: a Clear (all locks) is before or after this shard.
      if (!ChangesKnownSince(since)) return Status::Ok();
      const auto in_window = [&](uint64_t stamp) {
        return stamp >= since.stamp && stamp < until.stamp;
      };
      // The lock keeps the chunk's string keys alive until the sink returns.
      ChunkBuffer chunk(*this,
                        std::min<int64_t>(chunk_rows, shard.size.load(std::memory_order_relaxed)));
      Status status;
      shard.rows.ForEachRow([&](const char* r) {
        const uint64_t age = Age(r);  // kDeadAge for a free row: never in a window
        if (status.ok() && age != kDeadAge && in_window(age)) status = chunk.Add(r, rows);
      });
      DYNEMB_RETURN_IF_ERROR(status);
      DYNEMB_RETURN_IF_ERROR(chunk.Flush(rows));
      std::vector<In> gone;
      for (const Tombstone& t : tombstones_[s]) {
        if (!in_window(t.stamp)) continue;
        const In key = Traits::View(&t.key);
        const uint64_t slot = shard.slots[FindPosition(shard, HashKey(key), key)];
        // Removed, then written again in the window: it travels as its row.
        if (!SlotEmpty(slot) && in_window(Age(shard.rows.Row(SlotRow(slot))))) continue;
        gone.push_back(key);
      }
      std::sort(gone.begin(), gone.end());
      gone.erase(std::unique(gone.begin(), gone.end()), gone.end());
      for (size_t b = 0; b < gone.size(); b += static_cast<size_t>(chunk_rows)) {
        const size_t m = std::min(gone.size() - b, static_cast<size_t>(chunk_rows));
        DYNEMB_RETURN_IF_ERROR(removed(gone.data() + b, static_cast<int64_t>(m)));
      }
    }
    *complete = true;
    return Status::Ok();
  }

  Status SnapshotBody(std::unique_ptr<TableSnapshot>* snapshot) {
    *snapshot = std::make_unique<CpuSnapshot>(*this);
    return Status::Ok();
  }

  Status ExportChunksBody(int64_t chunk_rows, const ChunkSink& sink) {
    if (chunk_rows < 1) {
      return InvalidArgument("chunk_rows must be >= 1, got " + std::to_string(chunk_rows));
    }
    if (bounded_) return ExportChunksOldestFirst(chunk_rows, sink);
    for (int s = 0; s < kNumShards; ++s) {
      const Shard& shard = shards_[s];
      std::shared_lock<std::shared_mutex> lock(shard.mu);
      // The lock keeps the chunk's string keys alive until the sink returns.
      ChunkBuffer chunk(*this,
                        std::min<int64_t>(chunk_rows, shard.size.load(std::memory_order_relaxed)));
      Status status;
      ForEachRowInSlotOrder(shard, [&](const char* r) {
        if (status.ok()) status = chunk.Add(r, sink);
      });
      DYNEMB_RETURN_IF_ERROR(status);
      DYNEMB_RETURN_IF_ERROR(chunk.Flush(sink));
    }
    return Status::Ok();
  }

 private:
  template <typename T>
  Status ApplyRuleAs(const In* in, int64_t n, const char* initial, const RuleStep& step,
                     const Runner& runner) {
    const T* coefficients = static_cast<const T*>(step.coefficients);
    const T* rows = static_cast<const T*>(step.rows);
    const T* grads = static_cast<const T*>(step.grads);
    T* out = static_cast<T*>(step.new_rows);
    const int64_t dim = step.dim;
    const size_t row_bytes = static_cast<size_t>(dim) * sizeof(T);
    // The batch's rows are visited in shard order, i.e. at random.
    const auto ahead = [&](uint32_t i) {
      PrefetchSpan<0>(rows + i * dim, row_bytes);
      PrefetchSpan<0>(grads + i * dim, row_bytes);
      PrefetchSpan<1>(out + i * dim, row_bytes);
    };
    const auto update = [&](uint32_t i, char* state) {
      ApplyRuleToRow<T>(step.rule, step.weight_decay, coefficients, dim, rows + i * dim,
                        grads + i * dim, reinterpret_cast<T*>(state), out + i * dim);
    };
    return UpdateInPlace(in, n, initial, runner, ahead, update);
  }

  // The read-modify-write loop of ApplyRule (unbounded tables only, so
  // WriteBatch never defers rows): update(i, value row) runs on key i's
  // stored row in place, or on a copy of `initial` that is then inserted;
  // ahead(i) runs some keys before, to prefetch the caller's memory of i.
  template <typename Ahead, typename Update>
  Status UpdateInPlace(const In* in, int64_t n, const char* initial, const Runner& runner,
                       Ahead&& ahead, Update&& update) {
    BatchPlan plan;
    BuildWritePlan(in, n, runner, &plan);
    const WriteGate gate(this);
    const ScoreContext ctx = WriteScoreContext(nullptr, n, /*is_insert=*/true);
    const uint64_t age_base = AgeBase(n);
    return WriteBatch(plan, n, runner, /*presize=*/false,
                      [&](WritePass& pass, auto&& shard_at, const uint32_t* idx, int64_t count,
                          DeferredRows*) {
      Status status;
      // 8-byte aligned (operator new), as the value rows of the slab are.
      std::vector<uint64_t> fresh((value_bytes_ + 7) / 8);
      char* fresh_row = reinterpret_cast<char*>(fresh.data());
      PipelinedLoopAt(
          shard_at, plan.hashes.data(), idx, count, [&](int64_t b) { ahead(idx[b]); },
          [&](int64_t p, uint32_t) {
            if (!status.ok()) return;
            const uint32_t i = idx[p];
            const uint64_t hash = plan.hashes[i];
            Shard& shard = shard_at(i);
            pass.shard = ShardOf(hash);
            const uint64_t pos = FindPosition(shard, hash, in[i]);
            const uint64_t slot = shard.slots[pos];
            if (!SlotEmpty(slot)) {
              char* r = shard.rows.Row(SlotRow(slot));
              update(i, r + value_offset_);
              SetScore(r, ctx.Score(i, true, AtomicLoadScore(r + score_offset_)));
              if (stamped_) SetAge(r, age_base + i);
              ++pass.pc.updates;
            } else {
              CopyValues(fresh_row, initial);
              update(i, fresh_row);
              InsertNew(pass, count - p, hash, in[i], pos, fresh_row, ctx.Score(i, false, 0),
                        age_base + i, /*out=*/nullptr, &status);
            }
          });
      return status;
    });
  }

  // A bounded table's rows (all shards locked by the caller; n of them), oldest
  // write first: importing an export in this order (as a checkpoint restore
  // does) gives the rows ages in the same relative order, so the restored
  // table breaks score ties as the saved one would.
  std::vector<std::pair<uint64_t, const char*>> RowsOldestFirst(int64_t n) const {
    std::vector<std::pair<uint64_t, const char*>> order;
    order.reserve(static_cast<size_t>(n));
    for (int s = 0; s < kNumShards; ++s) {
      ForEachRowInSlotOrder(shards_[s], [&](const char* r) { order.emplace_back(Age(r), r); });
    }
    std::sort(order.begin(), order.end());
    return order;
  }

  // Rows gathered for a ChunkSink (ExportChunks, TableSnapshot::Read), up to
  // `cap` at a time: keys in the batch representation (string keys viewed in
  // place, so the caller holds the rows' locks until Flush), values, scores.
  class ChunkBuffer {
   public:
    ChunkBuffer(const CpuTable& table, int64_t cap)
        : table_(table), cap_(static_cast<size_t>(std::max<int64_t>(cap, 1))) {
      keys_.reserve(cap_);
      values_.resize(cap_ * table.value_bytes_);
      scores_.reserve(cap_);
    }

    // Adds row r; a full chunk goes to the sink.
    Status Add(const char* r, const ChunkSink& sink) {
      std::memcpy(values_.data() + keys_.size() * table_.value_bytes_, r + table_.value_offset_,
                  table_.value_bytes_);
      keys_.push_back(Traits::View(r));
      scores_.push_back(AtomicLoadScore(r + table_.score_offset_));
      return keys_.size() == cap_ ? Flush(sink) : Status::Ok();
    }

    // Hands the rows gathered so far, if any, to the sink.
    Status Flush(const ChunkSink& sink) {
      if (keys_.empty()) return Status::Ok();
      Status status =
          sink(keys_.data(), static_cast<int64_t>(keys_.size()), values_.data(), scores_.data());
      keys_.clear();
      scores_.clear();
      return status;
    }

   private:
    const CpuTable& table_;
    const size_t cap_;
    std::vector<In> keys_;
    std::vector<char> values_;
    std::vector<uint64_t> scores_;
  };

  // TableSnapshot of a CPU table: every shard's reader lock, held for the
  // snapshot's life, and the rows in Export's order (shard by shard in slot
  // order; bounded tables oldest write first).
  class CpuSnapshot final : public TableSnapshot {
   public:
    explicit CpuSnapshot(const CpuTable& table)
        : table_(table), locks_(table.LockAll<std::shared_lock>()) {
      offset_[0] = 0;
      for (int s = 0; s < kNumShards; ++s) {
        offset_[s + 1] = offset_[s] + table.shards_[s].size.load(std::memory_order_relaxed);
      }
      if (table.bounded_) order_ = table.RowsOldestFirst(size());
    }

    int64_t size() const override { return offset_[kNumShards]; }

    Status Read(int64_t begin, int64_t end, int64_t chunk_rows,
                const ChunkSink& sink) const override {
      if (begin < 0 || begin > end || end > size()) {
        return InvalidArgument("snapshot rows [" + std::to_string(begin) + ", " +
                               std::to_string(end) + ") are outside [0, " +
                               std::to_string(size()) + ")");
      }
      if (chunk_rows < 1) {
        return InvalidArgument("chunk_rows must be >= 1, got " + std::to_string(chunk_rows));
      }
      // The snapshot's locks keep the chunk's string keys alive.
      ChunkBuffer chunk(table_, std::min(chunk_rows, end - begin));
      Status status;
      const auto emit = [&](const char* r) { status = chunk.Add(r, sink); };
      if (table_.bounded_) {
        for (int64_t i = begin; i < end && status.ok(); ++i) emit(order_[i].second);
      } else {
        // Row i of the snapshot is row i - offset_[s] of shard s in slot order.
        for (int s = 0; s < kNumShards && status.ok(); ++s) {
          if (offset_[s + 1] <= begin || offset_[s] == offset_[s + 1]) continue;
          if (offset_[s] >= end) break;
          int64_t i = offset_[s];
          table_.ForEachRowInSlotOrder(table_.shards_[s], [&](const char* r) {
            if (i >= begin && i < end && status.ok()) emit(r);
            ++i;
          });
        }
      }
      DYNEMB_RETURN_IF_ERROR(status);
      return chunk.Flush(sink);
    }

   private:
    const CpuTable& table_;
    std::vector<std::shared_lock<std::shared_mutex>> locks_;
    std::array<int64_t, kNumShards + 1> offset_;
    std::vector<std::pair<uint64_t, const char*>> order_;  // bounded tables
  };

  // Calls fn(row) for every entry of `shard` (locked by the caller).
  template <typename Fn>
  void ForEachRowInSlotOrder(const Shard& shard, Fn&& fn) const {
    for (uint64_t pos = 0; pos < shard.num_slots; ++pos) {
      // Slots are in hash order, rows in insertion order: fetch rows ahead.
      if (pos + kPrefetchDistance < shard.num_slots) {
        const uint64_t ahead = shard.slots[pos + kPrefetchDistance];
        if (!SlotEmpty(ahead)) PrefetchSpan<0>(shard.rows.Row(SlotRow(ahead)), stride_);
      }
      const uint64_t slot = shard.slots[pos];
      if (!SlotEmpty(slot)) fn(static_cast<const char*>(shard.rows.Row(SlotRow(slot))));
    }
  }

  // ExportChunks of a bounded table: oldest write first over the whole table,
  // as Export, so that a file load gives the rows ages in the same relative
  // order and the loaded table breaks score ties as the saved one would. The
  // order is taken shard by shard (24 bytes per key, no values); then each
  // chunk's rows are copied under their shard's lock, one shard at a time,
  // with their content at that moment. A row that no longer holds the key it
  // held in the snapshot (freed, released by a Clear, or reused by another
  // key) is skipped, so no key is written twice even if it moved meanwhile.
  Status ExportChunksOldestFirst(int64_t chunk_rows, const ChunkSink& sink) {
    struct Ref {
      uint64_t age;
      uint64_t hash;  // the key's: tells whether the row still holds it
      uint32_t row;
      uint32_t shard;
      bool operator<(const Ref& o) const { return age < o.age; }
    };
    std::vector<Ref> order;
    for (int s = 0; s < kNumShards; ++s) {
      const Shard& shard = shards_[s];
      std::shared_lock<std::shared_mutex> lock(shard.mu);
      for (uint64_t pos = 0; pos < shard.num_slots; ++pos) {
        const uint64_t slot = shard.slots[pos];
        if (SlotEmpty(slot)) continue;
        const char* r = shard.rows.Row(SlotRow(slot));
        order.push_back(
            Ref{Age(r), HashKey(Traits::View(r)), SlotRow(slot), static_cast<uint32_t>(s)});
      }
    }
    std::sort(order.begin(), order.end());
    const size_t cap = std::min(order.size(), static_cast<size_t>(chunk_rows));
    std::vector<typename Traits::Stored> key_copies(cap);  // the sink's keys outlive the locks
    std::vector<In> keys(cap);
    std::vector<char> values(cap * value_bytes_);
    std::vector<uint64_t> scores(cap);
    std::vector<bool> copied(cap);
    std::vector<uint32_t> by_shard(cap);
    for (size_t begin = 0; begin < order.size(); begin += cap) {
      const size_t m = std::min(cap, order.size() - begin);
      const Ref* chunk = order.data() + begin;
      for (size_t j = 0; j < m; ++j) by_shard[j] = static_cast<uint32_t>(j);
      std::stable_sort(by_shard.begin(), by_shard.begin() + m,
                       [chunk](uint32_t a, uint32_t b) { return chunk[a].shard < chunk[b].shard; });
      for (size_t j = 0; j < m;) {
        const uint32_t s = chunk[by_shard[j]].shard;
        std::shared_lock<std::shared_mutex> lock(shards_[s].mu);
        for (; j < m && chunk[by_shard[j]].shard == s; ++j) {
          const uint32_t c = by_shard[j];
          // (A Clear since the snapshot released the rows: check first.)
          const char* r = shards_[s].rows.Contains(chunk[c].row)
                              ? shards_[s].rows.Row(chunk[c].row) : nullptr;
          copied[c] = r != nullptr && Age(r) != kDeadAge &&
                      HashKey(Traits::View(r)) == chunk[c].hash;
          if (!copied[c]) continue;
          key_copies[c] = *reinterpret_cast<const typename Traits::Stored*>(r);
          std::memcpy(values.data() + c * value_bytes_, r + value_offset_, value_bytes_);
          scores[c] = AtomicLoadScore(r + score_offset_);
        }
      }
      size_t n = 0;  // compact the copied rows, in age order
      for (size_t c = 0; c < m; ++c) {
        if (!copied[c]) continue;
        if (n != c) {
          key_copies[n] = std::move(key_copies[c]);
          std::memmove(values.data() + n * value_bytes_, values.data() + c * value_bytes_,
                       value_bytes_);
          scores[n] = scores[c];
        }
        keys[n] = In(key_copies[n]);
        ++n;
      }
      if (n > 0) DYNEMB_RETURN_IF_ERROR(sink(keys.data(), static_cast<int64_t>(n), values.data(),
                                             scores.data()));
    }
    return Status::Ok();
  }

  // ---- Change tracking (see "Change tracking" in table.h) ----

  // A key that left the table: its stamp and a copy of it.
  struct Tombstone {
    uint64_t stamp;
    typename Traits::Stored key;
  };

  static Status NotTracked() {
    return Status(StatusCode::kFailedPrecondition,
                  "this table was made with track_changes=False: it keeps no write stamps or "
                  "tombstones, so it cannot say what changed");
  }

  // Whether every change since `since` is known: the same epoch, and no
  // tombstone of the window dropped.
  bool ChangesKnownSince(const ChangeMark& since) const {
    return since.epoch == epoch_.load(std::memory_order_seq_cst) &&
           since.stamp >= lost_below_.load(std::memory_order_relaxed);
  }

  // Held by a writing batch from before it takes its stamps until it
  // returns, so that Mark can wait for the batches in flight: one atomic
  // increment and decrement per batch. Does nothing in a table that does not
  // track changes.
  class WriteGate {
   public:
    explicit WriteGate(CpuTable* table) : table_(table->tracking_ ? table : nullptr) {
      if (table_ == nullptr) return;
      for (;;) {
        table_->writers_.fetch_add(1, std::memory_order_seq_cst);
        if (!table_->marking_.load(std::memory_order_seq_cst)) return;
        // A Mark is waiting for the batches in flight: do not start one now.
        table_->writers_.fetch_sub(1, std::memory_order_seq_cst);
        while (table_->marking_.load(std::memory_order_seq_cst)) std::this_thread::yield();
      }
    }
    ~WriteGate() {
      if (table_ != nullptr) table_->writers_.fetch_sub(1, std::memory_order_seq_cst);
    }
    WriteGate(const WriteGate&) = delete;
    WriteGate& operator=(const WriteGate&) = delete;

   private:
    CpuTable* const table_;
  };

  // Logs that `key` left shard s (locked exclusively) at `stamp`; called
  // before its row is freed. A full log first drops its older half (entries
  // are in the order keys went, so their stamps almost rise), and the stamps
  // it dropped become unknown changes.
  void RecordRemoval(int s, In key, uint64_t stamp) {
    if (!tracking_) return;
    std::vector<Tombstone>& log = tombstones_[s];
    const size_t cap = std::max(
        kMinTombstones, static_cast<size_t>(shards_[s].size.load(std::memory_order_relaxed)) / 2);
    if (log.size() >= cap) {
      const size_t drop = log.size() / 2;
      uint64_t highest = 0;
      for (size_t i = 0; i < drop; ++i) highest = std::max(highest, log[i].stamp);
      log.erase(log.begin(), log.begin() + static_cast<std::ptrdiff_t>(drop));
      AtomicMax(lost_below_, highest + 1);
    }
    log.push_back(Tombstone{stamp, typename Traits::Stored(key)});
  }

  // Writes evicted entries into the caller's EvictedEntries (or only counts
  // them); thread-safe: each entry takes the next index.
  class EvictedWriter {
   public:
    EvictedWriter(EvictedEntries* out, size_t value_bytes) : out_(out), value_bytes_(value_bytes) {}
    void Write(In key, const char* value, uint64_t score) {
      if (out_ == nullptr) return;
      const int64_t i = next_.fetch_add(1, std::memory_order_relaxed);
      if constexpr (Traits::kTrivial) {
        if (out_->keys != nullptr) static_cast<K*>(out_->keys)[i] = key;
      } else {
        if (out_->string_key) out_->string_key(i, key);
      }
      if (out_->values != nullptr) {
        std::memcpy(static_cast<char*>(out_->values) + static_cast<size_t>(i) * value_bytes_,
                    value, value_bytes_);
      }
      if (out_->scores != nullptr) out_->scores[i] = score;
    }
    int64_t count() const { return next_.load(std::memory_order_relaxed); }

   private:
    EvictedEntries* out_;
    size_t value_bytes_;
    std::atomic<int64_t> next_{0};
  };

  static size_t RoundUp8(size_t x) { return (x + 7) & ~size_t{7}; }

  uint64_t InitialShardSlots() const { return InitialShardSlotsFor(options_.init_capacity); }

  // Batch positions are uint32 in the shard plan.
  Status CheckBatch(const void* keys, int64_t n, const void* data, const char* what) const {
    return CheckBatchArgs(keys, n, data, what, int64_t{0xffffffff}, "[0, 2^32)");
  }

  // Advances the clock by one, saturating: a clock restored at the top of the
  // range must not wrap below the scores it was restored from.
  uint64_t NextClock() {
    uint64_t current = clock_.load(std::memory_order_relaxed);
    while (current != ~uint64_t{0} &&
           !clock_.compare_exchange_weak(current, current + 1, std::memory_order_relaxed)) {
    }
    return current == ~uint64_t{0} ? current : current + 1;
  }

  uint64_t CurrentEpoch() const {
    const uint64_t floor = epoch_floor_.load(std::memory_order_relaxed);
    if (options_.step_per_epoch <= 0) return floor;
    return std::max(floor, insert_batches_.load(std::memory_order_relaxed) /
                               static_cast<uint64_t>(options_.step_per_epoch));
  }

  static void AtomicMax(std::atomic<uint64_t>& target, uint64_t value) {
    uint64_t current = target.load(std::memory_order_relaxed);
    while (current < value &&
           !target.compare_exchange_weak(current, value, std::memory_order_relaxed)) {
    }
  }

  // Explicit scores (import, restore) move the clock and the epoch forward
  // past them, so keys written afterwards rank above the restored ones, as
  // they would have in the table that was saved.
  void AdvancePastScores(const uint64_t* scores, int64_t n) {
    uint64_t max_clock = 0, max_epoch = 0;
    const bool epochs = options_.strategy == EvictStrategy::kEpochLru ||
                        options_.strategy == EvictStrategy::kEpochLfu;
    if (!epochs && options_.strategy != EvictStrategy::kLru) return;
    for (int64_t i = 0; i < n; ++i) {
      max_clock = std::max(max_clock, epochs ? (scores[i] & 0xffffffffu) : scores[i]);
      max_epoch = std::max(max_epoch, scores[i] >> 32);
    }
    if (options_.strategy != EvictStrategy::kEpochLfu) AtomicMax(clock_, max_clock);
    if (epochs) AtomicMax(epoch_floor_, max_epoch);
  }

  // Score state for a writing batch: one clock tick per batch; the epoch
  // counts Insert batches only (API.md: "every step_per_epoch insert calls").
  ScoreContext WriteScoreContext(const uint64_t* explicit_scores, int64_t n, bool is_insert) {
    if (explicit_scores != nullptr) AdvancePastScores(explicit_scores, n);
    ScoreContext ctx{options_.strategy, NextClock(), CurrentEpoch(), explicit_scores};
    if (is_insert) insert_batches_.fetch_add(1, std::memory_order_relaxed);
    return ctx;
  }

  void SetScore(char* row, uint64_t score) const { AtomicStoreScore(row + score_offset_, score); }

  // Hashes the batch and groups its indices by shard (a stable counting
  // sort), or with `groups` > 0 by group of shards, in batch order (see
  // BatchPlan). Large batches are cut into blocks that hash, count and
  // scatter in parallel: block j's indices of a bucket go after those of
  // blocks < j, so every bucket's indices stay in batch order.
  void BuildPlan(const In* keys, int64_t n, const Runner& runner, BatchPlan* plan,
                 int groups = 0) const {
    plan->hashes.resize(n);
    plan->order.resize(n);
    plan->groups = groups;
    uint64_t* hashes = plan->hashes.data();
    uint32_t* order = plan->order.data();
    const int64_t blocks = n < kParallelMinKeys ? 1 : std::min<int64_t>(kPlanBlocks, n / 2048);
    std::vector<std::array<uint32_t, kNumShards>> counts(static_cast<size_t>(blocks));
    const auto block_begin = [&](int64_t j) { return n * j / blocks; };
    const auto hash_and_count = [&](int64_t first, int64_t last) {
      for (int64_t j = first; j < last; ++j) {
        std::array<uint32_t, kNumShards>& c = counts[j];
        c.fill(0);
        for (int64_t i = block_begin(j), e = block_begin(j + 1); i < e; ++i) {
          hashes[i] = HashKey(keys[i]);
          ++c[ShardOf(hashes[i])];
        }
      }
    };
    const int64_t keys_per_block = n / blocks + 1;
    if (blocks == 1) {
      hash_and_count(0, 1);
    } else {
      runner.ParallelFor(blocks, keys_per_block * (Traits::kTrivial ? 25 : 100), hash_and_count);
    }
    uint32_t running = 0;
    for (int s = 0; s < kNumShards; ++s) {
      plan->begin[s] = running;
      for (int64_t j = 0; j < blocks; ++j) running += counts[j][s];
    }
    plan->begin[kNumShards] = running;
    // The buckets are the shards, or the groups of consecutive shards.
    // next[j][b]: where block j's first index of bucket b goes.
    const int buckets = groups > 0 ? groups : kNumShards;
    const auto bucket_end = [&](int b) { return groups > 0 ? GroupFirstShard(b + 1, groups) : b + 1; };
    std::array<uint16_t, kNumShards> bucket_of;
    std::vector<std::array<uint32_t, kNumShards>> next(static_cast<size_t>(blocks));
    for (int b = 0, s = 0; b < buckets; s = bucket_end(b), ++b) {
      uint32_t at = plan->begin[s];
      for (int64_t j = 0; j < blocks; ++j) {
        next[j][b] = at;
        for (int t = s; t < bucket_end(b); ++t) at += counts[j][t];
      }
      for (int t = s; t < bucket_end(b); ++t) bucket_of[t] = static_cast<uint16_t>(b);
    }
    const auto scatter = [&](int64_t first, int64_t last) {
      for (int64_t j = first; j < last; ++j) {
        std::array<uint32_t, kNumShards>& to = next[j];
        for (int64_t i = block_begin(j), e = block_begin(j + 1); i < e; ++i) {
          order[to[bucket_of[ShardOf(hashes[i])]]++] = static_cast<uint32_t>(i);
        }
      }
    };
    if (blocks == 1) {
      scatter(0, 1);
    } else {
      runner.ParallelFor(blocks, keys_per_block * 10, scatter);
    }
  }

  // The groups that an unbounded table's writes (and a small Find) plan a
  // batch of n keys in (BuildPlan, ForEachGroup). A large batch: one per
  // thread the runner may use at once. Each group then reads every other row
  // of the caller's arrays (on 2 threads), whose lines the hardware
  // prefetcher streams; four groups per thread (for balance among threads
  // that start late) lost that: the steady shared step's ApplyRule took
  // 6.6-7.1 ms against 3.9-5.0 (docs/benchmarks.md, issue 35). A small
  // batch: one group, which then runs one pipeline over all its keys (a
  // small batch leaves a few keys per shard, and a pipeline per shard would
  // drain every few keys).
  static int GroupsFor(int64_t n, const Runner& runner) {
    if (n < kParallelMinKeys) return 1;
    return static_cast<int>(std::clamp<int64_t>(runner.Parallelism(), 1, kNumShards));
  }

  // Runs fn(first, end, indices, count) for every group of a plan made in
  // groups that has keys: the group's shards are [first, end), its keys'
  // batch indices come in batch order. Groups run in parallel. Returns the
  // first error.
  template <typename Fn>
  Status ForEachGroup(const BatchPlan& plan, const Runner& runner, Fn&& fn) {
    const int groups = plan.groups;
    FirstError first_error;
    const auto run = [&](int64_t first_group, int64_t last_group) {
      for (int64_t g = first_group; g < last_group; ++g) {
        const int first = GroupFirstShard(static_cast<int>(g), groups);
        const int end = GroupFirstShard(static_cast<int>(g) + 1, groups);
        const uint32_t b = plan.begin[first], e = plan.begin[end];
        if (b == e) continue;
        // An exception must not escape a thread pool's worker.
        first_error.Add(GuardMemory(
            [&] { return fn(first, end, plan.order.data() + b, static_cast<int64_t>(e - b)); }));
      }
    };
    if (groups == 1) {
      run(0, 1);
    } else {
      // A group is one thread's whole share of the batch.
      runner.ParallelFor(groups, int64_t{1} << 30, run);
    }
    return first_error.Get();
  }

  // Runs fn(shard index, shard, indices, count) for every shard the batch
  // touches, shards in parallel. Returns the first error.
  template <typename Fn>
  Status ForEachShard(const BatchPlan& plan, int64_t n, const Runner& runner, Fn&& fn) {
    return ForEachShard(plan.begin, plan.order.data(), n, runner, std::forward<Fn>(fn));
  }

  // The same over the n batch indices order[begin[s] .. begin[s + 1]) of
  // each shard s; with `serial` (or a small batch), shards run one after
  // another on this thread. A shard's error does not stop the other shards.
  template <typename Fn>
  Status ForEachShard(const std::array<uint32_t, kNumShards + 1>& begin, const uint32_t* order,
                      int64_t n, const Runner& runner, Fn&& fn, bool serial = false) {
    // The shards the batch touches, in order. Only they are split among the
    // threads: a batch concentrated in a few shards (a checkpoint's rows come
    // shard by shard) would otherwise fall into one thread's range of all
    // kNumShards, and one thread would do all of it.
    std::array<uint16_t, kNumShards> touched;
    int64_t count = 0;
    for (int s = 0; s < kNumShards; ++s) {
      if (begin[s] != begin[s + 1]) touched[count++] = static_cast<uint16_t>(s);
    }
    FirstError first_error;
    auto run = [&](int64_t first, int64_t last) {
      for (int64_t i = first; i < last; ++i) {
        const int s = touched[i];
        const uint32_t b = begin[s], e = begin[s + 1];
        // An exception must not escape a thread pool's worker.
        first_error.Add(
            GuardMemory([&] { return fn(s, shards_[s], order + b, static_cast<int64_t>(e - b)); }));
      }
    };
    if (serial || n < kParallelMinKeys || count <= 1) {
      run(0, count);
    } else {
      runner.ParallelFor(count, (n / count + 1) * 200, run);
    }
    return first_error.Get();
  }

  // The slot holding `key`, or the empty slot that ends its probe sequence.
  uint64_t FindPosition(const Shard& shard, uint64_t hash, In key) const {
    const uint32_t h32 = static_cast<uint32_t>(hash);
    const uint64_t mask = shard.mask();
    for (uint64_t pos = h32 & mask;; pos = (pos + 1) & mask) {
      const uint64_t slot = shard.slots[pos];
      if (SlotEmpty(slot)) return pos;
      if (SlotHash(slot) == h32 && Traits::Equal(shard.rows.Row(SlotRow(slot)), key)) return pos;
    }
  }

  // The first row whose slot hash matches, without comparing keys (the
  // pipelined Find verifies it once the row is in cache), or kInvalidRow.
  static uint32_t CandidateRow(const Shard& shard, uint64_t hash) {
    const uint32_t h32 = static_cast<uint32_t>(hash);
    const uint64_t mask = shard.mask();
    for (uint64_t pos = h32 & mask;; pos = (pos + 1) & mask) {
      const uint64_t slot = shard.slots[pos];
      if (SlotEmpty(slot)) return RowSlab::kInvalidRow;
      if (SlotHash(slot) == h32) return SlotRow(slot);
    }
  }

  // Applies a writing batch: run_pass(pass, shard_at, idx, count, deferred)
  // applies the rows idx[0 .. count) in order, where shard_at(i) is the
  // (exclusively locked) shard of batch index i; it sets pass.shard to a
  // key's shard before it inserts or rescores the key. (The row loop is
  // written in each operation, so that it inlines.) With `presize`, each
  // shard is first grown to hold its keys in the batch (Presize).
  //
  // An unbounded table's batch is planned in groups (BuildWritePlan): each
  // group, in parallel, holds its shards' locks and applies its keys in
  // batch order, in one WritePass.
  //
  // A bounded table's batch is applied shard by shard, shards in parallel,
  // one pass per shard (eviction keeps budget and victim state per pass, and
  // takes other shards' locks by the rules of table.h "Locking"). With
  // `deferred` non-null, run_pass must defer rows whose key is absent
  // (deferred->Add(i)) instead of applying them.
  //
  // When the batch may fill a bounded table it runs in two rounds: first the
  // rows whose key is present (apply returns deferred for the others), then
  // the deferred rows. So the new keys' evictions find the batch's existing
  // keys already rescored, and do not evict a key a later row of the same
  // batch updates. A key is present for all of its rows in round one or
  // absent for all (round one inserts nothing), so each key's rows still
  // apply in batch order. The second round runs on this thread: its
  // evictions lock the shard that holds the table's minimum, so threads
  // evicting in parallel mostly wait for each other (2 threads: 0.5 M
  // evicting inserts/s, 1 thread: 1.2 M/s), and one thread makes the choice
  // of victims independent of thread timing.
  template <typename RunPass>
  Status WriteBatch(const BatchPlan& plan, int64_t n, const Runner& runner, bool presize,
                    RunPass&& run_pass) {
    if (plan.groups > 0) {
      const uint64_t* hashes = plan.hashes.data();
      const auto shard_at = [&](uint32_t i) -> Shard& { return shards_[ShardOf(hashes[i])]; };
      return ForEachGroup(plan, runner, [&](int first, int end, const uint32_t* idx, int64_t count) {
        const ShardRangeLocks</*kExclusive=*/true> locks(shards_.get(), first, end, plan.begin);
        if (presize) {
          for (int s = first; s < end; ++s) Presize(shards_[s], plan.begin[s + 1] - plan.begin[s]);
        }
        WritePass pass(first);
        // Caught here, so that what the pass did before is published.
        const Status status = GuardMemory([&] { return run_pass(pass, shard_at, idx, count, nullptr); });
        Publish(pass);
        return status;
      });
    }
    const bool two_rounds =
        bounded_ && reserved_.load(std::memory_order_relaxed) + n > options_.max_capacity;
    std::vector<uint32_t> deferred(two_rounds ? n : 0);
    std::array<uint32_t, kNumShards> num_deferred{};
    const auto round = [&](const std::array<uint32_t, kNumShards + 1>& begin,
                           const uint32_t* order, int64_t rows, bool defer, bool serial) {
      return ForEachShard(
          begin, order, rows, runner,
          [&](int s, Shard& shard, const uint32_t* idx, int64_t count) {
            std::unique_lock<std::shared_mutex> lock(shard.mu);
            if (presize && !defer) Presize(shard, count);
            WritePass pass(s);
            DeferredRows rows_out{defer ? deferred.data() + begin[s] : nullptr, 0};
            const auto shard_at = [&shard](uint32_t) -> Shard& { return shard; };
            // Caught here, so that what the pass did before is published.
            const Status status = GuardMemory(
                [&] { return run_pass(pass, shard_at, idx, count, defer ? &rows_out : nullptr); });
            if (defer) num_deferred[s] = rows_out.count;
            Publish(pass);
            return status;
          },
          serial);
    };
    DYNEMB_RETURN_IF_ERROR(round(plan.begin, plan.order.data(), n, two_rounds, false));
    if (!two_rounds) return Status::Ok();
    // Compact each shard's deferred rows to the front (never overtaking).
    std::array<uint32_t, kNumShards + 1> begin;
    begin[0] = 0;
    for (int s = 0; s < kNumShards; ++s) {
      std::memmove(deferred.data() + begin[s], deferred.data() + plan.begin[s],
                   num_deferred[s] * sizeof(uint32_t));
      begin[s + 1] = begin[s] + num_deferred[s];
    }
    return round(begin, deferred.data(), begin[kNumShards], false, /*serial=*/true);
  }

  // The plan of a writing batch (WriteBatch): in groups for an unbounded table.
  void BuildWritePlan(const In* keys, int64_t n, const Runner& runner, BatchPlan* plan) const {
    BuildPlan(keys, n, runner, plan, bounded_ ? 0 : GroupsFor(n, runner));
  }

  // Inserts `key`, absent from shard pass.shard (locked; its probe ended at
  // `pos`), with `value`, `score` and (bounded tables) `age`. In a bounded
  // table it first makes room (MakeRoom): it may evict an entry or turn the
  // key away. Sets *status only on an error (assigning a Status per key
  // costs more than the rest of an insert's bookkeeping).
  void InsertNew(WritePass& pass, int64_t rows_left, uint64_t hash, In key, uint64_t pos,
                 const char* value, uint64_t score, uint64_t age, EvictedWriter* out,
                 Status* status) {
    Shard& shard = shards_[pass.shard];
    Room room = Room::kFree;
    if (bounded_) {
      room = MakeRoom(pass, rows_left, key, value, score, age, out);
      if (room == Room::kTurnedAway) return;
      // Evicting from this shard shifted its slots.
      if (room == Room::kEvictedHere) pos = FindPosition(shard, hash, key);
    }
    const int64_t size = shard.size.load(std::memory_order_relaxed);
    uint32_t row = 0;
    const Status* failure = TakeSlotAndRow(shard, size, hash, key, &pos, &row);
    if (failure != nullptr) {
      if (room == Room::kFree) {
        ++pass.stash;  // the reserved unit was not used
      } else {         // an entry was evicted for nothing: its unit is free
        --pass.size_delta;
        ++pass.released;
      }
      *status = *failure;
      return;
    }
    char* r = shard.rows.Row(row);
    CopyValues(r + value_offset_, value);
    SetScore(r, score);
    shard.slots[pos] = MakeSlot(static_cast<uint32_t>(hash), row);
    shard.size.store(size + 1, std::memory_order_relaxed);
    ++pass.pc.inserts;
    // An eviction made room: the table's size is unchanged.
    if (room == Room::kFree) ++pass.size_delta;
    if (bounded_) {
      OnWrite(pass.shard, row, r, score, age, /*lowered=*/true);
    } else if (stamped_) {
      SetAge(r, age);
    }
  }

  // Room in `shard` (holding `size` keys) for absent `key`: grows the slot
  // array when it is full (then *pos is where key's probe now ends) and
  // takes a row with the key constructed in it. Returns null, or why there
  // is no room (kOutOfMemory or kOutOfRowIndices); then the shard holds what
  // it held (it may have grown). Running out of memory is an error for the
  // caller to report: an exception escaping a thread pool's worker would end
  // the process.
  const Status* TakeSlotAndRow(Shard& shard, int64_t size, uint64_t hash, In key, uint64_t* pos,
                             uint32_t* row) {
    try {
      if (shard.NeedsGrowthFor(size + 1)) {
        Grow(shard, shard.num_slots * 2);
        *pos = FindPosition(shard, hash, key);
      }
      if (!shard.rows.Allocate(row)) {
        return &kOutOfRowIndices;
      }
    } catch (const std::bad_alloc&) {
      return &kOutOfMemory;
    }
    try {
      Traits::Construct(shard.rows.Row(*row), key);  // a long string key allocates
    } catch (const std::bad_alloc&) {
      // A free row reads as dead to the scans of stamped rows.
      if (stamped_) SetAge(shard.rows.Row(*row), kDeadAge);
      shard.rows.Free(*row);
      return &kOutOfMemory;
    }
    return nullptr;
  }

  // A writer changed the score of existing row `row` (at `r`) from `old` to
  // `score`.
  void Rescore(int s, uint32_t row, char* r, uint64_t old, uint64_t score, uint64_t age) {
    SetScore(r, score);
    // A rising (score, age) leaves the row's heap entry valid as a lower
    // bound (it is re-pushed lazily); a lowered score needs an entry.
    if (bounded_) {
      OnWrite(s, row, r, score, age, /*lowered=*/score < old);
    } else if (stamped_) {
      SetAge(r, age);
    }
  }

  // A bounded shard's row was written with `score` at `age`. If its (score,
  // age) is new or lower, the heap and the shard's hint learn of it.
  void OnWrite(int s, uint32_t row, char* r, uint64_t score, uint64_t age, bool lowered) {
    Shard& shard = shards_[s];
    SetAge(r, age);
    if (!lowered) return;
    if (RankKey{score, age} < Hint(s)) SetHint(s, RankKey{score, age});
    if (!shard.heap_built) return;  // BuildHeap will read the row
    // Grow by a quarter rather than double: the heap holds ~1 entry per key,
    // and a full table's shards drift only a little in size.
    if (shard.heap.size() == shard.heap.capacity()) {
      shard.heap.reserve(WithQuarterRoom(shard.heap.size()));
    }
    shard.heap.push_back(HeapEntry{score, age, row});
    std::push_heap(shard.heap.begin(), shard.heap.end(), HeapAfter());
    // Dead and re-ranked entries accumulate; rebuilding from the live rows
    // keeps the heap within ~2 entries per key.
    const auto live = static_cast<size_t>(shard.size.load(std::memory_order_relaxed));
    if (shard.heap.size() > 2 * live + 64) BuildHeap(shard);
  }

  // A heap's capacity for `entries`: a quarter more (docs/tables.md's bound).
  static size_t WithQuarterRoom(size_t entries) { return entries + entries / 4 + 16; }

  void BuildHeap(Shard& shard) {
    shard.heap.clear();
    // Room for a quarter more than the shard holds: new keys push entries
    // before their victims' entries are popped, and a heap that grew here
    // would leave its old copy (~24 B per key) in malloc's free lists.
    const auto live = static_cast<size_t>(shard.size.load(std::memory_order_relaxed));
    shard.heap.reserve(WithQuarterRoom(live));
    for (uint64_t pos = 0; pos < shard.num_slots; ++pos) {
      const uint64_t slot = shard.slots[pos];
      if (SlotEmpty(slot)) continue;
      const char* r = shard.rows.Row(SlotRow(slot));
      shard.heap.push_back(HeapEntry{AtomicLoadScore(r + score_offset_), Age(r), SlotRow(slot)});
    }
    std::make_heap(shard.heap.begin(), shard.heap.end(), HeapAfter());
    shard.heap_built = true;
  }

  uint64_t Age(const char* row) const {
    uint64_t age;
    std::memcpy(&age, row + age_offset_, sizeof(age));
    return age;
  }
  void SetAge(char* row, uint64_t age) const { std::memcpy(row + age_offset_, &age, sizeof(age)); }

  // Ages for a writing batch of n rows: row i was written at base + i. One
  // atomic add per batch; 2^64 rows never wrap.
  uint64_t AgeBase(int64_t n) {
    return stamped_ ? rows_written_.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed)
                    : 0;
  }

  // Shard s's published hint: a lower bound of its lowest (score, age). Two
  // relaxed words: a reader racing a writer may see a mixed pair, which only
  // makes eviction approximate under concurrency.
  RankKey Hint(int s) const {
    return RankKey{hint_score_[s].load(std::memory_order_relaxed),
                   hint_age_[s].load(std::memory_order_relaxed)};
  }
  void SetHint(int s, RankKey key) {
    hint_score_[s].store(key.score, std::memory_order_relaxed);
    hint_age_[s].store(key.age, std::memory_order_relaxed);
  }

  // Brings shard s's lowest (score, age) live entry to the top of its heap
  // (building the heap on first use) and publishes it as the shard's hint,
  // now exact. The caller holds the shard's exclusive lock. Returns false
  // when the shard is empty.
  bool ValidateTop(int s, Victim* top) {
    Shard& shard = shards_[s];
    if (!shard.heap_built) BuildHeap(shard);
    std::vector<HeapEntry>& heap = shard.heap;
    while (!heap.empty()) {
      const HeapEntry e = heap.front();
      const char* r = shard.rows.Row(e.row);
      const uint64_t age = Age(r);
      const uint64_t score = AtomicLoadScore(r + score_offset_);
      if (age != e.age || score != e.score) {
        std::pop_heap(heap.begin(), heap.end(), HeapAfter());
        if (age == kDeadAge) {  // evicted or removed since it was pushed
          heap.pop_back();
        } else {  // written or re-scored since (or a new key's reused row): re-rank
          heap.back() = HeapEntry{score, age, e.row};
          std::push_heap(heap.begin(), heap.end(), HeapAfter());
        }
        continue;
      }
      // `e` stays on top, where EvictAt expects it.
      top->shard = s;
      top->key = RankKey{score, age};
      SetHint(s, top->key);
      return true;
    }
    SetHint(s, kNoEntryKey);
    return false;
  }

  // Locks shard t for eviction while the caller holds shards up to index
  // `max_held`. Blocking only on a higher index than every lock held keeps
  // one global lock order, so two evicting writers cannot deadlock; a lower
  // index is only tried. The returned lock may not own the mutex.
  std::unique_lock<std::shared_mutex> LockForEviction(int t, int max_held) {
    std::unique_lock<std::shared_mutex> lock(shards_[t].mu, std::defer_lock);
    if (t > max_held) {
      lock.lock();
      return lock;
    }
    for (int attempt = 0; attempt < kEvictLockTries; ++attempt) {
      if (lock.try_lock()) break;
      std::this_thread::yield();
    }
    return lock;
  }

  // Finds the entry of lowest (score, age) in the table, for a new key of
  // shard pass.shard (whose lock the caller holds). The pass keeps the other
  // shards in a priority queue by their hints (lower bounds): the top shard
  // is locked and validated (its key becomes exact and goes back in), until
  // the best entry found is at or below every key left in the queue: then it
  // is the global minimum. The queue stays valid for the whole pass since the
  // pass only raises other shards' minimums (by evicting from them), so most
  // rows validate one or two shards. `*victim_lock` holds the victim's shard
  // lock when it is not pass.shard. Returns false if no entry was found (the
  // budget is all reserved by passes still inserting).
  bool FindVictim(WritePass& pass, Victim* best, std::unique_lock<std::shared_mutex>* victim_lock) {
    const int s = pass.shard;
    bool found = ValidateTop(s, best);
    std::vector<ShardKey>& queue = pass.candidates;
    if (!pass.candidates_built) {
      queue.clear();
      for (int u = 0; u < kNumShards; ++u) {
        if (u != s) queue.push_back(ShardKey{Hint(u), u});
      }
      std::make_heap(queue.begin(), queue.end(), ShardKeyAfter());
      pass.candidates_built = true;
    }
    std::vector<ShardKey> skipped;  // busy shards, back in the queue afterwards
    for (int visits = 0; visits < kNumShards && !queue.empty(); ++visits) {
      const ShardKey top = queue.front();
      if (found && !(top.key < best->key)) break;  // nothing left can beat best
      std::pop_heap(queue.begin(), queue.end(), ShardKeyAfter());
      queue.pop_back();
      std::unique_lock<std::shared_mutex> lock =
          LockForEviction(top.shard, std::max(s, found ? best->shard : s));
      if (!lock.owns_lock()) {  // busy: approximate rather than wait
        skipped.push_back(top);
        continue;
      }
      Victim candidate;
      const bool nonempty = ValidateTop(top.shard, &candidate);
      queue.push_back(ShardKey{nonempty ? candidate.key : kNoEntryKey, top.shard});
      std::push_heap(queue.begin(), queue.end(), ShardKeyAfter());
      if (nonempty && (!found || candidate.key < best->key)) {
        *best = candidate;
        *victim_lock = std::move(lock);  // releases the previous victim's shard
        found = true;
      }
    }
    for (const ShardKey& k : skipped) {
      queue.push_back(k);
      std::push_heap(queue.begin(), queue.end(), ShardKeyAfter());
    }
    return found;
  }

  // Room for one new key of `score` in bounded shard pass.shard (locked).
  // Below max_capacity a unit of the global budget is reserved (in bulk: up
  // to the rows left in the pass, at most 1/8 of what is free, so that
  // concurrent passes rarely hold budget another one needs; returned when the
  // pass ends). When the table is full, the entry of lowest (score, age) is
  // evicted and reported, or, if the new key's own score is lower, the key is
  // turned away and reported instead (a tie evicts the stored entry: it is
  // older).
  // Out of line: the insert loop stays small for unbounded tables.
  __attribute__((noinline)) Room MakeRoom(WritePass& pass, int64_t rows_left, In key,
                                          const char* value, uint64_t score, uint64_t age,
                                          EvictedWriter* out) {
    for (int attempt = 0;; ++attempt) {
      if (pass.stash == 0) pass.stash = TryReserve(rows_left);
      if (pass.stash > 0) {
        --pass.stash;
        return Room::kFree;
      }
      Victim victim;
      std::unique_lock<std::shared_mutex> victim_lock;
      if (FindVictim(pass, &victim, &victim_lock)) {
        ++pass.pc.evictions;
        if (score < victim.key.score) {
          out->Write(key, value, score);
          return Room::kTurnedAway;
        }
        EvictAt(victim, age, out);
        return victim.shard == pass.shard ? Room::kEvictedHere : Room::kEvictedElsewhere;
      }
      // Full, yet nothing to evict: other passes hold the budget as
      // reservations they are about to use or return. Never wait for them
      // while holding a lock (one of them may wait for ours).
      if (attempt == kNoVictimRetries) {
        ++pass.pc.evictions;
        out->Write(key, value, score);
        return Room::kTurnedAway;
      }
      std::this_thread::yield();
      rows_left = 1;
    }
  }

  // Takes up to `want` units of the max_capacity budget: all of it when
  // plenty is free, one at a time near the limit.
  int64_t TryReserve(int64_t want) {
    int64_t current = reserved_.load(std::memory_order_relaxed);
    for (;;) {
      const int64_t free = options_.max_capacity - current;
      if (free <= 0) return 0;
      const int64_t take = std::min(want, std::max<int64_t>(1, free / 8));
      if (reserved_.compare_exchange_weak(current, current + take, std::memory_order_relaxed)) {
        return take;
      }
    }
  }

  // Evicts the entry ValidateTop left on top of its shard's heap (the shard
  // is locked), reporting it before its row is freed; `stamp` is the evicting
  // row's (its tombstone's stamp).
  void EvictAt(const Victim& victim, uint64_t stamp, EvictedWriter* out) {
    Shard& shard = shards_[victim.shard];
    const char* r = shard.rows.Row(shard.heap.front().row);
    const In key = Traits::View(r);
    const uint64_t pos = FindPosition(shard, HashKey(key), key);
    out->Write(key, r + value_offset_, victim.key.score);
    RecordRemoval(victim.shard, key, stamp);
    std::pop_heap(shard.heap.begin(), shard.heap.end(), HeapAfter());
    shard.heap.pop_back();
    EraseAt(shard, pos);
    // The next entry is a lower bound of the shard's new minimum.
    SetHint(victim.shard, shard.heap.empty()
                              ? kNoEntryKey
                              : RankKey{shard.heap.front().score, shard.heap.front().age});
  }

  // Before an insert applies `count` keys to a shard (locked): if they could
  // take it past 3/4 load, grows its slot array once, to what holds them all,
  // instead of doubling it again and again as they arrive. Why: keys exported
  // from a table (import, restore, load_from_file) come in slot order, sorted
  // by their home in the source's large arrays; one by one into a small array
  // they sweep it several times, each key walking to the end of the run the
  // previous ones built (linear probing's worst case: a 10M-key import took
  // 4.8 s instead of 0.6). Keys already stored, or repeated in the batch, make
  // it grow at most one batch early. A bounded shard is presized to its share
  // of max_capacity at most: eviction keeps it near that share, and per-key
  // growth covers the drift.
  void Presize(Shard& shard, int64_t count) {
    int64_t keys = shard.size.load(std::memory_order_relaxed) + count;
    if (bounded_) keys = std::min(keys, (options_.max_capacity + kNumShards - 1) / kNumShards);
    if (!shard.NeedsGrowthFor(keys)) return;
    try {
      Grow(shard, Shard::SlotsToHold(keys, shard.num_slots));
    } catch (const std::bad_alloc&) {
      // Only a speed-up: the inserts grow the array as they need and report
      // running out of memory themselves.
    }
  }

  // Moves the slots into a new array of `n` slots (a power of two, larger).
  // Slots carry their hash bits, so rows are not read.
  // Throws std::bad_alloc before anything changes when there is no memory
  // for the new array.
  static void Grow(Shard& shard, uint64_t n) {
    std::unique_ptr<uint64_t[], SlotArrayDeleter> grown(shard.slot_pool->Allocate(n),
                                                        SlotArrayDeleter{shard.slot_pool, n});
    std::fill_n(grown.get(), n, kEmptySlot);
    const uint64_t mask = n - 1;
    for (uint64_t i = 0; i < shard.num_slots; ++i) {
      const uint64_t slot = shard.slots[i];
      if (SlotEmpty(slot)) continue;
      uint64_t pos = SlotHash(slot) & mask;
      while (!SlotEmpty(grown[pos])) pos = (pos + 1) & mask;
      grown[pos] = slot;
    }
    shard.slots = std::move(grown);
    shard.num_slots = n;
  }

  // Removes the entry at `pos` by backward-shift deletion: later entries of
  // the probe run move back into the hole unless that would put them before
  // their home, so lookups never need tombstones.
  void EraseAt(Shard& shard, uint64_t pos) {
    const uint32_t row = SlotRow(shard.slots[pos]);
    Traits::Destroy(shard.rows.Row(row));
    if (stamped_) SetAge(shard.rows.Row(row), kDeadAge);
    shard.rows.Free(row);
    const uint64_t mask = shard.mask();
    uint64_t hole = pos;
    for (uint64_t j = (pos + 1) & mask;; j = (j + 1) & mask) {
      const uint64_t slot = shard.slots[j];
      if (SlotEmpty(slot)) break;
      const uint64_t home = SlotHash(slot) & mask;
      // The entry at j may fill the hole iff its home is not cyclically in (hole, j].
      const bool home_in_range = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
      if (home_in_range) continue;
      shard.slots[hole] = slot;
      hole = j;
    }
    shard.slots[hole] = kEmptySlot;
    shard.size.fetch_sub(1, std::memory_order_relaxed);
  }

  // Visits a shard's keys in batch order, overlapping their cache misses:
  // slots are prefetched 2 * D keys ahead; D keys ahead the first row whose
  // slot hash matches is found and every cache line of it prefetched (a
  // 48-byte row straddles two lines half the time), and ahead(b) runs so the
  // caller can prefetch its own per-key memory (Find: the output row, which
  // is written in shard order, i.e. at random); then visit(p, candidate)
  // runs with all of it most likely in cache. The candidate is a hint: visit
  // must verify it (Find does) or probe again (writers do, since their own
  // inserts may have moved slots since).
  template <typename Ahead, typename Visit>
  void PipelinedLoop(const Shard& shard, const uint64_t* hashes, const uint32_t* idx,
                     int64_t count, Ahead&& ahead, Visit&& visit) const {
    PipelinedLoopAt([&](uint32_t) -> const Shard& { return shard; }, hashes, idx, count,
                    std::forward<Ahead>(ahead), std::forward<Visit>(visit));
  }
  // The same over keys of several shards: shard_at(i) is batch index i's
  // shard, whose lock the caller holds for the whole loop.
  template <typename ShardAt, typename Ahead, typename Visit>
  void PipelinedLoopAt(ShardAt&& shard_at, const uint64_t* hashes, const uint32_t* idx,
                       int64_t count, Ahead&& ahead, Visit&& visit) const {
    constexpr int64_t D = kPrefetchDistance;
    uint32_t candidates[D];
    for (int64_t t = 0; t < count + 2 * D; ++t) {
      if (t < count) {
        const Shard& shard = shard_at(idx[t]);
        __builtin_prefetch(&shard.slots[SlotHash(hashes[idx[t]]) & shard.mask()]);
      }
      const int64_t c = t - 2 * D;
      if (c >= 0) visit(c, candidates[c % D]);
      const int64_t b = t - D;
      if (b >= 0 && b < count) {
        const Shard& shard = shard_at(idx[b]);
        const uint32_t row = CandidateRow(shard, hashes[idx[b]]);
        candidates[b % D] = row;
        if (row != RowSlab::kInvalidRow) PrefetchSpan<0>(shard.rows.Row(row), stride_);
        ahead(b);
      }
    }
  }
  template <typename Visit>
  void PipelinedLoop(const Shard& shard, const uint64_t* hashes, const uint32_t* idx,
                     int64_t count, Visit&& visit) const {
    PipelinedLoop(shard, hashes, idx, count, [](int64_t) {}, std::forward<Visit>(visit));
  }

  // Prefetches the cache lines of [p, p + bytes), at most kMaxPrefetchLines
  // of them (rw: 0 to read, 1 to write).
  template <int rw>
  static void PrefetchSpan(const void* p, size_t bytes) {
    const uintptr_t first = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{63};
    const uintptr_t last = reinterpret_cast<uintptr_t>(p) + bytes - 1;
    int lines = 0;
    for (uintptr_t a = first; a <= last && lines < kMaxPrefetchLines; a += 64, ++lines) {
      __builtin_prefetch(reinterpret_cast<const void*>(a), rw);
    }
  }

  // Finds the keys idx[0..count) (shard_at(i): batch index i's shard, whose
  // reader lock the caller holds) into `out` and `exists`.
  template <typename ShardAt>
  void FindKeys(ShardAt&& shard_at, const uint64_t* hashes, const uint32_t* idx,
                int64_t count, const In* keys, char* out, bool* exists, const char* defaults,
                bool default_per_key, const ScoreContext* touch) const {
    uint64_t misses = 0;
    const auto ahead = [&](int64_t b) {
      PrefetchSpan<1>(out + static_cast<size_t>(idx[b]) * value_bytes_, value_bytes_);
    };
    PipelinedLoopAt(shard_at, hashes, idx, count, ahead, [&](int64_t p, uint32_t row) {
      const uint32_t i = idx[p];
      const Shard& shard = shard_at(i);
      if (row != RowSlab::kInvalidRow && !Traits::Equal(shard.rows.Row(row), keys[i])) {
        // Another key shares the 32 hash bits: take the exact path.
        row = SlotRow(shard.slots[FindPosition(shard, hashes[i], keys[i])]);
      }
      char* dst = out + static_cast<size_t>(i) * value_bytes_;
      if (row != RowSlab::kInvalidRow) {
        char* r = shard.rows.Row(row);
        CopyValues(dst, r + value_offset_);
        if (touch != nullptr) SetScore(r, touch->Score(i, true, AtomicLoadScore(r + score_offset_)));
        if (exists != nullptr) exists[i] = true;
      } else {
        CopyValues(dst, defaults + (default_per_key ? static_cast<size_t>(i) * value_bytes_ : 0));
        if (exists != nullptr) exists[i] = false;
        ++misses;
      }
    });
    lookups_.fetch_add(static_cast<uint64_t>(count), std::memory_order_relaxed);
    misses_.fetch_add(misses, std::memory_order_relaxed);
  }

  // Copies one value row. The common row sizes get a copy of constant size,
  // which the compiler inlines as a few vector moves: a call to memcpy with a
  // runtime size costs more than the copy of a 32-byte row itself.
  void CopyValues(char* dst, const char* src) const {
    switch (value_bytes_) {
      case 16: std::memcpy(dst, src, 16); return;
      case 32: std::memcpy(dst, src, 32); return;
      case 64: std::memcpy(dst, src, 64); return;
      case 128: std::memcpy(dst, src, 128); return;
      case 256: std::memcpy(dst, src, 256); return;
      case 512: std::memcpy(dst, src, 512); return;
      default: std::memcpy(dst, src, value_bytes_); return;
    }
  }

  // Publishes a writing pass, before its shard lock is released.
  void Publish(WritePass& pass) {
    const PassCounters& pc = pass.pc;
    if (pc.inserts) inserts_.fetch_add(pc.inserts, std::memory_order_relaxed);
    if (pc.updates) updates_.fetch_add(pc.updates, std::memory_order_relaxed);
    if (pc.removes) removes_.fetch_add(pc.removes, std::memory_order_relaxed);
    if (pc.evictions) evictions_.fetch_add(pc.evictions, std::memory_order_relaxed);
    // size_ never exceeds reserved_: the pass's new keys were reserved before
    // it counts them here, and removals leave the budget only after size_.
    if (pass.size_delta != 0) size_.fetch_add(pass.size_delta, std::memory_order_relaxed);
    if (bounded_ && pass.stash + pass.released != 0) {
      reserved_.fetch_sub(pass.stash + pass.released, std::memory_order_relaxed);
    }
    pass.stash = 0;
    pass.released = 0;
  }

  void WriteKey(ExportSink* sink, void* keys, int64_t i, const char* row) const {
    if constexpr (Traits::kTrivial) {
      if (keys != nullptr) static_cast<K*>(keys)[i] = Traits::View(row);
    } else {
      sink->SetStringKey(i, Traits::View(row));
    }
  }

  void DestroyKeys(Shard& shard) {
    if constexpr (!Traits::kTrivial) {
      for (uint64_t pos = 0; pos < shard.num_slots; ++pos) {
        const uint64_t slot = shard.slots[pos];
        if (!SlotEmpty(slot)) Traits::Destroy(shard.rows.Row(SlotRow(slot)));
      }
    }
  }

  // Heap bytes owned by string keys longer than the small-string buffer.
  int64_t StringHeapBytes(const Shard& shard) const {
    int64_t bytes = 0;
    if constexpr (!Traits::kTrivial) {
      for (uint64_t pos = 0; pos < shard.num_slots; ++pos) {
        const uint64_t slot = shard.slots[pos];
        if (SlotEmpty(slot)) continue;
        const auto* key = reinterpret_cast<const std::string*>(shard.rows.Row(SlotRow(slot)));
        if (key->capacity() > 15) bytes += static_cast<int64_t>(key->capacity() + 1);
      }
    }
    return bytes;
  }

  // Locks every shard in ascending order (the only order used anywhere, so
  // two whole-table operations cannot deadlock).
  template <template <typename> class Lock>
  std::vector<Lock<std::shared_mutex>> LockAll() const {
    std::vector<Lock<std::shared_mutex>> locks;
    locks.reserve(kNumShards);
    for (int s = 0; s < kNumShards; ++s) locks.emplace_back(shards_[s].mu);
    return locks;
  }

  const TableOptions options_;
  const size_t value_bytes_;
  const AddRowFn add_row_;
  const bool bounded_;  // max_capacity > 0
  const bool tracking_;  // options.track_changes: marks, tombstones, the write gate
  const bool stamped_;   // rows carry an age (bounded_ || tracking_)
  size_t score_offset_ = 0;
  size_t age_offset_ = 0;  // bounded tables only
  size_t value_offset_ = 0;
  size_t stride_ = 0;
  // The shards' big row chunks and slot arrays (huge pages). Declared before
  // shards_ so they outlive every row and slot array.
  ChunkArena chunk_arena_;
  SlotArrayPool slot_pool_;
  std::unique_ptr<Shard[]> shards_;
  // Per shard, the keys removed or evicted (change tracking; guarded by the
  // shard's lock), in the order they went.
  std::unique_ptr<std::vector<Tombstone>[]> tombstones_;
  // Change tracking: the epoch (a new one at each Clear), tombstones with
  // stamps below lost_below_ may have been dropped, and the write gate
  // (writers_ counts batches in flight; Mark sets marking_ and waits).
  std::atomic<uint64_t> epoch_;
  std::atomic<uint64_t> lost_below_{0};
  std::atomic<int64_t> writers_{0};
  std::atomic<bool> marking_{false};
  std::mutex mark_mu_;

  // Keys in the table, as published by finished passes (Size()).
  std::atomic<int64_t> size_{0};
  // Bounded tables: keys plus the budget passes have reserved and not yet
  // used or returned; never above max_capacity.
  std::atomic<int64_t> reserved_{0};
  // Bounded tables: rows written so far (the next batch's first age).
  std::atomic<uint64_t> rows_written_{0};
  // Per shard, a lower bound of its lowest (score, age) (kNoEntryKey if
  // empty), read without the shard's lock to pick eviction victims. Apart
  // from the shard structs so reading them does not touch contended lock words.
  std::array<std::atomic<uint64_t>, kNumShards> hint_score_;
  std::array<std::atomic<uint64_t>, kNumShards> hint_age_;

  std::atomic<uint64_t> clock_{0};
  std::atomic<uint64_t> insert_batches_{0};
  std::atomic<uint64_t> epoch_floor_{0};
  mutable std::atomic<uint64_t> inserts_{0}, updates_{0}, lookups_{0}, misses_{0}, removes_{0},
      evictions_{0};
};

}  // namespace

std::unique_ptr<Table> NewCpuTable(const TableOptions& options, Status* status) {
  *status = options.Validate();
  if (!status->ok()) return nullptr;
  // A new table writes its slot arrays for init_capacity at once: more than
  // the machine's memory would have the process killed, not an error raised.
  const long pages = sysconf(_SC_PHYS_PAGES), page_bytes = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page_bytes > 0) {
    const uint64_t memory = static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_bytes);
    const uint64_t shard_slots = InitialShardSlotsFor(options.init_capacity);
    if (shard_slots > memory / (kNumShards * sizeof(uint64_t))) {
      *status = InvalidArgument(
          "init_capacity " + std::to_string(options.init_capacity) + " needs " +
          std::to_string((shard_slots >> 20) * kNumShards * sizeof(uint64_t)) +
          " MiB of slot arrays at once, more than this machine's " +
          std::to_string(memory >> 20) + " MiB of memory; a table grows as keys arrive, " +
          "so a smaller init_capacity loses nothing");
      return nullptr;
    }
  }
  try {
    switch (options.key_type) {
      case KeyType::kInt32: return std::make_unique<CpuTable<int32_t>>(options);
      case KeyType::kInt64: return std::make_unique<CpuTable<int64_t>>(options);
      case KeyType::kString: return std::make_unique<CpuTable<std::string>>(options);
    }
  } catch (const std::bad_alloc&) {
    *status = kOutOfMemory;
    return nullptr;
  }
  *status = InvalidArgument("unknown key type");
  return nullptr;
}

}  // namespace dynemb
