// The keyed-random and partition functions of `tensorflow_dynemb._core_gpu`
// (keyed_bindings.cc).

#ifndef DYNEMB_BINDINGS_GPU_KEYED_BINDINGS_H_
#define DYNEMB_BINDINGS_GPU_KEYED_BINDINGS_H_

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "cc/core/gpu/keyed_gpu.h"

namespace dynemb {

// Adds partition, keyed_random, keyed_random_fill (on the device) and their
// host references partition_host, keyed_random_host, keyed_random_fill_host
// to `m`.
void AddKeyedGpuBindings(pybind11::module_& m);

// The KeyedRandomSpec of keyed_random's arguments; a bad distribution or dim
// raises ValueError naming `fn`.
KeyedRandomSpec KeyedSpecOf(int64_t dim, int64_t seed, const std::string& distribution, double a,
                            double b, const char* fn);

}  // namespace dynemb

#endif  // DYNEMB_BINDINGS_GPU_KEYED_BINDINGS_H_
