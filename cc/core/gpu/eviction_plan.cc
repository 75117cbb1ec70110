// See eviction_plan.h.

#include "cc/core/gpu/eviction_plan.h"

#include <set>
#include <tuple>

namespace dynemb {
namespace {

// A stay's rank; keys break no ties (ages are unique), they only make the
// set entries distinct and let the set name the key it holds.
using Rank = std::tuple<uint64_t, uint64_t, uint32_t>;  // (score, age, key)

struct Stay {
  bool present = false;
  PlannedStay planned;
  Rank rank() const { return Rank{planned.score, planned.age, planned.key}; }
};

class Replay {
 public:
  explicit Replay(const EvictionInput& in) : in_(in), stays_(in.num_keys), free_(in.free_room) {}

  EvictionPlan Run() {
    for (int64_t p = 0; p < in_.n; ++p) {
      const uint32_t key = in_.key_of_row[p];
      if (key == EvictionInput::kNotInRound) continue;
      Row(key, static_cast<uint32_t>(p));
    }
    for (const Stay& stay : stays_) {
      if (stay.present) plan_.kept.push_back(stay.planned);
    }
    return std::move(plan_);
  }

 private:
  void Row(uint32_t key, uint32_t p) {
    Stay& stay = stays_[key];
    const bool accum = in_.exists != nullptr;
    if (stay.present) {
      if (accum && !in_.exists[p]) return;  // present, exists = false: nothing
      const uint64_t score = Score(p, true, stay.planned.score);
      ranks_.erase(stay.rank());
      stay.planned.score = score;
      stay.planned.age = in_.age_base + p;
      stay.planned.last_pos = p;
      ranks_.insert(stay.rank());
      ++plan_.updates;
      return;
    }
    if (accum && in_.exists[p]) return;  // absent, exists = true: nothing
    const uint64_t score = Score(p, false, 0);
    if (!MakeRoom(p, score)) return;
    stay.present = true;
    stay.planned = PlannedStay{key, p, p, score, in_.age_base + p};
    ranks_.insert(stay.rank());
    ++plan_.inserts;
  }

  uint64_t Score(uint32_t p, bool existed, uint64_t old) const {
    if (in_.explicit_scores != nullptr) return in_.explicit_scores[p];
    return in_.rule.Score(existed, old);
  }

  // Room for a new key of `score` (row p): free room, or the lowest entry of
  // the table evicted, or false when the row is turned away.
  bool MakeRoom(uint32_t p, uint64_t score) {
    if (free_ > 0) {
      --free_;
      return true;
    }
    const bool have_stored = next_stored_ < in_.num_lowest;
    const bool have_stay = !ranks_.empty();
    ++plan_.evictions;
    if (!have_stored && !have_stay) {  // max_capacity entries, none known: cannot happen
      TurnAway(p, score);
      return false;
    }
    bool victim_is_stored = have_stored;
    if (have_stored && have_stay) {
      const Rank& top = *ranks_.begin();
      const uint64_t s = in_.lowest_scores[next_stored_], a = in_.lowest_ages[next_stored_];
      victim_is_stored = s != std::get<0>(top) ? s < std::get<0>(top) : a < std::get<1>(top);
    }
    const uint64_t victim_score = victim_is_stored ? in_.lowest_scores[next_stored_]
                                                   : std::get<0>(*ranks_.begin());
    if (score < victim_score) {
      TurnAway(p, score);
      return false;
    }
    if (victim_is_stored) {
      ++next_stored_;
      plan_.stored_evicted = next_stored_;
    } else {
      Stay& victim = stays_[std::get<2>(*ranks_.begin())];
      ranks_.erase(ranks_.begin());
      victim.present = false;
      plan_.evicted.push_back(victim.planned);
    }
    return true;
  }

  void TurnAway(uint32_t p, uint64_t score) {
    plan_.turned_away_pos.push_back(p);
    plan_.turned_away_scores.push_back(score);
  }

  const EvictionInput& in_;
  std::vector<Stay> stays_;
  std::set<Rank> ranks_;  // the stays present now
  int64_t free_;
  int64_t next_stored_ = 0;
  EvictionPlan plan_;
};

}  // namespace

EvictionPlan PlanEvictions(const EvictionInput& in) { return Replay(in).Run(); }

}  // namespace dynemb
