/* The float32 direct convolution (tv_conv2d_direct_f32; NCHW data, OIHW weights, any strides, dilation and
   padding) written once for every vector ISA, in the vector extensions of tv_vgemm.h (tv_vf: TV_VLANES
   floats; the same host-derived macros instantiate both).

   It reads a zero-padded copy of the image laid out so that every kernel tap of a vector of output columns
   is one contiguous vector load, whatever the stride: each padded row is stored as SW column *phases*
   (phase p holds padded columns p, p + SW, p + 2 SW, ...; WQ of them, see tv_vconv_geometry). Output
   column j reads padded column j SW + kx DW = SW (j + kx DW / SW) + kx DW % SW, i.e. phase kx DW % SW at
   index j + kx DW / SW: consecutive j are consecutive floats. Output row y reads padded row y SH + ky DH.
   Each phase is a whole number of vectors plus the taps' reach, so tiles read without border tests.
   Included by tv_gemm.h (TV_PACKED_KERNELS), after tv_vgemm.h. */
#ifndef TV_VCONV_H
#define TV_VCONV_H
#include <sched.h>
/* The convolutions' tile rows where the register file holds more than the product's tile
   (host.gemm_params: conv_mr; the product's own rows where not given): the packed convolution's pixels and
   the direct kernel's 2-row tile's output channels. */
#ifndef TV_CONV_MR
#define TV_CONV_MR TV_VGEMM_MR
#endif
#ifndef TV_ERROR_OUT_OF_MEMORY
#define TV_ERROR_OUT_OF_MEMORY 1003 /* (as tv_lib.h and c_emit.ERROR_OUT_OF_MEMORY) */
#endif

/* The padded copy of one image: C planes of HP rows of SW x WQ floats. at[kx] is where tap kx of a vector
   of output columns starts in its row: phase kx DW % SW, index kx DW / SW (KW of them; computed once per
   call, not per step: an integer division costs as much as the tap's FMAs). */
typedef struct { int64_t hp, wq, row, plane; } tv_vconv_geometry;
static inline tv_vconv_geometry tv_vconv_geometry_of(int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh,
                                                     int64_t sw, int64_t dh, int64_t dw) {
  tv_vconv_geometry g;
  g.hp = (oh - 1) * sh + (kh - 1) * dh + 1;
  g.wq = (ow + TV_VLANES - 1) / TV_VLANES * TV_VLANES + (kw - 1) * dw / sw;
  g.row = sw * g.wq;
  g.plane = g.hp * g.row;
  return g;
}
static inline void tv_vconv_taps(int64_t kw, int64_t sw, int64_t dw, tv_vconv_geometry g, int64_t* at) {
  for (int64_t kx = 0; kx < kw; ++kx) at[kx] = kx * dw % sw * g.wq + kx * dw / sw;
}

/* The even and the odd lanes of two vectors (lo, hi), in order: a row split into its two column phases. */
typedef int32_t tv_vi __attribute__((vector_size(TV_VEC_BYTES)));
#if TV_VLANES == 4
#define TV_VEVEN_OF_TWO ((tv_vi){0, 2, 4, 6})
#define TV_VODD_OF_TWO ((tv_vi){1, 3, 5, 7})
#elif TV_VLANES == 8
#define TV_VEVEN_OF_TWO ((tv_vi){0, 2, 4, 6, 8, 10, 12, 14})
#define TV_VODD_OF_TWO ((tv_vi){1, 3, 5, 7, 9, 11, 13, 15})
#else
#define TV_VEVEN_OF_TWO ((tv_vi){0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30})
#define TV_VODD_OF_TWO ((tv_vi){1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31})
#endif

/* The first n (<= TV_VLANES) lanes of a vector stored to d, or loaded from s (the other lanes zero), touching
   no float past them (the floats after may be another thread's): a plain move when n is every lane. Else
   a store is AVX-512's k-masked move where the host has one (for 32-byte vectors too, with AVX-512VL), and
   elsewhere plain moves of halves, quarters and a float (4 + 2 of AVX2's 6 lanes): AVX2's VMASKMOVPS store
   is slow on AMD cores, even with every lane set (Zen 4, the packed convolution's 24 -> 72 1x1 layer on 28 x
   28 images at batch 8: 47 GFLOP/s through it, 75 with the k-masks; built for AVX2 alone, where its 6-pixel
   tiles store every channel partially, 37 against 62 with the split moves; benchmarks/conv_layers.py and a
   C harness). A load is the k-masked move, or AVX2's VMASKMOVPS (its load form is not the slow one), or
   lane by lane. The compiler's builtins, not <immintrin.h>: parsing that header was half the cost of
   parsing a translation unit's prelude (0.3 of 0.6 s on a Cascade Lake Xeon), paid by every unit with
   products. */
#if defined(__AVX512F__) && TV_VEC_BYTES == 64
#define TV_VMASKED 1
typedef unsigned short tv_vlane_bits;
static inline tv_vlane_bits tv_vfirst_lanes(int64_t n) { return (tv_vlane_bits)((1u << n) - 1); }
#elif defined(__AVX512VL__) && TV_VEC_BYTES == 32
#define TV_VMASKED 1
typedef unsigned char tv_vlane_bits;
static inline tv_vlane_bits tv_vfirst_lanes(int64_t n) { return (tv_vlane_bits)((1u << n) - 1); }
#elif defined(__AVX2__) && TV_VEC_BYTES == 32
#define TV_VMASKED_LOAD 1
typedef tv_vi tv_vlane_bits;
static inline tv_vlane_bits tv_vfirst_lanes(int64_t n) {
  return (tv_vi){0, 1, 2, 3, 4, 5, 6, 7} < (tv_vi){0} + (int32_t)n; /* (lanes below n: all ones) */
}
#endif
static inline void tv_vstore_first(float* d, const tv_vf* v, int64_t n) {
  if (n == TV_VLANES) {
    __builtin_memcpy(d, v, sizeof(tv_vf));
    return;
  }
#if defined(TV_VMASKED) && TV_VEC_BYTES == 64
  __builtin_ia32_storeups512_mask(d, *v, tv_vfirst_lanes(n));
#elif defined(TV_VMASKED)
  __builtin_ia32_storeups256_mask(d, *v, tv_vfirst_lanes(n));
#else
  const float* f = (const float*)v;
  int64_t i = 0;
  _Pragma("GCC unroll 8") for (int64_t w = TV_VLANES / 2; w >= 1; w /= 2)
    if (n - i >= w) {
      __builtin_memcpy(d + i, f + i, sizeof(float) * (size_t)w);
      i += w;
    }
#endif
}
static inline void tv_vload_first(tv_vf* v, const float* s, int64_t n) {
  if (n == TV_VLANES) {
    __builtin_memcpy(v, s, sizeof(tv_vf));
    return;
  }
#if defined(TV_VMASKED) && TV_VEC_BYTES == 64
  *v = __builtin_ia32_loadups512_mask(s, (tv_vf){0}, tv_vfirst_lanes(n));
#elif defined(TV_VMASKED)
  *v = __builtin_ia32_loadups256_mask(s, (tv_vf){0}, tv_vfirst_lanes(n));
#elif defined(TV_VMASKED_LOAD)
  *v = __builtin_ia32_maskloadps256((const tv_vf*)s, tv_vfirst_lanes(n));
#else
  *v = (tv_vf){0};
  for (int64_t l = 0; l < n; ++l) (*v)[l] = s[l];
#endif
}

/* The zeros of a padded copy (hp rows of wp pixels of ``lanes`` floats) around its image (``rows`` x ``cols``
   pixels from row ``top``, column ``left``): the rows above and below it and the columns left and right of
   it, not the pixels the copy writes (a memset of the whole copy per chunk was a fifth of a depthwise
   layer's time at 2 threads, and had been a second write of every pixel of the packed convolution's). */
static inline void tv_vconv_zero_frame(float* d, int64_t hp, int64_t wp, int64_t lanes, int64_t top, int64_t rows,
                                       int64_t left, int64_t cols) {
  const int64_t row = wp * lanes;
  memset(d, 0, sizeof(float) * (size_t)(top * row));
  memset(d + (top + rows) * row, 0, sizeof(float) * (size_t)((hp - top - rows) * row));
  if (left == 0 && cols == wp) return;
  for (int64_t iy = top; iy < top + rows; ++iy) {
    memset(d + iy * row, 0, sizeof(float) * (size_t)(left * lanes));
    memset(d + iy * row + (left + cols) * lanes, 0, sizeof(float) * (size_t)((wp - left - cols) * lanes));
  }
}

/* Floats of one row of the linear padded copy a stride-2 pad goes through (tv_vconv_pad): room for the
   left padding and the image row, and for the two vectors read per output vector of the phases. */
static inline int64_t tv_vconv_line(int64_t w, int64_t pl, tv_vconv_geometry g) {
  const int64_t reads = 2 * ((g.wq + TV_VLANES - 1) / TV_VLANES * TV_VLANES);
  return reads > pl + w ? reads : pl + w;
}

/* n floats zeroed, then m (<= n) of them from s copied to d + at, in whole vectors (n >= TV_VLANES; the last
   vector of each overlaps the one before): a padded row is a few vectors, and a call to memset / memcpy per
   border and per row had cost more than the row's copy. */
static inline void tv_vconv_copy(float* d, const float* s, int64_t m);
static inline void tv_vconv_fill(float* d, int64_t n, const float* s, int64_t at, int64_t m) {
  const tv_vf zero = TV_VSPLAT(0.0f);
  for (int64_t i = 0; i + TV_VLANES <= n; i += TV_VLANES) TV_VSTORE(d + i, zero);
  TV_VSTORE(d + n - TV_VLANES, zero);
  tv_vconv_copy(d + at, s, m);
}
/* m floats from s to d in whole vectors (the last overlapping the one before), or one by one when m is
   less than a vector */
static inline void tv_vconv_copy(float* d, const float* s, int64_t m) {
  if (m < TV_VLANES) {
    for (int64_t i = 0; i < m; ++i) d[i] = s[i];
    return;
  }
  for (int64_t i = 0; i + TV_VLANES <= m; i += TV_VLANES) TV_VSTORE(d + i, TV_VLOAD(s + i));
  TV_VSTORE(d + m - TV_VLANES, TV_VLOAD(s + m - TV_VLANES));
}

/* One image row (w floats from src, pl zeros before it) split straight into its two column phases d0 and d1
   (wq floats each): pairs of vectors loaded from the row where both lie inside it (the even and the odd
   lanes; the last pair overlaps the one before), float by float at the borders (pl / 2 + 1 and a few
   more at the right). Nothing it reads was just written (no store to load forwarding), and no linear
   zero-padded copy of the row goes through L2 first: on a stem (3 x 224 x 224) that copy and its second
   read had been half of the padding's time. */
static inline void tv_vconv_split2(float* d0, float* d1, const float* src, int64_t w, int64_t pl, int64_t wq) {
  const int64_t qa = (pl + 1) / 2; /* first index whose pair starts inside the row (2 q - pl >= 0) */
  int64_t qz = (w + pl) / 2 - TV_VLANES; /* last one whose pair ends inside it */
  qz = qz < wq - TV_VLANES ? qz : wq - TV_VLANES;
  int64_t q = 0;
  if (qz >= qa) {
    for (; q < qa; ++q) {
      const int64_t k = 2 * q - pl;
      d0[q] = k >= 0 ? src[k] : 0.0f, d1[q] = k + 1 >= 0 ? src[k + 1] : 0.0f;
    }
    for (;; q += TV_VLANES) {
      if (q > qz) q = qz;
      const tv_vf lo = TV_VLOAD(src + 2 * q - pl), hi = TV_VLOAD(src + 2 * q - pl + TV_VLANES);
      TV_VSTORE(d0 + q, __builtin_shuffle(lo, hi, TV_VEVEN_OF_TWO));
      TV_VSTORE(d1 + q, __builtin_shuffle(lo, hi, TV_VODD_OF_TWO));
      if (q == qz) break;
    }
    q = qz + TV_VLANES;
  }
  for (; q < wq; ++q) {
    const int64_t k = 2 * q - pl;
    d0[q] = k >= 0 && k < w ? src[k] : 0.0f, d1[q] = k + 1 >= 0 && k + 1 < w ? src[k + 1] : 0.0f;
  }
}

/* Channels [c0, c1) of the image x (C x H x W) into their padded, phase-split planes (see above): per
   phase, zeros, the image's columns, zeros. With column stride 2 (``line``: h x tv_vconv_line floats, else
   unused) a channel's rows are first copied whole into zero-padded linear rows, then split into their two
   phases a pair of vectors at a time (even and odd lanes): a gather per float had been most of a strided
   depthwise convolution's time, and splitting at the image's borders straight from the row (a partial
   copy, then a vector load of it) stalled on store forwarding. The linear rows' zero borders are the same
   for every channel: they are written once, where ``line_ready`` is 0 (the first call on that buffer),
   and later channels only copy their rows (zeroing every row had been a third of the copy's time). So
   are the padded planes' rows above and below the image, when ``line_ready`` says an earlier call filled
   this ``padded`` with the same geometry (the depthwise kernel's plane per chunk, the direct kernel's
   planes per image). With ``line`` NULL (the direct kernel) each row is split straight from the image
   instead (tv_vconv_split2). */
/* Only the padded rows [r0, r1) of each channel (and the linear rows they read): disjoint row ranges can be
   padded at once (the direct kernel's tiles pad the rows they read: tv_vconv_need_rows). */
static void tv_vconv_pad_rows(const float* x, int64_t c0, int64_t c1, int64_t h, int64_t w, int64_t sw, int64_t pt,
                              int64_t pl, tv_vconv_geometry g, float* line, int line_ready, float* padded,
                              int64_t r0, int64_t r1) {
  const int64_t lw = sw == 2 ? tv_vconv_line(w, pl, g) : 0;
  const int64_t y0 = r0 - pt > 0 ? r0 - pt : 0, y1 = r1 - pt < h ? r1 - pt : h;
  for (int64_t ci = c0; ci < c1; ++ci) {
    if (sw == 2 && line == NULL) { /* (the direct kernel: the rows split straight from the image) */
    } else if (sw == 2 && (line_ready || ci > c0))
      for (int64_t iy = y0; iy < y1; ++iy) tv_vconv_copy(line + iy * lw + pl, x + (ci * h + iy) * w, w);
    else if (sw == 2)
      for (int64_t iy = y0; iy < y1; ++iy) tv_vconv_fill(line + iy * lw, lw, x + (ci * h + iy) * w, pl, w);
    for (int64_t r = r0; r < r1; ++r) {
      float* d = padded + ci * g.plane + r * g.row;
      const int64_t iy = r - pt;
      if (iy < 0 || iy >= h) {  /* (a zero row: the earlier call on this buffer left it) */
        if (!line_ready) memset(d, 0, (size_t)g.row * sizeof(float));
        continue;
      }
      const float* src = x + (ci * h + iy) * w;
      if (sw == 1) {  /* one phase: the row copied whole, the border cleared around it */
        const int64_t left = pl < g.wq ? pl : g.wq, cols = w < g.wq - left ? w : g.wq - left;
        tv_vconv_fill(d, g.wq, src, left, cols > 0 ? cols : 0);
        continue;
      }
      if (sw == 2 && line == NULL) {
        tv_vconv_split2(d, d + g.wq, src, w, pl, g.wq);
        continue;
      }
      if (sw == 2) {  /* (the last pair of vectors overlaps the one before: wq >= TV_VLANES) */
        const float* l = line + iy * lw;
        float* d1 = d + g.wq;
        for (int64_t q = 0; q < g.wq; q += TV_VLANES) {
          if (q + TV_VLANES > g.wq) q = g.wq - TV_VLANES;
          const tv_vf lo = TV_VLOAD(l + 2 * q), hi = TV_VLOAD(l + 2 * q + TV_VLANES);
          TV_VSTORE(d + q, __builtin_shuffle(lo, hi, TV_VEVEN_OF_TWO));
          TV_VSTORE(d1 + q, __builtin_shuffle(lo, hi, TV_VODD_OF_TWO));
        }
        continue;
      }
      for (int64_t p = 0; p < sw; ++p, d += g.wq) {
        /* phase p, index q reads column q SW + p - PL: inside the image for q in [lo, hi) */
        int64_t lo = pl - p > 0 ? (pl - p + sw - 1) / sw : 0, hi = (w + pl - p + sw - 1) / sw;
        hi = hi < g.wq ? hi : g.wq, lo = lo < hi ? lo : hi;
        for (int64_t q = 0; q < lo; ++q) d[q] = 0.0f;
        const float* s0 = src + lo * sw + p - pl;
        for (int64_t q = lo; q < hi; ++q) d[q] = s0[(q - lo) * sw];
        for (int64_t q = hi; q < g.wq; ++q) d[q] = 0.0f;
      }
    }
  }
}
static void tv_vconv_pad(const float* x, int64_t c0, int64_t c1, int64_t h, int64_t w, int64_t sw, int64_t pt,
                         int64_t pl, tv_vconv_geometry g, float* line, int line_ready, float* padded) {
  tv_vconv_pad_rows(x, c0, c1, h, w, sw, pt, pl, g, line, line_ready, padded, 0, g.hp);
}

/* What the direct convolution applies to its tiles in registers before the store: a per-channel bias
   (starts the accumulators), a clamp at 0 (TV_VRELU), and a 2x2 stride-2 max pool (each tile of 2 rows x TV_VLANES
   columns stores 1 row x TV_VLANES / 2; the output is then C x OH/2 x OW/2, an odd last row or column
   dropped as max_pool2d does without ceil mode). Max pooling commutes with the bias and the clamp.
   Without a pool (and then instead of ``relu``), also a residual (an array of the output's shape, added
   after the bias) and an activation after it: s = alpha v + beta, clamped below at lo (TV_ACT_LO) and above
   at hi (TV_ACT_HI), times v itself with TV_ACT_GATE (relu, relu6 and clip, hard-sigmoid, hard-swish; see
   strategy.tile_epilogue; TV_VACT in tv_vec.h is the vector form). A NaN stays NaN, as NumPy's maximum
   and minimum keep it. */
typedef struct {
  const float* bias;
  int relu, pool;
  int act;  /* TV_ACT_* bits; 0: no activation */
  float alpha, beta, lo, hi;
  const float* residual;  /* NULL, or the output's shape (of the image the call is at) */
} tv_conv_epilogue;
static inline float tv_conv_act1(float v, const tv_conv_epilogue* e) {
  if (!e->act) return v;
  float s = v * e->alpha + e->beta;
  if ((e->act & TV_ACT_LO) && s < e->lo) s = e->lo;
  if ((e->act & TV_ACT_HI) && s > e->hi) s = e->hi;
  return e->act & TV_ACT_GATE ? v * s : s;
}

/* The epilogue of one-pixel images over their n x o floats in place: bias, relu, residual, activation
   (as the tiles apply them). */
static void tv_conv_finish_pixels(int64_t n, int64_t o, const float* bias, int64_t has_bias, int64_t relu, int64_t act,
                                  float alpha, float beta, float lo, float hi, const float* residual,
                                  int64_t has_residual, float* out) {
  const tv_conv_epilogue e = {NULL, relu != 0, 0, (int)act, alpha, beta, lo, hi, NULL};
  for (int64_t i = 0; i < n * o; ++i) {
    float v = out[i] + (has_bias ? bias[i % o] : 0.0f);
    if (e.relu) v = v <= 0.0f ? 0.0f : v;  /* (NaN stays: TV_VRELU) */
    if (has_residual) v += residual[i];
    out[i] = tv_conv_act1(v, &e);
  }
}

/* v = max(v, 0) lane by lane as NumPy's maximum: NaN stays NaN, -0 gives +0. The mask is "not v <= 0" (an
   unordered comparison is false, so a NaN lane is kept), where "v > 0" had zeroed NaN; the same compare
   and one logical operation either way. A macro: a function returning a vector wider than the target's
   would change the ABI (-Wpsabi) */
#define TV_VRELU(v) (v) = (tv_vf)((tv_vi)(v) & ~((v) <= (tv_vf){0}))
/* max(a, b) of two floats as NumPy's maximum: a NaN in either wins (a > b alone returns b for a NaN a) */
static inline float tv_vconv_max1(float a, float b) { return a > b || a != a ? a : b; }

/* The direct convolution's tile: OC output channels x 2 rows x one vector of columns, 2 OC accumulators in
   registers (named per channel by TV_VROWS<OC>, see tv_vgemm.h) over (c, ky, kx): 2 input vectors and OC
   weight broadcasts feed 2 OC FMAs. OC is TV_CONV_MR (the rule of host.gemm_params: 2 OC accumulators + 2
   inputs + 1 broadcast fit the register file: 6 on AVX2, 14 on AVX-512, 8 on the 32-byte instance of an
   AVX-512 host; 8 there made the small CNN's pooled layers 3-10% faster than 6) or 4 for the tails. A channel
   past the end repeats the last one and a missing row the last row (neither stored); a partial column block
   goes through a small buffer. */
#define TV_VCONV_ACC(i) tv_vf a##i##0 = TV_VSPLAT(start[i]), a##i##1 = a##i##0;
#define TV_VCONV_FMA(i) { const tv_vf wv = TV_VSPLAT(wt[i][t]); a##i##0 += wv * v0; a##i##1 += wv * v1; }
#define TV_VCONV_RELU(i) TV_VRELU(a##i##0); TV_VRELU(a##i##1);
#define TV_VCONV_RESIDUAL(i) a##i##0 += TV_VLOAD(epi.residual + ((o0 + i) * oh + y0) * ow + x0);         \
                             a##i##1 += TV_VLOAD(epi.residual + ((o0 + i) * oh + y0 + 1) * ow + x0);
#define TV_VCONV_ACT(i) TV_VACT(a##i##0, epi) TV_VACT(a##i##1, epi)
#define TV_VCONV_KEEP(i) TV_VSTORE(tile[i][0], a##i##0); TV_VSTORE(tile[i][1], a##i##1);
#define TV_VCONV_STORE(i) TV_VSTORE(out + ((o0 + i) * oh + y0) * ow + x0, a##i##0);                      \
                          TV_VSTORE(out + ((o0 + i) * oh + y0 + 1) * ow + x0, a##i##1);
/* The reduction over the C KH KW taps as one flat loop: tap t reads its two input vectors at off[t] from
   the output rows' start in the padded image (tv_vconv_offsets) and one weight of each of the OC channels.
   A loop per channel and kernel row had run a few taps each (3 for a 3x3 kernel), and its overhead, not
   the FMAs, had been most of a first layer's time. */
#define TV_VCONV_SUM(OC)                                                                             \
    const float* wt[OC];                                                                             \
    for (int i = 0; i < OC; ++i) wt[i] = weights + (o0 + i < o ? o0 + i : o - 1) * taps;             \
    const float* r0 = padded + y0 * sh * g.row + x0;                                                 \
    const float* r1 = padded + y1 * sh * g.row + x0;                                                 \
    _Pragma("GCC unroll 4")                                                                          \
    for (int64_t t = 0; t < taps; ++t) {                                                             \
      const tv_vf v0 = TV_VLOAD(r0 + off[t]), v1 = TV_VLOAD(r1 + off[t]);                            \
      TV_VROWS##OC(TV_VCONV_FMA)                                                                     \
    }
/* 2x2 max pool of a whole tile in registers: the rows' maximum, each lane's with its pair's, the even
   lanes gathered into the first half, half a vector stored. max(a, b) as tv_vconv_max1: a where a > b or
   a is NaN, else b (NaN when b is); "a > b" alone (the AVX max_ps rule) drops a NaN a. One compare and one
   OR more per pool of 4 outputs, next to C KH KW FMAs for each of them. */
#define TV_VMAX(a, b) ((tv_vf)(((tv_vi)(a) & (((a) > (b)) | ((a) != (a)))) | ((tv_vi)(b) & ~(((a) > (b)) | ((a) != (a))))))
#if TV_VLANES == 4
#define TV_VPAIRS ((tv_vi){1, 0, 3, 2})
#define TV_VEVENS ((tv_vi){0, 2, 0, 2})
#elif TV_VLANES == 8
#define TV_VPAIRS ((tv_vi){1, 0, 3, 2, 5, 4, 7, 6})
#define TV_VEVENS ((tv_vi){0, 2, 4, 6, 0, 2, 4, 6})
#else
#define TV_VPAIRS ((tv_vi){1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14})
#define TV_VEVENS ((tv_vi){0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14})
#endif
#define TV_VCONV_STORE_POOL(i) {                                                                     \
    const tv_vf rows = TV_VMAX(a##i##0, a##i##1);                                                    \
    const tv_vf pairs = TV_VMAX(rows, __builtin_shuffle(rows, TV_VPAIRS));                           \
    const tv_vf evens = __builtin_shuffle(pairs, TV_VEVENS);                                          \
    memcpy(out + ((o0 + i) * ph + y0 / 2) * pw + x0 / 2, &evens, sizeof(float) * (TV_VLANES / 2)); }
/* A tap's offset in its row: kx at unit column stride and dilation (the depthwise kernel's copy for them:
   a table lookup per step made its layers 15% slower), else at[kx] (tv_vconv_taps). */
#define TV_VCONV_AT_UNIT(kx) (kx)
#define TV_VCONV_AT_TABLE(kx) (at[kx])
#define TV_VCONV_TILE(OC)                                                                            \
  static void tv_vconv_tile##OC(const float* padded, tv_vconv_geometry g, int64_t sh, const int64_t* off,     \
                                int64_t taps, const float* weights, int64_t o, int64_t oh, int64_t ow, \
                                int64_t o0, int64_t y0, int64_t x0, tv_conv_epilogue epi, float* out) { \
    float start[OC];                                                                                 \
    for (int i = 0; i < OC; ++i) start[i] = epi.bias ? epi.bias[o0 + i < o ? o0 + i : o - 1] : 0.0f; \
    const int64_t y1 = y0 + 1 < oh ? y0 + 1 : y0;                                                    \
    TV_VROWS##OC(TV_VCONV_ACC)                                                                       \
    TV_VCONV_SUM(OC)                                                                                 \
    if (epi.relu) { TV_VROWS##OC(TV_VCONV_RELU) }                                                    \
    if (o0 + OC <= o && y0 + 1 < oh && x0 + TV_VLANES <= ow) { /* a whole tile: straight to the output */ \
      if (epi.residual) { TV_VROWS##OC(TV_VCONV_RESIDUAL) }                                          \
      if (epi.act) { TV_VROWS##OC(TV_VCONV_ACT) }                                                    \
      if (epi.pool) {                                                                                \
        const int64_t ph = oh / 2, pw = ow / 2;                                                      \
        TV_VROWS##OC(TV_VCONV_STORE_POOL)                                                            \
      } else {                                                                                       \
        TV_VROWS##OC(TV_VCONV_STORE)                                                                 \
      }                                                                                              \
      return;                                                                                        \
    }                                                                                                \
    float tile[OC][2][TV_VLANES];                                                                    \
    TV_VROWS##OC(TV_VCONV_KEEP)                                                                      \
    tv_vconv_store(&tile[0][0][0], OC, 2, o, oh, ow, o0, y0, x0, &epi, out);                         \
  }

/* A tile kept in tile[channel][row][lane] (``rows`` rows) to the output: the rows and columns inside it (with
   the epilogue's residual and activation), or (pool, 2 rows) the 2x2 maxima of its row pair (the driver
   visits only whole row pairs then). */
static void tv_vconv_store(const float* tile, int channels, int rows, int64_t o, int64_t oh, int64_t ow, int64_t o0,
                           int64_t y0, int64_t x0, const tv_conv_epilogue* epi, float* out) {
  const int pool = epi->pool;
  const int64_t cols = ow - x0 < TV_VLANES ? ow - x0 : TV_VLANES, ph = oh / 2, pw = ow / 2;
  for (int i = 0; i < channels && o0 + i < o; ++i) {
    const float* t0 = tile + (rows * i) * TV_VLANES;
    const float* t1 = t0 + TV_VLANES;
    if (pool) {
      float* d = out + ((o0 + i) * ph + y0 / 2) * pw + x0 / 2;
      for (int64_t j = 0; j < cols / 2; ++j) {
        d[j] = tv_vconv_max1(tv_vconv_max1(t0[2 * j], t0[2 * j + 1]), tv_vconv_max1(t1[2 * j], t1[2 * j + 1]));
      }
      continue;
    }
    for (int r = 0; r < rows && y0 + r < oh; ++r) {
      const int64_t at = ((o0 + i) * oh + y0 + r) * ow + x0;
      for (int64_t j = 0; j < cols; ++j) {
        float v = t0[r * TV_VLANES + j];
        if (epi->residual) v += epi->residual[at + j];
        out[at + j] = tv_conv_act1(v, epi);
      }
    }
  }
}

/* (through these, TV_VGEMM_MR is expanded to its number before it is pasted into a name) */
#define TV_VCONV_TILE_OF(OC) TV_VCONV_TILE(OC)
#define TV_VCONV_NAME(OC) TV_VCONV_NAME_(OC)
#define TV_VCONV_NAME_(OC) tv_vconv_tile##OC
TV_VCONV_TILE(4)
#if TV_CONV_MR > 4
TV_VCONV_TILE_OF(TV_CONV_MR)
#endif

/* Output channels in blocks of ``wide`` and of 4: the split of o that stores the fewest repeated channels
   (the most blocks of ``wide`` among equals). */
static void tv_vconv_blocks_of(int64_t o, int64_t wide, int64_t* big, int64_t* fours) {
  int64_t best_waste = -1;
  *big = 0, *fours = (o + 3) / 4;
  for (int64_t f = 0; f < wide && 4 * f <= o + 3; ++f) {
    const int64_t rest = o - 4 * f > 0 ? o - 4 * f : 0;
    const int64_t q = wide > 4 ? (rest + wide - 1) / wide : 0;
    if (wide <= 4 && rest > 0) continue;
    const int64_t waste = q * wide + 4 * f - o;
    if (best_waste < 0 || waste < best_waste) best_waste = waste, *big = q, *fours = f;
  }
}
/* Output channels in blocks of MR and of 4 (32 = 4 x 6 + 2 x 4 on AVX2). */
static void tv_vconv_blocks(int64_t o, int64_t* big, int64_t* fours) { tv_vconv_blocks_of(o, TV_VGEMM_MR, big, fours); }

/* The tiles of the direct and depthwise kernels run as about TV_VCONV_CHUNKS chunks per thread through
   tv_team_run (tv_team.h: the caller runs the chunks of workers that have not started, so a busy core no
   longer holds a convolution at an OpenMP barrier). A chunk is a contiguous run of tiles (of planes for
   the depthwise kernel); each output float is written by one tile, computed the same way whichever thread
   runs it, so the result does not depend on the thread count. */
#define TV_VCONV_CHUNKS 4
static inline int64_t tv_vconv_chunks(int64_t units, int threads) {
  if (threads <= 1) return units < 1 ? units : 1;
  return units < (int64_t)TV_VCONV_CHUNKS * threads ? units : (int64_t)TV_VCONV_CHUNKS * threads;
}

/* One job per image pads the image's rows as its tiles need them and (the tall tile) packs each block's
   weights, instead of a copy job, then a tile job: each padded row (all channels) and each block is made
   once, by the first chunk that needs it (tv_vconv_claim), and waited for by the others. A separate copy
   job had cost a second fork and join per image and, split over 2 threads, took longer than on the
   caller alone (1-2 us of copy in 8 chunks: 2.9-6.3 us, the worker's cache lines and the join's wait),
   and the tall tile's serial repack (64 x 288 weights: 7 us) had left the worker idle. */
typedef struct {
  const float* padded;
  const float* weights;
  const int64_t* off;
  float* image;
  tv_conv_epilogue epi;
  tv_vconv_geometry g;
  int64_t taps, o, oh, ow, sh, big, oblocks, xblocks, tiles, chunks;
  int columns_first;
  /* what the chunks make on demand: rows of ``padded`` from the image x (tv_vconv_pad_rows' arguments),
     and (``raw`` not NULL) each block's weights from raw into weights (tv_vconv_tall_pack_block) */
  const float* x;
  const float* raw;
  int32_t* rows_state;   /* per unit of padded rows (TV_VCONV_STATE apart): 0 to make, 1 being made, 2 made */
  int32_t* block_state;  /* per block of output channels, alike */
  int64_t c, h, w, sw, pt, pl, kh, dh, rows, unit;
  int rows_ready;        /* (the rows above and below the image are zeros already: an earlier image's) */
} tv_vconv_job;

/* Whether the caller is to make the unit whose state is *state (it was 0; it is now 1): else the unit is
   made, or another chunk was making it and this one waited. A chunk holds a claim only while it makes the
   unit (it waits for nothing then), so no two chunks wait on each other. */
static inline int tv_vconv_claim(int32_t* state) {
  int32_t seen = __atomic_load_n(state, __ATOMIC_ACQUIRE);
  if (seen == 2) return 0;
  if (seen == 0 && __atomic_compare_exchange_n(state, &seen, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return 1;
  for (int spins = 0; __atomic_load_n(state, __ATOMIC_ACQUIRE) != 2; ++spins) {
#ifdef TV_TEAM_H
    if (spins < 4096) { tv_team_relax(); continue; }
#endif
    sched_yield();
  }
  return 0;
}
static inline void tv_vconv_made(int32_t* state) { __atomic_store_n(state, 2, __ATOMIC_RELEASE); }
#define TV_VCONV_STATE 16 /* (int32s from one state to the next: a cache line each) */

/* Padded rows [r0, r1) of the job's image, in units of ``unit`` rows (a band's advance: about one claim
   per band; a claim per row had made an RGB layer 3% slower at 1 thread), each unit made here unless made
   or being made by another chunk. Returns where the last unit ends. */
static int64_t tv_vconv_need_rows(const tv_vconv_job* j, int64_t r0, int64_t r1) {
  const int64_t u0 = r0 / j->unit, u1 = (r1 + j->unit - 1) / j->unit;
  const int64_t end = u1 * j->unit < j->g.hp ? u1 * j->unit : j->g.hp;
  for (int64_t u = u0; u < u1; ++u)
    if (tv_vconv_claim(j->rows_state + u * TV_VCONV_STATE)) {
      const int64_t e = (u + 1) * j->unit < j->g.hp ? (u + 1) * j->unit : j->g.hp;
      tv_vconv_pad_rows(j->x, 0, j->c, j->h, j->w, j->sw, j->pt, j->pl, j->g, NULL, j->rows_ready,
                        (float*)j->padded, u * j->unit, e);
      tv_vconv_made(j->rows_state + u * TV_VCONV_STATE);
    }
  return end;
}

/* The padded rows the tiles [lo, hi) of a chunk read, made (or waited for) as its tiles reach them: the
   tiles go by bands of output rows (``rows`` each, a pool's 2), so the rows needed only move down;
   checked once per band (``band``: the last one seen). */
#define TV_VCONV_NEED_ROWS(j, yb, band, made_to)                                                     \
  if ((yb) != (band)) { /* (a new band of output rows) */                                            \
    (band) = (yb);                                                                                   \
    const int64_t last_ = (yb) * (j)->rows + (j)->rows - 1 < (j)->oh ? (yb) * (j)->rows + (j)->rows - 1 \
                                                                     : (j)->oh - 1;                 \
    const int64_t need_ = last_ * (j)->sh + ((j)->kh - 1) * (j)->dh + 1;                             \
    if (need_ > (made_to)) {                                                                         \
      const int64_t first_ = (yb) * (j)->rows * (j)->sh;                                             \
      (made_to) = tv_vconv_need_rows((j), (made_to) > first_ ? (made_to) : first_, need_);           \
    }                                                                                                \
  }

/* Tile t of a direct job as (band of output rows, block of output channels, block of columns) and the
   block's first channel: blocks of ``width`` channels (the tile's), then of 4 (j->big of the former). */
static inline int64_t tv_vconv_tile_at(const tv_vconv_job* j, int64_t t, int64_t width, int64_t* yb, int64_t* ob,
                                       int64_t* xb) {
  const int64_t inner = j->columns_first ? j->xblocks : j->oblocks;
  *yb = t / (j->oblocks * j->xblocks);
  *ob = j->columns_first ? t / inner % j->oblocks : t % inner;
  *xb = j->columns_first ? t % inner : t / inner % j->xblocks;
  return *ob < j->big ? *ob * width : j->big * width + (*ob - j->big) * 4;
}

static void tv_vconv_chunk(void* arg, int64_t i) {
  const tv_vconv_job* j = (const tv_vconv_job*)arg;
  const int64_t mr = TV_CONV_MR > 4 ? TV_CONV_MR : 4;
  const int64_t lo = i * j->tiles / j->chunks, hi = (i + 1) * j->tiles / j->chunks;
  int64_t made_to = 0, band = -1;
  for (int64_t t = lo; t < hi; ++t) {
    int64_t yb, ob, xb;
    const int64_t o0 = tv_vconv_tile_at(j, t, mr, &yb, &ob, &xb);
    TV_VCONV_NEED_ROWS(j, yb, band, made_to)
#if TV_CONV_MR > 4
    if (ob < j->big) {
      TV_VCONV_NAME(TV_CONV_MR)(j->padded, j->g, j->sh, j->off, j->taps, j->weights, j->o, j->oh, j->ow, o0, yb * 2,
                                 xb * TV_VLANES, j->epi, j->image);
      continue;
    }
#endif
    tv_vconv_tile4(j->padded, j->g, j->sh, j->off, j->taps, j->weights, j->o, j->oh, j->ow, o0, yb * 2, xb * TV_VLANES,
                   j->epi, j->image);
  }
}

/* ---- the tall tile (tv_vconv_tall*): every direct convolution without a pool ----
   An RGB stem (3 x 3 x 3 = 27 taps per output) has a short reduction, so what the 2-row tile pays once per
   tile (the biases and OC weight pointers, the taps' loop that does not divide by its unroll, the
   epilogue's tests per vector) had been 40% of its time on MobileNetV3's stem (perf, 1 thread). Where the
   compiler has 32 vector registers (TV_VREGISTERS: AVX-512, NEON), the tile is OC =
   TV_VCONV_TALL_OC channels x TV_VCONV_TALL_ROWS output rows x one vector: per tap ROWS input loads and OC
   weight broadcasts feed OC x ROWS FMAs (8 x 3: 11 loads per 24 FMAs, against 8 per 12), and its setup and
   loop tail are paid once per 24 vectors (16 registers: 6 x 2, the 2-row tile's shape). The weights are
   repacked per call block by block, tap-major (the OC weights of a tap side by side: one pointer instead
   of OC), and a whole tile's epilogue runs without a test per vector (tv_vconv_tall_put). Tails of the
   channels run a 4-channel tile; a channel past the end repeats the last one and a row past the end the
   last row (neither stored); a partial column block goes through tv_vconv_store. Same padded,
   phase-split image and tap offsets as the 2-row tile, so any kernel size, stride, dilation and padding.
   The 2-row tile (TV_VCONV_TILE) is left to the 2x2 max pool epilogue (a pool needs row pairs). */
#ifndef TV_VCONV_TALL_ROWS
#if TV_VREGISTERS >= 32 /* (tv_vec.h: the register file gcc compiles for, in vectors of this width) */
#define TV_VCONV_TALL_ROWS 3
#define TV_VCONV_TALL_OC 8  /* (3 x 8 accumulators + 3 inputs + 1 broadcast = 28 registers) */
#else
#define TV_VCONV_TALL_ROWS 2
#define TV_VCONV_TALL_OC 6  /* (the 2-row tile's shape: 12 + 2 + 1) */
#endif
#endif
/* A whole tall tile (``acc``: channels x rows vectors, kept in memory) through the residual (``res`` at the
   tile's first float, NULL for none) and the activation to d (the same place in the output): branch-free
   per vector, a missing clamp being one at -inf or +inf (a NaN still passes: both compares are false) and
   the gate a select between v and 1 made once. TV_VACT's tests per vector, its constants broadcast again
   each time, had been a quarter of the tile's time on a 27-tap stem with hard-swish. Out of line: the
   tile's registers are stored once for it. */
static void tv_vconv_tall_put(const tv_vf* acc, int channels, int rows, const tv_conv_epilogue* e, const float* res,
                              int64_t plane, int64_t ow, float* d) {
  const tv_vf alpha = TV_VSPLAT(e->alpha), beta = TV_VSPLAT(e->beta), one = TV_VSPLAT(1.0f);
  const tv_vf lo = TV_VSPLAT(e->act & TV_ACT_LO ? e->lo : -__builtin_inff());
  const tv_vf hi = TV_VSPLAT(e->act & TV_ACT_HI ? e->hi : __builtin_inff());
  const tv_vmask gate = e->act & TV_ACT_GATE ? one == one : one != one;  /* (all lanes set, or none) */
  const int act = e->act != 0;
  for (int i = 0; i < channels; ++i, d += plane, res = res ? res + plane : NULL)
    for (int k = 0; k < rows; ++k) {
      tv_vf v = acc[i * rows + k];
      if (res) v += TV_VLOAD(res + k * ow);
      if (act) {
        tv_vf s = v * alpha + beta;
        s = TV_VSELECT(s < lo, lo, s);
        s = TV_VSELECT(s > hi, hi, s);
        v = s * TV_VSELECT(gate, v, one);
      }
      TV_VSTORE(d + k * ow, v);
    }
}

#define TV_VCONV_TALL(OC, R)                                                                         \
  static void tv_vconv_tall##OC(const float* padded, tv_vconv_geometry g, int64_t sh, const int64_t* off,     \
                                int64_t taps, const float* wp, int64_t o, int64_t oh, int64_t ow,     \
                                int64_t o0, int64_t y0, int64_t x0, const tv_conv_epilogue* epi,      \
                                float* out) {                                                        \
    const tv_conv_epilogue e = *epi; /* (a copy: the stores to out could alias its floats) */        \
    tv_vf a[OC][R];                                                                                  \
    const float* r[R];                                                                               \
    _Pragma("GCC unroll 16") for (int i = 0; i < (OC); ++i) {                                        \
      const tv_vf b = TV_VSPLAT(e.bias ? e.bias[o0 + i < o ? o0 + i : o - 1] : 0.0f);                \
      _Pragma("GCC unroll 8") for (int k = 0; k < (R); ++k) a[i][k] = b;                             \
    }                                                                                                \
    _Pragma("GCC unroll 8") for (int k = 0; k < (R); ++k)                                            \
      r[k] = padded + (y0 + k < oh ? y0 + k : oh - 1) * sh * g.row + x0;                             \
    _Pragma("GCC unroll 2") for (int64_t t = 0; t < taps; ++t, wp += (OC)) {                         \
      tv_vf v[R];                                                                                    \
      _Pragma("GCC unroll 8") for (int k = 0; k < (R); ++k) v[k] = TV_VLOAD(r[k] + off[t]);          \
      _Pragma("GCC unroll 16") for (int i = 0; i < (OC); ++i) {                                      \
        const tv_vf wv = TV_VSPLAT(wp[i]);                                                           \
        _Pragma("GCC unroll 8") for (int k = 0; k < (R); ++k) a[i][k] += wv * v[k];                  \
      }                                                                                              \
    }                                                                                                \
    if (e.relu) {                                                                                    \
      _Pragma("GCC unroll 16") for (int i = 0; i < (OC); ++i)                                        \
        _Pragma("GCC unroll 8") for (int k = 0; k < (R); ++k) TV_VRELU(a[i][k]);                     \
    }                                                                                                \
    if (o0 + (OC) <= o && y0 + (R) <= oh && x0 + TV_VLANES <= ow) { /* a whole tile */               \
      float* d = out + (o0 * oh + y0) * ow + x0;                                                     \
      const float* res = e.residual ? e.residual + (o0 * oh + y0) * ow + x0 : NULL;                  \
      if (e.act || res) {                                                                            \
        tv_vf kept[OC][R];                                                                           \
        _Pragma("GCC unroll 16") for (int i = 0; i < (OC); ++i)                                      \
          _Pragma("GCC unroll 8") for (int k = 0; k < (R); ++k) kept[i][k] = a[i][k];                \
        tv_vconv_tall_put(&kept[0][0], OC, R, &e, res, oh * ow, ow, d);                              \
        return;                                                                                      \
      }                                                                                              \
      _Pragma("GCC unroll 16") for (int i = 0; i < (OC); ++i)                                        \
        _Pragma("GCC unroll 8") for (int k = 0; k < (R); ++k) TV_VSTORE(d + i * oh * ow + k * ow, a[i][k]); \
      return;                                                                                        \
    }                                                                                                \
    float tile[OC][R][TV_VLANES];                                                                    \
    _Pragma("GCC unroll 16") for (int i = 0; i < (OC); ++i)                                          \
      _Pragma("GCC unroll 8") for (int k = 0; k < (R); ++k) TV_VSTORE(tile[i][k], a[i][k]);          \
    tv_vconv_store(&tile[0][0][0], OC, R, o, oh, ow, o0, y0, x0, &e, out);                           \
  }
#define TV_VCONV_TALL_OF(OC, R) TV_VCONV_TALL(OC, R)
#define TV_VCONV_TALL_NAME(OC) TV_VCONV_TALL_NAME_(OC)
#define TV_VCONV_TALL_NAME_(OC) tv_vconv_tall##OC
TV_VCONV_TALL(4, TV_VCONV_TALL_ROWS)
#if TV_VCONV_TALL_OC > 4
TV_VCONV_TALL_OF(TV_VCONV_TALL_OC, TV_VCONV_TALL_ROWS)
#endif

/* The weights of one block of the tall tiles (``width`` channels from o0: TV_VCONV_TALL_OC, or 4 for the
   tails) tap-major at packed + o0 taps: tap t's weights side by side (a channel past o repeats the last).
   The width a constant, each tap's channels unrolled from a pointer per channel: with the width and the
   channel's clamp in the loop, ResNet-size blocks had packed at a fifth of the speed (64 x 288 weights:
   7 us, near a quarter of an 8 x 8 layer's time at 1 thread). */
#define TV_VCONV_PACK_BLOCK(W)                                                                      \
  {                                                                                                \
    const float* s[W];                                                                             \
    for (int i = 0; i < (W); ++i) s[i] = weights + (o0 + i < o ? o0 + i : o - 1) * taps;           \
    for (int64_t t = 0; t < taps; ++t, d += (W)) {                                                 \
      _Pragma("GCC unroll 16") for (int i = 0; i < (W); ++i) d[i] = s[i][t];                     \
    }                                                                                              \
  }
static void tv_vconv_tall_pack_block(const float* weights, int64_t o, int64_t taps, int64_t width, int64_t o0,
                                     float* packed) {
  float* d = packed + o0 * taps;
  if (width == TV_VCONV_TALL_OC) TV_VCONV_PACK_BLOCK(TV_VCONV_TALL_OC)
  else TV_VCONV_PACK_BLOCK(4)
}

/* A run of tall tiles (tv_vconv_job with weights repacked per block, rows TV_VCONV_TALL_ROWS per tile). */
static void tv_vconv_tall_chunk(void* arg, int64_t i) {
  const tv_vconv_job* j = (const tv_vconv_job*)arg;
  const int64_t lo = i * j->tiles / j->chunks, hi = (i + 1) * j->tiles / j->chunks;
  int64_t made_to = 0, band = -1;
  for (int64_t t = lo; t < hi; ++t) {
    int64_t yb, ob, xb;
    const int64_t o0 = tv_vconv_tile_at(j, t, TV_VCONV_TALL_OC, &yb, &ob, &xb);
    TV_VCONV_NEED_ROWS(j, yb, band, made_to)
    if (j->raw && tv_vconv_claim(j->block_state + ob * TV_VCONV_STATE)) {
      tv_vconv_tall_pack_block(j->raw, j->o, j->taps, ob < j->big ? TV_VCONV_TALL_OC : 4, o0, (float*)j->weights);
      tv_vconv_made(j->block_state + ob * TV_VCONV_STATE);
    }
#if TV_VCONV_TALL_OC > 4
    if (ob < j->big) {
      TV_VCONV_TALL_NAME(TV_VCONV_TALL_OC)(j->padded, j->g, j->sh, j->off, j->taps, j->weights + o0 * j->taps, j->o,
                                           j->oh, j->ow, o0, yb * TV_VCONV_TALL_ROWS, xb * TV_VLANES, &j->epi, j->image);
      continue;
    }
#endif
    tv_vconv_tall4(j->padded, j->g, j->sh, j->off, j->taps, j->weights + o0 * j->taps, j->o, j->oh, j->ow, o0,
                   yb * TV_VCONV_TALL_ROWS, xb * TV_VLANES, &j->epi, j->image);
  }
}

/* Where each tap (c, ky, kx) of a vector of output columns starts in the padded image, from its output
   row's start: channel c's plane, kernel row ky's padded row, and at[kx] in it. */
static void tv_vconv_offsets(int64_t c, int64_t kh, int64_t kw, int64_t dh, const int64_t* at, tv_vconv_geometry g,
                             int64_t* off) {
  for (int64_t ci = 0, t = 0; ci < c; ++ci)
    for (int64_t ky = 0; ky < kh; ++ky)
      for (int64_t kx = 0; kx < kw; ++kx, ++t) off[t] = ci * g.plane + ky * dh * g.row + at[kx];
}

/* ``bias`` is read only when ``has_bias`` (callers without one pass any float pointer), ``residual`` (the
   output's shape) only when ``has_residual``; ``act``, ``alpha``... are tv_conv_epilogue's (no pool with
   either); ``padded`` holds c * tv_vconv_geometry(...).plane floats (conv2d_padded_size in
   tensorvm/codegen/strategy.py). */
__attribute__((unused)) static int32_t tv_conv2d_direct_act_f32(int64_t n, int64_t c, int64_t h, int64_t w,
    int64_t o, int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
    int64_t pt, int64_t pl, const float* x, const float* weights, const float* bias, int64_t has_bias,
    int64_t relu, int64_t pool, int64_t act, float alpha, float beta, float lo, float hi, const float* residual,
    int64_t has_residual, float* padded, float* out) {
  if (n <= 0 || o <= 0 || oh <= 0 || ow <= 0) return 0;
  const tv_vconv_geometry g = tv_vconv_geometry_of(oh, ow, kh, kw, sh, sw, dh, dw);
  int64_t at[kw];
  tv_vconv_taps(kw, sw, dw, g, at);
  const int tall = !pool; /* (the tall tiles; a pool needs the 2-row tile) */
  int64_t big, fours;
  tv_vconv_blocks_of(o, tall ? TV_VCONV_TALL_OC : TV_CONV_MR, &big, &fours);
  const int64_t rows = tall ? TV_VCONV_TALL_ROWS : 2;
  /* Within a pair of output rows, the channel blocks vary fastest (neighbouring tiles read the same input
     rows, kept in L1), unless the weights of all blocks fill more than half of L1d: then the column blocks
     do, and a block's weights stay in L1 while the rows stream (ResNet-18's first layer, 64 x 3 x 7 x 7:
     1.14x faster; the same speed on layers whose weights fit) */
  const int64_t yblocks = pool ? oh / 2 : (oh + rows - 1) / rows, xblocks = (ow + TV_VLANES - 1) / TV_VLANES;
  const int threads = tv_gemm_parallel((double)o * oh * ow * c * kh * kw) ? tv_omp_max_threads() : 1;
  const int64_t taps = c * kh * kw;
  const int64_t oblocks = big + fours, blocked = big * (tall ? TV_VCONV_TALL_OC : TV_CONV_MR) + 4 * fours;
  /* the taps' offsets, then the units' and the blocks' states, a cache line each from the next line on:
     the tiles read the offsets at every tap while other cores swap the states */
  const int64_t lines = (taps * (int64_t)sizeof(int64_t) + 63) / 64 + 1 + (g.hp + oblocks);
  char* scratch = (char*)malloc((size_t)(lines * 64));
  float* packed = tall ? (float*)malloc(sizeof(float) * (size_t)(blocked * taps)) : NULL;
  if (scratch == NULL || (tall && packed == NULL)) {
    free(scratch), free(packed);
    return TV_ERROR_OUT_OF_MEMORY;
  }
  int64_t* off = (int64_t*)scratch;
  int32_t* rows_state = (int32_t*)(scratch + (((uintptr_t)scratch + (uintptr_t)taps * sizeof(int64_t)) / 64 + 1) * 64
                                   - (uintptr_t)scratch);
  int32_t* block_state = rows_state + g.hp * TV_VCONV_STATE;
  tv_vconv_offsets(c, kh, kw, dh, at, g, off);
  for (int64_t b = 0; b < oblocks; ++b) block_state[b * TV_VCONV_STATE] = 0;
  tv_vconv_job job = {padded, tall ? packed : weights, off, out,
                      {has_bias ? bias : NULL, relu != 0, pool != 0, (int)act, alpha, beta, lo, hi, NULL},
                      g, taps, o, oh, ow, sh, big, oblocks, xblocks, oblocks * yblocks * xblocks, 0,
                      o * taps * (int64_t)sizeof(float) > TV_L1D / 2,
                      x, tall ? weights : NULL, rows_state, block_state, c, h, w, sw, pt, pl, kh, dh,
                      pool ? 2 : rows, (pool ? 2 : rows) * sh, 0};
  job.chunks = tv_vconv_chunks(job.tiles, threads);
  const int64_t units = (g.hp + job.unit - 1) / job.unit;
  const int64_t image_out = pool ? o * (oh / 2) * (ow / 2) : o * oh * ow;
  for (int64_t b = 0; b < n; ++b) {
    job.x = x + b * c * h * w;
    job.rows_ready = b > 0;
    /* the rows above and below the image stay zeros from one image to the next */
    for (int64_t u = 0; u < units; ++u) /* (a unit of zero rows only is made) */
      rows_state[u * TV_VCONV_STATE] = b > 0 && ((u + 1) * job.unit <= pt || u * job.unit - pt >= h) ? 2 : 0;
    if (job.chunks == 1) { /* (one chunk: the whole copy in one pass first, 2-4% faster than band by band) */
      tv_vconv_pad(job.x, 0, c, h, w, sw, pt, pl, g, NULL, b > 0, padded);
      for (int64_t u = 0; u < units; ++u) rows_state[u * TV_VCONV_STATE] = 2;
    }
    job.image = out + b * image_out;
    job.epi.residual = has_residual ? residual + b * image_out : NULL;
    tv_team_run(job.chunks, threads, tall ? tv_vconv_tall_chunk : tv_vconv_chunk, &job);
  }
  free(scratch), free(packed);
  return 0;
}

/* The direct convolution with bias, relu and pool only. */
__attribute__((unused)) static int32_t tv_conv2d_direct_f32(int64_t n, int64_t c, int64_t h, int64_t w,
    int64_t o, int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
    int64_t pt, int64_t pl, const float* x, const float* weights, const float* bias, int64_t has_bias,
    int64_t relu, int64_t pool, float* padded, float* out) {
  return tv_conv2d_direct_act_f32(n, c, h, w, o, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl, x, weights, bias, has_bias,
                                  relu, pool, 0, 1.0f, 0.0f, 0.0f, 0.0f, bias, 0, padded, out);
}

/* ---- the depthwise convolution (groups = channels, one filter per channel): tv_conv2d_depthwise_f32 ----
   Each channel is padded into its own phase-split plane (tv_vconv_pad, as above) by the thread that
   convolves it, so the plane is still in L1/L2 when its tiles read it. A tile is ROWS output rows x one
   vector of columns: per tap one weight broadcast and ROWS vector loads feed ROWS FMAs (a depthwise tap
   has no other output channel to share its input load with). ROWS is 8 (5x5 layers measured 6-7% faster
   than with 4), but 4 for the stride-2 3x3 tile (8 measured 8-11% slower there: 9 taps over 8 rows' 24
   row pointers). A missing row repeats the
   last one (not stored); the last column block overlaps the one before (a row narrower than a vector
   goes through a small buffer). Bias and relu are applied in
   registers (tv_conv_epilogue; no pool). */
/* One row of a tile (TV_VLANES floats, output columns x0 on; ``cols`` = OW - x0 of them are the output's)
   through the epilogue's relu, residual (``res``: the output's plane, read at the same place) and
   activation into out + at, of a plane of ``plane`` floats: whole vectors, and a row narrower than a
   vector still in one. Such a row is stored whole too, its last lanes over the start of the next row, when
   the plane goes on that far: the tiles store a plane's rows in order, so the next row overwrites them (a
   memcpy call per 7-float row had been a fifth of a 7x7 layer's time); the last rows' floats are copied. */
static inline void tv_vdw_put(const float* row, const tv_conv_epilogue* e, const float* res, int64_t at,
                              int64_t cols, int64_t plane, float* out) {
  tv_vf v = TV_VLOAD(row);
  if (e->relu) TV_VRELU(v);
  if (cols >= TV_VLANES || at + TV_VLANES <= plane) {
    if (res) v += TV_VLOAD(res + at);
    if (e->act) TV_VACT(v, *e)
    TV_VSTORE(out + at, v);
    return;
  }
  if (res) {
    float r[TV_VLANES] = {0};
    memcpy(r, res + at, sizeof(float) * (size_t)cols);
    v += TV_VLOAD(r);
  }
  if (e->act) TV_VACT(v, *e)
  float kept[TV_VLANES];
  TV_VSTORE(kept, v);
  memcpy(out + at, kept, sizeof(float) * (size_t)cols);
}
#define TV_VDW_ACC(i) tv_vf a##i = TV_VSPLAT(start);
#define TV_VDW_FMA(i) a##i += wv * TV_VLOAD(r##i + tap);
#define TV_VDW_ROW(i) const float* r##i = plane + (row##i * sh + ky * dh) * g.row + x0;
#define TV_VDW_Y(i) const int64_t row##i = y0 + i < oh ? y0 + i : oh - 1;
#define TV_VDW_KEEP(i) TV_VSTORE(tile[i], a##i);
/* Row i of a whole tile (every row inside the plane, a whole vector of columns) through the epilogue in
   registers, as tv_vdw_put does it from memory (the tile's rows stored and read back, and the
   epilogue's tests per row, had been a fifth of a 3 x 3 layer's time). */
#define TV_VDW_STORE(i) {                                                                            \
    tv_vf v = a##i;                                                                                  \
    if (e.relu) TV_VRELU(v);                                                                         \
    if (res) v += TV_VLOAD(res + (y0 + i) * ow + x0);                                                \
    if (e.act) TV_VACT(v, e)                                                                         \
    TV_VSTORE(out + (y0 + i) * ow + x0, v); }
#define TV_VDW_EACH4(F) F(0) F(1) F(2) F(3)
#define TV_VDW_EACH8(F) TV_VDW_EACH4(F) F(4) F(5) F(6) F(7)
#define TV_VDW_CHANNEL(KIND, AT, KW, ROWS)                                                           \
  static void tv_vdw_channel_##KIND(const float* plane, tv_vconv_geometry g, const int64_t* at, int64_t sh,   \
                                    int64_t dh, const float* wt, int64_t kh, int64_t kw, float start,     \
                                    const tv_conv_epilogue* epi, const float* res, int64_t oh, int64_t ow, \
                                    float* out) {                                                    \
    (void)at;                                                                                        \
    const tv_conv_epilogue e = *epi; /* (a copy: the stores to out could alias its floats) */        \
    for (int64_t y0 = 0; y0 < oh; y0 += ROWS) {                                               \
      TV_VDW_EACH##ROWS(TV_VDW_Y)                                                                          \
      for (int64_t x = 0; x < ow; x += TV_VLANES) {                                                  \
        /* (the last block overlaps the one before when the row has a vector: whole stores only) */   \
        const int64_t x0 = ow >= TV_VLANES && x + TV_VLANES > ow ? ow - TV_VLANES : x;                \
        TV_VDW_EACH##ROWS(TV_VDW_ACC)                                                                      \
        for (int64_t ky = 0; ky < kh; ++ky) {                                                        \
          TV_VDW_EACH##ROWS(TV_VDW_ROW)                                                                    \
          const float* wk = wt + ky * kw;                                                            \
          _Pragma("GCC unroll 7")                                                                    \
          for (int64_t kx = 0; kx < (KW); ++kx) {                                                    \
            const tv_vf wv = TV_VSPLAT(wk[kx]);                                                      \
            const int64_t tap = AT(kx);                                                              \
            TV_VDW_EACH##ROWS(TV_VDW_FMA)                                                                  \
          }                                                                                          \
        }                                                                                            \
        if (y0 + ROWS <= oh && ow >= TV_VLANES) {  /* (a whole tile: the epilogue in registers) */    \
          TV_VDW_EACH##ROWS(TV_VDW_STORE)                                                            \
          continue;                                                                                  \
        }                                                                                            \
        float tile[ROWS][TV_VLANES];                                                                 \
        TV_VDW_EACH##ROWS(TV_VDW_KEEP)                                                               \
        for (int64_t i = 0; i < ROWS && y0 + i < oh; ++i) tv_vdw_put(tile[i], &e, res, (y0 + i) * ow + x0, ow - x0, oh * ow, out); \
      }                                                                                              \
    }                                                                                                \
  }
TV_VDW_CHANNEL(unit, TV_VCONV_AT_UNIT, kw, 8)
/* (3 taps a row, a constant: the rows wider than the channel-blocked tiles take (MobileNet's 88-channel
   28x28 layer at 8 lanes) ran 1.24x faster than through the tile whose tap count is a variable) */
TV_VDW_CHANNEL(unit3, TV_VCONV_AT_UNIT, 3, 8)
TV_VDW_CHANNEL(any, TV_VCONV_AT_TABLE, kw, 8)
/* Unit strides and a 3 x 3 kernel (MobileNetV2's every depthwise layer, V3's 88-channel one): the same 8
   output rows x one vector, but each of the tile's 10 input rows is loaded once, as its 3 shifted vectors,
   and feeds every output row it reaches (up to 3): 30 loads for 72 FMAs, where the tile above loads a row
   once per output row it feeds (72 loads, half of them straddling a cache line). The input rows go in
   order, so each output row still sums bias, then ky, then kx, as above: the same bits. Rows of the last
   tile past the image read the plane's last row (in bounds) and are not stored. */
#define TV_VDW33_TAPS(i, ky) a##i += w##ky##0 * v0; a##i += w##ky##1 * v1; a##i += w##ky##2 * v2;
#define TV_VDW33_LOAD(j)                                                                             \
  const float* in = plane + (y0 + j < g.hp ? y0 + j : g.hp - 1) * g.row + x0;                        \
  const tv_vf v0 = TV_VLOAD(in), v1 = TV_VLOAD(in + 1), v2 = TV_VLOAD(in + 2);
static void tv_vdw_channel_unit33(const float* plane, tv_vconv_geometry g, const float* wt, float start,
                                  const tv_conv_epilogue* epi, const float* res, int64_t oh, int64_t ow,
                                  float* out) {
  const tv_conv_epilogue e = *epi; /* (a copy: the stores to out could alias its floats) */
  const tv_vf w00 = TV_VSPLAT(wt[0]), w01 = TV_VSPLAT(wt[1]), w02 = TV_VSPLAT(wt[2]);
  const tv_vf w10 = TV_VSPLAT(wt[3]), w11 = TV_VSPLAT(wt[4]), w12 = TV_VSPLAT(wt[5]);
  const tv_vf w20 = TV_VSPLAT(wt[6]), w21 = TV_VSPLAT(wt[7]), w22 = TV_VSPLAT(wt[8]);
  for (int64_t y0 = 0; y0 < oh; y0 += 8) {
    for (int64_t x = 0; x < ow; x += TV_VLANES) {
      /* (the last block overlaps the one before when the row has a vector: whole stores only) */
      const int64_t x0 = ow >= TV_VLANES && x + TV_VLANES > ow ? ow - TV_VLANES : x;
      TV_VDW_EACH8(TV_VDW_ACC)
      { TV_VDW33_LOAD(0) TV_VDW33_TAPS(0, 0) }
      { TV_VDW33_LOAD(1) TV_VDW33_TAPS(0, 1) TV_VDW33_TAPS(1, 0) }
      { TV_VDW33_LOAD(2) TV_VDW33_TAPS(0, 2) TV_VDW33_TAPS(1, 1) TV_VDW33_TAPS(2, 0) }
      { TV_VDW33_LOAD(3) TV_VDW33_TAPS(1, 2) TV_VDW33_TAPS(2, 1) TV_VDW33_TAPS(3, 0) }
      { TV_VDW33_LOAD(4) TV_VDW33_TAPS(2, 2) TV_VDW33_TAPS(3, 1) TV_VDW33_TAPS(4, 0) }
      { TV_VDW33_LOAD(5) TV_VDW33_TAPS(3, 2) TV_VDW33_TAPS(4, 1) TV_VDW33_TAPS(5, 0) }
      { TV_VDW33_LOAD(6) TV_VDW33_TAPS(4, 2) TV_VDW33_TAPS(5, 1) TV_VDW33_TAPS(6, 0) }
      { TV_VDW33_LOAD(7) TV_VDW33_TAPS(5, 2) TV_VDW33_TAPS(6, 1) TV_VDW33_TAPS(7, 0) }
      { TV_VDW33_LOAD(8) TV_VDW33_TAPS(6, 2) TV_VDW33_TAPS(7, 1) }
      { TV_VDW33_LOAD(9) TV_VDW33_TAPS(7, 2) }
      if (y0 + 8 <= oh && ow >= TV_VLANES) {  /* (a whole tile: the epilogue in registers) */
        TV_VDW_EACH8(TV_VDW_STORE)
        continue;
      }
      float tile[8][TV_VLANES];
      TV_VDW_EACH8(TV_VDW_KEEP)
      for (int64_t i = 0; i < 8 && y0 + i < oh; ++i) tv_vdw_put(tile[i], &e, res, (y0 + i) * ow + x0, ow - x0, oh * ow, out);
    }
  }
}
/* Column stride 2, dilation 1 and a kernel 3, 5 or 7 wide (KW, a constant): no phase-split copy. Each
   input row of a column block is split into its even and odd columns in registers as the tile reads it:
   a pair of vector loads at padded column 2 x0 + 2 m gives, through its even and odd lanes, taps 2 m and
   2 m + 1 of the block's output columns (TV_VDW2_EVEN / ODD). The split keeps every lane inside its 128
   bits (one shuffle on x86, where the in-order split also crosses lanes), so the accumulators hold the
   block's columns in the order TV_VDW2_ORDER puts back once per stored vector. A tile is ROWS output rows
   that share their input rows: each input row is split once and feeds every output row whose taps reach
   it (KW / 2 of them). The rows are read from a linear copy of the plane (``line``, tv_vdw2_lines): PT
   zero rows, then each image row behind PL zeros with zeros after it (as many as the last block reads),
   then zero rows down to the last one the last tile reads; the zeros are written once per buffer. (A
   test per input row instead of the zero rows had cost 8 instructions each; reading the blocks inside
   the image straight from it, the copy only of the border columns, measured 1.12-1.19x slower.) */
#if TV_VLANES == 4
#define TV_VDW2_EVEN TV_VEVEN_OF_TWO
#define TV_VDW2_ODD TV_VODD_OF_TWO
#define TV_VDW2_ORDER ((tv_vi){0, 1, 2, 3})
#elif TV_VLANES == 8
#define TV_VDW2_EVEN ((tv_vi){0, 2, 8, 10, 4, 6, 12, 14})
#define TV_VDW2_ODD ((tv_vi){1, 3, 9, 11, 5, 7, 13, 15})
#define TV_VDW2_ORDER ((tv_vi){0, 1, 4, 5, 2, 3, 6, 7})
#else
#define TV_VDW2_EVEN ((tv_vi){0, 2, 16, 18, 4, 6, 20, 22, 8, 10, 24, 26, 12, 14, 28, 30})
#define TV_VDW2_ODD ((tv_vi){1, 3, 17, 19, 5, 7, 21, 23, 9, 11, 25, 27, 13, 15, 29, 31})
#define TV_VDW2_ORDER ((tv_vi){0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15})
#endif
/* The tile's output rows per kernel width (TV_VDW2_CHANNEL below): as many as fit the 16 vector registers
   of AVX2 and SSE beside the KW split taps, two loads and a weight (at most 8; 8 rows of a 5x5 tile spilled
   its accumulators and measured 1.2-1.4x slower than 7). */
static inline int64_t tv_vdw2_rows(int64_t kw) { return kw == 3 ? 8 : kw == 5 ? 7 : 5; }
/* The linear copy's geometry: floats per row (the image row behind PL zeros, and every float a block
   reads: the last block starts at output column max(OW - lanes, 0) and reads 2 lanes + KW - 1 floats,
   the last of them past its taps: the odd lanes of the last pair) and rows (PT zero rows, the image's,
   and zero rows down to the last the last tile reads, whole tiles of tv_vdw2_rows). */
static inline void tv_vdw2_lines(int64_t h, int64_t w, int64_t oh, int64_t ow, int64_t kw, int64_t pt, int64_t pl,
                                 int64_t* lw, int64_t* rows) {
  const int64_t last = ow > TV_VLANES ? ow - TV_VLANES : 0, reads = 2 * last + kw - 1 + 2 * TV_VLANES;
  const int64_t tile = tv_vdw2_rows(kw), below = ((oh + tile - 1) / tile * tile - 1) * 2 + kw - pt;
  *lw = reads > pl + w ? reads : pl + w;
  *rows = pt + (below > h ? below : h);
}
#define TV_VDW2_ACC(i) tv_vf a##i = TV_VSPLAT(start);
/* (an input row's taps are summed apart, then added to the row's accumulator: in one chain, the 9 or 25
   dependent FMAs of each output row, whose rows the input-row order runs nearly one after the other, had
   held the tile to about a fifth of the FMA rate) */
#define TV_VDW2_ROW(i) {                                                                             \
    const int ky = t - 2 * (i);                                                                      \
    if (ky >= 0 && ky < kw) {                                                                        \
      tv_vf part = TV_VSPLAT(wt[ky * kw]) * v[0];                                                    \
      _Pragma("GCC unroll 7")                                                                        \
      for (int kx = 1; kx < kw; ++kx) part += TV_VSPLAT(wt[ky * kw + kx]) * v[kx];                   \
      a##i += part;                                                                                  \
    } }
#define TV_VDW2_KEEP(i) TV_VSTORE(tile[i], __builtin_shuffle(a##i, TV_VDW2_ORDER));
#define TV_VDW2_STORE(i) { a##i = __builtin_shuffle(a##i, TV_VDW2_ORDER); TV_VDW_STORE(i) }
/* The tile of a KW x KW kernel at stride 2: the loop over the block's input rows (2 (ROWS - 1) + KW) is
   unrolled whole, so which output rows each one feeds, and with which weights, is known to the compiler
   (no test per row and input row). A whole tile (ROWS rows of a whole vector) goes through the epilogue in
   registers, others through tv_vdw_put. */
#define TV_VDW2_CHANNEL(KW, ROWS)                                                                    \
  static void tv_vdw2_channel_k##KW(const float* line, int64_t lw, const float* wt, float start,       \
                                    const tv_conv_epilogue* epi, const float* res, int64_t oh, int64_t ow, \
                                    float* out) {                                                    \
    const tv_conv_epilogue e = *epi; /* (a copy: the stores to out could alias its floats) */        \
    enum { kw = KW, reach = 2 * (ROWS - 1) + KW };  /* (for TV_VDW2_ROW) */                          \
    for (int64_t y0 = 0; y0 < oh; y0 += ROWS) {                                                      \
      const int64_t rows = oh - y0 < ROWS ? oh - y0 : ROWS;                                          \
      for (int64_t x = 0; x < ow; x += TV_VLANES) {                                                  \
        /* (the last block overlaps the one before when the row has a vector: whole stores only) */   \
        const int64_t x0 = ow >= TV_VLANES && x + TV_VLANES > ow ? ow - TV_VLANES : x;                \
        TV_VROWS##ROWS(TV_VDW2_ACC)                                                               \
        _Pragma("GCC unroll 32")                                                                     \
        for (int t = 0; t < reach; ++t) {                                                            \
          const float* r = line + (y0 * 2 + t) * lw + 2 * x0;                                        \
          tv_vf v[KW];                                                                               \
          _Pragma("GCC unroll 4")                                                                    \
          for (int m = 0; 2 * m < (KW); ++m) {                                                       \
            const tv_vf lo = TV_VLOAD(r + 2 * m), hi = TV_VLOAD(r + 2 * m + TV_VLANES);              \
            v[2 * m] = __builtin_shuffle(lo, hi, TV_VDW2_EVEN);                                      \
            if (2 * m + 1 < (KW)) v[2 * m + 1] = __builtin_shuffle(lo, hi, TV_VDW2_ODD);             \
          }                                                                                          \
          TV_VROWS##ROWS(TV_VDW2_ROW)                                                             \
        }                                                                                            \
        if (rows == ROWS && ow >= TV_VLANES) {                                                       \
          TV_VROWS##ROWS(TV_VDW2_STORE)                                                              \
          continue;                                                                                  \
        }                                                                                            \
        float tile[ROWS][TV_VLANES];                                                                 \
        TV_VROWS##ROWS(TV_VDW2_KEEP)                                                                 \
        for (int64_t i = 0; i < rows; ++i) tv_vdw_put(tile[i], &e, res, (y0 + i) * ow + x0, ow - x0, oh * ow, out); \
      }                                                                                              \
    }                                                                                                \
  }
TV_VDW2_CHANNEL(3, 8)
TV_VDW2_CHANNEL(5, 7)
TV_VDW2_CHANNEL(7, 5)

typedef struct {
  const float* x;
  const float* weights;
  const float* bias;
  const int64_t* at;
  float* buffers;
  float* out;
  tv_vconv_geometry g;
  int64_t c, h, w, oh, ow, kh, kw, sh, sw, dh, pt, pl, each, planes, chunks;
  /* the plane's zero-padded copy of paths 1, 3, 5, 7: lines rows of lw floats, the image at row pt, column pl
     (path 1: tv_vdw_geometry_of's, 3, 5, 7: tv_vdw2_lines), copied row by row into zeros written once */
  int64_t lw, lines;
  int has_bias, relu;
  int path;  /* 1: unit column stride and dilation; 3, 5, 7: column stride 2, dilation 1, that kernel width; 0: any */
  tv_conv_epilogue epi;  /* (relu, the activation and the residual of the whole batch) */
} tv_vdw_job;

/* A run of planes, padded one at a time into the chunk's own buffer (buffers + i * each): a chunk may run
   on any thread, the caller included, so the buffer belongs to the chunk, not to a thread number. */
static void tv_vdw_chunk(void* arg, int64_t i) {
  const tv_vdw_job* j = (const tv_vdw_job*)arg;
  float* plane = j->buffers + i * j->each;
  const int64_t lo = i * j->planes / j->chunks, hi = (i + 1) * j->planes / j->chunks;
  for (int64_t p = lo; p < hi; ++p) {
    const int64_t ci = p % j->c;
    const float* src = j->x + p * j->h * j->w;
    /* (no software prefetch of the next plane: the copies read rows in order, a stream the hardware
       prefetcher follows; a prefetch per line of the next plane measured 1.07-1.15x slower on the strided
       layers, its instructions waiting for fill buffers) */
    if (j->path >= 1) { /* (the zeros around the image are the same for every plane: written for the first) */
      const int64_t cols = j->w < j->lw - j->pl ? j->w : j->lw - j->pl, rows = j->h < j->lines - j->pt ? j->h : j->lines - j->pt;
      if (p == lo) memset(plane, 0, sizeof(float) * (size_t)(j->lines * j->lw));
      for (int64_t iy = 0; iy < rows && cols > 0; ++iy)
        tv_vconv_copy(plane + (j->pt + iy) * j->lw + j->pl, src + iy * j->w, cols);
    } else
      tv_vconv_pad(src, 0, 1, j->h, j->w, j->sw, j->pt, j->pl, j->g, plane + j->g.plane, p > lo, plane);
    const float start = j->has_bias ? j->bias[ci] : 0.0f;
    const float* wt = j->weights + ci * j->kh * j->kw;
    float* dst = j->out + p * j->oh * j->ow;
    const float* res = j->epi.residual ? j->epi.residual + p * j->oh * j->ow : NULL;
#define TV_VDW_CALL(KIND) tv_vdw_channel_##KIND(plane, j->g, j->at, j->sh, j->dh, wt, j->kh, j->kw, start, &j->epi, res, \
                                               j->oh, j->ow, dst)
#define TV_VDW2_CALL(KW) tv_vdw2_channel_k##KW(plane, j->lw, wt, start, &j->epi, res, j->oh, j->ow, dst)
    switch (j->path) {
      case 1:
        if (j->kw == 3 && j->kh == 3 && j->sh == 1 && j->dh == 1)
          tv_vdw_channel_unit33(plane, j->g, wt, start, &j->epi, res, j->oh, j->ow, dst);
        else if (j->kw == 3)
          TV_VDW_CALL(unit3);
        else
          TV_VDW_CALL(unit);
        break;
      case 3: TV_VDW2_CALL(3); break;
      case 5: TV_VDW2_CALL(5); break;
      case 7: TV_VDW2_CALL(7); break;
      default: TV_VDW_CALL(any);
    }
#undef TV_VDW_CALL
#undef TV_VDW2_CALL
  }
}

/* The depthwise kernel's padded plane: tv_vconv_geometry_of's with rows only as long as its tiles read
   (max(OW, TV_VLANES) plus the taps' reach, where the direct kernel rounds OW up to whole vectors): its
   last column block overlaps the one before instead of running past OW, and at column stride 2 each
   vector the copy saves is a pair of loads, two shuffles and two stores (28 output columns: 4 pairs a
   row, not 5). */
static inline tv_vconv_geometry tv_vdw_geometry_of(int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh,
                                                   int64_t sw, int64_t dh, int64_t dw) {
  tv_vconv_geometry g = tv_vconv_geometry_of(oh, ow, kh, kw, sh, sw, dh, dw);
  g.wq = (ow > TV_VLANES ? ow : TV_VLANES) + (kw - 1) * dw / sw;
  g.row = sw * g.wq;
  g.plane = g.hp * g.row;
  return g;
}

/* Which tile a depthwise convolution runs (tv_vdw_job.path). */
static inline int tv_vdw_path(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw) {
  if (sw == 1 && dw == 1) return 1;
  return sh == 2 && sw == 2 && dh == 1 && dw == 1 && kh == kw && (kw == 3 || kw == 5 || kw == 7) ? (int)kw : 0;
}

/* Stride 1 or 2 (both ways), no dilation, a kernel 3, 5 or 7 wide: channel-blocked tiles (tv_vdwb_*). The
   column tiles above waste lanes and rows on small planes (a 14x14 plane computes 16 x 16 outputs, a 7x7 one
   8 x 8) and their shifted loads straddle cache lines; per plane they also pay a copy and a tile setup. Here
   the lanes are TV_VLANES channels instead: each unit (an image x a block of channels) transposes the
   block's planes into one zero-padded buffer of pixels (TV_VLANES floats each, the channels of that pixel),
   runs tiles of TV_VDWB_R output pixels of a row x every channel of the block (at stride 2, of every other
   input pixel: the tile loads each of its taps' input vectors where it uses it), writes the sums pixel by
   pixel into a second buffer, and transposes them back into the NCHW planes, applying the epilogue there
   (relu, the residual, the activation: as tv_vdw_put, on whole vectors of one channel's pixels). Per kernel
   row a tile loads its R + KW - 1 input pixels once and feeds R x KW FMAs (a weight vector per tap, read
   from the block's repacked weights): no lane is wasted but the channel tail of the last block, whose
   missing channels repeat the last one and are not stored. */
/* (8 pixels: 8 accumulators hide the FMA's latency; 4 measured 1.15-1.3x slower) */
#ifndef TV_VDWB_R
#define TV_VDWB_R 8
#endif
#define TV_VDWB_EACH__(R, F) TV_VROWS##R(F)
#define TV_VDWB_EACH_(R, F) TV_VDWB_EACH__(R, F)
#define TV_VDWB_EACH(F) TV_VDWB_EACH_(TV_VDWB_R, F)
/* The two halves of interleaving two vectors: {a0, b0, a1, b1, ...} of their first and of their second halves. */
#if TV_VLANES == 4
#define TV_VZIP_LO ((tv_vi){0, 4, 1, 5})
#define TV_VZIP_HI ((tv_vi){2, 6, 3, 7})
#elif TV_VLANES == 8
#define TV_VZIP_LO ((tv_vi){0, 8, 1, 9, 2, 10, 3, 11})
#define TV_VZIP_HI ((tv_vi){4, 12, 5, 13, 6, 14, 7, 15})
#else
#define TV_VZIP_LO ((tv_vi){0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23})
#define TV_VZIP_HI ((tv_vi){8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31})
#endif
/* Eight vectors of 8 floats (32 bytes whatever the instance's width) transposed in place: tv_vtranspose's
   8 lanes, and the packed convolution's blocked copy (a pixel's channel block is 8 floats) at any width. */
typedef float tv_v8f __attribute__((vector_size(32)));
typedef float tv_v8fu __attribute__((vector_size(32), aligned(4), may_alias));
typedef int32_t tv_v8i __attribute__((vector_size(32)));
static inline void tv_v8_transpose(tv_v8f* r) {
  tv_v8f t[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = __builtin_shuffle(r[2 * i], r[2 * i + 1], ((tv_v8i){0, 8, 1, 9, 4, 12, 5, 13}));
    t[2 * i + 1] = __builtin_shuffle(r[2 * i], r[2 * i + 1], ((tv_v8i){2, 10, 3, 11, 6, 14, 7, 15}));
  }
  for (int k = 0; k < 2; ++k)
    for (int h = 0; h < 2; ++h) {
      r[4 * k + 2 * h] = __builtin_shuffle(t[4 * k + h], t[4 * k + h + 2], ((tv_v8i){0, 1, 8, 9, 4, 5, 12, 13}));
      r[4 * k + 2 * h + 1] = __builtin_shuffle(t[4 * k + h], t[4 * k + h + 2], ((tv_v8i){2, 3, 10, 11, 6, 7, 14, 15}));
    }
  for (int i = 0; i < 4; ++i) {
    t[i] = __builtin_shuffle(r[i], r[i + 4], ((tv_v8i){0, 1, 2, 3, 8, 9, 10, 11}));
    t[i + 4] = __builtin_shuffle(r[i], r[i + 4], ((tv_v8i){4, 5, 6, 7, 12, 13, 14, 15}));
  }
  for (int i = 0; i < 8; ++i) r[i] = t[i];
}

/* r[0 .. TV_VLANES - 1] transposed in place (after it r[j] holds lane j of every row, in order). 8 lanes:
   the classic three rounds, two of them inside 128-bit halves (unpack, shufps: cheap on x86), one across
   (a generic interleave is a two-source permute in every round, and the transposes were then most of a
   14x14 5x5 layer's time); other widths: log2(lanes) rounds of interleaving row i with row i + lanes / 2. */
static inline void tv_vtranspose(tv_vf* r) {
#if TV_VLANES == 8
  tv_v8_transpose(r);
#else
  for (int step = 1; step < TV_VLANES; step *= 2) {
    tv_vf t[TV_VLANES];
    for (int i = 0; i < TV_VLANES / 2; ++i) {
      t[2 * i] = __builtin_shuffle(r[i], r[i + TV_VLANES / 2], TV_VZIP_LO);
      t[2 * i + 1] = __builtin_shuffle(r[i], r[i + TV_VLANES / 2], TV_VZIP_HI);
    }
    for (int i = 0; i < TV_VLANES; ++i) r[i] = t[i];
  }
#endif
}

typedef struct {
  const float* x;
  const float* weights;  /* c x kh x kw, as the op has them */
  const float* bias;     /* c floats, or NULL */
  const int32_t* at;     /* per input pixel: where its vector goes in the padded buffer */
  float* buffers;
  float* out;
  int64_t c, h, w, oh, ow, kh, kw, pt, pl, blocks, units, chunks, stride;
  int64_t wp, hp, each, sums;  /* padded pixels per row and rows; floats per chunk, of them the sums' */
  tv_conv_epilogue epi;
} tv_vdwb_job;

/* Block ``block``'s weights side by side per tap (kh x kw x TV_VLANES: lane l is channel block x
   TV_VLANES + l, a missing channel repeating the last one) into wt, its biases (zeros without) into b.
   Each chunk packs the blocks it runs: all of them packed on the caller before the split, a float at a
   time, had been serial work beside the tiles' split (4 us of a 38 us 576x7x7 5x5 layer, 8 lanes). Runs of
   TV_VLANES taps go through the transpose (a vector of taps per channel in, a vector of channels per tap
   out), the rest a float at a time. */
static void tv_vdwb_pack(const tv_vdwb_job* j, int64_t block, float* wt, float* b) {
  const int64_t taps = j->kh * j->kw, whole = taps / TV_VLANES * TV_VLANES;
  const float* src[TV_VLANES];
  for (int l = 0; l < TV_VLANES; ++l) {
    const int64_t ch = block * TV_VLANES + l, from = ch < j->c ? ch : j->c - 1;
    src[l] = j->weights + from * taps;
    b[l] = j->bias ? j->bias[from] : 0.0f;
  }
  for (int64_t t0 = 0; t0 < whole; t0 += TV_VLANES) {
    tv_vf r[TV_VLANES];
    for (int l = 0; l < TV_VLANES; ++l) r[l] = TV_VLOAD(src[l] + t0);
    tv_vtranspose(r);
    for (int q = 0; q < TV_VLANES; ++q) TV_VSTORE(wt + (t0 + q) * TV_VLANES, r[q]);
  }
  for (int64_t t = whole; t < taps; ++t)
    for (int l = 0; l < TV_VLANES; ++l) wt[t * TV_VLANES + l] = src[l][t];
}

/* The tile of KW (a constant) taps per kernel row at stride S (1 or 2): TV_VDWB_R output pixels of row oy
   from column x0 (sums of every channel of the block, from the block's biases at start) into sums. At
   stride 1 the row's R + KW - 1 input vectors are loaded once; at stride 2 output pixel x0 + i reads input
   columns 2 (x0 + i) + kx, each loaded where its FMA uses it (2 R + KW - 2 of them would not stay in the
   registers beside the sums). */
#define TV_VDWB_ACC(i) tv_vf a##i = TV_VLOAD(start);
#define TV_VDWB_FMA(i) a##i += wv * in[(i) + kx];
#define TV_VDWB_FMA2(i) a##i += wv * TV_VLOAD(row + (2 * (i) + kx) * TV_VLANES);
#define TV_VDWB_KEEP(i) if ((i) < keep) TV_VSTORE(dst + (i) * TV_VLANES, a##i);
#define TV_VDWB_TILE(KW, S, NAME)                                                                           \
  static void NAME##KW(const float* padded, int64_t wp, const float* wt, int64_t kh, const float* start,    \
                       int64_t oy, int64_t ow, float* sums) {                                               \
    for (int64_t x = 0; x < ow; x += TV_VDWB_R) {                                                           \
      /* (the last block overlaps the one before: the same sums again) */                                   \
      const int64_t x0 = ow >= TV_VDWB_R && x + TV_VDWB_R > ow ? ow - TV_VDWB_R : x;                        \
      const int64_t keep = ow < TV_VDWB_R ? ow : TV_VDWB_R;                                                 \
      TV_VDWB_EACH(TV_VDWB_ACC)                                                                             \
      for (int64_t ky = 0; ky < kh; ++ky) {                                                                 \
        const float* row = padded + (((S) * oy + ky) * wp + (S) * x0) * TV_VLANES;                          \
        tv_vf in[TV_VDWB_R + (KW) - 1]; /* (stride 1: every input vector of the row, loaded once) */        \
        _Pragma("GCC unroll 16")                                                                            \
        for (int j = 0; j < TV_VDWB_R + (KW) - 1; ++j)                                                      \
          if ((S) == 1) in[j] = TV_VLOAD(row + j * TV_VLANES); else in[j] = (tv_vf){0};                     \
        _Pragma("GCC unroll 7")                                                                             \
        for (int kx = 0; kx < (KW); ++kx) {                                                                 \
          const tv_vf wv = TV_VLOAD(wt + (ky * (KW) + kx) * TV_VLANES);                                     \
          if ((S) == 1) { TV_VDWB_EACH(TV_VDWB_FMA) } else { TV_VDWB_EACH(TV_VDWB_FMA2) }                   \
        }                                                                                                   \
      }                                                                                                     \
      float* dst = sums + (oy * ow + x0) * TV_VLANES;                                                       \
      TV_VDWB_EACH(TV_VDWB_KEEP)                                                                            \
    }                                                                                                       \
  }
TV_VDWB_TILE(3, 1, tv_vdwb_row_k)
TV_VDWB_TILE(5, 1, tv_vdwb_row_k)
TV_VDWB_TILE(7, 1, tv_vdwb_row_k)
TV_VDWB_TILE(3, 2, tv_vdwb_row2_k)
TV_VDWB_TILE(5, 2, tv_vdwb_row2_k)
TV_VDWB_TILE(7, 2, tv_vdwb_row2_k)
typedef void (*tv_vdwb_row_fn)(const float*, int64_t, const float*, int64_t, const float*, int64_t, int64_t, float*);
/* The tile for a kernel `kw` wide (3, 5 or 7, tv_vdwb_takes) at stride `s` (1 or 2). */
static tv_vdwb_row_fn tv_vdwb_row_of(int64_t s, int64_t kw) {
  if (s == 1) return kw == 3 ? tv_vdwb_row_k3 : kw == 5 ? tv_vdwb_row_k5 : tv_vdwb_row_k7;
  return kw == 3 ? tv_vdwb_row2_k3 : kw == 5 ? tv_vdwb_row2_k5 : tv_vdwb_row2_k7;
}

static void tv_vdwb_chunk(void* arg, int64_t i) {
  const tv_vdwb_job* j = (const tv_vdwb_job*)arg;
  float* padded = j->buffers + i * j->each;
  float* sums = padded + (j->each - j->sums);
  /* (the block's packed weights and biases after the chunk's buffers) */
  float* wt = j->buffers + j->chunks * j->each + i * (j->kh * j->kw + 1) * TV_VLANES;
  float* start = wt + j->kh * j->kw * TV_VLANES;
  const int64_t lo = i * j->units / j->chunks, hi = (i + 1) * j->units / j->chunks;
  const int64_t pixels = j->h * j->w, outs = j->oh * j->ow, images = j->units / j->blocks;
  const tv_conv_epilogue e = j->epi; /* (a copy: the stores to out could alias its floats) */
  const tv_vdwb_row_fn row = tv_vdwb_row_of(j->stride, j->kw);
  /* (the zeros around the image are the same for every unit: written once, and only they, since every
     unit writes the image's pixels; so are the sums' tail lanes past the last pixel, which the last
     transpose reads and no store keeps) */
  tv_vconv_zero_frame(padded, j->hp, j->wp, TV_VLANES, j->pt, j->h, j->pl, j->w);
  memset(sums + outs * TV_VLANES, 0, sizeof(float) * (size_t)(j->sums - outs * TV_VLANES));
  /* units block by block (the images of a block in a row): a block's weights are packed once per chunk */
  int64_t packed = -1;
  for (int64_t u = lo; u < hi; ++u) {
    const int64_t image = u % images, block = u / images, c0 = block * TV_VLANES;
    if (block != packed) {
      tv_vdwb_pack(j, block, wt, start);
      packed = block;
    }
    const int64_t valid = j->c - c0 < TV_VLANES ? j->c - c0 : TV_VLANES;
    const float* src[TV_VLANES];
    for (int l = 0; l < TV_VLANES; ++l)  /* (a missing channel repeats the last one: computed, not stored) */
      src[l] = j->x + (image * j->c + c0 + (l < valid ? l : valid - 1)) * pixels;
    /* the planes' pixels, TV_VLANES at a time (the last run overlapping the one before), transposed and
       stored where the pixel's padded place is (j->at, made once per call: a test per pixel for the
       row's end had cost more than the transposes) */
    if (pixels >= TV_VLANES) {
      for (int64_t p = 0; p < pixels; p += TV_VLANES) {
        const int64_t p0 = p + TV_VLANES > pixels ? pixels - TV_VLANES : p;
        tv_vf r[TV_VLANES];
        for (int l = 0; l < TV_VLANES; ++l) r[l] = TV_VLOAD(src[l] + p0);
        tv_vtranspose(r);
        for (int q = 0; q < TV_VLANES; ++q) TV_VSTORE(padded + j->at[p0 + q], r[q]);
      }
    } else {
      for (int64_t p = 0; p < pixels; ++p)
        for (int l = 0; l < TV_VLANES; ++l) padded[j->at[p] + l] = src[l][p];
    }
    /* (the block's biases by address, start: a vector wider than the target's is not passed by value) */
    for (int64_t oy = 0; oy < j->oh; ++oy) row(padded, j->wp, wt, j->kh, start, oy, j->ow, sums);
    /* the sums back into the block's planes, TV_VLANES pixels of one channel per vector, through the
       epilogue; the tail's pixels (fewer than a vector) through a small buffer, so no output float is
       written twice (the residual may be the output's own floats) */
    for (int64_t q0 = 0; q0 < outs; q0 += TV_VLANES) {
      const int64_t count = outs - q0 < TV_VLANES ? outs - q0 : TV_VLANES;
      tv_vf r[TV_VLANES];
      for (int q = 0; q < TV_VLANES; ++q) r[q] = TV_VLOAD(sums + (q0 + q) * TV_VLANES);
      tv_vtranspose(r);
      for (int l = 0; l < valid; ++l) {
        const int64_t at = (image * j->c + c0 + l) * outs + q0;
        tv_vf v = r[l];
        if (e.relu) TV_VRELU(v);
        if (count == TV_VLANES) {
          if (e.residual) v += TV_VLOAD(e.residual + at);
          if (e.act) TV_VACT(v, e)
          TV_VSTORE(j->out + at, v);
          continue;
        }
        if (e.residual) {
          float res[TV_VLANES] = {0};
          memcpy(res, e.residual + at, sizeof(float) * (size_t)count);
          v += TV_VLOAD(res);
        }
        if (e.act) TV_VACT(v, e)
        float kept[TV_VLANES];
        TV_VSTORE(kept, v);
        memcpy(j->out + at, kept, sizeof(float) * (size_t)count);
      }
    }
  }
}

/* Whether the channel-blocked tiles take a depthwise convolution: strides 1 or 2 (the same both ways), no
   dilation, a kernel 3, 5 or 7 wide (any height); at stride 1 either a kernel 5 or 7 wide (25 or 49 taps per
   pixel carry the two transposes) or an output row shorter than a vector (where the column tiles leave lanes
   of every vector idle). 3x3 layers, relu, 1 thread, through the VM, blocked / column tiles on a Zen 5: with
   16 lanes rows of 7 0.66, 14 1.03, 16 1.38, 20 0.93, 28 1.33 (MobileNetV3's 88 x 28 x 28: 28.2 against 21.3
   us), 30 1.41, 56 and 112 1.00; with 8 lanes rows of 7 0.76, 14 1.15, 16 1.33, 20 to 112 1.00. (Rows of up
   to two vectors had been the rule, from 8-lane measurements of the 28- and 56-pixel rows only.) At stride 2
   the tile reads an input vector per FMA where the column tiles' even/odd path does not, and it takes only
   rows of at most half a vector, where the column tiles leave half of every vector idle
   (`benchmarks/depthwise_layers.py --against` the kernels before, 1 thread, blocked / column: 16 lanes, 288
   x 14 x 14 5x5, rows of 7: 0.575 at batch 1, 0.42 at 8; 96 x 28 x 28 5x5, rows of 14: 0.97 and 1.41; 8
   lanes: 1.09 and 1.37 at batch 1). TV_VDWB_OFF (a define) keeps every layer on the column tiles
   (benchmarks). */
static inline int tv_vdwb_takes(int64_t ow, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw) {
#ifdef TV_VDWB_OFF
  (void)ow; (void)kw; (void)sh; (void)sw; (void)dh; (void)dw;
  return 0;
#else
  return (sh == 1 || sh == 2) && sw == sh && dh == 1 && dw == 1 && (kw == 3 || kw == 5 || kw == 7) &&
         (sh == 1 ? kw >= 5 || ow < TV_VLANES : 2 * ow <= TV_VLANES);
#endif
}

/* tv_conv2d_depthwise_act_f32 through the channel-blocked tiles (tv_vdwb_takes). */
static int32_t tv_vdwb_run(int64_t n, int64_t c, int64_t h, int64_t w, int64_t oh, int64_t ow, int64_t kh,
                           int64_t kw, int64_t s, int64_t pt, int64_t pl, const float* x, const float* weights,
                           const float* bias, int64_t has_bias, tv_conv_epilogue epi, float* out) {
  const int64_t blocks = (c + TV_VLANES - 1) / TV_VLANES, taps = kh * kw;
  /* the columns and rows the tiles read (a tile of R pixels, the last overlapping the one before), and
     at least the image's place in the padding (at stride 2 an image may reach past what the taps read) */
  int64_t wp = s * ((ow > TV_VDWB_R ? ow : TV_VDWB_R) - 1) + kw, hp = s * (oh - 1) + kh;
  wp = wp > pl + w ? wp : pl + w, hp = hp > pt + h ? hp : pt + h;
  const int64_t outs = (oh * ow + TV_VLANES - 1) / TV_VLANES * TV_VLANES;  /* (whole vectors of pixels) */
  const int threads = tv_gemm_parallel((double)n * c * oh * ow * taps) ? tv_omp_max_threads() : 1;
  tv_vdwb_job job = {x, weights, has_bias ? bias : NULL, NULL, NULL, out, c, h, w, oh, ow, kh, kw, pt, pl, blocks,
                     n * blocks, 0, s, wp, hp, (hp * wp + outs) * TV_VLANES, outs * TV_VLANES, epi};
  job.chunks = tv_vconv_chunks(job.units, threads);
  /* (the padded image reaches every input pixel: wp >= pl + w, hp >= pt + h, the padding after it being >= 0)
     per chunk its buffers and its block's packed weights and biases; then the pixels' offsets */
  float* buffers = (float*)malloc(sizeof(float) * (size_t)(job.chunks * (job.each + (taps + 1) * TV_VLANES)) +
                                  sizeof(int32_t) * (size_t)(h * w));
  if (buffers == NULL) return TV_ERROR_OUT_OF_MEMORY;
  job.buffers = buffers;
  int32_t* at = (int32_t*)(buffers + job.chunks * (job.each + (taps + 1) * TV_VLANES));
  for (int64_t iy = 0; iy < h; ++iy)
    for (int64_t ix = 0; ix < w; ++ix) at[iy * w + ix] = (int32_t)(((pt + iy) * wp + pl + ix) * TV_VLANES);
  job.at = at;
  tv_team_run(job.chunks, threads, tv_vdwb_chunk, &job);
  free(buffers);
  return 0;
}

/* x (n x c x h x w) convolved channel by channel with weights (c x 1 x kh x kw) into out (n x c x oh x ow).
   Each chunk pads one plane at a time into its own buffer (tv_vconv_geometry(...).plane floats, a few KB:
   a buffer for every channel, allocated per call, cost page faults on each call and left L2). Returns
   TV_ERROR_OUT_OF_MEMORY when a buffer cannot be allocated. ``act`` ... ``has_residual``: as
   tv_conv2d_direct_act_f32's. */
__attribute__((unused)) static int32_t tv_conv2d_depthwise_act_f32(int64_t n, int64_t c, int64_t h, int64_t w,
    int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt,
    int64_t pl, const float* x, const float* weights, const float* bias, int64_t has_bias, int64_t relu,
    int64_t act, float alpha, float beta, float lo, float hi, const float* residual, int64_t has_residual,
    float* out) {
  if (n <= 0 || c <= 0 || oh <= 0 || ow <= 0) return 0;
  if (tv_vdwb_takes(ow, kw, sh, sw, dh, dw) && (sh * oh + kh + pt + h) * (sw * ow + kw + 2 * TV_VDWB_R + pl + w)
                                                  < INT32_MAX / TV_VLANES) {
    const tv_conv_epilogue epi = {NULL, relu != 0, 0, (int)act, alpha, beta, lo, hi, has_residual ? residual : NULL};
    return tv_vdwb_run(n, c, h, w, oh, ow, kh, kw, sh, pt, pl, x, weights, bias, has_bias, epi, out);
  }
  const tv_vconv_geometry g = tv_vdw_geometry_of(oh, ow, kh, kw, sh, sw, dh, dw);
  int64_t at[kw];
  tv_vconv_taps(kw, sw, dw, g, at);
  const int64_t planes = n * c;
  const int threads = tv_gemm_parallel((double)planes * oh * ow * kh * kw) ? tv_omp_max_threads() : 1;
  const int path = tv_vdw_path(kh, kw, sh, sw, dh, dw);
  int64_t lw = g.row, lines = g.hp;
  if (path >= 3) tv_vdw2_lines(h, w, oh, ow, kw, pt, pl, &lw, &lines);
  tv_vdw_job job = {x, weights, bias, at, NULL, out, g, c, h, w, oh, ow, kh, kw, sh, sw, dh, pt, pl,
                    path >= 3 ? lines * lw : g.plane + (sw == 2 ? h * tv_vconv_line(w, pl, g) : 0), planes,
                    tv_vconv_chunks(planes, threads), lw, lines, has_bias != 0, relu != 0, path,
                    {NULL, relu != 0, 0, (int)act, alpha, beta, lo, hi, has_residual ? residual : NULL}};
  job.buffers = (float*)malloc(sizeof(float) * (size_t)(job.chunks * job.each));
  if (job.buffers == NULL) return TV_ERROR_OUT_OF_MEMORY;
  tv_team_run(job.chunks, threads, tv_vdw_chunk, &job);
  free(job.buffers);
  return 0;
}

/* The depthwise convolution with bias and relu only. */
__attribute__((unused)) static int32_t tv_conv2d_depthwise_f32(int64_t n, int64_t c, int64_t h, int64_t w,
    int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt,
    int64_t pl, const float* x, const float* weights, const float* bias, int64_t has_bias, int64_t relu,
    float* out) {
  return tv_conv2d_depthwise_act_f32(n, c, h, w, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl, x, weights, bias, has_bias,
                                     relu, 0, 1.0f, 0.0f, 0.0f, 0.0f, bias, 0, out);
}

/* ---- the packed convolution (nn.conv2d_packed): tv_conv2d_packed_f32 ----
   A convolution with a long reduction as the packed product's register tile over the image itself (no
   im2col): out[o][q] = sum_k panel[o / NR][k][o % NR] x[k][q] for output pixels q, k = (channel block,
   ky, kx, channel in block) as the weight was packed at compile time (pack_conv_weight in op/nn.py). The
   image is first copied into channel blocks of TV_VCONV_BLOCK (B) floats per pixel, zero padded
   (ceil(C / B) x HP x WP x B): a tile's reduction then reads each pixel's B channels in a row, one tap
   after the other, where NCHW jumps a whole plane per channel (the direct kernel above, whose every
   channel step waited on L2, ran at half the FMA rate on ResNet's 3x3 layers). A tile is MR output pixels
   (TV_CONV_MR, consecutive in the flattened image, so a narrow image fills its tiles; the pixels dealt
   out evenly, tiles of MR and MR - 1) x NR output channels: per step two weight vectors and MR broadcast
   inputs feed 2 MR FMAs, as in the product. Bias, residual and activation are applied in registers, the
   tile stored through a small buffer (MR floats per channel: the NCHW output is strided by channel). The
   reduction runs in runs of channel blocks whose slice of a panel fills at most half of L1d (TV_L1D, from
   the host description; see tv_pconv_chunk). */
#ifndef TV_VCONV_BLOCK
#define TV_VCONV_BLOCK 8
#endif
/* The shortest run of the reduction, in steps (input channels x taps): between runs a tile stores its
   2 MR partial-sum vectors and reloads them (from L2 or L3: 0.8 MB for a 56 x 56 layer), about as long
   as 8 steps of FMAs, whatever MR. With 64-byte vectors the L1 bound alone gives a 3x3 layer runs of one
   channel block (72 steps): 9-14% slower than runs of 2 or 3 blocks on a Cascade Lake Xeon; with AVX2's
   16-wide panels it gives 3 blocks (216 steps) already. */
#ifndef TV_PCONV_RUN_STEPS
#define TV_PCONV_RUN_STEPS 192
#endif
/* The register tile: R output pixels (their offsets in the blocked copy at at[0..R)) x NR output channels,
   over ``count`` taps (a channel block at one (ky, kx): offsets ``taps``, relative to a pixel's) whose
   weights follow each other from w (B x NR floats per tap). One flat loop over the taps, whatever the
   kernel's size: three nested loops of 3 (channel block, ky, kx) cost a loop exit, and its misprediction,
   every 3 taps, and recomputed every row's pointer per ky. Per input channel two weight vectors and R
   broadcasts feed 2 R FMAs. Unless NULL, ``ahead`` is the next slice of weights the chunk will read (as
   long as this one), fetched into L2 line by line as the taps go: a deep layer's weights (9.4 MB at 512
   channels) come from L3 or memory, and the first tile of each slice had waited on them (2-6% of
   ResNet-18's 512-channel layers). */
#define TV_PCONV_ACC(r) tv_vf lo##r = {0}, hi##r = {0}; const float* p##r = blocked + at[r];
#define TV_PCONV_FMA(r) { const tv_vf a = TV_VSPLAT(p##r[d + ci]); lo##r += a * b0; hi##r += a * b1; }
#define TV_PCONV_FMA_LO(r) { const tv_vf a = TV_VSPLAT(p##r[d + ci]); lo##r += a * b0; }
/* The reduction over the taps with FMA(r) per row and input channel, the second weight vector loaded by
   LOAD_B1 or not: a last panel of at most half its width (40 channels as 32 + 8) runs half the FMAs
   (tv_pconv_half##R: 6-10% of MobileNetV3's 40- and 48-channel 1x1 layers on a Cascade Lake Xeon), its hi
   sums zero. A function of its own, not inlined: as a branch in the tile's, it cost the whole-panel loop
   registers (5% on 7 x 7 layers). */
#define TV_PCONV_ACC_LO(r) tv_vf lo##r = {0}; const float* p##r = blocked + at[r];
#define TV_PCONV_PUT_LO(r) sums[r] = lo##r;
#define TV_PCONV_GET_LO(r) lo##r = sums[r];
#define TV_PCONV_TAPS(R, FMA, LOAD_B1)                                                               \
    for (int64_t t = 0; t < count; ++t) {                                                            \
      const int64_t d = taps[t];                                                                     \
      if (ahead) {                                                                                   \
        _Pragma("GCC unroll 16") for (int l = 0; l < TV_VCONV_BLOCK * TV_VGEMM_NR * 4; l += 64)       \
          __builtin_prefetch((const char*)(ahead + t * TV_VCONV_BLOCK * TV_VGEMM_NR) + l, 0, 2);      \
      }                                                                                              \
      _Pragma("GCC unroll 16")                                                                       \
      for (int ci = 0; ci < TV_VCONV_BLOCK; ++ci, w += TV_VGEMM_NR) {                                \
        const tv_vf b0 = TV_VLOAD(w);                                                                \
        LOAD_B1;                                                                                     \
        TV_VROWS##R(FMA)                                                                             \
      }                                                                                              \
    }
#define TV_PCONV_KEEP(r) TV_VSTORE(buf[r], lo##r); TV_VSTORE(buf[r] + TV_VLANES, hi##r);
#define TV_PCONV_LOAD(r) lo##r += TV_VLOAD(acc_in + r * TV_VGEMM_NR);                                 \
                         hi##r += TV_VLOAD(acc_in + r * TV_VGEMM_NR + TV_VLANES);
#define TV_PCONV_SAVE(r) TV_VSTORE(acc_out + r * TV_VGEMM_NR, lo##r);                                 \
                         TV_VSTORE(acc_out + r * TV_VGEMM_NR + TV_VLANES, hi##r);
#define TV_PCONV_BIAS(r) lo##r += bias_lo; hi##r += bias_hi;
#define TV_PCONV_RELU(r) TV_VRELU(lo##r); TV_VRELU(hi##r);
#define TV_PCONV_ACT(r) TV_VACT(lo##r, e) TV_VACT(hi##r, e)
#define TV_PCONV_RESIDUAL(r) lo##r += TV_VLOAD(buf[r]); hi##r += TV_VLOAD(buf[r] + TV_VLANES);
/* The finished tile (bias and relu applied) to the NCHW output, where a channel's R pixels are consecutive:
   where R fits a vector, each half of the tile (R pixels x TV_VLANES channels) is transposed in registers
   (tv_vtranspose; the rows past R are zeros) into one vector per channel, to which the residual is added
   and the activation applied as it is stored, R floats (tv_vstore_first). Else through a buffer of R floats
   per channel, stored (and the residual gathered into it) a float at a time: 14 x 32 scalar loads and
   stores per AVX-512 tile, where the transposition is 64 shuffles. */
#define TV_PCONV_TLO(r) t[r] = lo##r;
#define TV_PCONV_THI(r) t[r] = hi##r;
#if TV_CONV_MR <= TV_VLANES
#define TV_PCONV_STORE(R)                                                                            \
    const float* res = e.residual ? e.residual + o0 * pixels + first : NULL;                         \
    tv_vf t[TV_VLANES];                                                                              \
    for (int r = R; r < TV_VLANES; ++r) t[r] = (tv_vf){0};                                           \
    TV_VROWS##R(TV_PCONV_TLO)                                                                        \
    tv_vtranspose(t);                                                                                \
    tv_pconv_channels(t, 0, channels, rows, pixels, &e, res, out + o0 * pixels + first);             \
    if (channels > TV_VLANES) {                                                                      \
      TV_VROWS##R(TV_PCONV_THI)                                                                      \
      for (int r = R; r < TV_VLANES; ++r) t[r] = (tv_vf){0};                                         \
      tv_vtranspose(t);                                                                              \
      tv_pconv_channels(t, TV_VLANES, channels, rows, pixels, &e, res, out + o0 * pixels + first);   \
    }
#else
#define TV_PCONV_STORE(R)                                                                            \
    float buf[R][TV_VGEMM_NR];                                                                       \
    if (e.residual) { /* gathered into the tile's layout (NCHW: R floats per channel), added in registers */ \
      if (rows < R || channels < TV_VGEMM_NR) memset(buf, 0, sizeof(buf));                           \
      for (int64_t i = 0; i < channels; ++i) {                                                       \
        const float* from = e.residual + (o0 + i) * pixels + first;                                  \
        for (int64_t j = 0; j < rows; ++j) buf[j][i] = from[j];                                      \
      }                                                                                              \
      TV_VROWS##R(TV_PCONV_RESIDUAL)                                                                 \
    }                                                                                                \
    if (e.act) { TV_VROWS##R(TV_PCONV_ACT) }                                                         \
    TV_VROWS##R(TV_PCONV_KEEP)                                                                       \
    if (rows == R) { /* a whole tile: R floats per channel, no test per float */                     \
      for (int64_t i = 0; i < channels; ++i) {                                                       \
        float* d = out + (o0 + i) * pixels + first;                                                  \
        _Pragma("GCC unroll 16") for (int j = 0; j < R; ++j) d[j] = buf[j][i];                       \
      }                                                                                              \
      return;                                                                                        \
    }                                                                                                \
    for (int64_t i = 0; i < channels; ++i)                                                           \
      for (int64_t j = 0; j < rows; ++j) out[(o0 + i) * pixels + first + j] = buf[j][i];
#endif
/* Channels c0 .. min(c0 + TV_VLANES, channels) of a transposed tile half (t[i]: channel c0 + i's ``rows``
   pixels) to d (channel 0's first pixel; channels ``pixels`` floats apart), with ``res`` (laid out as d;
   unless NULL) added and e's activation applied. */
static inline void tv_pconv_channels(const tv_vf* t, int64_t c0, int64_t channels, int64_t rows, int64_t pixels,
                                     const tv_conv_epilogue* e, const float* res, float* d) {
  const int64_t end = channels - c0 < TV_VLANES ? channels - c0 : TV_VLANES;
  for (int64_t i = 0; i < end; ++i) {
    tv_vf v = t[i];
    if (res) {
      tv_vf r;
      tv_vload_first(&r, res + (c0 + i) * pixels, rows);
      v += r;
    }
    if (e->act) TV_VACT(v, *e)
    tv_vstore_first(d + (c0 + i) * pixels, &v, rows);
  }
}
/* The tile's sums start from acc_in (the tile's R x NR partial sums over the taps before, as
   TV_PCONV_SAVE left them) unless NULL, and go to acc_out (the same layout) unless NULL, else, the
   reduction complete, through the bias and relu (or the activation and residual of epi,
   tv_conv_epilogue) to out: ``rows`` (<= R) output pixels from ``first`` (the rows past them repeat a
   pixel and are not stored), channels o0 .. min(o0 + NR, o). */
#define TV_PCONV_TILE(R)                                                                             \
  __attribute__((noinline)) static void tv_pconv_half##R(const float* blocked, const int64_t* at,    \
      const int64_t* taps, int64_t count, const float* w, const float* ahead, tv_vf* sums) {         \
    TV_VROWS##R(TV_PCONV_ACC_LO)                                                                     \
    TV_PCONV_TAPS(R, TV_PCONV_FMA_LO, (void)0)                                                       \
    TV_VROWS##R(TV_PCONV_PUT_LO)                                                                     \
  }                                                                                                  \
  static void tv_pconv_tile##R(const float* blocked, const int64_t* at, const int64_t* taps,         \
      int64_t count, const float* w, const float* ahead, int64_t first, int64_t rows, int64_t pixels, \
      int64_t o0, int64_t o, const float* acc_in, float* acc_out, const float* bias, int relu,       \
      const tv_conv_epilogue* epi, float* out) {                                                     \
    TV_VROWS##R(TV_PCONV_ACC)                                                                        \
    if (o - o0 <= TV_VLANES) {                                                                       \
      tv_vf sums[R];                                                                                 \
      tv_pconv_half##R(blocked, at, taps, count, w, ahead, sums);                                    \
      TV_VROWS##R(TV_PCONV_GET_LO)                                                                   \
    } else {                                                                                         \
      TV_PCONV_TAPS(R, TV_PCONV_FMA, const tv_vf b1 = TV_VLOAD(w + TV_VLANES))                       \
    }                                                                                                \
    if (acc_in) { TV_VROWS##R(TV_PCONV_LOAD) }                                                       \
    if (acc_out) { TV_VROWS##R(TV_PCONV_SAVE) return; }                                              \
    const tv_vf bias_lo = TV_VLOAD(bias), bias_hi = TV_VLOAD(bias + TV_VLANES);                      \
    TV_VROWS##R(TV_PCONV_BIAS)                                                                       \
    if (relu) { TV_VROWS##R(TV_PCONV_RELU) }                                                         \
    const tv_conv_epilogue e = *epi; /* (a copy: the stores to out could alias its floats) */        \
    const int64_t channels = o - o0 < TV_VGEMM_NR ? o - o0 : TV_VGEMM_NR;                            \
    TV_PCONV_STORE(R)                                                                                \
  }
#define TV_PCONV_TILE_OF(R) TV_PCONV_TILE(R)
#define TV_PCONV_NAME(R) TV_PCONV_NAME_(R)
#define TV_PCONV_NAME_(R) tv_pconv_tile##R
TV_PCONV_TILE_OF(TV_CONV_MR)
/* The tile one pixel shorter (TV_PCONV_SHORT rows): the pixels are dealt out evenly, ceil(P / MR) tiles
   of MR or MR - 1 pixels where they fit (7 x 7 = 49 pixels at MR 6: four tiles of 6 and five of 5, not
   eight of 6 and one of 1: 5 of 54 rows repeated, a tenth of the layer's work). */
#if TV_CONV_MR == 2
#define TV_PCONV_SHORT 1
#elif TV_CONV_MR == 3
#define TV_PCONV_SHORT 2
#elif TV_CONV_MR == 4
#define TV_PCONV_SHORT 3
#elif TV_CONV_MR == 5
#define TV_PCONV_SHORT 4
#elif TV_CONV_MR == 6
#define TV_PCONV_SHORT 5
#elif TV_CONV_MR == 7
#define TV_PCONV_SHORT 6
#elif TV_CONV_MR == 8
#define TV_PCONV_SHORT 7
#elif TV_CONV_MR == 9
#define TV_PCONV_SHORT 8
#elif TV_CONV_MR == 10
#define TV_PCONV_SHORT 9
#elif TV_CONV_MR == 11
#define TV_PCONV_SHORT 10
#elif TV_CONV_MR == 12
#define TV_PCONV_SHORT 11
#elif TV_CONV_MR == 13
#define TV_PCONV_SHORT 12
#elif TV_CONV_MR == 14
#define TV_PCONV_SHORT 13
#endif
#ifdef TV_PCONV_SHORT
TV_PCONV_TILE_OF(TV_PCONV_SHORT)
#endif


/* n consecutive pixels of a whole block of planes (s: the first plane's first pixel) to d, each pixel's
   B channels in a row: 8 pixels at a time through tv_v8_transpose (the last 8 overlapping the ones
   before), a float at a time when there are fewer (as every pixel was: 28% of a 1 x 1 layer's time,
   240 -> 40 channels at 14 x 14, on a Cascade Lake Xeon). */
static inline void tv_pconv_block_pixels(float* d, const float* s, int64_t n, int64_t plane) {
#if TV_VCONV_BLOCK == 8
  if (n >= 8) {
    for (int64_t ix = 0;; ix += 8) {
      if (ix > n - 8) ix = n - 8;
      tv_v8f r[8];
      for (int ci = 0; ci < 8; ++ci) r[ci] = *(const tv_v8fu*)(s + ci * plane + ix);
      tv_v8_transpose(r);
      for (int q = 0; q < 8; ++q) *(tv_v8fu*)(d + (ix + q) * 8) = r[q];
      if (ix == n - 8) return;
    }
  }
#endif
  for (int64_t ix = 0; ix < n; ++ix)
    _Pragma("GCC unroll 16") for (int ci = 0; ci < TV_VCONV_BLOCK; ++ci) d[ix * TV_VCONV_BLOCK + ci] = s[ci * plane + ix];
}

/* Block cb of the image x (c x h x w) into ``blocked`` (ceil(c / B) x hp x wp x B floats), zero padded: pt
   rows and pl columns before the image, the rest after it. Pixel by pixel, its B channels in a row (one
   store stream; channel by channel, each plane of the block was written B times, once per channel, at
   a stride of B floats, after a memset of the whole block), only the borders zeroed apart. */
static void tv_pconv_block(const float* x, int64_t cb, int64_t c, int64_t h, int64_t w, int64_t pt, int64_t pl,
                           int64_t hp, int64_t wp, float* blocked) {
  const int64_t row = wp * TV_VCONV_BLOCK, plane = h * w;
  float* block = blocked + cb * hp * row;
  const int64_t count = c - cb * TV_VCONV_BLOCK < TV_VCONV_BLOCK ? c - cb * TV_VCONV_BLOCK : TV_VCONV_BLOCK;
  const int64_t top = pt < hp ? pt : hp, rows = h < hp - top ? h : hp - top;
  const int64_t left = pl < wp ? pl : wp, cols = w < wp - left ? w : wp - left;
  tv_vconv_zero_frame(block, hp, wp, TV_VCONV_BLOCK, top, rows, left, cols);
  const int64_t whole = left == 0 && cols == wp && cols == w; /* (rows follow each other in both) */
  for (int64_t iy = 0; iy < rows; iy += whole ? rows : 1) {
    float* d = block + (top + iy) * row + left * TV_VCONV_BLOCK;
    const float* s = x + cb * TV_VCONV_BLOCK * plane + iy * w;
    const int64_t n = whole ? rows * cols : cols;
    if (count == TV_VCONV_BLOCK) {
      tv_pconv_block_pixels(d, s, n, plane);
    } else {
      for (int64_t ix = 0; ix < n; ++ix)
        for (int ci = 0; ci < TV_VCONV_BLOCK; ++ci) d[ix * TV_VCONV_BLOCK + ci] = ci < count ? s[ci * plane + ix] : 0.0f;
    }
  }
}

/* The lines of a tile's outputs (channels o0 .. min(o0 + NR, o), ``rows`` pixels from ``first``; each
   channel's pixels are consecutive, ``pixels`` floats from the next's) and of its residual (unless NULL),
   fetched into the cache ahead of the tile's last run, whose reduction then hides their latency: at a batch
   whose outputs outgrow L2 the epilogue had waited on them (ResNet-18's 64-channel 3x3 layers at batch 8:
   4-5% of the layer with a residual, 1-2% without, on Zen 4). Not for 1x1 kernels, whose last run can be
   a few steps long and whose outputs were not late (the prefetches cost 2-10% there). */
static inline void tv_pconv_fetch_outputs(const float* out, const float* residual, int64_t o0, int64_t o,
                                          int64_t pixels, int64_t first, int64_t rows) {
  const int64_t channels = o - o0 < TV_VGEMM_NR ? o - o0 : TV_VGEMM_NR;
  for (int64_t i = 0; i < channels; ++i) {
    const int64_t at = (o0 + i) * pixels + first;
    __builtin_prefetch(out + at, 1, 3);
    __builtin_prefetch(out + at + rows - 1, 1, 3);  /* (the same line or the next one) */
    if (residual) {
      __builtin_prefetch(residual + at, 0, 3);
      __builtin_prefetch(residual + at + rows - 1, 0, 3);
    }
  }
}

/* A chunk is a range of panels x a range of tiles of pixels, the tiles of a group of images in one
   sequence (the panels split first when the weights are larger than the images, so that each panel's
   weights are read by one chunk, else the tiles; about TV_VCONV_CHUNKS chunks per thread, tv_team_run:
   a thread whose core is shared with other work takes fewer). Within a chunk the reduction runs in runs of ``span`` channel blocks whose slice of
   a panel fills at most half of L1d: the slice meets every tile of the chunk from L1 (a whole panel, 36
   to 295 KB on ResNet-18's 3x3 layers, was streamed from L2 for every tile), the tiles' partial sums kept
   in ``acc`` between runs (R x NR floats per tile, stored and reloaded as whole vectors). */
typedef struct {
  const float* blocked;  /* every image's blocked copy, ``image`` floats apart */
  const float* packed;
  const float* b;
  float* out;
  float* acc;
  const float* residual;  /* (NULL without one) */
  const int64_t* at;    /* each output pixel's offset in an image's blocked copy */
  const int64_t* taps;  /* each tap's (channel block, ky, kx) offset from a pixel's, in the panel's order */
  int64_t cblocks, span, pixels, o, k, panels, qblocks, tiles, pchunks, qchunks, window, image;
  int relu;
  tv_conv_epilogue epi;  /* (the activation; its residual is set per image) */
} tv_pconv_job;

static void tv_pconv_chunk(void* arg, int64_t i) {
  const tv_pconv_job* j = (const tv_pconv_job*)arg;
  const int64_t pc = i % j->pchunks, qc = i / j->pchunks;
  const int64_t p0 = pc * j->panels / j->pchunks, p1 = (pc + 1) * j->panels / j->pchunks;
  const int64_t q0 = qc * j->tiles / j->qchunks, q1 = (qc + 1) * j->tiles / j->qchunks;
  tv_conv_epilogue epi = j->epi;
  for (int64_t cb0 = 0; cb0 < j->cblocks; cb0 += j->span) {
    const int64_t cb1 = cb0 + j->span < j->cblocks ? cb0 + j->span : j->cblocks;
    const int64_t* taps = j->taps + cb0 * j->window;
    const int64_t count = (cb1 - cb0) * j->window;
    for (int64_t p = p0; p < p1; ++p) {
      const float* w = j->packed + (p * j->k + cb0 * j->window * TV_VCONV_BLOCK) * TV_VGEMM_NR;
      /* the slice after this one, as long: the next panel's, else the next run's first panel's when that
         run is whole */
      const float* next = p + 1 < p1 ? w + j->k * TV_VGEMM_NR
                        : cb1 + j->span <= j->cblocks
                        ? j->packed + (p0 * j->k + cb1 * j->window * TV_VCONV_BLOCK) * TV_VGEMM_NR : NULL;
      for (int64_t tile = q0; tile < q1; ++tile) {
        const float* ahead = tile == q0 ? next : NULL; /* (by the chunk's first tile: the others find it there) */
        float* acc = j->acc + (p * j->tiles + tile) * (TV_CONV_MR * TV_VGEMM_NR);
        const int64_t image = tile / j->qblocks, qb = tile % j->qblocks;
        const float* blocked = j->blocked + image * j->image;
        float* dst = j->out + image * j->o * j->pixels;
        epi.residual = j->residual ? j->residual + image * j->o * j->pixels : NULL;
        const int64_t first = qb * j->pixels / j->qblocks, rows = (qb + 1) * j->pixels / j->qblocks - first;
        const float* acc_in = cb0 > 0 ? acc : NULL;
        float* acc_out = cb1 < j->cblocks ? acc : NULL;
        if (acc_out == NULL && j->window > 1)
          tv_pconv_fetch_outputs(dst, epi.residual, p * TV_VGEMM_NR, j->o, j->pixels, first, rows);
        if (rows == TV_CONV_MR) {
          TV_PCONV_NAME(TV_CONV_MR)(blocked, j->at + first, taps, count, w, ahead, first, rows, j->pixels,
                                     p * TV_VGEMM_NR, j->o, acc_in, acc_out, j->b + p * TV_VGEMM_NR, j->relu, &epi, dst);
          continue;
        }
#ifdef TV_PCONV_SHORT /* (rows < MR = 1 cannot be) */
        int64_t short_at[TV_PCONV_SHORT]; /* its rows past the pixels repeat the last one */
        for (int64_t r = 0; r < TV_PCONV_SHORT; ++r) short_at[r] = j->at[first + (r < rows ? r : rows - 1)];
        TV_PCONV_NAME(TV_PCONV_SHORT)(blocked, short_at, taps, count, w, ahead, first, rows, j->pixels, p * TV_VGEMM_NR,
                                      j->o, acc_in, acc_out, j->b + p * TV_VGEMM_NR, j->relu, &epi, dst);
#endif
      }
    }
  }
}

/* The blocked copies of a group of images, (image, channel block) units in chunks on the pool. */
typedef struct {
  const float* x;
  float* blocked;
  int64_t c, h, w, pt, pl, hp, wp, cblocks, units, chunks;
} tv_pconv_copy_job;

static void tv_pconv_copy_chunk(void* arg, int64_t i) {
  const tv_pconv_copy_job* j = (const tv_pconv_copy_job*)arg;
  for (int64_t u = i * j->units / j->chunks; u < (i + 1) * j->units / j->chunks; ++u) {
    const int64_t image = u / j->cblocks, cb = u % j->cblocks;
    tv_pconv_block(j->x + image * j->c * j->h * j->w, cb, j->c, j->h, j->w, j->pt, j->pl, j->hp, j->wp,
                   j->blocked + image * j->cblocks * j->hp * j->wp * TV_VCONV_BLOCK);
  }
}

/* One pixel per image (squeeze-and-excitation's 1x1 convolutions of a 1x1 image; PackWeights packs them):
   the panels of a 1x1 weight are nn.dense_packed's, over the channels padded to whole blocks, so the batch
   is one product of n rows that reads the weights once for all images, by the products' tiles for few
   rows (through the products part in a library part: TV_LINKED_PRODUCTS), then the epilogue. The host's
   BLAS GEMV per image it replaces took 4.7 us for 576 x 144 (a Zen 5 EPYC), the packed product 1 us per row
   at batch 3. (TV_VPW_GEMV: the pointwise kernel's GEMV per image, tv_vpointwise.h.) */
#ifdef TV_LINKED_PRODUCTS
extern __typeof__(tv_gemm_packed_f32) tvl_gemm_packed_f32 __attribute__((visibility("hidden")));
extern __typeof__(tv_gemm_f32) tvl_gemm_f32 __attribute__((visibility("hidden")));
#define TV_PCONV_PRODUCT tvl_gemm_packed_f32
#define TV_VPW_GEMV tvl_gemm_f32
#else
#define TV_PCONV_PRODUCT tv_gemm_packed_f32
#define TV_VPW_GEMV tv_gemm_f32
#endif
static int32_t tv_pconv_one_pixel(int64_t n, int64_t c, int64_t o, const float* x, const float* packed,
    const float* bias, int64_t has_bias, int64_t relu, int64_t act, float alpha, float beta, float lo, float hi,
    const float* residual, int64_t has_residual, float* out) {
  const int64_t k = (c + TV_VCONV_BLOCK - 1) / TV_VCONV_BLOCK * TV_VCONV_BLOCK;
  float* rows = NULL;
  if (k != c) {  /* the images' channels padded with zeros, as the panels' rows past c are */
    rows = (float*)malloc(sizeof(float) * (size_t)(n * k));  /* (malloc and free only: aot/dynamic.py) */
    if (rows == NULL) return TV_ERROR_OUT_OF_MEMORY;
    for (int64_t b = 0; b < n; ++b) {
      memcpy(rows + b * k, x + b * c, sizeof(float) * (size_t)c);
      memset(rows + b * k + c, 0, sizeof(float) * (size_t)(k - c));
    }
  }
  const int32_t status = TV_PCONV_PRODUCT(n, o, k, TV_VGEMM_NR, rows != NULL ? rows : x, packed, out);
  free(rows);
  if (status == 0) tv_conv_finish_pixels(n, o, bias, has_bias, relu, act, alpha, beta, lo, hi, residual, has_residual, out);
  return status;
}

/* ``bias`` is read only when ``has_bias``; ``act`` ... ``has_residual``: as tv_conv2d_direct_act_f32's.
   Returns TV_ERROR_OUT_OF_MEMORY when the blocked copy cannot be allocated. */
__attribute__((unused)) static int32_t tv_conv2d_packed_act_f32(int64_t n, int64_t c, int64_t h, int64_t w,
    int64_t o, int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw,
    int64_t pt, int64_t pl, const float* x, const float* packed, const float* bias, int64_t has_bias, int64_t relu,
    int64_t act, float alpha, float beta, float lo, float hi, const float* residual, int64_t has_residual,
    float* out) {
  if (n <= 0 || o <= 0 || oh <= 0 || ow <= 0) return 0;
  if (h == 1 && w == 1 && kh == 1 && kw == 1 && oh == 1 && ow == 1 && pt == 0 && pl == 0)
    return tv_pconv_one_pixel(n, c, o, x, packed, bias, has_bias, relu, act, alpha, beta, lo, hi, residual,
                              has_residual, out);
  const int64_t cblocks = (c + TV_VCONV_BLOCK - 1) / TV_VCONV_BLOCK, pixels = oh * ow, window = kh * kw;
  const int64_t qblocks = (pixels + TV_CONV_MR - 1) / TV_CONV_MR;
  const int64_t hp = (oh - 1) * sh + (kh - 1) * dh + 1, wp = (ow - 1) * sw + (kw - 1) * dw + 1;
  const int64_t k = cblocks * TV_VCONV_BLOCK * window, panels = (o + TV_VGEMM_NR - 1) / TV_VGEMM_NR;
  /* channel blocks per run: a panel's slice of them fills at most half of L1d, but a run is at least
     TV_PCONV_RUN_STEPS reduction steps long (each run stores and reloads every tile's 2 MR sums) */
  int64_t span = (TV_L1D / 2) / (window * TV_VCONV_BLOCK * TV_VGEMM_NR * (int64_t)sizeof(float));
  const int64_t least = (TV_PCONV_RUN_STEPS + window * TV_VCONV_BLOCK - 1) / (window * TV_VCONV_BLOCK);
  span = span < least ? least : span;
  span = span > cblocks ? cblocks : span;
  const int threads = tv_gemm_parallel((double)n * o * pixels * k) ? tv_omp_max_threads() : 1;
  /* The images go in groups, each copied then convolved by one job: as many as their blocked copies fill
     half of L2, or as the weights outweigh (a deep layer's 9.4 MB of weights read once for the group
     instead of once per image, its 7 x 7 copies then read back from L3); else one image at a time, its
     copy still in the caches when its tiles read it (all the copies of a batch of 56 x 56 images first
     made the stride-2 layers 6-7% slower at 1 thread). */
  const int64_t image = cblocks * hp * wp * TV_VCONV_BLOCK, weights = panels * k * TV_VGEMM_NR;
  int64_t group = (TV_L2 / 2) / ((int64_t)sizeof(float) * image);
  group = group > weights / image ? group : weights / image;
  group = group < 1 ? 1 : group > n ? n : group;
  const int64_t tiles = group * qblocks;
  const int64_t want = threads > 1 ? (int64_t)TV_VCONV_CHUNKS * threads : 1;
  /* What is split first is read by one chunk only: the panels when the weights outweigh the group's
     copies (a deep layer), else the tiles (a 56 x 56 image: its pixels, a run slice from L3, then meet
     every panel from L2, where split by panels each chunk of one panel read them from L3 again) */
  int64_t pchunks = panels < want ? panels : want, qchunks = (want + pchunks - 1) / pchunks;
  if (weights < group * image) {
    qchunks = tiles < want ? tiles : want;
    pchunks = (want + qchunks - 1) / qchunks;
    pchunks = pchunks < panels ? pchunks : panels;
  }
  /* A run of a chunk reads its tiles' pixels in ``span`` blocks (about sh x sw input pixels per output
     pixel) and their partial sums: the tiles of several small images share a chunk while that fits half
     of L2; a larger image keeps a chunk (at least) of its own, as one whole image per chunk on one thread
     had been. */
  const int64_t tile_bytes = TV_CONV_MR * (span * TV_VCONV_BLOCK * sh * sw + TV_VGEMM_NR) * (int64_t)sizeof(float);
  int64_t most = (TV_L2 / 2) / tile_bytes;
  most = most > qblocks ? most : qblocks;
  const int64_t fit = (tiles + most - 1) / most;
  qchunks = qchunks > fit ? qchunks : fit;
  qchunks = qchunks < tiles ? qchunks : tiles;
  /* a group's blocked copies, the bias of every panel's channels (zeros past o and without a bias), and
     the tiles' partial sums when the reduction takes several runs; then the pixels' and the taps' offsets */
  const int64_t sums = span < cblocks ? panels * tiles * TV_CONV_MR * TV_VGEMM_NR : 0;
  float* blocked = (float*)malloc(sizeof(float) * (size_t)(group * image + panels * TV_VGEMM_NR + sums));
  int64_t* at = (int64_t*)malloc(sizeof(int64_t) * (size_t)(pixels + cblocks * window));
  if (blocked == NULL || at == NULL) {
    free(blocked);
    free(at);
    return TV_ERROR_OUT_OF_MEMORY;
  }
  float* b = blocked + group * image;
  for (int64_t i = 0; i < panels * TV_VGEMM_NR; ++i) b[i] = has_bias && i < o ? bias[i] : 0.0f;
  for (int64_t q = 0; q < pixels; ++q) at[q] = ((q / ow) * sh * wp + (q % ow) * sw) * TV_VCONV_BLOCK;
  int64_t* taps = at + pixels;
  for (int64_t cb = 0, t = 0; cb < cblocks; ++cb)
    for (int64_t ky = 0; ky < kh; ++ky)
      for (int64_t kx = 0; kx < kw; ++kx) taps[t++] = ((cb * hp + ky * dh) * wp + kx * dw) * TV_VCONV_BLOCK;
  tv_pconv_job job = {blocked, packed, b, out, b + panels * TV_VGEMM_NR, NULL, at, taps, cblocks, span, pixels, o,
                      k, panels, qblocks, tiles, pchunks, qchunks, window, image, relu != 0,
                      {NULL, 0, 0, (int)act, alpha, beta, lo, hi, NULL}};
  for (int64_t g0 = 0; g0 < n; g0 += group) {
    const int64_t count = n - g0 < group ? n - g0 : group;
    /* the copy on the pool, in chunks of (image, channel block) units, then the tiles. (One image's copy
       had run on the caller alone, 1-3% of a layer at 2 threads with the worker idle: split, ResNet-18 at
       batch 1 ran 3% faster at 2 threads, benchmarks/model_against.py; a worker preempted inside a copy
       chunk holds the caller no longer than inside a chunk of tiles.) */
    tv_pconv_copy_job copy = {x + g0 * c * h * w, blocked, c, h, w, pt, pl, hp, wp, cblocks, count * cblocks, 1};
    copy.chunks = tv_team_chunks(copy.units, hp * wp * TV_VCONV_BLOCK, threads); /* (one on one thread) */
    tv_team_run(copy.chunks, threads, tv_pconv_copy_chunk, &copy);
    job.out = out + g0 * o * pixels;
    job.residual = has_residual ? residual + g0 * o * pixels : NULL;
    job.tiles = count * qblocks; /* (a last group of fewer images: as many chunks, each shorter) */
    job.qchunks = qchunks < job.tiles ? qchunks : job.tiles;
    tv_team_run(pchunks * job.qchunks, threads, tv_pconv_chunk, &job);
  }
  free(blocked);
  free(at);
  return 0;
}

/* The packed convolution with bias and relu only. */
__attribute__((unused)) static int32_t tv_conv2d_packed_f32(int64_t n, int64_t c, int64_t h, int64_t w, int64_t o,
    int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt,
    int64_t pl, const float* x, const float* packed, const float* bias, int64_t has_bias, int64_t relu, float* out) {
  return tv_conv2d_packed_act_f32(n, c, h, w, o, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl, x, packed, bias, has_bias,
                                  relu, 0, 1.0f, 0.0f, 0.0f, 0.0f, bias, 0, out);
}

#endif /* TV_VCONV_H */
