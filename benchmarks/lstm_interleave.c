/* Experiment (issue 19, LSTM 256->512 batch 1 within 1.1x of the floor): can the input projection of later
   tokens hide under the recurrent product's stream of W_hh, instead of running as its own product?

   A step reads W_hh (4H x H floats, 4 MB at H = 512) for one row h: a GEMV bound by how fast the weight
   streams (from L3 when it fits there), its FMA units mostly idle. The input projection (T x I . I x 4H,
   one product for all tokens before the loop) is compute-bound. Three ways to run T steps, timed side by
   side (CPU time of this thread and wall time, median of rounds; the first is the floor):

     floor     T bare GEMVs (tv_vgemm_block of one row: the kernel tensorvm calls);
     separate  what tensorvm runs: the projection as one product (tv_vgemm_block, all rows), then T GEMVs,
               each adding its token's projection row;
     fused     the projection of the first FB tokens up front; then each step's GEMV carries, interleaved at
               instruction level (one reduction step of a projection tile every H / (I / FB) GEMV steps, in
               the same loop), 1/FB of the reduction of the next FB tokens' projection, panel by panel: after
               the FB steps of a block the next block's projection is complete. FB = MR - 2 (the registers
               left beside 4 GEMV accumulators), so W_ih is read once per FB tokens.

   The fused and separate runs must give the same final h (checked). Built and run by lstm_interleave.py
   with the host's vector width and tile (host.gemm_params); single thread.

   usage: lstm_interleave T ROUNDS [I H] */
#define _POSIX_C_SOURCE 200112L /* clock_gettime */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* tv_vgemm.h's parallel entry point (unused here) names the thread pool: one thread. */
static inline int tv_gemm_parallel_rows(double work, int64_t rows) { (void)work, (void)rows; return 0; }
static inline int tv_omp_max_threads(void) { return 1; }
static inline void tv_team_run(int64_t chunks, int threads, void (*fn)(void*, int64_t), void* arg) {
  (void)threads;
  for (int64_t i = 0; i < chunks; ++i) fn(arg, i);
}
static inline int64_t tv_team_mirror(int64_t i, int64_t chunks, int64_t threads) {
  (void)threads;
  return chunks - 1 - i;
}
#include "tv_vgemm.h"

#ifndef LI_FB
#define LI_FB 4
#endif
#define LI_CAT2(a, b) a##b
#define LI_CAT(a, b) LI_CAT2(a, b)
#define LI_ROWS(F) LI_CAT(TV_VROWS, LI_FB)(F)
#define NR TV_VGEMM_NR

static int64_t T, I, H, G, P;
static float *whh, *wih, *xs, *proj, *h0, *h, *gates;

static double cpu_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return 1e6 * (double)t.tv_sec + 1e-3 * (double)t.tv_nsec;
}
static double wall_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return 1e6 * (double)t.tv_sec + 1e-3 * (double)t.tv_nsec;
}

/* The next h from the gates (a stand-in for the cell: cheap, bounded, depends on every gate). */
static void next_h(void) {
  for (int64_t j = 0; j < H; ++j) h[j] = tanhf(gates[j] + gates[H + j] - gates[2 * H + j] + gates[3 * H + j]);
}

static void run_floor(void) {
  memcpy(h, h0, sizeof(float) * (size_t)H);
  for (int64_t t = 0; t < T; ++t) {
    tv_vgemm_block(0, 1, 0, P, G, H, h, whh, NULL, gates, 0);
    next_h();
  }
}

static void run_separate(void) {
  memcpy(h, h0, sizeof(float) * (size_t)H);
  tv_vgemm_block(0, T, 0, P, G, I, xs, wih, NULL, proj, 0);
  for (int64_t t = 0; t < T; ++t) {
    tv_vgemm_block(0, 1, 0, P, G, H, h, whh, NULL, gates, 0);
    for (int64_t j = 0; j < G; ++j) gates[j] += proj[t * G + j];
    next_h();
  }
}

/* One panel: gates[panel] = h . W_hh panel, and (when xb) reduction steps [k0, k1) of the FB x NR
   projection tile of the same panel for the FB token rows at xb, accumulated into pc (row stride G). */
static void fused_panel(const float* panel, float* out, const float* xb, const float* ipanel, int64_t k0,
                        int64_t k1, float* pc) {
  tv_vf lo0 = {0}, hi0 = {0}, lo1 = {0}, hi1 = {0};
  const int64_t steps = xb ? k1 - k0 : 0;
#define LI_ZERO(r) tv_vf plo##r = {0}, phi##r = {0};
  LI_ROWS(LI_ZERO)
#define LI_LOAD(r) plo##r = TV_VLOAD(pc + r * G), phi##r = TV_VLOAD(pc + r * G + TV_VLANES);
  if (steps) { LI_ROWS(LI_LOAD) }
  /* The panel read as two streams (its two halves of the reduction, as the one-row tile tv_vgemm_tile1 read
     it then); ``chunk`` steps of each between two projection steps. */
  const int64_t half = H / 2, chunk = steps ? half / steps : half;
  const float* second = panel + half * NR;
  int64_t p = 0;
  for (int64_t q = 0; q < steps; ++q) {
    for (int64_t e = p + chunk; p < e; ++p) {
      const tv_vf a0 = TV_VSPLAT(h[p]), a1 = TV_VSPLAT(h[half + p]);
      lo0 += a0 * TV_VLOAD(panel + p * NR), hi0 += a0 * TV_VLOAD(panel + p * NR + TV_VLANES);
      lo1 += a1 * TV_VLOAD(second + p * NR), hi1 += a1 * TV_VLOAD(second + p * NR + TV_VLANES);
    }
    const int64_t k = k0 + q;
    const tv_vf w0 = TV_VLOAD(ipanel + k * NR), w1 = TV_VLOAD(ipanel + k * NR + TV_VLANES);
#define LI_FMA(r)                          \
  {                                        \
    const tv_vf a = TV_VSPLAT(xb[r * I + k]); \
    plo##r += a * w0, phi##r += a * w1;    \
  }
    LI_ROWS(LI_FMA)
  }
  for (; p < half; ++p) {
    const tv_vf a0 = TV_VSPLAT(h[p]), a1 = TV_VSPLAT(h[half + p]);
    lo0 += a0 * TV_VLOAD(panel + p * NR), hi0 += a0 * TV_VLOAD(panel + p * NR + TV_VLANES);
    lo1 += a1 * TV_VLOAD(second + p * NR), hi1 += a1 * TV_VLOAD(second + p * NR + TV_VLANES);
  }
  TV_VSTORE(out, lo0 + lo1);
  TV_VSTORE(out + TV_VLANES, hi0 + hi1);
  if (steps) {
#define LI_STORE(r) TV_VSTORE(pc + r * G, plo##r), TV_VSTORE(pc + r * G + TV_VLANES, phi##r);
    LI_ROWS(LI_STORE)
  }
}

static void run_fused(void) {
  memcpy(h, h0, sizeof(float) * (size_t)H);
  const int64_t first = T < LI_FB ? T : LI_FB;
  tv_vgemm_block(0, first, 0, P, G, I, xs, wih, NULL, proj, 0);
  const int64_t share = (I + LI_FB - 1) / LI_FB;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t next = (t / LI_FB + 1) * LI_FB, part = t % LI_FB;
    const int64_t k0 = part * share < I ? part * share : I, k1 = k0 + share < I ? k0 + share : I;
    const int carry = next + LI_FB <= T; /* a block with all its rows (a short last block runs apart) */
    if (carry && part == 0) memset(proj + next * G, 0, sizeof(float) * (size_t)(LI_FB * G));
    for (int64_t p = 0; p < P; ++p)
      fused_panel(whh + p * H * NR, gates + p * NR, carry ? xs + next * I : NULL, wih + p * I * NR, k0, k1,
                  proj + next * G + p * NR);
    if (!carry && next < T && part == LI_FB - 1) tv_vgemm_block(next, T, 0, P, G, I, xs, wih, NULL, proj, 0);
    for (int64_t j = 0; j < G; ++j) gates[j] += proj[t * G + j];
    next_h();
  }
}

/* The fused pass's own GEMV loop with no projection in it: what the interleaving itself costs. */
static void run_fused_gemv(void) {
  memcpy(h, h0, sizeof(float) * (size_t)H);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t p = 0; p < P; ++p) fused_panel(whh + p * H * NR, gates + p * NR, NULL, wih, 0, 0, proj);
    next_h();
  }
}

static float* floats(int64_t n, float scale, unsigned seed) {
  float* p = aligned_alloc(64, (size_t)((n * 4 + 63) / 64 * 64));
  if (p == NULL) exit(1);
  for (int64_t i = 0; i < n; ++i) {
    seed = seed * 1103515245u + 12345u;
    p[i] = scale * ((float)((seed >> 8) & 0xffff) / 32768.0f - 1.0f);
  }
  return p;
}

static int compare(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  if (argc < 3) { fprintf(stderr, "usage: %s T ROUNDS [I H]\n", argv[0]); return 2; }
  T = atoll(argv[1]);
  const int rounds = atoi(argv[2]);
  I = argc > 3 ? atoll(argv[3]) : 256, H = argc > 4 ? atoll(argv[4]) : 512;
  if (T < 1 || rounds < 1 || rounds > 256 || I < 1 || H < 2 || H % 2 || (4 * H) % NR) {
    fprintf(stderr, "need T >= 1, 1 <= ROUNDS <= 256, H even and 4H a multiple of %d\n", NR);
    return 2;
  }
  G = 4 * H, P = G / NR;
  const float scale = 1.0f / sqrtf((float)H);
  whh = floats(G * H, scale, 1), wih = floats(G * I, scale, 2), xs = floats(T * I, 1.0f, 3);
  h0 = floats(H, 0.1f, 4), h = floats(H, 0, 5), gates = floats(G, 0, 6), proj = floats(T * G, 0, 7);
  /* (the weights are random: their packed layout is any layout of the same numbers, both runs read it alike) */
  float* want = floats(H, 0, 8);
  run_separate();
  memcpy(want, h, sizeof(float) * (size_t)H);
  run_fused();
  for (int64_t j = 0; j < H; ++j)
    if (fabsf(h[j] - want[j]) > 1e-4f * (1.0f + fabsf(want[j]))) {
      fprintf(stderr, "fused differs from separate at h[%lld]: %g vs %g\n", (long long)j, h[j], want[j]);
      return 1;
    }
  enum { RUNS = 4 };
  void (*runs[RUNS])(void) = {run_floor, run_separate, run_fused, run_fused_gemv};
  const char* names[RUNS] = {"floor (T bare GEMVs)", "separate (tensorvm's order)", "fused (interleaved)",
                             "fused pass, GEMV only"};
  static double cpu[RUNS][256], wall[RUNS][256];
  for (int r = 0; r < rounds; ++r)
    for (int v = 0; v < RUNS; ++v) {
      const double c = cpu_us(), w = wall_us();
      runs[v]();
      wall[v][r] = (wall_us() - w) / (double)T, cpu[v][r] = (cpu_us() - c) / (double)T;
    }
  for (int v = 0; v < RUNS; ++v) {
    qsort(cpu[v], (size_t)rounds, sizeof(double), compare);
    qsort(wall[v], (size_t)rounds, sizeof(double), compare);
  }
  printf("T=%lld I=%lld H=%lld FB=%d NR=%d (median of %d rounds)\n", (long long)T, (long long)I, (long long)H,
         LI_FB, NR, rounds);
  for (int v = 0; v < RUNS; ++v)
    printf("  %-28s cpu %7.1f us/token %5.3fx the floor   wall %7.1f us/token %5.3fx\n", names[v],
           cpu[v][rounds / 2], cpu[v][rounds / 2] / cpu[0][rounds / 2], wall[v][rounds / 2],
           wall[v][rounds / 2] / wall[0][rounds / 2]);
  return 0;
}
