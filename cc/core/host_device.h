// DYNEMB_HOST_DEVICE marks small inline functions that both the CPU core
// (g++) and the CUDA core (nvcc, cc/core/gpu) call, so each rule exists once.
// Under g++ it expands to nothing.

#ifndef DYNEMB_CORE_HOST_DEVICE_H_
#define DYNEMB_CORE_HOST_DEVICE_H_

#ifdef __CUDACC__
#define DYNEMB_HOST_DEVICE __host__ __device__
#else
#define DYNEMB_HOST_DEVICE
#endif

#endif  // DYNEMB_CORE_HOST_DEVICE_H_
