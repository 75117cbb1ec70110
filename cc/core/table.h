// tensorflow_dynemb core: a hash table from feature ids to fixed-width value
// rows. This header has no TensorFlow dependency; g++ alone builds and tests it.
//
// ============================================================================
// Design
// ============================================================================
//
// Semantics (shared by every implementation: CPU here, CUDA in gpu/)
//   * Keys are int32, int64 or byte strings. Every value of the key type is a
//     valid key: no value is reserved as "empty" or "deleted".
//   * A value is a row of `dim` elements of one ValueType; `dim` is a runtime
//     value (no template per dim).
//   * Every entry carries a uint64 score. The score is what a bounded table
//     evicts by (lowest first) and what export/import carry, so a restored
//     table ranks its keys exactly as the saved one did. How a batch assigns
//     scores is the table's EvictStrategy (see ScoreClock below); scores passed
//     explicitly by the caller always win (that is how import restores them).
//   * Explicit scores move the table's LRU clock and epoch past them, so
//     entries written after an import rank above the imported ones.
//   * Batch semantics are sequential: the result of Insert, Accum or Remove on
//     a batch equals applying its rows one by one in order, so duplicate keys
//     in a batch are deterministic (the last insert wins, accum deltas add up).
//   * Operations are thread-safe. Concurrent batches see each key's rows
//     atomically (a reader never sees half a row).
//
// CPU memory layout (cpu/cpu_table.*)
//   The table is split into kNumShards shards chosen by the top bits of the
//   key's 64-bit hash. Each shard owns:
//     - a slot array: open addressing with linear probing, one uint64 per slot
//       holding (row index << 32 | low 32 bits of the key's hash); a row index
//       of 0xffffffff marks an empty slot. The hash bits give the home slot, so
//       growth and deletion never read rows, and keys are compared only when
//       the 32 bits match. Deletion is by backward shift, so there are no
//       tombstones and no key value has to be reserved.
//     - a row slab: rows of [key | score | values] ([key | score | age |
//       values] in bounded tables) in chunks (no allocation per key). Rows
//       never move, so growing the slot array rehashes only 8-byte slots,
//       never values; freed rows go to a free list.
//   Growth doubles one shard's slot array when it passes 3/4 load; an insert
//   batch first grows each shard once to hold all of its keys in the batch
//   (exported keys come sorted by slot, which a small array would cluster).
//   Shards grow independently, so a rehash stalls 1/kNumShards of the table
//   briefly.
//   A large table's row chunks and slot arrays live in 2 MiB-aligned mappings
//   advised for transparent huge pages (cpu/huge_pages.h): one TLB entry per
//   2 MiB instead of per 4 KiB for the random reads of a lookup, and 512x
//   fewer page faults for fresh rows.
//
// Locking
//   One reader-writer lock per shard. Find takes shared locks (readers never
//   block readers); Insert/Accum/Remove/ApplyRule take exclusive locks. A
//   batch is first hashed and bucketed (a stable counting sort, which keeps
//   each key's rows in batch order; large batches hash, count and scatter in
//   parallel blocks).
//   - The writes of an unbounded table bucket a large batch into one group
//     of consecutive shards per thread of the runner (Runner::Parallelism);
//     they and Find bucket a small batch (one the table does not split among
//     threads) into one group. Each group, in parallel, takes the locks of
//     the shards it touches, ascending, and runs one pipeline over its keys
//     in batch order. Batch order reads the caller's rows (values, gradients)
//     and writes its outputs in address order, which the hardware prefetcher
//     streams; shard order made each of those arrays one more random cache
//     line per key (issue 35 in docs/benchmarks.md: -20-45% for the inserts
//     and ApplyRule of a training step). A small batch leaves a few keys per
//     shard, too few for a pipeline per shard to overlap their misses.
//   - A large Find, Removes, and the writes of a bounded table bucket by
//     shard and run the shards in parallel, one lock acquisition and one
//     pass per shard (eviction keeps its budget and victim state per pass; a
//     Find reads no caller rows, and keeping to one shard's slot array at a
//     time measured faster than batch order).
//   A group holds its shards' locks for the whole batch, so a writer of one
//   shard waits for a concurrent batch's whole group, not just its shard.
//
// Batch pipeline (PipelinedLoop)
//   A lookup costs two dependent cache misses (slot, then row), so a batch's
//   keys go through a software pipeline: the slot is prefetched 32
//   keys ahead, the candidate row (first slot whose hash bits match) and the
//   key's output row 16 keys ahead, and the key is verified and copied last.
//   Every line of a row is prefetched (a 48-byte row straddles two lines half
//   the time; a dim-64 row spans five). Value rows of common sizes are copied
//   with constant-size copies. See docs/benchmarks.md "Performance work" for
//   what each step measured, and why a lookup stays below tf.gather at dim 64
//   (six lines read per key against four).
//   Score updates made by Find (LRU strategies) are relaxed atomic stores.
//   A bounded table's writer holds one shard's lock, plus, while evicting,
//   at most two more (the best victim's shard and the one it is looking at).
//   It blocks only on a shard of higher index than every lock it holds, and
//   only tries lower ones; a group (above) and whole-table operations
//   (Export, Clear) lock their shards ascending.
//   So the lock order is global and nothing can deadlock. A TableSnapshot
//   (streaming checkpoints) holds every shard's reader lock, taken ascending,
//   for its whole life: writers wait meanwhile, readers do not.
//
// Bounded tables (max_capacity > 0; HKV's cache semantics)
//   Size. A global budget counter `reserved` (keys + units reserved by passes
//   in flight) never exceeds max_capacity: a pass takes a unit before it
//   inserts a new key (in bulk, up to 1/8 of what is free, and returns what
//   it did not use when it ends), so even concurrent writers cannot overshoot.
//   Size() is a counter each pass publishes when it ends, so it never counts
//   a key that is not covered by the budget: Size() <= max_capacity, always.
//   Below max_capacity nothing is evicted (exactly so for batches applied by
//   one thread; concurrent passes may briefly hold budget another one needs).
//
//   Which entry goes. Entries rank by (score, age): the age is when the row
//   was last written (inserted, overwritten, accumulated; a Find refreshing
//   an LRU score does not count), counted in rows written to the table, so it
//   orders rows across shards and within a batch. When the budget is
//   exhausted each new key evicts the lowest-ranked entry of the whole table,
//   or is itself turned away if its own score is lower still (on equal
//   scores the stored entry goes: it is older). Breaking score ties by age
//   matters: under LFU many keys tie at count 1, and with a fixed order (say,
//   by hash) the same keys would always lose the tie and never stay long
//   enough to be counted up.
//
//   Only evicting inside the inserting key's shard would be cheap but wrong:
//   shard sizes are random, so a shard that receives more new keys than it
//   holds old ones would evict recent keys (simulated, LRU, 2 x max_capacity
//   keys inserted: ~12% of the most recent max_capacity keys lost at 4K keys,
//   ~3% at 64K). A full scan per insert is exact but O(size). Instead:
//     - each shard keeps a lazy min-heap of (score, age, row), built the
//       first time the shard is asked for a victim. Outside the writer's lock
//       scores only rise (Find refreshing LRU scores); a write makes the age
//       newer, and one that lowers a score pushes a fresh entry. So every live
//       row has an entry at or below its rank, and popping dead rows (age =
//       all ones once freed) and re-pushing moved ones brings the true
//       minimum to the top (ValidateTop). The heap is rebuilt when stale
//       entries exceed one per key: 24 bytes per entry, ~1-2 per key.
//     - each shard publishes a hint, a lower bound of its minimum rank (the
//       heap top, or the lowest rank written since), read without locks.
//     - FindVictim validates the inserting shard's top; the pass keeps the
//       other shards in a priority queue by hint, and locks and validates the
//       queue's top shard (its key becomes exact and goes back) until the best
//       entry found ranks at or below every key left: that entry is the global
//       minimum. The pass only raises other shards' minimums (by evicting), so
//       the queue stays a set of lower bounds for the whole pass and a row
//       validates one or two shards: O(log 256), not a scan.
//   Ages are unique, so the victim is determined by keys, scores and the
//   order of writes. Export (which checkpoints use) and ExportChunks (file
//   saves) emit a bounded table oldest write first, so importing or loading
//   them gives the rows ages in the same relative order: a restored table
//   evicts exactly what the saved one would have. Only batches written by
//   several threads at once make the choice depend on timing; and a
//   lower-index shard that is busy (try-lock fails) is skipped, so eviction
//   is approximate under contention. Rows cost 8 bytes more (the age).
//
//   Batches. A batch that may fill the table (reserved + n > max_capacity)
//   runs in two rounds: rows of keys already present first (updated and
//   rescored, shards in parallel), then the rows of absent keys, on one
//   thread (evictions lock the shard holding the minimum: parallel threads
//   would mostly wait for each other, 2.4x slower on 2 threads). A key is
//   absent for all its rows or present for all in round one, so its rows
//   still apply in batch order; and the batch's new keys do not evict the
//   keys it updates unless those still rank lowest. Under LRU a batch's keys carry the newest clock value,
//   so they are the last candidates, evicted only if the batch alone exceeds
//   max_capacity. Each row that needs room evicts or is turned away once, so
//   a batch of n rows evicts at most n entries (InsertAndEvict and
//   AccumAndEvict report them).
//   Evicted rows return to their shard's row free list and the budget stays
//   put, so memory stays bounded.
//
// Change tracking (online learning: incremental exports, docs/online_learning.md)
//   A table can say what changed since a point, so an export can write only
//   the changed rows plus the keys removed since (tombstones):
//     - Write stamps. Every row carries the rows-written counter of its last
//       write (insert, overwrite, accum, ApplyRule). Bounded tables have it
//       already: it is their age (above), so tracking costs them no memory;
//       unbounded tables add the same 8-byte field (track_changes; false
//       leaves their rows as before). A Find refreshing LRU scores is no write.
//     - Marks. Mark() returns (epoch, stamp): rows with age >= stamp were
//       written after it. A batch takes its stamps before it locks its shards,
//       so a mark must not fall inside a batch: writers pass a gate (one
//       atomic increment per batch) that Mark closes while it waits for the
//       batches in flight, then reads the counter. A mark is a value the
//       caller keeps: several exporters (or an exporter and a checkpoint)
//       never take changes from each other, and the table keeps no per-reader
//       state.
//     - Tombstones. Remove and eviction append (stamp, key) to the shard's
//       log under the lock they already hold. The log is bounded: when a
//       shard's log passes max(64, shard keys / 2) entries its older half is
//       dropped and `lost_below` rises past their stamps; the changes since a
//       mark below it are then unknown and ExportChanges says so (the exporter
//       then writes the whole table). Memory: 16 bytes per logged numeric key
//       (plus the string), at most ~size/2 entries, and only as keys go.
//     - Epochs. Clear (and so import and checkpoint restores) starts a new
//       epoch: a mark of another epoch is unknown changes (the keys Clear
//       removed have no tombstones). A table made by a staged load is a new
//       table with a new epoch.
//   ExportChanges(since, until) scans each shard's rows in row order (dense,
//   sequential memory, no probing) for ages in [since, until), and the
//   shard's log for tombstones in that window whose key was not written in
//   it (a key removed then written again travels as its row), each key once.
//   Rows written after `until` wait for the next window, so a window holds
//   the table as of `until` except rows rewritten since, which the next
//   window brings; with no concurrent writer it is exactly the table at
//   `until`.
//
// GPU
//   The Table interface below takes raw pointers plus a Runner; the CUDA table
//   (gpu/gpu_table.h) implements the same interface with device pointers and
//   a stream-bound Runner (GpuRunner). The semantics above (and the
//   conformance tests) are shared; its layout and batch algorithms are
//   described in gpu/gpu_table.h and docs/gpu.md.
// ============================================================================

#ifndef DYNEMB_CORE_TABLE_H_
#define DYNEMB_CORE_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "cc/core/update_rules.h"

namespace dynemb {

// ---------------------------------------------------------------------------
// Status: the core's error type (the kernels map it onto tensorflow::Status).
// ---------------------------------------------------------------------------
enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 3,
  kNotFound = 5,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kDataLoss = 15,
  kInternal = 13,
  kUnavailable = 14,  // a remote store (redis/) cannot be reached
};

// Copies of a Status share its message, so copying one allocates nothing: an
// error made while memory was there (cpu_table.cc's out-of-memory error) can
// be returned, and collected from worker threads, after memory has run out.
// (Allocating in a std::bad_alloc handler throws again, and a throw that
// leaves a thread pool's worker ends the process.)
class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::make_shared<const std::string>(std::move(message))) {}
  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const {
    static const std::string kNoMessage;
    return message_ ? *message_ : kNoMessage;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::shared_ptr<const std::string> message_;
};

inline Status InvalidArgument(std::string msg) {
  return Status(StatusCode::kInvalidArgument, std::move(msg));
}

// The argument checks every Table implementation makes on a batch call: the
// batch size n in [0, max_rows] (an implementation's row-index limit, which
// the message calls `limit`, e.g. "[0, 2^32)"), and `keys` and `data` (the
// other array, named `what` in the message) not null.
Status CheckBatchArgs(const void* keys, int64_t n, const void* data, const char* what,
                      int64_t max_rows, const char* limit);

// The checks of Table::ApplyRule's arguments against a table's options, shared
// by every implementation (n as in CheckBatchArgs).
struct TableOptions;
Status CheckRuleStep(const TableOptions& options, const void* keys, int64_t n,
                     const void* initial, const RuleStep& step);

#define DYNEMB_RETURN_IF_ERROR(expr)         \
  do {                                       \
    ::dynemb::Status _dynemb_status = (expr); \
    if (!_dynemb_status.ok()) return _dynemb_status; \
  } while (0)

// ---------------------------------------------------------------------------
// Types
// ---------------------------------------------------------------------------
enum class KeyType : int { kInt32 = 0, kInt64 = 1, kString = 2 };

enum class ValueType : int {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt8 = 4,
  kInt32 = 5,
  kInt64 = 6,
  kBool = 7,
};

// Bytes of one element of `type`.
size_t ValueTypeSize(ValueType type);
const char* ValueTypeName(ValueType type);
const char* KeyTypeName(KeyType type);
// Parses "float32", "float64", "float16", "bfloat16", "int8", "int32",
// "int64", "bool" (and "int32"/"int64"/"string" for keys).
bool ParseValueType(std::string_view name, ValueType* type);
bool ParseKeyType(std::string_view name, KeyType* type);

// How a batch assigns scores to the entries it touches (API.md §1).
//   kLru:        score = table clock (saturating), advanced once per Insert/Accum batch
//                (and per Find batch when find_updates_scores).
//   kLfu:        score = number of Insert/Accum rows that touched the key.
//   kEpochLru:   (epoch << 32) | (clock & 0xffffffff).
//   kEpochLfu:   (epoch << 32) | frequency within the epoch.
//   kCustomized: the caller passes scores; without them, a new key gets 0
//                and an existing key keeps its score.
// The epoch advances every `step_per_epoch` Insert batches (never if 0).
enum class EvictStrategy : int {
  kLru = 0,
  kLfu = 1,
  kEpochLru = 2,
  kEpochLfu = 3,
  kCustomized = 4,
};
bool ParseEvictStrategy(std::string_view name, EvictStrategy* strategy);
const char* EvictStrategyName(EvictStrategy strategy);

// The most elements a value row may have (64 MiB of float32): far beyond any
// embedding, and small enough that no batch's shape overflows.
constexpr int64_t kMaxDim = int64_t{1} << 24;
// Ok when `dim` elements per value row are allowed ([1, kMaxDim]), else an
// InvalidArgument naming it.
Status CheckDim(int64_t dim);

struct TableOptions {
  KeyType key_type = KeyType::kInt64;
  ValueType value_type = ValueType::kFloat32;
  int64_t dim = 1;                // elements per value row, in [1, kMaxDim]
  int64_t init_capacity = 0;      // keys to reserve room for up front
  int64_t max_capacity = 0;       // 0: unbounded
  EvictStrategy strategy = EvictStrategy::kLru;
  bool find_updates_scores = false;  // Find refreshes LRU scores
  int64_t step_per_epoch = 0;
  // GPU tables (gpu/gpu_table.h): bytes of device memory for value rows; the
  // rows beyond it live in pinned host memory mapped into the device's address
  // space (slower, but tables larger than the GPU's memory work). -1: all in
  // device memory. CPU tables ignore it.
  int64_t max_hbm_for_values = -1;
  // Keep write stamps and tombstones (see "Change tracking"): +8 bytes per
  // row of an unbounded table (bounded ones stamp their rows anyway), one
  // atomic increment per writing batch. GPU tables ignore it (they do not
  // track changes).
  bool track_changes = true;

  // Checks the options; the message names the field and the value received.
  Status Validate() const;
  size_t value_bytes() const { return static_cast<size_t>(dim) * ValueTypeSize(value_type); }
};

// ---------------------------------------------------------------------------
// Runner: where a batch's parallel work runs. The TF kernels wrap the
// intra-op thread pool; tests and bindings use SerialRunner or ThreadRunner.
// ---------------------------------------------------------------------------
class Runner {
 public:
  virtual ~Runner() = default;
  // Calls fn(begin, end) over disjoint ranges covering [0, n), possibly
  // concurrently. `cost_per_unit` is a rough count of cycles per unit.
  virtual void ParallelFor(int64_t n, int64_t cost_per_unit,
                           const std::function<void(int64_t, int64_t)>& fn) const = 0;
  // How many ranges ParallelFor may run at once (its threads): a table cuts
  // a large batch into this many groups of shards, one per thread (see
  // "Locking" above).
  virtual int Parallelism() const { return 1; }
};

class SerialRunner : public Runner {
 public:
  void ParallelFor(int64_t n, int64_t cost_per_unit,
                   const std::function<void(int64_t, int64_t)>& fn) const override {
    (void)cost_per_unit;
    if (n > 0) fn(0, n);
  }
};

// ---------------------------------------------------------------------------
// Key batches. `keys` points at n keys in the table's key type:
//   kInt32: const int32_t*, kInt64: const int64_t*,
//   kString: const std::string_view* (bytes, not necessarily UTF-8).
// Values are row-major [n, dim] arrays of the table's value type.
// ---------------------------------------------------------------------------

// Receives a whole-table snapshot from Table::Export.
class ExportSink {
 public:
  virtual ~ExportSink() = default;
  // Called once, while the table is locked against writers, with the number
  // of entries. Sets *keys (numeric key tables only; ignored for strings),
  // *values ([n, dim]) and *scores ([n]) to buffers that hold n entries; any
  // of them may be set to nullptr to skip that part.
  virtual Status Allocate(int64_t n, void** keys, void** values, uint64_t** scores) = 0;
  // String tables: called once per entry, i in [0, n), possibly from several
  // of the runner's threads at once (for different i).
  virtual void SetStringKey(int64_t i, std::string_view key) { (void)i; (void)key; }
};

// Receives the table in chunks from Table::ExportChunks (streaming save).
// `keys` is in the batch key representation above; pointers are valid only
// during the call. Returning an error stops the iteration.
using ChunkSink = std::function<Status(const void* keys, int64_t n, const void* values,
                                       const uint64_t* scores)>;

// A consistent snapshot of a table that is read in pieces (streaming
// checkpoints: tensorflow_dynemb/persistence/checkpoint.py writes it into TF's bundle
// files slice by slice). It holds the table's reader locks from
// Table::Snapshot until it is destroyed: writers wait meanwhile, readers
// (Find) do not. Unlike ExportChunks its size is known before the first row
// is read, and every row read is part of the same state.
class TableSnapshot {
 public:
  virtual ~TableSnapshot() = default;
  // Entries in the snapshot.
  virtual int64_t size() const = 0;
  // Entries [begin, end) of the snapshot, in Export's order (bounded tables:
  // oldest write first), in chunks of at most chunk_rows, each handed to
  // `sink` as in ExportChunks. Several threads may read disjoint ranges at
  // once. Returning an error from the sink stops the read.
  virtual Status Read(int64_t begin, int64_t end, int64_t chunk_rows,
                      const ChunkSink& sink) const = 0;
};

// Receives keys (tombstones) from Table::ExportChanges, in the batch key
// representation; pointers are valid only during the call. Returning an error
// stops the iteration.
using KeySink = std::function<Status(const void* keys, int64_t n)>;

// A point in a table's history of writes (see "Change tracking"): what
// Table::Mark returns and ExportChanges takes. Plain values: callers keep
// them, the table keeps nothing per caller.
struct ChangeMark {
  uint64_t epoch = 0;  // the table's epoch when taken (Clear starts a new one)
  uint64_t stamp = 0;  // rows written before the mark have ages below it
};

// Byte streams for the streaming file format (cc/core/table_io.h).
class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual Status Append(const void* data, size_t size) = 0;
  virtual Status Close() = 0;
};

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads exactly `size` bytes. At the end of the stream before the first
  // byte: Ok with *eof = true; a partial read is kDataLoss.
  virtual Status Read(void* data, size_t size, bool* eof) = 0;
  // Goes back to the first byte (the loader validates a file fully before it
  // clears the table, then reads it again).
  virtual Status Rewind() = 0;
  // What errors about this stream are prefixed with (e.g. its file path).
  virtual std::string Name() const { return std::string(); }
};

// Where Table::InsertAndEvict and Table::AccumAndEvict report the entries a
// batch evicted. A batch of n rows evicts at most n entries (every row that
// needs room evicts one entry, or is itself turned away), so the caller
// provides buffers of n rows; the table fills rows [0, count) in unspecified
// order. Plain pointers, so a GPU table can take device buffers.
struct EvictedEntries {
  void* keys = nullptr;        // int32/int64 tables: [n] keys (nullable); unused for strings
  void* values = nullptr;      // [n, dim] (nullable: values are not reported)
  uint64_t* scores = nullptr;  // [n] (nullable)
  // String tables: receives evicted key i; the bytes are valid only during
  // the call. Called from the batch's worker threads, once per i < count.
  std::function<void(int64_t i, std::string_view key)> string_key;
  int64_t count = 0;           // set by the table: entries written
};

// Counters since creation (monotonic; Clear does not reset them).
struct TableCounters {
  uint64_t inserts = 0;    // rows that created a new key
  uint64_t updates = 0;    // rows that overwrote or accumulated into a key
  uint64_t lookups = 0;    // keys looked up
  uint64_t misses = 0;     // keys looked up and not found
  uint64_t removes = 0;    // keys removed
  // Entries evicted to stay within max_capacity, plus new keys turned away
  // because their score was below every stored score: what InsertAndEvict
  // and AccumAndEvict report.
  uint64_t evictions = 0;
};

// ---------------------------------------------------------------------------
// Table: the interface every implementation provides. All methods are
// thread-safe. `n` may be 0. Pointers may be null only where documented.
// Methods that return a Status do not throw (what a caller's sink throws
// excepted): the table running out of memory is kResourceExhausted, and the
// table keeps what it held plus the rows of the batch applied before.
// ---------------------------------------------------------------------------
class Table {
 public:
  virtual ~Table() = default;

  virtual const TableOptions& options() const = 0;

  // Number of keys stored. Never exceeds options().max_capacity when that is
  // > 0, also while other threads write.
  virtual int64_t Size() const = 0;
  // Number of keys the table holds before its slot arrays grow; a bounded
  // table's capacity grows up to max_capacity and stops there.
  virtual int64_t Capacity() const = 0;
  // Bytes of memory the table owns (slots, rows, bookkeeping).
  virtual int64_t MemoryBytes() const = 0;
  virtual TableCounters Counters() const = 0;

  // values[i] = row of keys[i], or the default row when absent. `defaults`
  // holds one row (default_per_key false) or n rows. `exists` (nullable)
  // receives whether each key was found. With `update_scores` false the call
  // changes no score even where the options' find_updates_scores would: a
  // read-only lookup (inference mode, serving).
  virtual Status FindRows(const void* keys, int64_t n, void* values, bool* exists,
                          const void* defaults, bool default_per_key, bool update_scores,
                          const Runner& runner) = 0;

  // FindRows that refreshes scores as the options say (find_updates_scores).
  Status Find(const void* keys, int64_t n, void* values, bool* exists, const void* defaults,
              bool default_per_key, const Runner& runner) {
    return FindRows(keys, n, values, exists, defaults, default_per_key, /*update_scores=*/true,
                    runner);
  }

  // Upsert. `scores` (nullable) sets the score of each row explicitly. In a
  // full bounded table, a new key evicts the lowest-score entry (see
  // "Bounded tables" above), or is itself turned away when its score is the
  // lowest. `evicted` (nullable) receives what the batch evicted.
  virtual Status InsertAndEvict(const void* keys, int64_t n, const void* values,
                                const uint64_t* scores, EvictedEntries* evicted,
                                const Runner& runner) = 0;

  // InsertAndEvict without reporting the evicted entries.
  Status Insert(const void* keys, int64_t n, const void* values, const uint64_t* scores,
                const Runner& runner) {
    return InsertAndEvict(keys, n, values, scores, nullptr, runner);
  }

  // Per row i: exists[i] and key present -> value += deltas[i];
  // !exists[i] and key absent -> insert deltas[i]; otherwise nothing.
  // Addition is elementwise in the value type (bool: logical or). A row that
  // inserts into a full bounded table evicts as InsertAndEvict does, and
  // `evicted` (nullable) receives what the batch evicted in the same way: the
  // stored entries evicted and the new keys turned away (with the delta they
  // would have been inserted with).
  virtual Status AccumAndEvict(const void* keys, int64_t n, const void* deltas,
                               const bool* exists, EvictedEntries* evicted,
                               const Runner& runner) = 0;

  // AccumAndEvict without reporting the evicted entries.
  Status Accum(const void* keys, int64_t n, const void* deltas, const bool* exists,
               const Runner& runner) {
    return AccumAndEvict(keys, n, deltas, exists, nullptr, runner);
  }

  // One optimizer step on a slot-state table (update_rules.h). For each key
  // i, its state row -- or, for a key the table lacks, a copy of `initial`
  // (one state row), which is then inserted -- is updated in place by
  // step.rule with row i of step.rows and step.grads, and row i of
  // step.new_rows receives the key's new parameter row. A key's read, update
  // and write happen under its shard's lock, so concurrent steps on the same
  // key all count; duplicate keys apply in batch order, each seeing the state
  // the one before left. Scores are assigned as Insert assigns them. The
  // table must be unbounded (a step must not evict slot rows), of value type
  // float32 or float64, with dim = UpdateRuleSlots(step.rule) * step.dim
  // (CheckRuleStep says what is wrong otherwise).
  virtual Status ApplyRule(const void* keys, int64_t n, const void* initial,
                           const RuleStep& step, const Runner& runner) = 0;

  // Removes the keys; absent keys are ignored.
  virtual Status Remove(const void* keys, int64_t n, const Runner& runner) = 0;

  // Removes every key and releases the memory.
  virtual void Clear() = 0;

  // Size() and Clear() for callers that can report an error: a table kept
  // in a remote store (redis/redis_table.h) may fail to answer, where an
  // in-memory table cannot (these defaults).
  virtual Status CheckedSize(int64_t* size) const {
    *size = Size();
    return Status::Ok();
  }
  virtual Status CheckedClear() {
    Clear();
    return Status::Ok();
  }

  // A consistent snapshot of every entry, in unspecified order (bounded
  // tables: oldest write first, so an import restores how ties break). The
  // copy into the sink's buffers runs on `runner`.
  virtual Status Export(ExportSink* sink, const Runner& runner) = 0;

  // Every entry in chunks of at most `chunk_rows`, holding one shard's lock
  // only while copying a chunk: memory stays O(chunk_rows) however large the
  // table (bounded tables add a 24-byte-per-key ordering to emit the oldest
  // writes first, see "Bounded tables"), and writers are never blocked for
  // long. Entries inserted or removed concurrently may or may not be visited;
  // no key is visited twice.
  virtual Status ExportChunks(int64_t chunk_rows, const ChunkSink& sink) = 0;

  // Change tracking (see "Change tracking"). The current mark: every write
  // batch that began before it has finished, and every later one gets ages at
  // or above mark->stamp. kFailedPrecondition where the table does not track
  // changes (made with track_changes false, or a GPU table).
  virtual Status Mark(ChangeMark* mark) {
    (void)mark;
    return Status(StatusCode::kFailedPrecondition,
                  "this table does not track changes (GPU tables do not); export it whole");
  }

  // The changes of the window [since, until) (until from a later Mark):
  // rows written in it and still present, in chunks of at most chunk_rows,
  // to `rows` (scores included), then the keys removed or evicted in it and
  // not written again in it, each once, to `removed`. Sets *complete false
  // when the window's changes are not all known: marks of two epochs or of
  // another epoch than the table's, or tombstones dropped since (see above);
  // the sinks may then have received part of the window: discard it. Shards
  // are visited one at a time, each under its reader lock.
  virtual Status ExportChanges(const ChangeMark& since, const ChangeMark& until,
                               int64_t chunk_rows, const ChunkSink& rows,
                               const KeySink& removed, bool* complete) {
    (void)since, (void)until, (void)chunk_rows, (void)rows, (void)removed;
    *complete = false;
    return Status(StatusCode::kFailedPrecondition,
                  "this table does not track changes (GPU tables do not); export it whole");
  }

  // Takes a TableSnapshot (above), which holds this table's reader locks
  // until it is destroyed. Tables whose rows are not in host memory (GPU
  // tables) answer kFailedPrecondition; their callers export instead.
  virtual Status Snapshot(std::unique_ptr<TableSnapshot>* snapshot) {
    snapshot->reset();
    return Status(StatusCode::kFailedPrecondition,
                  "this table cannot lend a snapshot of its rows; export it instead");
  }
};

// Creates a CPU table; returns nullptr and sets *status on invalid options
// (an init_capacity whose slot arrays exceed the machine's memory included)
// or when there is no memory for it.
std::unique_ptr<Table> NewCpuTable(const TableOptions& options, Status* status);

}  // namespace dynemb

#endif  // DYNEMB_CORE_TABLE_H_
