/* The float32 pointwise convolution (1x1 kernel, unit strides, no padding; NCHW data, OIHW weights):
   tv_conv2d_pointwise_act_f32, written once for every vector ISA in the vector extensions of tv_vgemm.h.

   Per image it is the product out (O x P) = W (O x C) . x (C x P), P = H x W pixels, contiguous in both x
   and out. A register tile is R output channels x NR pixels (NR = TV_VGEMM_NR, two vectors; R =
   TV_VGEMM_MR or 4 for the channel tails, split as the direct kernel's, tv_vconv_blocks): per input
   channel it loads two vectors of x's row straight from the image (no packed copy of it: a row of x is
   contiguous) and broadcasts R weights (rows of W in place), 2 R FMAs. The epilogue (tv_conv_epilogue:
   a per-channel bias that starts the sums, relu, or a residual of the output's layout and a clamped
   affine activation) is applied in registers and the tile stored straight into out's rows: no buffer
   and no second pass over the output, which the product then a generated epilogue had cost.
   Tails: a channel past O repeats the last one (not stored); the last pixel block of an image with at
   least NR pixels starts NR before its end (overlapping the one before: every lane a real pixel, so the
   residual is read in place), its new columns stored through a small buffer; an image of fewer than NR
   pixels is first copied into rows of NR floats (zero padded) and its epilogue applied float by float.
   One pixel per image (P = 1: squeeze-and-excitation's layers at 1 x 1) is a GEMV per image instead
   (tv_vpw_vectors, the host's BLAS): the tile would waste NR - 1 of its lanes.
   Included by tv_gemm.h (TV_PACKED_KERNELS), after tv_vconv.h (tv_conv_epilogue, tv_vconv_blocks,
   tv_vconv_chunks, TV_VRELU). */
#ifndef TV_VPOINTWISE_H
#define TV_VPOINTWISE_H

#define TV_VPW_ACC(i) tv_vf lo##i = TV_VSPLAT(start[i]), hi##i = lo##i;
#define TV_VPW_FMA(i) { const tv_vf a = TV_VSPLAT(wt[i][k]); lo##i += a * b0; hi##i += a * b1; }
#define TV_VPW_RELU(i) TV_VRELU(lo##i); TV_VRELU(hi##i);
#define TV_VPW_RESIDUAL(i) lo##i += TV_VLOAD(e.residual + row[i] + x0);                                 \
                           hi##i += TV_VLOAD(e.residual + row[i] + x0 + TV_VLANES);
#define TV_VPW_ACT(i) TV_VACT(lo##i, e) TV_VACT(hi##i, e)
#define TV_VPW_STORE(i) TV_VSTORE(out + row[i] + x0, lo##i); TV_VSTORE(out + row[i] + x0 + TV_VLANES, hi##i);
#define TV_VPW_KEEP(i) TV_VSTORE(tile[i], lo##i); TV_VSTORE(tile[i] + TV_VLANES, hi##i);
/* The tiles of R channels from o0 over the pixel blocks [s0, s1) of NR pixels: x's rows ``ldx`` floats
   apart (P, or NR for the padded copy), out's (and the residual's) P apart; the channels' weights, bias
   and the epilogue read once for the run (per tile, that setup had cost as much as a 16-channel
   reduction). A block starts at its first pixel, or NR before the image's end for the last one (then it
   stores its pixels past the block before). With every lane a real pixel (P >= NR) the whole epilogue is
   applied to the accumulators, else the bias only, the rest as the floats are stored. */
#define TV_VPW_TILE(R)                                                                               \
  static void tv_vpw_tile##R(const float* x, int64_t ldx, const float* weights, int64_t c, int64_t o, \
                             int64_t o0, int64_t s0, int64_t s1, int64_t pixels,                     \
                             const tv_conv_epilogue* epi, float* out) {                              \
    const tv_conv_epilogue e = *epi; /* (a copy: the stores to out could alias its floats) */        \
    const int in_registers = pixels >= TV_VGEMM_NR, whole = o0 + R <= o;                             \
    const float* wt[R];                                                                              \
    float start[R];                                                                                  \
    int64_t row[R];                                                                                  \
    for (int i = 0; i < R; ++i) {                                                                    \
      const int64_t oc = o0 + i < o ? o0 + i : o - 1;                                                \
      wt[i] = weights + oc * c;                                                                      \
      start[i] = e.bias ? e.bias[oc] : 0.0f;                                                         \
      row[i] = oc * pixels;                                                                          \
    }                                                                                                \
    for (int64_t s = s0; s < s1; ++s) {                                                              \
      const int64_t first = s * TV_VGEMM_NR;                                                         \
      const int64_t x0 = !in_registers ? 0 : first + TV_VGEMM_NR <= pixels ? first : pixels - TV_VGEMM_NR; \
      const int64_t skip = first - x0;                                                               \
      const int64_t cols = pixels - first < TV_VGEMM_NR ? pixels - first : TV_VGEMM_NR;              \
      TV_VROWS##R(TV_VPW_ACC)                                                                        \
      const float* b = x + x0;                                                                       \
      _Pragma("GCC unroll 4")                                                                        \
      for (int64_t k = 0; k < c; ++k, b += ldx) {                                                    \
        const tv_vf b0 = TV_VLOAD(b), b1 = TV_VLOAD(b + TV_VLANES);                                  \
        TV_VROWS##R(TV_VPW_FMA)                                                                      \
      }                                                                                              \
      if (in_registers) {                                                                            \
        if (e.relu) { TV_VROWS##R(TV_VPW_RELU) }                                                     \
        if (e.residual) { TV_VROWS##R(TV_VPW_RESIDUAL) }                                             \
        if (e.act) { TV_VROWS##R(TV_VPW_ACT) }                                                       \
        if (whole && skip == 0) { /* a whole tile: straight to out */                                \
          TV_VROWS##R(TV_VPW_STORE)                                                                  \
          continue;                                                                                  \
        }                                                                                            \
      }                                                                                              \
      float tile[R][TV_VGEMM_NR];                                                                    \
      TV_VROWS##R(TV_VPW_KEEP)                                                                       \
      tv_vpw_store(&tile[0][0], R, o, o0, first, skip, cols, pixels, in_registers, &e, out);         \
    }                                                                                                \
  }

/* The kept tile's channels inside o, ``cols`` pixels from column ``skip`` of the tile to out at ``at``;
   unless ``done``, with the epilogue after the bias (relu, or the residual and the activation). */
static void tv_vpw_store(const float* tile, int channels, int64_t o, int64_t o0, int64_t at, int64_t skip,
                         int64_t cols, int64_t pixels, int done, const tv_conv_epilogue* e, float* out) {
  for (int i = 0; i < channels && o0 + i < o; ++i) {
    const float* t = tile + i * TV_VGEMM_NR + skip;
    const int64_t base = (o0 + i) * pixels + at;
    for (int64_t j = 0; j < cols; ++j) {
      float v = t[j];
      if (!done) {
        if (e->relu) v = v <= 0.0f ? 0.0f : v;  /* (NaN stays: TV_VRELU) */
        if (e->residual) v += e->residual[base + j];
        v = tv_conv_act1(v, e);
      }
      out[base + j] = v;
    }
  }
}

#define TV_VPW_TILE_OF(R) TV_VPW_TILE(R)
#define TV_VPW_NAME(R) TV_VPW_NAME_(R)
#define TV_VPW_NAME_(R) tv_vpw_tile##R
TV_VPW_TILE(4)
#if TV_VGEMM_MR > 4
TV_VPW_TILE_OF(TV_VGEMM_MR)
#endif

/* One pixel per image: a GEMV per image, out[b] (o) = W x[b] (tv_gemm_f32 over the batch: the host's
   BLAS GEMV; one product over the batch, x (n x c) W^T, measured 1.2-1.8x slower at batch 8), then the
   epilogue over the n x o floats. In the library part of this kernel (c_emit.library_part, which defines
   TV_LINKED_PRODUCTS) the product is the products part's entry point, linked into the same library, not a
   second copy of the products' register tiles in this part (1.2-1.5 s of its 6.5 s compile on a Cascade
   Lake Xeon; TV_VPW_GEMV, declared in tv_vconv.h beside the packed convolution's product). */
static int32_t tv_vpw_vectors(int64_t n, int64_t c, int64_t o, const float* x, const float* weights,
    const float* bias, int64_t has_bias, int64_t relu, int64_t act, float alpha, float beta, float lo, float hi,
    const float* residual, int64_t has_residual, float* out) {
  const int32_t status = TV_VPW_GEMV(n, o, 1, c, weights, 0, 0, x, c, 0, out, 1.0f);
  if (status == 0) tv_conv_finish_pixels(n, o, bias, has_bias, relu, act, alpha, beta, lo, hi, residual, has_residual, out);
  return status;
}

/* The tiles of a call: (image, run of pixel blocks, channel block), channel blocks varying fastest, in
   contiguous ranges per chunk (tv_team_run; as the direct kernel's). A run's columns of x (``span``
   blocks of NR pixels, C rows) fill at most TV_VGEMM_L1_BYTES (half of L1d): every channel block reads
   them from L1. */
typedef struct {
  const float* x;  /* the images, or (fewer pixels than NR) their copy in rows of NR floats */
  const float* weights;
  const float* residual;
  float* out;
  tv_conv_epilogue epi;
  int64_t c, o, pixels, ldx, big, oblocks, xblocks, span, runs, tiles, chunks;
} tv_vpw_job;

static void tv_vpw_chunk(void* arg, int64_t i) {
  const tv_vpw_job* j = (const tv_vpw_job*)arg;
  const int64_t mr = TV_VGEMM_MR > 4 ? TV_VGEMM_MR : 4, p = j->pixels;
  const int64_t lo = i * j->tiles / j->chunks, hi = (i + 1) * j->tiles / j->chunks;
  tv_conv_epilogue e = j->epi;
  /* (the first tile's indices divided out once, the others counted) */
  int64_t ob = lo % j->oblocks, run = (lo / j->oblocks) % j->runs, image = lo / (j->oblocks * j->runs);
  for (int64_t t = lo; t < hi; ++t) {
    const int64_t o0 = ob < j->big ? ob * mr : j->big * mr + (ob - j->big) * 4;
    const float* x = j->x + image * j->c * j->ldx;
    float* out = j->out + image * j->o * p;
    const int64_t s0 = run * j->span, s1 = s0 + j->span < j->xblocks ? s0 + j->span : j->xblocks;
    e.residual = j->residual ? j->residual + image * j->o * p : NULL;
#if TV_VGEMM_MR > 4
    if (ob < j->big)
      TV_VPW_NAME(TV_VGEMM_MR)(x, j->ldx, j->weights, j->c, j->o, o0, s0, s1, p, &e, out);
    else
#endif
      tv_vpw_tile4(x, j->ldx, j->weights, j->c, j->o, o0, s0, s1, p, &e, out);
    if (++ob == j->oblocks) {
      ob = 0;
      if (++run == j->runs) run = 0, ++image;
    }
  }
}

/* x (n x c x p) by weights (o x c) into out (n x o x p), p = h x w. ``bias`` is read only when
   ``has_bias`` (callers without one pass any float pointer), ``residual`` (the output's shape) only when
   ``has_residual``; ``relu`` (not with an activation or residual), ``act``, ``alpha``...: as
   tv_conv2d_direct_act_f32's. Returns TV_ERROR_OUT_OF_MEMORY when the copy of images narrower than a
   tile cannot be allocated. */
__attribute__((unused)) static int32_t tv_conv2d_pointwise_act_f32(int64_t n, int64_t c, int64_t p, int64_t o,
    const float* x, const float* weights, const float* bias, int64_t has_bias, int64_t relu, int64_t act,
    float alpha, float beta, float lo, float hi, const float* residual, int64_t has_residual, float* out) {
  if (n <= 0 || o <= 0 || p <= 0) return 0;
  if (p == 1 && c > 0) return tv_vpw_vectors(n, c, o, x, weights, bias, has_bias, relu, act, alpha, beta, lo, hi,
                                            residual, has_residual, out);
  float* copy = NULL;
  int64_t ldx = p;
  if (c > 0 && p > 1 && p < TV_VGEMM_NR) {  /* (c = 0: no float of x is read, the epilogue of zeros) */
    copy = (float*)malloc(sizeof(float) * (size_t)(n * c * TV_VGEMM_NR));
    if (copy == NULL) return TV_ERROR_OUT_OF_MEMORY;
    for (int64_t r = 0; r < n * c; ++r)
      for (int64_t j = 0; j < TV_VGEMM_NR; ++j) copy[r * TV_VGEMM_NR + j] = j < p ? x[r * p + j] : 0.0f;
    x = copy, ldx = TV_VGEMM_NR;
  }
  int64_t big, fours;
  tv_vconv_blocks(o, &big, &fours);
  const int64_t xblocks = (p + TV_VGEMM_NR - 1) / TV_VGEMM_NR;
  int64_t span = TV_VGEMM_L1_BYTES / ((c > 1 ? c : 1) * TV_VGEMM_NR * (int64_t)sizeof(float));
  span = span < 1 ? 1 : span > xblocks ? xblocks : span;
  const int64_t runs = (xblocks + span - 1) / span;
  const int threads = tv_gemm_parallel((double)n * o * p * c) ? tv_omp_max_threads() : 1;
  tv_vpw_job job = {x, weights, has_residual ? residual : NULL, out,
                    {has_bias ? bias : NULL, relu != 0, 0, (int)act, alpha, beta, lo, hi, NULL},
                    c, o, p, ldx, big, big + fours, xblocks, span, runs, n * runs * (big + fours), 0};
  job.chunks = tv_vconv_chunks(job.tiles, threads);
  tv_team_run(job.chunks, threads, tv_vpw_chunk, &job);
  free(copy);
  return 0;
}

#endif /* TV_VPOINTWISE_H */
