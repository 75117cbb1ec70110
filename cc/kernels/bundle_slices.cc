// Direct reads of a bundle's stored slices (bundle_slices.h says why).

#include "cc/kernels/bundle_slices.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/core/crc32c.h"
#include "tensorflow/core/protobuf/tensor_bundle.pb.h"
#include "tensorflow/core/util/saved_tensor_slice_util.h"
#include "tensorflow/core/util/tensor_bundle/naming.h"

namespace dynemb {
namespace {

// Whether `slice` asks for every row of the tensor `entry` describes.
bool CoversWhole(const tensorflow::TensorSlice& slice, const tensorflow::BundleEntryProto& entry) {
  if (slice.IsFullAt(0)) return true;
  return slice.start(0) == 0 && entry.shape().dim_size() > 0 &&
         slice.length(0) == entry.shape().dim(0).size();
}

}  // namespace

BundleSlices::BundleSlices(tensorflow::BundleReader* reader, std::string prefix,
                           tensorflow::Env* env)
    : reader_(reader), prefix_(std::move(prefix)), env_(env) {
  usable_ = reader_->status().ok() ? ReadHeader()
                                   : absl::UnimplementedError("the bundle did not open");
}

absl::Status BundleSlices::ReadHeader() {
  // Without the instruction TF's reader (absl's portable CRC) beats our fallback.
  if (!HaveCrc32cInstruction()) return absl::UnimplementedError("no CRC32C instruction");
  const std::string header_key = tensorflow::kHeaderEntryKey;
  reader_->Seek(header_key);
  tensorflow::BundleHeaderProto header;
  if (!reader_->Valid() || reader_->key() != header_key ||
      !header.ParseFromArray(reader_->value().data(), reader_->value().size())) {
    return absl::UnimplementedError("no bundle header");
  }
  const bool host_little = __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__;
  if ((header.endianness() == tensorflow::BundleHeaderProto::LITTLE) != host_little) {
    return absl::UnimplementedError("a bundle of the other byte order");
  }
  num_shards_ = header.num_shards();
  return absl::OkStatus();
}

absl::Status BundleSlices::Read(const std::string& name, const tensorflow::TensorSlice& slice,
                                tensorflow::Tensor* out) {
  TF_RETURN_IF_ERROR(usable_);
  // The full tensor's entry, then the stored slice's (keyed by name and extent).
  const auto entry_of = [this](const std::string& key, tensorflow::BundleEntryProto* entry) {
    reader_->Seek(key);
    if (!reader_->Valid() || reader_->key() != key) {
      return absl::UnimplementedError(absl::StrCat("no entry ", key));
    }
    if (!entry->ParseFromArray(reader_->value().data(), reader_->value().size())) {
      return absl::DataLossError(absl::StrCat("the checkpoint's index entry of ", key,
                                              " is damaged"));
    }
    return absl::OkStatus();
  };
  tensorflow::BundleEntryProto entry;
  TF_RETURN_IF_ERROR(entry_of(name, &entry));
  if (entry.slices_size() > 0) {
    const std::string slice_key = tensorflow::checkpoint::EncodeTensorNameSlice(name, slice);
    TF_RETURN_IF_ERROR(entry_of(slice_key, &entry));
  } else if (!CoversWhole(slice, entry)) {
    // A part of a tensor stored whole: the reader cuts it out.
    return absl::UnimplementedError(absl::StrCat(name, " is stored whole"));
  }
  const size_t bytes = out->TotalBytes();
  if (entry.size() != static_cast<int64_t>(bytes)) {
    return absl::DataLossError(absl::StrCat("the checkpoint's ", name, " holds ", entry.size(),
                                            " bytes for ", slice.DebugString(), ", expected ",
                                            bytes));
  }
  std::unique_ptr<tensorflow::RandomAccessFile>& file = files_[entry.shard_id()];
  if (file == nullptr) {
    TF_RETURN_IF_ERROR(env_->NewRandomAccessFile(
        tensorflow::DataFilename(prefix_, entry.shard_id(), num_shards_), &file));
  }
  char* data = const_cast<char*>(out->tensor_data().data());
  absl::string_view got;
  // The (offset, n, result, scratch) form: TF 2.16 has no other; newer TFs
  // mark it deprecated but still route every read through it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  TF_RETURN_IF_ERROR(file->Read(entry.offset(), bytes, &got, data));
#pragma GCC diagnostic pop
  if (got.size() != bytes) {
    return absl::DataLossError(absl::StrCat("read ", got.size(), " of ", bytes, " bytes of ",
                                            name, " from the checkpoint"));
  }
  if (got.data() != data) std::memmove(data, got.data(), bytes);
  const uint32_t stored = UnmaskCrc32c(entry.crc32c());
  const uint32_t computed = Crc32c(data, bytes);
  if (stored != computed) {
    return absl::DataLossError(absl::StrCat("Checksum does not match for ", name, " ",
                                            slice.DebugString(), ": stored ", stored,
                                            ", calculated on the restored bytes ", computed));
  }
  return absl::OkStatus();
}

}  // namespace dynemb
