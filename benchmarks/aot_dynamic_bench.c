/* Times the Tree-LSTM standalone library (tensorvm AOT, dynamic=True; built by benchmarks/aot_dynamic.py)
   called from C: the trees are built once with the library's constructors, then each round runs @main over
   every tree; prints the first tree's h (to check against the VM) and the fastest round in microseconds.

   usage: aot_dynamic_bench TREES_FILE ROUNDS
   TREES_FILE: "T I", then T trees in preorder: "L x1..xI" or "N <left> <right> x1..xI". */
#define _POSIX_C_SOURCE 200112L /* clock_gettime */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tree.h"
#include "tree_text.h" /* (tests/aot/) */

static void check(int32_t rc, tvd_model* m, const char* what) {
  if (rc != TVD_OK) {
    fprintf(stderr, "%s: status %d: %s\n", what, rc, tvd_tree_last_error(m));
    exit(1);
  }
}

static tvd_value* read_tree(tvd_model* m, FILE* in, int64_t input_size) {
  int32_t rc = TVD_OK;
  tvd_value* tree = tree_from_text(m, in, input_size, &rc);
  if (tree == NULL) {
    if (rc < 0) exit(2); /* (the text does not parse) */
    check(rc, m, "building a tree");
  }
  return tree;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  FILE* in = fopen(argv[1], "r");
  int count = 0;
  long long input_size = 0;
  if (in == NULL || fscanf(in, "%d %lld", &count, &input_size) != 2) return 2;
  const int rounds = atoi(argv[2]);
  tvd_model* m = NULL;
  check(tvd_tree_create(NULL, &m), m, "create");
  tvd_tree_set_num_threads(1);
  tvd_value** trees = (tvd_value**)malloc(sizeof(tvd_value*) * (size_t)count);
  for (int k = 0; k < count; ++k) trees[k] = read_tree(m, in, input_size);
  fclose(in);
  double best = 1e30;
  for (int r = 0; r <= rounds; ++r) { /* (round 0 warms the pool and the caches) */
    const double start = now();
    for (int k = 0; k < count; ++k) {
      tvd_value* result = NULL;
      check(tvd_tree_main(m, trees[k], &result), m, "main");
      if (r == 0 && k == 0) {
        tvd_tensor h;
        tvd_tree_tensor_get(tvd_tree_field(result, 0), &h);
        printf("h");
        for (int64_t i = 0; i < h.shape[1]; ++i) printf(" %.9g", (double)((const float*)h.data)[i]);
        printf("\n");
      }
      tvd_tree_release(result);
    }
    const double seconds = now() - start;
    if (r > 0 && seconds < best) best = seconds;
  }
  printf("best_round_us %.3f\n", best * 1e6);
  for (int k = 0; k < count; ++k) tvd_tree_release(trees[k]);
  free(trees);
  tvd_tree_destroy(m);
  return 0;
}
