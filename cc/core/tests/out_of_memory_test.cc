// Running out of memory in the middle of a batch, deterministically: this
// binary replaces the global operator new with one that, once armed, fails
// the allocation of a long string key's buffer after a given number of them
// (or the first allocation past a size), and from then on every allocation on
// every thread (as when the address space is exhausted). An insert of string keys must then return
// kResourceExhausted, with the table consistent, instead of ending the
// process: where the out-of-memory error itself allocated (a Status message
// built in the std::bad_alloc handler), that second bad_alloc escaped a
// worker thread and the process aborted (a CI failure of
// tests/test_out_of_memory.py that RLIMIT_AS hit only by chance).
//
// Its own binary, because replacing operator new would also replace it for
// core_test.cc's cases, and under the sanitizers, which bring their own.
// tests/test_core_cpp.py builds and runs it.

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "cc/core/table.h"
#include "cc/core/table_io.h"
#include "cc/core/tests/memory_streams.h"
#include "cc/core/tests/thread_runner.h"

// GCC 12 takes the free() of the replacement operator delete, once inlined
// into the standard containers, for a mismatch with operator new; both are
// replaced below, so they match.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {

// A key of this length allocates a buffer of kKeyLength + 1 bytes, a size
// nothing else in an insert allocates.
constexpr size_t kKeyLength = 200;
std::atomic<bool> g_armed{false};
std::atomic<int64_t> g_key_buffers_left{0};
std::atomic<bool> g_exhausted{false};
// Also fail the first allocation of at least this many bytes (0: none): a
// load's block payload or batch of rows.
std::atomic<size_t> g_fail_from_bytes{0};

bool ShouldFail(size_t size) {
  if (!g_armed.load(std::memory_order_relaxed)) return false;
  if (g_exhausted.load(std::memory_order_relaxed)) return true;
  const size_t from = g_fail_from_bytes.load(std::memory_order_relaxed);
  if (from > 0 && size >= from) {
    g_exhausted.store(true, std::memory_order_relaxed);
    return true;
  }
  if (size != kKeyLength + 1) return false;
  if (g_key_buffers_left.fetch_sub(1, std::memory_order_relaxed) > 0) return false;
  g_exhausted.store(true, std::memory_order_relaxed);
  return true;
}

}  // namespace

void* operator new(size_t size) {
  if (ShouldFail(size)) throw std::bad_alloc();
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
// (The array forms' defaults call these.)
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace dynemb {
namespace {

int g_failures = 0;

void Expect(bool ok, const std::string& what) {
  if (ok) return;
  std::printf("FAILED: %s\n", what.c_str());
  ++g_failures;
}

// Runs call() with memory running out at the first allocation of
// `fail_from_bytes` or more (0: never by size) or after `good` long key
// buffers, and every allocation after that; returns its Status.
template <typename Call>
Status WithMemoryRunningOut(size_t fail_from_bytes, int64_t good, Call&& call) {
  g_fail_from_bytes.store(fail_from_bytes);
  g_key_buffers_left.store(good);
  g_exhausted.store(false);
  g_armed.store(true);
  const Status status = call();
  g_armed.store(false);
  g_fail_from_bytes.store(0);
  return status;
}

// The error a call that ran out of memory must return.
void ExpectOutOfMemory(const Status& status, const std::string& label) {
  Expect(status.code() == StatusCode::kResourceExhausted,
         label + ": expected kResourceExhausted, got code " +
             std::to_string(static_cast<int>(status.code())) + ": " + status.message());
  Expect(status.message().find("out of memory") != std::string::npos,
         label + ": message " + status.message());
}

// Fills a string table with n keys, memory running out after `good` key
// buffers; checks the error, the table's consistency, and that the same batch
// goes in once memory is back.
void InsertRunsOutOfMemory(const char* name, int64_t max_capacity, int threads, int64_t good) {
  const std::string label = std::string(name) + ", threads " + std::to_string(threads) +
                            ", memory out after " + std::to_string(good) + " keys";
  TableOptions options;
  options.key_type = KeyType::kString;
  options.value_type = ValueType::kFloat32;
  options.dim = 2;
  options.max_capacity = max_capacity;
  Status status;
  std::unique_ptr<Table> table = NewCpuTable(options, &status);
  Expect(status.ok() && table != nullptr, label + ": NewCpuTable: " + status.message());
  if (table == nullptr) return;

  const int64_t n = 20000;  // a parallel batch (above the core's 4096)
  std::vector<std::string> storage;
  for (int64_t i = 0; i < n; ++i) {
    std::string key = "key-" + std::to_string(i) + "-";
    key.resize(kKeyLength, 'x');
    storage.push_back(std::move(key));
  }
  std::vector<std::string_view> keys(storage.begin(), storage.end());
  std::vector<float> values(n * 2);
  for (int64_t i = 0; i < n * 2; ++i) values[i] = static_cast<float>(i);
  ThreadRunner runner(threads);

  status = WithMemoryRunningOut(
      0, good, [&] { return table->Insert(keys.data(), n, values.data(), nullptr, runner); });
  ExpectOutOfMemory(status, label);
  std::vector<float> found(n * 2);
  std::unique_ptr<bool[]> exists(new bool[n]);
  const float zeros[2] = {0, 0};
  Expect(table->Find(keys.data(), n, found.data(), exists.get(), zeros, false, runner).ok(),
         label + ": Find");
  int64_t present = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!exists[i]) continue;
    ++present;
    Expect(found[2 * i] == values[2 * i] && found[2 * i + 1] == values[2 * i + 1],
           label + ": row of key " + std::to_string(i));
  }
  Expect(present == table->Size(), label + ": size " + std::to_string(table->Size()) +
                                       " but " + std::to_string(present) + " keys found");
  Expect(present <= good, label + ": " + std::to_string(present) + " keys in");

  status = table->Insert(keys.data(), n, values.data(), nullptr, runner);
  Expect(status.ok(), label + ": insert once memory is back: " + status.message());
  Expect(table->Size() == n, label + ": size after the second insert");
  Expect(table->Find(keys.data(), n, found.data(), exists.get(), zeros, false, runner).ok(),
         label + ": Find after");
  for (int64_t i = 0; i < n; ++i) {
    if (!exists[i] || found[2 * i] != values[2 * i]) {
      Expect(false, label + ": key " + std::to_string(i) + " after the second insert");
      break;
    }
  }
}

// Loads a saved table into one that holds other keys (an upsert: clear_first
// false), memory running out at the reads' first allocation of
// `fail_from_bytes` or more (numeric keys: a block's payload) or after `good`
// key buffers (string keys, which the reads and the inserts both allocate);
// checks the error, that the table kept its keys and is consistent, and that
// the same load succeeds once memory is back.
void LoadRunsOutOfMemory(bool string_keys, size_t fail_from_bytes, int64_t good) {
  const std::string label = std::string("load, ") + (string_keys ? "string" : "int64") +
                            " keys, memory out from " + std::to_string(fail_from_bytes) +
                            " bytes / after " + std::to_string(good) + " keys";
  TableOptions options;
  options.key_type = string_keys ? KeyType::kString : KeyType::kInt64;
  options.dim = 16;
  Status status;
  std::unique_ptr<Table> saved = NewCpuTable(options, &status);
  std::unique_ptr<Table> target = NewCpuTable(options, &status);
  Expect(saved != nullptr && target != nullptr, label + ": NewCpuTable: " + status.message());
  if (saved == nullptr || target == nullptr) return;
  // Keys [0, n) are the file's, [n, n + kept) the target's own.
  const int64_t n = 20000, kept = 100;
  std::vector<int64_t> ints(n + kept);
  std::vector<std::string> storage;
  for (int64_t i = 0; i < n + kept; ++i) {
    ints[i] = i * 7919;
    std::string key = "key-" + std::to_string(i) + "-";
    key.resize(kKeyLength, 'x');
    storage.push_back(std::move(key));
  }
  const std::vector<std::string_view> views(storage.begin(), storage.end());
  const auto keys_at = [&](int64_t i) {
    return string_keys ? static_cast<const void*>(views.data() + i)
                       : static_cast<const void*>(ints.data() + i);
  };
  std::vector<float> values((n + kept) * 16);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  ThreadRunner runner(2);
  Expect(saved->Insert(keys_at(0), n, values.data(), nullptr, runner).ok(), label + ": insert");
  MemorySink file;
  Expect(SaveTable(*saved, 4096, &file).ok(), label + ": save");
  Expect(target->Insert(keys_at(n), kept, values.data() + n * 16, nullptr, runner).ok(),
         label + ": insert the target's own keys");
  LoadOptions upsert;
  upsert.clear_first = false;

  // A name longer than a short string's inline buffer: prefixing an error with it allocates.
  MemorySource source(file.data, "/a/long/path/to/shard-00000-of-00001.dynemb");
  status = WithMemoryRunningOut(fail_from_bytes, good,
                                [&] { return LoadTable({&source}, *target, upsert, runner); });
  ExpectOutOfMemory(status, label);
  // Every key the table holds has its row, and its own keys are all there.
  std::vector<float> found((n + kept) * 16);
  std::unique_ptr<bool[]> exists(new bool[n + kept]);
  const float zeros[16] = {};
  Expect(target->Find(keys_at(0), n + kept, found.data(), exists.get(), zeros, false, runner).ok(),
         label + ": Find after the failed load");
  int64_t present = 0;
  for (int64_t i = 0; i < n + kept; ++i) {
    if (!exists[i]) {
      Expect(i < n, label + ": the table lost its key " + std::to_string(i));
      continue;
    }
    ++present;
    Expect(std::memcmp(&found[i * 16], &values[i * 16], 16 * sizeof(float)) == 0,
           label + ": row of key " + std::to_string(i));
  }
  Expect(present == target->Size(), label + ": size " + std::to_string(target->Size()) +
                                        " but " + std::to_string(present) + " keys found");

  source.Rewind();
  status = LoadTable({&source}, *target, upsert, runner);
  Expect(status.ok(), label + ": load once memory is back: " + status.message());
  Expect(target->Size() == n + kept &&
             target->Find(keys_at(0), n + kept, found.data(), nullptr, zeros, false, runner).ok() &&
             found == values,
         label + ": the rows after the second load");
}

// Writes 20,000 rows with SaveRows, memory running out when its block buffer
// grows past 1 MiB; then, memory back, writes them again and reads them back.
void SaveRunsOutOfMemory() {
  const std::string label = "save, int64 keys, memory out from 1 MiB";
  TableOptions options;
  options.dim = 16;
  const int64_t n = 20000;
  std::vector<int64_t> keys(n);
  std::vector<float> values(n * 16);
  for (int64_t i = 0; i < n; ++i) keys[i] = i * 7919;
  for (int64_t i = 0; i < n * 16; ++i) values[i] = static_cast<float>(i);
  SaveOptions save;
  save.with_scores = false;
  MemorySink failed;
  Status status = WithMemoryRunningOut(size_t{1} << 20, 0, [&] {
    return SaveRows(options, save, keys.data(), n, values.data(), nullptr, &failed, nullptr);
  });
  ExpectOutOfMemory(status, label);

  MemorySink file;
  status = SaveRows(options, save, keys.data(), n, values.data(), nullptr, &file, nullptr);
  Expect(status.ok(), label + ": save once memory is back: " + status.message());
  std::unique_ptr<Table> table = NewCpuTable(options, &status);
  MemorySource source(file.data);
  ThreadRunner runner(1);
  Expect(table != nullptr && LoadTable({&source}, *table, LoadOptions{}, runner).ok(),
         label + ": load the second save");
  std::vector<float> found(n * 16);
  const float zeros[16] = {};
  Expect(table != nullptr && table->Size() == n &&
             table->Find(keys.data(), n, found.data(), nullptr, zeros, false, runner).ok() &&
             found == values,
         label + ": the rows of the second save");
}

}  // namespace
}  // namespace dynemb

int main() {
  for (int threads : {1, 2, 3}) {
    for (int64_t good : {0, 1, 7000}) {
      // Unbounded: keys in groups of shards, one per thread.
      dynemb::InsertRunsOutOfMemory("unbounded", 0, threads, good);
      // Bounded (without evicting): shard by shard.
      dynemb::InsertRunsOutOfMemory("bounded", 1 << 20, threads, good);
    }
  }
  // A block of 4,096 rows of int64 keys, scores and 16 floats: 320 KiB.
  dynemb::LoadRunsOutOfMemory(/*string_keys=*/false, /*fail_from_bytes=*/256 << 10, 0);
  for (int64_t good : {0, 1, 7000}) dynemb::LoadRunsOutOfMemory(/*string_keys=*/true, 0, good);
  dynemb::SaveRunsOutOfMemory();
  if (dynemb::g_failures != 0) {
    std::printf("%d failures\n", dynemb::g_failures);
    return 1;
  }
  std::printf("out of memory tests passed\n");
  return 0;
}
