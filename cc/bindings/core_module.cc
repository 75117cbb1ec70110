// pybind11 module `tensorflow_dynemb._core`: the TF-free core table
// (cc/core/table.h) as a Python class over NumPy arrays, for the core
// conformance/concurrency tests and for benchmarks without TensorFlow.
//
//   t = _core.Table("int64", "float32", dim=8, strategy="lru", num_threads=2)
//   t.insert(np.array([1, 2], np.int64), np.ones((2, 8), np.float32))
//   values, exists = t.find(np.array([1, 3], np.int64), np.zeros(8, np.float32))
//
// Conventions
//   * keys: int32/int64 tables take a NumPy array of exactly that dtype, of any
//     shape (flattened; outputs keep keys.shape), or a Python sequence of ints.
//     String tables take a sequence (list/tuple/NumPy object, bytes or str
//     array) of bytes or str; str is encoded as UTF-8.
//   * values: a NumPy array of exactly the table's value dtype with shape
//     keys.shape + (dim,) or (n, dim), or a nested Python sequence (converted).
//     bfloat16 values are ml_dtypes.bfloat16 arrays when ml_dtypes is
//     installed (outputs then use it too); uint16 arrays holding the bfloat16
//     bit patterns are always accepted, and are the output dtype without
//     ml_dtypes (module attribute BFLOAT16_DTYPE says which).
//   * A wrong dtype raises TypeError, a wrong shape or size ValueError; both
//     name the argument, what was received and what was expected. Core errors
//     raise ValueError (invalid argument, failed precondition, data loss, not
//     found) or RuntimeError (anything else), with the core's message; a file
//     that save/load cannot open raises OSError (FileNotFoundError, ...).
//   * Every core call runs with the GIL released, so Python threads using one
//     table run concurrently (the core is thread-safe).

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cc/core/table.h"
#include "cc/core/table_io.h"
#include "cc/core/update_rules.h"

namespace py = pybind11;

// The same bindings are compiled a second time as tensorflow_dynemb._core_gpu
// (cc/bindings_gpu/core_gpu_module.cc), which defines these three hooks
// before including this file: the module name, the table factory, and a
// function adding GPU-only methods.
#ifndef DYNEMB_CORE_MODULE_NAME
#define DYNEMB_CORE_MODULE_NAME _core
#endif
#ifndef DYNEMB_NEW_TABLE
#define DYNEMB_NEW_TABLE(options, status) NewCpuTable(options, status)
#endif
#define DYNEMB_STRINGIFY_(x) #x
#define DYNEMB_STRINGIFY(x) DYNEMB_STRINGIFY_(x)

namespace dynemb {
namespace {

// ---------------------------------------------------------------------------
// Runner over plain std::threads: a static split of [0, n) into num_threads
// contiguous ranges, the first one run by the calling thread. Threads are
// started per call, which is cheap next to the batches the tests and
// benchmarks use and keeps the runner stateless (so it is trivially
// thread-safe when several Python threads share a table).
// ---------------------------------------------------------------------------
class ThreadRunner : public Runner {
 public:
  explicit ThreadRunner(int num_threads) : num_threads_(num_threads) {}

  void ParallelFor(int64_t n, int64_t cost_per_unit,
                   const std::function<void(int64_t, int64_t)>& fn) const override {
    (void)cost_per_unit;
    if (n <= 0) return;
    const int64_t parts = std::min<int64_t>(num_threads_, n);
    if (parts <= 1) {
      fn(0, n);
      return;
    }
    std::vector<std::exception_ptr> errors(parts);
    auto run_part = [&](int64_t p) {
      try {
        fn(n / parts * p + std::min(p, n % parts), n / parts * (p + 1) + std::min(p + 1, n % parts));
      } catch (...) {
        errors[p] = std::current_exception();
      }
    };
    std::vector<std::thread> threads;
    threads.reserve(parts - 1);
    for (int64_t p = 1; p < parts; ++p) threads.emplace_back(run_part, p);
    run_part(0);
    for (std::thread& t : threads) t.join();
    for (const std::exception_ptr& e : errors) {
      if (e) std::rethrow_exception(e);
    }
  }
  int Parallelism() const override { return num_threads_; }

 private:
  int num_threads_;
};

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------
const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kInternal: return "INTERNAL";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
  }
  return "UNKNOWN";
}

// Raises the Python exception for a non-OK status. Call with the GIL held.
void ThrowIfError(const Status& status) {
  if (status.ok()) return;
  const std::string message =
      std::string(StatusCodeName(status.code())) + ": " + status.message();
  switch (status.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kDataLoss:
    case StatusCode::kNotFound:
      throw py::value_error(message);
    default:
      throw std::runtime_error(message);
  }
}

std::string Repr(const py::handle& obj) { return py::repr(obj).cast<std::string>(); }

std::string ShapeString(const std::vector<py::ssize_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

std::vector<py::ssize_t> ShapeOf(const py::array& a) {
  return std::vector<py::ssize_t>(a.shape(), a.shape() + a.ndim());
}

// "array of dtype int32 and shape (3,)" or "list" for the error messages.
std::string Describe(const py::handle& obj) {
  if (py::isinstance<py::array>(obj)) {
    py::array a = py::reinterpret_borrow<py::array>(obj);
    return "an array of dtype " + py::str(a.dtype()).cast<std::string>() + " and shape " +
           ShapeString(ShapeOf(a));
  }
  return "an object of type " + py::str(py::type::of(obj).attr("__name__")).cast<std::string>();
}

// ---------------------------------------------------------------------------
// Dtypes
// ---------------------------------------------------------------------------
py::module_& Numpy() {
  static py::module_* np = new py::module_(py::module_::import("numpy"));
  return *np;
}

// ml_dtypes.bfloat16's dtype, or None when ml_dtypes is not installed.
py::object& BFloat16Dtype() {
  static py::object* dtype = [] {
    try {
      return new py::object(py::dtype::from_args(py::module_::import("ml_dtypes").attr("bfloat16")));
    } catch (const py::error_already_set&) {
      PyErr_Clear();
      return new py::object(py::none());
    }
  }();
  return *dtype;
}

// The dtype outputs of this value type have.
py::dtype ValueDtype(ValueType type) {
  switch (type) {
    case ValueType::kFloat32: return py::dtype::of<float>();
    case ValueType::kFloat64: return py::dtype::of<double>();
    case ValueType::kFloat16: return py::dtype("float16");
    case ValueType::kBFloat16:
      if (!BFloat16Dtype().is_none()) return py::reinterpret_borrow<py::dtype>(BFloat16Dtype());
      return py::dtype::of<uint16_t>();
    case ValueType::kInt8: return py::dtype::of<int8_t>();
    case ValueType::kInt32: return py::dtype::of<int32_t>();
    case ValueType::kInt64: return py::dtype::of<int64_t>();
    case ValueType::kBool: return py::dtype::of<bool>();
  }
  throw std::logic_error("unknown ValueType");
}

// Whether an input array of dtype `dt` is accepted for `type`.
bool AcceptsValueDtype(ValueType type, const py::dtype& dt) {
  if (type == ValueType::kBFloat16) {
    if (dt.equal(py::dtype::of<uint16_t>())) return true;
    return dt.itemsize() == 2 && py::str(dt).cast<std::string>() == "bfloat16";
  }
  return dt.equal(ValueDtype(type));
}

std::string ExpectedValueDtype(ValueType type) {
  if (type == ValueType::kBFloat16) return "bfloat16 (ml_dtypes.bfloat16, or uint16 bit patterns)";
  return ValueTypeName(type);
}

py::dtype KeyDtype(KeyType type) {
  return type == KeyType::kInt32 ? py::dtype::of<int32_t>() : py::dtype::of<int64_t>();
}

// `a` itself when it is C-contiguous, else a C-contiguous copy (keeps 0-d
// arrays 0-d, unlike np.ascontiguousarray).
py::array Contiguous(const py::handle& obj) {
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (a.flags() & py::array::c_style) return a;
  return py::reinterpret_steal<py::array>(a.attr("copy")("C").release());
}

// ---------------------------------------------------------------------------
// Key batches
// ---------------------------------------------------------------------------
// Keys converted for one core call. Holds references that keep the key bytes
// alive while the GIL is released; destroy it with the GIL held.
struct KeyBatch {
  std::vector<py::ssize_t> shape;  // the caller's key shape; outputs keep it
  int64_t n = 0;
  bool is_string = false;
  py::array numeric;                     // int32/int64 tables
  std::vector<py::object> string_refs;   // string tables: bytes objects
  std::vector<std::string_view> views;   // string tables: the keys

  const void* data() const {
    return is_string ? static_cast<const void*>(views.data()) : numeric.data();
  }
};

KeyBatch ToKeyBatch(const TableOptions& options, const py::handle& keys) {
  KeyBatch batch;
  if (options.key_type == KeyType::kString) {
    batch.is_string = true;
    py::list items;
    if (py::isinstance<py::array>(keys)) {
      py::array a = py::reinterpret_borrow<py::array>(keys);
      const char kind = a.dtype().kind();
      if (kind != 'O' && kind != 'S' && kind != 'U') {
        throw py::type_error("keys: expected bytes or str keys for a string table, got " +
                             Describe(keys));
      }
      batch.shape = ShapeOf(a);
      items = a.attr("ravel")().attr("tolist")();
    } else if (py::isinstance<py::bytes>(keys) || py::isinstance<py::str>(keys) ||
               !py::isinstance<py::sequence>(keys)) {
      throw py::type_error("keys: expected a sequence of bytes or str for a string table, got " +
                           Repr(keys).substr(0, 80) + " (" + Describe(keys) + ")");
    } else {
      items = py::list(py::reinterpret_borrow<py::object>(keys));
      batch.shape = {static_cast<py::ssize_t>(items.size())};
    }
    batch.n = static_cast<int64_t>(items.size());
    batch.string_refs.reserve(batch.n);
    batch.views.reserve(batch.n);
    for (int64_t i = 0; i < batch.n; ++i) {
      py::handle item = items[i];
      py::object b;
      if (py::isinstance<py::bytes>(item)) {
        b = py::reinterpret_borrow<py::object>(item);
      } else if (py::isinstance<py::str>(item)) {
        b = item.attr("encode")("utf-8");
      } else {
        throw py::type_error("keys[" + std::to_string(i) + "]: expected bytes or str, got " +
                             Repr(item).substr(0, 80) + " of type " +
                             py::str(py::type::of(item).attr("__name__")).cast<std::string>());
      }
      char* data = nullptr;
      py::ssize_t size = 0;
      PyBytes_AsStringAndSize(b.ptr(), &data, &size);
      batch.views.emplace_back(data, static_cast<size_t>(size));
      batch.string_refs.push_back(std::move(b));
    }
    return batch;
  }

  const py::dtype want = KeyDtype(options.key_type);
  py::array a;
  if (py::isinstance<py::array>(keys)) {
    a = py::reinterpret_borrow<py::array>(keys);
    if (!a.dtype().equal(want)) {
      throw py::type_error(std::string("keys: expected an array of dtype ") +
                           KeyTypeName(options.key_type) + ", got " + Describe(keys));
    }
  } else {
    try {
      a = py::reinterpret_steal<py::array>(Numpy().attr("asarray")(keys, want).release());
    } catch (const py::error_already_set& e) {
      throw py::type_error(std::string("keys: expected ") + KeyTypeName(options.key_type) +
                           " keys (an array or a sequence of ints), got " +
                           Repr(keys).substr(0, 80) + ": " + e.what());
    }
  }
  batch.numeric = Contiguous(a);
  batch.shape = ShapeOf(batch.numeric);
  batch.n = static_cast<int64_t>(batch.numeric.size());
  return batch;
}

// ---------------------------------------------------------------------------
// Value arrays
// ---------------------------------------------------------------------------
// Converts `obj` to a contiguous array of the table's value dtype, checking
// the dtype of arrays (no silent casts) and converting other sequences.
py::array ToValueArray(const TableOptions& options, const py::handle& obj, const char* name) {
  if (py::isinstance<py::array>(obj)) {
    py::array a = py::reinterpret_borrow<py::array>(obj);
    if (!AcceptsValueDtype(options.value_type, a.dtype())) {
      throw py::type_error(std::string(name) + ": expected an array of dtype " +
                           ExpectedValueDtype(options.value_type) + ", got " + Describe(obj));
    }
    return Contiguous(a);
  }
  try {
    return Contiguous(Numpy().attr("asarray")(obj, ValueDtype(options.value_type)));
  } catch (const py::error_already_set& e) {
    throw py::type_error(std::string(name) + ": expected " + ValueTypeName(options.value_type) +
                         " values (an array or a nested sequence of numbers), got " +
                         Repr(obj).substr(0, 80) + ": " + e.what());
  }
}

std::vector<py::ssize_t> RowsShape(const KeyBatch& keys, int64_t dim) {
  std::vector<py::ssize_t> shape = keys.shape;
  shape.push_back(static_cast<py::ssize_t>(dim));
  return shape;
}

// Checks that `a` holds one row per key: shape keys.shape + (dim,) or (n, dim).
void CheckRowsShape(const py::array& a, const KeyBatch& keys, int64_t dim, const char* name) {
  const std::vector<py::ssize_t> got = ShapeOf(a);
  const std::vector<py::ssize_t> keyed = RowsShape(keys, dim);
  const std::vector<py::ssize_t> flat = {static_cast<py::ssize_t>(keys.n),
                                         static_cast<py::ssize_t>(dim)};
  if (got != keyed && got != flat) {
    throw py::value_error(std::string(name) + ": Expected shape " + ShapeString(keyed) +
                          " (keys.shape + (dim,)) or " + ShapeString(flat) + ", got " +
                          ShapeString(got));
  }
}

// A per-key array (exists, scores): shape keys.shape or (n,).
void CheckPerKeyShape(const py::array& a, const KeyBatch& keys, const char* name) {
  const std::vector<py::ssize_t> got = ShapeOf(a);
  const std::vector<py::ssize_t> flat = {static_cast<py::ssize_t>(keys.n)};
  if (got != keys.shape && got != flat) {
    throw py::value_error(std::string(name) + ": Expected shape " + ShapeString(keys.shape) +
                          " (keys.shape) or " + ShapeString(flat) + ", got " + ShapeString(got));
  }
}

py::array ToScores(const py::handle& obj, const KeyBatch& keys) {
  py::array a;
  if (py::isinstance<py::array>(obj)) {
    a = py::reinterpret_borrow<py::array>(obj);
    const char kind = a.dtype().kind();
    if (kind != 'i' && kind != 'u') {
      throw py::type_error("scores: expected an array of integers (uint64 or int64), got " +
                           Describe(obj));
    }
    if (kind == 'i' && a.size() > 0 && Numpy().attr("any")(a.attr("__lt__")(0)).cast<bool>()) {
      throw py::value_error("scores: expected non-negative scores, got a negative score in " +
                            Describe(obj));
    }
    a = py::reinterpret_steal<py::array>(a.attr("astype")(py::dtype::of<uint64_t>()).release());
  } else {
    try {
      a = py::reinterpret_steal<py::array>(
          Numpy().attr("asarray")(obj, py::dtype::of<uint64_t>()).release());
    } catch (const py::error_already_set& e) {
      throw py::type_error("scores: expected a sequence of non-negative ints, got " +
                           Repr(obj).substr(0, 80) + ": " + e.what());
    }
  }
  a = Contiguous(a);
  CheckPerKeyShape(a, keys, "scores");
  return a;
}

py::array ToExists(const py::handle& obj, const KeyBatch& keys) {
  py::array a;
  if (py::isinstance<py::array>(obj)) {
    a = py::reinterpret_borrow<py::array>(obj);
    if (!a.dtype().equal(py::dtype::of<bool>())) {
      throw py::type_error("exists: expected an array of dtype bool, got " + Describe(obj));
    }
  } else {
    a = py::reinterpret_steal<py::array>(
        Numpy().attr("asarray")(obj, py::dtype::of<bool>()).release());
  }
  a = Contiguous(a);
  CheckPerKeyShape(a, keys, "exists");
  return a;
}

// An array owning a heap buffer (no copy on the way to Python).
py::array WrapBuffer(std::vector<uint8_t>* buffer, const py::dtype& dtype,
                     std::vector<py::ssize_t> shape) {
  py::capsule owner(buffer, [](void* p) { delete static_cast<std::vector<uint8_t>*>(p); });
  return py::array(dtype, std::move(shape), buffer->data(), owner);
}

// ---------------------------------------------------------------------------
// Export (and evicted entries) into heap buffers; the core fills them with
// the GIL released.
// ---------------------------------------------------------------------------
class BufferExportSink : public ExportSink {
 public:
  explicit BufferExportSink(const TableOptions& options) : options_(options) {}

  Status Allocate(int64_t n, void** keys, void** values, uint64_t** scores) override {
    if (n < 0) return Status(StatusCode::kInternal, "Export: negative entry count");
    n_ = n;
    // Buffers are never empty, so a pointer handed to the core is never null.
    const size_t rows = static_cast<size_t>(std::max<int64_t>(n, 1));
    if (options_.key_type == KeyType::kString) {
      strings_.assign(static_cast<size_t>(n), std::string());
      *keys = nullptr;
    } else {
      keys_ = std::make_unique<std::vector<uint8_t>>(
          rows * (options_.key_type == KeyType::kInt32 ? 4 : 8));
      *keys = keys_->data();
    }
    values_ = std::make_unique<std::vector<uint8_t>>(rows * options_.value_bytes());
    scores_ = std::make_unique<std::vector<uint8_t>>(rows * sizeof(uint64_t));
    *values = values_->data();
    *scores = reinterpret_cast<uint64_t*>(scores_->data());
    return Status::Ok();
  }

  void SetStringKey(int64_t i, std::string_view key) override {
    if (i >= 0 && i < n_) strings_[static_cast<size_t>(i)].assign(key.data(), key.size());
  }

  // Buffers of n rows for InsertAndEvict / AccumAndEvict; Shrink(count) afterwards.
  EvictedEntries AllocateEvicted(int64_t n) {
    EvictedEntries out;
    Allocate(n, &out.keys, &out.values, &out.scores);
    if (options_.key_type == KeyType::kString) {
      out.string_key = [this](int64_t i, std::string_view key) { SetStringKey(i, key); };
    }
    return out;
  }

  // Keeps the first m rows (the buffers stay allocated; the arrays view m rows).
  void Shrink(int64_t m) {
    if (m >= 0 && m < n_) {
      n_ = m;
      strings_.resize(static_cast<size_t>(m));
    }
  }

  // (keys, values, scores) as NumPy arrays; call with the GIL held.
  py::tuple Result() {
    if (!values_) {  // the core never called Allocate: an empty table
      void* keys_ptr;
      void* values_ptr;
      uint64_t* scores_ptr;
      Allocate(0, &keys_ptr, &values_ptr, &scores_ptr);
    }
    const py::ssize_t n = static_cast<py::ssize_t>(n_);
    py::object keys;
    if (options_.key_type == KeyType::kString) {
      py::list items(n);
      for (py::ssize_t i = 0; i < n; ++i) items[i] = py::bytes(strings_[i]);
      keys = Numpy().attr("array")(items, py::dtype("O"));
      if (n == 0) keys = Numpy().attr("empty")(0, py::dtype("O"));
    } else {
      keys = WrapBuffer(keys_.release(), KeyDtype(options_.key_type), {n});
    }
    py::array values = WrapBuffer(values_.release(), ValueDtype(options_.value_type),
                                  {n, static_cast<py::ssize_t>(options_.dim)});
    py::array scores = WrapBuffer(scores_.release(), py::dtype::of<uint64_t>(), {n});
    return py::make_tuple(keys, values, scores);
  }

 private:
  const TableOptions& options_;
  int64_t n_ = 0;
  std::unique_ptr<std::vector<uint8_t>> keys_, values_, scores_;
  std::vector<std::string> strings_;
};

// ---------------------------------------------------------------------------
// Files for SaveTable / LoadTable.
// ---------------------------------------------------------------------------
std::string ErrnoMessage(const std::string& what, const std::string& path) {
  return what + " '" + path + "': " + std::strerror(errno);
}

class FileByteSink : public ByteSink {
 public:
  FileByteSink(std::FILE* f, std::string path) : f_(f), path_(std::move(path)) {}
  ~FileByteSink() override {
    if (f_ != nullptr) std::fclose(f_);
  }
  Status Append(const void* data, size_t size) override {
    if (f_ == nullptr) return Status(StatusCode::kFailedPrecondition, "write after Close");
    if (size > 0 && std::fwrite(data, 1, size, f_) != size) {
      return Status(StatusCode::kDataLoss, ErrnoMessage("cannot write", path_));
    }
    return Status::Ok();
  }
  Status Close() override {
    if (f_ == nullptr) return Status::Ok();
    const int rc = std::fclose(f_);
    f_ = nullptr;
    if (rc != 0) return Status(StatusCode::kDataLoss, ErrnoMessage("cannot close", path_));
    return Status::Ok();
  }

 private:
  std::FILE* f_;
  std::string path_;
};

class FileByteSource : public ByteSource {
 public:
  FileByteSource(std::FILE* f, std::string path) : f_(f), path_(std::move(path)) {}
  ~FileByteSource() override { std::fclose(f_); }
  Status Read(void* data, size_t size, bool* eof) override {
    *eof = false;
    if (size == 0) return Status::Ok();
    const size_t got = std::fread(data, 1, size, f_);
    if (got == size) return Status::Ok();
    if (got == 0 && std::feof(f_)) {
      *eof = true;
      return Status::Ok();
    }
    if (std::ferror(f_)) return Status(StatusCode::kDataLoss, ErrnoMessage("cannot read", path_));
    return Status(StatusCode::kDataLoss, "'" + path_ + "' is truncated: wanted " +
                                             std::to_string(size) + " bytes, got " +
                                             std::to_string(got));
  }
  Status Rewind() override {
    if (std::fseek(f_, 0, SEEK_SET) != 0) {
      return Status(StatusCode::kDataLoss, ErrnoMessage("cannot rewind", path_));
    }
    std::clearerr(f_);
    return Status::Ok();
  }

 private:
  std::FILE* f_;
  std::string path_;
};

// Opens `path` or raises the OSError subclass for errno (FileNotFoundError, ...).
std::FILE* OpenFile(const std::string& path, const char* mode) {
  std::FILE* f = std::fopen(path.c_str(), mode);
  if (f == nullptr) {
    PyErr_SetFromErrnoWithFilename(PyExc_OSError, path.c_str());
    throw py::error_already_set();
  }
  return f;
}

void CheckChunkRows(int64_t chunk_rows) {
  if (chunk_rows < 1) {
    throw py::value_error("chunk_rows: expected a positive integer, got " +
                          std::to_string(chunk_rows));
  }
}

// ---------------------------------------------------------------------------
// The Python Table.
// ---------------------------------------------------------------------------
class PyTable {
 public:
  PyTable(const std::string& key_dtype, const std::string& value_dtype, int64_t dim,
          int64_t init_capacity, int64_t max_capacity, const std::string& strategy,
          bool find_updates_scores, int64_t step_per_epoch, int num_threads,
          int64_t max_hbm_for_values, bool track_changes) {
    TableOptions options;
    if (!ParseKeyType(key_dtype, &options.key_type)) {
      throw py::value_error("key_dtype: expected one of 'int32', 'int64', 'string', got '" +
                            key_dtype + "'");
    }
    if (!ParseValueType(value_dtype, &options.value_type)) {
      throw py::value_error(
          "value_dtype: expected one of 'float32', 'float64', 'float16', 'bfloat16', 'int8', "
          "'int32', 'int64', 'bool', got '" + value_dtype + "'");
    }
    if (!ParseEvictStrategy(strategy, &options.strategy)) {
      throw py::value_error(
          "strategy: expected one of 'lru', 'lfu', 'epoch_lru', 'epoch_lfu', 'customized', got '" +
          strategy + "'");
    }
    if (num_threads < 1) {
      throw py::value_error("num_threads: expected a positive integer, got " +
                            std::to_string(num_threads));
    }
    options.dim = dim;
    options.init_capacity = init_capacity;
    options.max_capacity = max_capacity;
    options.find_updates_scores = find_updates_scores;
    options.step_per_epoch = step_per_epoch;
    options.max_hbm_for_values = max_hbm_for_values;
    options.track_changes = track_changes;
    Status status;
    {
      py::gil_scoped_release release;
      table_ = DYNEMB_NEW_TABLE(options, &status);
    }
    if (table_ == nullptr) {
      ThrowIfError(status.ok() ? Status(StatusCode::kInternal, "table factory returned null")
                               : status);
    }
    num_threads_ = num_threads;
    if (num_threads > 1) {
      runner_ = std::make_unique<ThreadRunner>(num_threads);
    } else {
      runner_ = std::make_unique<SerialRunner>();
    }
  }

  const TableOptions& options() const { return table_->options(); }

  void Insert(const py::handle& keys_obj, const py::handle& values_obj,
              const py::handle& scores_obj) {
    RunInsert(keys_obj, values_obj, scores_obj, nullptr);
  }

  // Returns the evicted (keys [m], values [m, dim], scores uint64 [m]).
  py::tuple InsertAndEvict(const py::handle& keys_obj, const py::handle& values_obj,
                           const py::handle& scores_obj) {
    BufferExportSink sink(options());
    RunInsert(keys_obj, values_obj, scores_obj, &sink);
    return sink.Result();
  }

  py::tuple Find(const py::handle& keys_obj, const py::handle& default_obj) {
    KeyBatch keys = ToKeyBatch(options(), keys_obj);
    const int64_t dim = options().dim;
    const py::dtype out_dtype = ValueDtype(options().value_type);
    py::array defaults;
    bool per_key = false;
    if (default_obj.is_none()) {
      defaults = Numpy().attr("zeros")(dim, out_dtype);
    } else {
      defaults = ToValueArray(options(), default_obj, "default");
      const std::vector<py::ssize_t> got = ShapeOf(defaults);
      if (got.empty()) {  // a scalar: the same value in every element
        defaults = Contiguous(Numpy().attr("full")(dim, defaults, defaults.dtype()));
      } else if (got != std::vector<py::ssize_t>{static_cast<py::ssize_t>(dim)}) {
        try {
          CheckRowsShape(defaults, keys, dim, "default");
        } catch (const py::value_error& e) {
          throw py::value_error(std::string(e.what()) + ", or (dim,) = " +
                                ShapeString({static_cast<py::ssize_t>(dim)}));
        }
        per_key = true;
      }
    }
    py::array values(out_dtype, RowsShape(keys, dim));
    py::array_t<bool> exists(keys.shape);
    Status status;
    {
      py::gil_scoped_release release;
      status = table_->Find(keys.data(), keys.n, values.mutable_data(),
                            exists.mutable_data(), defaults.data(), per_key, *runner_);
    }
    ThrowIfError(status);
    return py::make_tuple(values, exists);
  }

  void Accum(const py::handle& keys_obj, const py::handle& deltas_obj,
             const py::handle& exists_obj) {
    RunAccum(keys_obj, deltas_obj, exists_obj, nullptr);
  }

  // Returns the evicted (keys [m], values [m, dim], scores uint64 [m]).
  py::tuple AccumAndEvict(const py::handle& keys_obj, const py::handle& deltas_obj,
                          const py::handle& exists_obj) {
    BufferExportSink sink(options());
    RunAccum(keys_obj, deltas_obj, exists_obj, &sink);
    return sink.Result();
  }

  // One optimizer step on a slot-state table (Table::ApplyRule); returns the
  // new parameter rows [n, dim / slots].
  py::array ApplyRule(const py::handle& keys_obj, const std::string& rule_name,
                      const py::handle& rows_obj, const py::handle& grads_obj,
                      const py::handle& initial_obj, const py::handle& coefficients_obj,
                      bool weight_decay) {
    RuleStep step;
    if (!ParseUpdateRule(rule_name, &step.rule)) {
      throw py::value_error("rule: expected a rule name of cc/core/update_rules.h (e.g. "
                            "'keras_adam'), got '" + rule_name + "'");
    }
    const int slots = UpdateRuleSlots(step.rule);
    if (options().dim % slots != 0) {
      throw py::value_error("rule: " + rule_name + " keeps " + std::to_string(slots) +
                            " slots per key, which the table's dim " +
                            std::to_string(options().dim) + " cannot hold");
    }
    step.dim = options().dim / slots;
    step.weight_decay = weight_decay;
    KeyBatch keys = ToKeyBatch(options(), keys_obj);
    py::array rows = ToValueArray(options(), rows_obj, "rows");
    CheckRowsShape(rows, keys, step.dim, "rows");
    py::array grads = ToValueArray(options(), grads_obj, "grads");
    CheckRowsShape(grads, keys, step.dim, "grads");
    py::array initial = ToValueArray(options(), initial_obj, "initial");
    if (ShapeOf(initial) != std::vector<py::ssize_t>{static_cast<py::ssize_t>(options().dim)}) {
      throw py::value_error("initial: Expected shape " +
                            ShapeString({static_cast<py::ssize_t>(options().dim)}) +
                            " (one state row), got " + ShapeString(ShapeOf(initial)));
    }
    py::array coefficients = ToValueArray(options(), coefficients_obj, "coefficients");
    const py::ssize_t wanted = UpdateRuleCoefficients(step.rule) + (weight_decay ? 2 : 0);
    if (ShapeOf(coefficients) != std::vector<py::ssize_t>{wanted}) {
      throw py::value_error("coefficients: Expected shape " + ShapeString({wanted}) + " for " +
                            rule_name + (weight_decay ? " with weight decay" : "") + ", got " +
                            ShapeString(ShapeOf(coefficients)));
    }
    py::array new_rows(ValueDtype(options().value_type), RowsShape(keys, step.dim));
    step.coefficients = coefficients.data();
    step.rows = rows.data();
    step.grads = grads.data();
    step.new_rows = new_rows.mutable_data();
    Status status;
    {
      py::gil_scoped_release release;
      status = table_->ApplyRule(keys.data(), keys.n, initial.data(), step, *runner_);
    }
    ThrowIfError(status);
    return new_rows;
  }

  void Remove(const py::handle& keys_obj) {
    KeyBatch keys = ToKeyBatch(options(), keys_obj);
    Status status;
    {
      py::gil_scoped_release release;
      status = table_->Remove(keys.data(), keys.n, *runner_);
    }
    ThrowIfError(status);
  }

  void Clear() {
    py::gil_scoped_release release;
    table_->Clear();
  }

  // CheckedSize: a table that counts lazily (the GPU table's pending counts)
  // or remotely (Redis) reports a failure rather than a stale size.
  int64_t Size() const {
    int64_t size = 0;
    Status status;
    {
      py::gil_scoped_release release;
      status = table_->CheckedSize(&size);
    }
    ThrowIfError(status);
    return size;
  }
  int64_t Capacity() const {
    py::gil_scoped_release release;
    return table_->Capacity();
  }
  int64_t MemoryBytes() const {
    py::gil_scoped_release release;
    return table_->MemoryBytes();
  }

  py::dict Counters() const {
    TableCounters c;
    {
      py::gil_scoped_release release;
      c = table_->Counters();
    }
    py::dict d;
    d["inserts"] = c.inserts;
    d["updates"] = c.updates;
    d["lookups"] = c.lookups;
    d["misses"] = c.misses;
    d["removes"] = c.removes;
    d["evictions"] = c.evictions;
    return d;
  }

  py::tuple Export() {
    BufferExportSink sink(options());
    Status status;
    {
      py::gil_scoped_release release;
      status = table_->Export(&sink, *runner_);
    }
    ThrowIfError(status);
    return sink.Result();
  }

  void Save(const std::string& path, int64_t chunk_rows) {
    CheckChunkRows(chunk_rows);
    FileByteSink sink(OpenFile(path, "wb"), path);
    Status status;
    {
      py::gil_scoped_release release;
      status = SaveTable(*table_, chunk_rows, &sink);
      const Status closed = sink.Close();  // idempotent; SaveTable closes on success
      if (status.ok()) status = closed;
    }
    if (!status.ok()) std::remove(path.c_str());  // no partial files
    ThrowIfError(status);
  }

  void Load(const std::string& path, int64_t chunk_rows, bool clear_first) {
    CheckChunkRows(chunk_rows);
    FileByteSource source(OpenFile(path, "rb"), path);
    Status status;
    {
      py::gil_scoped_release release;
      LoadOptions options;
      options.chunk_rows = chunk_rows;
      options.clear_first = clear_first;
      status = LoadTable({&source}, *table_, options, *runner_);
    }
    ThrowIfError(status);
  }

  // (epoch, stamp): Table::Mark.
  py::tuple Mark() {
    ChangeMark mark;
    Status status;
    {
      py::gil_scoped_release release;
      status = table_->Mark(&mark);
    }
    ThrowIfError(status);
    return py::make_tuple(mark.epoch, mark.stamp);
  }

  // (complete, keys, values, removed keys) of the window [since, until)
  // (Table::ExportChanges), each part in the order the core gave it.
  py::tuple ExportChanges(const py::tuple& since, const py::tuple& until, int64_t chunk_rows) {
    CheckChunkRows(chunk_rows);
    const ChangeMark from{since[0].cast<uint64_t>(), since[1].cast<uint64_t>()};
    const ChangeMark to{until[0].cast<uint64_t>(), until[1].cast<uint64_t>()};
    const bool strings = options().key_type == KeyType::kString;
    const size_t key_bytes = strings ? 0 : (options().key_type == KeyType::kInt32 ? 4 : 8);
    const size_t value_bytes = options().value_bytes();
    std::vector<char> keys, values, removed;
    std::vector<std::string> string_keys, string_removed;
    const auto take_keys = [&](const void* k, int64_t n, std::vector<char>* bytes,
                               std::vector<std::string>* names) {
      if (strings) {
        const auto* views = static_cast<const std::string_view*>(k);
        for (int64_t i = 0; i < n; ++i) names->emplace_back(views[i]);
      } else {
        const char* p = static_cast<const char*>(k);
        bytes->insert(bytes->end(), p, p + n * key_bytes);
      }
    };
    bool complete = false;
    Status status;
    {
      py::gil_scoped_release release;
      status = table_->ExportChanges(
          from, to, chunk_rows,
          [&](const void* k, int64_t n, const void* v, const uint64_t*) {
            take_keys(k, n, &keys, &string_keys);
            const char* p = static_cast<const char*>(v);
            values.insert(values.end(), p, p + n * value_bytes);
            return Status::Ok();
          },
          [&](const void* k, int64_t n) {
            take_keys(k, n, &removed, &string_removed);
            return Status::Ok();
          },
          &complete);
    }
    ThrowIfError(status);
    const auto rows_of = [&](const std::vector<char>& bytes, const std::vector<std::string>& names) {
      return static_cast<int64_t>(strings ? names.size() : bytes.size() / key_bytes);
    };
    BufferExportSink rows(options()), gone(options());
    void* key_ptr;
    void* value_ptr;
    uint64_t* score_ptr;
    const int64_t n = rows_of(keys, string_keys);
    ThrowIfError(rows.Allocate(n, &key_ptr, &value_ptr, &score_ptr));
    if (!strings) std::memcpy(key_ptr, keys.data(), keys.size());
    std::memcpy(value_ptr, values.data(), values.size());
    for (int64_t i = 0; i < static_cast<int64_t>(string_keys.size()); ++i) {
      rows.SetStringKey(i, string_keys[i]);
    }
    const int64_t m = rows_of(removed, string_removed);
    ThrowIfError(gone.Allocate(m, &key_ptr, &value_ptr, &score_ptr));
    if (!strings) std::memcpy(key_ptr, removed.data(), removed.size());
    for (int64_t i = 0; i < static_cast<int64_t>(string_removed.size()); ++i) {
      gone.SetStringKey(i, string_removed[i]);
    }
    const py::tuple r = rows.Result();
    const py::tuple g = gone.Result();
    return py::make_tuple(complete, r[0], r[1], g[0]);
  }

  int num_threads() const { return num_threads_; }
  Table& table() { return *table_; }

 private:
  // Converts insert's arguments and runs the core insert; with `evicted`,
  // the entries the batch evicted are written into it.
  void RunInsert(const py::handle& keys_obj, const py::handle& values_obj,
                 const py::handle& scores_obj, BufferExportSink* evicted) {
    KeyBatch keys = ToKeyBatch(options(), keys_obj);
    py::array values = ToValueArray(options(), values_obj, "values");
    CheckRowsShape(values, keys, options().dim, "values");
    // (A default-constructed py::array is an empty array, not a null handle.)
    py::object scores = py::none();
    const uint64_t* scores_ptr = nullptr;
    if (!scores_obj.is_none()) {
      py::array a = ToScores(scores_obj, keys);
      scores_ptr = static_cast<const uint64_t*>(a.data());
      scores = std::move(a);
    }
    Status status;
    {
      py::gil_scoped_release release;
      if (evicted == nullptr) {
        status = table_->Insert(keys.data(), keys.n, values.data(), scores_ptr, *runner_);
      } else {
        // A batch of n rows evicts at most n entries.
        EvictedEntries out = evicted->AllocateEvicted(keys.n);
        status = table_->InsertAndEvict(keys.data(), keys.n, values.data(), scores_ptr, &out,
                                        *runner_);
        evicted->Shrink(out.count);
      }
    }
    ThrowIfError(status);
  }

  // Converts accum's arguments and runs the core accum; with `evicted`, the
  // entries the batch evicted are written into it.
  void RunAccum(const py::handle& keys_obj, const py::handle& deltas_obj,
                const py::handle& exists_obj, BufferExportSink* evicted) {
    KeyBatch keys = ToKeyBatch(options(), keys_obj);
    py::array deltas = ToValueArray(options(), deltas_obj, "deltas");
    CheckRowsShape(deltas, keys, options().dim, "deltas");
    py::array exists = ToExists(exists_obj, keys);
    const bool* exists_ptr = static_cast<const bool*>(exists.data());
    Status status;
    {
      py::gil_scoped_release release;
      if (evicted == nullptr) {
        status = table_->Accum(keys.data(), keys.n, deltas.data(), exists_ptr, *runner_);
      } else {
        // A batch of n rows evicts at most n entries.
        EvictedEntries out = evicted->AllocateEvicted(keys.n);
        status = table_->AccumAndEvict(keys.data(), keys.n, deltas.data(), exists_ptr, &out,
                                       *runner_);
        evicted->Shrink(out.count);
      }
    }
    ThrowIfError(status);
  }

 public:

  std::string ReprString() const {
    const TableOptions& o = options();
    return std::string("<" DYNEMB_STRINGIFY(DYNEMB_CORE_MODULE_NAME) ".Table key_dtype=") + KeyTypeName(o.key_type) +
           " value_dtype=" + ValueTypeName(o.value_type) + " dim=" + std::to_string(o.dim) +
           " strategy=" + EvictStrategyName(o.strategy) +
           " max_capacity=" + std::to_string(o.max_capacity) +
           " size=" + std::to_string(table_->Size()) + ">";
  }

 private:
  std::unique_ptr<Table> table_;
  std::unique_ptr<Runner> runner_;
  int num_threads_ = 1;
};

}  // namespace
}  // namespace dynemb

PYBIND11_MODULE(DYNEMB_CORE_MODULE_NAME, m) {
  using dynemb::PyTable;
  m.doc() =
      "TF-free bindings of the tensorflow_dynemb core hash table (cc/core/table.h), for "
      "tests and benchmarks. See cc/bindings/core_module.cc for the conventions.";
  m.attr("BFLOAT16_DTYPE") = dynemb::ValueDtype(dynemb::ValueType::kBFloat16);
  m.attr("KEY_DTYPES") = py::make_tuple("int32", "int64", "string");
  m.attr("VALUE_DTYPES") = py::make_tuple("float32", "float64", "float16", "bfloat16", "int8",
                                          "int32", "int64", "bool");
  m.attr("STRATEGIES") =
      py::make_tuple("lru", "lfu", "epoch_lru", "epoch_lfu", "customized");

  py::class_<PyTable> table_class(m, "Table", R"doc(
A core hash table from keys to rows of `dim` values (cc/core/table.h).

Args:
  key_dtype: 'int32', 'int64' or 'string'.
  value_dtype: 'float32', 'float64', 'float16', 'bfloat16', 'int8', 'int32',
    'int64' or 'bool'.
  dim: elements per value row (>= 1).
  init_capacity: keys to reserve room for up front.
  max_capacity: 0 for an unbounded table, else the most keys it holds
    (inserts evict the lowest scores).
  strategy: 'lru', 'lfu', 'epoch_lru', 'epoch_lfu' or 'customized'.
  find_updates_scores: whether find refreshes LRU scores.
  step_per_epoch: insert batches per epoch for the epoch strategies.
  num_threads: threads a batch is split over (1: the calling thread only).
  max_hbm_for_values: GPU tables: bytes of device memory for values, the
    rest in pinned host memory (-1: no limit). CPU tables ignore it.
  track_changes: keep write stamps and tombstones (mark, export_changes).

Every method releases the GIL while the core runs; the table is thread-safe.
)doc");
  table_class
      .def(py::init<const std::string&, const std::string&, int64_t, int64_t, int64_t,
                    const std::string&, bool, int64_t, int, int64_t, bool>(),
           py::arg("key_dtype"), py::arg("value_dtype"), py::arg("dim"),
           py::arg("init_capacity") = 0, py::arg("max_capacity") = 0,
           py::arg("strategy") = "lru", py::arg("find_updates_scores") = false,
           py::arg("step_per_epoch") = 0, py::arg("num_threads") = 1,
           py::arg("max_hbm_for_values") = -1, py::arg("track_changes") = true)
      .def("insert", &PyTable::Insert, py::arg("keys"), py::arg("values"),
           py::arg("scores") = py::none(),
           "Upserts rows: values has shape keys.shape + (dim,) or (n, dim); scores "
           "(optional, non-negative ints of keys' size) set each row's score.")
      .def("insert_and_evict", &PyTable::InsertAndEvict, py::arg("keys"), py::arg("values"),
           py::arg("scores") = py::none(),
           "insert, returning what it evicted to stay within max_capacity: (keys [m], "
           "values [m, dim], scores uint64 [m]), m <= len(keys), in unspecified order. "
           "It holds the stored entries evicted and the new keys turned away because "
           "their score was below every stored score.")
      .def("find", &PyTable::Find, py::arg("keys"), py::arg("default") = py::none(),
           "Returns (values of shape keys.shape + (dim,), exists of shape keys.shape). "
           "Missing keys read `default`: a scalar, a (dim,) row, or one row per key "
           "(None: zeros).")
      .def("accum", &PyTable::Accum, py::arg("keys"), py::arg("deltas"), py::arg("exists"),
           "Per row: exists and present -> value += delta; not exists and absent -> "
           "insert delta; otherwise nothing.")
      .def("accum_and_evict", &PyTable::AccumAndEvict, py::arg("keys"), py::arg("deltas"),
           py::arg("exists"),
           "accum, returning what it evicted to stay within max_capacity, as "
           "insert_and_evict does: (keys [m], values [m, dim], scores uint64 [m]), "
           "m <= len(keys), in unspecified order; a new key turned away is reported "
           "with its delta.")
      .def("apply_rule", &PyTable::ApplyRule, py::arg("keys"), py::arg("rule"), py::arg("rows"),
           py::arg("grads"), py::arg("initial"), py::arg("coefficients"),
           py::arg("weight_decay") = false,
           "One optimizer step on a slot-state table (cc/core/update_rules.h): per key, its "
           "state row (initial for a new key, then inserted) is updated by `rule` from rows[i] "
           "and grads[i] ([n, dim / slots]); returns the new parameter rows.")
      .def("remove", &PyTable::Remove, py::arg("keys"), "Removes keys; absent keys are ignored.")
      .def("clear", &PyTable::Clear, "Removes every key.")
      .def("mark", &PyTable::Mark,
           "The table's current change mark (epoch, stamp) (Table::Mark).")
      .def("export_changes", &PyTable::ExportChanges, py::arg("since"), py::arg("until"),
           py::arg("chunk_rows") = 65536,
           "The changes of the window [since, until) of two marks: (complete, keys, values, "
           "removed_keys); complete is False when the table cannot tell (another epoch, or "
           "tombstones dropped), and then the rest is meaningless.")
      .def("size", &PyTable::Size)
      .def("__len__", &PyTable::Size)
      .def("capacity", &PyTable::Capacity)
      .def("memory_bytes", &PyTable::MemoryBytes)
      .def("counters", &PyTable::Counters,
           "Monotonic counters: inserts, updates, lookups, misses, removes, evictions "
           "(entries insert_and_evict and accum_and_evict report, also when insert or accum "
           "evicted them).")
      .def("export", &PyTable::Export,
           "Returns (keys [n], values [n, dim], scores uint64 [n]) in unspecified order; "
           "string keys are a NumPy object array of bytes.")
      .def("save", &PyTable::Save, py::arg("path"), py::arg("chunk_rows") = 65536,
           "Streams the table to a file (cc/core/table_io.h format).")
      .def("load", &PyTable::Load, py::arg("path"), py::arg("chunk_rows") = 65536,
           py::arg("clear_first") = true,
           "Streams a file written by save into the table (merging unless clear_first).")
      .def_property_readonly("key_dtype",
                             [](const PyTable& t) { return dynemb::KeyTypeName(t.options().key_type); })
      .def_property_readonly(
          "value_dtype", [](const PyTable& t) { return dynemb::ValueTypeName(t.options().value_type); })
      .def_property_readonly("dim", [](const PyTable& t) { return t.options().dim; })
      .def_property_readonly("max_capacity",
                             [](const PyTable& t) { return t.options().max_capacity; })
      .def_property_readonly(
          "strategy", [](const PyTable& t) { return dynemb::EvictStrategyName(t.options().strategy); })
      .def_property_readonly("num_threads", &PyTable::num_threads)
      .def("__repr__", &PyTable::ReprString);
#ifdef DYNEMB_EXTRA_BINDINGS
  DYNEMB_EXTRA_BINDINGS(m, table_class);
#endif
}
