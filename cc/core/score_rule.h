// The score a write gives an entry under each EvictStrategy (table.h), shared
// by the CPU table and the GPU table (host and device code), so the two
// cannot drift apart.

#ifndef DYNEMB_CORE_SCORE_RULE_H_
#define DYNEMB_CORE_SCORE_RULE_H_

#include <cstdint>

#include "cc/core/host_device.h"
#include "cc/core/table.h"

namespace dynemb {

// Per-batch score state: the batch's clock tick and epoch.
struct ScoreRule {
  EvictStrategy strategy;
  uint64_t clock;
  uint64_t epoch;

  // The score of a row written without an explicit score; `existed` says
  // whether the key was present, `old` is its score then.
  DYNEMB_HOST_DEVICE uint64_t Score(bool existed, uint64_t old) const {
    switch (strategy) {
      case EvictStrategy::kLru:
        return clock;
      case EvictStrategy::kLfu:
        // Saturates: an imported UINT64_MAX must not wrap to the lowest score.
        return existed ? (old == ~uint64_t{0} ? old : old + 1) : 1;
      case EvictStrategy::kEpochLru:
        // The clock saturates in the low 32 bits rather than wrapping below
        // older scores of the same epoch.
        return (epoch << 32) | (clock < 0xffffffffu ? clock : 0xffffffffu);
      case EvictStrategy::kEpochLfu: {
        if (existed && (old >> 32) == epoch) {
          const uint64_t freq = old & 0xffffffffu;
          return (epoch << 32) | (freq == 0xffffffffu ? freq : freq + 1);
        }
        return (epoch << 32) | 1;
      }
      case EvictStrategy::kCustomized:
        return existed ? old : 0;
    }
    return 0;
  }
};

}  // namespace dynemb

#endif  // DYNEMB_CORE_SCORE_RULE_H_
