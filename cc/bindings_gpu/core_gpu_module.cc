// pybind11 module `tensorflow_dynemb._core_gpu`: the GPU core table
// (cc/core/gpu) behind the same Python surface as `tensorflow_dynemb._core`
// (cc/bindings/core_module.cc, compiled here a second time): NumPy arrays in
// and out, copied to and from the device inside each call (StagedGpuTable),
// so the core conformance tests run unchanged against the GPU. String keys
// are refused (they stay on the CPU); num_threads is accepted and unused.
//
// GPU-only additions:
//   _core_gpu.gpu_available() -> (bool, reason)
//   Table.find_device(keys_ptr, n, values_ptr, default_ptr, exists_ptr=0, stream=None)
//   Table.insert_device(keys_ptr, n, values_ptr, scores_ptr=0, stream=None)
//   Table.assign_device(keys_ptr, n, values_ptr, scores_ptr=0, stream=None),
//   Table.assign(keys, values)
//   EmbeddingStep(params, slots, rule, ...): forward / backward (host arrays),
//     forward_device / backward_device (device addresses, stream=None)
//   Table.synchronize()
// The *_device methods take raw device addresses (e.g. a CuPy array's
// .data.ptr) and queue the GPU table's work without copies or host
// synchronization beyond what the GPU table itself does (gpu_table.h): on the
// table's own stream (stream=None; call synchronize() before reading the
// results), or on the caller's (stream=<cudaStream_t as int>), which orders
// the work with the caller's kernels and allocator. A caller whose arrays
// may be freed or rewritten before it synchronizes must pass its stream
// (RunnerFor). They exist for benchmarks: nothing checks the addresses.
//
// Built only with CUDA (setup.py: DYNEMB_CUDA=1), compiled by the host
// compiler and linked with the nvcc-compiled cc/core/gpu objects.

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include <cuda_runtime_api.h>

#include <memory>
#include <vector>

#include "cc/bindings_gpu/keyed_bindings.h"
#include "cc/core/gpu/embedding_step.h"
#include "cc/core/gpu/gpu_table.h"
#include "cc/core/gpu/staged_table.h"
#include "cc/core/table.h"

namespace dynemb {
namespace {
template <typename PyTableT>
void AddGpuBindings(pybind11::module_& m, pybind11::class_<PyTableT>& table_class);
}  // namespace
}  // namespace dynemb

#define DYNEMB_CORE_MODULE_NAME _core_gpu
#define DYNEMB_NEW_TABLE(options, status) NewStagedGpuTable(options, status)
#define DYNEMB_EXTRA_BINDINGS(m, table_class) ::dynemb::AddGpuBindings(m, table_class)
#include "cc/bindings/core_module.cc"

namespace dynemb {
namespace {

StagedGpuTable& Staged(Table& table) {
  // DYNEMB_NEW_TABLE above makes every table of this module a StagedGpuTable.
  return static_cast<StagedGpuTable&>(table);
}

template <typename T>
T* Address(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

// The runner a *_device call queues its work with: the table's own stream
// (stream None), or the caller's stream (an int: a cudaStream_t such as
// CuPy's `get_current_stream().ptr` or PyTorch's `current_stream().cuda_stream`;
// 0 is the legacy default stream). On the caller's stream the work is ordered
// after what the caller queued there (the keys being written, say) and before
// what it queues next (a reuse of their memory): without it, an asynchronous
// write could read keys the caller's allocator has already handed out again.
GpuRunner RunnerFor(const Runner& table_runner, const pybind11::object& stream) {
  const GpuRunner& own = static_cast<const GpuRunner&>(table_runner);
  if (stream.is_none()) return own;
  return GpuRunner(reinterpret_cast<cudaStream_t>(stream.cast<uintptr_t>()), own.scratch());
}

// Device memory for one call's staging (the host-array methods of EmbeddingStep).
class StagingBuffer {
 public:
  explicit StagingBuffer(size_t bytes) {
    ThrowIfError(CudaStatus(cudaMalloc(&ptr_, std::max<size_t>(bytes, 1)), "cudaMalloc"));
  }
  ~StagingBuffer() { (void)cudaFree(ptr_); }
  StagingBuffer(const StagingBuffer&) = delete;
  StagingBuffer& operator=(const StagingBuffer&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

// The bytes of a NumPy row of exactly `dim` values of the table's value type
// (empty for None), for EmbeddingStepOptions.
std::vector<char> RowBytes(const TableOptions& options, const pybind11::handle& obj, int64_t dim,
                           const char* name) {
  if (obj.is_none()) return {};
  pybind11::array a = ToValueArray(options, obj, name);
  if (ShapeOf(a) != std::vector<pybind11::ssize_t>{static_cast<pybind11::ssize_t>(dim)}) {
    throw pybind11::value_error(std::string(name) + ": Expected shape " +
                                ShapeString({static_cast<pybind11::ssize_t>(dim)}) + ", got " +
                                ShapeString(ShapeOf(a)));
  }
  const char* data = static_cast<const char*>(a.data());
  return std::vector<char>(data, data + a.nbytes());
}

// A GpuEmbeddingStep over two tables of this module, run on the parameter
// table's stream.
template <typename PyTableT>
class PyEmbeddingStep {
 public:
  PyEmbeddingStep(PyTableT& params, PyTableT& slots, const std::string& rule, bool weight_decay,
                  const pybind11::handle& default_row, const pybind11::handle& initial_state,
                  const pybind11::handle& keyed_init)
      : params_(Staged(params.table())), options_(params.options()) {
    EmbeddingStepOptions o;
    if (!ParseUpdateRule(rule, &o.rule)) {
      throw pybind11::value_error("rule: expected a rule name of cc/core/update_rules.h (e.g. "
                                  "'keras_adam'), got '" + rule + "'");
    }
    o.weight_decay = weight_decay;
    o.default_row = RowBytes(options_, default_row, options_.dim, "default_row");
    o.initial_state = RowBytes(options_, initial_state, slots.options().dim, "initial_state");
    if (!keyed_init.is_none()) {
      // (seed, distribution, a, b), as keyed_random takes them.
      pybind11::tuple t = keyed_init.cast<pybind11::tuple>();
      if (t.size() != 4) {
        throw pybind11::value_error("keyed_init: expected (seed, distribution, a, b), got " +
                                    std::to_string(t.size()) + " items");
      }
      o.keyed_init = true;
      o.init = KeyedSpecOf(options_.dim, t[0].cast<int64_t>(), t[1].cast<std::string>(),
                           t[2].cast<double>(), t[3].cast<double>(), "keyed_init");
    }
    Status status;
    step_ = NewGpuEmbeddingStep(&params_.gpu_table(), &Staged(slots.table()).gpu_table(), o,
                                nullptr, &status);
    ThrowIfError(status);
    rule_coefficients_ = UpdateRuleCoefficients(o.rule) + (weight_decay ? 2 : 0);
  }

  void ForwardDevice(uintptr_t ids, int64_t n, uintptr_t out, const pybind11::object& stream) {
    const GpuRunner on = RunnerFor(runner(), stream);
    Status status;
    {
      pybind11::gil_scoped_release release;
      status = step_->Forward(Address<const void>(ids), n, Address<void>(out), on);
    }
    ThrowIfError(status);
  }

  void BackwardDevice(uintptr_t grads, const pybind11::handle& coefficients,
                      const pybind11::object& stream) {
    pybind11::array c = Coefficients(coefficients);
    const void* c_data = c.data();  // with the GIL
    const GpuRunner on = RunnerFor(runner(), stream);
    Status status;
    {
      pybind11::gil_scoped_release release;
      status = step_->Backward(Address<const void>(grads), c_data, on);
    }
    ThrowIfError(status);
  }

  // Host arrays: ids [n] -> rows [n, dim].
  pybind11::array Forward(const pybind11::handle& ids_obj) {
    KeyBatch ids = ToKeyBatch(options_, ids_obj);
    // Sizes and addresses are read while the GIL is held: py::array's
    // accessors may touch Python objects (the dtype).
    const size_t ids_bytes = static_cast<size_t>(ids.numeric.nbytes());
    const void* ids_data = ids.data();
    const size_t out_bytes = static_cast<size_t>(ids.n) * options_.value_bytes();
    StagingBuffer d_ids(ids_bytes);
    StagingBuffer d_out(out_bytes);
    pybind11::array out(ValueDtype(options_.value_type), RowsShape(ids, options_.dim));
    void* out_data = out.mutable_data();
    Status status;
    {
      pybind11::gil_scoped_release release;
      const cudaStream_t stream = runner().stream();
      status = CudaStatus(cudaMemcpyAsync(d_ids.get(), ids_data, ids_bytes,
                                          cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
      if (status.ok()) status = step_->Forward(d_ids.get(), ids.n, d_out.get(), runner());
      if (status.ok()) {
        status = CudaStatus(cudaMemcpyAsync(out_data, d_out.get(), out_bytes,
                                            cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
      }
      if (status.ok()) status = params_.Synchronize();
    }
    ThrowIfError(status);
    return out;
  }

  // Host arrays: grads [n, dim] of the last forward's rows.
  void Backward(const pybind11::handle& grads_obj, const pybind11::handle& coefficients) {
    pybind11::array grads = ToValueArray(options_, grads_obj, "grads");
    pybind11::array c = Coefficients(coefficients);
    const size_t grads_bytes = static_cast<size_t>(grads.nbytes());  // with the GIL
    const void* grads_data = grads.data();
    const void* c_data = c.data();
    StagingBuffer d_grads(grads_bytes);
    Status status;
    {
      pybind11::gil_scoped_release release;
      const cudaStream_t stream = runner().stream();
      status = CudaStatus(cudaMemcpyAsync(d_grads.get(), grads_data, grads_bytes,
                                          cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
      if (status.ok()) status = step_->Backward(d_grads.get(), c_data, runner());
      if (status.ok()) status = params_.Synchronize();
    }
    ThrowIfError(status);
  }

  int64_t num_unique() const { return step_->num_unique(); }

 private:
  const GpuRunner& runner() const {
    return static_cast<const GpuRunner&>(params_.gpu_runner());
  }

  pybind11::array Coefficients(const pybind11::handle& obj) const {
    pybind11::array c = ToValueArray(options_, obj, "coefficients");
    if (ShapeOf(c) != std::vector<pybind11::ssize_t>{rule_coefficients_}) {
      throw pybind11::value_error("coefficients: Expected shape " +
                                  ShapeString({rule_coefficients_}) + ", got " +
                                  ShapeString(ShapeOf(c)));
    }
    return c;
  }

  StagedGpuTable& params_;
  const TableOptions options_;
  std::unique_ptr<GpuEmbeddingStep> step_;
  pybind11::ssize_t rule_coefficients_ = 0;
};

template <typename PyTableT>
void AddGpuBindings(pybind11::module_& m, pybind11::class_<PyTableT>& table_class) {
  namespace py = pybind11;
  m.doc() =
      "TF-free bindings of the tensorflow_dynemb GPU core table (cc/core/gpu), with the "
      "surface of tensorflow_dynemb._core. See cc/bindings_gpu/core_gpu_module.cc.";
  m.attr("KEY_DTYPES") = py::make_tuple("int32", "int64");
  m.def("gpu_available", [] {
    std::string reason;
    const bool ok = GpuAvailable(&reason);
    return py::make_tuple(ok, reason);
  }, "(True, '') when a CUDA device is usable, else (False, the reason).");
  AddKeyedGpuBindings(m);
  using Step = PyEmbeddingStep<PyTableT>;
  py::class_<Step>(m, "EmbeddingStep",
                   "One embedding training step on the device (cc/core/gpu/embedding_step.h) "
                   "over a parameter table and its slot-state table of this module.")
      .def(py::init<PyTableT&, PyTableT&, const std::string&, bool, const py::handle&,
                    const py::handle&, const py::handle&>(),
           py::arg("params"), py::arg("slots"), py::arg("rule") = "keras_adam",
           py::arg("weight_decay") = false, py::arg("default_row") = py::none(),
           py::arg("initial_state") = py::none(), py::arg("keyed_init") = py::none(),
           py::keep_alive<1, 2>(), py::keep_alive<1, 3>(),
           "keyed_init: (seed, distribution, a, b) for key-seeded initial rows (as "
           "keyed_random), else default_row (None: zeros). initial_state: a new id's "
           "slot-state row (None: zeros).")
      .def("forward", &Step::Forward, py::arg("ids"), "ids [n] -> rows [n, dim] (host arrays).")
      .def("backward", &Step::Backward, py::arg("grads"), py::arg("coefficients"),
           "grads [n, dim] of the last forward's rows; coefficients as apply_rule's.")
      .def("forward_device", &Step::ForwardDevice, py::arg("ids_ptr"), py::arg("n"),
           py::arg("out_ptr"), py::arg("stream") = py::none(),
           "forward on device memory (returns after one host sync); stream: as "
           "Table.find_device's.")
      .def("backward_device", &Step::BackwardDevice, py::arg("grads_ptr"),
           py::arg("coefficients"), py::arg("stream") = py::none(),
           "backward on device memory (asynchronous); stream: as Table.find_device's.")
      .def_property_readonly("num_unique", &Step::num_unique);
  table_class
      .def("find_device",
           [](PyTableT& t, uintptr_t keys, int64_t n, uintptr_t values, uintptr_t defaults,
              uintptr_t exists, const py::object& stream) {
             StagedGpuTable& s = Staged(t.table());
             const GpuRunner on = RunnerFor(s.gpu_runner(), stream);
             Status status;
             {
               py::gil_scoped_release release;
               status = s.gpu_table().Find(Address<const void>(keys), n, Address<void>(values),
                                           Address<bool>(exists), Address<const void>(defaults),
                                           /*default_per_key=*/false, on);
             }
             ThrowIfError(status);
           },
           py::arg("keys_ptr"), py::arg("n"), py::arg("values_ptr"), py::arg("default_ptr"),
           py::arg("exists_ptr") = 0, py::arg("stream") = py::none(),
           "find on device memory: keys [n], values [n, dim] out, one default row, "
           "exists [n] bool out (0: not wanted). Asynchronous. stream None: the table's "
           "own stream (call synchronize()); an int: the caller's cudaStream_t (e.g. "
           "cupy.cuda.get_current_stream().ptr; 0: the legacy default stream), ordered "
           "with the caller's work there: use it whenever the caller frees or rewrites "
           "the arrays before synchronizing.")
      .def("insert_device",
           [](PyTableT& t, uintptr_t keys, int64_t n, uintptr_t values, uintptr_t scores,
              const py::object& stream) {
             StagedGpuTable& s = Staged(t.table());
             const GpuRunner on = RunnerFor(s.gpu_runner(), stream);
             Status status;
             {
               py::gil_scoped_release release;
               status = s.gpu_table().Insert(Address<const void>(keys), n,
                                             Address<const void>(values),
                                             Address<const uint64_t>(scores), on);
             }
             ThrowIfError(status);
           },
           py::arg("keys_ptr"), py::arg("n"), py::arg("values_ptr"), py::arg("scores_ptr") = 0,
           py::arg("stream") = py::none(),
           "insert (insert-or-assign) from device memory: keys [n], values [n, dim], "
           "scores [n] uint64 (0: none). Asynchronous; stream: as find_device's.")
      .def("assign_device",
           [](PyTableT& t, uintptr_t keys, int64_t n, uintptr_t values, uintptr_t scores,
              const py::object& stream) {
             StagedGpuTable& s = Staged(t.table());
             GpuTableOps* ops = AsGpuTableOps(&s.gpu_table());
             const GpuRunner on = RunnerFor(s.gpu_runner(), stream);
             Status status;
             {
               py::gil_scoped_release release;
               status = ops->Assign(Address<const void>(keys), n, Address<const void>(values),
                                    Address<const uint64_t>(scores), on);
             }
             ThrowIfError(status);
           },
           py::arg("keys_ptr"), py::arg("n"), py::arg("values_ptr"), py::arg("scores_ptr") = 0,
           py::arg("stream") = py::none(),
           "assign (update the keys present, insert nothing) from device memory: keys [n], "
           "values [n, dim], scores [n] uint64 (0: none). Asynchronous; stream: as find_device's.")
      .def("assign",
           [](PyTableT& t, const py::handle& keys_obj, const py::handle& values_obj) {
             const TableOptions& o = t.options();
             KeyBatch keys = ToKeyBatch(o, keys_obj);
             py::array values = ToValueArray(o, values_obj, "values");
             CheckRowsShape(values, keys, o.dim, "values");
             Status status;
             {
               py::gil_scoped_release release;
               status = Staged(t.table()).Assign(keys.data(), keys.n, values.data(), nullptr);
             }
             ThrowIfError(status);
           },
           py::arg("keys"), py::arg("values"),
           "Writes values (and update scores) of the keys the table holds; absent keys are "
           "left out (HKV's assign).")
      .def("synchronize",
           [](PyTableT& t) {
             Status status;
             {
               py::gil_scoped_release release;
               status = Staged(t.table()).Synchronize();
             }
             ThrowIfError(status);
           },
           "Waits for the work queued by the *_device methods.");
}

}  // namespace
}  // namespace dynemb
