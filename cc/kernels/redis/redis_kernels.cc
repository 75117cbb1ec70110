// The kernel of DynembRedisTable (cc/ops/redis/redis_ops.cc): a CpuTableResource
// over a Redis table (cc/core/redis/redis_table.h). The other table ops'
// kernels (table_kernels.h) serve it unchanged. Built only with hiredis.

#include <cstdlib>
#include <memory>
#include <string>
#include <sys/stat.h>

#include "cc/core/redis/redis_config.h"
#include "cc/core/redis/redis_table.h"
#include "cc/kernels/table_kernels.h"
#include "cc/kernels/table_resource.h"
#include "tensorflow/core/framework/op_kernel.h"

namespace dynemb {
namespace {

bool FileExists(const std::string& path) {
  struct stat st;
  return !path.empty() && stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

class RedisCreateTableOp final : public CreateTableOp {
 public:
  explicit RedisCreateTableOp(tensorflow::OpKernelConstruction* ctx) : CreateTableOp(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("embedding_name", &embedding_name_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("redis_config_abs_dir", &config_path_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("redis_config_abs_dir_env", &config_env_));
  }

 protected:
  absl::Status NewResource(tensorflow::OpKernelContext*, TableResource** out) const override {
    std::string path;
    TF_RETURN_IF_ERROR(ConfigPath(&path));
    redis::RedisConfig config;
    Status status = redis::LoadRedisConfigFile(path, &config);
    if (!status.ok()) return ToTfStatus(status);
    std::unique_ptr<Table> table = redis::NewRedisTable(options(), config, embedding_name_, &status);
    if (!status.ok()) {
      return ToTfStatus(Status(status.code(), "Redis table '" + embedding_name_ + "' (config " +
                                                  path + "): " + status.message()));
    }
    // Loads go in place: a second table of the same buckets could not be filled aside.
    // table_store_mode 2 (this process's config): restores leave Redis as it is.
    *out = new CpuTableResource(std::move(table), key_dtype(), value_dtype(), value_shape(),
                                /*staged_loads=*/false,
                                /*keeps_content_in_checkpoints=*/config.table_store_mode != 2);
    return absl::OkStatus();
  }

 private:
  // TFRA's order: $<redis_config_abs_dir_env>, $TFRA_REDIS_CONFIG_PATH, the attr.
  absl::Status ConfigPath(std::string* path) const {
    for (const std::string& env : {config_env_, std::string("TFRA_REDIS_CONFIG_PATH")}) {
      const char* value = env.empty() ? nullptr : std::getenv(env.c_str());
      if (value == nullptr) continue;
      if (!FileExists(value)) {
        return absl::NotFoundError(absl::StrCat(
            "the Redis config file ", value, " named by the environment variable ", env,
            " does not exist: create it or unset ", env));
      }
      *path = value;
      return absl::OkStatus();
    }
    if (!FileExists(config_path_)) {
      return absl::NotFoundError(absl::StrCat(
          "no Redis config file: redis_config_abs_dir is '", config_path_, "' (no such file), and "
          "neither ", config_env_.empty() ? std::string("redis_config_abs_dir_env") : config_env_,
          " nor TFRA_REDIS_CONFIG_PATH is set"));
    }
    *path = config_path_;
    return absl::OkStatus();
  }

  std::string embedding_name_;
  std::string config_path_;
  std::string config_env_;
};

REGISTER_KERNEL_BUILDER(Name("DynembRedisTable").Device(tensorflow::DEVICE_CPU),
                        RedisCreateTableOp);

}  // namespace
}  // namespace dynemb
