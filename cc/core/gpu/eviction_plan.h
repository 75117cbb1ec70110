// The second round of a batch that fills a bounded GPU table, replayed on the
// host: which rows insert, which stored entries they evict, which rows are
// turned away. Plain C++ (no CUDA), so the rule reads like the CPU core's
// MakeRoom and can be tested without a GPU.
//
// Setting (gpu_table.h, "Bounded tables"): the rows of keys present at the
// start of the batch have been applied. The remaining rows -- those of keys
// absent at the start -- now apply one by one in batch order. Such a row
//   * updates its key if an earlier row of this round inserted it (and it was
//     not evicted since);
//   * otherwise inserts it (accum: only rows with exists = false insert, and
//     only rows with exists = true update): into free room while the table is
//     below max_capacity, else by evicting the entry of lowest (score, age) of
//     the whole table -- or, when its own score is lower than that entry's,
//     the row is turned away (on equal scores the stored entry goes).
// Entries stored before this round are not written by it, so it evicts them
// in (score, age) order: the replay needs only the lowest ones, as many as
// there are rows (each row evicts at most one entry).

#ifndef DYNEMB_CORE_GPU_EVICTION_PLAN_H_
#define DYNEMB_CORE_GPU_EVICTION_PLAN_H_

#include <cstdint>
#include <vector>

#include "cc/core/score_rule.h"

namespace dynemb {

// What the replay reads. Arrays are indexed by batch position p in [0, n).
struct EvictionInput {
  int64_t n = 0;
  // key_of_row[p]: the dense id (< num_keys) of row p's key if it takes part
  // in this round, else kNotInRound.
  const uint32_t* key_of_row = nullptr;
  uint32_t num_keys = 0;
  const uint64_t* explicit_scores = nullptr;  // nullable (insert only)
  const bool* exists = nullptr;               // accum: per-row flags; nullptr for insert
  // The lowest-ranked stored entries, ascending by (score, age).
  const uint64_t* lowest_scores = nullptr;
  const uint64_t* lowest_ages = nullptr;
  int64_t num_lowest = 0;
  int64_t free_room = 0;  // max_capacity - size before the round (>= 0)
  ScoreRule rule{};
  uint64_t age_base = 0;  // row p is written at age age_base + p

  static constexpr uint32_t kNotInRound = 0xffffffffu;
};

// One stay of a key in the table during the round: inserted by row
// first_pos, last written by row last_pos (both batch positions). Its value
// is what rows first_pos..last_pos of the key make of it (insert: row
// last_pos's values; accum: first_pos's delta plus the deltas of the rows in
// between whose exists flag is true).
struct PlannedStay {
  uint32_t key = 0;  // dense key id
  uint32_t first_pos = 0;
  uint32_t last_pos = 0;
  uint64_t score = 0;
  uint64_t age = 0;
};

struct EvictionPlan {
  int64_t stored_evicted = 0;       // the first this many of the lowest entries go
  std::vector<PlannedStay> kept;    // stays that last to the end of the batch
  std::vector<PlannedStay> evicted; // stays ended by a later row's eviction
  std::vector<uint32_t> turned_away_pos;     // rows turned away, in batch order
  std::vector<uint64_t> turned_away_scores;  // ... with the score they had
  uint64_t inserts = 0;
  uint64_t updates = 0;
  uint64_t evictions = 0;  // stored + stays evicted + rows turned away
};

EvictionPlan PlanEvictions(const EvictionInput& in);

}  // namespace dynemb

#endif  // DYNEMB_CORE_GPU_EVICTION_PLAN_H_
