/* How many float32 multiply-adds per nanosecond this core retires with 32-byte and with 64-byte vectors
   (host.py's fma_bits: AVX-512 parts whose FMA units are 512 bits wide do twice the work per instruction
   at 64 bytes; parts that split a 512-bit operation into two 256-bit halves, as Zen 4 does, do the same
   work at either width, so the wider vectors only cost registers and larger tails there).

   tv_fma_probe_ns(bytes, iters) runs TV_PROBE_CHAINS independent chains of `iters` FMAs each on vectors of
   `bytes` (32 or 64) and returns the nanoseconds it took. The chains outnumber an FMA's latency times
   its pipes (4-5 cycles x 2 on current x86), so the loop is bound by throughput, not latency. Built with
   the toolchain's flags (-march=native): on a machine without AVX-512 the 64-byte vectors are lowered to
   pairs of 256-bit operations, which the probe then reports as no gain, as it should. */
#include <stdint.h>

#include "tv_clock.h"

#define TV_PROBE_CHAINS 12

typedef float tv_probe_v8 __attribute__((vector_size(32)));
typedef float tv_probe_v16 __attribute__((vector_size(64)));

/* One body per width (a macro: the same text, two vector types). The multiplier is just below 1 and the
   addend small, so the values stay normal (no denormal slow path) whatever `iters` is. `sink` keeps the
   result alive. */
#define TV_PROBE_BODY(T)                                                                  \
  T acc[TV_PROBE_CHAINS];                                                                 \
  const T mul = (T){0} + 0.999999f, add = (T){0} + 1e-7f;                                 \
  for (int c = 0; c < TV_PROBE_CHAINS; ++c) acc[c] = (T){0} + (float)(c + 1);             \
  const int64_t start = tv_now_ns();                                                      \
  for (int64_t i = 0; i < iters; ++i) {                                                   \
    for (int c = 0; c < TV_PROBE_CHAINS; ++c) acc[c] = acc[c] * mul + add;                \
  }                                                                                       \
  const int64_t took = tv_now_ns() - start;                                               \
  float total = 0.0f;                                                                     \
  for (int c = 0; c < TV_PROBE_CHAINS; ++c) total += acc[c][0];                           \
  *sink = total;                                                                          \
  return took;

static int64_t tv_probe_256(int64_t iters, float* sink) { TV_PROBE_BODY(tv_probe_v8) }
static int64_t tv_probe_512(int64_t iters, float* sink) { TV_PROBE_BODY(tv_probe_v16) }

int64_t tv_fma_probe_ns(int32_t bytes, int64_t iters, float* sink) {
  if (iters < 1) return 0;
  return bytes == 64 ? tv_probe_512(iters, sink) : tv_probe_256(iters, sink);
}
