/* The packed float32 product written once for every vector ISA (GCC vector extensions), instantiated by
   macros that tensorvm/codegen/host.py derives from a description of the host (gemm_params, gemm_defines):

     TV_VEC_BYTES  bytes per vector: 16 (portable, 128-bit), 32 (AVX2), 64 (AVX-512);
     TV_VGEMM_MR   rows of the register tile (1..14): 2 MR accumulators + 3 registers fit the register file;
     TV_VGEMM_KC   the longest reduction block;  TV_VGEMM_MC  rows per block (the x block stays in L2);
     TV_VGEMM_L1_BYTES, TV_VGEMM_GROUP_BYTES  half of L1d and of L2 (panel order, see tv_vgemm_block).

   The weight W (n x k) is packed as ceil(n / NR) panels of k x NR floats, NR = 2 vectors (TV_VGEMM_NR):
   output column j reads panel j / NR, lane j % NR (zero padded). tv_vgemm_packed_f32 computes
   out (m x n) = x (m x k) W^T in register tiles of MR x NR: each reduction step loads one panel row
   (2 vectors), broadcasts MR values of x and issues 2 MR FMAs into accumulators that stay in registers
   (named variables written out by the TV_VROWS macros: an array of accumulators would live in memory).
   A vector wider than the target's is lowered by gcc to several native ones: the 64-byte instance is
   correct (and tested) on an AVX2 machine, fast only with AVX-512.
   Included by tv_gemm.h (TV_PACKED_KERNELS), after the OpenMP helpers it uses. */
#ifndef TV_VGEMM_H
#define TV_VGEMM_H

#ifndef TV_VGEMM_MR
#define TV_VGEMM_MR 6
#endif
#ifndef TV_VGEMM_KC
#define TV_VGEMM_KC 768
#endif
#ifndef TV_VGEMM_MC
#define TV_VGEMM_MC 132
#endif
#ifndef TV_VGEMM_ONTHEFLY
#define TV_VGEMM_ONTHEFLY 65536
#endif
#if TV_VGEMM_MR < 1 || TV_VGEMM_MR > 14
#error "TV_VGEMM_MR must be between 1 and 14"
#endif
#include <stddef.h> /* NULL: the header compiles on its own */

#include "tv_vec.h"
#define TV_VGEMM_NR (2 * TV_VLANES)

/* Prefetch the weight 2 KB ahead of the step being read, one hint per cache line of a panel row: with few
   rows the weight streams from DRAM and the hardware prefetchers alone fall behind. */
#define TV_VPREFETCH(p)                                                                              \
  _Pragma("GCC unroll 4") for (int l = 0; l < TV_VGEMM_NR * 4; l += 64)                              \
    __builtin_prefetch((const char*)(p) + 2048 + l, 0, 3);

#define TV_VROWS1(F) F(0)
#define TV_VROWS2(F) TV_VROWS1(F) F(1)
#define TV_VROWS3(F) TV_VROWS2(F) F(2)
#define TV_VROWS4(F) TV_VROWS3(F) F(3)
#define TV_VROWS5(F) TV_VROWS4(F) F(4)
#define TV_VROWS6(F) TV_VROWS5(F) F(5)
#define TV_VROWS7(F) TV_VROWS6(F) F(6)
#define TV_VROWS8(F) TV_VROWS7(F) F(7)
#define TV_VROWS9(F) TV_VROWS8(F) F(8)
#define TV_VROWS10(F) TV_VROWS9(F) F(9)
#define TV_VROWS11(F) TV_VROWS10(F) F(10)
#define TV_VROWS12(F) TV_VROWS11(F) F(11)
#define TV_VROWS13(F) TV_VROWS12(F) F(12)
#define TV_VROWS14(F) TV_VROWS13(F) F(13)

#define TV_VTILE_ZERO(r) tv_vf lo##r = {0}, hi##r = {0};
#define TV_VTILE_LOAD(r) lo##r = TV_VLOAD(c + r * ldc); hi##r = TV_VLOAD(c + r * ldc + TV_VLANES);
#define TV_VTILE_FMA(r) { const tv_vf a = TV_VSPLAT(x[r * ldx + p]); lo##r += a * b0; hi##r += a * b1; }
#define TV_VTILE_STORE(r) TV_VSTORE(c + r * ldc, lo##r); TV_VSTORE(c + r * ldc + TV_VLANES, hi##r);
/* A tile of R rows x NR outputs at c (row stride ldc) = (or +=) x . panel over kc steps. */
#define TV_VTILE(R)                                                                                  \
  static void tv_vgemm_tile##R(const float* x, int64_t ldx, const float* panel, int64_t kc, float* c, \
                               int64_t ldc, int accumulate) {                                        \
    TV_VROWS##R(TV_VTILE_ZERO)                                                                       \
    if (accumulate) { TV_VROWS##R(TV_VTILE_LOAD) }                                                   \
    _Pragma("GCC unroll 4") /* the loop's own work (index, compare) is a tenth of a short tile */    \
    for (int64_t p = 0; p < kc; ++p) {                                                               \
      const float* row = panel + p * TV_VGEMM_NR;                                                    \
      TV_VPREFETCH(row)                                                                              \
      const tv_vf b0 = TV_VLOAD(row), b1 = TV_VLOAD(row + TV_VLANES);                                \
      TV_VROWS##R(TV_VTILE_FMA)                                                                      \
    }                                                                                                \
    TV_VROWS##R(TV_VTILE_STORE)                                                                      \
  }
/* Two or three rows keep only 4 or 6 accumulators: fewer chains than the FMA units' latency x their
   number (4 x 2 on current x86 cores), so such a tile waits on its own sums (a 2-row product with its
   weights in L2 took 0.87x the time of a 4-row one). Where the registers hold twice the accumulators
   besides 4 weight vectors and 2 broadcasts (TV_VTILE2_FITS), the tile reads the panel as two streams,
   the first and second halves of the reduction, added at the store; where they do not (3 rows with 16
   registers) the spills made it 1.6-1.7x slower than one stream. */
#define TV_VTILE2_FITS(R) (4 * (R) + 6 <= TV_VREGISTERS)
#define TV_VTILE2_ZERO(r) tv_vf lo##r = {0}, hi##r = {0}, LO##r = {0}, HI##r = {0};
#define TV_VTILE2_FMA(r)                                                                           \
  {                                                                                                \
    const tv_vf a = TV_VSPLAT(x[r * ldx + p]), e = TV_VSPLAT(x[r * ldx + half + p]);               \
    lo##r += a * b0, hi##r += a * b1, LO##r += e * d0, HI##r += e * d1;                            \
  }
#define TV_VTILE2_TAIL(r) { const tv_vf a = TV_VSPLAT(x[r * ldx + p]); lo##r += a * b0; hi##r += a * b1; }
#define TV_VTILE2_STORE(r) TV_VSTORE(c + r * ldc, lo##r + LO##r); TV_VSTORE(c + r * ldc + TV_VLANES, hi##r + HI##r);
#define TV_VTILE2(R)                                                                                 \
  static void tv_vgemm_tile##R(const float* x, int64_t ldx, const float* panel, int64_t kc, float* c, \
                               int64_t ldc, int accumulate) {                                        \
    TV_VROWS##R(TV_VTILE2_ZERO)                                                                      \
    if (accumulate) { TV_VROWS##R(TV_VTILE_LOAD) }                                                   \
    const int64_t half = kc / 2;                                                                     \
    const float* second = panel + half * TV_VGEMM_NR;                                                \
    _Pragma("GCC unroll 2")                                                                          \
    for (int64_t p = 0; p < half; ++p) {                                                             \
      const float* row = panel + p * TV_VGEMM_NR;                                                    \
      const float* other = second + p * TV_VGEMM_NR;                                                 \
      TV_VPREFETCH(row)                                                                              \
      TV_VPREFETCH(other)                                                                            \
      const tv_vf b0 = TV_VLOAD(row), b1 = TV_VLOAD(row + TV_VLANES);                                \
      const tv_vf d0 = TV_VLOAD(other), d1 = TV_VLOAD(other + TV_VLANES);                            \
      TV_VROWS##R(TV_VTILE2_FMA)                                                                     \
    }                                                                                                \
    for (int64_t p = 2 * half; p < kc; ++p) {                                                        \
      const float* row = panel + p * TV_VGEMM_NR;                                                    \
      const tv_vf b0 = TV_VLOAD(row), b1 = TV_VLOAD(row + TV_VLANES);                                \
      TV_VROWS##R(TV_VTILE2_TAIL)                                                                    \
    }                                                                                                \
    TV_VROWS##R(TV_VTILE2_STORE)                                                                     \
  }
#if TV_VTILE2_FITS(2)
TV_VTILE2(2)
#else
TV_VTILE(2)
#endif
#if TV_VGEMM_MR >= 3 && TV_VTILE2_FITS(3)
TV_VTILE2(3)
#elif TV_VGEMM_MR >= 3
TV_VTILE(3)
#endif
#if TV_VGEMM_MR >= 4
TV_VTILE(4)
#endif
#if TV_VGEMM_MR >= 5
TV_VTILE(5)
#endif
#if TV_VGEMM_MR >= 6
TV_VTILE(6)
#endif
#if TV_VGEMM_MR >= 7
TV_VTILE(7)
#endif
#if TV_VGEMM_MR >= 8
TV_VTILE(8)
#endif
#if TV_VGEMM_MR >= 9
TV_VTILE(9)
#endif
#if TV_VGEMM_MR >= 10
TV_VTILE(10)
#endif
#if TV_VGEMM_MR >= 11
TV_VTILE(11)
#endif
#if TV_VGEMM_MR >= 12
TV_VTILE(12)
#endif
#if TV_VGEMM_MR >= 13
TV_VTILE(13)
#endif
#if TV_VGEMM_MR >= 14
TV_VTILE(14)
#endif

/* ---- tiles for a weight that streams past once (tv_vgemm_stream*: tv_vgemm_rows with stream set) ----
   Where the panels come one after another from beyond L2 (tv_vgemm_block: few rows, a weight larger than
   L2), the tiles read each panel in memory order without software prefetch: the hardware prefetchers
   follow that one stream better. The tiles above measured slower there, over GPT-2's LM head (25.7 MB of
   8 KB panels): their prefetch hints (tiles of 4-8 rows: 1.2x the time) and the two-halves reading of 2
   and 3 rows (two streams jumping at every 4 KB page: 1.9x). Separate functions, so that the tiles above
   stay the code they are elsewhere. The 2- and 3-row tiles keep their two accumulator sets
   (TV_VTILE2_FITS) on the even and the odd steps. */
#define TV_VSTREAM(R)                                                                                \
  static void tv_vgemm_stream##R(const float* x, int64_t ldx, const float* panel, int64_t kc, float* c, \
                                 int64_t ldc, int accumulate) {                                      \
    TV_VROWS##R(TV_VTILE_ZERO)                                                                       \
    if (accumulate) { TV_VROWS##R(TV_VTILE_LOAD) }                                                   \
    _Pragma("GCC unroll 4")                                                                          \
    for (int64_t p = 0; p < kc; ++p) {                                                               \
      const float* row = panel + p * TV_VGEMM_NR;                                                    \
      const tv_vf b0 = TV_VLOAD(row), b1 = TV_VLOAD(row + TV_VLANES);                                \
      TV_VROWS##R(TV_VTILE_FMA)                                                                      \
    }                                                                                                \
    TV_VROWS##R(TV_VTILE_STORE)                                                                      \
  }
#define TV_VSTREAM2_FMA(r)                                                                         \
  {                                                                                                \
    const tv_vf a = TV_VSPLAT(x[r * ldx + p]), e = TV_VSPLAT(x[r * ldx + p + 1]);                  \
    lo##r += a * b0, hi##r += a * b1, LO##r += e * d0, HI##r += e * d1;                            \
  }
#define TV_VSTREAM2(R)                                                                               \
  static void tv_vgemm_stream##R(const float* x, int64_t ldx, const float* panel, int64_t kc, float* c, \
                                 int64_t ldc, int accumulate) {                                      \
    TV_VROWS##R(TV_VTILE2_ZERO)                                                                      \
    if (accumulate) { TV_VROWS##R(TV_VTILE_LOAD) }                                                   \
    const int64_t pairs = kc / 2 * 2;                                                                \
    _Pragma("GCC unroll 2")                                                                          \
    for (int64_t p = 0; p < pairs; p += 2) {                                                         \
      const float* row = panel + p * TV_VGEMM_NR;                                                    \
      const tv_vf b0 = TV_VLOAD(row), b1 = TV_VLOAD(row + TV_VLANES);                                \
      const tv_vf d0 = TV_VLOAD(row + TV_VGEMM_NR), d1 = TV_VLOAD(row + TV_VGEMM_NR + TV_VLANES);    \
      TV_VROWS##R(TV_VSTREAM2_FMA)                                                                   \
    }                                                                                                \
    for (int64_t p = pairs; p < kc; ++p) {                                                           \
      const float* row = panel + p * TV_VGEMM_NR;                                                    \
      const tv_vf b0 = TV_VLOAD(row), b1 = TV_VLOAD(row + TV_VLANES);                                \
      TV_VROWS##R(TV_VTILE2_TAIL)                                                                    \
    }                                                                                                \
    TV_VROWS##R(TV_VTILE2_STORE)                                                                     \
  }
/* One row (GEMV), streaming or not: four consecutive steps into 8 accumulators (two per half-row could not
   hide the FMA latency). It is the only one-row tile: the panel is read once by a one-row product in any
   case, and a tile reading the panel's two halves as two streams was slower everywhere measured (one C
   program calling both, 1 thread, medians of 400 calls): 512 x 2048 from L3 (the LSTM's) 52.1 -> 50.3 us,
   L2-resident 150 x 448 2.45 -> 2.33, 128 x 384 1.84 -> 1.70, 512 x 256 4.97 -> 4.87; the LM head at one
   row had taken 1.5x the two-row tile's time with it (two streams jumping at every 4 KB page); a software
   prefetch here measured slower too. */
static void tv_vgemm_stream1(const float* x, int64_t ldx, const float* panel, int64_t kc, float* c, int64_t ldc,
                             int accumulate) {
  (void)ldx, (void)ldc;
  tv_vf lo0 = {0}, hi0 = {0}, lo1 = {0}, hi1 = {0}, lo2 = {0}, hi2 = {0}, lo3 = {0}, hi3 = {0};
  if (accumulate) lo0 = TV_VLOAD(c), hi0 = TV_VLOAD(c + TV_VLANES);
  const int64_t body = kc / 4 * 4;
  for (int64_t p = 0; p < body; p += 4) {
    const float* b = panel + p * TV_VGEMM_NR;
    const tv_vf a0 = TV_VSPLAT(x[p]), a1 = TV_VSPLAT(x[p + 1]), a2 = TV_VSPLAT(x[p + 2]), a3 = TV_VSPLAT(x[p + 3]);
    lo0 += a0 * TV_VLOAD(b), hi0 += a0 * TV_VLOAD(b + TV_VLANES);
    lo1 += a1 * TV_VLOAD(b + TV_VGEMM_NR), hi1 += a1 * TV_VLOAD(b + TV_VGEMM_NR + TV_VLANES);
    lo2 += a2 * TV_VLOAD(b + 2 * TV_VGEMM_NR), hi2 += a2 * TV_VLOAD(b + 2 * TV_VGEMM_NR + TV_VLANES);
    lo3 += a3 * TV_VLOAD(b + 3 * TV_VGEMM_NR), hi3 += a3 * TV_VLOAD(b + 3 * TV_VGEMM_NR + TV_VLANES);
  }
  for (int64_t p = body; p < kc; ++p) {
    const tv_vf a = TV_VSPLAT(x[p]);
    lo0 += a * TV_VLOAD(panel + p * TV_VGEMM_NR), hi0 += a * TV_VLOAD(panel + p * TV_VGEMM_NR + TV_VLANES);
  }
  TV_VSTORE(c, (lo0 + lo1) + (lo2 + lo3));
  TV_VSTORE(c + TV_VLANES, (hi0 + hi1) + (hi2 + hi3));
}

#if TV_VTILE2_FITS(2)
TV_VSTREAM2(2)
#else
TV_VSTREAM(2)
#endif
#if TV_VGEMM_MR >= 3 && TV_VTILE2_FITS(3)
TV_VSTREAM2(3)
#elif TV_VGEMM_MR >= 3
TV_VSTREAM(3)
#endif
#if TV_VGEMM_MR >= 4
TV_VSTREAM(4)
#endif
#if TV_VGEMM_MR >= 5
TV_VSTREAM(5)
#endif
#if TV_VGEMM_MR >= 6
TV_VSTREAM(6)
#endif
#if TV_VGEMM_MR >= 7
TV_VSTREAM(7)
#endif
#if TV_VGEMM_MR >= 8
TV_VSTREAM(8)
#endif
#if TV_VGEMM_MR >= 9
TV_VSTREAM(9)
#endif
#if TV_VGEMM_MR >= 10
TV_VSTREAM(10)
#endif
#if TV_VGEMM_MR >= 11
TV_VSTREAM(11)
#endif
#if TV_VGEMM_MR >= 12
TV_VSTREAM(12)
#endif
#if TV_VGEMM_MR >= 13
TV_VSTREAM(13)
#endif
#if TV_VGEMM_MR >= 14
TV_VSTREAM(14)
#endif

#define TV_VCASE(R) \
  case R: (stream ? tv_vgemm_stream##R : tv_vgemm_tile##R)(x, ldx, panel, kc, target, ld, accumulate); break;
/* A tile of ``rows`` (<= MR) rows, of the streaming tiles when ``stream``; the last panel's tile (cols < NR)
   goes through a local buffer. */
static void tv_vgemm_rows(int rows, const float* x, int64_t ldx, const float* panel, int64_t kc, float* c,
                          int64_t ldc, int64_t cols, int accumulate, int stream) {
  float tile[TV_VGEMM_MR * TV_VGEMM_NR];
  float* target = c;
  int64_t ld = ldc;
  if (cols < TV_VGEMM_NR) {
    target = tile, ld = TV_VGEMM_NR;
    if (accumulate)
      for (int r = 0; r < rows; ++r) for (int64_t j = 0; j < cols; ++j) tile[r * TV_VGEMM_NR + j] = c[r * ldc + j];
  }
  switch (rows) {
    case 1: tv_vgemm_stream1(x, ldx, panel, kc, target, ld, accumulate); break;  /* (streaming or not) */
    TV_VCASE(2)
#if TV_VGEMM_MR >= 3
    TV_VCASE(3)
#endif
#if TV_VGEMM_MR >= 4
    TV_VCASE(4)
#endif
#if TV_VGEMM_MR >= 5
    TV_VCASE(5)
#endif
#if TV_VGEMM_MR >= 6
    TV_VCASE(6)
#endif
#if TV_VGEMM_MR >= 7
    TV_VCASE(7)
#endif
#if TV_VGEMM_MR >= 8
    TV_VCASE(8)
#endif
#if TV_VGEMM_MR >= 9
    TV_VCASE(9)
#endif
#if TV_VGEMM_MR >= 10
    TV_VCASE(10)
#endif
#if TV_VGEMM_MR >= 11
    TV_VCASE(11)
#endif
#if TV_VGEMM_MR >= 12
    TV_VCASE(12)
#endif
#if TV_VGEMM_MR >= 13
    TV_VCASE(13)
#endif
#if TV_VGEMM_MR >= 14
    TV_VCASE(14)
#endif
    default: break;
  }
  if (cols < TV_VGEMM_NR)
    for (int r = 0; r < rows; ++r) for (int64_t j = 0; j < cols; ++j) c[r * ldc + j] = tile[r * TV_VGEMM_NR + j];
}

/* ---- the epilogue applied where the tiles are stored (tv_vgemm_epilogue) ----
   A product's fused elementwise tail, applied to each output tile right after its last reduction block
   stores it (the tile is then in L1), instead of a second pass over the whole output: a bias per output
   column (nn.dense's) and/or per row (a 1x1 convolution's channels, its rows), then a residual (an array
   of the output's m x n shape), then an activation: the clamped affine family of the convolutions
   (TV_ACT_LO/HI/GATE and TV_VACT in tv_vec.h: relu, clip, hard-sigmoid, hard-swish) or GELU
   (TV_ACT_GELU: v Phi(v) with erf; TV_ACT_GELU_TANH: its tanh approximation). strategy.product_epilogue
   recognizes the groups. */
#define TV_ACT_GELU 8  /* (after tv_vec.h's TV_ACT_LO/HI/GATE) */
#define TV_ACT_GELU_TANH 16
typedef struct {
  const float* col_bias;  /* n floats, or NULL */
  const float* row_bias;  /* m floats, or NULL */
  const float* residual;  /* m x n (row stride n), or NULL */
  int act;                /* TV_ACT_* bits; 0: none */
  float alpha, beta, lo, hi;
} tv_vgemm_epilogue;

/* v Phi(v) lane by lane, Phi(v) = erfc(-v / sqrt 2) / 2, with erfc(a) = t P(t) exp(-a^2) for a = |v| / sqrt 2,
   t = 1 / (1 + a / 2): P is a degree-9 polynomial fitted (weighted least squares toward minimax, float64)
   to erfc(a) exp(a^2) / t on [0, 10], relative error 2e-8, 2e-7 evaluated in float32. exp(-a^2) is
   exp(-h) exp(-l) with h + l = a^2, h exact, so the tail v < 0, where
   Phi is tiny, keeps its relative accuracy (no 1 + erf cancelling): within about 1e-6 of float64 math on
   the whole line. Beyond a = 10 Phi(-|v|) is under 1e-44: a is clamped there (exp flushes to 0). NaN
   stays NaN; -inf gives NaN and +inf gives +inf, as 0.5 v (1 + erf(v / sqrt 2)) does. */
static inline void tv_vgelu_erf_f32(tv_vf* v) {  /* (in place: see TV_VSELECT) */
  const tv_vf x = *v, most = TV_VSPLAT(14.142135f);  /* (|v| / sqrt 2 = 10) */
  tv_vf u = TV_VSELECT(x < (tv_vf){0}, -x, x);
  u = TV_VSELECT(u > most, most, u);
  const tv_vf a = u * TV_VSPLAT(0.70710678118654752f);
  /* a^2 = u^2 / 2 = h + l, h exact: half the square of u's leading 12 bits (not from a, whose rounding
     would cost a^2 6e-8 of relative error in exp(-a^2); and a contracted FMA for l is not to be counted
     on: gcc shares u * u with h) */
  const tv_vf top = (tv_vf)((tv_vbits)u & 0xFFFFF000u);
  const tv_vf h = top * top * TV_VSPLAT(0.5f), l = (u - top) * (u + top) * TV_VSPLAT(0.5f);
  tv_vf e = -h;
  tv_vexp_nonpositive_f32(&e);
  /* times exp(-l), l < 0.05: its Taylor polynomial to l^4 (the next term is under 3e-9) */
  e = e * (TV_VSPLAT(1.0f) - l * (TV_VSPLAT(1.0f) - l * TV_VSPLAT(0.5f) * (TV_VSPLAT(1.0f) - l * TV_VSPLAT(1.0f / 3) *
                                                                         (TV_VSPLAT(1.0f) - l * TV_VSPLAT(0.25f)))));
  const tv_vf t = TV_VSPLAT(1.0f) / (TV_VSPLAT(1.0f) + TV_VSPLAT(0.5f) * a);
  tv_vf p = TV_VSPLAT(1.228326803e-02f);
  p = p * t + TV_VSPLAT(-1.232550674e-01f);
  p = p * t + TV_VSPLAT(4.289379842e-01f);
  p = p * t + TV_VSPLAT(-6.700466977e-01f);
  p = p * t + TV_VSPLAT(4.213036258e-01f);
  p = p * t + TV_VSPLAT(-9.833802623e-02f);
  p = p * t + TV_VSPLAT(2.255503447e-01f);
  p = p * t + TV_VSPLAT(2.386427541e-01f);
  p = p * t + TV_VSPLAT(2.828573106e-01f);
  p = p * t + TV_VSPLAT(2.820644841e-01f);
  const tv_vf q = TV_VSPLAT(0.5f) * t * p * e;  /* Phi(-|v|) */
  *v = x * TV_VSELECT(x < (tv_vf){0}, q, TV_VSPLAT(1.0f) - q);
}

/* 0.5 v (1 + tanh(u)), u = sqrt(2 / pi) (v + 0.044715 v^3), as v sigmoid(2 u) = v / (1 + exp(-2 u)), and for
   u < 0 as v e / (1 + e) with e = exp(2 u): exp of a non-positive argument either way (no overflow, the
   tail keeps its relative accuracy). NaN stays NaN; -inf gives NaN and +inf gives +inf, as the formula. */
static inline void tv_vgelu_tanh_f32(tv_vf* v) {
  const tv_vf x = *v;
  const tv_vf u = TV_VSPLAT(0.79788456080286536f) * (x + TV_VSPLAT(0.044715f) * x * x * x);
  const tv_vmask positive = u >= (tv_vf){0};
  tv_vf e = TV_VSELECT(positive, TV_VSPLAT(-2.0f) * u, TV_VSPLAT(2.0f) * u);
  tv_vexp_nonpositive_f32(&e);
  *v = x * TV_VSELECT(positive, TV_VSPLAT(1.0f), e) / (TV_VSPLAT(1.0f) + e);
}

/* The activation of e (e->act != 0) lane by lane: GELU, or s = alpha v + beta clamped to [lo, hi] (the
   bounds of its TV_ACT_LO/HI bits), times v with TV_ACT_GATE; a NaN stays NaN (a failed comparison keeps
   s: TV_VACT), as tv_conv_act1. */
static inline void tv_vgemm_activate(tv_vf* v, const tv_vgemm_epilogue* e) {
  if (e->act & TV_ACT_GELU) { tv_vgelu_erf_f32(v); return; }
  if (e->act & TV_ACT_GELU_TANH) { tv_vgelu_tanh_f32(v); return; }
  TV_VACT(*v, *e);
}

/* The epilogue on rows [i, i + rows) x columns [j, j + cols) of the output, stored at c (row stride ldc;
   the tile just written, still in L1), a vector at a time: ((v + column bias) + row bias) + residual, then
   the activation, in the order (and float32 roundings) of the group it replaces. A partial vector (the
   last panel's columns) goes through zero-padded copies. */
static void tv_vgemm_finish(const tv_vgemm_epilogue* epi, int rows, int64_t i, int64_t j, int64_t cols, int64_t n,
                            float* c, int64_t ldc) {
  const tv_vgemm_epilogue copy = *epi, *e = &copy;  /* (a copy: the stores to c could alias its floats) */
  for (int r = 0; r < rows; ++r)
    for (int64_t h = 0; h < cols; h += TV_VLANES) {
      float* d = c + r * ldc + h;
      const float* res = e->residual ? e->residual + (i + r) * n + j + h : NULL;
      const float* bias = e->col_bias ? e->col_bias + j + h : NULL;
      const int64_t width = cols - h < TV_VLANES ? cols - h : TV_VLANES;
      float vs[TV_VLANES], bs[TV_VLANES], rs[TV_VLANES];
      const float* src = d;
      if (width < TV_VLANES) {
        for (int64_t l = 0; l < TV_VLANES; ++l) {
          vs[l] = l < width ? d[l] : 0.0f;
          bs[l] = bias && l < width ? bias[l] : 0.0f;
          rs[l] = res && l < width ? res[l] : 0.0f;
        }
        src = vs, bias = bias ? bs : NULL, res = res ? rs : NULL;
      }
      tv_vf v = TV_VLOAD(src);
      if (bias) v += TV_VLOAD(bias);
      if (e->row_bias) v += TV_VSPLAT(e->row_bias[i + r]);
      if (res) v += TV_VLOAD(res);
      if (e->act) tv_vgemm_activate(&v, e);
      if (width == TV_VLANES) {
        TV_VSTORE(d, v);
      } else {
        TV_VSTORE(vs, v);
        for (int64_t l = 0; l < width; ++l) d[l] = vs[l];
      }
    }
}

#ifndef TV_VGEMM_L1_BYTES
#define TV_VGEMM_L1_BYTES 16384
#endif
#ifndef TV_VGEMM_GROUP_BYTES
#define TV_VGEMM_GROUP_BYTES 262144
#endif
/* Row tiles [i0, i1) x panels [g0, g1), reduction steps [k0, k0 + kc): each row tile meets every panel of
   the group while its x rows (MR x kc) are in L1, and writes a run of consecutive outputs in each of its
   rows (a few store streams the prefetchers follow, not one line in each of MC rows per panel). The rows
   are cut into as few tiles as MR allows, of sizes differing by at most one (128 rows: 18 tiles of 6 and
   4 of 5, not 21 of 6 and one of 2 whose 4 accumulators leave the FMA units waiting on latency). */
static void tv_vgemm_group(int64_t i0, int64_t i1, int64_t g0, int64_t g1, int64_t k0, int64_t kc, int64_t n,
                           int64_t k, const float* x, const float* packed, const tv_vgemm_epilogue* epi,
                           float* out, int stream) {
  const int finish = epi != NULL && k0 + kc >= k;  /* (the tiles' last reduction block: the epilogue follows) */
  const int64_t tiles = (i1 - i0 + TV_VGEMM_MR - 1) / TV_VGEMM_MR;
  const int64_t base = (i1 - i0) / tiles, longer = (i1 - i0) % tiles;
  for (int64_t t = 0, i = i0; t < tiles; ++t) {
    const int rows = (int)(base + (t < longer));
    for (int64_t p = g0; p < g1; ++p) {
      const int64_t cols = n - p * TV_VGEMM_NR < TV_VGEMM_NR ? n - p * TV_VGEMM_NR : TV_VGEMM_NR;
      tv_vgemm_rows(rows, x + i * k + k0, k, packed + (p * k + k0) * TV_VGEMM_NR, kc, out + i * n + p * TV_VGEMM_NR,
                    n, cols, k0 > 0, stream);
      if (finish) tv_vgemm_finish(epi, rows, i, p * TV_VGEMM_NR, cols, n, out + i * n + p * TV_VGEMM_NR, n);
    }
    i += rows;
  }
}

/* The reduction block of a product of ``rows`` rows: one row tile reads each panel once, whole panels
   then (the weight streams in order); more rows, equal blocks of at most KC steps. */
static inline int64_t tv_vgemm_kblock(int64_t rows, int64_t k) {
  const int64_t splits = (k + TV_VGEMM_KC - 1) / TV_VGEMM_KC;
  return rows <= TV_VGEMM_MR ? k : (k + splits - 1) / splits;
}
/* Whether x's ``rows`` rows and one panel of a block fit in half of L1 (TV_VGEMM_L1_BYTES): each panel read
   from memory then stays in L1 for every row tile (panel after panel: the weight streams from memory all
   the time, what a product with few rows is bound by). */
static inline int tv_vgemm_l1_panel(int64_t rows, int64_t k) {
  return (rows + TV_VGEMM_NR) * tv_vgemm_kblock(rows, k) * (int64_t)sizeof(float) <= TV_VGEMM_L1_BYTES;
}
/* The bytes of the packed weight of n x k (whole panels). */
static inline int64_t tv_vgemm_weight_bytes(int64_t n, int64_t k) {
  return (n + TV_VGEMM_NR - 1) / TV_VGEMM_NR * k * TV_VGEMM_NR * (int64_t)sizeof(float);
}
/* Whether the packed weight of n x k is larger than L2 (twice TV_VGEMM_GROUP_BYTES). */
static inline int tv_vgemm_beyond_l2(int64_t n, int64_t k) {
  return tv_vgemm_weight_bytes(n, k) > 2 * (int64_t)TV_VGEMM_GROUP_BYTES;
}
/* Whether L2 (twice TV_VGEMM_GROUP_BYTES) holds at least a quarter of the packed weight of n x k. */
static inline int tv_vgemm_l2_quarter(int64_t n, int64_t k) {
  return tv_vgemm_weight_bytes(n, k) <= 8 * (int64_t)TV_VGEMM_GROUP_BYTES;
}
/* Whether the product streams its weight: panel after panel over a weight larger than L2, read past
   once, with the streaming tiles (tv_vgemm_rows' stream). */
static inline int tv_vgemm_streams(int64_t rows, int64_t n, int64_t k) {
  return tv_vgemm_l1_panel(rows, k) && tv_vgemm_beyond_l2(n, k);
}

/* One row tile over a weight of at least TV_VGEMM_TURN_BYTES, of which L2 holds at least a quarter,
   reads it in the opposite order from one call to the next when the same weight comes again (a recurrent
   product, step after step): L2 still holds the panels read last, and they are read first. That pays for
   a weight larger than L2 (the LSTM's 4 MB), and for several smaller weights that take turns and together
   outgrow L2 (a Tree-LSTM node's four, 1.08 MB: read in order each time, the one read next was always the
   one evicted; 11.0-11.2 -> 10.6-10.7 us per node at 1 thread). (Over a weight many times L2, GPT-2's
   25.7 MB LM head, what L2 keeps is a few percent and reading backwards cost more.) The tile's sums for
   each panel are the same either way (the order of its reduction does not change), so the results are
   too. The direction is remembered per weight in a small table (TV_VGEMM_TURNS slots by a hash of the
   weight's address; two weights sharing a slot just read in order; atomics: only the speed depends on it
   when several threads call products at once). */
#ifndef TV_VGEMM_TURN_BYTES
#define TV_VGEMM_TURN_BYTES 65536
#endif
#ifndef TV_VGEMM_BACK_BYTES
#define TV_VGEMM_BACK_BYTES 65536
#endif
#define TV_VGEMM_TURNS 16
__attribute__((weak, visibility("hidden"))) const float* tv_vgemm_last_weight[TV_VGEMM_TURNS];
__attribute__((weak, visibility("hidden"))) int32_t tv_vgemm_last_reverse[TV_VGEMM_TURNS];
static inline int tv_vgemm_turn(const float* packed) {
  /* (a multiplicative hash: large weights are page aligned, so their low address bits are all alike) */
  const int slot = (int)(((uint64_t)(uintptr_t)packed * 0x9E3779B97F4A7C15ull) >> 60) % TV_VGEMM_TURNS;
  const float* last = __atomic_exchange_n(&tv_vgemm_last_weight[slot], packed, __ATOMIC_RELAXED);
  const int reverse = last == packed && !__atomic_load_n(&tv_vgemm_last_reverse[slot], __ATOMIC_RELAXED);
  __atomic_store_n(&tv_vgemm_last_reverse[slot], reverse, __ATOMIC_RELAXED);
  return reverse;
}

/* Rows [m0, m1) x panels [p0, p1) of the product. The reduction runs in equal blocks of at most KC steps
   (each block after the first reloads the output tiles). Panels go in groups whose block of weight fills
   at most half of L2: the first row tile reads a group from memory, the others from L2. ``reverse``: one
   row tile's panels last to first (tv_vgemm_turn). */
static void tv_vgemm_block(int64_t m0, int64_t m1, int64_t p0, int64_t p1, int64_t n, int64_t k, const float* x,
                           const float* packed, const tv_vgemm_epilogue* epi, float* out, int reverse) {
  const int64_t block = tv_vgemm_kblock(m1 - m0, k);
  /* Panels one at a time when one stays in L1 for every row tile (tv_vgemm_l1_panel); else groups of
     panels, each in at most half of L2 (TV_VGEMM_GROUP_BYTES). */
  const int64_t l1_panel = tv_vgemm_l1_panel(m1 - m0, k);
  const int64_t fit = TV_VGEMM_GROUP_BYTES / (block * TV_VGEMM_NR * (int64_t)sizeof(float));
  const int64_t group = l1_panel || fit < 1 ? 1 : fit;
  const int stream = tv_vgemm_streams(m1 - m0, n, k);
  if (reverse && m1 - m0 <= TV_VGEMM_MR) {
    /* One row tile, the whole reduction: the tiles of the order below. Runs of panels of about
       TV_VGEMM_BACK_BYTES go last to first, the panels of a run in memory order: panel by panel last to
       first, a weight streamed from L3 or memory lost the prefetchers at every panel (GPT-2's LM head,
       8 KB panels: 1.7x slower). */
    const int64_t run = TV_VGEMM_BACK_BYTES / (k * TV_VGEMM_NR * (int64_t)sizeof(float)) + 1;
    for (int64_t end = p1; end > p0; end -= run) {
      const int64_t start = end - run > p0 ? end - run : p0;
      tv_vgemm_group(m0, m1, start, end, 0, k, n, k, x, packed, epi, out, stream);
    }
    return;
  }
  if (m1 - m0 <= TV_VGEMM_MC) {
    /* Up to MC rows (their x stays in L2): group after group, every reduction block of a group read by
       every row tile while it is in cache, so the weight is read once from memory, in memory order (one
       sequential stream, what the prefetchers serve best). */
    for (int64_t g = p0; g < p1; g += group)
      for (int64_t k0 = 0; k0 < k; k0 += block)
        tv_vgemm_group(m0, m1, g, p1 - g < group ? p1 : g + group, k0, k - k0 < block ? k - k0 : block, n, k, x,
                       packed, epi, out, stream);
    return;
  }
  /* More rows: row blocks of MC (an x block of MC x kc stays in L2) under each reduction block. */
  for (int64_t k0 = 0; k0 < k; k0 += block)
    for (int64_t i0 = m0; i0 < m1; i0 += TV_VGEMM_MC)
      for (int64_t g = p0; g < p1; g += group)
        tv_vgemm_group(i0, m1 - i0 < TV_VGEMM_MC ? m1 : i0 + TV_VGEMM_MC, g, p1 - g < group ? p1 : g + group, k0,
                       k - k0 < block ? k - k0 : block, n, k, x, packed, epi, out, stream);
}

/* A parallel product in chunks (tv_team_run: the caller runs the chunks of workers that have not
   started): panels, or (with fewer panels than 2 per thread, and enough rows) row blocks of whole tiles,
   about TV_VGEMM_CHUNKS per thread so that a late worker leaves the caller little to wait for. */
#define TV_VGEMM_CHUNKS 4
typedef struct {
  int64_t m, n, k, panels, per, chunks;
  int rows, reverse, threads;
  const float* x;
  const float* packed;
  const tv_vgemm_epilogue* epi;
  float* out;
} tv_vgemm_job;

static void tv_vgemm_chunk(void* arg, int64_t i) {
  const tv_vgemm_job* job = (const tv_vgemm_job*)arg;
  /* (reversed: the thread whose home range this chunk is in runs its panels last to first, tv_team.h) */
  if (job->reverse) i = tv_team_mirror(i, job->chunks, job->threads);
  const int64_t count = job->rows ? job->m : job->panels;
  const int64_t lo = i * job->per < count ? i * job->per : count, hi = lo + job->per < count ? lo + job->per : count;
  if (lo >= hi) return;
  if (job->rows) tv_vgemm_block(lo, hi, 0, job->panels, job->n, job->k, job->x, job->packed, job->epi, job->out, 0);
  else tv_vgemm_block(0, job->m, lo, hi, job->n, job->k, job->x, job->packed, job->epi, job->out, job->reverse);
}

/* out (m x n) = x (m x k) W^T, W packed in panels of TV_VGEMM_NR columns (see above), then the epilogue
   epi (NULL: none) in the tiles. */
static int32_t tv_vgemm_product(int64_t m, int64_t n, int64_t k, const float* x, const float* packed,
                                const tv_vgemm_epilogue* epi, float* out) {
  if (m <= 0 || n <= 0) return 0;
  if (k <= 0) {
    for (int64_t i = 0; i < m * n; ++i) out[i] = 0;
    if (epi) for (int64_t i = 0; i < m; ++i) tv_vgemm_finish(epi, 1, i, 0, n, n, out + i * n, n);
    return 0;
  }
  const int threads = tv_gemm_parallel_rows((double)m * n * k, m) ? tv_omp_max_threads() : 1;
  const int64_t panels = (n + TV_VGEMM_NR - 1) / TV_VGEMM_NR;
  const int reverse = m <= TV_VGEMM_MR && tv_vgemm_weight_bytes(n, k) >= TV_VGEMM_TURN_BYTES && tv_vgemm_l2_quarter(n, k)
                      && tv_vgemm_turn(packed);
  if (threads <= 1) { tv_vgemm_block(0, m, 0, panels, n, k, x, packed, epi, out, reverse); return 0; }
  const int rows = !(panels >= 2 * threads || m < 2 * TV_VGEMM_MR);
  const int64_t units = rows ? (m + TV_VGEMM_MR - 1) / TV_VGEMM_MR : panels;
  const int64_t chunks = units < TV_VGEMM_CHUNKS * threads ? units : TV_VGEMM_CHUNKS * threads;
  tv_vgemm_job job = {m, n, k, panels, (units + chunks - 1) / chunks * (rows ? TV_VGEMM_MR : 1), chunks,
                      rows, reverse && !rows, threads, x, packed, epi, out};
  tv_team_run(chunks, threads, tv_vgemm_chunk, &job);
  return 0;
}

__attribute__((unused)) static int32_t tv_vgemm_packed_f32(int64_t m, int64_t n, int64_t k, const float* x,
                                                           const float* packed, float* out) {
  return tv_vgemm_product(m, n, k, x, packed, NULL, out);
}

/* The panel width this translation unit was built for. */
__attribute__((weak)) int32_t tv_vgemm_lanes(void) { return TV_VGEMM_NR; }

/* out = x W^T (then the epilogue epi, NULL: none) for W packed in panels of ``lanes`` columns: the tiles
   when ``lanes`` is the width they were built for, else (weights packed for another CPU, an executable
   moved between machines) plain loops over that layout: slow, never wrong. */
static int32_t tv_vgemm_packed_lanes_f32(int64_t m, int64_t n, int64_t k, int64_t lanes, const float* x,
                                         const float* packed, const tv_vgemm_epilogue* epi, float* out) {
  if (lanes == TV_VGEMM_NR) return tv_vgemm_product(m, n, k, x, packed, epi, out);
  if (lanes <= 0) return 1005;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const float* w = packed + (j / lanes) * k * lanes + j % lanes;
      float acc = 0.0f;
      for (int64_t p = 0; p < k; ++p) acc += x[i * k + p] * w[p * lanes];
      out[i * n + j] = acc;
    }
    if (epi) tv_vgemm_finish(epi, 1, i, 0, n, n, out + i * n, n);
  }
  return 0;
}
__attribute__((unused)) static int32_t tv_vgemm_packed_any_f32(int64_t m, int64_t n, int64_t k, int64_t lanes,
                                                               const float* x, const float* packed, float* out) {
  return tv_vgemm_packed_lanes_f32(m, n, k, lanes, x, packed, NULL, out);
}

/* The product with its epilogue, as generated kernels call it (strategy.PackedGemmCall): ``col_bias``
   (n floats) is read only when ``has_col_bias``, ``row_bias`` (m floats) only when ``has_row_bias``,
   ``residual`` (m x n) only when ``has_residual``; ``act``, ``alpha``... as tv_vgemm_epilogue's. (Named tv_gemm_*:
   c_emit.PRODUCT_CALLS then gives the calling translation unit the products.) */
__attribute__((unused)) static int32_t tv_gemm_packed_epi_f32(
    int64_t m, int64_t n, int64_t k, int64_t lanes, const float* x, const float* packed, const float* col_bias,
    int64_t has_col_bias, const float* row_bias, int64_t has_row_bias, const float* residual, int64_t has_residual,
    int64_t act, float alpha, float beta, float lo, float hi, float* out) {
  const tv_vgemm_epilogue epi = {has_col_bias ? col_bias : NULL, has_row_bias ? row_bias : NULL,
                                 has_residual ? residual : NULL, (int)act, alpha, beta, lo, hi};
  return tv_vgemm_packed_lanes_f32(m, n, k, lanes, x, packed, &epi, out);
}

#endif /* TV_VGEMM_H */
