/* Recurrent layers with ONNX's semantics: the library function of nn.lstm, nn.gru and nn.rnn
   (tensorvm/op/onnx_ops.py; see tv_lib.h). One call runs every direction over the whole sequence:
   per-row sequence lengths (a row's reverse direction starts at its own last step), initial states,
   LSTM peepholes and input_forget, GRU's linear_before_reset, clip, activations with alpha and beta,
   and layout 1 (batch first). The inputs are read into double arrays and the math runs in double, as
   the NumPy reference kernels do; the results are stored in the data's dtype. */
#include "tv_lib.h"

#include <math.h>

enum { TV_RNN_LSTM, TV_RNN_GRU, TV_RNN_RNN };

/* The activation codes, in the order of onnx_ops._ACTIVATIONS. */
enum {
  TV_ACT_SIGMOID, TV_ACT_TANH, TV_ACT_RELU, TV_ACT_AFFINE, TV_ACT_LEAKYRELU, TV_ACT_THRESHOLDEDRELU,
  TV_ACT_SCALEDTANH, TV_ACT_HARDSIGMOID, TV_ACT_ELU, TV_ACT_SOFTSIGN, TV_ACT_SOFTPLUS
};

typedef struct {
  int64_t code;
  double alpha, beta;
} tv_rnn_act;

static double tv_rnn_apply(tv_rnn_act f, double x) {
  switch (f.code) {
    case TV_ACT_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case TV_ACT_TANH: return tanh(x);
    case TV_ACT_RELU: return x <= 0.0 ? 0.0 : x; /* (np.maximum(x, 0): NaN stays NaN) */
    case TV_ACT_AFFINE: return f.alpha * x + f.beta;
    case TV_ACT_LEAKYRELU: return x >= 0.0 ? x : f.alpha * x;
    case TV_ACT_THRESHOLDEDRELU: return x > f.alpha ? x : 0.0;
    case TV_ACT_SCALEDTANH: return f.alpha * tanh(f.beta * x);
    case TV_ACT_HARDSIGMOID: {
      const double v = f.alpha * x + f.beta;
      return v < 0.0 ? 0.0 : (v > 1.0 ? 1.0 : v);
    }
    case TV_ACT_ELU: return x >= 0.0 ? x : f.alpha * (exp(x) - 1.0);
    case TV_ACT_SOFTSIGN: return x / (1.0 + fabs(x));
    default: return x > 0.0 ? x + log1p(exp(-x)) : log1p(exp(x)); /* TV_ACT_SOFTPLUS (exp never overflows) */
  }
}

/* A double passed as the int64 of its bits (the library call passes integers only). */
static double tv_rnn_double(int64_t bits) {
  double v;
  memcpy(&v, &bits, sizeof v);
  return v;
}

/* n elements of a float array of dtype code dtype, as doubles (0 for a dtype not handled). */
static int32_t tv_rnn_load(const void* p, int64_t dtype, int64_t n, double* out) {
  switch (dtype) {
#define TV_RNN_LOAD_CASE(CODE, T, S, F)                                                            \
  case CODE:                                                                                        \
    for (int64_t i = 0; i < n; i++) out[i] = (double)((const T*)p)[i];                              \
    return 0;
    TV_LIB_FLOAT16(TV_RNN_LOAD_CASE)
    TV_RNN_LOAD_CASE(TV_DTYPE_FLOAT32, float, f32, 1)
    TV_RNN_LOAD_CASE(TV_DTYPE_FLOAT64, double, f64, 1)
#undef TV_RNN_LOAD_CASE
    default: return TV_ERROR_DTYPE;
  }
}

static void tv_rnn_store(void* p, int64_t dtype, int64_t i, double v) {
  switch (dtype) {
#define TV_RNN_STORE_CASE(CODE, T, S, F) case CODE: ((T*)p)[i] = (T)v; break;
    TV_LIB_FLOAT16(TV_RNN_STORE_CASE)
    TV_RNN_STORE_CASE(TV_DTYPE_FLOAT32, float, f32, 1)
    TV_RNN_STORE_CASE(TV_DTYPE_FLOAT64, double, f64, 1)
#undef TV_RNN_STORE_CASE
    default: break;
  }
}

/* out[g] = bias[g] + sum_k m[g, k] v[k] for g < rows (m row-major, rows x cols). */
static void tv_rnn_matvec(const double* m, const double* v, const double* bias, int64_t rows, int64_t cols,
                          double* out) {
  for (int64_t g = 0; g < rows; g++) {
    double acc = bias != NULL ? bias[g] : 0.0;
    const double* row = m + g * cols;
    for (int64_t k = 0; k < cols; k++) acc += row[k] * v[k];
    out[g] = acc;
  }
}

/* A step of one batch row: new states (h, and c for LSTM) from x (input) and the old ones, in place.
   gx, gh: scratch of gates * hidden. */
static void tv_rnn_step(int64_t kind, const tv_rnn_act* act, const double* w, const double* r, const double* b,
                        const double* p, const double* x, double* h, double* c, int64_t input, int64_t hidden,
                        int64_t gates, int64_t input_forget, int64_t linear_before_reset, int64_t has_clip,
                        double clip, double* gx, double* gh) {
  const int64_t H = hidden;
#define TV_RNN_CLIP(v) (has_clip ? ((v) < -clip ? -clip : ((v) > clip ? clip : (v))) : (v))
  tv_rnn_matvec(w, x, b, gates * H, input, gx);      /* x W^T + Wb */
  tv_rnn_matvec(r, h, b + gates * H, gates * H, H, gh); /* h R^T + Rb */
  if (kind == TV_RNN_LSTM) {                       /* gates i, o, f, c; peepholes i, o, f */
    for (int64_t j = 0; j < H; j++) {
      const double ci = c[j];
      double i = TV_RNN_CLIP(gx[j] + gh[j] + p[j] * ci);
      i = tv_rnn_apply(act[0], i);
      double f = TV_RNN_CLIP(gx[2 * H + j] + gh[2 * H + j] + p[2 * H + j] * ci);
      f = input_forget ? 1.0 - i : tv_rnn_apply(act[0], f);
      double g = TV_RNN_CLIP(gx[3 * H + j] + gh[3 * H + j]);
      g = tv_rnn_apply(act[1], g);
      const double c_new = f * ci + i * g;
      double o = TV_RNN_CLIP(gx[H + j] + gh[H + j] + p[H + j] * c_new);
      o = tv_rnn_apply(act[0], o);
      c[j] = c_new;
      gx[j] = o * tv_rnn_apply(act[2], c_new); /* (gx[j] is not read again) */
    }
    for (int64_t j = 0; j < H; j++) h[j] = gx[j];
  } else if (kind == TV_RNN_GRU) { /* gates z, r, h */
    if (!linear_before_reset) {    /* (r * h) R_h^T: the reset gate first, then the product */
      double* rh = gh + 2 * H;     /* (replaces h R_h^T + Rb_h, computed again below) */
      double* reset_h = gx + gates * H; /* scratch of H more */
      for (int64_t j = 0; j < H; j++) {
        const double rg = tv_rnn_apply(act[0], TV_RNN_CLIP(gx[H + j] + gh[H + j]));
        reset_h[j] = rg * h[j];
      }
      tv_rnn_matvec(r + 2 * H * H, reset_h, b + gates * H + 2 * H, H, H, rh);
      for (int64_t j = 0; j < H; j++) {
        const double z = tv_rnn_apply(act[0], TV_RNN_CLIP(gx[j] + gh[j]));
        const double hh = tv_rnn_apply(act[1], TV_RNN_CLIP(gx[2 * H + j] + rh[j]));
        h[j] = (1.0 - z) * hh + z * h[j];
      }
    } else {
      for (int64_t j = 0; j < H; j++) {
        const double z = tv_rnn_apply(act[0], TV_RNN_CLIP(gx[j] + gh[j]));
        const double rg = tv_rnn_apply(act[0], TV_RNN_CLIP(gx[H + j] + gh[H + j]));
        const double hh = tv_rnn_apply(act[1], TV_RNN_CLIP(gx[2 * H + j] + rg * gh[2 * H + j]));
        h[j] = (1.0 - z) * hh + z * h[j];
      }
    }
  } else {
    for (int64_t j = 0; j < H; j++) h[j] = tv_rnn_apply(act[0], TV_RNN_CLIP(gx[j] + gh[j]));
  }
#undef TV_RNN_CLIP
}

/* dims: seq, batch, input, hidden, directions. flags: reverse_only, layout, has_b, has_lens, has_h0,
   has_c0, has_p, input_forget, linear_before_reset, has_clip. acts: per direction, the gates'
   activation codes (3 LSTM, 2 GRU, 1 RNN); alphas, betas: their parameters as double bits. Omitted
   inputs (has_* 0) are not read; y_c only for LSTM. A sequence length outside [0, seq] is
   TV_ERROR_INDEX. */
__attribute__((unused)) static int32_t tv_recurrent(int64_t kind, int64_t dtype, const void* x, const void* w,
                                                    const void* r, const void* b, const void* lens,
                                                    int64_t lens_dtype, const void* h0, const void* c0,
                                                    const void* p, void* y, void* y_h, void* y_c,
                                                    const int64_t* dims, const int64_t* flags, int64_t clip_bits,
                                                    const int64_t* acts, const int64_t* alphas,
                                                    const int64_t* betas) {
  const int64_t seq = dims[0], batch = dims[1], input = dims[2], H = dims[3], D = dims[4];
  const int64_t reverse_only = flags[0], layout = flags[1], has_b = flags[2], has_lens = flags[3];
  const int64_t has_h0 = flags[4], has_c0 = flags[5], has_p = flags[6];
  const int64_t gates = kind == TV_RNN_LSTM ? 4 : (kind == TV_RNN_GRU ? 3 : 1);
  const int64_t per = kind == TV_RNN_LSTM ? 3 : (kind == TV_RNN_GRU ? 2 : 1);
  const int64_t GH = gates * H;
  const double clip = tv_rnn_double(clip_bits);
  for (int64_t i = 0; i < batch && has_lens; i++) {
    const int64_t n = tv_lib_load_int(lens, i, lens_dtype);
    if (n < 0 || n > seq) return TV_ERROR_INDEX;
  }
  /* The double copies: x, W, R, B (zeros if omitted), P (zeros), then the states and the scratch. */
  const size_t total = (size_t)(seq * batch * input + D * GH * input + D * GH * H + D * 2 * GH + D * 3 * H +
                                2 * batch * H + 2 * GH + H + 1);
  double* work = (double*)calloc(total, sizeof(double));
  if (work == NULL) return TV_ERROR_OUT_OF_MEMORY;
  double *xd = work, *wd = xd + seq * batch * input, *rd = wd + D * GH * input, *bd = rd + D * GH * H;
  double *pd = bd + D * 2 * GH, *hs = pd + D * 3 * H, *cs = hs + batch * H, *gx = cs + batch * H, *gh = gx + GH + H;
  int32_t rc = tv_rnn_load(x, dtype, seq * batch * input, xd);
  if (rc == 0) rc = tv_rnn_load(w, dtype, D * GH * input, wd);
  if (rc == 0) rc = tv_rnn_load(r, dtype, D * GH * H, rd);
  if (rc == 0 && has_b) rc = tv_rnn_load(b, dtype, D * 2 * GH, bd);
  if (rc == 0 && has_p) rc = tv_rnn_load(p, dtype, D * 3 * H, pd);
  if (rc != 0) {
    free(work);
    return rc;
  }
  double* states[2] = {NULL, NULL};
  for (int64_t i = 0; i < seq * D * batch * H; i++) tv_rnn_store(y, dtype, i, 0.0); /* steps past a length */
  for (int64_t d = 0; d < D; d++) {
    const int reverse = reverse_only || d == 1;
    tv_rnn_act act[3];
    for (int64_t k = 0; k < per; k++) {
      act[k].code = acts[d * per + k];
      act[k].alpha = tv_rnn_double(alphas[d * per + k]);
      act[k].beta = tv_rnn_double(betas[d * per + k]);
    }
    /* Initial states (layout 1: (batch, D, hidden)). */
    const void* init[2] = {h0, c0};
    const int64_t has_init[2] = {has_h0, has_c0};
    states[0] = hs;
    states[1] = cs;
    for (int s = 0; s < 2; s++) {
      for (int64_t i = 0; i < batch; i++) {
        const int64_t at = layout ? (i * D + d) * H : (d * batch + i) * H;
        if (has_init[s]) {
          rc = tv_rnn_load((const char*)init[s] + at * tv_lib_itemsize(dtype), dtype, H, states[s] + i * H);
        } else {
          for (int64_t j = 0; j < H; j++) states[s][i * H + j] = 0.0;
        }
      }
    }
    for (int64_t i = 0; i < batch; i++) {
      const int64_t n = has_lens ? tv_lib_load_int(lens, i, lens_dtype) : seq;
      double* h = hs + i * H;
      double* c = cs + i * H;
      for (int64_t t = 0; t < n; t++) {
        const int64_t step = reverse ? n - 1 - t : t;
        const double* xt = xd + (layout ? i * seq + step : step * batch + i) * input;
        tv_rnn_step(kind, act, wd + d * GH * input, rd + d * GH * H, bd + d * 2 * GH, pd + d * 3 * H, xt, h, c,
                    input, H, gates, flags[7], flags[8], flags[9], clip, gx, gh);
        const int64_t at = layout ? ((i * seq + step) * D + d) * H : ((step * D + d) * batch + i) * H;
        for (int64_t j = 0; j < H; j++) tv_rnn_store(y, dtype, at + j, h[j]);
      }
      const int64_t final_at = layout ? (i * D + d) * H : (d * batch + i) * H;
      for (int64_t j = 0; j < H; j++) {
        tv_rnn_store(y_h, dtype, final_at + j, h[j]);
        if (kind == TV_RNN_LSTM) tv_rnn_store(y_c, dtype, final_at + j, c[j]);
      }
    }
  }
  free(work);
  return 0;
}
