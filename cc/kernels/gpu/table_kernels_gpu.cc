// GPU registrations of the table ops (CUDA builds only; setup.py compiles
// cc/kernels/gpu/ when CUDA is enabled). The kernels are the CPU's
// (table_kernels.h); what differs is the resource the create op makes
// (gpu_table_resource.h) and which arguments stay in host memory:
//   * table handles, always;
//   * Size's and Stats' scalars: the core keeps them on the host;
//   * ApplyRule's coefficients, which the core reads on the host;
//   * the file ops' paths, save ids and staged loads, which only host code reads.
// Keys, values, scores, `exists` and every export / eviction output are in
// device memory. GPU tables take int32 and int64 keys: string-keyed tables
// have no GPU kernel, so TF places them on the CPU.

#include <initializer_list>

#include "cc/kernels/file_kernels.h"
#include "cc/kernels/gpu/gpu_table_resource.h"
#include "cc/kernels/table_kernels.h"
#include "cc/kernels/table_resource.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/types.h"

namespace dynemb {
namespace {

using ::tensorflow::DEVICE_GPU;
using ::tensorflow::DT_INT32;
using ::tensorflow::DT_INT64;

// Makes GPU tables.
class GpuCreateTableOp final : public CreateTableOp {
 public:
  using CreateTableOp::CreateTableOp;

 protected:
  absl::Status NewResource(tensorflow::OpKernelContext* ctx, TableResource** out) const override {
    return NewGpuTableResource(ctx, options(), key_dtype(), value_dtype(), value_shape(), out);
  }
};

constexpr std::initializer_list<tensorflow::DataType> kGpuKeyTypes = {DT_INT32, DT_INT64};

// Ops with keys (a Tkey attribute).
#define DYNEMB_REGISTER_GPU_KEYED(name, kernel)                       \
  REGISTER_KERNEL_BUILDER(Name(name)                                  \
                              .Device(DEVICE_GPU)                     \
                              .TypeConstraint("Tkey", kGpuKeyTypes)   \
                              .HostMemory("table_handle"),            \
                          kernel)

REGISTER_KERNEL_BUILDER(Name("DynembHashTable")
                            .Device(DEVICE_GPU)
                            .TypeConstraint("key_dtype", kGpuKeyTypes)
                            .HostMemory("table_handle"),
                        GpuCreateTableOp);
DYNEMB_REGISTER_GPU_KEYED("DynembTableFind", FindOp);
DYNEMB_REGISTER_GPU_KEYED("DynembTableInsert", InsertOp);
DYNEMB_REGISTER_GPU_KEYED("DynembTableInsertAndEvict", InsertAndEvictOp);
DYNEMB_REGISTER_GPU_KEYED("DynembTableAccum", AccumOp);
DYNEMB_REGISTER_GPU_KEYED("DynembTableAccumAndEvict", AccumAndEvictOp);
DYNEMB_REGISTER_GPU_KEYED("DynembTableRemove", RemoveOp);
DYNEMB_REGISTER_GPU_KEYED("DynembTableExport", ExportOp);
DYNEMB_REGISTER_GPU_KEYED("DynembTableImport", ImportOp);

#undef DYNEMB_REGISTER_GPU_KEYED

// The rule's per-step scalars are read by the host (RuleStep.coefficients).
REGISTER_KERNEL_BUILDER(Name("DynembTableApplyRule")
                            .Device(DEVICE_GPU)
                            .TypeConstraint("Tkey", kGpuKeyTypes)
                            .HostMemory("table_handle")
                            .HostMemory("coefficients"),
                        ApplyRuleOp);

REGISTER_KERNEL_BUILDER(Name("DynembTableClear").Device(DEVICE_GPU).HostMemory("table_handle"),
                        ClearOp);
REGISTER_KERNEL_BUILDER(
    Name("DynembTableSize").Device(DEVICE_GPU).HostMemory("table_handle").HostMemory("size"),
    SizeOp);
REGISTER_KERNEL_BUILDER(Name("DynembTableStats")
                            .Device(DEVICE_GPU)
                            .HostMemory("table_handle")
                            .HostMemory("size")
                            .HostMemory("capacity")
                            .HostMemory("max_capacity")
                            .HostMemory("load_factor")
                            .HostMemory("inserts")
                            .HostMemory("lookups")
                            .HostMemory("misses")
                            .HostMemory("evictions"),
                        StatsOp);
REGISTER_KERNEL_BUILDER(Name("DynembTableSaveToFile")
                            .Device(DEVICE_GPU)
                            .HostMemory("table_handle")
                            .HostMemory("dirpath")
                            .HostMemory("file_name")
                            .HostMemory("save_id")
                            .HostMemory("file_entry"),
                        SaveToFileOp);
REGISTER_KERNEL_BUILDER(Name("DynembTableStageLoad")
                            .Device(DEVICE_GPU)
                            .HostMemory("table_handle")
                            .HostMemory("manifest_paths")
                            .HostMemory("filepaths")
                            .HostMemory("expected_save_id")
                            .HostMemory("staged")
                            .HostMemory("save_ids"),
                        StageLoadOp);
REGISTER_KERNEL_BUILDER(Name("DynembTableCommitLoad")
                            .Device(DEVICE_GPU)
                            .HostMemory("table_handle")
                            .HostMemory("staged"),
                        CommitLoadOp);

}  // namespace
}  // namespace dynemb
