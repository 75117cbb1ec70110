// Key partitioning and key-seeded random rows in `tensorflow_dynemb._core_gpu`,
// on the device (PartitionKeysGpu, KeyedRandomRowsGpu: cc/core/gpu/keyed_gpu.h)
// and, for comparison in one module, on the host (ShardOfKey, KeyedRandomRow:
// cc/core/partition.h, the functions the TF CPU kernels call):
//
//   partition(keys, num_shards) -> int32 array of keys.shape
//   keyed_random(keys, dim, seed, distribution, a, b, dtype) -> keys.shape + (dim,)
//   keyed_random_fill(values, exists, keys, dim, seed, distribution, a, b)
//       -> values with the rows of keys whose `exists` is false drawn anew
//   partition_host, keyed_random_host, keyed_random_fill_host: the same on the CPU.
//
// keys: int32 or int64 arrays (any shape); distribution: 'uniform', 'normal'
// or 'truncated_normal' (DynembKeyedRandom's attr); dtype: float32 or float64.
// The device functions copy their inputs to device memory, run the kernels on
// a stream of their own, copy the results back and synchronize before
// returning. Invalid arguments raise ValueError, CUDA failures RuntimeError.
//
// Compiled by the host compiler with the CUDA headers (runtime API only).

#include "cc/bindings_gpu/keyed_bindings.h"

#include <cuda_runtime_api.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "cc/core/gpu/gpu_table.h"  // CudaStatus
#include "cc/core/gpu/keyed_gpu.h"
#include "cc/core/partition.h"
#include "cc/core/table.h"

namespace dynemb {
namespace {

namespace py = pybind11;

void ThrowIfError(const Status& status) {
  if (status.ok()) return;
  if (status.code() == StatusCode::kInvalidArgument) throw py::value_error(status.message());
  throw std::runtime_error(status.message());
}

std::string Repr(const py::handle& obj) { return py::repr(obj).cast<std::string>(); }

// ---------------------------------------------------------------------------
// Arguments
// ---------------------------------------------------------------------------

enum class KeyKind { kInt32, kInt64 };

// A C-contiguous int32 or int64 array of `obj` (lists become int64 arrays).
py::array KeysArray(const py::handle& obj, const char* fn, KeyKind* kind) {
  py::array keys = py::array::ensure(obj, py::array::c_style);
  if (!keys) {
    throw py::value_error(std::string(fn) + ": keys must be an int32 or int64 array, got " +
                          Repr(obj));
  }
  if (keys.dtype().equal(py::dtype::of<int32_t>())) {
    *kind = KeyKind::kInt32;
  } else if (keys.dtype().equal(py::dtype::of<int64_t>())) {
    *kind = KeyKind::kInt64;
  } else {
    throw py::value_error(std::string(fn) + ": keys must be an int32 or int64 array, got dtype " +
                          Repr(keys.dtype()));
  }
  return keys;
}

std::vector<py::ssize_t> Shape(const py::array& a) {
  return std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim());
}

std::string ShapeString(const std::vector<py::ssize_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i > 0 ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

KeyedDistribution ParseDistribution(const std::string& name, const char* fn) {
  if (name == "uniform") return KeyedDistribution::kUniform;
  if (name == "normal") return KeyedDistribution::kNormal;
  if (name == "truncated_normal") return KeyedDistribution::kTruncatedNormal;
  throw py::value_error(std::string(fn) +
                        ": distribution must be 'uniform', 'normal' or 'truncated_normal', got '" +
                        name + "'");
}

// true for float32, false for float64.
bool ParseFloatDtype(const py::dtype& dtype, const char* what, const char* fn) {
  if (dtype.equal(py::dtype::of<float>())) return true;
  if (dtype.equal(py::dtype::of<double>())) return false;
  throw py::value_error(std::string(fn) + ": " + what + " must be float32 or float64, got " +
                        Repr(dtype));
}

// num_shards as int32: values outside int32 are refused here; values inside
// it reach the core's own check (device) or CheckNumShards (host).
int32_t NumShards(int64_t num_shards, const char* fn) {
  if (num_shards < std::numeric_limits<int32_t>::min() ||
      num_shards > std::numeric_limits<int32_t>::max()) {
    throw py::value_error(std::string(fn) + ": num_shards must be in [1, 2147483647], got " +
                          std::to_string(num_shards));
  }
  return static_cast<int32_t>(num_shards);
}

void CheckNumShards(int32_t num_shards, const char* fn) {
  if (num_shards < 1) {
    throw py::value_error(std::string(fn) + ": num_shards must be >= 1, got " +
                          std::to_string(num_shards));
  }
}

void CheckDimHost(int64_t dim, const char* fn) {
  if (dim < 1) {
    throw py::value_error(std::string(fn) + ": dim must be >= 1, got " + std::to_string(dim));
  }
}

// Elements of a keys.shape + (dim,) output: 0 when dim or the product is
// invalid (then nothing is allocated, and the core's checks report it).
int64_t RowElements(int64_t n, int64_t dim) {
  if (dim < 1 || (n > 0 && n > std::numeric_limits<int64_t>::max() / dim)) return 0;
  return n * dim;
}

std::vector<py::ssize_t> RowsShape(const py::array& keys, int64_t dim) {
  std::vector<py::ssize_t> shape = Shape(keys);
  shape.push_back(static_cast<py::ssize_t>(dim));
  return shape;
}

// ---------------------------------------------------------------------------
// Device staging
// ---------------------------------------------------------------------------

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }

  // Leaves the buffer null for 0 bytes.
  Status Allocate(size_t bytes) {
    if (bytes == 0) return Status::Ok();
    return CudaStatus(cudaMalloc(&ptr_, bytes), "cudaMalloc");
  }
  // Allocates `bytes` and copies them from `host` (on `stream`).
  Status CopyFrom(const void* host, size_t bytes, cudaStream_t stream) {
    DYNEMB_RETURN_IF_ERROR(Allocate(bytes));
    if (bytes == 0) return Status::Ok();
    return CudaStatus(cudaMemcpyAsync(ptr_, host, bytes, cudaMemcpyHostToDevice, stream),
                      "cudaMemcpyAsync to the device");
  }
  template <typename T>
  T* get() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

class Stream {
 public:
  Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() {
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
  }
  Status Create() {
    return CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                      "cudaStreamCreateWithFlags");
  }
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

Status CopyToHost(void* host, const void* device, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return Status::Ok();
  return CudaStatus(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream),
                    "cudaMemcpyAsync to the host");
}

template <typename K>
Status PartitionOnDevice(const K* keys, int64_t n, int32_t num_shards, int32_t* shard_ids) {
  Stream stream;
  DYNEMB_RETURN_IF_ERROR(stream.Create());
  const size_t count = n > 0 ? static_cast<size_t>(n) : 0;
  DeviceBuffer d_keys, d_ids;
  DYNEMB_RETURN_IF_ERROR(d_keys.CopyFrom(keys, count * sizeof(K), stream.get()));
  DYNEMB_RETURN_IF_ERROR(d_ids.Allocate(count * sizeof(int32_t)));
  DYNEMB_RETURN_IF_ERROR(
      PartitionKeysGpu<K>(d_keys.get<K>(), n, num_shards, d_ids.get<int32_t>(), stream.get()));
  DYNEMB_RETURN_IF_ERROR(
      CopyToHost(shard_ids, d_ids.get<int32_t>(), count * sizeof(int32_t), stream.get()));
  return CudaStatus(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
}

// rows (host, RowElements(n, spec.dim) elements) holds the values to keep
// where exists (host, n flags) is given; the drawn rows replace the others.
template <typename K, typename T>
Status KeyedRandomOnDevice(const K* keys, int64_t n, const KeyedRandomSpec& spec,
                           const bool* exists, T* rows) {
  Stream stream;
  DYNEMB_RETURN_IF_ERROR(stream.Create());
  const size_t count = n > 0 ? static_cast<size_t>(n) : 0;
  const size_t row_bytes = static_cast<size_t>(RowElements(n, spec.dim)) * sizeof(T);
  DeviceBuffer d_keys, d_exists, d_rows;
  DYNEMB_RETURN_IF_ERROR(d_keys.CopyFrom(keys, count * sizeof(K), stream.get()));
  if (exists != nullptr) {
    DYNEMB_RETURN_IF_ERROR(d_exists.CopyFrom(exists, count * sizeof(bool), stream.get()));
    DYNEMB_RETURN_IF_ERROR(d_rows.CopyFrom(rows, row_bytes, stream.get()));
  } else {
    DYNEMB_RETURN_IF_ERROR(d_rows.Allocate(row_bytes));
  }
  const bool* d_exists_or_null = exists != nullptr ? d_exists.get<bool>() : nullptr;
  DYNEMB_RETURN_IF_ERROR((KeyedRandomRowsGpu<K, T>(d_keys.get<K>(), n, spec, d_exists_or_null,
                                                   d_rows.get<T>(), stream.get())));
  DYNEMB_RETURN_IF_ERROR(CopyToHost(rows, d_rows.get<T>(), row_bytes, stream.get()));
  return CudaStatus(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
}

// ---------------------------------------------------------------------------
// The functions
// ---------------------------------------------------------------------------

py::array Partition(const py::handle& keys_obj, int64_t num_shards_arg, bool on_device) {
  const char* fn = on_device ? "partition" : "partition_host";
  KeyKind kind;
  const py::array keys = KeysArray(keys_obj, fn, &kind);
  const int32_t num_shards = NumShards(num_shards_arg, fn);
  if (!on_device) CheckNumShards(num_shards, fn);
  py::array_t<int32_t> out(Shape(keys));
  const int64_t n = static_cast<int64_t>(keys.size());
  int32_t* ids = out.mutable_data();
  const void* data = keys.data();
  Status status;
  {
    py::gil_scoped_release release;
    if (on_device) {
      status = kind == KeyKind::kInt32
                   ? PartitionOnDevice(static_cast<const int32_t*>(data), n, num_shards, ids)
                   : PartitionOnDevice(static_cast<const int64_t*>(data), n, num_shards, ids);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        ids[i] = kind == KeyKind::kInt32 ? ShardOfKey(static_cast<const int32_t*>(data)[i], num_shards)
                                         : ShardOfKey(static_cast<const int64_t*>(data)[i], num_shards);
      }
    }
  }
  ThrowIfError(status);
  return std::move(out);
}

template <typename K, typename T>
Status DrawRows(const K* keys, int64_t n, const KeyedRandomSpec& spec, const bool* exists, T* rows,
                bool on_device) {
  if (on_device) return KeyedRandomOnDevice(keys, n, spec, exists, rows);
  for (int64_t i = 0; i < n; ++i) {
    if (exists != nullptr && exists[i]) continue;
    KeyedRandomRow(spec.seed, StableKeyHash(keys[i]), spec.dim, spec.dist, spec.a, spec.b,
                   rows + i * spec.dim);
  }
  return Status::Ok();
}

// Draws into `rows` (keys.shape + (dim,), of float32 when `is_float`), where
// exists (or every row, when null) is false.
void Draw(const py::array& keys, KeyKind kind, const KeyedRandomSpec& spec, const bool* exists,
          bool is_float, void* rows, bool on_device) {
  const int64_t n = static_cast<int64_t>(keys.size());
  const void* data = keys.data();
  Status status;
  {
    py::gil_scoped_release release;
    if (kind == KeyKind::kInt32) {
      const auto* k = static_cast<const int32_t*>(data);
      status = is_float ? DrawRows(k, n, spec, exists, static_cast<float*>(rows), on_device)
                        : DrawRows(k, n, spec, exists, static_cast<double*>(rows), on_device);
    } else {
      const auto* k = static_cast<const int64_t*>(data);
      status = is_float ? DrawRows(k, n, spec, exists, static_cast<float*>(rows), on_device)
                        : DrawRows(k, n, spec, exists, static_cast<double*>(rows), on_device);
    }
  }
  ThrowIfError(status);
}

KeyedRandomSpec Spec(int64_t dim, int64_t seed, const std::string& distribution, double a,
                     double b, const char* fn, bool on_device) {
  if (!on_device) CheckDimHost(dim, fn);
  KeyedRandomSpec spec;
  spec.seed = static_cast<uint64_t>(seed);  // as the ops' int attr
  spec.dist = ParseDistribution(distribution, fn);
  spec.a = a;
  spec.b = b;
  spec.dim = dim;
  return spec;
}

py::array KeyedRandom(const py::handle& keys_obj, int64_t dim, int64_t seed,
                      const std::string& distribution, double a, double b,
                      const py::object& dtype_obj, bool on_device) {
  const char* fn = on_device ? "keyed_random" : "keyed_random_host";
  KeyKind kind;
  const py::array keys = KeysArray(keys_obj, fn, &kind);
  const KeyedRandomSpec spec = Spec(dim, seed, distribution, a, b, fn, on_device);
  const py::dtype dtype = py::dtype::from_args(dtype_obj);
  const bool is_float = ParseFloatDtype(dtype, "dtype", fn);
  // An invalid dim (device): nothing to allocate; the core reports it.
  py::array rows(dtype, dim >= 1 ? RowsShape(keys, dim) : std::vector<py::ssize_t>{0});
  Draw(keys, kind, spec, nullptr, is_float, rows.mutable_data(), on_device);
  return rows;
}

py::array KeyedRandomFill(const py::handle& values_obj, const py::handle& exists_obj,
                          const py::handle& keys_obj, int64_t dim, int64_t seed,
                          const std::string& distribution, double a, double b, bool on_device) {
  const char* fn = on_device ? "keyed_random_fill" : "keyed_random_fill_host";
  KeyKind kind;
  const py::array keys = KeysArray(keys_obj, fn, &kind);
  const KeyedRandomSpec spec = Spec(dim, seed, distribution, a, b, fn, on_device);
  const py::array values = py::array::ensure(values_obj, py::array::c_style);
  if (!values) {
    throw py::value_error(std::string(fn) + ": values must be a float32 or float64 array, got " +
                          Repr(values_obj));
  }
  const bool is_float = ParseFloatDtype(values.dtype(), "values' dtype", fn);
  const py::array exists = py::array::ensure(exists_obj, py::array::c_style);
  if (!exists) {
    throw py::value_error(std::string(fn) + ": exists must be a bool array, got " +
                          Repr(exists_obj));
  }
  if (!exists.dtype().equal(py::dtype::of<bool>())) {
    throw py::value_error(std::string(fn) + ": exists must be a bool array, got dtype " +
                          Repr(exists.dtype()));
  }
  if (Shape(exists) != Shape(keys)) {
    throw py::value_error(std::string(fn) + ": exists must have the shape of keys " +
                          ShapeString(Shape(keys)) + ", got " + ShapeString(Shape(exists)));
  }
  if (dim >= 1 && Shape(values) != RowsShape(keys, dim)) {
    throw py::value_error(std::string(fn) + ": values must have shape keys.shape + (dim,) = " +
                          ShapeString(RowsShape(keys, dim)) + ", got " +
                          ShapeString(Shape(values)));
  }
  // A copy of values (never written in place), of the same dtype and shape.
  py::array rows(values.dtype(), Shape(values));
  std::memcpy(rows.mutable_data(), values.data(), static_cast<size_t>(values.nbytes()));
  Draw(keys, kind, spec, static_cast<const bool*>(exists.data()), is_float, rows.mutable_data(),
       on_device);
  return rows;
}

// The three functions, on the device or on the host, under the given names.
void AddFunctions(py::module_& m, bool on_device, const char* partition_name,
                  const char* partition_doc, const char* random_name, const char* random_doc,
                  const char* fill_name, const char* fill_doc) {
  using py::arg;
  m.def(partition_name,
        [on_device](const py::handle& keys, int64_t num_shards) {
          return Partition(keys, num_shards, on_device);
        },
        arg("keys"), arg("num_shards"), partition_doc);
  m.def(random_name,
        [on_device](const py::handle& keys, int64_t dim, int64_t seed,
                    const std::string& distribution, double a, double b, const py::object& dtype) {
          return KeyedRandom(keys, dim, seed, distribution, a, b, dtype, on_device);
        },
        arg("keys"), arg("dim"), arg("seed"), arg("distribution"), arg("a"), arg("b"),
        arg("dtype"), random_doc);
  m.def(fill_name,
        [on_device](const py::handle& values, const py::handle& exists, const py::handle& keys,
                    int64_t dim, int64_t seed, const std::string& distribution, double a,
                    double b) {
          return KeyedRandomFill(values, exists, keys, dim, seed, distribution, a, b, on_device);
        },
        arg("values"), arg("exists"), arg("keys"), arg("dim"), arg("seed"), arg("distribution"),
        arg("a"), arg("b"), fill_doc);
}

}  // namespace

KeyedRandomSpec KeyedSpecOf(int64_t dim, int64_t seed, const std::string& distribution, double a,
                            double b, const char* fn) {
  return Spec(dim, seed, distribution, a, b, fn, /*on_device=*/false);
}

void AddKeyedGpuBindings(pybind11::module_& m) {
  AddFunctions(
      m, /*on_device=*/true, "partition",
      "The shard in [0, num_shards) of each int32/int64 key (an int32 array of keys' shape), "
      "computed on the device (PartitionKeysGpu).",
      "keyed_random",
      "keys.shape + (dim,) key-seeded rows of `dtype` (float32, float64), as DynembKeyedRandom "
      "draws them, computed on the device (KeyedRandomRowsGpu). distribution: 'uniform', "
      "'normal' or 'truncated_normal'.",
      "keyed_random_fill",
      "A copy of `values` with the rows of the keys whose `exists` is false drawn as "
      "keyed_random draws them (DynembKeyedRandomFill), on the device (KeyedRandomRowsGpu).");
  AddFunctions(
      m, /*on_device=*/false, "partition_host",
      "partition, computed on the host with cc/core/partition.h (as the CPU kernels).",
      "keyed_random_host",
      "keyed_random, computed on the host with cc/core/partition.h (as the CPU kernels).",
      "keyed_random_fill_host",
      "keyed_random_fill, computed on the host with cc/core/partition.h (as the CPU kernels).");
}

}  // namespace dynemb
