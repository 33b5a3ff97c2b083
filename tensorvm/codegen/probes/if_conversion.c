/* The toolchain probe of loop if-conversion (tensorvm/codegen/build.py: _if_conversion_sound): the kernel
   tensorvm generates for concatenate((x, x), axis=0) of a (3, 2) float32 tensor. GCC 12.2 at -O3 with
   AVX2 vectorizes its if-converted select between two loads of the same array wrongly (element 7 comes
   out 0 instead of 1). Where this, built with the probe's flags, gives a wrong answer, the generated
   kernels holding such a select are built without loop if-conversion (TV_SELECT_OF_LOADS, tv_kernel.h). */
#include <stdint.h>
int32_t tv_probe(const float* restrict p0, float* restrict out0);
int32_t tv_probe(const float* restrict p0, float* restrict out0) {
  for (int64_t i0 = 0; i0 < INT64_C(6); ++i0) {
    for (int64_t i1 = 0; i1 < INT64_C(2); ++i1) {
      out0[((i0 * INT64_C(2)) + i1)] = ((i0 < INT64_C(3)) ? p0[((i0 * INT64_C(2)) + i1)]
                                                          : p0[(((i0 + INT64_C(-3)) * INT64_C(2)) + i1)]);
    }
  }
  return 0;
}
