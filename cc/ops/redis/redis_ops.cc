// DynembRedisTable: a table kept in Redis (cc/core/redis/redis_table.h). Only
// built where hiredis is found (setup.py); every other table op
// (cc/ops/table_ops.cc) works on its handle.

#include "cc/ops/shape_fns.h"
#include "tensorflow/core/framework/op.h"

namespace dynemb {

REGISTER_OP("DynembRedisTable")
    .Output("table_handle: resource")
    .Attr("container: string = ''")
    .Attr("shared_name: string = ''")
    .Attr("use_node_name_sharing: bool = false")
    .Attr("anonymous: bool = false")
    .Attr("key_dtype: {int32, int64, string}")
    .Attr("value_dtype: {float, double, half, bfloat16, int8, int32, int64, bool}")
    .Attr("value_shape: shape = {}")
    .Attr("embedding_name: string")
    .Attr("redis_config_abs_dir: string = ''")
    .Attr("redis_config_abs_dir_env: string = 'TFRA_REDIS_CONFIG_PATH'")
    // The attributes of DynembHashTable the table kernels read; a Redis table
    // is unbounded and keeps no scores, so only their defaults are accepted.
    .Attr("init_capacity: int >= 0 = 0")
    .Attr("max_capacity: int = 0")
    .Attr("evict_strategy: {'lru'} = 'lru'")
    .Attr("step_per_epoch: int = 0")
    .Attr("find_updates_scores: bool = false")
    .Attr("max_hbm_for_values: int = -1")
    .Attr("track_changes: bool = false")
    .SetIsStateful()
    .SetShapeFn(TableHandleShape)
    .Doc(R"doc(
Connects to the Redis server or cluster of a TFRA RedisTable config file and
returns the handle of a table kept there, in TFRA's key layout.

The config file is, in order: the file named by the environment variable
`redis_config_abs_dir_env` (when that variable is set), the file named by
TFRA_REDIS_CONFIG_PATH (when set), else `redis_config_abs_dir`: read when the
table is created, as TFRA's kernel reads it.
embedding_name: the buckets' name (TFRA: the table name up to "_mht_").
)doc");

}  // namespace dynemb
