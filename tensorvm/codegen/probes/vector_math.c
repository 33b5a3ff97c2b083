/* The toolchain probe of vector math (tensorvm/codegen/build.py: _vector_math_works): built after the
   kernel prelude (tv_kernel.h) with -DTV_VECTOR_MATH, whose declarations let the vectorizer call glibc's
   libmvec; the probe passes when this compiles, links and loads. */
#include "tv_kernel.h"
void tv_probe(const float* restrict x, float* restrict y, const double* restrict u, double* restrict v, long n);
void tv_probe(const float* restrict x, float* restrict y, const double* restrict u, double* restrict v, long n) {
  for (long i = 0; i < n; ++i)
    y[i] = expf(x[i]) + logf(x[i]) + log2f(x[i]) + log10f(x[i]) + sinf(x[i]) + cosf(x[i]) + tanf(x[i])
         + tanhf(x[i]) + erff(x[i]) + powf(x[i], x[i]);
  for (long i = 0; i < n; ++i)
    v[i] = exp(u[i]) + log(u[i]) + log2(u[i]) + log10(u[i]) + sin(u[i]) + cos(u[i]) + tan(u[i])
         + tanh(u[i]) + erf(u[i]) + pow(u[i], u[i]);
}
