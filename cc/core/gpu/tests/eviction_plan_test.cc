// Plain C++ tests of the bounded GPU table's second-round replay
// (cc/core/gpu/eviction_plan.h). The replay is host code, so unlike the rest
// of cc/core/gpu it runs without a GPU:
//
//   g++ -std=c++17 -O2 -I. cc/core/gpu/eviction_plan.cc
//       cc/core/gpu/tests/eviction_plan_test.cc -o /tmp/plan_test && /tmp/plan_test
//
// (tests/test_eviction_plan.py builds and runs it under pytest.) Hand-made
// cases check the rule itself (as tests/test_core_eviction.py states it for
// the tables); a randomized comparison checks the replay, which sees only the
// lowest-ranked stored entries, against a naive replay that scans the whole
// table for its minimum on every row.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cc/core/gpu/eviction_plan.h"

namespace dynemb {
namespace {

int failures = 0;

#define CHECK(cond)                                                   \
  do {                                                                \
    if (!(cond)) {                                                    \
      std::printf("%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                     \
    }                                                                 \
  } while (0)

constexpr uint32_t kOut = EvictionInput::kNotInRound;

// A round: stored entries (score, age), sorted by the test; rows of new keys.
struct Round {
  std::vector<uint64_t> stored_scores, stored_ages;  // ascending by (score, age)
  std::vector<uint32_t> key_of_row;
  std::vector<uint64_t> scores;  // explicit, or empty
  std::vector<char> exists;      // accum flags, or empty (insert)
  int64_t free_room = 0;
  ScoreRule rule{EvictStrategy::kLfu, 1, 0};
  uint64_t age_base = 1000;

  EvictionPlan Plan() const {
    EvictionInput in;
    in.n = static_cast<int64_t>(key_of_row.size());
    in.key_of_row = key_of_row.data();
    uint32_t keys = 0;
    for (uint32_t k : key_of_row) {
      if (k != kOut) keys = std::max(keys, k + 1);
    }
    in.num_keys = keys;
    in.explicit_scores = scores.empty() ? nullptr : scores.data();
    in.exists = exists.empty() ? nullptr : reinterpret_cast<const bool*>(exists.data());
    in.lowest_scores = stored_scores.data();
    in.lowest_ages = stored_ages.data();
    // As the table does: only as many of the lowest as there are rows.
    in.num_lowest = std::min<int64_t>(static_cast<int64_t>(stored_scores.size()), in.n);
    in.free_room = free_room;
    in.rule = rule;
    in.age_base = age_base;
    return PlanEvictions(in);
  }
};

// LFU: a full table of counts >= 2 turns a new key (count 1) away, and two rows
// of one new key are two attempts, both turned away.
void TestLfuTurnsAwayEveryRow() {
  Round r;
  r.stored_scores = {2, 2, 3};
  r.stored_ages = {5, 6, 1};
  r.key_of_row = {0, 0};
  const EvictionPlan plan = r.Plan();
  CHECK(plan.stored_evicted == 0);
  CHECK(plan.kept.empty() && plan.evicted.empty());
  CHECK((plan.turned_away_pos == std::vector<uint32_t>{0, 1}));
  CHECK((plan.turned_away_scores == std::vector<uint64_t>{1, 1}));
  CHECK(plan.evictions == 2 && plan.inserts == 0 && plan.updates == 0);
}

// A new key ties the lowest stored score: the stored entry goes.
void TestTieEvictsTheStoredEntry() {
  Round r;
  r.stored_scores = {1, 1, 4};
  r.stored_ages = {3, 7, 2};
  r.key_of_row = {0};
  const EvictionPlan plan = r.Plan();
  CHECK(plan.stored_evicted == 1);
  CHECK(plan.kept.size() == 1 && plan.kept[0].score == 1 && plan.kept[0].age == 1000);
  CHECK(plan.turned_away_pos.empty() && plan.evictions == 1 && plan.inserts == 1);
}

// Customized scores (tests/test_core_eviction.py): 80 (score 2) is turned
// away, 90 (score 3) replaces the stored 3.
void TestCustomizedScores() {
  Round r;
  r.rule = ScoreRule{EvictStrategy::kCustomized, 0, 0};
  r.stored_scores = {3, 4, 5, 8, 9};
  r.stored_ages = {10, 11, 12, 13, 14};
  r.key_of_row = {0, 1};
  r.scores = {2, 3};
  const EvictionPlan plan = r.Plan();
  CHECK(plan.stored_evicted == 1);
  CHECK((plan.turned_away_pos == std::vector<uint32_t>{0}));
  CHECK(plan.kept.size() == 1 && plan.kept[0].key == 1 && plan.kept[0].score == 3);
}

// Free room first; then a batch larger than the table evicts its own earlier
// keys (LRU: all new keys tie on the clock, the oldest write goes), and a
// later row of an evicted key inserts it again.
void TestBatchEvictsItsOwnKeys() {
  Round r;
  r.rule = ScoreRule{EvictStrategy::kLru, 9, 0};
  r.free_room = 2;
  r.key_of_row = {0, 1, 2, kOut, 0};
  const EvictionPlan plan = r.Plan();
  // 0 and 1 take the free room; 2 evicts 0 (oldest); row 4 (key 0) evicts 1.
  CHECK(plan.stored_evicted == 0);
  CHECK(plan.evicted.size() == 2);
  CHECK(plan.evicted[0].key == 0 && plan.evicted[0].first_pos == 0 && plan.evicted[0].last_pos == 0);
  CHECK(plan.evicted[1].key == 1);
  CHECK(plan.kept.size() == 2);
  CHECK(plan.inserts == 4 && plan.evictions == 2);
}

// Accum: only exists = false inserts an absent key; later rows with exists
// add (they extend the stay), rows without do nothing.
void TestAccumStay() {
  Round r;
  r.free_room = 5;
  r.key_of_row = {0, 0, 0, 0, 1};
  r.exists = {1, 0, 1, 0, 1};
  const EvictionPlan plan = r.Plan();
  CHECK(plan.kept.size() == 1);
  const PlannedStay& s = plan.kept[0];
  CHECK(s.key == 0 && s.first_pos == 1 && s.last_pos == 2 && s.score == 2 && s.age == 1002);
  CHECK(plan.inserts == 1 && plan.updates == 1 && plan.evictions == 0);
}

// ---------------------------------------------------------------------------
// Randomized: the replay against a naive one over the whole table.
// ---------------------------------------------------------------------------
struct NaiveEntry {
  bool stored;       // from before the round (index into the sorted stored list)
  uint32_t id;       // stored index, or key id
  uint64_t score, age;
  uint32_t first, last;
  bool present;
};

EvictionPlan NaivePlan(const Round& r) {
  std::vector<NaiveEntry> table;
  for (size_t i = 0; i < r.stored_scores.size(); ++i) {
    table.push_back({true, static_cast<uint32_t>(i), r.stored_scores[i], r.stored_ages[i], 0, 0, true});
  }
  EvictionPlan plan;
  int64_t free_room = r.free_room;
  std::vector<char> stored_gone(r.stored_scores.size(), 0);
  const auto find_key = [&](uint32_t key) -> NaiveEntry* {
    for (NaiveEntry& e : table) {
      if (!e.stored && e.present && e.id == key) return &e;
    }
    return nullptr;
  };
  for (uint32_t p = 0; p < r.key_of_row.size(); ++p) {
    const uint32_t key = r.key_of_row[p];
    if (key == kOut) continue;
    const bool accum = !r.exists.empty();
    NaiveEntry* e = find_key(key);
    if (e != nullptr) {
      if (accum && !r.exists[p]) continue;
      e->score = r.scores.empty() ? r.rule.Score(true, e->score) : r.scores[p];
      e->age = r.age_base + p;
      e->last = p;
      ++plan.updates;
      continue;
    }
    if (accum && r.exists[p]) continue;
    const uint64_t score = r.scores.empty() ? r.rule.Score(false, 0) : r.scores[p];
    if (free_room > 0) {
      --free_room;
    } else {
      NaiveEntry* victim = nullptr;
      for (NaiveEntry& c : table) {
        if (c.present && (victim == nullptr || std::tie(c.score, c.age) < std::tie(victim->score, victim->age))) {
          victim = &c;
        }
      }
      ++plan.evictions;
      if (victim == nullptr || score < victim->score) {
        plan.turned_away_pos.push_back(p);
        plan.turned_away_scores.push_back(score);
        continue;
      }
      victim->present = false;
      if (victim->stored) {
        stored_gone[victim->id] = 1;
      } else {
        plan.evicted.push_back(PlannedStay{victim->id, victim->first, victim->last, victim->score, victim->age});
      }
    }
    table.push_back({false, key, score, r.age_base + p, p, p, true});
    ++plan.inserts;
  }
  // Stored entries go in rank order: a prefix of the sorted list.
  while (plan.stored_evicted < static_cast<int64_t>(stored_gone.size()) &&
         stored_gone[plan.stored_evicted]) {
    ++plan.stored_evicted;
  }
  int64_t gone = 0;
  for (char g : stored_gone) gone += g;
  if (gone != plan.stored_evicted) plan.stored_evicted = -1;  // not a prefix: flags a failure
  for (const NaiveEntry& c : table) {
    if (!c.stored && c.present) plan.kept.push_back(PlannedStay{c.id, c.first, c.last, c.score, c.age});
  }
  return plan;
}

bool SameStays(std::vector<PlannedStay> a, std::vector<PlannedStay> b) {
  const auto key = [](const PlannedStay& s) {
    return std::make_tuple(s.key, s.first_pos, s.last_pos, s.score, s.age);
  };
  const auto less = [&](const PlannedStay& x, const PlannedStay& y) { return key(x) < key(y); };
  std::sort(a.begin(), a.end(), less);
  std::sort(b.begin(), b.end(), less);
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (key(a[i]) != key(b[i])) return false;
  }
  return true;
}

void TestAgainstNaiveReplay() {
  std::mt19937_64 rng(12345);
  const auto uniform = [&](uint64_t n) { return n == 0 ? 0 : rng() % n; };
  const EvictStrategy strategies[] = {EvictStrategy::kLru, EvictStrategy::kLfu,
                                      EvictStrategy::kEpochLfu, EvictStrategy::kCustomized};
  for (int trial = 0; trial < 3000; ++trial) {
    Round r;
    const EvictStrategy strategy = strategies[uniform(4)];
    r.rule = ScoreRule{strategy, 3 + uniform(3), uniform(2)};
    const size_t stored = uniform(30);
    std::vector<std::pair<uint64_t, uint64_t>> entries;
    for (size_t i = 0; i < stored; ++i) {
      entries.emplace_back(uniform(6), 10 * i + uniform(10));  // many score ties, unique ages
    }
    std::sort(entries.begin(), entries.end());
    for (const auto& e : entries) {
      r.stored_scores.push_back(e.first);
      r.stored_ages.push_back(e.second);
    }
    r.free_room = static_cast<int64_t>(uniform(4));
    const size_t n = uniform(40);
    const uint32_t pool = 1 + static_cast<uint32_t>(uniform(12));
    for (size_t p = 0; p < n; ++p) r.key_of_row.push_back(uniform(5) == 0 ? kOut : uniform(pool));
    if (strategy == EvictStrategy::kCustomized && uniform(2) == 0) {
      for (size_t p = 0; p < n; ++p) r.scores.push_back(uniform(7));
    } else if (uniform(3) == 0) {
      for (size_t p = 0; p < n; ++p) r.exists.push_back(uniform(2) == 0);
    }
    const EvictionPlan got = r.Plan();
    const EvictionPlan want = NaivePlan(r);
    const bool same = got.stored_evicted == want.stored_evicted && SameStays(got.kept, want.kept) &&
                      SameStays(got.evicted, want.evicted) &&
                      got.turned_away_pos == want.turned_away_pos &&
                      got.turned_away_scores == want.turned_away_scores &&
                      got.inserts == want.inserts && got.updates == want.updates &&
                      got.evictions == want.evictions;
    if (!same) {
      std::printf("trial %d differs: stored_evicted %lld vs %lld, kept %zu vs %zu, evicted %zu vs "
                  "%zu, turned away %zu vs %zu\n",
                  trial, static_cast<long long>(got.stored_evicted),
                  static_cast<long long>(want.stored_evicted), got.kept.size(), want.kept.size(),
                  got.evicted.size(), want.evicted.size(), got.turned_away_pos.size(),
                  want.turned_away_pos.size());
      ++failures;
      return;
    }
  }
}

}  // namespace
}  // namespace dynemb

int main() {
  dynemb::TestLfuTurnsAwayEveryRow();
  dynemb::TestTieEvictsTheStoredEntry();
  dynemb::TestCustomizedScores();
  dynemb::TestBatchEvictsItsOwnKeys();
  dynemb::TestAccumStay();
  dynemb::TestAgainstNaiveReplay();
  if (dynemb::failures != 0) {
    std::printf("%d eviction plan check(s) failed\n", dynemb::failures);
    return 1;
  }
  std::printf("all eviction plan tests passed\n");
  return 0;
}
