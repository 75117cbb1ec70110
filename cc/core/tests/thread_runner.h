// A Runner for the C++ core tests that really runs ranges on several threads,
// as the TF intra-op pool wrapper does (an exception leaving one of its
// threads ends the process, as it does in TensorFlow's pool).

#ifndef DYNEMB_CC_CORE_TESTS_THREAD_RUNNER_H_
#define DYNEMB_CC_CORE_TESTS_THREAD_RUNNER_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "cc/core/table.h"

namespace dynemb {

class ThreadRunner : public Runner {
 public:
  explicit ThreadRunner(int threads) : threads_(threads) {}
  void ParallelFor(int64_t n, int64_t, const std::function<void(int64_t, int64_t)>& fn) const override {
    if (n <= 0) return;
    const int64_t parts = std::min<int64_t>(threads_, n);
    std::vector<std::thread> workers;
    for (int64_t p = 1; p < parts; ++p) workers.emplace_back(fn, n * p / parts, n * (p + 1) / parts);
    fn(0, n / parts);
    for (auto& t : workers) t.join();
  }
  int Parallelism() const override { return threads_; }

 private:
  int threads_;
};

}  // namespace dynemb

#endif  // DYNEMB_CC_CORE_TESTS_THREAD_RUNNER_H_
