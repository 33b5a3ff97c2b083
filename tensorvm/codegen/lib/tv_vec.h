/* The vector type every hand-written vector kernel is written in (GCC vector extensions), one vector of
   the host's width: TV_VEC_BYTES (16, 32 or 64) comes from tensorvm/codegen/host.py (rule_defines; the
   default is the portable 128-bit width). A vector wider than the target's is lowered by gcc to several
   native ones, so every instance is correct on any x86-64 (and fast where the width is native).
   Used by the softmax (tv_kernel.h), the packed product (tv_vgemm.h) and the direct convolution. */
#ifndef TV_VEC_H
#define TV_VEC_H

#include <stdint.h>

#ifndef TV_VEC_BYTES
#define TV_VEC_BYTES 16
#endif
#define TV_VLANES (TV_VEC_BYTES / 4)
/* How many tv_vf the register file of the target gcc compiles for holds (a rule of the ISA, for tiles that
   choose how many accumulators to keep): AVX-512 has 32 registers (of 32 bytes as well, with AVX-512VL),
   AArch64 32, AVX2 and SSE 16; a vector wider than the native ones takes several of them. */
#if (defined(__AVX512F__) && (TV_VEC_BYTES == 64 || defined(__AVX512VL__))) || defined(__aarch64__)
#define TV_NATIVE_REGISTERS 32
#else
#define TV_NATIVE_REGISTERS 16
#endif
#if defined(__AVX512F__)
#define TV_NATIVE_BYTES 64
#elif defined(__AVX__)
#define TV_NATIVE_BYTES 32
#else
#define TV_NATIVE_BYTES 16
#endif
#if TV_VEC_BYTES <= TV_NATIVE_BYTES
#define TV_VREGISTERS TV_NATIVE_REGISTERS
#else
#define TV_VREGISTERS (TV_NATIVE_REGISTERS * TV_NATIVE_BYTES / TV_VEC_BYTES)
#endif

/* tv_vf: a vector of floats; tv_vfu: the same read from any float address (unaligned, may alias);
   tv_vmask: what comparing two tv_vf gives (-1 where true, 0 where false); tv_vbits: unsigned lanes. */
typedef float tv_vf __attribute__((vector_size(TV_VEC_BYTES)));
typedef float tv_vfu __attribute__((vector_size(TV_VEC_BYTES), aligned(4), may_alias));
typedef int32_t tv_vmask __attribute__((vector_size(TV_VEC_BYTES)));
typedef uint32_t tv_vbits __attribute__((vector_size(TV_VEC_BYTES)));  /* (shifts without overflow) */
#define TV_VLOAD(p) (*(const tv_vfu*)(p))
#define TV_VSTORE(p, v) (*(tv_vfu*)(p) = (v))
/* A vector of s in every lane, written out (``(tv_vf){0} + s`` would cost an addition: 0 + -0 is +0). */
#define TV_VSPLAT4(s) s, s, s, s
#if TV_VLANES == 4
#define TV_VSPLAT(s) ((tv_vf){TV_VSPLAT4(s)})
#elif TV_VLANES == 8
#define TV_VSPLAT(s) ((tv_vf){TV_VSPLAT4(s), TV_VSPLAT4(s)})
#elif TV_VLANES == 16
#define TV_VSPLAT(s) ((tv_vf){TV_VSPLAT4(s), TV_VSPLAT4(s), TV_VSPLAT4(s), TV_VSPLAT4(s)})
#else
#error "TV_VEC_BYTES must be 16, 32 or 64"
#endif
/* Where mask, a, else b (C has no vector ?:). Macros and pointers, not vector arguments: passing a vector
   wider than the target's by value changes the ABI (gcc warns), and the 64-byte instance is built on
   AVX2 machines too. */
#define TV_VSELECT(mask, a, b) ((tv_vf)(((tv_vmask)(a) & (mask)) | ((tv_vmask)(b) & ~(mask))))
/* The clamped affine activations of the convolutions' and the product's epilogues (relu, relu6 and clip,
   hard-sigmoid, hard-swish; strategy.ACT_*): s = alpha v + beta, clamped below at lo (TV_ACT_LO) and above
   at hi (TV_ACT_HI), times v itself with TV_ACT_GATE. TV_VACT(v, e): v = that, lane by lane, for an
   epilogue e (e.act != 0) with the fields act, alpha, beta, lo and hi; a NaN stays NaN (a failed
   comparison keeps s). A macro, as TV_VSELECT. */
#define TV_ACT_LO 1
#define TV_ACT_HI 2
#define TV_ACT_GATE 4
#define TV_VACT(v, e) {                                                                              \
    tv_vf s_ = (v) * TV_VSPLAT((e).alpha) + TV_VSPLAT((e).beta);                                     \
    if ((e).act & TV_ACT_LO) s_ = TV_VSELECT(s_ < TV_VSPLAT((e).lo), TV_VSPLAT((e).lo), s_);          \
    if ((e).act & TV_ACT_HI) s_ = TV_VSELECT(s_ > TV_VSPLAT((e).hi), TV_VSPLAT((e).hi), s_);          \
    (v) = (e).act & TV_ACT_GATE ? (v) * s_ : s_; }
static inline float tv_vsum(const tv_vf* v) {
  float total = 0.0f;
  for (int i = 0; i < TV_VLANES; ++i) total += (*v)[i];
  return total;
}

/* exp(x) for x <= 0 (or NaN) on a vector: the steps of tv_exp_nonpositive_f32 (tv_kernel.h) lane by lane;
   a*b + c contracts to an FMA where the target has one, else rounds twice: the reduction's k * ln2_hi is
   exact either way. Here, not in tv_kernel.h, so the softmax and the product's GELU share it. */
static inline void tv_vexp_nonpositive_f32(tv_vf* v) {  /* (in place: see TV_VSELECT) */
  const tv_vf x = *v, lowest = TV_VSPLAT(-87.0f), magic = TV_VSPLAT(12582912.0f);
  const tv_vmask below = x < lowest;  /* (false for NaN: it passes) */
  const tv_vf clamped = TV_VSELECT(below, lowest, x);
  const tv_vf shifted = clamped * TV_VSPLAT(1.44269504088896341f) + magic;
  const tv_vf k = shifted - magic;
  tv_vf r = k * TV_VSPLAT(-0.693359375f) + clamped;
  r = k * TV_VSPLAT(2.12194440e-4f) + r;
  tv_vf p = TV_VSPLAT(1.9875691500e-4f);
  p = p * r + TV_VSPLAT(1.3981999507e-3f);
  p = p * r + TV_VSPLAT(8.3334519073e-3f);
  p = p * r + TV_VSPLAT(4.1665795894e-2f);
  p = p * r + TV_VSPLAT(1.6666665459e-1f);
  p = p * r + TV_VSPLAT(5.0000001201e-1f);
  p = p * (r * r) + r + TV_VSPLAT(1.0f);
  const tv_vbits bits = (tv_vbits)p + ((tv_vbits)shifted << 23);
  *v = (tv_vf)(bits & ~(tv_vbits)below);
}

#endif /* TV_VEC_H */
