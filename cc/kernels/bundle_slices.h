// Reads stored tensors and slices of a TF checkpoint bundle straight into
// caller buffers, checking each with the CPU's CRC32C instruction; the
// streaming restore (checkpoint_kernels.cc) reads through it.
//
// Why not BundleReader::LookupSlice alone: it checks every chunk's CRC32C
// with absl's portable code (TF's wheels are not built for SSE4.2), about
// 1-2 GB/s of one core: restoring a 10M-key Adam state (2.2 GB) spent ~1 s of
// CPU on it, beside the inserts, on a 2-core machine (docs/benchmarks.md,
// change 15). Where each chunk's bytes lie (data file, offset, size) and
// their masked CRC32C are in the bundle's index, which BundleReader lets us
// iterate. A read this reader cannot serve (no SSE4.2, a bundle of the other
// byte order, no stored slice of exactly those rows, some rows of a tensor
// stored whole) answers kUnimplemented, and the caller reads through
// LookupSlice instead.

#ifndef DYNEMB_KERNELS_BUNDLE_SLICES_H_
#define DYNEMB_KERNELS_BUNDLE_SLICES_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_slice.h"
#include "tensorflow/core/platform/env.h"
#include "tensorflow/core/util/tensor_bundle/tensor_bundle.h"

namespace dynemb {

class BundleSlices {
 public:
  // `reader` (opened on `prefix`) must outlive this object; the two are used
  // by one thread at a time. Data files are opened through `env`. A reader
  // that failed to open leaves every Read to fall back (to its error).
  BundleSlices(tensorflow::BundleReader* reader, std::string prefix, tensorflow::Env* env);

  // Reads the stored bytes of `name` for `slice` into `out` (shaped for the
  // slice): the stored slice equal to `slice`, or, with `slice` all rows, the
  // tensor stored whole. kDataLoss when the bytes do not match their CRC32C.
  absl::Status Read(const std::string& name, const tensorflow::TensorSlice& slice,
                    tensorflow::Tensor* out);

 private:
  absl::Status ReadHeader();

  tensorflow::BundleReader* const reader_;
  const std::string prefix_;
  tensorflow::Env* const env_;
  absl::Status usable_;  // not OK (kUnimplemented): every Read falls back
  int32_t num_shards_ = 1;
  std::map<int32_t, std::unique_ptr<tensorflow::RandomAccessFile>> files_;
};

}  // namespace dynemb

#endif  // DYNEMB_KERNELS_BUNDLE_SLICES_H_
