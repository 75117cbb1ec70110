// Side-by-side driver for NVIDIA HierarchicalKV's (HKV's) own benchmark.
//
// Built by benchmarks/hkv/run_hkv.sh against the snapshot that scripts/hkv_snapshot.sh
// exports to build/hkv_snapshot (HKV's include/ and benchmark/). This file is ours; it
// compiles HKV's benchmark source unchanged (its `main` renamed by a macro) and calls
// HKV's own measurement function `test_one_api` (benchmark/merlin_hashtable_benchmark.cc.cu)
// the way HKV's `test_main` does: one table per (dim, memory mode), for each load factor
// and API `table->clear()` then two calls of `test_one_api`, best of the two. Unlike
// `test_main`, it passes the hit rate (share of the 1M keys of the timed call that are
// present), which `test_main` leaves at HKV's default 0.6, and it sets
// `max_hbm_for_vectors` in bytes.
//
// Each measurement prints one line `HKV_RESULT {json}`; `HKV_DEVICE {json}` describes the
// card. Flags (all optional):
//   --dims 8,64  --load-factors 0.5,0.75  --capacity 67108864  --batch 1048576
//   --hit-rates 0.6,1.0  --apis find,insert_or_assign,assign,find_or_insert@0.6
//     (an API runs at each of --hit-rates, or at its own list: api@0.6:1.0)
//   --hybrid 0.5 (fractions of the value rows in HBM, at --hybrid-dim 64 and
//     --hybrid-load-factor 0.5; "none" skips; "0.1,0.5" adds the 10% table, ~25 s
//     more: HKV pins 14 GiB of host memory for it)  --hybrid-apis find,insert_or_assign
//   Time on an H200: ~9 s to create each pure-HBM table (HKV launches a kernel and
//   synchronizes per 128-slot bucket), ~10 s the 50% hybrid one, ~0.2 s per
//   test_one_api call (it refills the table from host memory each time).
//   --quick  (dims 8,64, load 0.5, find/insert_or_assign at 0.6 and 1.0, no hybrid)
//   --upstream (run HKV's unchanged main instead: its full published table; slow)
//   --probe    (exit 0 when CUDA starts: run_hkv.sh's check of a carried binary)

// The headers HKV's benchmark includes, first, so the `main` macro below cannot reach
// into any of them (their include guards keep the second inclusion empty).
#include <assert.h>
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>
#include "benchmark_util.cuh"
#include "merlin_hashtable.cuh"

#define main hkv_upstream_main
#include "merlin_hashtable_benchmark.cc.cu"
#undef main

#ifndef HKV_COMMIT
#define HKV_COMMIT "unknown"
#endif

namespace side_by_side {

using HkvTable = nv::merlin::HashTable<K, V, S, EvictStrategy::kLru, Sm80>;

struct ApiName {
  const char* name;
  API_Select api;
};

const ApiName kApis[] = {
    {"find", API_Select::find},
    {"insert_or_assign", API_Select::insert_or_assign},
    {"assign", API_Select::assign},
    {"find_or_insert", API_Select::find_or_insert},
    {"find_ptr", API_Select::find_ptr},
    {"find_or_insert_ptr", API_Select::find_or_insert_ptr},
    {"insert_and_evict", API_Select::insert_and_evict},
    {"contains", API_Select::contains},
};

API_Select api_of(const std::string& name) {
  for (const auto& a : kApis) {
    if (name == a.name) return a.api;
  }
  std::cerr << "side_by_side: unknown api " << name << std::endl;
  std::exit(2);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::vector<double> split_f(const std::string& s) {
  std::vector<double> out;
  if (s == "none") return out;
  for (const auto& item : split(s)) out.push_back(std::stod(item));
  return out;
}

// An API with the hit rates to run it at: "find" (the --hit-rates) or
// "find@0.6:1.0".
struct ApiRun {
  std::string name;
  std::vector<double> hit_rates;  // empty: Config::hit_rates
};

std::vector<ApiRun> parse_apis(const std::string& s) {
  std::vector<ApiRun> out;
  for (const auto& item : split(s)) {
    ApiRun run;
    const auto at = item.find('@');
    run.name = item.substr(0, at);
    if (at != std::string::npos) {
      std::string rates = item.substr(at + 1);
      std::replace(rates.begin(), rates.end(), ':', ',');
      run.hit_rates = split_f(rates);
    }
    api_of(run.name);
    out.push_back(run);
  }
  return out;
}

struct Config {
  std::vector<double> dims{8, 64};
  std::vector<double> load_factors{0.50, 0.75};
  std::vector<double> hit_rates{0.6, 1.0};
  std::vector<ApiRun> apis = parse_apis(
      "find,insert_or_assign,assign,find_or_insert@0.6");
  std::vector<double> hybrid{0.50};
  std::vector<ApiRun> hybrid_apis = parse_apis("find,insert_or_assign");
  size_t hybrid_dim = 64;
  double hybrid_load_factor = 0.50;
  size_t capacity = 64 * 1024 * 1024UL;
  size_t batch = 1 * 1024 * 1024UL;
};

// Values of the table in bytes; HKV's pure-HBM `test_main` gives it this much HBM.
size_t value_bytes(size_t capacity, size_t dim) {
  return capacity * dim * sizeof(V);
}

// HKV places value memory in slices (core_kernels.cuh: get_slice_size): a slice goes to
// HBM while the remaining budget holds all of it, else to pinned host memory. So the
// fraction of rows really in HBM is the budget rounded down to whole slices.
size_t slice_bytes(size_t capacity, size_t dim, size_t bucket = 128) {
  const size_t min_slice = bucket * sizeof(V) * dim;
  const size_t total = value_bytes(capacity, dim);
  size_t slice = min_slice;
  if (total >= nv::merlin::GB(128)) {
    slice = nv::merlin::GB(16);
  } else if (total >= nv::merlin::GB(16)) {
    slice = nv::merlin::GB(2);
  } else if (total >= nv::merlin::GB(2)) {
    slice = nv::merlin::MB(128);
  } else if (total >= nv::merlin::MB(128)) {
    slice = nv::merlin::MB(16);
  } else if (total >= nv::merlin::MB(16)) {
    slice = nv::merlin::MB(1);
  }
  return std::max(min_slice, slice);
}

const auto kStart = std::chrono::steady_clock::now();

double since_start() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - kStart)
      .count();
}

// Tables are kept until the process exits: HKV's destructor frees its bucket memory
// one bucket at a time (~10 s for 64M slots), which the CUDA context's teardown at exit
// does at once. Every table fits beside the others (H100: ~35 GiB of HBM for all).
std::vector<std::shared_ptr<HkvTable>> kept_tables;

void run_table(const Config& cfg, size_t dim, const char* mode,
               double hbm_fraction_requested, const std::vector<double>& lfs,
               const std::vector<ApiRun>& apis) {
  const size_t total = value_bytes(cfg.capacity, dim);
  size_t hbm_bytes = total;
  if (std::string(mode) == "hybrid") {
    // Round to the nearest whole slice (at least one): with 64M x dim 64 the slice is
    // 2 GiB = 1/8 of the values, so 10% becomes 12.5% (rounding down would give 0).
    const size_t slice = slice_bytes(cfg.capacity, dim);
    const double want = hbm_fraction_requested * total;
    size_t slices = static_cast<size_t>(std::llround(want / slice));
    if (slices < 1) slices = 1;
    hbm_bytes = std::min(total, slices * slice);
  }
  const double hbm_fraction = static_cast<double>(hbm_bytes) / total;

  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (free_b < hbm_bytes + nv::merlin::GB(2)) {
    std::cout << "HKV_SKIP {\"mode\": \"" << mode << "\", \"dim\": " << dim
              << ", \"reason\": \"free HBM " << free_b << " < " << hbm_bytes
              << " + 2 GiB\"}" << std::endl;
    return;
  }

  TableOptions options;
  options.init_capacity = cfg.capacity;
  options.max_capacity = cfg.capacity;
  options.dim = dim;
  options.max_hbm_for_vectors = hbm_bytes;
  options.io_by_cpu = false;
  auto t0 = std::chrono::steady_clock::now();
  std::shared_ptr<HkvTable> table = std::make_shared<HkvTable>();
  table->init(options);
  CUDA_CHECK(cudaDeviceSynchronize());
  const double init_s = std::chrono::duration<double>(
                            std::chrono::steady_clock::now() - t0)
                            .count();
  std::cout << "HKV_TABLE {\"mode\": \"" << mode << "\", \"dim\": " << dim
            << ", \"capacity\": " << table->capacity()
            << ", \"hbm_bytes\": " << hbm_bytes << ", \"value_bytes\": " << total
            << ", \"init_s\": " << init_s << ", \"t\": " << since_start() << "}"
            << std::endl;

  for (double lf : lfs) {
    for (const auto& run : apis) {
      const std::string& api_name = run.name;
      const API_Select api = api_of(api_name);
      for (double hit : run.hit_rates.empty() ? cfg.hit_rates : run.hit_rates) {
        auto t1 = std::chrono::steady_clock::now();
        table->clear();
        CUDA_CHECK(cudaDeviceSynchronize());
        // As HKV's test_main: two consecutive calls (the second without clear, so
        // it refills the same keys and, with hit rate < 1, meets the absent keys the
        // first call inserted), best of the two.
        const float r1 = test_one_api<HkvTable>(table, api, dim, cfg.capacity,
                                                cfg.batch, static_cast<float>(lf),
                                                static_cast<float>(hit));
        const float r2 = test_one_api<HkvTable>(table, api, dim, cfg.capacity,
                                                cfg.batch, static_cast<float>(lf),
                                                static_cast<float>(hit));
        const double wall = std::chrono::duration<double>(
                                std::chrono::steady_clock::now() - t1)
                                .count();
        const float best = std::max(r1, r2);
        const double unit = 1024.0 * 1024.0 * 1024.0;  // HKV's "billion" is 2^30
        std::cout << std::setprecision(6) << "HKV_RESULT {\"api\": \"" << api_name
                  << "\", \"dim\": " << dim << ", \"load_factor\": " << lf
                  << ", \"hit_rate\": " << hit << ", \"mode\": \"" << mode
                  << "\", \"hbm_fraction\": " << hbm_fraction
                  << ", \"hbm_fraction_requested\": " << hbm_fraction_requested
                  << ", \"capacity\": " << cfg.capacity
                  << ", \"batch\": " << cfg.batch
                  << ", \"hkv_gkv_per_s\": " << best
                  << ", \"keys_per_s\": " << std::setprecision(10) << best * unit
                  << ", \"first_keys_per_s\": " << r1 * unit
                  << ", \"second_keys_per_s\": " << r2 * unit
                  << std::setprecision(4) << ", \"wall_s\": " << wall
                  << ", \"t\": " << since_start() << "}" << std::endl;
      }
    }
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  kept_tables.push_back(table);
}

void print_device() {
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp props;
  CUDA_CHECK(cudaGetDeviceProperties(&props, device));
  int driver = 0, runtime = 0;
  CUDA_CHECK(cudaDriverGetVersion(&driver));
  CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  std::cout << "HKV_DEVICE {\"name\": \"" << props.name << "\", \"cc\": \""
            << props.major << "." << props.minor
            << "\", \"memory_bytes\": " << props.totalGlobalMem
            << ", \"sms\": " << props.multiProcessorCount
            << ", \"cuda_driver_api\": " << driver
            << ", \"cuda_runtime\": " << runtime << ", \"hkv_commit\": \""
            << HKV_COMMIT << "\"}" << std::endl;
}

}  // namespace side_by_side

int main(int argc, char** argv) {
  using namespace side_by_side;
  Config cfg;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "side_by_side: " << a << " needs a value" << std::endl;
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--upstream") {
      return hkv_upstream_main();
    } else if (a == "--probe") {  // can this binary start CUDA here? (run_hkv.sh)
      int n = 0;
      const cudaError_t err = cudaGetDeviceCount(&n);
      std::cout << (err == cudaSuccess ? "probe ok: " : "probe failed: ")
                << cudaGetErrorString(err) << ", " << n << " device(s)" << std::endl;
      return err == cudaSuccess && n > 0 ? 0 : 1;
    } else if (a == "--quick") {
      cfg.load_factors = {0.50};
      cfg.apis = parse_apis("find,insert_or_assign");
      cfg.hybrid.clear();
    } else if (a == "--dims") {
      cfg.dims = split_f(next());
    } else if (a == "--load-factors") {
      cfg.load_factors = split_f(next());
    } else if (a == "--hit-rates") {
      cfg.hit_rates = split_f(next());
    } else if (a == "--apis") {
      cfg.apis = parse_apis(next());
    } else if (a == "--hybrid") {
      cfg.hybrid = split_f(next());
    } else if (a == "--hybrid-apis") {
      cfg.hybrid_apis = parse_apis(next());
    } else if (a == "--hybrid-dim") {
      cfg.hybrid_dim = std::stoul(next());
    } else if (a == "--hybrid-load-factor") {
      cfg.hybrid_load_factor = std::stod(next());
    } else if (a == "--capacity") {
      cfg.capacity = std::stoul(next());
    } else if (a == "--batch") {
      cfg.batch = std::stoul(next());
    } else if (a == "-h" || a == "--help") {
      std::cout << "usage: side_by_side [--quick] [--dims 8,64] [--load-factors "
                   "0.5,0.75] [--hit-rates 0.6,1.0] [--apis "
                   "find,insert_or_assign,assign,find_or_insert@0.6] [--hybrid "
                   "0.5|0.1,0.5|none] [--hybrid-apis find,insert_or_assign] "
                   "[--hybrid-dim 64] [--hybrid-load-factor 0.5] [--capacity N] "
                   "[--batch N] [--upstream] [--probe]"
                << std::endl;
      return 0;
    } else {
      std::cerr << "side_by_side: unknown flag " << a << std::endl;
      return 2;
    }
  }
  try {
    CUDA_CHECK(cudaSetDevice(0));
    print_device();
    for (double d : cfg.dims) {
      test_mode = Test_Mode::pure_hbm;
      run_table(cfg, static_cast<size_t>(d), "pure_hbm", 1.0, cfg.load_factors,
                cfg.apis);
    }
    for (double f : cfg.hybrid) {
      test_mode = Test_Mode::hybrid;
      run_table(cfg, cfg.hybrid_dim, "hybrid", f, {cfg.hybrid_load_factor},
                cfg.hybrid_apis);
    }
    CUDA_CHECK(cudaDeviceSynchronize());
  } catch (const std::exception& e) {
    std::cerr << "HKV_ERROR " << e.what() << std::endl;
    return 1;
  }
  std::cout << "HKV_DONE {\"t\": " << since_start() << "}" << std::endl;
  // The kept tables are not destroyed (see kept_tables): leave without running static
  // destructors or CUDA's teardown; the driver releases the process's memory.
  std::fflush(nullptr);
  std::_Exit(0);
}
