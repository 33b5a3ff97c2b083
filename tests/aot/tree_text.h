/* tree_text.h: a Tree of the Tree-LSTM's standalone library (a model named "tree", tensorvm AOT with
   dynamic=True) built with its constructors from the text form benchmarks/models/treelstm.py writes
   (tree_lines): a tree in preorder, "L x1..xI" for a leaf or "N <left> <right> x1..xI" for a node. Shared
   by tests/aot/dynamic_main.c and benchmarks/aot_dynamic_bench.c; include "tree.h" first. */
#ifndef TREE_TEXT_H_
#define TREE_TEXT_H_

#include <stdio.h>
#include <stdlib.h>

/* The next tree of `in` (input_size floats per node), or NULL with *rc set: a library status (its message in
   tvd_tree_last_error(m)) or -1 for text that does not parse. The caller releases the tree. */
static tvd_value* tree_from_text(tvd_model* m, FILE* in, int64_t input_size, int32_t* rc) {
  char kind[2];
  *rc = -1;
  if (fscanf(in, "%1s", kind) != 1 || (kind[0] != 'N' && kind[0] != 'L')) return NULL;
  tvd_value* left = NULL;
  tvd_value* right = NULL;
  if (kind[0] == 'N' && ((left = tree_from_text(m, in, input_size, rc)) == NULL ||
                         (right = tree_from_text(m, in, input_size, rc)) == NULL)) {
    tvd_tree_release(left);
    return NULL;
  }
  float* x = (float*)malloc(sizeof(float) * (size_t)(input_size > 0 ? input_size : 1));
  int ok = x != NULL;
  for (int64_t i = 0; ok && i < input_size; ++i) ok = fscanf(in, "%f", &x[i]) == 1;
  int64_t shape[2] = {1, input_size};
  tvd_tensor t = {x, {TVD_DEVICE_CPU, 0}, 2, {TVD_FLOAT, 32, 1}, shape, NULL, 0};
  tvd_value* xv = NULL;
  tvd_value* node = NULL;
  if (ok && (*rc = tvd_tree_tensor(m, &t, &xv)) == TVD_OK) /* (the value holds a copy of x) */
    *rc = kind[0] == 'N' ? tvd_tree_Tree_Node(m, left, right, xv, &node) : tvd_tree_Tree_Leaf(m, xv, &node);
  free(x);
  tvd_tree_release(xv); /* (the node holds its own references) */
  tvd_tree_release(left);
  tvd_tree_release(right);
  return node;
}

#endif /* TREE_TEXT_H_ */
