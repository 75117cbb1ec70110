// BoxMullerBatch (partition.h): glibc's vector math where available.
//
// libmvec is looked up at run time (dlopen) rather than linked, so the library
// loads on any glibc; the AVX2 variants (_ZGVdN4v_*) are used only when the
// CPU has AVX2 and FMA, which those variants require.

#include <dlfcn.h>
#include <immintrin.h>

#include <cstdint>

#include "cc/core/partition.h"

namespace dynemb {
namespace {

using VectorFn = __m256d (*)(__m256d);

struct VectorMath {
  VectorFn log = nullptr;
  VectorFn cos = nullptr;
};

VectorMath LoadVectorMath() {
  VectorMath math;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return math;
  void* lib = dlopen("libmvec.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return math;  // kept open for the process's lifetime
  math.log = reinterpret_cast<VectorFn>(dlsym(lib, "_ZGVdN4v_log"));
  math.cos = reinterpret_cast<VectorFn>(dlsym(lib, "_ZGVdN4v_cos"));
  if (math.log == nullptr || math.cos == nullptr) math = VectorMath();
  return math;
}

const VectorMath& GetVectorMath() {
  static const VectorMath math = LoadVectorMath();
  return math;
}

// The same operations as BoxMuller, four at a time: -2 * log(u1), its square
// root, 2 pi * u2, its cosine, the product (each IEEE-rounded like the scalar
// code; only log and cos are different implementations).
__attribute__((target("avx2,fma"))) void BoxMullerAvx2(const VectorMath& math, const double* u1,
                                                       const double* u2, int64_t n, double* z) {
  const __m256d minus_two = _mm256_set1_pd(-2.0);
  const __m256d two_pi = _mm256_set1_pd(6.283185307179586476925286766559);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const __m256d radius =
        _mm256_sqrt_pd(_mm256_mul_pd(minus_two, math.log(_mm256_loadu_pd(u1 + i))));
    const __m256d angle = math.cos(_mm256_mul_pd(two_pi, _mm256_loadu_pd(u2 + i)));
    _mm256_storeu_pd(z + i, _mm256_mul_pd(radius, angle));
  }
  for (; i < n; ++i) z[i] = BoxMuller(u1[i], u2[i]);
}

}  // namespace

void BoxMullerBatch(const double* u1, const double* u2, int64_t n, double* z) {
  const VectorMath& math = GetVectorMath();
  if (math.log != nullptr && n >= 4) {
    BoxMullerAvx2(math, u1, u2, n, z);
    return;
  }
  for (int64_t i = 0; i < n; ++i) z[i] = BoxMuller(u1[i], u2[i]);
}

}  // namespace dynemb
