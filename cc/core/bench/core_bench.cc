// Micro-benchmark of the CPU core without TensorFlow:
//   g++ -std=c++17 -O3 -pthread -I. cc/core/*.cc cc/core/cpu/*.cc \
//       cc/core/bench/core_bench.cc -o /tmp/core_bench && /tmp/core_bench [threads]
// Prints insert/find keys/s at 1M keys (dim 8 and 64), the insert rate while
// growing 1M -> 10M keys, and bytes per key at 10M keys; then, for bounded
// tables (dim 8, LRU): the insert rate below max_capacity, and the rate of
// inserts into a full table, each of which evicts; then the three table ops of
// a steady training step (keras_train.py's shared table: find, the fused Adam
// rule on the slot table, the parameter write-back), ns per key.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "cc/core/table.h"

namespace {

using Clock = std::chrono::steady_clock;

// Splits [0, n) statically over `threads` std::threads.
class ThreadRunner : public dynemb::Runner {
 public:
  explicit ThreadRunner(int threads) : threads_(threads) {}
  void ParallelFor(int64_t n, int64_t, const std::function<void(int64_t, int64_t)>& fn) const override {
    if (threads_ <= 1 || n < 2) {
      fn(0, n);
      return;
    }
    std::vector<std::thread> pool;
    const int64_t step = (n + threads_ - 1) / threads_;
    for (int64_t b = step; b < n; b += step) pool.emplace_back(fn, b, std::min(n, b + step));
    fn(0, std::min(n, step));
    for (auto& t : pool) t.join();
  }
  int Parallelism() const override { return threads_; }

 private:
  int threads_;
};

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::vector<int64_t> RandomKeys(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> keys(n);
  for (auto& k : keys) k = static_cast<int64_t>(rng());
  return keys;
}

void RunDim(int64_t dim, const ThreadRunner& runner) {
  constexpr int64_t kKeys = 1 << 20, kBatch = 65536;
  dynemb::TableOptions options;
  options.dim = dim;
  dynemb::Status status;
  auto table = dynemb::NewCpuTable(options, &status);
  std::vector<int64_t> keys = RandomKeys(kKeys, 1);
  std::vector<float> values(kBatch * dim, 1.0f), out(kBatch * dim), def(dim, 0.0f);
  std::vector<bool> dummy;
  std::unique_ptr<bool[]> exists(new bool[kBatch]);
  auto start = Clock::now();
  for (int64_t b = 0; b < kKeys; b += kBatch)
    table->Insert(keys.data() + b, kBatch, values.data(), nullptr, runner);
  const double insert_s = Seconds(start);
  // Overwrite pass (all keys present): the steady-state upsert rate.
  start = Clock::now();
  for (int64_t b = 0; b < kKeys; b += kBatch)
    table->Insert(keys.data() + b, kBatch, values.data(), nullptr, runner);
  const double upsert_s = Seconds(start);
  std::vector<int64_t> query = keys;
  std::shuffle(query.begin(), query.end(), std::mt19937_64(2));
  start = Clock::now();
  int64_t found = 0;
  for (int rep = 0; rep < 3; ++rep) {
    for (int64_t b = 0; b < kKeys; b += kBatch) {
      table->Find(query.data() + b, kBatch, out.data(), exists.get(), def.data(), false, runner);
      for (int64_t i = 0; i < kBatch; ++i) found += exists[i];
    }
  }
  const double find_s = Seconds(start) / 3;
  std::printf("dim %3lld: insert(new) %.1f M/s  upsert %.1f M/s  find %.1f M/s  (found %lld/%lld)\n",
              static_cast<long long>(dim), kKeys / insert_s / 1e6, kKeys / upsert_s / 1e6,
              kKeys / find_s / 1e6, static_cast<long long>(found / 3), static_cast<long long>(kKeys));
}

void RunGrowth(const ThreadRunner& runner) {
  constexpr int64_t kBatch = 65536, kTotal = 10 << 20;
  dynemb::TableOptions options;
  options.dim = 8;
  dynemb::Status status;
  auto table = dynemb::NewCpuTable(options, &status);
  std::vector<float> values(kBatch * 8, 1.0f);
  std::vector<int64_t> keys = RandomKeys(kTotal, 3);
  double first_million_s = 0, rest_s = 0;
  for (int64_t b = 0; b < kTotal; b += kBatch) {
    auto start = Clock::now();
    table->Insert(keys.data() + b, kBatch, values.data(), nullptr, runner);
    (b < (1 << 20) ? first_million_s : rest_s) += Seconds(start);
  }
  const double payload = 8 + 8 * 4;
  std::printf("growth dim 8: 0->1M %.1f M/s, 1M->10M %.1f M/s; size %lld, %.1f bytes/key (%.2fx payload)\n",
              (1 << 20) / first_million_s / 1e6, (kTotal - (1 << 20)) / rest_s / 1e6,
              static_cast<long long>(table->Size()),
              static_cast<double>(table->MemoryBytes()) / table->Size(),
              table->MemoryBytes() / table->Size() / payload);
}

// Bounded LRU table of 1M keys, dim 8: 1M new keys below max_capacity (the
// reservation path), then 1M more new keys, each evicting the oldest.
void RunBounded(const ThreadRunner& runner) {
  constexpr int64_t kKeys = 1 << 20, kBatch = 65536;
  dynemb::TableOptions options;
  options.dim = 8;
  options.max_capacity = kKeys;
  dynemb::Status status;
  auto table = dynemb::NewCpuTable(options, &status);
  std::vector<int64_t> keys = RandomKeys(2 * kKeys, 4);
  std::vector<float> values(kBatch * 8, 1.0f);
  auto start = Clock::now();
  for (int64_t b = 0; b < kKeys; b += kBatch)
    table->Insert(keys.data() + b, kBatch, values.data(), nullptr, runner);
  const double fill_s = Seconds(start);
  start = Clock::now();
  for (int64_t b = kKeys; b < 2 * kKeys; b += kBatch)
    table->Insert(keys.data() + b, kBatch, values.data(), nullptr, runner);
  const double evict_s = Seconds(start);
  std::printf("bounded dim 8: insert(new, below max) %.1f M/s  insert(full, evicting) %.1f M/s; "
              "size %lld, evictions %llu, %.1f bytes/key\n",
              kKeys / fill_s / 1e6, kKeys / evict_s / 1e6, static_cast<long long>(table->Size()),
              static_cast<unsigned long long>(table->Counters().evictions),
              static_cast<double>(table->MemoryBytes()) / table->Size());
}

// The table ops of a steady training step of keras_train.py's shared table
// (dim 16, Adam): a 655,360-key parameter table and its slot table (rows of
// 2 x 16), and calls of 51,200 distinct keys drawn from them at random (a
// step's distinct ids): Find in the parameter table, ApplyRule on the slot
// table, Insert of the new rows into the parameter table. ns per key of each,
// the median of 40 calls. A gauge for layout work (docs/benchmarks.md, "What
// the memory allows on this VM"): each op costs about the random cache lines
// it reads plus those it dirties, at whatever rate the machine sustains.
void RunTrainingStep(const ThreadRunner& runner) {
  constexpr int64_t kKeys = 655360, kBatch = 51200, kDim = 16, kCalls = 40;
  dynemb::TableOptions options;
  options.dim = kDim;
  dynemb::Status status;
  auto params = dynemb::NewCpuTable(options, &status);
  options.dim = 2 * kDim;
  auto slots = dynemb::NewCpuTable(options, &status);
  std::vector<int64_t> keys = RandomKeys(kKeys, 5);
  std::vector<float> fill(kKeys * 2 * kDim, 0.01f);
  params->Insert(keys.data(), kKeys, fill.data(), nullptr, runner);
  slots->Insert(keys.data(), kKeys, fill.data(), nullptr, runner);
  std::vector<int64_t> batch(kBatch);
  std::vector<float> rows(kBatch * kDim), grads(kBatch * kDim, 1e-3f), new_rows(kBatch * kDim);
  std::vector<float> initial(2 * kDim, 0.0f);
  std::unique_ptr<bool[]> exists(new bool[kBatch]);
  const float adam[4] = {1e-3f, 0.1f, 0.001f, 1e-7f};  // alpha, 1 - beta_1, 1 - beta_2, epsilon
  dynemb::RuleStep step;
  step.rule = dynemb::UpdateRule::kKerasAdam;
  step.dim = kDim;
  step.coefficients = adam;
  step.rows = rows.data();
  step.grads = grads.data();
  step.new_rows = new_rows.data();
  std::vector<double> find_s, rule_s, insert_s;
  std::mt19937_64 rng(6);
  for (int c = 0; c < kCalls; ++c) {
    // Distinct keys, in random order: a partial shuffle of the key set.
    for (int64_t i = 0; i < kBatch; ++i) std::swap(keys[i], keys[i + rng() % (kKeys - i)]);
    std::copy(keys.begin(), keys.begin() + kBatch, batch.begin());
    auto start = Clock::now();
    params->FindRows(batch.data(), kBatch, rows.data(), exists.get(), initial.data(), false, false,
                     runner);
    find_s.push_back(Seconds(start));
    start = Clock::now();
    const dynemb::Status rule = slots->ApplyRule(batch.data(), kBatch, initial.data(), step, runner);
    rule_s.push_back(Seconds(start));
    start = Clock::now();
    params->Insert(batch.data(), kBatch, new_rows.data(), nullptr, runner);
    insert_s.push_back(Seconds(start));
    if (!rule.ok()) {
      std::printf("training step: ApplyRule failed: %s\n", rule.message().c_str());
      return;
    }
  }
  const auto median_ns = [&](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2] * 1e9 / kBatch;
  };
  std::printf("training step (dim 16, Adam, %lld of %lld keys): find %.1f  apply_rule %.1f  "
              "insert %.1f ns/key\n",
              static_cast<long long>(kBatch), static_cast<long long>(kKeys), median_ns(find_s),
              median_ns(rule_s), median_ns(insert_s));
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  ThreadRunner runner(threads);
  std::printf("threads: %d\n", threads);
  RunDim(8, runner);
  RunDim(64, runner);
  RunGrowth(runner);
  RunBounded(runner);
  RunTrainingStep(runner);
  return 0;
}
