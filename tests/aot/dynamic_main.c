/* A C application of two standalone dynamic-program libraries (tensorvm AOT, dynamic=True; built by
   tests/aot/test_aot_dynamic.py): the Tree-LSTM ("tree") over trees built here with its constructors, and
   an LSTM ("lstm") over sequences of several lengths; then error cases. Both models allocate through a
   counting allocator of this file, which must end with every block given back.

   usage: dynamic_main DIR   reads DIR/trees.txt and DIR/lstm.txt, writes DIR/trees_out.txt,
                             DIR/lstm_out.txt and DIR/errors.txt; prints DYNAMIC_TEST_SUCCESS at the end.
   trees.txt: "T I", then T trees in preorder: "L x1..xI" or "N <left> <right> x1..xI".
   lstm.txt: "S I", then S sequences: "T" and T*I floats. Outputs: one line per tensor, "%.9g" values. */
#define _POSIX_C_SOURCE 200112L /* posix_memalign */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lstm.h"
#include "tree.h"

/* ---- the application's allocator: counts what is outstanding ---- */
typedef struct {
  long blocks;
  long long bytes;
  long calls;
} counter;

static void* counting_alloc(void* user, size_t size, size_t alignment) {
  counter* c = (counter*)user;
  void* block = NULL;
  if (posix_memalign(&block, alignment < sizeof(void*) ? sizeof(void*) : alignment, size + 64) != 0) return NULL;
  *(size_t*)block = size;
  c->blocks += 1;
  c->bytes += (long long)size;
  c->calls += 1;
  return (char*)block + 64;
}

static void counting_free(void* user, void* block) {
  counter* c = (counter*)user;
  char* start = (char*)block - 64;
  c->blocks -= 1;
  c->bytes -= (long long)*(size_t*)start;
  free(start);
}

static counter usage = {0, 0, 0};
static const tvd_allocator allocator = {counting_alloc, counting_free, &usage};

static void fail(const char* what, int32_t rc, const char* message) {
  fprintf(stderr, "FAILED: %s: status %d: %s\n", what, rc, message);
  exit(1);
}

typedef int32_t (*tensor_getter)(const tvd_value*, tvd_tensor*);

static void print_tensor(FILE* out, const tvd_value* v, tensor_getter get) {
  tvd_tensor t;
  if (get(v, &t) != TVD_OK || t.dtype.code != TVD_FLOAT || t.dtype.bits != 32 || t.device.device_type != TVD_DEVICE_CPU)
    fail("a float32 tensor result", -1, "");
  int64_t n = 1;
  for (int32_t i = 0; i < t.ndim; ++i) n *= t.shape[i];
  for (int64_t i = 0; i < n; ++i) fprintf(out, i ? " %.9g" : "%.9g", (double)((const float*)t.data)[i]);
  fprintf(out, "\n");
}

/* ---- Tree-LSTM ---- */
static tvd_value* tensor_1xI(tvd_model* m, float* data, int64_t* shape) {
  tvd_tensor t = {data, {TVD_DEVICE_CPU, 0}, 2, {TVD_FLOAT, 32, 1}, shape, NULL, 0};
  tvd_value* v = NULL;
  int32_t rc = tvd_tree_tensor(m, &t, &v);
  if (rc != TVD_OK) fail("tvd_tree_tensor", rc, tvd_tree_last_error(m));
  return v;
}

static tvd_value* read_tree(tvd_model* m, FILE* in, int64_t input_size) {
  char kind[2];
  if (fscanf(in, "%1s", kind) != 1) fail("reading a tree", -1, "end of file");
  tvd_value* left = NULL;
  tvd_value* right = NULL;
  if (kind[0] == 'N') {
    left = read_tree(m, in, input_size);
    right = read_tree(m, in, input_size);
  }
  float* x = (float*)malloc(sizeof(float) * (size_t)input_size);
  for (int64_t i = 0; i < input_size; ++i)
    if (fscanf(in, "%f", &x[i]) != 1) fail("reading a tree's x", -1, "");
  int64_t shape[2] = {1, input_size};
  tvd_value* xv = tensor_1xI(m, x, shape);
  free(x); /* (the value holds a copy) */
  tvd_value* node = NULL;
  int32_t rc = kind[0] == 'N' ? tvd_tree_Tree_Node(m, left, right, xv, &node) : tvd_tree_Tree_Leaf(m, xv, &node);
  if (rc != TVD_OK) fail("a Tree constructor", rc, tvd_tree_last_error(m));
  tvd_tree_release(xv); /* (the node holds its own references) */
  tvd_tree_release(left);
  tvd_tree_release(right);
  return node;
}

static tvd_value* deep_tree(tvd_model* m, int depth, int64_t input_size) {
  float x[64] = {0};
  int64_t shape[2] = {1, input_size};
  tvd_value* xv = tensor_1xI(m, x, shape);
  tvd_value* tree = NULL;
  if (tvd_tree_Tree_Leaf(m, xv, &tree) != TVD_OK) fail("Leaf", -1, tvd_tree_last_error(m));
  for (int d = 0; d < depth; ++d) {
    tvd_value* leaf = NULL;
    tvd_value* node = NULL;
    if (tvd_tree_Tree_Leaf(m, xv, &leaf) != TVD_OK) fail("Leaf", -1, tvd_tree_last_error(m));
    if (tvd_tree_Tree_Node(m, tree, leaf, xv, &node) != TVD_OK) fail("Node", -1, tvd_tree_last_error(m));
    tvd_tree_release(tree);
    tvd_tree_release(leaf);
    tree = node;
  }
  tvd_tree_release(xv);
  return tree;
}

static int64_t run_trees(const char* dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/trees.txt", dir);
  FILE* in = fopen(path, "r");
  snprintf(path, sizeof path, "%s/trees_out.txt", dir);
  FILE* out = fopen(path, "w");
  if (in == NULL || out == NULL) fail("opening the tree files", -1, path);
  int count = 0;
  long long input_size = 0;
  if (fscanf(in, "%d %lld", &count, &input_size) != 2) fail("reading trees.txt", -1, "");
  const tvd_options options = {&allocator, -1, 0};
  tvd_model* m = NULL;
  int32_t rc = tvd_tree_create(&options, &m);
  if (rc != TVD_OK) fail("tvd_tree_create", rc, "");
  for (int k = 0; k < count; ++k) {
    tvd_value* tree = read_tree(m, in, input_size);
    for (int repeat = 0; repeat < 2; ++repeat) { /* (a second call on the same tree: nothing kept between calls) */
      tvd_value* result = NULL;
      if ((rc = tvd_tree_main(m, tree, &result)) != TVD_OK) fail("tvd_tree_main", rc, tvd_tree_last_error(m));
      if (tvd_tree_tag(result) != 0 || tvd_tree_num_fields(result) != 2) fail("a (h, c) tuple result", -1, "");
      if (repeat == 0) {
        print_tensor(out, tvd_tree_field(result, 0), tvd_tree_tensor_get);
        print_tensor(out, tvd_tree_field(result, 1), tvd_tree_tensor_get);
      }
      tvd_tree_release(result);
    }
    tvd_tree_release(tree);
  }
  tvd_memory_stats stats;
  tvd_tree_memory_stats(m, &stats);
  tvd_tree_destroy(m);
  fclose(in);
  fclose(out);
  return stats.bytes_live;
}

/* ---- LSTM ---- */
static int64_t run_lstm(const char* dir) {
  char path[4096];
  snprintf(path, sizeof path, "%s/lstm.txt", dir);
  FILE* in = fopen(path, "r");
  snprintf(path, sizeof path, "%s/lstm_out.txt", dir);
  FILE* out = fopen(path, "w");
  if (in == NULL || out == NULL) fail("opening the LSTM files", -1, path);
  int count = 0;
  long long input_size = 0;
  if (fscanf(in, "%d %lld", &count, &input_size) != 2) fail("reading lstm.txt", -1, "");
  const tvd_options options = {&allocator, -1, 0};
  tvd_model* m = NULL;
  int32_t rc = tvd_lstm_create(&options, &m);
  if (rc != TVD_OK) fail("tvd_lstm_create", rc, "");
  tvd_lstm_set_num_threads(1);
  for (int k = 0; k < count; ++k) {
    long long length = 0;
    if (fscanf(in, "%lld", &length) != 1) fail("reading a length", -1, "");
    float* xs = (float*)malloc(sizeof(float) * (size_t)(length * input_size + 1));
    for (long long i = 0; i < length * input_size; ++i)
      if (fscanf(in, "%f", &xs[i]) != 1) fail("reading a sequence", -1, "");
    int64_t shape[3] = {length, 1, input_size};
    tvd_tensor t = {xs, {TVD_DEVICE_CPU, 0}, 3, {TVD_FLOAT, 32, 1}, shape, NULL, 0};
    tvd_value* result = NULL;
    if ((rc = tvd_lstm_main(m, &t, &result)) != TVD_OK) fail("tvd_lstm_main", rc, tvd_lstm_last_error(m));
    free(xs); /* (the result owns its memory: the input was only read during the call) */
    print_tensor(out, tvd_lstm_field(result, 0), tvd_lstm_tensor_get);
    print_tensor(out, tvd_lstm_field(result, 1), tvd_lstm_tensor_get);
    tvd_lstm_release(result);
  }
  tvd_memory_stats stats;
  tvd_lstm_memory_stats(m, &stats);
  tvd_lstm_destroy(m);
  fclose(in);
  fclose(out);
  return stats.bytes_live;
}

/* ---- errors: each case writes "name status message" ---- */
static void report(FILE* out, const char* name, int32_t rc, const char* message) {
  fprintf(out, "%s %d %s\n", name, rc, message);
}

static void run_errors(const char* dir, int64_t input_size, int64_t lstm_input) {
  char path[4096];
  snprintf(path, sizeof path, "%s/errors.txt", dir);
  FILE* out = fopen(path, "w");
  if (out == NULL) fail("opening errors.txt", -1, path);
  const tvd_options options = {&allocator, -1, 0};
  tvd_model* lstm = NULL;
  if (tvd_lstm_create(&options, &lstm) != TVD_OK) fail("tvd_lstm_create", -1, "");
  float data[4096] = {0};
  double wide[4096] = {0};
  tvd_value* result = NULL;
  int64_t rank2[2] = {3, lstm_input};
  tvd_tensor t = {data, {TVD_DEVICE_CPU, 0}, 2, {TVD_FLOAT, 32, 1}, rank2, NULL, 0};
  report(out, "lstm_rank", tvd_lstm_main(lstm, &t, &result), tvd_lstm_last_error(lstm));
  int64_t shape[3] = {3, 1, lstm_input};
  t = (tvd_tensor){wide, {TVD_DEVICE_CPU, 0}, 3, {TVD_FLOAT, 64, 1}, shape, NULL, 0};
  report(out, "lstm_dtype", tvd_lstm_main(lstm, &t, &result), tvd_lstm_last_error(lstm));
  int64_t bad_dim[3] = {3, 1, lstm_input + 1};
  t = (tvd_tensor){data, {TVD_DEVICE_CPU, 0}, 3, {TVD_FLOAT, 32, 1}, bad_dim, NULL, 0};
  report(out, "lstm_shape", tvd_lstm_main(lstm, &t, &result), tvd_lstm_last_error(lstm));
  t = (tvd_tensor){NULL, {TVD_DEVICE_CPU, 0}, 3, {TVD_FLOAT, 32, 1}, shape, NULL, 0};
  report(out, "lstm_null_data", tvd_lstm_main(lstm, &t, &result), tvd_lstm_last_error(lstm));
  t = (tvd_tensor){data, {TVD_DEVICE_CPU, 0}, 3, {TVD_FLOAT, 32, 1}, shape, NULL, 0};
  report(out, "lstm_null_result", tvd_lstm_main(lstm, &t, NULL), tvd_lstm_last_error(lstm));
  int32_t rc = tvd_lstm_main(lstm, &t, &result); /* (a good call after the errors) */
  report(out, "lstm_after_errors", rc, tvd_lstm_last_error(lstm));
  tvd_lstm_release(result);
  result = NULL;
  tvd_lstm_destroy(lstm);

  tvd_model* tree = NULL;
  if (tvd_tree_create(&options, &tree) != TVD_OK) fail("tvd_tree_create", -1, "");
  int64_t xshape[2] = {1, input_size};
  tvd_value* x = tensor_1xI(tree, data, xshape);
  report(out, "tree_not_a_tree", tvd_tree_main(tree, x, &result), tvd_tree_last_error(tree));
  int64_t wrong[2] = {1, input_size + 1};
  tvd_value* wide_x = tensor_1xI(tree, data, wrong);
  tvd_value* leaf = NULL;
  report(out, "leaf_field_shape", tvd_tree_Tree_Leaf(tree, wide_x, &leaf), tvd_tree_last_error(tree));
  tvd_value* pair = NULL;
  tvd_value* fields[2] = {x, x};
  if (tvd_tree_tuple(tree, 2, fields, &pair) != TVD_OK) fail("tuple", -1, tvd_tree_last_error(tree));
  report(out, "node_child_not_a_tree", tvd_tree_Tree_Node(tree, pair, pair, x, &leaf), tvd_tree_last_error(tree));
  tvd_tree_release(pair);
  tvd_tree_release(wide_x);
  tvd_tree_release(x);
  tvd_tree_destroy(tree);

  /* a depth limit of 3 nested calls: a tree of depth 6 is an error, one of depth 1 runs */
  const tvd_options shallow = {&allocator, -1, 3};
  if (tvd_tree_create(&shallow, &tree) != TVD_OK) fail("tvd_tree_create", -1, "");
  tvd_value* deep = deep_tree(tree, 6, input_size);
  report(out, "tree_depth", tvd_tree_main(tree, deep, &result), tvd_tree_last_error(tree));
  tvd_tree_release(deep);
  deep = deep_tree(tree, 1, input_size);
  rc = tvd_tree_main(tree, deep, &result);
  report(out, "tree_shallow_ok", rc, tvd_tree_last_error(tree));
  tvd_tree_release(result);
  tvd_tree_release(deep);
  /* a memory limit too small for one call */
  tvd_tree_destroy(tree);
  const tvd_options tiny = {&allocator, 16, 0};
  if (tvd_tree_create(&tiny, &tree) != TVD_OK) fail("tvd_tree_create", -1, "");
  tvd_tensor xt = {data, {TVD_DEVICE_CPU, 0}, 2, {TVD_FLOAT, 32, 1}, xshape, NULL, 0};
  x = NULL;
  report(out, "tree_memory_limit", tvd_tree_tensor(tree, &xt, &x), tvd_tree_last_error(tree));
  tvd_tree_release(x);
  tvd_tree_destroy(tree);
  fclose(out);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const int64_t tree_live = run_trees(argv[1]);
  const int64_t lstm_live = run_lstm(argv[1]);
  if (tree_live != 0 || lstm_live != 0) fail("every value released", -1, "bytes still live in a pool");
  if (usage.blocks != 0) {
    fprintf(stderr, "FAILED: %ld blocks (%lld bytes) not given back to the allocator\n", usage.blocks, usage.bytes);
    return 1;
  }
  FILE* sizes = NULL;
  char path[4096];
  snprintf(path, sizeof path, "%s/sizes.txt", argv[1]);
  if ((sizes = fopen(path, "r")) == NULL) fail("opening sizes.txt", -1, path);
  long long tree_input = 0, lstm_input = 0;
  if (fscanf(sizes, "%lld %lld", &tree_input, &lstm_input) != 2) fail("reading sizes.txt", -1, "");
  fclose(sizes);
  run_errors(argv[1], tree_input, lstm_input);
  if (usage.blocks != 0) {
    fprintf(stderr, "FAILED: %ld blocks (%lld bytes) not given back after the error cases\n", usage.blocks,
            usage.bytes);
    return 1;
  }
  printf("allocator calls: %ld\nDYNAMIC_TEST_SUCCESS\n", usage.calls);
  return 0;
}
