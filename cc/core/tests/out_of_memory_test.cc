// Running out of memory in the middle of a batch, deterministically: this
// binary replaces the global operator new with one that, once armed, fails
// the allocation of a long string key's buffer after a given number of them,
// and from then on every allocation on every thread (as when the address
// space is exhausted). An insert of string keys must then return
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
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "cc/core/table.h"
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

bool ShouldFail(size_t size) {
  if (!g_armed.load(std::memory_order_relaxed)) return false;
  if (g_exhausted.load(std::memory_order_relaxed)) return true;
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

  g_key_buffers_left.store(good);
  g_exhausted.store(false);
  g_armed.store(true);
  status = table->Insert(keys.data(), n, values.data(), nullptr, runner);
  g_armed.store(false);

  Expect(status.code() == StatusCode::kResourceExhausted,
         label + ": expected kResourceExhausted, got code " +
             std::to_string(static_cast<int>(status.code())));
  Expect(status.message().find("out of memory") != std::string::npos,
         label + ": message " + status.message());
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
  if (dynemb::g_failures != 0) {
    std::printf("%d failures\n", dynemb::g_failures);
    return 1;
  }
  std::printf("out of memory tests passed\n");
  return 0;
}
