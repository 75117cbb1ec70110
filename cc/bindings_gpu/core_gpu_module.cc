// pybind11 module `tensorflow_dynemb._core_gpu`: the GPU core table
// (cc/core/gpu) behind the same Python surface as `tensorflow_dynemb._core`
// (cc/bindings/core_module.cc, compiled here a second time): NumPy arrays in
// and out, copied to and from the device inside each call (StagedGpuTable),
// so the core conformance tests run unchanged against the GPU. String keys
// are refused (they stay on the CPU); num_threads is accepted and unused.
//
// GPU-only additions:
//   _core_gpu.gpu_available() -> (bool, reason)
//   Table.find_device(keys_ptr, n, values_ptr, default_ptr, exists_ptr=0)
//   Table.insert_device(keys_ptr, n, values_ptr, scores_ptr=0)
//   Table.synchronize()
// The *_device methods take raw device addresses (e.g. a CuPy array's
// .data.ptr) and queue the GPU table's work on the table's stream without
// copies or host synchronization beyond what the GPU table itself does
// (gpu_table.h); call synchronize() before reading the results. They exist
// for benchmarks: nothing checks the addresses.
//
// Built only with CUDA (setup.py: DYNEMB_CUDA=1), compiled by the host
// compiler and linked with the nvcc-compiled cc/core/gpu objects.

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

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
  table_class
      .def("find_device",
           [](PyTableT& t, uintptr_t keys, int64_t n, uintptr_t values, uintptr_t defaults,
              uintptr_t exists) {
             StagedGpuTable& s = Staged(t.table());
             Status status;
             {
               py::gil_scoped_release release;
               status = s.gpu_table().Find(Address<const void>(keys), n, Address<void>(values),
                                           Address<bool>(exists), Address<const void>(defaults),
                                           /*default_per_key=*/false, s.gpu_runner());
             }
             ThrowIfError(status);
           },
           py::arg("keys_ptr"), py::arg("n"), py::arg("values_ptr"), py::arg("default_ptr"),
           py::arg("exists_ptr") = 0,
           "find on device memory: keys [n], values [n, dim] out, one default row, "
           "exists [n] bool out (0: not wanted). Asynchronous: call synchronize().")
      .def("insert_device",
           [](PyTableT& t, uintptr_t keys, int64_t n, uintptr_t values, uintptr_t scores) {
             StagedGpuTable& s = Staged(t.table());
             Status status;
             {
               py::gil_scoped_release release;
               status = s.gpu_table().Insert(Address<const void>(keys), n,
                                             Address<const void>(values),
                                             Address<const uint64_t>(scores), s.gpu_runner());
             }
             ThrowIfError(status);
           },
           py::arg("keys_ptr"), py::arg("n"), py::arg("values_ptr"), py::arg("scores_ptr") = 0,
           "insert (insert-or-assign) from device memory: keys [n], values [n, dim], "
           "scores [n] uint64 (0: none).")
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
