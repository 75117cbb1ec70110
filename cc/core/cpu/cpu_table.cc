// The CPU implementation of dynemb::Table. The design (sharding, slot layout,
// row slab, locking, scores) is described at the top of cc/core/table.h.

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <string>
#include <string_view>
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

struct alignas(64) Shard {
  mutable std::shared_mutex mu;
  std::unique_ptr<uint64_t[]> slots;
  uint64_t num_slots = 0;  // a power of two
  std::atomic<int64_t> size{0};
  RowSlab rows;

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
        return existed ? old + 1 : 1;
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
  uint64_t inserts = 0, updates = 0, lookups = 0, misses = 0, removes = 0;
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
        shards_(new Shard[kNumShards]) {
    score_offset_ = RoundUp8(sizeof(typename Traits::Stored));
    value_offset_ = score_offset_ + sizeof(uint64_t);
    stride_ = RoundUp8(value_offset_ + value_bytes_);
    for (int s = 0; s < kNumShards; ++s) {
      shards_[s].rows.Init(stride_);
      shards_[s].ResetSlots(InitialShardSlots());
    }
  }

  ~CpuTable() override {
    for (int s = 0; s < kNumShards; ++s) DestroyKeys(shards_[s]);
  }

  const TableOptions& options() const override { return options_; }

  int64_t Size() const override {
    int64_t total = 0;
    for (int s = 0; s < kNumShards; ++s) total += shards_[s].size.load(std::memory_order_relaxed);
    return total;
  }

  int64_t Capacity() const override {
    if (options_.max_capacity > 0) return options_.max_capacity;
    int64_t total = 0;
    for (int s = 0; s < kNumShards; ++s) {
      std::shared_lock<std::shared_mutex> lock(shards_[s].mu);
      total += static_cast<int64_t>(shards_[s].num_slots * 3 / 4);
    }
    return total;
  }

  int64_t MemoryBytes() const override {
    int64_t bytes = sizeof(*this) + kNumShards * sizeof(Shard);
    for (int s = 0; s < kNumShards; ++s) {
      std::shared_lock<std::shared_mutex> lock(shards_[s].mu);
      bytes += shards_[s].num_slots * sizeof(uint64_t) + shards_[s].rows.MemoryBytes();
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
    return ForEachShard(plan, n, runner, [&](Shard& shard, const uint32_t* idx, int64_t count) {
      std::shared_lock<std::shared_mutex> lock(shard.mu);
      FindInShard(shard, plan.hashes.data(), idx, count, in, out, exists, def, default_per_key,
                  touch ? &ctx : nullptr);
      return Status::Ok();
    });
  }

  Status Insert(const void* keys, int64_t n, const void* values, const uint64_t* scores,
                const Runner& runner) override {
    if (n == 0) return Status::Ok();
    DYNEMB_RETURN_IF_ERROR(CheckBatch(keys, n, values, "values"));
    const In* in = static_cast<const In*>(keys);
    BatchPlan plan;
    BuildPlan(in, n, runner, &plan);
    ScoreContext ctx = WriteScoreContext(scores, n, /*is_insert=*/true);
    const char* src = static_cast<const char*>(values);
    return ForEachShard(plan, n, runner, [&](Shard& shard, const uint32_t* idx, int64_t count) {
      std::unique_lock<std::shared_mutex> lock(shard.mu);
      PassCounters pc;
      Status status;
      PipelinedLoop(shard, plan.hashes.data(), idx, count, [&](int64_t p, uint32_t) {
        if (!status.ok()) return;
        const uint32_t i = idx[p];
        uint32_t row = 0;
        bool existed = false;
        status = FindOrInsert(shard, plan.hashes[i], in[i], &row, &existed);
        if (!status.ok()) return;
        char* r = shard.rows.Row(row);
        std::memcpy(r + value_offset_, src + i * value_bytes_, value_bytes_);
        SetScore(r, ctx.Score(i, existed, existed ? AtomicLoadScore(r + score_offset_) : 0));
        ++(existed ? pc.updates : pc.inserts);
      });
      Publish(pc);
      return status;
    });
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
    return ForEachShard(plan, n, runner, [&](Shard& shard, const uint32_t* idx, int64_t count) {
      std::unique_lock<std::shared_mutex> lock(shard.mu);
      PassCounters pc;
      Status status;
      PipelinedLoop(shard, plan.hashes.data(), idx, count, [&](int64_t p, uint32_t) {
        if (!status.ok()) return;
        const uint32_t i = idx[p];
        const uint64_t pos = FindPosition(shard, plan.hashes[i], in[i]);
        const bool present = !SlotEmpty(shard.slots[pos]);
        if (exists[i] && present) {
          char* r = shard.rows.Row(SlotRow(shard.slots[pos]));
          add_row_(r + value_offset_, src + i * value_bytes_, options_.dim);
          SetScore(r, ctx.Score(i, true, AtomicLoadScore(r + score_offset_)));
          ++pc.updates;
        } else if (!exists[i] && !present) {
          uint32_t row = 0;
          bool existed = false;
          status = FindOrInsert(shard, plan.hashes[i], in[i], &row, &existed);
          if (!status.ok()) return;
          char* r = shard.rows.Row(row);
          std::memcpy(r + value_offset_, src + i * value_bytes_, value_bytes_);
          SetScore(r, ctx.Score(i, false, 0));
          ++pc.inserts;
        }
      });
      Publish(pc);
      return status;
    });
  }

  Status Remove(const void* keys, int64_t n, const Runner& runner) override {
    if (n == 0) return Status::Ok();
    DYNEMB_RETURN_IF_ERROR(CheckBatch(keys, n, keys, "keys"));
    const In* in = static_cast<const In*>(keys);
    BatchPlan plan;
    BuildPlan(in, n, runner, &plan);
    return ForEachShard(plan, n, runner, [&](Shard& shard, const uint32_t* idx, int64_t count) {
      std::unique_lock<std::shared_mutex> lock(shard.mu);
      PassCounters pc;
      PipelinedLoop(shard, plan.hashes.data(), idx, count, [&](int64_t p, uint32_t) {
        const uint32_t i = idx[p];
        const uint64_t pos = FindPosition(shard, plan.hashes[i], in[i]);
        if (SlotEmpty(shard.slots[pos])) return;
        EraseAt(shard, pos);
        ++pc.removes;
      });
      Publish(pc);
      return Status::Ok();
    });
  }

  void Clear() override {
    std::vector<std::unique_lock<std::shared_mutex>> locks = LockAll<std::unique_lock>();
    for (int s = 0; s < kNumShards; ++s) {
      Shard& shard = shards_[s];
      DestroyKeys(shard);
      shard.rows.Reset();
      shard.ResetSlots(InitialShardSlots());
      shard.size.store(0, std::memory_order_relaxed);
    }
  }

  Status Export(ExportSink* sink) override {
    std::vector<std::shared_lock<std::shared_mutex>> locks = LockAll<std::shared_lock>();
    const int64_t n = Size();
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

  // Runs fn(shard, indices, count) for every shard the batch touches, shards
  // in parallel. Returns the first error.
  template <typename Fn>
  Status ForEachShard(const BatchPlan& plan, int64_t n, const Runner& runner, Fn&& fn) {
    std::mutex error_mu;
    Status first_error;
    auto run = [&](int64_t begin, int64_t end) {
      for (int64_t s = begin; s < end; ++s) {
        const uint32_t b = plan.begin[s], e = plan.begin[s + 1];
        if (b == e) continue;
        Status status = fn(shards_[s], plan.order.data() + b, static_cast<int64_t>(e - b));
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

  Status FindOrInsert(Shard& shard, uint64_t hash, In key, uint32_t* row, bool* existed) {
    uint64_t pos = FindPosition(shard, hash, key);
    if (!SlotEmpty(shard.slots[pos])) {
      *row = SlotRow(shard.slots[pos]);
      *existed = true;
      return Status::Ok();
    }
    *existed = false;
    const int64_t size = shard.size.load(std::memory_order_relaxed);
    if (shard.NeedsGrowthFor(size + 1)) {
      Grow(shard);
      pos = FindPosition(shard, hash, key);
    }
    if (!shard.rows.Allocate(row)) {
      return Status(StatusCode::kResourceExhausted,
                    "a table shard ran out of row indices (2^32 - 1 keys per shard)");
    }
    Traits::Construct(shard.rows.Row(*row), key);
    shard.slots[pos] = MakeSlot(static_cast<uint32_t>(hash), *row);
    shard.size.store(size + 1, std::memory_order_relaxed);
    return Status::Ok();
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

  void Publish(const PassCounters& pc) {
    if (pc.inserts) inserts_.fetch_add(pc.inserts, std::memory_order_relaxed);
    if (pc.updates) updates_.fetch_add(pc.updates, std::memory_order_relaxed);
    if (pc.removes) removes_.fetch_add(pc.removes, std::memory_order_relaxed);
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
  size_t score_offset_ = 0;
  size_t value_offset_ = 0;
  size_t stride_ = 0;
  std::unique_ptr<Shard[]> shards_;

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
