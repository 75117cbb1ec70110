// Plain C++ tests of the core table (no test framework, no TensorFlow).
//
//   g++ -std=c++17 -O2 -pthread -I. cc/core/*.cc cc/core/cpu/*.cc
//       cc/core/tests/core_test.cc -o /tmp/core_test && /tmp/core_test
//   (CORE_TEST_ONLY=<substring> runs only the matching cases; the file is
//   also clean under -fsanitize=address,undefined and -fsanitize=thread with
//   TSAN_OPTIONS=detect_deadlocks=0.)
//
// tests/test_core_cpp.py builds and runs it under pytest (and, beside it,
// out_of_memory_test.cc, which replaces operator new). The exhaustive
// conformance tests are in Python (tests/test_core_conformance.py); this file
// checks the C++ surface the bindings do not reach: the Runner contract,
// ExportSink/ChunkSink/ByteSink/ByteSource/EvictedEntries use, the value
// arithmetic, the status codes, and bounded tables under concurrent writers
// (eviction quality is tested in Python: tests/test_core_eviction.py).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <mutex>
#include <stdexcept>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cc/core/cpu/huge_pages.h"
#include "cc/core/crc32c.h"
#include "cc/core/delta.h"
#include "cc/core/generation.h"
#include "cc/core/partition.h"
#include "cc/core/table.h"
#include "cc/core/table_io.h"
#include "cc/core/tests/memory_streams.h"
#include "cc/core/tests/thread_runner.h"
#include "cc/core/value_ops.h"

namespace dynemb {
namespace {

std::atomic<int> g_checks{0};

// A failed CHECK throws, so the remaining cases still run; threads catch it
// and hand it to the joining thread (see Guarded).
struct CheckFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string Where(const char* file, int line) { return std::string(file) + ":" + std::to_string(line); }

#define CHECK(cond)                                                              \
  do {                                                                           \
    ++g_checks;                                                                  \
    if (!(cond)) throw CheckFailure(Where(__FILE__, __LINE__) + ": CHECK failed: " #cond); \
  } while (0)

#define CHECK_OK(expr)                                                                   \
  do {                                                                                   \
    ++g_checks;                                                                          \
    const ::dynemb::Status _s = (expr);                                                  \
    if (!_s.ok()) {                                                                      \
      throw CheckFailure(Where(__FILE__, __LINE__) + ": " #expr " failed: code " +       \
                         std::to_string(static_cast<int>(_s.code())) + ": " + _s.message()); \
    }                                                                                    \
  } while (0)

// Runs fn on threads; rethrows the first failure after all have joined.
void RunThreads(int n, const std::function<void(int)>& fn) {
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

std::unique_ptr<Table> MakeTable(KeyType key, ValueType value, int64_t dim,
                                 EvictStrategy strategy = EvictStrategy::kLru,
                                 int64_t max_capacity = 0) {
  TableOptions o;
  o.key_type = key;
  o.value_type = value;
  o.dim = dim;
  o.strategy = strategy;
  o.max_capacity = max_capacity;
  Status s;
  std::unique_ptr<Table> t = NewCpuTable(o, &s);
  CHECK_OK(s);
  CHECK(t != nullptr);
  return t;
}

struct VectorSink : ExportSink {
  int64_t n = -1;
  std::vector<int64_t> keys;
  std::vector<std::string> string_keys;
  std::vector<float> values;
  std::vector<uint64_t> scores;
  int64_t dim;
  explicit VectorSink(int64_t d) : dim(d) {}
  Status Allocate(int64_t count, void** k, void** v, uint64_t** s) override {
    n = count;
    keys.resize(count);
    string_keys.resize(count);
    values.resize(count * dim);
    scores.resize(count);
    *k = keys.data();
    *v = values.data();
    *s = scores.data();
    return Status::Ok();
  }
  void SetStringKey(int64_t i, std::string_view key) override { string_keys[i] = std::string(key); }
};

void TestNamesAndOptions() {
  ValueType v;
  KeyType k;
  EvictStrategy e;
  const char* values[] = {"float32", "float64", "float16", "bfloat16", "int8", "int32", "int64", "bool"};
  const size_t sizes[] = {4, 8, 2, 2, 1, 4, 8, 1};
  for (int i = 0; i < 8; ++i) {
    CHECK(ParseValueType(values[i], &v));
    CHECK(std::string(ValueTypeName(v)) == values[i]);
    CHECK(ValueTypeSize(v) == sizes[i]);
  }
  CHECK(!ParseValueType("float8", &v));
  CHECK(!ParseValueType("", &v));
  for (const char* name : {"int32", "int64", "string"}) {
    CHECK(ParseKeyType(name, &k));
    CHECK(std::string(KeyTypeName(k)) == name);
  }
  CHECK(!ParseKeyType("int16", &k));
  for (const char* name : {"lru", "lfu", "epoch_lru", "epoch_lfu", "customized"}) {
    CHECK(ParseEvictStrategy(name, &e));
    CHECK(std::string(EvictStrategyName(e)) == name);
  }
  CHECK(!ParseEvictStrategy("fifo", &e));

  TableOptions o;
  CHECK_OK(o.Validate());
  o.dim = 0;
  Status s = o.Validate();
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("dim") != std::string::npos);
  CHECK(NewCpuTable(o, &s) == nullptr && !s.ok());
  o.dim = 4;
  o.max_capacity = -1;
  CHECK(!o.Validate().ok());
  CHECK(o.value_bytes() == 16);
}

void TestValueOps() {
  // float16: exact values, rounding to nearest even, overflow to inf.
  CHECK(FloatToHalf(1.0f) == 0x3C00);
  CHECK(FloatToHalf(-2.0f) == 0xC000);
  CHECK(FloatToHalf(65504.0f) == 0x7BFF);
  CHECK(FloatToHalf(1e6f) == 0x7C00);
  CHECK(FloatToHalf(1.0f + 1.0f / 2048) == 0x3C00);        // tie -> even
  CHECK(FloatToHalf(1.0f + 3.0f / 2048) == 0x3C02);        // tie -> even (up)
  CHECK(FloatToHalf(5.9604645e-08f) == 0x0001);            // smallest subnormal
  CHECK(HalfToFloat(0x3555) == 0.333251953125f);
  CHECK(std::isnan(HalfToFloat(FloatToHalf(NAN))));
  // bfloat16
  CHECK(FloatToBFloat16(1.0f) == 0x3F80);
  CHECK(FloatToBFloat16(1.0f + 1.0f / 256) == 0x3F80);     // tie -> even
  CHECK(FloatToBFloat16(1.0f + 3.0f / 256) == 0x3F82);     // tie -> even (up)
  CHECK(BFloat16ToFloat(0xC040) == -3.0f);
  CHECK(std::isnan(BFloat16ToFloat(FloatToBFloat16(NAN))));

  // Row addition per type.
  {
    int8_t a[3] = {127, -128, 5}, b[3] = {1, -1, -10};
    GetAddRowFn(ValueType::kInt8)(a, b, 3);
    CHECK(a[0] == -128 && a[1] == 127 && a[2] == -5);
  }
  {
    int32_t a[1] = {INT32_MAX}, b[1] = {1};
    GetAddRowFn(ValueType::kInt32)(a, b, 1);
    CHECK(a[0] == INT32_MIN);
  }
  {
    int64_t a[1] = {INT64_MIN}, b[1] = {-1};
    GetAddRowFn(ValueType::kInt64)(a, b, 1);
    CHECK(a[0] == INT64_MAX);
  }
  {
    bool a[4] = {false, false, true, true}, b[4] = {false, true, false, true};
    GetAddRowFn(ValueType::kBool)(a, b, 4);
    CHECK(!a[0] && a[1] && a[2] && a[3]);
    unsigned char raw[4];
    std::memcpy(raw, a, 4);
    CHECK(raw[0] == 0 && raw[1] == 1 && raw[2] == 1 && raw[3] == 1);  // canonical bools
  }
  {
    uint16_t a[1] = {FloatToHalf(2048.0f)}, b[1] = {FloatToHalf(1.0f)};
    GetAddRowFn(ValueType::kFloat16)(a, b, 1);  // 2049 rounds to even: 2048
    CHECK(HalfToFloat(a[0]) == 2048.0f);
  }
  {
    uint16_t a[1] = {FloatToBFloat16(256.0f)}, b[1] = {FloatToBFloat16(1.0f)};
    GetAddRowFn(ValueType::kBFloat16)(a, b, 1);  // 257 rounds to even: 256
    CHECK(BFloat16ToFloat(a[0]) == 256.0f);
  }
  {
    double a[2] = {0.1, -0.0}, b[2] = {0.2, 0.0};
    GetAddRowFn(ValueType::kFloat64)(a, b, 2);
    CHECK(a[0] == 0.1 + 0.2 && a[1] == 0.0 && !std::signbit(a[1]));
  }
}

void TestInt64Basics(const Runner& runner) {
  auto t = MakeTable(KeyType::kInt64, ValueType::kFloat32, 2);
  const int64_t keys[] = {0, -1, INT64_MIN, INT64_MAX, 0};  // 0 twice: the last row wins
  const float values[] = {1, 1, 2, 2, 3, 3, 4, 4, 5, 5};
  CHECK_OK(t->Insert(keys, 5, values, nullptr, runner));
  CHECK(t->Size() == 4);
  CHECK(t->Capacity() >= 4);
  CHECK(t->MemoryBytes() > 0);

  const int64_t probe[] = {0, 1, INT64_MIN, INT64_MAX, -1};
  float out[10];
  bool exists[5];
  const float def[] = {-9, -8};
  CHECK_OK(t->Find(probe, 5, out, exists, def, false, runner));
  const float want[] = {5, 5, -9, -8, 3, 3, 4, 4, 2, 2};
  for (int i = 0; i < 10; ++i) CHECK(out[i] == want[i]);
  CHECK(exists[0] && !exists[1] && exists[2] && exists[3] && exists[4]);
  // exists may be null; per-key defaults
  const float defs[] = {10, 11, 12, 13, 14, 15, 16, 17, 18, 19};
  CHECK_OK(t->Find(probe, 5, out, nullptr, defs, true, runner));
  CHECK(out[2] == 12 && out[3] == 13 && out[0] == 5);

  // Accum: sequential semantics within one batch.
  const int64_t akeys[] = {7, 7, 0, 8};
  const float deltas[] = {1, 1, 2, 2, 10, 10, 1, 1};
  const bool aexists[] = {false, true, true, true};  // 7 inserted then added to; 8 absent: no-op
  CHECK_OK(t->Accum(akeys, 4, deltas, aexists, runner));
  CHECK_OK(t->Find(akeys, 4, out, exists, def, false, runner));
  CHECK(out[0] == 3 && out[1] == 3 && out[4] == 15 && exists[0] && !exists[3]);

  const int64_t rkeys[] = {7, 7, 12345, INT64_MIN};
  CHECK_OK(t->Remove(rkeys, 4, runner));
  CHECK(t->Size() == 3);
  CHECK_OK(t->Insert(keys, 0, values, nullptr, runner));  // n == 0
  TableCounters c = t->Counters();
  CHECK(c.inserts == 5 && c.updates == 3 && c.removes == 2);

  VectorSink sink(2);
  CHECK_OK(t->Export(&sink, runner));
  CHECK(sink.n == 3);
  std::map<int64_t, float> got;
  for (int i = 0; i < 3; ++i) got[sink.keys[i]] = sink.values[2 * i];
  CHECK(got.size() == 3 && got[0] == 15 && got[-1] == 2 && got[INT64_MAX] == 4);

  t->Clear();
  CHECK(t->Size() == 0);
  CHECK(t->Counters().inserts == 5);  // counters survive Clear
  VectorSink empty(2);
  CHECK_OK(t->Export(&empty, runner));
  CHECK(empty.n == 0);
}

void TestStringsAndGrowth(const Runner& runner) {
  auto t = MakeTable(KeyType::kString, ValueType::kInt32, 1);
  const int n = 50000;
  std::vector<std::string> storage;
  storage.reserve(n + 3);
  for (int i = 0; i < n; ++i) storage.push_back("key-" + std::to_string(i) + std::string(i % 40, 'x'));
  storage.push_back("");
  storage.push_back(std::string("\0\0", 2));
  storage.push_back(std::string("\0", 1));
  std::vector<std::string_view> keys(storage.begin(), storage.end());
  std::vector<int32_t> values(keys.size());
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int32_t>(i);
  CHECK_OK(t->Insert(keys.data(), keys.size(), values.data(), nullptr, runner));
  CHECK(t->Size() == static_cast<int64_t>(keys.size()));
  std::vector<int32_t> out(keys.size());
  std::vector<char> exists(keys.size());
  const int32_t def = -1;
  CHECK_OK(t->Find(keys.data(), keys.size(), out.data(), reinterpret_cast<bool*>(exists.data()),
                   &def, false, runner));
  for (size_t i = 0; i < keys.size(); ++i) CHECK(out[i] == values[i] && exists[i]);

  // Remove every other key; the rest still read back (backward-shift deletion).
  std::vector<std::string_view> odd;
  for (size_t i = 1; i < keys.size(); i += 2) odd.push_back(keys[i]);
  CHECK_OK(t->Remove(odd.data(), odd.size(), runner));
  CHECK(t->Size() == static_cast<int64_t>(keys.size() - odd.size()));
  CHECK_OK(t->Find(keys.data(), keys.size(), out.data(), reinterpret_cast<bool*>(exists.data()),
                   &def, false, runner));
  for (size_t i = 0; i < keys.size(); ++i) {
    CHECK(static_cast<bool>(exists[i]) == (i % 2 == 0));
    CHECK(out[i] == (i % 2 == 0 ? values[i] : -1));
  }

  VectorSink sink(1);
  CHECK_OK(t->Export(&sink, runner));
  CHECK(sink.n == t->Size());
  std::map<std::string, int32_t> model;
  for (size_t i = 0; i < keys.size(); i += 2) model[storage[i]] = values[i];
  for (int64_t i = 0; i < sink.n; ++i) CHECK(model.count(sink.string_keys[i]));

  // ExportChunks visits every entry once, in chunks of at most chunk_rows.
  int64_t seen = 0;
  CHECK_OK(t->ExportChunks(1000, [&](const void* k, int64_t m, const void* v, const uint64_t*) {
    CHECK(m >= 1 && m <= 1000);
    const auto* sk = static_cast<const std::string_view*>(k);
    const auto* iv = static_cast<const int32_t*>(v);
    for (int64_t i = 0; i < m; ++i) CHECK(model.at(std::string(sk[i])) == iv[i]);
    seen += m;
    return Status::Ok();
  }));
  CHECK(seen == t->Size());
  // An error from the sink stops the iteration and is returned.
  Status stop = t->ExportChunks(10, [&](const void*, int64_t, const void*, const uint64_t*) {
    return Status(StatusCode::kInternal, "stop");
  });
  CHECK(stop.code() == StatusCode::kInternal && stop.message() == "stop");
}

// ChunkArena: chunks are 64-byte aligned, blocks 2 MiB aligned, a chunk
// larger than a block gets a block of its own, and Release unmaps them all.
void TestChunkArena() {
  ChunkArena arena;
  char* a = arena.Allocate(100);
  char* b = arena.Allocate(1000);
  CHECK(reinterpret_cast<uintptr_t>(a) % kHugePageBytes == 0);  // a new block
  CHECK(b == a + 128);  // bump allocation, rounded to 64 bytes
  char* big = arena.Allocate(ChunkArena::kBlockBytes + 1);
  CHECK(reinterpret_cast<uintptr_t>(big) % kHugePageBytes == 0);
  std::memset(a, 1, 100);
  std::memset(b, 2, 1000);
  std::memset(big, 3, ChunkArena::kBlockBytes + 1);
  CHECK(a[99] == 1 && b[999] == 2 && big[ChunkArena::kBlockBytes] == 3);
  arena.Release();
  char* again = arena.Allocate(64);
  std::memset(again, 4, 64);
  CHECK(again[63] == 4);
}

// Tables past ~258k keys take their rows from the arena (1024-row chunks)
// and their slot arrays from the pool; Clear releases them and the table
// fills again. String keys, so the keys'
// own heap memory is destroyed before the chunks go.
// Whether the mapping that holds `p` is advised for huge pages ("hg" among its
// VmFlags in /proc/self/smaps). Sets *known = false where smaps is missing.
bool AdvisedForHugePages(const void* p, bool* known) {
  std::ifstream smaps("/proc/self/smaps");
  *known = smaps.good();
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  std::string line;
  while (std::getline(smaps, line)) {
    uintptr_t start = 0, end = 0;
    char dash = 0;
    std::istringstream header(line);
    if (header >> std::hex >> start >> dash >> end && dash == '-') {
      inside = start <= address && address < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      std::istringstream flags(line.substr(8));
      std::string flag;
      while (flags >> flag) {
        if (flag == "hg") return true;
      }
      return false;
    }
  }
  return false;
}

// The arena's blocks are advised for huge pages unless DYNEMB_HUGE_PAGES=0
// (tests/test_core_cpp.py runs this case both ways).
void TestHugePageAdvice() {
  const char* env = std::getenv("DYNEMB_HUGE_PAGES");
  const bool wanted = env == nullptr || std::strcmp(env, "0") != 0;
  ChunkArena arena;
  SlotArrayPool pool;
  char* chunk = arena.Allocate(4096);
  uint64_t* slots = pool.Allocate((128 << 10) / 8);
  bool known = false;
  const bool chunk_advised = AdvisedForHugePages(chunk, &known);
  if (!known) return;  // no /proc: nothing to read the advice from
  CHECK(chunk_advised == wanted);
  CHECK(AdvisedForHugePages(slots, &known) == wanted);
  pool.Free(slots, (128 << 10) / 8);
}

// SlotArrayPool: small arrays come from new[], mid-sized ones share 2 MiB
// blocks (a freed array is handed out again; a block whose arrays are all
// freed is unmapped), big ones have mappings of their own.
void TestSlotArrayPool() {
  SlotArrayPool pool;
  const uint64_t small = 1024, mid = (64 << 10) / 8, big = (4 << 20) / 8;
  uint64_t* s = pool.Allocate(small);
  uint64_t* b = pool.Allocate(big);
  CHECK(reinterpret_cast<uintptr_t>(b) % kHugePageBytes == 0);
  std::vector<uint64_t*> mids;
  for (int i = 0; i < 40; ++i) mids.push_back(pool.Allocate(mid));  // 32 a block: two blocks
  std::fill_n(s, small, 1);
  std::fill_n(b, big, 2);
  for (uint64_t* m : mids) std::fill_n(m, mid, 3);
  CHECK(reinterpret_cast<uintptr_t>(mids[0]) % kHugePageBytes == 0);
  CHECK(mids[1] == mids[0] + mid);  // the same block
  uint64_t* freed = mids[5];
  pool.Free(freed, mid);
  CHECK(pool.Allocate(mid) == freed);  // reused
  // Free the first block's arrays (unmapped with its last one), then more.
  for (int i = 0; i < 32; ++i) pool.Free(mids[i], mid);
  for (int i = 0; i < 40; ++i) {
    uint64_t* m = pool.Allocate(mid);
    std::fill_n(m, mid, 4);
    mids.push_back(m);
  }
  for (size_t i = 32; i < mids.size(); ++i) CHECK(mids[i][mid - 1] == (i < 40 ? 3u : 4u));
  for (size_t i = 32; i < mids.size(); ++i) pool.Free(mids[i], mid);
  CHECK(s[small - 1] == 1 && b[big - 1] == 2);
  pool.Free(s, small);
  pool.Free(b, big);
}

void TestBigChunks(const Runner& runner, int64_t init_capacity) {
  TableOptions o;
  o.key_type = KeyType::kString;
  o.value_type = ValueType::kFloat32;
  o.dim = 2;
  o.init_capacity = init_capacity;
  Status status;
  std::unique_ptr<Table> t = NewCpuTable(o, &status);
  CHECK_OK(status);
  const int64_t n = 400000;  // ~1,560 rows a shard: every shard has a big chunk
  std::vector<std::string> storage;
  storage.reserve(n);
  for (int64_t i = 0; i < n; ++i) storage.push_back("a-long-enough-feature-id-" + std::to_string(i));
  std::vector<std::string_view> keys(storage.begin(), storage.end());
  std::vector<float> values(2 * n), out(2 * n);
  for (int64_t i = 0; i < 2 * n; ++i) values[i] = static_cast<float>(i);
  std::vector<char> exists(n);
  const float def[2] = {-1.f, -1.f};
  for (int round = 0; round < 2; ++round) {
    CHECK_OK(t->Insert(keys.data(), n, values.data(), nullptr, runner));
    CHECK(t->Size() == n);
    CHECK_OK(t->Find(keys.data(), n, out.data(), reinterpret_cast<bool*>(exists.data()), def, false,
                     runner));
    CHECK(out == values);
    CHECK(std::all_of(exists.begin(), exists.end(), [](char e) { return e != 0; }));
    t->Clear();
    CHECK(t->Size() == 0);
    CHECK_OK(t->Find(keys.data(), 1000, out.data(), reinterpret_cast<bool*>(exists.data()), def,
                     false, runner));
    CHECK(std::none_of(exists.begin(), exists.begin() + 1000, [](char e) { return e != 0; }));
  }
}

// One insert batch bigger than the table: each shard's slot array is grown
// once to hold the batch (Presize), with existing and repeated keys in it.
void TestPresizedBatch(const Runner& runner) {
  auto t = MakeTable(KeyType::kInt64, ValueType::kFloat32, 1);
  std::vector<int64_t> keys;
  std::vector<float> values;
  for (int64_t k = 0; k < 1000; ++k) {
    keys.push_back(k);
    values.push_back(static_cast<float>(k));
  }
  CHECK_OK(t->Insert(keys.data(), keys.size(), values.data(), nullptr, runner));
  keys.clear();
  values.clear();
  const int64_t fresh = 250000, repeated = 50000;
  for (int64_t i = 0; i < fresh; ++i) {  // 500 of them already stored
    keys.push_back(500 + i);
    values.push_back(static_cast<float>(2 * (500 + i)));
  }
  for (int64_t i = 0; i < repeated; ++i) {  // later in the batch: they win
    keys.push_back(500 + i);
    values.push_back(static_cast<float>(3 * (500 + i)));
  }
  CHECK_OK(t->Insert(keys.data(), keys.size(), values.data(), nullptr, runner));
  const int64_t size = 500 + fresh;
  CHECK(t->Size() == size);
  std::vector<int64_t> all(size);
  for (int64_t k = 0; k < size; ++k) all[k] = k;
  std::vector<float> out(size);
  std::vector<char> exists(size);
  const float def = -1.f;
  CHECK_OK(t->Find(all.data(), size, out.data(), reinterpret_cast<bool*>(exists.data()), &def,
                   false, runner));
  for (int64_t k = 0; k < size; ++k) {
    const float want = static_cast<float>(k < 500 ? k : k < 500 + repeated ? 3 * k : 2 * k);
    CHECK(exists[k] && out[k] == want);
  }
  // The same keys inserted in small batches (slot arrays doubled key by key):
  // presizing may grow a shard one doubling further (repeats and stored keys
  // count), never more.
  auto ref = MakeTable(KeyType::kInt64, ValueType::kFloat32, 1);
  for (int64_t b = 0; b < size; b += 1000) {
    CHECK_OK(ref->Insert(all.data() + b, std::min<int64_t>(1000, size - b), out.data() + b,
                         nullptr, runner));
  }
  CHECK(t->Capacity() >= size && t->Capacity() <= 2 * ref->Capacity());

  // A bounded table given a batch far larger than max_capacity (presized to
  // its share of max_capacity at most) keeps the newest keys.
  const int64_t cap = 4096, n = 100000;
  auto bounded = MakeTable(KeyType::kInt64, ValueType::kFloat32, 1, EvictStrategy::kLru, cap);
  std::vector<int64_t> many(n);
  std::vector<float> many_values(n, 1.f);
  for (int64_t i = 0; i < n; ++i) many[i] = 1000000 + i;
  CHECK_OK(bounded->Insert(many.data(), n, many_values.data(), nullptr, runner));
  CHECK(bounded->Size() <= cap && bounded->Size() > cap / 2);
  CHECK_OK(bounded->Find(many.data() + n - 1, 1, out.data(), reinterpret_cast<bool*>(exists.data()),
                         &def, false, runner));
  CHECK(exists[0]);  // the batch's last (newest) key stays
}

void TestSaveLoad(const Runner& runner) {
  auto t = MakeTable(KeyType::kInt32, ValueType::kFloat64, 3, EvictStrategy::kCustomized);
  std::vector<int32_t> keys;
  std::vector<double> values;
  std::vector<uint64_t> scores;
  for (int i = 0; i < 1000; ++i) {
    keys.push_back(i * 7919 - 3000000);
    for (int j = 0; j < 3; ++j) values.push_back(i + j / 4.0);
    scores.push_back(uint64_t{0xFFFFFFFFFFFFFFFF} - i);
  }
  CHECK_OK(t->Insert(keys.data(), keys.size(), values.data(), scores.data(), runner));
  MemorySink sink;
  CHECK_OK(SaveTable(*t, 64, &sink));
  CHECK(sink.closed);

  auto u = MakeTable(KeyType::kInt32, ValueType::kFloat64, 3);
  MemorySource source(sink.data);
  CHECK_OK(LoadTable({&source}, *u, LoadOptions{100, true}, runner));
  CHECK(u->Size() == 1000);
  std::vector<double> out(values.size());
  const double def[3] = {0, 0, 0};
  CHECK_OK(u->Find(keys.data(), keys.size(), out.data(), nullptr, def, false, runner));
  CHECK(out == values);
  struct ScoreSink : ExportSink {
    std::vector<int32_t> k;
    std::vector<uint64_t> s;
    Status Allocate(int64_t n, void** kp, void** vp, uint64_t** sp) override {
      k.resize(n);
      s.resize(n);
      *kp = k.data();
      *vp = nullptr;  // values skipped
      *sp = s.data();
      return Status::Ok();
    }
  } ss;
  CHECK_OK(u->Export(&ss, runner));
  std::map<int32_t, uint64_t> want;
  for (size_t i = 0; i < keys.size(); ++i) want[keys[i]] = scores[i];
  for (size_t i = 0; i < ss.k.size(); ++i) CHECK(want.at(ss.k[i]) == ss.s[i]);

  // Mismatched table: an error naming both, and the table is untouched.
  auto w = MakeTable(KeyType::kInt32, ValueType::kFloat64, 4);
  const int32_t one = 1;
  const double row[4] = {1, 2, 3, 4};
  CHECK_OK(w->Insert(&one, 1, row, nullptr, runner));
  MemorySource again(sink.data);
  Status s = LoadTable({&again}, *w, LoadOptions{100, true}, runner);
  CHECK(!s.ok());
  CHECK(s.message().find('3') != std::string::npos && s.message().find('4') != std::string::npos);
  CHECK(w->Size() == 1);

  // Truncation anywhere is an error (never a crash or a silent partial
  // load), and with clear_first the table keeps its content.
  for (size_t cut : {size_t{0}, size_t{5}, size_t{32}, sink.data.size() / 2, sink.data.size() - 1}) {
    auto x = MakeTable(KeyType::kInt32, ValueType::kFloat64, 3);
    const int32_t seven = 7;
    const double seven_row[3] = {7, 7, 7};
    CHECK_OK(x->Insert(&seven, 1, seven_row, nullptr, runner));
    MemorySource truncated(sink.data.substr(0, cut));
    CHECK(!LoadTable({&truncated}, *x, LoadOptions{100, true}, runner).ok());
    CHECK(x->Size() == 1);
  }
}

void TestConcurrentWriters() {
  auto t = MakeTable(KeyType::kInt64, ValueType::kInt64, 8);
  SerialRunner serial;
  const int kThreads = 4, kKeys = 20000;
  RunThreads(kThreads, [&](int th) {
    std::vector<int64_t> keys(kKeys);
    std::vector<int64_t> values(kKeys * 8);
    for (int i = 0; i < kKeys; ++i) {
      keys[i] = static_cast<int64_t>(i) * kThreads + th;
      for (int j = 0; j < 8; ++j) values[i * 8 + j] = keys[i];
    }
    for (int round = 0; round < 5; ++round) {
      CHECK_OK(t->Insert(keys.data(), kKeys, values.data(), nullptr, serial));
      std::vector<int64_t> out(kKeys * 8);
      const int64_t def[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
      CHECK_OK(t->Find(keys.data(), kKeys, out.data(), nullptr, def, false, serial));
      for (int i = 0; i < kKeys * 8; ++i) CHECK(out[i] == keys[i / 8]);
      if (round < 4) CHECK_OK(t->Remove(keys.data(), kKeys / 2, serial));
    }
  });
  CHECK(t->Size() == int64_t{kThreads} * kKeys);
}

// Every operation at once on overlapping keys (scores refreshed by Find,
// whole-table Export/ExportChunks/Clear): no crash, no torn rows, and clean
// under -fsanitize=thread (TSAN_OPTIONS=detect_deadlocks=0: Export holds all
// shard locks, more than TSan's deadlock detector tracks).
void TestConcurrentMixed() {
  TableOptions o;
  o.key_type = KeyType::kInt64;
  o.value_type = ValueType::kInt32;
  o.dim = 16;
  o.strategy = EvictStrategy::kLru;
  o.find_updates_scores = true;
  Status st;
  std::unique_ptr<Table> t = NewCpuTable(o, &st);
  CHECK_OK(st);
  ThreadRunner runner(2);
  std::atomic<bool> stop{false};
  std::atomic<int> torn{0};
  const int64_t kKeys = 5000;
  auto worker = [&](int id) {
    uint64_t x = 0x9E3779B97F4A7C15ULL * (id + 1);
    auto next = [&x] {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      return x;
    };
    std::vector<int64_t> keys(600);
    std::vector<int32_t> values(600 * 16), out(600 * 16);
    std::vector<char> exists(600);
    const int32_t def[16] = {};
    for (int iter = 0; !stop.load(); ++iter) {
      const int64_t n = static_cast<int64_t>(next() % 600);
      for (int64_t i = 0; i < n; ++i) {
        keys[i] = static_cast<int64_t>(next() % kKeys) - kKeys / 2;
        const int32_t v = static_cast<int32_t>(next());
        for (int j = 0; j < 16; ++j) values[i * 16 + j] = v;  // constant rows
      }
      switch (next() % 10) {
        case 0: case 1: case 2:
          CHECK_OK(t->Insert(keys.data(), n, values.data(), nullptr, runner));
          break;
        case 3: {
          for (int64_t i = 0; i < n * 16; ++i) values[i] = 1;
          for (int64_t i = 0; i < n; ++i) exists[i] = next() % 2;
          CHECK_OK(t->Accum(keys.data(), n, values.data(), reinterpret_cast<bool*>(exists.data()),
                            runner));
          break;
        }
        case 4:
          CHECK_OK(t->Remove(keys.data(), n / 4, runner));
          break;
        case 5: {
          struct IntSink : ExportSink {
            std::vector<int64_t> k;
            std::vector<int32_t> v;
            std::vector<uint64_t> s;
            Status Allocate(int64_t m, void** kp, void** vp, uint64_t** sp) override {
              k.resize(m);
              v.resize(m * 16);
              s.resize(m);
              *kp = k.data();
              *vp = v.data();
              *sp = s.data();
              return Status::Ok();
            }
          } is;
          CHECK_OK(t->Export(&is, SerialRunner()));
          for (size_t r = 0; r < is.k.size(); ++r)
            for (int j = 1; j < 16; ++j)
              if (is.v[r * 16 + j] != is.v[r * 16]) torn++;
          break;
        }
        case 6:
          CHECK_OK(t->ExportChunks(97, [&](const void*, int64_t m, const void* v, const uint64_t*) {
            const int32_t* iv = static_cast<const int32_t*>(v);
            for (int64_t r = 0; r < m; ++r)
              for (int j = 1; j < 16; ++j)
                if (iv[r * 16 + j] != iv[r * 16]) torn++;
            return Status::Ok();
          }));
          break;
        case 7:
          if (iter % 50 == 0) t->Clear();
          (void)t->Size();
          (void)t->Capacity();
          (void)t->MemoryBytes();
          (void)t->Counters();
          break;
        default:
          CHECK_OK(t->Find(keys.data(), n, out.data(), reinterpret_cast<bool*>(exists.data()), def,
                           false, runner));
          for (int64_t i = 0; i < n; ++i)
            for (int j = 1; j < 16; ++j)
              if (out[i * 16 + j] != out[i * 16]) torn++;
      }
    }
  };
  std::thread timer([&stop] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    stop = true;
  });
  try {
    RunThreads(6, worker);
  } catch (...) {
    stop = true;
    timer.join();
    throw;
  }
  timer.join();
  CHECK(torn.load() == 0);
  CHECK(t->Size() >= 0 && t->Size() <= kKeys);
}


// Loading files saved by several tables into one shard of another sharding
// keeps exactly the keys ShardOfKey routes there, from every file.
void TestShardedLoad(const Runner& runner) {
  std::vector<std::string> files;
  std::vector<int64_t> all_keys;
  for (int part = 0; part < 2; ++part) {
    auto t = MakeTable(KeyType::kInt64, ValueType::kFloat32, 2);
    std::vector<int64_t> keys;
    std::vector<float> values;
    for (int64_t i = 0; i < 500; ++i) {
      keys.push_back(part * 1000000 + i * 31 - 7000);
      values.push_back(static_cast<float>(keys.back()));
      values.push_back(-static_cast<float>(keys.back()));
    }
    CHECK_OK(t->Insert(keys.data(), keys.size(), values.data(), nullptr, runner));
    MemorySink sink;
    CHECK_OK(SaveTable(*t, 64, &sink));
    files.push_back(sink.data);
    all_keys.insert(all_keys.end(), keys.begin(), keys.end());
  }
  int64_t total = 0;
  for (int32_t shard = 0; shard < 3; ++shard) {
    auto t = MakeTable(KeyType::kInt64, ValueType::kFloat32, 2);
    MemorySource a(files[0]), b(files[1]);
    CHECK_OK(LoadTable({&a, &b}, *t, LoadOptions{100, true, 3, shard}, runner));
    int64_t expected = 0;
    for (int64_t k : all_keys) {
      const bool mine = ShardOfKey(k, 3) == shard;
      expected += mine;
      float row[2];
      bool found = false;
      const float def[2] = {0, 0};
      CHECK_OK(t->Find(&k, 1, row, &found, def, false, runner));
      CHECK(found == mine);
      if (mine) CHECK(row[0] == static_cast<float>(k) && row[1] == -static_cast<float>(k));
    }
    CHECK(t->Size() == expected);
    total += t->Size();
  }
  CHECK(total == static_cast<int64_t>(all_keys.size()));
  // A shard index out of range is an error, not an empty load.
  auto t = MakeTable(KeyType::kInt64, ValueType::kFloat32, 2);
  MemorySource a(files[0]);
  CHECK(!LoadTable({&a}, *t, LoadOptions{100, true, 3, 3}, runner).ok());
}

// The partition hash is a cross-machine contract: these values must never
// change (tests/test_variable_partition.py pins the same through the op).
void TestPartitionIsStable() {
  CHECK(StableKeyHash(int64_t{0}) == 0);
  CHECK(StableKeyHash(int64_t{1}) == 0xb456bcfc34c2cb2cULL);
  CHECK(StableKeyHash(int32_t{-1}) == StableKeyHash(int64_t{-1}));
  CHECK(ShardOfKey(std::string_view(""), 7) == ShardOfKey(std::string_view(""), 7));
  for (int64_t k = -1000; k < 1000; ++k) {
    const int32_t s = ShardOfKey(k, 5);
    CHECK(s >= 0 && s < 5);
  }
}

// The batched Box-Muller (libmvec where available) stays within a few double
// ulps of libm's, and float32 rows drawn through it round like float64 rows
// drawn through libm (KeyedRandomRow<double>, which never uses the batch) in
// all but a handful of values: what partition.h promises.
void TestBatchedBoxMuller() {
  const int64_t n = 1 << 16;
  std::vector<double> u1(n), u2(n), batched(n);
  for (int64_t i = 0; i < n; ++i) {
    u1[i] = 1.0 - static_cast<double>(StableMix64(2 * i) >> 11) * 0x1.0p-53;
    u2[i] = static_cast<double>(StableMix64(2 * i + 1) >> 11) * 0x1.0p-53;
  }
  for (int64_t len : {int64_t{0}, int64_t{3}, int64_t{7}, n}) {  // tails shorter than 4 too
    BoxMullerBatch(u1.data(), u2.data(), len, batched.data());
    for (int64_t i = 0; i < len; ++i) {
      const double exact = BoxMuller(u1[i], u2[i]);
      CHECK(std::fabs(batched[i] - exact) <= 1e-15 * std::fabs(exact) + 1e-300);
    }
  }
  int64_t differing = 0;
  const int64_t keys = 20000, dim = 16;
  std::vector<float> f(dim);
  std::vector<double> d(dim);
  for (const KeyedDistribution dist : {KeyedDistribution::kNormal, KeyedDistribution::kTruncatedNormal}) {
    for (int64_t k = 0; k < keys; ++k) {
      KeyedRandomRow(3, StableKeyHash(k), dim, dist, 0.5, 2.0, f.data());
      KeyedRandomRow(3, StableKeyHash(k), dim, dist, 0.5, 2.0, d.data());
      for (int64_t j = 0; j < dim; ++j) {
        CHECK(std::fabs(f[j] - static_cast<float>(d[j])) <= std::fabs(std::nextafter(f[j], 0.0f) - f[j]));
        differing += f[j] != static_cast<float>(d[j]);
        if (dist == KeyedDistribution::kTruncatedNormal) CHECK(std::fabs(d[j] - 0.5) <= 4.0);
      }
    }
  }
  CHECK(differing <= 2);  // expected ~0.02 of 640,000 values
}

// ---------------------------------------------------------------------------
// Bounded tables (eviction)
// ---------------------------------------------------------------------------

// EvictedEntries over vectors of n rows, for int64 keys and float values.
struct EvictedBuffers {
  std::vector<int64_t> keys;
  std::vector<float> values;
  std::vector<uint64_t> scores;
  EvictedEntries entries;
  EvictedBuffers(int64_t n, int64_t dim) : keys(n), values(n * dim), scores(n) {
    entries.keys = keys.data();
    entries.values = values.data();
    entries.scores = scores.data();
  }
  std::map<int64_t, std::pair<float, uint64_t>> Map() const {
    std::map<int64_t, std::pair<float, uint64_t>> m;
    for (int64_t i = 0; i < entries.count; ++i) m[keys[i]] = {values[i * (values.size() / keys.size())], scores[i]};
    return m;
  }
};

std::unique_ptr<Table> MakeBounded(KeyType key, EvictStrategy strategy, int64_t max_capacity,
                                   int64_t dim = 1, bool find_updates_scores = false) {
  TableOptions o;
  o.key_type = key;
  o.value_type = ValueType::kFloat32;
  o.dim = dim;
  o.strategy = strategy;
  o.max_capacity = max_capacity;
  o.find_updates_scores = find_updates_scores;
  Status s;
  std::unique_ptr<Table> t = NewCpuTable(o, &s);
  CHECK_OK(s);
  return t;
}

std::map<int64_t, uint64_t> ExportScores(Table& t) {
  VectorSink sink(t.options().dim);
  CHECK_OK(t.Export(&sink, SerialRunner()));
  std::map<int64_t, uint64_t> m;
  for (int64_t i = 0; i < sink.n; ++i) m[sink.keys[i]] = sink.scores[i];
  return m;
}

// LRU batches: nothing is evicted below max_capacity; then each batch evicts
// exactly the oldest one, reported with its values and scores.
void TestBoundedLruBatches(const Runner& runner) {
  const int64_t kBatch = 16, kMax = 64;
  auto t = MakeBounded(KeyType::kInt64, EvictStrategy::kLru, kMax, 2);
  std::vector<std::map<int64_t, uint64_t>> batch_scores;
  for (int64_t b = 0; b < 8; ++b) {
    std::vector<int64_t> keys(kBatch);
    std::vector<float> values(kBatch * 2);
    for (int64_t i = 0; i < kBatch; ++i) {
      keys[i] = b * 1000000 + i * 7919;  // batch b: keys / 1000000 == b
      values[2 * i] = values[2 * i + 1] = static_cast<float>(keys[i]);
    }
    const std::map<int64_t, uint64_t> before = ExportScores(*t);
    EvictedBuffers ev(kBatch, 2);
    CHECK_OK(t->InsertAndEvict(keys.data(), kBatch, values.data(), nullptr, &ev.entries, runner));
    CHECK(t->Size() == std::min<int64_t>((b + 1) * kBatch, kMax));
    if (b < 4) {
      CHECK(ev.entries.count == 0);
      continue;
    }
    // Batch b - 4 is the oldest: exactly its keys, with their rows and scores.
    CHECK(ev.entries.count == kBatch);
    const auto got = ev.Map();
    CHECK(static_cast<int64_t>(got.size()) == kBatch);
    for (const auto& [key, row] : got) {
      CHECK(key / 1000000 == b - 4);
      CHECK(row.first == static_cast<float>(key));
      CHECK(row.second == before.at(key));
    }
  }
  CHECK(t->Capacity() == kMax);
  CHECK(t->Counters().evictions == 4 * kBatch);
  CHECK(t->Counters().inserts == 8 * kBatch);
}

// The reporting buffers may be null (counted, not written); string keys go
// through the callback, copied before their row is freed.
void TestEvictedEntriesBuffers(const Runner& runner) {
  auto t = MakeBounded(KeyType::kString, EvictStrategy::kCustomized, 4, 3);
  std::vector<std::string> storage = {"a", std::string(100, 'b'), std::string("\0c", 2), ""};
  std::vector<std::string_view> keys(storage.begin(), storage.end());
  std::vector<float> values = {1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4};
  const uint64_t scores[] = {40, 10, 30, 20};
  CHECK_OK(t->Insert(keys.data(), 4, values.data(), scores, runner));

  std::vector<std::string> new_storage = {std::string(50, 'x'), "y"};
  std::vector<std::string_view> new_keys(new_storage.begin(), new_storage.end());
  const float new_values[] = {5, 5, 5, 6, 6, 6};
  const uint64_t new_scores[] = {50, 5};  // "y" ranks below every stored entry
  std::vector<std::string> ev_keys(2);
  std::vector<float> ev_values(6, -1);
  EvictedEntries ev;
  ev.values = ev_values.data();  // scores not wanted
  ev.string_key = [&](int64_t i, std::string_view key) { ev_keys[i] = std::string(key); };
  CHECK_OK(t->InsertAndEvict(new_keys.data(), 2, new_values, new_scores, &ev, runner));
  CHECK(ev.count == 2);
  std::map<std::string, float> got;
  for (int i = 0; i < 2; ++i) got[ev_keys[i]] = ev_values[3 * i];
  // The lowest stored entry (100 x 'b', score 10) made room for 50 x 'x';
  // "y" (score 5) was turned away with the value it was given.
  CHECK(got.size() == 2 && got.at(std::string(100, 'b')) == 2 && got.at("y") == 6);
  CHECK(t->Size() == 4);

  // Null buffers: still evicts and counts; count is set.
  EvictedEntries none;
  const std::string_view more[] = {"m1", "m2"};
  const uint64_t high[] = {100, 101};
  CHECK_OK(t->InsertAndEvict(more, 2, new_values, high, &none, runner));
  CHECK(none.count == 2 && t->Size() == 4 && t->Counters().evictions == 4);
  // Unbounded tables never evict; count is reset to 0.
  auto u = MakeTable(KeyType::kInt64, ValueType::kFloat32, 1);
  const int64_t k[] = {1, 2};
  const float v[] = {1, 2};
  none.count = 77;
  CHECK_OK(u->InsertAndEvict(k, 2, v, nullptr, &none, runner));
  CHECK(none.count == 0 && u->Size() == 2);
}

// Accum into a full bounded table reports what it evicted exactly as
// InsertAndEvict does: the reported entries are exactly the keys that
// disappeared, with the rows and scores they had; a new key turned away is
// reported with its delta.
void TestBoundedAccumReports(const Runner& runner) {
  const int64_t kMax = 64;
  auto t = MakeBounded(KeyType::kInt64, EvictStrategy::kLru, kMax, 2);
  std::vector<int64_t> keys(kMax);
  std::vector<float> values(kMax * 2);
  for (int64_t i = 0; i < kMax; ++i) {
    keys[i] = i;
    values[2 * i] = values[2 * i + 1] = static_cast<float>(i);
    // One key per batch: LRU ranks key i below key i + 1.
    CHECK_OK(t->Insert(&keys[i], 1, &values[2 * i], nullptr, runner));
  }
  // 8 present keys accumulated (rescored, so no longer the oldest), 8 present
  // keys left alone (exists false), 8 absent keys ignored (exists true) and
  // 16 absent keys inserted: they evict the 16 oldest keys not accumulated.
  std::vector<int64_t> batch;
  std::vector<char> exists;
  for (int64_t i = 0; i < 8; ++i) batch.push_back(i), exists.push_back(1);
  for (int64_t i = 8; i < 16; ++i) batch.push_back(i), exists.push_back(0);
  for (int64_t i = 0; i < 8; ++i) batch.push_back(1000 + i), exists.push_back(1);
  for (int64_t i = 0; i < 16; ++i) batch.push_back(2000 + i), exists.push_back(0);
  const int64_t n = static_cast<int64_t>(batch.size());
  const std::vector<float> deltas(n * 2, 0.5f);
  const std::map<int64_t, uint64_t> before = ExportScores(*t);
  EvictedBuffers ev(n, 2);
  ev.entries.count = 77;  // set by the table
  CHECK_OK(t->AccumAndEvict(batch.data(), n, deltas.data(),
                            reinterpret_cast<const bool*>(exists.data()), &ev.entries, runner));
  const std::map<int64_t, uint64_t> after = ExportScores(*t);
  CHECK(t->Size() == kMax && ev.entries.count == 16);
  std::set<int64_t> gone;
  for (const auto& [key, score] : before) {
    if (after.count(key) == 0) gone.insert(key);
  }
  const auto got = ev.Map();
  CHECK(static_cast<int64_t>(got.size()) == 16);
  for (const auto& [key, row] : got) {
    CHECK(gone.count(key) == 1);
    CHECK(key >= 8 && key < 24);  // the oldest keys the batch did not accumulate
    CHECK(row.first == static_cast<float>(key) && row.second == before.at(key));
  }
  CHECK(gone.size() == got.size());
  for (int64_t i = 0; i < 16; ++i) CHECK(after.count(2000 + i) == 1);
  CHECK(t->Counters().evictions == 16);

  // A customized table gives accumulated new keys score 0: below every
  // stored score, so the new key is turned away and reported with its delta.
  auto c = MakeBounded(KeyType::kInt64, EvictStrategy::kCustomized, 2, 2);
  const int64_t stored[] = {1, 2};
  const float stored_values[] = {1, 1, 2, 2};
  const uint64_t stored_scores[] = {10, 20};
  CHECK_OK(c->Insert(stored, 2, stored_values, stored_scores, runner));
  const int64_t fresh = 3;
  const float fresh_delta[] = {7, 7};
  const bool absent = false;
  EvictedBuffers away(1, 2);
  CHECK_OK(c->AccumAndEvict(&fresh, 1, fresh_delta, &absent, &away.entries, runner));
  CHECK(away.entries.count == 1 && away.keys[0] == 3 && away.values[0] == 7 &&
        away.scores[0] == 0);
  CHECK(c->Size() == 2 && ExportScores(*c).count(3) == 0);

  // Accum (the non-reporting form) still evicts and counts.
  const int64_t more[] = {4, 5};
  const bool not_there[] = {false, false};
  const uint64_t before_count = c->Counters().evictions;
  CHECK_OK(c->Accum(more, 2, stored_values, not_there, runner));
  CHECK(c->Size() == 2 && c->Counters().evictions == before_count + 2);
  // Unbounded tables never evict; count is reset to 0.
  auto u = MakeTable(KeyType::kInt64, ValueType::kFloat32, 2);
  EvictedBuffers none(2, 2);
  none.entries.count = 77;
  CHECK_OK(u->AccumAndEvict(more, 2, stored_values, not_there, &none.entries, runner));
  CHECK(none.entries.count == 0 && u->Size() == 2);
}

// A score lowered by an explicit insert makes the key the next victim (the
// heap gets an entry for it); a new key tying the minimum evicts the stored one.
void TestLoweredScoresAndTies(const Runner& runner) {
  auto t = MakeBounded(KeyType::kInt64, EvictStrategy::kCustomized, 100);
  std::vector<int64_t> keys(100);
  std::vector<float> values(100, 1);
  std::vector<uint64_t> scores(100);
  for (int i = 0; i < 100; ++i) {
    keys[i] = i;
    scores[i] = 1000 + i;
  }
  CHECK_OK(t->Insert(keys.data(), 100, values.data(), scores.data(), runner));
  EvictedBuffers ev(1, 1);
  int64_t key = 1000;
  uint64_t score = 2000;
  CHECK_OK(t->InsertAndEvict(&key, 1, values.data(), &score, &ev.entries, runner));
  CHECK(ev.entries.count == 1 && ev.keys[0] == 0 && ev.scores[0] == 1000);
  const int64_t lowered = 57;
  const uint64_t low = 3;
  CHECK_OK(t->Insert(&lowered, 1, values.data(), &low, runner));
  key = 1001;
  CHECK_OK(t->InsertAndEvict(&key, 1, values.data(), &score, &ev.entries, runner));
  CHECK(ev.entries.count == 1 && ev.keys[0] == 57 && ev.scores[0] == 3);
  // Tie with the minimum (1001, key 1): the stored entry goes.
  key = 1002;
  score = 1001;
  CHECK_OK(t->InsertAndEvict(&key, 1, values.data(), &score, &ev.entries, runner));
  CHECK(ev.entries.count == 1 && ev.keys[0] == 1);
  CHECK(ExportScores(*t).count(1002) == 1 && t->Size() == 100);
}

// LRU with Find refreshing scores: the heap goes stale (entries below the
// rows' scores) and must still find the least recently used, without its
// memory growing over many rounds.
void TestStaleHeapUnderFindRefresh(const Runner& runner) {
  const int64_t kMax = 4096;
  auto t = MakeBounded(KeyType::kInt64, EvictStrategy::kLru, kMax, 1, /*find_updates_scores=*/true);
  std::vector<int64_t> keys(kMax);
  std::vector<float> values(kMax, 0), out(kMax);
  for (int64_t i = 0; i < kMax; ++i) keys[i] = i;
  CHECK_OK(t->Insert(keys.data(), kMax, values.data(), nullptr, runner));
  int64_t next = kMax;
  int64_t memory_after_first_round = 0;
  const float def = -1;
  for (int round = 0; round < 20; ++round) {
    // Touch all but the 256 stored keys of lowest (score, key), then insert
    // 256 new ones: exactly the untouched keys must go. (Every round leaves
    // exactly 256 keys at the older score, so the cut is never inside a tie.)
    std::map<int64_t, uint64_t> stored = ExportScores(*t);
    std::vector<int64_t> order;
    for (const auto& [k, s] : stored) order.push_back(k);
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return stored[a] != stored[b] ? stored[a] < stored[b] : a < b;
    });
    std::vector<int64_t> untouched(order.begin(), order.begin() + 256);
    std::vector<int64_t> touched(order.begin() + 256, order.end());
    CHECK_OK(t->Find(touched.data(), touched.size(), out.data(), nullptr, &def, false, runner));
    std::vector<int64_t> fresh(256);
    for (auto& k : fresh) k = next++;
    EvictedBuffers ev(256, 1);
    CHECK_OK(t->InsertAndEvict(fresh.data(), 256, values.data(), nullptr, &ev.entries, runner));
    CHECK(ev.entries.count == 256);
    std::vector<int64_t> got(ev.keys.begin(), ev.keys.end());
    std::sort(got.begin(), got.end());
    std::sort(untouched.begin(), untouched.end());
    CHECK(got == untouched);
    CHECK(t->Size() == kMax);
    if (round == 0) memory_after_first_round = t->MemoryBytes();
  }
  // Stale entries are compacted: memory does not grow with the rounds.
  CHECK(t->MemoryBytes() <= memory_after_first_round * 3 / 2);
}

// Many threads insert (with and without reporting), accumulate, remove,
// export (whole and in chunks) and clear small bounded tables, with parallel
// runners, while another thread watches Size(): it never exceeds
// max_capacity, each batch reports at most n entries, and the final content
// agrees with Size(). max_capacity 1 also exercises the "budget all reserved
// by other passes" fallback.
void TestConcurrentBounded() {
  for (int64_t max_capacity : {int64_t{1}, int64_t{37}, int64_t{1000}}) {
    for (EvictStrategy strategy : {EvictStrategy::kLru, EvictStrategy::kLfu}) {
      auto t = MakeBounded(KeyType::kInt64, strategy, max_capacity, 4);
      ThreadRunner runner(2);
      std::atomic<bool> stop{false};
      std::atomic<int64_t> max_seen{0};
      std::thread watcher([&] {
        while (!stop.load()) {
          const int64_t s = t->Size();
          if (s > max_seen.load()) max_seen = s;
        }
      });
      try {
        RunThreads(8, [&](int id) {
          uint64_t x = 0x9E3779B97F4A7C15ULL * (id + 1);
          auto next = [&x] {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            return x;
          };
          std::vector<int64_t> keys(5000);
          std::vector<float> values(5000 * 4, 1.0f);
          std::vector<char> exists(5000);
          for (int iter = 0; iter < 60; ++iter) {
            const int64_t n = iter % 10 == 0 ? 5000 : static_cast<int64_t>(next() % 300);
            for (int64_t i = 0; i < n; ++i) keys[i] = static_cast<int64_t>(next() % 20000);
            switch (next() % 5) {
              case 4: {  // whole-table readers (and a rare Clear) meanwhile
                // ExportChunks is no snapshot (keys evicted and inserted while
                // it runs may both be visited), but it never visits a key twice.
                std::set<int64_t> seen;
                bool duplicate = false;
                CHECK_OK(t->ExportChunks(97, [&](const void* k, int64_t m, const void*,
                                                 const uint64_t*) {
                  for (int64_t r = 0; r < m; ++r) {
                    duplicate |= !seen.insert(static_cast<const int64_t*>(k)[r]).second;
                  }
                  return Status::Ok();
                }));
                CHECK(!duplicate);
                VectorSink sink(4);  // Export is a snapshot
                CHECK_OK(t->Export(&sink, SerialRunner()));
                CHECK(sink.n <= max_capacity);
                if (iter == 30 && id == 0) t->Clear();
                break;
              }
              case 0: {
                EvictedBuffers ev(n, 4);
                CHECK_OK(t->InsertAndEvict(keys.data(), n, values.data(), nullptr, &ev.entries,
                                           runner));
                CHECK(ev.entries.count >= 0 && ev.entries.count <= n);
                break;
              }
              case 1:
                CHECK_OK(t->Insert(keys.data(), n, values.data(), nullptr, runner));
                break;
              case 2: {
                for (int64_t i = 0; i < n; ++i) exists[i] = next() % 2;
                const bool* e = reinterpret_cast<bool*>(exists.data());
                if (next() % 2 == 0) {
                  CHECK_OK(t->Accum(keys.data(), n, values.data(), e, runner));
                } else {
                  EvictedBuffers ev(n, 4);
                  CHECK_OK(t->AccumAndEvict(keys.data(), n, values.data(), e, &ev.entries,
                                            runner));
                  CHECK(ev.entries.count >= 0 && ev.entries.count <= n);
                }
                break;
              }
              default:
                CHECK_OK(t->Remove(keys.data(), n / 3, runner));
            }
            CHECK(t->Size() <= max_capacity);
          }
        });
      } catch (...) {
        stop = true;
        watcher.join();
        throw;
      }
      stop = true;
      watcher.join();
      CHECK(max_seen.load() <= max_capacity);
      VectorSink sink(4);
      CHECK_OK(t->Export(&sink, SerialRunner()));
      CHECK(sink.n == t->Size() && sink.n <= max_capacity);
      // Quiescent: the budget is all returned, so the table fills up again.
      t->Clear();
      std::vector<int64_t> keys(max_capacity);
      std::vector<float> values(max_capacity * 4, 0.0f);
      for (int64_t i = 0; i < max_capacity; ++i) keys[i] = i;
      EvictedBuffers ev(max_capacity, 4);
      CHECK_OK(t->InsertAndEvict(keys.data(), max_capacity, values.data(), nullptr, &ev.entries,
                                 runner));
      CHECK(ev.entries.count == 0 && t->Size() == max_capacity);
    }
  }
}

// A dim-3 float32 LRU table (bounded if max_capacity > 0) after inserting keys
// i * 2654435761 with rows [i, i + 1, i + 2], i < 20,000, in batches of 1,000;
// `values` gets those rows.
std::unique_ptr<Table> Filled20kTable(int64_t max_capacity, std::vector<float>* values) {
  SerialRunner serial;
  auto t = MakeTable(KeyType::kInt64, ValueType::kFloat32, 3, EvictStrategy::kLru, max_capacity);
  const int64_t n = 20000;
  std::vector<int64_t> keys(n);
  values->resize(3 * n);
  for (int64_t i = 0; i < n; ++i) {
    keys[i] = i * 2654435761LL;
    for (int j = 0; j < 3; ++j) (*values)[3 * i + j] = static_cast<float>(i + j);
  }
  for (int64_t b = 0; b < n; b += 1000) {
    CHECK_OK(t->Insert(keys.data() + b, 1000, values->data() + 3 * b, nullptr, serial));
  }
  return t;
}

// Export copies shards (or, bounded, ranges of the age order) in parallel:
// the result is the serial one, entry for entry.
void TestParallelExport() {
  ThreadRunner threads(3);
  SerialRunner serial;
  for (const int64_t max_capacity : {int64_t{0}, int64_t{15000}}) {
    std::vector<float> values;
    auto t = Filled20kTable(max_capacity, &values);
    VectorSink one(3), many(3);
    CHECK_OK(t->Export(&one, serial));
    CHECK_OK(t->Export(&many, threads));
    CHECK(one.n == t->Size() && many.n == one.n);
    CHECK(one.keys == many.keys && one.values == many.values && one.scores == many.scores);
  }
}

// Snapshot: the size is known up front, Read gives Export's rows in Export's
// order (also in ranges read by several threads at once), bad ranges and sink
// errors come back as errors, and writers wait until the snapshot is gone.
void TestSnapshot() {
  SerialRunner serial;
  for (const int64_t max_capacity : {int64_t{0}, int64_t{15000}}) {
    std::vector<float> values;
    auto t = Filled20kTable(max_capacity, &values);
    VectorSink expected(3);
    CHECK_OK(t->Export(&expected, serial));
    std::unique_ptr<TableSnapshot> snap;
    CHECK_OK(t->Snapshot(&snap));
    CHECK(snap != nullptr && snap->size() == expected.n);
    const int64_t m = snap->size();
    // Three ranges on three threads, each in chunks of 7 rows.
    std::vector<int64_t> got_keys(m);
    std::vector<float> got_values(3 * m);
    std::vector<uint64_t> got_scores(m);
    const int64_t bounds[] = {0, m / 3, m / 3 + 1, m};
    std::vector<std::thread> readers;
    for (int p = 0; p < 3; ++p) {
      readers.emplace_back([&, p] {
        int64_t at = bounds[p];
        CHECK_OK(snap->Read(bounds[p], bounds[p + 1], 7,
                            [&](const void* k, int64_t rows, const void* v, const uint64_t* sc) {
                              CHECK(rows >= 1 && rows <= 7);
                              std::memcpy(&got_keys[at], k, rows * sizeof(int64_t));
                              std::memcpy(&got_values[3 * at], v, rows * 3 * sizeof(float));
                              std::memcpy(&got_scores[at], sc, rows * sizeof(uint64_t));
                              at += rows;
                              return Status::Ok();
                            }));
        CHECK(at == bounds[p + 1]);
      });
    }
    for (auto& r : readers) r.join();
    CHECK(got_keys == expected.keys && got_values == expected.values &&
          got_scores == expected.scores);
    // An empty range calls nothing; a range past the end is an error.
    CHECK_OK(snap->Read(5, 5, 7, [](const void*, int64_t, const void*, const uint64_t*) {
      CHECK(false);
      return Status::Ok();
    }));
    CHECK(snap->Read(0, m + 1, 7, nullptr).code() == StatusCode::kInvalidArgument);
    CHECK(snap->Read(0, m, 0, nullptr).code() == StatusCode::kInvalidArgument);
    Status stop = snap->Read(0, m, 10, [](const void*, int64_t, const void*, const uint64_t*) {
      return Status(StatusCode::kInternal, "stop");
    });
    CHECK(stop.code() == StatusCode::kInternal && stop.message() == "stop");
    // A writer waits for the snapshot's locks.
    std::atomic<bool> inserted{false};
    const int64_t new_key = -1;
    std::thread writer([&] {
      CHECK_OK(t->Insert(&new_key, 1, values.data(), nullptr, serial));
      inserted = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK(!inserted);
    snap.reset();
    writer.join();
    CHECK(inserted);
  }
  // String keys are viewed in place, in Export's order.
  auto s = MakeTable(KeyType::kString, ValueType::kFloat32, 1);
  std::vector<std::string> storage;
  for (int i = 0; i < 3000; ++i) storage.push_back("key-" + std::to_string(i * 7919));
  std::vector<std::string_view> views(storage.begin(), storage.end());
  std::vector<float> ones(storage.size(), 1.0f);
  CHECK_OK(s->Insert(views.data(), views.size(), ones.data(), nullptr, serial));
  VectorSink expected(1);
  CHECK_OK(s->Export(&expected, serial));
  std::unique_ptr<TableSnapshot> snap;
  CHECK_OK(s->Snapshot(&snap));
  std::vector<std::string> got;
  CHECK_OK(snap->Read(0, snap->size(), 1000,
                      [&](const void* k, int64_t rows, const void*, const uint64_t*) {
                        const auto* sk = static_cast<const std::string_view*>(k);
                        for (int64_t i = 0; i < rows; ++i) got.emplace_back(sk[i]);
                        return Status::Ok();
                      }));
  CHECK(got == expected.string_keys);
}

// ApplyRule: absent keys start from `initial`, present ones are updated in
// place, duplicates apply in batch order, the parameter rows come out.
void TestApplyRule(const Runner& runner) {
  const int64_t dim = 3;
  auto t = MakeTable(KeyType::kInt64, ValueType::kFloat32, 2 * dim);  // Adam: [m | v]
  const int64_t seeded_key[] = {5};
  const float seeded[] = {0.5f, 0.5f, 0.5f, 2, 2, 2};
  CHECK_OK(t->Insert(seeded_key, 1, seeded, nullptr, runner));
  const int64_t keys[] = {7, 5, 7};  // 7 absent, then updated again
  const float rows[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const float grads[] = {0.25f, -1, 2, 1, 1, 1, -0.5f, 0.5f, 4};
  const float initial[] = {0, 0, 0, 0, 0, 0};
  const float coef[] = {0.01f, 0.1f, 0.001f, 1e-7f};  // alpha, 1 - beta_1, 1 - beta_2, eps
  float out[9];
  RuleStep step;
  step.rule = UpdateRule::kKerasAdam;
  step.dim = dim;
  step.coefficients = coef;
  step.rows = rows;
  step.grads = grads;
  step.new_rows = out;
  CHECK_OK(t->ApplyRule(keys, 3, initial, step, runner));
  CHECK(t->Size() == 2);
  // The same steps written out, one row after the other.
  std::map<int64_t, std::vector<float>> state = {{7, std::vector<float>(initial, initial + 6)},
                                                 {5, std::vector<float>(seeded, seeded + 6)}};
  for (int i = 0; i < 3; ++i) {
    std::vector<float>& st = state[keys[i]];
    for (int64_t j = 0; j < dim; ++j) {
      const float g = grads[i * dim + j];
      float& m = st[j];
      float& v = st[dim + j];
      m = m + (g - m) * coef[1];
      v = v + (g * g - v) * coef[2];
      const float w = rows[i * dim + j] - (m * coef[0]) / (std::sqrt(v) + coef[3]);
      CHECK(out[i * dim + j] == w);
    }
  }
  const int64_t probe[] = {5, 7};
  float found[12];
  CHECK_OK(t->Find(probe, 2, found, nullptr, initial, false, runner));
  for (int j = 0; j < 6; ++j) CHECK(found[j] == state[5][j] && found[6 + j] == state[7][j]);
  const TableCounters c = t->Counters();
  CHECK(c.inserts == 2 && c.updates == 2);

  // Weight decay comes first: w - (w * wd) * lr, then the rule (here momentum).
  auto u = MakeTable(KeyType::kInt32, ValueType::kFloat64, 2);
  const int32_t ukeys[] = {1};
  const double urows[] = {10, -4};
  const double ugrads[] = {1, 2};
  const double uinit[] = {0.5, 0.5};
  const double ucoef[] = {0.1, 0.5, 0.25, 0.9};  // wd, lr, then lr, momentum
  double uout[2];
  RuleStep decayed;
  decayed.rule = UpdateRule::kKerasMomentum;
  decayed.dim = 2;
  decayed.weight_decay = true;
  decayed.coefficients = ucoef;
  decayed.rows = urows;
  decayed.grads = ugrads;
  decayed.new_rows = uout;
  CHECK_OK(u->ApplyRule(ukeys, 1, uinit, decayed, runner));
  for (int j = 0; j < 2; ++j) {
    const double w = urows[j] - (urows[j] * 0.1) * 0.5;
    const double m = 0.5 * 0.9 - ugrads[j] * 0.25;
    CHECK(uout[j] == w + m);
  }
}

void TestApplyRuleErrors() {
  SerialRunner runner;
  const int64_t keys[] = {1};
  const float row[] = {1, 2};
  float out[2];
  const float coef[] = {1, 1, 1};
  RuleStep step;
  step.rule = UpdateRule::kMomentum;
  step.dim = 2;
  step.coefficients = coef;
  step.rows = row;
  step.grads = row;
  step.new_rows = out;
  auto wrong_dim = MakeTable(KeyType::kInt64, ValueType::kFloat32, 4);
  Status s = wrong_dim->ApplyRule(keys, 1, row, step, runner);
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("must be 2, got 4") != std::string::npos);
  auto ints = MakeTable(KeyType::kInt64, ValueType::kInt32, 2);
  CHECK(ints->ApplyRule(keys, 1, row, step, runner).code() == StatusCode::kInvalidArgument);
  auto bounded = MakeTable(KeyType::kInt64, ValueType::kFloat32, 2, EvictStrategy::kLru, 10);
  CHECK(bounded->ApplyRule(keys, 1, row, step, runner).code() ==
        StatusCode::kFailedPrecondition);
  CHECK(bounded->Size() == 0);
  auto ok = MakeTable(KeyType::kInt64, ValueType::kFloat32, 2);
  step.grads = nullptr;
  CHECK(ok->ApplyRule(keys, 1, row, step, runner).code() == StatusCode::kInvalidArgument);
  step.grads = row;
  step.rule = static_cast<UpdateRule>(99);
  CHECK(ok->ApplyRule(keys, 1, row, step, runner).code() == StatusCode::kInvalidArgument);
  CHECK(ok->Size() == 0);
  UpdateRule parsed;
  CHECK(ParseUpdateRule("keras_adam", &parsed) && parsed == UpdateRule::kKerasAdam);
  CHECK(!ParseUpdateRule("adamw", &parsed));
  CHECK(UpdateRuleSlots(UpdateRule::kAdamKernel) == 2 &&
        UpdateRuleCoefficients(UpdateRule::kAdamKernel) == 6);
}

// Concurrent steps on the same keys all count: with momentum 1 the
// accumulator is the sum of every gradient applied to the key.
void TestApplyRuleConcurrent() {
  auto t = MakeTable(KeyType::kInt64, ValueType::kFloat32, 1);
  const int threads = 4, rounds = 200, n = 5000;
  RunThreads(threads, [&](int) {
    SerialRunner runner;
    std::vector<int64_t> keys(n);
    for (int i = 0; i < n; ++i) keys[i] = i * 7919;
    const std::vector<float> ones(n, 1.0f), zero(1, 0.0f);
    std::vector<float> out(n);
    const float coef[] = {1, 1, 1};  // lr, momentum, lr * momentum
    RuleStep step;
    step.rule = UpdateRule::kMomentum;
    step.dim = 1;
    step.coefficients = coef;
    step.rows = ones.data();
    step.grads = ones.data();
    step.new_rows = out.data();
    for (int r = 0; r < rounds; ++r) CHECK_OK(t->ApplyRule(keys.data(), n, zero.data(), step, runner));
  });
  VectorSink sink(1);
  CHECK_OK(t->Export(&sink, SerialRunner()));
  CHECK(sink.n == n);
  for (int i = 0; i < n; ++i) CHECK(sink.values[i] == static_cast<float>(threads * rounds));
}


// CRC-32C: the standard check value, and extending equals one pass.
void TestCrc32c() {
  CHECK(Crc32c("123456789", 9) == 0xe3069283u);
  CHECK(Crc32c("", 0) == 0);
  std::string data;
  for (int i = 0; i < 1000; ++i) data.push_back(static_cast<char>(i * 37 + i / 7));
  for (size_t cut : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{501}, data.size()}) {
    CHECK(Crc32cExtend(Crc32c(data.data(), cut), data.data() + cut, data.size() - cut) ==
          Crc32c(data.data(), data.size()));
  }
  for (uint32_t v : {0u, 1u, 0xe3069283u, 0xffffffffu}) CHECK(UnmaskCrc32c(MaskCrc32c(v)) == v);
}

// A saved file of 300 int64 keys (dim 2) as the shard 1 of 3 of save `id`,
// its keys routed by ShardOfKey; and the keys.
std::string SavedShardFile(const Runner& runner, const std::string& id, SavedFile* saved,
                           std::vector<int64_t>* keys_out) {
  auto t = MakeTable(KeyType::kInt64, ValueType::kFloat32, 2);
  std::vector<int64_t> keys;
  std::vector<float> values;
  for (int64_t k = -2000; keys.size() < 300; ++k) {
    if (ShardOfKey(k, 3) != 1) continue;
    keys.push_back(k);
    values.push_back(static_cast<float>(k));
    values.push_back(0.5f);
  }
  CHECK_OK(t->Insert(keys.data(), keys.size(), values.data(), nullptr, runner));
  SaveOptions options;
  options.chunk_rows = 64;
  options.save_id = id;
  options.shard_index = 1;
  options.num_shards = 3;
  options.routed = true;
  MemorySink sink;
  CHECK_OK(SaveTable(*t, options, &sink, saved));
  CHECK(sink.closed);
  CHECK(saved->rows == 300 && saved->bytes == sink.data.size());
  if (keys_out != nullptr) *keys_out = keys;
  return sink.data;
}

// Every single-bit flip and every truncation of a version 2 file fails the
// load (kDataLoss past the header's first fields), and leaves the table as
// it was; what a manifest expects of a file is checked too.
void TestFileIntegrity(const Runner& runner) {
  SavedFile saved;
  std::vector<int64_t> keys;
  const std::string file = SavedShardFile(runner, "0123456789abcdef", &saved, &keys);
  const auto fresh = [&] {
    auto t = MakeTable(KeyType::kInt64, ValueType::kFloat32, 2);
    const int64_t k = 7;
    const float row[2] = {7, 7};
    CHECK_OK(t->Insert(&k, 1, row, nullptr, runner));
    return t;
  };
  {  // the file as written loads, with what it says about itself
    auto t = fresh();
    MemorySource source(file);
    std::vector<LoadedFile> loaded;
    CHECK_OK(LoadTable({&source}, *t, LoadOptions{}, runner, &loaded));
    CHECK(t->Size() == 300);
    CHECK(loaded[0].version == 2 && loaded[0].save_id == "0123456789abcdef");
    CHECK(loaded[0].shard_index == 1 && loaded[0].num_shards == 3 && loaded[0].routed);
    CHECK(loaded[0].rows == 300);
  }
  auto t = fresh();
  for (size_t bit = 0; bit < file.size() * 8; bit += (bit < 64 * 8 ? 1 : 13)) {
    std::string damaged = file;
    damaged[bit / 8] = static_cast<char>(damaged[bit / 8] ^ (1 << (bit % 8)));
    MemorySource source(damaged);
    const Status s = LoadTable({&source}, *t, LoadOptions{}, runner);
    CHECK(!s.ok());
    if (bit >= 32 * 8) CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(t->Size() == 1);
  }
  for (size_t cut = 0; cut < file.size(); cut += 97) {
    MemorySource source(file.substr(0, cut));
    const Status s = LoadTable({&source}, *t, LoadOptions{}, runner);
    CHECK(s.code() == StatusCode::kDataLoss);
    CHECK(t->Size() == 1);
  }
  {  // bytes after the footer
    MemorySource source(file + "x");
    CHECK(LoadTable({&source}, *t, LoadOptions{}, runner).code() == StatusCode::kDataLoss);
  }
  ExpectedFile expected{"0123456789abcdef", 1, 3, saved.rows, saved.bytes, saved.digest};
  const auto with = [&](const ExpectedFile& e) {
    LoadOptions options;
    options.expected = {e};
    MemorySource source(file);
    return LoadTable({&source}, *t, options, runner);
  };
  CHECK_OK(with(expected));
  CHECK(t->Size() == 300);
  t = fresh();
  ExpectedFile other = expected;
  other.save_id = "fedcba9876543210";
  Status s = with(other);
  CHECK(s.code() == StatusCode::kDataLoss && s.message().find("fedcba9876543210") != std::string::npos);
  other = expected;
  other.shard_index = 2;
  CHECK(with(other).code() == StatusCode::kDataLoss);
  other = expected;
  other.digest ^= 1;
  CHECK(with(other).code() == StatusCode::kDataLoss);
  other = expected;
  other.rows += 1;
  CHECK(with(other).code() == StatusCode::kDataLoss);
  CHECK(t->Size() == 1);

  // Routing: loaded as shard 1 of 3 every key belongs; as shard 0 they do
  // not (a swapped file), which verify_routing reports and filtering skips.
  LoadOptions routed;
  routed.num_shards = 3;
  routed.shard_index = 1;
  routed.verify_routing = true;
  MemorySource a(file);
  CHECK_OK(LoadTable({&a}, *t, routed, runner));
  CHECK(t->Size() == 300);
  t = fresh();
  routed.shard_index = 0;
  MemorySource b(file);
  s = LoadTable({&b}, *t, routed, runner);
  CHECK(s.code() == StatusCode::kDataLoss && s.message().find("shard 1 of 3") != std::string::npos);
  CHECK(t->Size() == 1);
  routed.verify_routing = false;
  MemorySource c(file);
  CHECK_OK(LoadTable({&c}, *t, routed, runner));
  CHECK(t->Size() == 0);
}

// A version 1 stream (the format before checksums) still loads.
void TestReadsVersion1(const Runner& runner) {
  std::string v1("DYNEMB\0\1", 8);
  const auto put = [&](const auto& v) { v1.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(uint32_t{1});
  put(uint32_t{1});  // int64 keys
  put(uint32_t{0});  // float32 values
  put(uint32_t{0});
  put(int64_t{2});
  put(uint64_t{2});
  for (int64_t k : {5, -9}) {
    put(k);
    put(uint64_t{42});
    put(static_cast<float>(k));
    put(1.5f);
  }
  put(uint64_t{0});
  put(uint64_t{2});
  auto t = MakeTable(KeyType::kInt64, ValueType::kFloat32, 2);
  MemorySource source(v1);
  std::vector<LoadedFile> loaded;
  CHECK_OK(LoadTable({&source}, *t, LoadOptions{}, runner, &loaded));
  CHECK(t->Size() == 2 && loaded[0].version == 1 && loaded[0].save_id.empty());
  const int64_t k = -9;
  float row[2];
  const float def[2] = {0, 0};
  CHECK_OK(t->Find(&k, 1, row, nullptr, def, false, runner));
  CHECK(row[0] == -9.0f && row[1] == 1.5f);
  // A newer format is refused with its version named.
  std::string v4 = v1;
  v4[8] = 4;
  MemorySource newer(v4);
  const Status s = LoadTable({&newer}, *t, LoadOptions{}, runner);
  CHECK(s.code() == StatusCode::kFailedPrecondition && s.message().find("version 4") != std::string::npos);
  CHECK(t->Size() == 2);
}

void TestManifest() {
  Manifest m;
  m.save_id = NewSaveId();
  CHECK(IsSaveId(m.save_id) && m.save_id != NewSaveId());
  m.key_type = KeyType::kString;
  m.value_type = ValueType::kBFloat16;
  m.dim = 12;
  m.partitioner = "custom";
  m.num_shards = 2;
  for (int32_t i = 0; i < 2; ++i) {
    m.files.push_back(ManifestFile{i, ShardFileName("emb", i, 2, m.save_id), 100u + i, 7u * i,
                                   0xdeadbeefu - i});
  }
  const std::string text = SerializeManifest(m);
  Manifest back;
  CHECK_OK(ParseManifest(text, &back));
  CHECK(back.save_id == m.save_id && back.key_type == m.key_type && back.value_type == m.value_type);
  CHECK(back.dim == 12 && back.partitioner == "custom" && back.num_shards == 2);
  CHECK(back.files.size() == 2 && back.files[1].name == m.files[1].name);
  CHECK(back.files[1].bytes == 101 && back.files[1].rows == 7 && back.files[1].digest == 0xdeadbeeeu);
  // Any damage (a changed byte, a cut) is detected.
  for (size_t i = 0; i < text.size(); ++i) {
    std::string damaged = text;
    damaged[i] = static_cast<char>(damaged[i] ^ 0x04);
    CHECK(!ParseManifest(damaged, &back).ok());
    CHECK(!ParseManifest(text.substr(0, i), &back).ok());
  }
  // The names a prefix owns, and the ones it does not.
  const std::string id = "0123456789abcdef";
  CHECK(NamesOwnedBy("emb-00001-of-00003." + id + ".dynemb", "emb", {}));
  CHECK(NamesOwnedBy("emb-00001-of-00003." + id + ".dynemb.tmp-" + id, "emb", {}));
  CHECK(NamesOwnedBy("emb.dynemb-manifest.tmp-" + id, "emb", {}));
  CHECK(NamesOwnedBy("emb-00000-of-00002.dynemb", "emb", {}));
  CHECK(NamesOwnedBy("emb-00000-of-00002.dynemb.tmp", "emb", {}));
  CHECK(NamesOwnedBy("mine." + id + ".dynemb", "emb", {"mine"}));
  CHECK(!NamesOwnedBy("emb.dynemb-manifest", "emb", {}));
  CHECK(!NamesOwnedBy("emb_rank1_size2-00000-of-00002." + id + ".dynemb", "emb", {}));
  CHECK(!NamesOwnedBy("emb-00001-of-00003.XYZ.dynemb", "emb", {}));
  CHECK(!NamesOwnedBy("embx-00001-of-00003." + id + ".dynemb", "emb", {}));
  CHECK(!NamesOwnedBy("other.txt", "emb", {}));
  int32_t index = -1, shards = -1;
  CHECK(ParseV1ShardFileName("emb-00002-of-00003.dynemb", "emb", &index, &shards));
  CHECK(index == 2 && shards == 3);
  CHECK(!ParseV1ShardFileName("emb-00002-of-00003." + id + ".dynemb", "emb", &index, &shards));
}

// ---- Change tracking (table.h "Change tracking") ----

// What ExportChanges reported for a window of an int64 -> float32 table.
struct Changes {
  std::map<int64_t, std::vector<float>> rows;
  std::set<int64_t> removed;
  bool complete = false;
  int64_t row_visits = 0;  // rows handed to the sink (each key at most once)
};

Changes ChangesOf(Table& t, const ChangeMark& since, const ChangeMark& until) {
  Changes c;
  const int64_t dim = t.options().dim;
  CHECK_OK(t.ExportChanges(
      since, until, 3,
      [&](const void* keys, int64_t n, const void* values, const uint64_t*) {
        CHECK(n >= 1 && n <= 3);
        const int64_t* k = static_cast<const int64_t*>(keys);
        const float* v = static_cast<const float*>(values);
        for (int64_t i = 0; i < n; ++i) {
          CHECK(c.rows.emplace(k[i], std::vector<float>(v + i * dim, v + (i + 1) * dim)).second);
          ++c.row_visits;
        }
        return Status::Ok();
      },
      [&](const void* keys, int64_t n) {
        const int64_t* k = static_cast<const int64_t*>(keys);
        for (int64_t i = 0; i < n; ++i) CHECK(c.removed.insert(k[i]).second);
        return Status::Ok();
      },
      &c.complete));
  return c;
}

ChangeMark MarkOf(Table& t) {
  ChangeMark m;
  CHECK_OK(t.Mark(&m));
  return m;
}

void TestChangeTracking(const Runner& runner) {
  auto t = MakeTable(KeyType::kInt64, ValueType::kFloat32, 2);
  const ChangeMark m0 = MarkOf(*t);
  std::vector<int64_t> keys;
  std::vector<float> values;
  for (int64_t i = 0; i < 100; ++i) {
    keys.push_back(i);
    values.push_back(static_cast<float>(i));
    values.push_back(-static_cast<float>(i));
  }
  CHECK_OK(t->Insert(keys.data(), 100, values.data(), nullptr, runner));
  const ChangeMark m1 = MarkOf(*t);
  CHECK(m1.epoch == m0.epoch && m1.stamp >= m0.stamp + 100);
  Changes all = ChangesOf(*t, m0, m1);
  CHECK(all.complete && all.rows.size() == 100 && all.removed.empty());
  CHECK(all.rows.at(7) == std::vector<float>({7, -7}));
  // An empty window: nothing.
  Changes none = ChangesOf(*t, m1, m1);
  CHECK(none.complete && none.rows.empty() && none.removed.empty());

  // Overwrite 3, accum into 4 and a new 200, remove 5 and 6 (and absent
  // 300), remove 8 then write it again; reads (scores refreshed or not) are
  // no writes.
  const int64_t over[] = {3};
  const float over_row[] = {30, 30};
  CHECK_OK(t->Insert(over, 1, over_row, nullptr, runner));
  const int64_t acc[] = {4, 200};
  const float deltas[] = {1, 1, 2, 2};
  const bool exists[] = {true, false};
  CHECK_OK(t->Accum(acc, 2, deltas, exists, runner));
  const int64_t gone[] = {5, 6, 300, 8};
  CHECK_OK(t->Remove(gone, 4, runner));
  const int64_t again[] = {8};
  const float again_row[] = {80, 80};
  CHECK_OK(t->Insert(again, 1, again_row, nullptr, runner));
  float read[20];
  const float def[2] = {0, 0};
  CHECK_OK(t->Find(keys.data(), 10, read, nullptr, def, false, runner));
  const ChangeMark m2 = MarkOf(*t);
  Changes window = ChangesOf(*t, m1, m2);
  CHECK(window.complete);
  CHECK(window.rows.size() == 4);
  CHECK(window.rows.at(3) == std::vector<float>({30, 30}));
  CHECK(window.rows.at(4) == std::vector<float>({5, -3}));
  CHECK(window.rows.at(200) == std::vector<float>({2, 2}));
  CHECK(window.rows.at(8) == std::vector<float>({80, 80}));
  CHECK(window.removed == std::set<int64_t>({5, 6}));
  // The two windows together: everything since m0, each key once; a key
  // written in the first window and removed in the second is a tombstone.
  Changes both = ChangesOf(*t, m0, m2);
  CHECK(both.complete && both.rows.size() == 99 && both.removed == std::set<int64_t>({5, 6}));
  // Marks in the wrong order are an error naming both stamps.
  Changes unused;
  const Status backwards = t->ExportChanges(
      m2, m1, 3, [](const void*, int64_t, const void*, const uint64_t*) { return Status::Ok(); },
      [](const void*, int64_t) { return Status::Ok(); }, &unused.complete);
  CHECK(backwards.code() == StatusCode::kInvalidArgument &&
        backwards.message().find(std::to_string(m2.stamp)) != std::string::npos);

  // ApplyRule (training write-back on a slot table) stamps its rows.
  auto slots = MakeTable(KeyType::kInt64, ValueType::kFloat32, 1);
  const ChangeMark s0 = MarkOf(*slots);
  const int64_t rk[] = {11};
  const float rrows[] = {1}, rgrads[] = {1}, rinit[] = {0};
  const float rcoef[] = {0.1f, 0.9f};
  float rout[1];
  RuleStep step;
  step.rule = UpdateRule::kKerasMomentum;
  step.dim = 1;
  step.coefficients = rcoef;
  step.rows = rrows;
  step.grads = rgrads;
  step.new_rows = rout;
  CHECK_OK(slots->ApplyRule(rk, 1, rinit, step, runner));
  const ChangeMark s1 = MarkOf(*slots);
  CHECK(ChangesOf(*slots, s0, s1).rows.count(11) == 1);

  // Clear starts a new epoch: the changes since an older mark are unknown.
  t->Clear();
  const ChangeMark m3 = MarkOf(*t);
  CHECK(m3.epoch != m2.epoch);
  CHECK(!ChangesOf(*t, m2, m3).complete);
  CHECK(ChangesOf(*t, m3, MarkOf(*t)).complete);

  // A table made without tracking says so.
  TableOptions o;
  o.dim = 2;
  o.track_changes = false;
  Status s;
  std::unique_ptr<Table> untracked = NewCpuTable(o, &s);
  CHECK_OK(s);
  ChangeMark mark;
  const Status refused = untracked->Mark(&mark);
  CHECK(refused.code() == StatusCode::kFailedPrecondition &&
        refused.message().find("track_changes") != std::string::npos);
}

// Evictions of a bounded table are tombstones; a tombstone log that had to
// drop entries makes older windows unknown (never wrong).
void TestChangeTrackingBounded(const Runner& runner) {
  auto t = MakeTable(KeyType::kInt64, ValueType::kFloat32, 1, EvictStrategy::kLru, 256);
  std::vector<int64_t> keys(256);
  std::vector<float> values(256, 1.0f);
  for (int64_t i = 0; i < 256; ++i) keys[i] = i;
  CHECK_OK(t->Insert(keys.data(), 256, values.data(), nullptr, runner));
  const ChangeMark m0 = MarkOf(*t);
  std::vector<int64_t> fresh(32);
  for (int64_t i = 0; i < 32; ++i) fresh[i] = 1000 + i;
  std::vector<int64_t> evicted_keys(32);
  EvictedEntries evicted;
  evicted.keys = evicted_keys.data();
  CHECK_OK(t->InsertAndEvict(fresh.data(), 32, values.data(), nullptr, &evicted, runner));
  CHECK(t->Size() <= 256);
  const ChangeMark m1 = MarkOf(*t);
  Changes c = ChangesOf(*t, m0, m1);
  CHECK(c.complete);
  std::set<int64_t> want_removed;
  evicted_keys.resize(static_cast<size_t>(evicted.count));
  for (int64_t k : evicted_keys) {
    if (k < 1000) want_removed.insert(k);
  }
  CHECK(!want_removed.empty());
  CHECK(c.removed == want_removed);
  for (const auto& row : c.rows) CHECK(row.first >= 1000);
  // Every present key of the window is in it, and nothing removed is.
  std::vector<float> out(32);
  std::unique_ptr<bool[]> found(new bool[32]);
  const float def = -1;
  CHECK_OK(t->FindRows(fresh.data(), 32, out.data(), found.get(), &def, false, false, runner));
  for (int64_t i = 0; i < 32; ++i) CHECK(found[i] == (c.rows.count(fresh[i]) == 1));

  // Churn far past the log's bound: the old window is now unknown, a window
  // opened just before the last batch is still exact.
  auto u = MakeTable(KeyType::kInt64, ValueType::kFloat32, 1, EvictStrategy::kLru, 128);
  const ChangeMark u0 = MarkOf(*u);
  ChangeMark before_last;
  for (int64_t round = 0; round < 200; ++round) {
    std::vector<int64_t> batch(64);
    for (int64_t i = 0; i < 64; ++i) batch[i] = round * 64 + i;
    if (round == 199) before_last = MarkOf(*u);
    CHECK_OK(u->Insert(batch.data(), 64, values.data(), nullptr, runner));
  }
  const ChangeMark u1 = MarkOf(*u);
  CHECK(!ChangesOf(*u, u0, u1).complete);
  Changes last = ChangesOf(*u, before_last, u1);
  CHECK(last.complete && last.rows.size() == 64 && last.removed.size() == 64);
  // Memory stays bounded by the table's size, not by the churn.
  CHECK(u->MemoryBytes() < int64_t{1} << 22);
}

// Concurrent writers and marks: every write lands in exactly one window.
void TestChangeMarksUnderWriters() {
  auto t = MakeTable(KeyType::kInt64, ValueType::kFloat32, 1);
  ThreadRunner runner(2);
  std::atomic<bool> stop{false};
  std::vector<ChangeMark> marks{MarkOf(*t)};
  const int kWriters = 3, kBatch = 50;
  std::atomic<int64_t> batches{0};
  std::thread marker([&] {
    while (!stop.load()) {
      marks.push_back(MarkOf(*t));
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  RunThreads(kWriters, [&](int w) {
    SerialRunner serial;
    std::vector<float> v(kBatch, 1.0f);
    for (int64_t b = 0; b < 200; ++b) {
      std::vector<int64_t> keys(kBatch);
      for (int i = 0; i < kBatch; ++i) keys[i] = (w * 1000000) + b * kBatch + i;
      CHECK_OK(t->Insert(keys.data(), kBatch, v.data(), nullptr, b % 2 ? static_cast<const Runner&>(serial) : runner));
      ++batches;
    }
  });
  stop = true;
  marker.join();
  marks.push_back(MarkOf(*t));
  CHECK(marks.size() > 2);
  std::set<int64_t> seen;
  for (size_t i = 0; i + 1 < marks.size(); ++i) {
    Changes c = ChangesOf(*t, marks[i], marks[i + 1]);
    CHECK(c.complete);
    for (const auto& row : c.rows) CHECK(seen.insert(row.first).second);
    // A batch is never split across windows.
    std::map<int64_t, int> per_batch;
    for (const auto& row : c.rows) ++per_batch[row.first / kBatch];
    for (const auto& b : per_batch) CHECK(b.second == kBatch);
  }
  CHECK(static_cast<int64_t>(seen.size()) == kWriters * 200 * kBatch);
}

// SaveChanges writes two files that LoadTable applies to a copy of the table
// as of the window's start, making it equal to the table at its end.
void TestSaveChangesRoundTrip(const Runner& runner) {
  for (KeyType kt : {KeyType::kInt64, KeyType::kString}) {
    auto t = MakeTable(kt, ValueType::kFloat32, 2);
    auto copy = MakeTable(kt, ValueType::kFloat32, 2);
    std::vector<int64_t> ikeys;
    std::vector<std::string> skeys;
    for (int64_t i = 0; i < 500; ++i) {
      ikeys.push_back(i * 31);
      skeys.push_back("key-" + std::to_string(i * 31));
    }
    std::vector<std::string_view> views(skeys.begin(), skeys.end());
    const auto keys = [&](int64_t from) -> const void* {
      return kt == KeyType::kString ? static_cast<const void*>(views.data() + from)
                                    : static_cast<const void*>(ikeys.data() + from);
    };
    std::vector<float> values(1000);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
    CHECK_OK(t->Insert(keys(0), 400, values.data(), nullptr, runner));
    MemorySink full;
    CHECK_OK(SaveTable(*t, 64, &full));
    MemorySource full_source(full.data);
    CHECK_OK(LoadTable({&full_source}, *copy, LoadOptions{100, true}, runner));
    const ChangeMark since = MarkOf(*t);
    CHECK_OK(t->Insert(keys(350), 150, values.data() + 2, nullptr, runner));  // 50 over, 100 new
    CHECK_OK(t->Remove(keys(0), 120, runner));
    const ChangeMark until = MarkOf(*t);
    MemorySink rows, removed;
    SavedFile rows_saved, removed_saved;
    bool complete = false;
    SaveOptions options;
    options.chunk_rows = 16;
    options.save_id = NewSaveId();
    CHECK_OK(SaveChanges(*t, since, until, options, &rows, &removed, &rows_saved, &removed_saved,
                         &complete));
    CHECK(complete && rows.closed && removed.closed);
    CHECK(rows_saved.rows == 150 && removed_saved.rows == 120);
    // The size bound of the issue: rows x (key + values) + keys, plus the
    // fixed header, block heads and footer.
    if (kt == KeyType::kInt64) {
      CHECK(rows.data.size() <= 150 * (8 + 8) * 11 / 10 + 256);
      CHECK(removed.data.size() <= 120 * 8 * 11 / 10 + 256);
    }
    // Removals first, then rows.
    MemorySource removed_source(removed.data), rows_source(rows.data);
    CHECK_OK(LoadTable({&removed_source}, *copy, LoadOptions{100, false}, runner));
    CHECK_OK(LoadTable({&rows_source}, *copy, LoadOptions{100, false}, runner));
    CHECK(copy->Size() == t->Size() && copy->Size() == 380);
    std::vector<float> a(1000), b(1000);
    std::unique_ptr<bool[]> ea(new bool[500]), eb(new bool[500]);
    const float def[2] = {-1, -1};
    CHECK_OK(t->Find(keys(0), 500, a.data(), ea.get(), def, false, runner));
    CHECK_OK(copy->Find(keys(0), 500, b.data(), eb.get(), def, false, runner));
    CHECK(a == b);
    for (int i = 0; i < 500; ++i) CHECK(ea[i] == eb[i] && ea[i] == (i >= 120));
    // A damaged delta file is refused and leaves the copy as it was.
    std::string bad = rows.data;
    bad[bad.size() / 2] ^= 0x10;
    MemorySource bad_source(bad);
    const int64_t before = copy->Size();
    CHECK(!LoadTable({&bad_source}, *copy, LoadOptions{100, false}, runner).ok());
    CHECK(copy->Size() == before);
    // A file without the row layouts of version 3 still says version 2.
    CHECK(full.data[8] == 2 && rows.data[8] == 3 && removed.data[8] == 3);
  }
}

void TestDeltaManifest() {
  DeltaManifest m;
  m.base_id = NewSaveId();
  m.base_serial = 3;
  m.sequence = 12;
  m.save_id = NewSaveId();
  DeltaItem table;
  table.identity = "model%2Femb";
  table.key_type = KeyType::kInt64;
  table.value_type = ValueType::kFloat32;
  table.dim = 8;
  table.num_shards = 2;
  table.replace = false;
  DeltaItem dense;
  dense.dense = true;
  dense.identity = "dense%2Fkernel";
  dense.alt = "variables%2F3";
  dense.shape = {16, 1};
  m.items = {table, dense};
  for (int32_t shard = 0; shard < 2; ++shard) {
    for (DeltaRole role : {DeltaRole::kRows, DeltaRole::kRemoved}) {
      m.files.push_back(DeltaFile{0, role, shard,
                                  DeltaFileStem(3, 12, 0, role, shard) + "." + m.save_id + ".dynemb",
                                  100u + shard, 7u, 0xabcdef01u});
    }
  }
  m.files.push_back(DeltaFile{1, DeltaRole::kDense, 0,
                              DeltaFileStem(3, 12, 1, DeltaRole::kDense, 0) + "." + m.save_id +
                                  ".dynemb",
                              64, 16, 1});
  const std::string text = SerializeDeltaManifest(m);
  DeltaManifest back;
  CHECK_OK(ParseDeltaManifest(text, &back));
  CHECK(back.base_id == m.base_id && back.base_serial == 3 && back.sequence == 12);
  CHECK(back.items.size() == 2 && !back.items[0].replace && back.items[0].num_shards == 2);
  CHECK(back.items[1].dense && back.items[1].alt == "variables%2F3" &&
        back.items[1].shape == std::vector<int64_t>({16, 1}));
  CHECK(back.files.size() == 5 && back.files[3].role == DeltaRole::kRemoved &&
        back.files[3].digest == 0xabcdef01u);
  for (size_t i = 0; i < text.size(); ++i) {
    std::string damaged = text;
    damaged[i] = static_cast<char>(damaged[i] ^ 0x04);
    CHECK(!ParseDeltaManifest(damaged, &back).ok());
    CHECK(!ParseDeltaManifest(text.substr(0, i), &back).ok());
  }
  // An item missing one of its files is damaged.
  DeltaManifest missing = m;
  missing.files.erase(missing.files.begin() + 1);
  const Status s = ParseDeltaManifest(SerializeDeltaManifest(missing), &back);
  CHECK(s.code() == StatusCode::kDataLoss && s.message().find("removed") != std::string::npos);
  // Names.
  uint64_t serial = 0, sequence = 0;
  CHECK(DeltaManifestName(3, 12) == "delta-000003-00000012.dynemb-delta");
  CHECK(ParseDeltaManifestName("delta-000003-00000012.dynemb-delta", &serial, &sequence));
  CHECK(serial == 3 && sequence == 12);
  CHECK(!ParseDeltaManifestName("delta-000003-00000012.dynemb-delta.tmp-" + m.save_id, &serial,
                                &sequence));
  CHECK(ParseDeltaFileName(m.files[0].name, &serial, &sequence) && sequence == 12);
  CHECK(ParseDeltaFileName("delta-000003-00000013.dynemb-delta.tmp-" + m.save_id, &serial,
                           &sequence) && sequence == 13);
  CHECK(!ParseDeltaFileName("delta-000003-00000013-0000-bogus-00000." + m.save_id + ".dynemb",
                            &serial, &sequence));
  CHECK(!ParseDeltaFileName("emb-00000-of-00001." + m.save_id + ".dynemb", &serial, &sequence));
}

}  // namespace
}  // namespace dynemb

int main() {
  using namespace dynemb;
  SerialRunner serial;
  ThreadRunner threads(3);
  struct Case {
    const char* name;
    std::function<void()> fn;
  } cases[] = {
      {"names_and_options", TestNamesAndOptions},
      {"value_ops", TestValueOps},
      {"int64_basics/serial", [&] { TestInt64Basics(serial); }},
      {"int64_basics/threads", [&] { TestInt64Basics(threads); }},
      {"strings_and_growth/serial", [&] { TestStringsAndGrowth(serial); }},
      {"strings_and_growth/threads", [&] { TestStringsAndGrowth(threads); }},
      {"chunk_arena", TestChunkArena},
      {"slot_array_pool", TestSlotArrayPool},
      {"huge_page_advice", TestHugePageAdvice},
      {"big_chunks/serial", [&] { TestBigChunks(serial, 0); }},
      {"big_chunks/threads", [&] { TestBigChunks(threads, 0); }},
      // 16,384 keys a shard: pooled slot arrays of 256 KiB from the start.
      {"big_chunks/pooled_slots", [&] { TestBigChunks(threads, int64_t{1} << 22); }},
      {"presized_batch/serial", [&] { TestPresizedBatch(serial); }},
      {"presized_batch/threads", [&] { TestPresizedBatch(threads); }},
      {"save_load", [&] { TestSaveLoad(threads); }},
      {"sharded_load", [&] { TestShardedLoad(threads); }},
      {"crc32c", TestCrc32c},
      {"file_integrity", [&] { TestFileIntegrity(threads); }},
      {"reads_version_1", [&] { TestReadsVersion1(serial); }},
      {"manifest", TestManifest},
      {"partition_is_stable", TestPartitionIsStable},
      {"batched_box_muller", TestBatchedBoxMuller},
      {"concurrent_writers", TestConcurrentWriters},
      {"concurrent_mixed", TestConcurrentMixed},
      {"bounded_lru_batches/serial", [&] { TestBoundedLruBatches(serial); }},
      {"bounded_lru_batches/threads", [&] { TestBoundedLruBatches(threads); }},
      {"evicted_entries_buffers", [&] { TestEvictedEntriesBuffers(serial); }},
      {"bounded_accum_reports/serial", [&] { TestBoundedAccumReports(serial); }},
      {"bounded_accum_reports/threads", [&] { TestBoundedAccumReports(threads); }},
      {"lowered_scores_and_ties", [&] { TestLoweredScoresAndTies(serial); }},
      {"stale_heap_under_find_refresh", [&] { TestStaleHeapUnderFindRefresh(serial); }},
      {"concurrent_bounded", TestConcurrentBounded},
      {"parallel_export", TestParallelExport},
      {"snapshot", TestSnapshot},
      {"apply_rule/serial", [&] { TestApplyRule(serial); }},
      {"apply_rule/threads", [&] { TestApplyRule(threads); }},
      {"apply_rule_errors", TestApplyRuleErrors},
      {"apply_rule_concurrent", TestApplyRuleConcurrent},
      {"change_tracking/serial", [&] { TestChangeTracking(serial); }},
      {"change_tracking/threads", [&] { TestChangeTracking(threads); }},
      {"change_tracking_bounded/serial", [&] { TestChangeTrackingBounded(serial); }},
      {"change_tracking_bounded/threads", [&] { TestChangeTrackingBounded(threads); }},
      {"change_marks_under_writers", TestChangeMarksUnderWriters},
      {"save_changes_round_trip", [&] { TestSaveChangesRoundTrip(threads); }},
      {"delta_manifest", TestDeltaManifest},
  };
  const char* only = std::getenv("CORE_TEST_ONLY");
  int failed = 0;
  for (const Case& c : cases) {
    if (only != nullptr && std::string(c.name).find(only) == std::string::npos) continue;
    std::printf("[ RUN  ] %s\n", c.name);
    std::fflush(stdout);
    try {
      c.fn();
      std::printf("[  OK  ] %s\n", c.name);
    } catch (const std::exception& e) {
      ++failed;
      std::printf("[ FAIL ] %s\n%s\n", c.name, e.what());
    }
    std::fflush(stdout);
  }
  if (failed > 0) {
    std::printf("%d core test case(s) FAILED (%d checks)\n", failed, g_checks.load());
    return 1;
  }
  std::printf("all core tests passed (%d checks)\n", g_checks.load());
  return 0;
}
