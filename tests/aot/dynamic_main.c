/* A C application of four standalone dynamic-program libraries (tensorvm AOT, dynamic=True; built by
   tests/aot/test_aot_dynamic.py): the Tree-LSTM ("tree") over trees built here with its constructors (from
   text, tree_text.h), and an LSTM over sequences of several lengths, once with embedded constants ("lstm")
   and once with its constants from a params blob ("lstmb"); then error cases, among them corrupted blobs and
   the argument checks of a third program ("misc": named dims inside tuples and ADTs, closures). Every model
   allocates through a counting allocator of this file, which must end with every block given back.

   usage: dynamic_main DIR   reads DIR/trees.txt, DIR/lstm.txt and DIR/lstmb.params, writes DIR/trees_out.txt,
                             DIR/lstm_out.txt, DIR/lstmb_out.txt and DIR/errors.txt; prints DYNAMIC_TEST_SUCCESS
                             at the end.
   trees.txt: "T I", then T trees in preorder: "L x1..xI" or "N <left> <right> x1..xI".
   lstm.txt: "S I", then S sequences: "T" and T*I floats. Outputs: one line per tensor, "%.9g" values. */
#define _POSIX_C_SOURCE 200112L /* posix_memalign */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lstm.h"
#include "lstmb.h"
#include "misc.h"
#include "tree.h"
#include "tree_text.h"

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
  int32_t rc = TVD_OK;
  tvd_value* tree = tree_from_text(m, in, input_size, &rc);
  if (tree == NULL) fail("reading a tree (tree_text.h)", rc, rc < 0 ? "bad text" : tvd_tree_last_error(m));
  return tree;
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

/* ---- errors: each case writes "name status message" ---- */
static void report(FILE* out, const char* name, int32_t rc, const char* message) {
  fprintf(out, "%s %d %s\n", name, rc, message);
}

/* ---- LSTM: the same program with embedded constants ("lstm") and from a params blob ("lstmb") ---- */
typedef struct {
  const char* name;
  int32_t (*create)(const tvd_options*, tvd_model**);
  int32_t (*load_params_file)(tvd_model*, const char*); /* NULL: constants embedded */
  int32_t (*main)(tvd_model*, const tvd_tensor*, tvd_value**);
  const char* (*last_error)(const tvd_model*);
  int32_t (*set_num_threads)(int32_t);
  tvd_value* (*field)(const tvd_value*, int32_t);
  tensor_getter tensor_get;
  void (*release)(tvd_value*);
  void (*memory_stats)(const tvd_model*, tvd_memory_stats*);
  void (*destroy)(tvd_model*);
} lstm_api;

static const lstm_api lstm_embedded = {"lstm", tvd_lstm_create, NULL, tvd_lstm_main, tvd_lstm_last_error,
                                       tvd_lstm_set_num_threads, tvd_lstm_field, tvd_lstm_tensor_get,
                                       tvd_lstm_release, tvd_lstm_memory_stats, tvd_lstm_destroy};
static const lstm_api lstm_blob = {"lstmb", tvd_lstmb_create, tvd_lstmb_load_params_file, tvd_lstmb_main,
                                   tvd_lstmb_last_error, tvd_lstmb_set_num_threads, tvd_lstmb_field,
                                   tvd_lstmb_tensor_get, tvd_lstmb_release, tvd_lstmb_memory_stats, tvd_lstmb_destroy};

static int64_t run_lstm(const char* dir, const lstm_api* api) {
  char path[4096];
  snprintf(path, sizeof path, "%s/lstm.txt", dir);
  FILE* in = fopen(path, "r");
  snprintf(path, sizeof path, "%s/%s_out.txt", dir, api->name);
  FILE* out = fopen(path, "w");
  if (in == NULL || out == NULL) fail("opening the LSTM files", -1, path);
  int count = 0;
  long long input_size = 0;
  if (fscanf(in, "%d %lld", &count, &input_size) != 2) fail("reading lstm.txt", -1, "");
  const tvd_options options = {&allocator, -1, 0};
  tvd_model* m = NULL;
  int32_t rc = api->create(&options, &m);
  if (rc != TVD_OK) fail(api->name, rc, "create");
  if (api->load_params_file != NULL) {
    snprintf(path, sizeof path, "%s/%s.params", dir, api->name);
    if ((rc = api->load_params_file(m, path)) != TVD_OK) fail("load_params_file", rc, api->last_error(m));
  }
  api->set_num_threads(1);
  for (int k = 0; k < count; ++k) {
    long long length = 0;
    if (fscanf(in, "%lld", &length) != 1) fail("reading a length", -1, "");
    float* xs = (float*)malloc(sizeof(float) * (size_t)(length * input_size + 1));
    for (long long i = 0; i < length * input_size; ++i)
      if (fscanf(in, "%f", &xs[i]) != 1) fail("reading a sequence", -1, "");
    int64_t shape[3] = {length, 1, input_size};
    tvd_tensor t = {xs, {TVD_DEVICE_CPU, 0}, 3, {TVD_FLOAT, 32, 1}, shape, NULL, 0};
    tvd_value* result = NULL;
    if ((rc = api->main(m, &t, &result)) != TVD_OK) fail(api->name, rc, api->last_error(m));
    free(xs); /* (the result owns its memory: the input was only read during the call) */
    print_tensor(out, api->field(result, 0), api->tensor_get);
    print_tensor(out, api->field(result, 1), api->tensor_get);
    api->release(result);
  }
  tvd_memory_stats stats;
  api->memory_stats(m, &stats);
  api->destroy(m);
  fclose(in);
  fclose(out);
  return stats.bytes_live;
}

/* ---- the params blob: every truncation and bit flip tried is refused with TVD_ERR_FORMAT (run under ASan too:
   no read outside the blob); then the intact blob loads once ---- */
static unsigned char* read_file(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  if (f == NULL || fseek(f, 0, SEEK_END) != 0) fail("opening the blob", -1, path);
  const long n = ftell(f);
  unsigned char* data = (unsigned char*)malloc((size_t)n + 1);
  if (n < 0 || data == NULL || fseek(f, 0, SEEK_SET) != 0 || fread(data, 1, (size_t)n, f) != (size_t)n)
    fail("reading the blob", -1, path);
  fclose(f);
  *size = (size_t)n;
  return data;
}

static long refused = 0;

/* Loads `size` bytes of blob (after flipping bit `bit` of byte `at`, when at >= 0) and expects a refusal. */
static void expect_refused(tvd_model* m, const unsigned char* blob, size_t size, long at, int bit, FILE* out,
                           const char* name) {
  unsigned char* copy = (unsigned char*)malloc(size + 1); /* (exactly size bytes are passed) */
  memcpy(copy, blob, size);
  if (at >= 0) copy[at] ^= (unsigned char)(1u << bit);
  const int32_t rc = tvd_lstmb_load_params(m, copy, size);
  free(copy);
  if (rc != TVD_ERR_FORMAT) {
    fprintf(stderr, "FAILED: a blob of %zu bytes with bit %d of byte %ld flipped: status %d (%s)\n", size, bit, at, rc,
            tvd_lstmb_last_error(m));
    exit(1);
  }
  refused += 1;
  if (name != NULL) report(out, name, rc, tvd_lstmb_last_error(m));
}

static void run_blob_errors(const char* dir, FILE* out, int64_t lstm_input) {
  char path[4096];
  snprintf(path, sizeof path, "%s/lstmb.params", dir);
  size_t size = 0;
  unsigned char* blob = read_file(path, &size);
  const tvd_options options = {&allocator, -1, 0};
  tvd_model* m = NULL;
  if (tvd_lstmb_create(&options, &m) != TVD_OK) fail("tvd_lstmb_create", -1, "");
  float data[4096] = {0};
  int64_t shape[3] = {2, 1, lstm_input};
  tvd_tensor t = {data, {TVD_DEVICE_CPU, 0}, 3, {TVD_FLOAT, 32, 1}, shape, NULL, 0};
  tvd_value* result = NULL;
  report(out, "blob_not_loaded", tvd_lstmb_main(m, &t, &result), tvd_lstmb_last_error(m));
  snprintf(path, sizeof path, "%s/no_such.params", dir);
  report(out, "blob_no_file", tvd_lstmb_load_params_file(m, path), tvd_lstmb_last_error(m));
  report(out, "blob_directory", tvd_lstmb_load_params_file(m, dir), tvd_lstmb_last_error(m)); /* (opens; length LONG_MAX) */
  const size_t table_end = 80 + 16 * (size_t)(blob[12] | blob[13] << 8);
  expect_refused(m, blob, size - 64, -1, 0, out, "blob_truncated");
  expect_refused(m, blob, 40, -1, 0, out, "blob_header_truncated");
  expect_refused(m, blob, size, 0, 0, out, "blob_magic");
  expect_refused(m, blob, size, 8, 1, out, "blob_version");
  expect_refused(m, blob, size, 50, 3, out, "blob_hash");
  expect_refused(m, blob, size, (long)table_end + 5, 6, out, "blob_checksum");
  expect_refused(m, blob, size, 12, 0, out, "blob_count");
  for (size_t n = 0; n < size; n += n < table_end + 64 ? 1 : 61) expect_refused(m, blob, n, -1, 0, out, NULL);
  for (size_t at = 0; at < size; at += at < table_end ? 1 : 37)
    for (int bit = 0; bit < 8; bit += at < table_end ? 1 : 3) expect_refused(m, blob, size, (long)at, bit, out, NULL);
  fprintf(out, "blob_refused %ld %zu\n", refused, size);
  report(out, "blob_load", tvd_lstmb_load_params(m, blob, size), tvd_lstmb_last_error(m));
  free(blob); /* (the model keeps its own copy) */
  report(out, "blob_twice", tvd_lstmb_load_params_file(m, path), tvd_lstmb_last_error(m));
  const int32_t rc = tvd_lstmb_main(m, &t, &result);
  report(out, "blob_run", rc, tvd_lstmb_last_error(m));
  tvd_lstmb_release(result);
  tvd_lstmb_destroy(m);
}

/* ---- named dims inside tuple and ADT fields, and closures' signatures ("misc", tests/aot/test_aot_dynamic.py) ---- */
static tvd_value* misc_leaf(tvd_model* m, float* data, int64_t rows) {
  int64_t shape[2] = {rows, 2};
  tvd_tensor t = {data, {TVD_DEVICE_CPU, 0}, 2, {TVD_FLOAT, 32, 1}, shape, NULL, 0};
  tvd_value *x = NULL, *leaf = NULL;
  if (tvd_misc_tensor(m, &t, &x) != TVD_OK || tvd_misc_Tree_Leaf(m, x, &leaf) != TVD_OK)
    fail("a misc leaf", -1, tvd_misc_last_error(m));
  tvd_misc_release(x);
  return leaf;
}

static tvd_value* misc_node(tvd_model* m, tvd_value* left, tvd_value* right) {
  tvd_value* node = NULL;
  if (tvd_misc_Tree_Node(m, left, right, &node) != TVD_OK) fail("a misc node", -1, tvd_misc_last_error(m));
  tvd_misc_release(left);
  tvd_misc_release(right);
  return node;
}

static void run_misc_errors(FILE* out) {
  const tvd_options options = {&allocator, -1, 0};
  tvd_model* m = NULL;
  if (tvd_misc_create(&options, &m) != TVD_OK) fail("tvd_misc_create", -1, "");
  float data[64] = {0};
  tvd_value* result = NULL;
  int64_t x3[2] = {3, 2}, x5[2] = {5, 2};
  tvd_tensor x = {data, {TVD_DEVICE_CPU, 0}, 2, {TVD_FLOAT, 32, 1}, x3, NULL, 0};
  tvd_value* tree = misc_node(m, misc_leaf(m, data, 3), misc_node(m, misc_leaf(m, data, 3), misc_leaf(m, data, 3)));
  int32_t rc = tvd_misc_tree_plus(m, tree, &x, &result);
  report(out, "misc_tree_ok", rc, tvd_misc_last_error(m));
  tvd_misc_release(result);
  result = NULL;
  x.shape = x5;
  report(out, "misc_tree_vs_x", tvd_misc_tree_plus(m, tree, &x, &result), tvd_misc_last_error(m));
  tvd_misc_release(tree);
  x.shape = x3;
  tree = misc_node(m, misc_leaf(m, data, 3), misc_node(m, misc_leaf(m, data, 3), misc_leaf(m, data, 4)));
  report(out, "misc_leaves_differ", tvd_misc_tree_plus(m, tree, &x, &result), tvd_misc_last_error(m));
  tvd_misc_release(tree);
  int64_t n3[1] = {3}, n4[1] = {4}, n2[1] = {2};
  tvd_tensor v = {data, {TVD_DEVICE_CPU, 0}, 1, {TVD_FLOAT, 32, 1}, n3, NULL, 0};
  tvd_value *a = NULL, *b = NULL, *pair = NULL;
  if (tvd_misc_tensor(m, &v, &a) != TVD_OK) fail("misc tensor", -1, tvd_misc_last_error(m));
  v.shape = n4;
  if (tvd_misc_tensor(m, &v, &b) != TVD_OK) fail("misc tensor", -1, tvd_misc_last_error(m));
  tvd_value* fields[2] = {a, b};
  if (tvd_misc_tuple(m, 2, fields, &pair) != TVD_OK) fail("misc tuple", -1, tvd_misc_last_error(m));
  v.shape = n3;
  report(out, "misc_pair_fields_differ", tvd_misc_pair_plus(m, pair, &v, &result), tvd_misc_last_error(m));
  tvd_misc_release(pair);
  fields[1] = a;
  if (tvd_misc_tuple(m, 2, fields, &pair) != TVD_OK) fail("misc tuple", -1, tvd_misc_last_error(m));
  v.shape = n2;
  report(out, "misc_pair_vs_x", tvd_misc_pair_plus(m, pair, &v, &result), tvd_misc_last_error(m));
  tvd_misc_release(pair);
  /* a monomorphic ADT whose fields share n: its constructor binds n, the entry point binds it across parameters */
  tvd_value* rows = NULL;
  int64_t rows3[2] = {3, 2};
  tvd_tensor r = {data, {TVD_DEVICE_CPU, 0}, 2, {TVD_FLOAT, 32, 1}, rows3, NULL, 0};
  tvd_value* a32 = NULL;
  if (tvd_misc_tensor(m, &r, &a32) != TVD_OK) fail("misc tensor", -1, tvd_misc_last_error(m));
  report(out, "misc_rows_ctor", tvd_misc_Rows_Rows(m, a32, b, &rows), tvd_misc_last_error(m)); /* (n = 3, then 4) */
  if (rows != NULL || tvd_misc_Rows_Rows(m, a32, a, &rows) != TVD_OK) fail("misc Rows", -1, tvd_misc_last_error(m));
  x.shape = x5;
  report(out, "misc_rows_vs_x", tvd_misc_rows(m, rows, &x, &result), tvd_misc_last_error(m));
  tvd_misc_release(rows);
  tvd_misc_release(a32);
  tvd_misc_release(a);
  tvd_misc_release(b);
  tvd_value* f = NULL;
  if (tvd_misc_make_add(m, &f) != TVD_OK) fail("make_add", -1, tvd_misc_last_error(m));
  report(out, "misc_closure_arity", tvd_misc_apply(m, f, &v, &result), tvd_misc_last_error(m));
  tvd_misc_release(f);
  if (tvd_misc_make_neg(m, &f) != TVD_OK) fail("make_neg", -1, tvd_misc_last_error(m));
  report(out, "misc_closure_types", tvd_misc_apply(m, f, &v, &result), tvd_misc_last_error(m));
  tvd_misc_release(f);
  /* a closure stored in the cell it captures: a cycle the library's collector frees with the call */
  float ramp[5] = {1, 2, 3, 4, 5};
  int32_t steps = 3;
  int64_t five[1] = {5};
  const tvd_tensor ramp_t = {ramp, {TVD_DEVICE_CPU, 0}, 1, {TVD_FLOAT, 32, 1}, five, NULL, 0};
  const tvd_tensor steps_t = {&steps, {TVD_DEVICE_CPU, 0}, 0, {TVD_INT, 32, 1}, NULL, NULL, 0};
  for (int call = 0; call < 3; ++call) {
    if (tvd_misc_knot(m, &ramp_t, &steps_t, &result) != TVD_OK) fail("misc knot", -1, tvd_misc_last_error(m));
    tvd_tensor got;
    if (tvd_misc_tensor_get(result, &got) != TVD_OK || ((float*)got.data)[4] != 2 * 5 * (steps + 1))
      fail("misc knot's value", -1, "");
    tvd_misc_release(result);
    result = NULL;
  }
  tvd_memory_stats stats;
  tvd_misc_memory_stats(m, &stats);
  if (stats.bytes_live != 0 || result != NULL) fail("misc: every value released", -1, "");
  tvd_misc_destroy(m);
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
  run_blob_errors(dir, out, lstm_input);
  run_misc_errors(out);
  fclose(out);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const int64_t tree_live = run_trees(argv[1]);
  const int64_t lstm_live = run_lstm(argv[1], &lstm_embedded) + run_lstm(argv[1], &lstm_blob);
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
