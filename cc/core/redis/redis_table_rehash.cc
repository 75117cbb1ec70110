// RedisTable's rehash when it opens (redis_table.h, "Rehash on open"): the
// rows of the import layout's buckets move to the buckets the runtime layout
// puts them in.

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "cc/core/redis/redis_table_impl.h"

namespace dynemb {
namespace redis {
namespace internal {

int RedisTable::BucketOfBytes(std::string_view key) const {
  const BatchKeys one(options_.key_type, 1, [&](size_t) { return key; });
  return BucketOf(one.data(), 0);
}

Status RedisTable::MoveFromImportLayout(const std::vector<std::pair<int, int>>& ranges) {
  // As TFRA: only within one model tag (another import tag is another model's
  // rows, which a table never moves).
  if (config_.model_tag_import != config_.model_tag_runtime) return Status::Ok();
  RedisConfig import = config_;
  import.storage_slice = config_.storage_slice_import;
  import.redis_hash_tags_runtime = config_.redis_hash_tags_import;
  const std::vector<std::string> sources = BucketNames(import, embedding_name_, ranges);
  if (sources == buckets_) return Status::Ok();  // one layout: nothing can be misplaced

  for (const std::string& source : sources) {
    NodePool* source_pool = router_.PoolFor(source);
    DYNEMB_RETURN_IF_ERROR(ScanBucket(source, [&](const std::vector<std::string_view>& keys,
                                                  const std::vector<const char*>& rows) {
      // HSETNX: a row already in its runtime bucket (written since, or moved by
      // another shard of the same variable opening at the same time) wins.
      std::map<int, std::vector<Command>> moves;
      Command remove;
      remove.Add("HDEL"), remove.Add(source);
      for (size_t j = 0; j < keys.size(); ++j) {
        const int target = BucketOfBytes(keys[j]);
        if (buckets_[target] == source) continue;
        Command c;
        c.Add("HSETNX"), c.Add(buckets_[target]);
        c.Add(keys[j].data(), keys[j].size()), c.Add(rows[j], value_bytes_);
        moves[target].push_back(std::move(c));
        remove.Add(keys[j].data(), keys[j].size());
      }
      if (moves.empty()) return Status::Ok();
      // Written first, removed after: a failure in between leaves a row in both
      // buckets (the next open moves it again), never in neither.
      for (auto& [target, commands] : moves) {
        std::vector<Reply> replies;
        DYNEMB_RETURN_IF_ERROR(router_.PoolFor(buckets_[target])->Run(commands, &replies, true));
        for (Reply& r : replies) {
          DYNEMB_RETURN_IF_ERROR(ReplyStatus(r.get(), "HSETNX into " + buckets_[target]));
        }
      }
      std::vector<Reply> replies;
      DYNEMB_RETURN_IF_ERROR(source_pool->Run({remove}, &replies, true));
      return ReplyStatus(replies[0].get(), "HDEL from " + source);
    }));
  }
  return Status::Ok();
}

}  // namespace internal
}  // namespace redis
}  // namespace dynemb
