// The CPU implementation of dynemb::Table. The design (sharding, slot layout,
// row slab, locking, scores) is described at the top of cc/core/table.h.

#include <algorithm>
#include <array>
#include <atomic>
#include <bitset>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cc/core/cpu/row_slab.h"
#include "cc/core/hash.h"
#include "cc/core/table.h"
#include "cc/core/value_ops.h"

namespace dynemb {
namespace {

constexpr int kShardBits = 8;
constexpr int kNumShards = 1 << kShardBits;
constexpr uint64_t kMinShardSlots = 8;
// Batches below this many keys run on the calling thread: handing a few
// hundred keys to a thread pool costs more than it saves.
constexpr int64_t kParallelMinKeys = 4096;
// How far ahead of use the batch loops prefetch.
constexpr int64_t kPrefetchDistance = 8;
// A shard's min-score hint when it has no entry (or only entries scored
// UINT64_MAX, which then rank last, as they should).
constexpr uint64_t kNoEntryHint = ~uint64_t{0};
// try_lock attempts on a lower-index shard before eviction looks elsewhere
// (blocking there could deadlock; see "Locking" in table.h).
constexpr int kEvictLockTries = 4;
// Attempts to find room for a new key in a full table whose budget is all
// reserved by other threads' passes, before the key is turned away.
constexpr int kNoVictimRetries = 16;

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

// An entry of a shard's eviction heap (bounded tables). Lazy: the score is
// the row's score when the entry was pushed. Scores only rise outside the
// writer's lock (a Find refreshing LRU scores), and a writer that lowers a
// score pushes a new entry, so every live row has an entry whose score is at
// most its current score; an entry whose row died or whose score moved is
// dropped or re-pushed when it reaches the top (ValidateTop).
struct HeapEntry {
  uint64_t score;
  uint32_t hash32;  // the slot's hash bits: finds the row's slot, and breaks ties
  uint32_t row;
};

// Min-heap order: the lowest (score, hash32) on top. Ties by hash rather
// than by age, so the choice depends only on the content (keys and scores):
// a table restored from a checkpoint evicts what the saved one would have.
struct HeapAfter {
  bool operator()(const HeapEntry& a, const HeapEntry& b) const {
    return a.score != b.score ? a.score > b.score : a.hash32 > b.hash32;
  }
};

struct alignas(64) Shard {
  mutable std::shared_mutex mu;
  std::unique_ptr<uint64_t[]> slots;
  uint64_t num_slots = 0;  // a power of two
  std::atomic<int64_t> size{0};
  RowSlab rows;
  // Bounded tables: built the first time the shard is asked for a victim
  // (so tables that never fill never pay for it), then kept up to date.
  std::vector<HeapEntry> heap;
  bool heap_built = false;

  uint64_t mask() const { return num_slots - 1; }
  // Keep the load factor at or below 3/4: linear probing stays short.
  bool NeedsGrowthFor(int64_t keys) const {
    return static_cast<uint64_t>(keys) * 4 > num_slots * 3;
  }
  void ResetSlots(uint64_t n) {
    slots.reset(new uint64_t[n]);
    std::fill_n(slots.get(), n, kEmptySlot);
    num_slots = n;
  }
};

// A batch hashed once and grouped by shard: order[begin[s] .. begin[s+1]) are
// the batch indices of the keys of shard s, in batch order (counting sort is
// stable), which is what makes duplicate keys behave sequentially.
struct BatchPlan {
  std::vector<uint64_t> hashes;
  std::vector<uint32_t> order;
  std::array<uint32_t, kNumShards + 1> begin;
};

// Per-batch score state (see EvictStrategy in table.h).
struct ScoreContext {
  EvictStrategy strategy;
  uint64_t clock;
  uint64_t epoch;
  const uint64_t* explicit_scores;  // nullable

  uint64_t Score(int64_t i, bool existed, uint64_t old) const {
    if (explicit_scores != nullptr) return explicit_scores[i];
    switch (strategy) {
      case EvictStrategy::kLru:
        return clock;
      case EvictStrategy::kLfu:
        // Saturates: an imported UINT64_MAX must not wrap to the lowest score.
        return existed ? (old == ~uint64_t{0} ? old : old + 1) : 1;
      case EvictStrategy::kEpochLru:
        // The clock saturates in the low 32 bits rather than wrapping below
        // older scores of the same epoch.
        return (epoch << 32) | std::min<uint64_t>(clock, 0xffffffffu);
      case EvictStrategy::kEpochLfu: {
        if (existed && (old >> 32) == epoch) {
          uint64_t freq = old & 0xffffffffu;
          return (epoch << 32) | (freq == 0xffffffffu ? freq : freq + 1);
        }
        return (epoch << 32) | 1;
      }
      case EvictStrategy::kCustomized:
        return existed ? old : 0;
    }
    return 0;
  }
};

// Counters a shard pass collects locally and publishes once.
struct PassCounters {
  uint64_t inserts = 0, updates = 0, lookups = 0, misses = 0, removes = 0, evictions = 0;
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
  // Eviction: a lower bound of the other shards' hints, from the last scan.
  // It stays one during the pass: the pass only raises other shards' hints
  // (by evicting from them), so a row whose own shard's minimum is at or
  // below it needs no new scan. (Other threads may lower hints meanwhile;
  // under concurrency eviction is approximate anyway.)
  uint64_t others_min = 0;
  bool others_min_known = false;
};

// What a writer did with one row: an error, or deferred to the second round.
struct RowResult {
  Status status;
  bool deferred = false;
};

// What making room for a new key in a bounded table did.
enum class Room {
  kFree,             // a reserved unit of the budget was free
  kEvictedHere,      // an entry of the key's own shard was evicted (slots moved)
  kEvictedElsewhere, // an entry of another shard was evicted
  kTurnedAway,       // the new key had the lowest score: it is not inserted
};

// The entry chosen for eviction: its shard, slot position and score.
struct Victim {
  int shard = -1;
  uint64_t pos = 0;
  uint64_t score = 0;
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
        shards_(new Shard[kNumShards]) {
    score_offset_ = RoundUp8(sizeof(typename Traits::Stored));
    value_offset_ = score_offset_ + sizeof(uint64_t);
    stride_ = RoundUp8(value_offset_ + value_bytes_);
    for (int s = 0; s < kNumShards; ++s) {
      shards_[s].rows.Init(stride_);
      shards_[s].ResetSlots(InitialShardSlots());
      min_hint_[s].store(kNoEntryHint, std::memory_order_relaxed);
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
               shards_[s].heap.capacity() * sizeof(HeapEntry);
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

  Status Find(const void* keys, int64_t n, void* values, bool* exists, const void* defaults,
              bool default_per_key, const Runner& runner) override {
    if (n == 0) return Status::Ok();
    DYNEMB_RETURN_IF_ERROR(CheckBatch(keys, n, values, "values"));
    if (defaults == nullptr) return InvalidArgument("Find: defaults must not be null");
    const In* in = static_cast<const In*>(keys);
    BatchPlan plan;
    BuildPlan(in, n, runner, &plan);
    const bool touch = options_.find_updates_scores &&
                       (options_.strategy == EvictStrategy::kLru ||
                        options_.strategy == EvictStrategy::kEpochLru);
    ScoreContext ctx{options_.strategy, touch ? NextClock() : 0, CurrentEpoch(), nullptr};
    char* out = static_cast<char*>(values);
    const char* def = static_cast<const char*>(defaults);
    return ForEachShard(plan, n, runner,
                        [&](int, Shard& shard, const uint32_t* idx, int64_t count) {
                          std::shared_lock<std::shared_mutex> lock(shard.mu);
                          FindInShard(shard, plan.hashes.data(), idx, count, in, out, exists,
                                      def, default_per_key, touch ? &ctx : nullptr);
                          return Status::Ok();
                        });
  }

  Status InsertAndEvict(const void* keys, int64_t n, const void* values, const uint64_t* scores,
                        EvictedEntries* evicted, const Runner& runner) override {
    if (evicted != nullptr) evicted->count = 0;
    if (n == 0) return Status::Ok();
    DYNEMB_RETURN_IF_ERROR(CheckBatch(keys, n, values, "values"));
    const In* in = static_cast<const In*>(keys);
    BatchPlan plan;
    BuildPlan(in, n, runner, &plan);
    ScoreContext ctx = WriteScoreContext(scores, n, /*is_insert=*/true);
    const char* src = static_cast<const char*>(values);
    EvictedWriter out(evicted, value_bytes_);
    Status result = WriteBatch(
        plan, n, runner,
        [&](WritePass& pass, Shard& shard, uint32_t i, int64_t rows_left, bool defer) {
          const uint64_t hash = plan.hashes[i];
          const char* value = src + i * value_bytes_;
          const uint64_t pos = FindPosition(shard, hash, in[i]);
          const uint64_t slot = shard.slots[pos];
          if (!SlotEmpty(slot)) {
            char* r = shard.rows.Row(SlotRow(slot));
            std::memcpy(r + value_offset_, value, value_bytes_);
            const uint64_t old = AtomicLoadScore(r + score_offset_);
            Rescore(pass.shard, SlotRow(slot), SlotHash(slot), old, ctx.Score(i, true, old));
            ++pass.pc.updates;
            return RowResult{};
          }
          if (defer) return RowResult{Status::Ok(), true};
          return RowResult{InsertNew(pass, rows_left, hash, in[i], pos, value,
                                     ctx.Score(i, false, 0), &out),
                           false};
        });
    if (evicted != nullptr) evicted->count = out.count();
    return result;
  }

  Status Accum(const void* keys, int64_t n, const void* deltas, const bool* exists,
               const Runner& runner) override {
    if (n == 0) return Status::Ok();
    DYNEMB_RETURN_IF_ERROR(CheckBatch(keys, n, deltas, "deltas"));
    if (exists == nullptr) return InvalidArgument("Accum: exists must not be null");
    const In* in = static_cast<const In*>(keys);
    BatchPlan plan;
    BuildPlan(in, n, runner, &plan);
    ScoreContext ctx = WriteScoreContext(nullptr, n, /*is_insert=*/false);
    const char* src = static_cast<const char*>(deltas);
    EvictedWriter out(nullptr, value_bytes_);
    return WriteBatch(
        plan, n, runner,
        [&](WritePass& pass, Shard& shard, uint32_t i, int64_t rows_left, bool defer) {
          const uint64_t hash = plan.hashes[i];
          const char* delta = src + i * value_bytes_;
          const uint64_t pos = FindPosition(shard, hash, in[i]);
          const uint64_t slot = shard.slots[pos];
          if (!SlotEmpty(slot)) {
            if (exists[i]) {
              char* r = shard.rows.Row(SlotRow(slot));
              add_row_(r + value_offset_, delta, options_.dim);
              const uint64_t old = AtomicLoadScore(r + score_offset_);
              Rescore(pass.shard, SlotRow(slot), SlotHash(slot), old, ctx.Score(i, true, old));
              ++pass.pc.updates;
            }
            return RowResult{};
          }
          // Absent: deferred whatever exists[i] says, so that all rows of a
          // key stay in one round, in batch order.
          if (defer) return RowResult{Status::Ok(), true};
          if (exists[i]) return RowResult{};
          return RowResult{InsertNew(pass, rows_left, hash, in[i], pos, delta,
                                     ctx.Score(i, false, 0), &out),
                           false};
        });
  }

  Status Remove(const void* keys, int64_t n, const Runner& runner) override {
    if (n == 0) return Status::Ok();
    DYNEMB_RETURN_IF_ERROR(CheckBatch(keys, n, keys, "keys"));
    const In* in = static_cast<const In*>(keys);
    BatchPlan plan;
    BuildPlan(in, n, runner, &plan);
    return ForEachShard(
        plan, n, runner, [&](int s, Shard& shard, const uint32_t* idx, int64_t count) {
          std::unique_lock<std::shared_mutex> lock(shard.mu);
          WritePass pass(s);
          PipelinedLoop(shard, plan.hashes.data(), idx, count, [&](int64_t p, uint32_t) {
            const uint32_t i = idx[p];
            const uint64_t pos = FindPosition(shard, plan.hashes[i], in[i]);
            if (SlotEmpty(shard.slots[pos])) return;
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
    std::vector<std::unique_lock<std::shared_mutex>> locks = LockAll<std::unique_lock>();
    int64_t removed = 0;
    for (int s = 0; s < kNumShards; ++s) {
      Shard& shard = shards_[s];
      removed += shard.size.load(std::memory_order_relaxed);
      DestroyKeys(shard);
      shard.rows.Reset();
      shard.ResetSlots(InitialShardSlots());
      shard.size.store(0, std::memory_order_relaxed);
      shard.heap.clear();
      shard.heap.shrink_to_fit();
      shard.heap_built = false;
      min_hint_[s].store(kNoEntryHint, std::memory_order_relaxed);
    }
    // Subtract rather than store 0: with every lock held no pass is running,
    // but the order of the two counters must stay size_ <= reserved_.
    size_.fetch_sub(removed, std::memory_order_relaxed);
    if (bounded_) reserved_.fetch_sub(removed, std::memory_order_relaxed);
  }

  Status Export(ExportSink* sink) override {
    std::vector<std::shared_lock<std::shared_mutex>> locks = LockAll<std::shared_lock>();
    int64_t n = 0;
    for (int s = 0; s < kNumShards; ++s) n += shards_[s].size.load(std::memory_order_relaxed);
    void* keys = nullptr;
    void* values = nullptr;
    uint64_t* scores = nullptr;
    DYNEMB_RETURN_IF_ERROR(sink->Allocate(n, &keys, &values, &scores));
    int64_t i = 0;
    for (int s = 0; s < kNumShards; ++s) {
      const Shard& shard = shards_[s];
      for (uint64_t pos = 0; pos < shard.num_slots; ++pos) {
        const uint64_t slot = shard.slots[pos];
        if (SlotEmpty(slot)) continue;
        const char* r = shard.rows.Row(SlotRow(slot));
        WriteKey(sink, keys, i, r);
        if (values != nullptr) {
          std::memcpy(static_cast<char*>(values) + i * value_bytes_, r + value_offset_,
                      value_bytes_);
        }
        if (scores != nullptr) scores[i] = AtomicLoadScore(r + score_offset_);
        ++i;
      }
    }
    return Status::Ok();
  }

  Status ExportChunks(int64_t chunk_rows, const ChunkSink& sink) override {
    if (chunk_rows < 1) {
      return InvalidArgument("chunk_rows must be >= 1, got " + std::to_string(chunk_rows));
    }
    std::vector<In> keys;
    std::vector<char> values;
    std::vector<uint64_t> scores;
    for (int s = 0; s < kNumShards; ++s) {
      const Shard& shard = shards_[s];
      std::shared_lock<std::shared_mutex> lock(shard.mu);
      const size_t cap = static_cast<size_t>(
          std::min<int64_t>(chunk_rows, shard.size.load(std::memory_order_relaxed)));
      keys.clear();
      keys.reserve(cap);
      values.resize(cap * value_bytes_);
      scores.clear();
      scores.reserve(cap);
      // String keys are viewed in place: the shard lock keeps them alive
      // until the sink returns.
      auto flush = [&]() -> Status {
        if (keys.empty()) return Status::Ok();
        Status status = sink(keys.data(), static_cast<int64_t>(keys.size()), values.data(),
                             scores.data());
        keys.clear();
        scores.clear();
        return status;
      };
      for (uint64_t pos = 0; pos < shard.num_slots; ++pos) {
        const uint64_t slot = shard.slots[pos];
        if (SlotEmpty(slot)) continue;
        const char* r = shard.rows.Row(SlotRow(slot));
        std::memcpy(values.data() + keys.size() * value_bytes_, r + value_offset_, value_bytes_);
        keys.push_back(Traits::View(r));
        scores.push_back(AtomicLoadScore(r + score_offset_));
        if (keys.size() == cap) DYNEMB_RETURN_IF_ERROR(flush());
      }
      DYNEMB_RETURN_IF_ERROR(flush());
    }
    return Status::Ok();
  }

 private:
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

  uint64_t InitialShardSlots() const {
    const int64_t per_shard = (options_.init_capacity + kNumShards - 1) / kNumShards;
    uint64_t slots = kMinShardSlots;
    while (static_cast<uint64_t>(per_shard) * 4 > slots * 3) slots *= 2;
    return slots;
  }

  Status CheckBatch(const void* keys, int64_t n, const void* data, const char* what) const {
    if (n < 0 || n > int64_t{0xffffffff}) {
      return InvalidArgument("batch size must be in [0, 2^32), got " + std::to_string(n));
    }
    if (keys == nullptr || data == nullptr) {
      return InvalidArgument(std::string("keys and ") + what + " must not be null");
    }
    return Status::Ok();
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

  void BuildPlan(const In* keys, int64_t n, const Runner& runner, BatchPlan* plan) const {
    plan->hashes.resize(n);
    uint64_t* hashes = plan->hashes.data();
    auto hash_range = [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hashes[i] = HashKey(keys[i]);
    };
    if (n < kParallelMinKeys) {
      hash_range(0, n);
    } else {
      runner.ParallelFor(n, Traits::kTrivial ? 20 : 100, hash_range);
    }
    std::array<uint32_t, kNumShards + 1> counts{};
    for (int64_t i = 0; i < n; ++i) ++counts[ShardOf(hashes[i]) + 1];
    for (int s = 0; s < kNumShards; ++s) counts[s + 1] += counts[s];
    plan->begin = counts;
    plan->order.resize(n);
    for (int64_t i = 0; i < n; ++i) plan->order[counts[ShardOf(hashes[i])]++] = static_cast<uint32_t>(i);
  }

  // Runs fn(shard index, shard, indices, count) for every shard the batch
  // touches, shards in parallel. Returns the first error.
  template <typename Fn>
  Status ForEachShard(const BatchPlan& plan, int64_t n, const Runner& runner, Fn&& fn) {
    return ForEachShard(plan.begin, plan.order.data(), n, runner, std::forward<Fn>(fn));
  }

  // The same over the n batch indices order[begin[s] .. begin[s + 1]) of
  // each shard s.
  template <typename Fn>
  Status ForEachShard(const std::array<uint32_t, kNumShards + 1>& begin, const uint32_t* order,
                      int64_t n, const Runner& runner, Fn&& fn) {
    std::mutex error_mu;
    Status first_error;
    auto run = [&](int64_t first, int64_t last) {
      for (int64_t s = first; s < last; ++s) {
        const uint32_t b = begin[s], e = begin[s + 1];
        if (b == e) continue;
        Status status =
            fn(static_cast<int>(s), shards_[s], order + b, static_cast<int64_t>(e - b));
        if (!status.ok()) {
          std::lock_guard<std::mutex> lock(error_mu);
          if (first_error.ok()) first_error = status;
        }
      }
    };
    if (n < kParallelMinKeys) {
      run(0, kNumShards);
    } else {
      const int64_t keys_per_shard = n / kNumShards + 1;
      runner.ParallelFor(kNumShards, keys_per_shard * 200, run);
    }
    return first_error;
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

  // Applies a writing batch: apply(pass, shard, i, rows_left, defer) for
  // every batch index i, shards in parallel, each under its exclusive lock,
  // rows of a shard in batch order. `rows_left` counts the shard's rows from
  // this one on (MakeRoom reserves for them in bulk).
  //
  // When the batch may fill a bounded table it runs in two rounds: first the
  // rows whose key is present (apply returns deferred for the others), then
  // the deferred rows. So the new keys' evictions find the batch's existing
  // keys already rescored, and do not evict a key a later row of the same
  // batch updates. A key is present for all of its rows in round one or
  // absent for all (round one inserts nothing), so each key's rows still
  // apply in batch order.
  template <typename Apply>
  Status WriteBatch(const BatchPlan& plan, int64_t n, const Runner& runner, Apply&& apply) {
    const bool two_rounds =
        bounded_ && reserved_.load(std::memory_order_relaxed) + n > options_.max_capacity;
    std::vector<uint32_t> deferred(two_rounds ? n : 0);
    std::array<uint32_t, kNumShards> num_deferred{};
    const auto round = [&](const std::array<uint32_t, kNumShards + 1>& begin,
                           const uint32_t* order, int64_t rows, bool defer) {
      return ForEachShard(
          begin, order, rows, runner, [&](int s, Shard& shard, const uint32_t* idx, int64_t count) {
            std::unique_lock<std::shared_mutex> lock(shard.mu);
            WritePass pass(s);
            Status status;
            uint32_t* out = defer ? deferred.data() + begin[s] : nullptr;
            uint32_t d = 0;
            PipelinedLoop(shard, plan.hashes.data(), idx, count, [&](int64_t p, uint32_t) {
              if (!status.ok()) return;
              RowResult r = apply(pass, shard, idx[p], count - p, defer);
              if (!r.status.ok()) status = std::move(r.status);
              if (r.deferred) out[d++] = idx[p];
            });
            if (defer) num_deferred[s] = d;
            Publish(pass);
            return status;
          });
    };
    DYNEMB_RETURN_IF_ERROR(round(plan.begin, plan.order.data(), n, two_rounds));
    if (!two_rounds) return Status::Ok();
    // Compact each shard's deferred rows to the front (never overtaking).
    std::array<uint32_t, kNumShards + 1> begin;
    begin[0] = 0;
    for (int s = 0; s < kNumShards; ++s) {
      std::memmove(deferred.data() + begin[s], deferred.data() + plan.begin[s],
                   num_deferred[s] * sizeof(uint32_t));
      begin[s + 1] = begin[s] + num_deferred[s];
    }
    return round(begin, deferred.data(), begin[kNumShards], false);
  }

  // Inserts `key`, absent from shard pass.shard (locked; its probe ended at
  // `pos`), with `value` and `score`. In a bounded table it first makes room
  // (MakeRoom), which may evict an entry or turn the key away.
  Status InsertNew(WritePass& pass, int64_t rows_left, uint64_t hash, In key, uint64_t pos,
                   const char* value, uint64_t score, EvictedWriter* out) {
    Shard& shard = shards_[pass.shard];
    Room room = Room::kFree;
    if (bounded_) {
      room = MakeRoom(pass, rows_left, key, value, score, out);
      if (room == Room::kTurnedAway) return Status::Ok();
      // Evicting from this shard shifted its slots.
      if (room == Room::kEvictedHere) pos = FindPosition(shard, hash, key);
    }
    const int64_t size = shard.size.load(std::memory_order_relaxed);
    if (shard.NeedsGrowthFor(size + 1)) {
      Grow(shard);
      pos = FindPosition(shard, hash, key);
    }
    uint32_t row = 0;
    if (!shard.rows.Allocate(&row)) {
      if (room == Room::kFree) {
        ++pass.stash;  // the reserved unit was not used
      } else {         // an entry was evicted for nothing: its unit is free
        --pass.size_delta;
        ++pass.released;
      }
      return Status(StatusCode::kResourceExhausted,
                    "a table shard ran out of row indices (2^32 - 1 keys per shard)");
    }
    char* r = shard.rows.Row(row);
    Traits::Construct(r, key);
    std::memcpy(r + value_offset_, value, value_bytes_);
    SetScore(r, score);
    shard.slots[pos] = MakeSlot(static_cast<uint32_t>(hash), row);
    shard.size.store(size + 1, std::memory_order_relaxed);
    ++pass.pc.inserts;
    // An eviction made room: the table's size is unchanged.
    if (room == Room::kFree) ++pass.size_delta;
    if (bounded_) OnNewScore(pass.shard, row, static_cast<uint32_t>(hash), score);
    return Status::Ok();
  }

  // A writer changed the score of an existing row from `old` to `score`.
  void Rescore(int s, uint32_t row, uint32_t hash32, uint64_t old, uint64_t score) {
    SetScore(shards_[s].rows.Row(row), score);
    // Rising scores leave the row's heap entry valid as a lower bound (it is
    // re-pushed lazily); a lowered score needs an entry of its own.
    if (bounded_ && score < old) OnNewScore(s, row, hash32, score);
  }

  // Keeps the eviction heap and the shard's min-score hint in step with a
  // row that got a new (or lower) score.
  void OnNewScore(int s, uint32_t row, uint32_t hash32, uint64_t score) {
    Shard& shard = shards_[s];
    if (score < min_hint_[s].load(std::memory_order_relaxed)) {
      min_hint_[s].store(score, std::memory_order_relaxed);
    }
    if (!shard.heap_built) return;  // BuildHeap will read the row
    // Grow by a quarter rather than double: the heap holds ~1 entry per key
    // (16 bytes), and a full table's shards drift only a little in size.
    if (shard.heap.size() == shard.heap.capacity()) {
      shard.heap.reserve(shard.heap.size() + shard.heap.size() / 4 + 16);
    }
    shard.heap.push_back(HeapEntry{score, hash32, row});
    std::push_heap(shard.heap.begin(), shard.heap.end(), HeapAfter());
    // Dead and re-scored entries accumulate; rebuilding from the live rows
    // keeps the heap within ~2 entries per key.
    const auto live = static_cast<size_t>(shard.size.load(std::memory_order_relaxed));
    if (shard.heap.size() > 2 * live + 64) BuildHeap(shard);
  }

  void BuildHeap(Shard& shard) {
    shard.heap.clear();
    shard.heap.reserve(static_cast<size_t>(shard.size.load(std::memory_order_relaxed)) + 16);
    for (uint64_t pos = 0; pos < shard.num_slots; ++pos) {
      const uint64_t slot = shard.slots[pos];
      if (SlotEmpty(slot)) continue;
      const char* r = shard.rows.Row(SlotRow(slot));
      shard.heap.push_back(HeapEntry{AtomicLoadScore(r + score_offset_), SlotHash(slot),
                                     SlotRow(slot)});
    }
    std::make_heap(shard.heap.begin(), shard.heap.end(), HeapAfter());
    shard.heap_built = true;
  }

  // The slot that holds `row` (whose slot hash is `hash32`), or kEmptySlot
  // when the row is no longer in the shard.
  static uint64_t SlotOfRow(const Shard& shard, uint32_t hash32, uint32_t row) {
    const uint64_t mask = shard.mask();
    for (uint64_t pos = hash32 & mask;; pos = (pos + 1) & mask) {
      const uint64_t slot = shard.slots[pos];
      if (SlotEmpty(slot)) return kEmptySlot;
      if (SlotRow(slot) == row && SlotHash(slot) == hash32) return pos;
    }
  }

  // Brings shard s's lowest (score, hash) live entry to the top of its heap
  // (building the heap on first use) and publishes its score as the shard's
  // hint, now exact. The caller holds the shard's exclusive lock. Returns
  // false when the shard is empty.
  bool ValidateTop(int s, Victim* top) {
    Shard& shard = shards_[s];
    if (!shard.heap_built) BuildHeap(shard);
    std::vector<HeapEntry>& heap = shard.heap;
    while (!heap.empty()) {
      const HeapEntry e = heap.front();
      const uint64_t pos = SlotOfRow(shard, e.hash32, e.row);
      const uint64_t score =
          pos == kEmptySlot ? 0 : AtomicLoadScore(shard.rows.Row(e.row) + score_offset_);
      if (pos == kEmptySlot || score != e.score) {
        std::pop_heap(heap.begin(), heap.end(), HeapAfter());
        if (pos == kEmptySlot) {  // evicted or removed since it was pushed
          heap.pop_back();
        } else {  // the score moved: re-rank the row and look again
          heap.back().score = score;
          std::push_heap(heap.begin(), heap.end(), HeapAfter());
        }
        continue;
      }
      // `e` stays on top, where EvictAt expects it.
      top->shard = s;
      top->pos = pos;
      top->score = score;
      min_hint_[s].store(score, std::memory_order_relaxed);
      return true;
    }
    min_hint_[s].store(kNoEntryHint, std::memory_order_relaxed);
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

  // Finds the entry with the lowest score in the table for a new key of
  // shard s (whose lock the caller holds). Among equal scores it prefers
  // shard s (no second lock), then the lowest shard index; within a shard the
  // lowest hash. Shards are visited in the order of their hints, which are
  // lower bounds of their minimum scores: once no unvisited hint can beat the
  // best entry found, that entry is the global minimum. `*victim_lock` holds
  // the victim's shard lock when it is not s. Returns false if no entry was
  // found (the table's budget is all reserved by passes still inserting).
  bool FindVictim(WritePass& pass, Victim* best, std::unique_lock<std::shared_mutex>* victim_lock) {
    const int s = pass.shard;
    const auto before = [s](uint64_t score_a, int a, uint64_t score_b, int b) {
      if (score_a != score_b) return score_a < score_b;
      if ((a == s) != (b == s)) return a == s;
      return a < b;
    };
    bool found = ValidateTop(s, best);
    best->shard = s;
    // Own shard first among equal scores: at or below every other hint, it wins.
    if (found && pass.others_min_known && best->score <= pass.others_min) return true;
    std::bitset<kNumShards> visited;
    visited.set(s);
    for (bool first = true;; first = false) {
      int t = -1;
      uint64_t hint = kNoEntryHint;
      for (int u = 0; u < kNumShards; ++u) {
        if (visited[u]) continue;
        const uint64_t h = min_hint_[u].load(std::memory_order_relaxed);
        if (t < 0 || h < hint) {
          t = u;
          hint = h;
        }
      }
      if (first) {  // every shard but s was a candidate: the min over the others
        pass.others_min = hint;
        pass.others_min_known = true;
      }
      if (t < 0 || (found && !before(hint, t, best->score, best->shard))) break;
      visited.set(t);
      std::unique_lock<std::shared_mutex> lock = LockForEviction(t, std::max(s, best->shard));
      if (!lock.owns_lock()) continue;  // busy: approximate rather than wait
      Victim candidate;
      if (!ValidateTop(t, &candidate)) continue;
      if (!found || before(candidate.score, t, best->score, best->shard)) {
        *best = candidate;
        *victim_lock = std::move(lock);  // releases the previous victim's shard
        found = true;
      }
    }
    return found;
  }

  // Room for one new key of `score` in bounded shard pass.shard (locked).
  // Below max_capacity a unit of the global budget is reserved (in bulk: up
  // to the rows left in the pass, at most 1/8 of what is free, so that
  // concurrent passes rarely hold budget another one needs; returned when the
  // pass ends). When the table is full, the entry with the lowest score is
  // evicted and reported, or, if the new key's own score is lower, the key is
  // turned away and reported instead (ties evict the stored entry).
  Room MakeRoom(WritePass& pass, int64_t rows_left, In key, const char* value, uint64_t score,
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
        if (score < victim.score) {
          out->Write(key, value, score);
          return Room::kTurnedAway;
        }
        EvictAt(victim, out);
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
  // is locked), reporting it before its row is freed.
  void EvictAt(const Victim& victim, EvictedWriter* out) {
    Shard& shard = shards_[victim.shard];
    const char* r = shard.rows.Row(SlotRow(shard.slots[victim.pos]));
    out->Write(Traits::View(r), r + value_offset_, victim.score);
    std::pop_heap(shard.heap.begin(), shard.heap.end(), HeapAfter());
    shard.heap.pop_back();
    EraseAt(shard, victim.pos);
    // The next entry's score is a lower bound of the shard's new minimum.
    min_hint_[victim.shard].store(shard.heap.empty() ? kNoEntryHint : shard.heap.front().score,
                                  std::memory_order_relaxed);
  }

  // Doubles the slot array. Slots carry their hash bits, so rows are not read.
  static void Grow(Shard& shard) {
    const uint64_t old_n = shard.num_slots;
    std::unique_ptr<uint64_t[]> old = std::move(shard.slots);
    shard.ResetSlots(old_n * 2);
    const uint64_t mask = shard.mask();
    for (uint64_t i = 0; i < old_n; ++i) {
      const uint64_t slot = old[i];
      if (SlotEmpty(slot)) continue;
      uint64_t pos = SlotHash(slot) & mask;
      while (!SlotEmpty(shard.slots[pos])) pos = (pos + 1) & mask;
      shard.slots[pos] = slot;
    }
  }

  // Removes the entry at `pos` by backward-shift deletion: later entries of
  // the probe run move back into the hole unless that would put them before
  // their home, so lookups never need tombstones.
  void EraseAt(Shard& shard, uint64_t pos) {
    const uint32_t row = SlotRow(shard.slots[pos]);
    Traits::Destroy(shard.rows.Row(row));
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
  // slot hash matches is found and prefetched; then visit(p, candidate) runs
  // with both most likely in cache. The candidate is a hint: visit must
  // verify it (Find does) or probe again (writers do, since their own inserts
  // may have moved slots since).
  template <typename Visit>
  static void PipelinedLoop(const Shard& shard, const uint64_t* hashes, const uint32_t* idx,
                            int64_t count, Visit&& visit) {
    constexpr int64_t D = kPrefetchDistance;
    uint32_t candidates[D];
    for (int64_t t = 0; t < count + 2 * D; ++t) {
      if (t < count) __builtin_prefetch(&shard.slots[SlotHash(hashes[idx[t]]) & shard.mask()]);
      const int64_t c = t - 2 * D;
      if (c >= 0) visit(c, candidates[c % D]);
      const int64_t b = t - D;
      if (b >= 0 && b < count) {
        const uint32_t row = CandidateRow(shard, hashes[idx[b]]);
        candidates[b % D] = row;
        if (row != RowSlab::kInvalidRow) __builtin_prefetch(shard.rows.Row(row));
      }
    }
  }

  void FindInShard(const Shard& shard, const uint64_t* hashes, const uint32_t* idx,
                   int64_t count, const In* keys, char* out, bool* exists, const char* defaults,
                   bool default_per_key, const ScoreContext* touch) const {
    uint64_t misses = 0;
    PipelinedLoop(shard, hashes, idx, count, [&](int64_t p, uint32_t row) {
      const uint32_t i = idx[p];
      if (row != RowSlab::kInvalidRow && !Traits::Equal(shard.rows.Row(row), keys[i])) {
        // Another key shares the 32 hash bits: take the exact path.
        row = SlotRow(shard.slots[FindPosition(shard, hashes[i], keys[i])]);
      }
      char* dst = out + static_cast<size_t>(i) * value_bytes_;
      if (row != RowSlab::kInvalidRow) {
        char* r = shard.rows.Row(row);
        std::memcpy(dst, r + value_offset_, value_bytes_);
        if (touch != nullptr) SetScore(r, touch->Score(i, true, AtomicLoadScore(r + score_offset_)));
        if (exists != nullptr) exists[i] = true;
      } else {
        std::memcpy(dst, defaults + (default_per_key ? static_cast<size_t>(i) * value_bytes_ : 0),
                    value_bytes_);
        if (exists != nullptr) exists[i] = false;
        ++misses;
      }
    });
    lookups_.fetch_add(static_cast<uint64_t>(count), std::memory_order_relaxed);
    misses_.fetch_add(misses, std::memory_order_relaxed);
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
  size_t score_offset_ = 0;
  size_t value_offset_ = 0;
  size_t stride_ = 0;
  std::unique_ptr<Shard[]> shards_;

  // Keys in the table, as published by finished passes (Size()).
  std::atomic<int64_t> size_{0};
  // Bounded tables: keys plus the budget passes have reserved and not yet
  // used or returned; never above max_capacity.
  std::atomic<int64_t> reserved_{0};
  // Per shard, a lower bound of its lowest score (kNoEntryHint if empty),
  // read without the shard's lock to pick eviction victims. Apart from the
  // shard structs so scanning them does not touch contended lock words.
  std::array<std::atomic<uint64_t>, kNumShards> min_hint_;

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
  switch (options.key_type) {
    case KeyType::kInt32: return std::make_unique<CpuTable<int32_t>>(options);
    case KeyType::kInt64: return std::make_unique<CpuTable<int64_t>>(options);
    case KeyType::kString: return std::make_unique<CpuTable<std::string>>(options);
  }
  *status = InvalidArgument("unknown key type");
  return nullptr;
}

}  // namespace dynemb
