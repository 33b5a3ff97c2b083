/* The helpers of the C that tensorvm/vm/native_emit.py generates for exec_mode="native" (one call per
   instruction that needs more than a line). The generated unit is this file's text (with the runtime's in
   place of the #include) followed by the generated code, which defines the two functions declared here:
   the arity of VM function f (-1 when there is none) and its C function. See docs/native_mode.md. */
#include "tv_runtime.c"

#include <time.h>

static int32_t tvn_function_arity(int32_t f);
static tv_function tvn_function(int32_t f);

/* Kernel arguments: tensors, with ADTs (tuples) expanded into their fields recursively (the Relay VM's rule);
   the count found, or -1 when a value is neither or there are more than max. */
TV_UNUSED static int32_t tvn_flatten_into(tv_obj* o, tv_tensor** out, int32_t at, int32_t max) {
  if (at < 0 || o == NULL) return -1;
  if (o->kind == TV_KIND_TENSOR) {
    if (at >= max) return -1;
    out[at] = (tv_tensor*)o;
    return at + 1;
  }
  if (o->kind != TV_KIND_ADT) return -1;
  const tv_adt* adt = (const tv_adt*)o;
  for (int32_t i = 0; i < adt->nfields && at >= 0; ++i) at = tvn_flatten_into(adt->fields[i], out, at, max);
  return at;
}
TV_UNUSED static int32_t tvn_flatten(tv_obj* const* a, int32_t n, tv_tensor** out, int32_t max) {
  int32_t at = 0;
  if (n <= max) { /* the common case: every argument a tensor */
    while (at < n && a[at] != NULL && a[at]->kind == TV_KIND_TENSOR) {
      out[at] = (tv_tensor*)a[at];
      ++at;
    }
  }
  for (int32_t i = at; i < n && at >= 0; ++i) at = tvn_flatten_into(a[i], out, at, max);
  return at;
}
TV_UNUSED static int tvn_is_shape(const tv_tensor* t, int64_t rank) {
  return t->dtype_code == 0 && t->dtype_bits == 64 && t->ndim == 1 && t->shape[0] == rank;
}
TV_UNUSED static int32_t tvn_count_error(tv_ctx* ctx, int32_t fidx, int32_t pc, int32_t packed, int32_t expected) {
  tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "PackedFunc[%d] takes %d tensors (inputs and outputs, tuples flattened); "
               "the arguments do not give that many tensors", packed, expected);
  return TV_ERR_EXEC;
}
TV_UNUSED static int32_t tvn_arg_error(tv_ctx* ctx, int32_t fidx, int32_t pc, int32_t packed, int32_t k, const tv_tensor* t,
                             const char* dtype, int32_t ndim) {
  char shape[160] = "(";
  size_t used = 1;
  for (int32_t i = 0; i < t->ndim && used < sizeof shape - 24; ++i)
    used += (size_t)snprintf(shape + used, sizeof shape - used, i ? ", %lld" : "%lld", (long long)t->shape[i]);
  snprintf(shape + used, sizeof shape - used, ")");
  tv_error_set(ctx, TV_ERR_SHAPE, fidx, pc, "PackedFunc[%d]: argument %d must be a %s tensor of rank %d (and the "
               "kernel's static dims), got dtype code %d bits %d shape %s", packed, k, dtype, ndim, t->dtype_code,
               t->dtype_bits, shape);
  return TV_ERR_SHAPE;
}
/* An integer operand (offset, size) from a one-element integer tensor; -1 with the error set otherwise. */
TV_UNUSED static int tvn_int_operand(tv_ctx* ctx, const tv_obj* o, int64_t* value, int32_t fidx, int32_t pc, const char* what) {
  double d;
  int is_float;
  if (tv_scalar(o, value, &d, &is_float) != 0 || is_float) {
    tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "%s: expected an integer scalar", what);
    return -1;
  }
  return 0;
}
TV_UNUSED static int tvn_test(tv_ctx* ctx, const tv_obj* o, int64_t* i, double* d, int* f, int32_t fidx, int32_t pc) {
  if (tv_scalar(o, i, d, f) != 0) {
    tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "if: the condition must be a scalar");
    return -1;
  }
  return 0;
}
/* The dims of an int64 1-D shape tensor, checked (rank, non-negative); -1 with the error set otherwise. */
TV_UNUSED static int tvn_shape_operand(tv_ctx* ctx, const tv_obj* o, int64_t* dims, int32_t* ndim, int32_t fidx, int32_t pc,
                             const char* what) {
  const tv_tensor* t = (const tv_tensor*)o;
  if (o == NULL || o->kind != TV_KIND_TENSOR || t->dtype_code != 0 || t->dtype_bits != 64 || t->ndim != 1
      || t->shape[0] > TV_MAX_RANK) {
    tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "%s: expected an int64 1-D shape of at most %d dims", what, TV_MAX_RANK);
    return -1;
  }
  *ndim = (int32_t)t->shape[0];
  for (int32_t i = 0; i < *ndim; ++i) {
    dims[i] = ((const int64_t*)t->data)[i];
    if (dims[i] < 0) {
      tv_error_set(ctx, TV_ERR_SHAPE, fidx, pc, "%s: negative dimension %lld in a shape", what, (long long)dims[i]);
      return -1;
    }
  }
  return 0;
}
/* nbytes of a tensor of these dims and itemsize; -1 on overflow. */
TV_UNUSED static int64_t tvn_nbytes(const int64_t* dims, int32_t ndim, int64_t itemsize) {
  int64_t n = itemsize;
  for (int32_t i = 0; i < ndim; ++i)
    if (__builtin_mul_overflow(n, dims[i], &n)) return -1; /* (no division: this runs per allocation) */
  return n;
}
TV_UNUSED static int32_t tvn_alloc_storage(tv_ctx* ctx, int64_t nbytes, tv_obj** dst, int32_t fidx, int32_t pc) {
  if (nbytes < 0)
    return tv_error_set(ctx, TV_ERR_SHAPE, fidx, pc,
                        "alloc_storage: invalid byte count %lld (a shape whose bytes overflow int64, or a negative size)",
                        (long long)nbytes);
  tv_storage* s = tv_pool_alloc(ctx->pool, nbytes);
  if (s == NULL) return tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "out of memory (alloc_storage of %lld bytes)", (long long)nbytes);
  tv_decref(*dst);
  *dst = &s->h;
  return 0;
}
/* ---- a VM function's arena (tv_runtime.h's tv_arena; docs/native_mode.md, "Arena") ---------------- */
/* The most bytes one function's arena block may hold (the bytecode VM's _ARENA_LIMIT). */
#define TVN_ARENA_MAX ((int64_t)256 << 20)

/* A new arena of a function with `slots` slots, or NULL when out of memory. */
static tv_arena* tvn_arena_new(tv_pool* pool, int32_t slots) {
  const size_t size = sizeof(tv_arena) + sizeof(int64_t) * 3 * (size_t)slots + sizeof(tv_arena_view) * (size_t)slots;
  tv_arena* a = (tv_arena*)pool->allocator.alloc(pool->allocator.user, size, 64);
  if (a == NULL) return NULL;
  memset(a, 0, size);
  a->slots = slots;
  a->pool = pool;
  a->planned = (int64_t*)(a + 1);
  a->offsets = a->planned + slots;
  a->seen = a->offsets + slots;
  a->views = (tv_arena_view*)(a->seen + slots);
  for (int32_t k = 0; k < slots; ++k) a->seen[k] = -1;
  return a;
}

/* Function fidx's arena for this call (made on its first call), or NULL: the function's AllocStorage then
   take pool blocks (arenas off, disabled, in use by a call already running, or out of memory). A pool with
   a limit on its bytes places none: a block placed for small shapes could leave a larger shape's pool
   blocks no room under the limit while views of it are in use. */
TV_UNUSED static tv_arena* tvn_arena_begin(tv_ctx* ctx, int32_t fidx, int32_t nfuncs, int32_t slots) {
  tv_pool* pool = ctx->pool;
  if (pool->no_arenas || pool->limit_bytes >= 0 || fidx < 0 || fidx >= nfuncs || slots <= 0) return NULL;
  if (pool->narenas < nfuncs) {
    tv_arena** grown = (tv_arena**)pool->allocator.alloc(pool->allocator.user, sizeof(tv_arena*) * (size_t)nfuncs, 16);
    if (grown == NULL) return NULL;
    for (int32_t f = 0; f < nfuncs; ++f) grown[f] = f < pool->narenas ? pool->arenas[f] : NULL;
    if (pool->arenas != NULL) pool->allocator.free(pool->allocator.user, pool->arenas);
    pool->arenas = grown;
    pool->narenas = nfuncs;
  }
  tv_arena* a = pool->arenas[fidx];
  if (a == NULL && (a = pool->arenas[fidx] = tvn_arena_new(pool, slots)) == NULL) return NULL;
  if (a->busy || a->disabled || a->slots != slots) return NULL;
  a->busy = 1;
  a->grew = a->block == NULL;
  return a;
}

/* A released view: its slot is free again (a detached arena goes with its last view). */
static void tvn_arena_release(tv_storage* s) {
  tv_arena* a = ((tv_arena_view*)s)->arena;
  a->live -= 1;
  if (a->detached && a->live == 0) tv_arena_free(a);
}

/* AllocStorage of arena slot k: a view of the block when the slot's place holds nbytes, else a pool block. */
TV_UNUSED static int32_t tvn_arena_storage(tv_ctx* ctx, tv_arena* a, int32_t k, int64_t nbytes, tv_obj** dst,
                                           int32_t fidx, int32_t pc) {
  if (a != NULL && nbytes >= 0) {
    tv_arena_view* v = &a->views[k];
    if (a->block != NULL && nbytes <= a->planned[k] && v->s.h.refcount == 0) {
      v->s = (tv_storage){{1, TV_KIND_STORAGE, 0}, a->block + a->offsets[k], nbytes, 0, NULL, NULL, tvn_arena_release};
      v->arena = a;
      a->live += 1;
      tv_decref(*dst);
      *dst = &v->s.h;
      return 0;
    }
    a->grew = 1;
    if (nbytes > a->seen[k]) a->seen[k] = nbytes;  /* (the next placement's size: the largest asked) */
  }
  return tvn_alloc_storage(ctx, nbytes, dst, fidx, pc);
}

static int tvn_by_start(const void* x, const void* y) {
  const int64_t a = ((const int64_t*)x)[0], b = ((const int64_t*)y)[0];
  return (a > b) - (a < b);
}

/* Places n slots of sizes size[] with spans span[] (first and last pc) in one block, first fit from the
   largest: a slot goes at the lowest 64-byte aligned offset clear of every placed slot whose span overlaps
   its own. Returns the block's bytes, or -1 when out of memory for the work arrays. */
static int64_t tvn_arena_place(const tv_allocator* al, int32_t n, const int64_t* size, const int32_t (*span)[2],
                               int64_t* offset) {
  int32_t* order = (int32_t*)al->alloc(al->user, sizeof(int32_t) * (size_t)n, 16);
  int64_t* busy = (int64_t*)al->alloc(al->user, sizeof(int64_t) * 2 * (size_t)n, 16);
  if (order == NULL || busy == NULL) {
    if (order != NULL) al->free(al->user, order);
    if (busy != NULL) al->free(al->user, busy);
    return -1;
  }
  for (int32_t i = 0; i < n; ++i) {  /* (insertion sort: by size, largest first, then by slot) */
    int32_t j = i;
    while (j > 0 && size[order[j - 1]] < size[i]) { order[j] = order[j - 1]; --j; }
    order[j] = i;
  }
  int64_t total = 0;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t k = order[i];
    int32_t m = 0;  /* the placed slots live at the same time as k, as (start, end) */
    for (int32_t p = 0; p < i; ++p) {
      const int32_t q = order[p];
      if (span[q][0] <= span[k][1] && span[k][0] <= span[q][1] && size[q] > 0) {
        busy[2 * m] = offset[q];
        busy[2 * m + 1] = offset[q] + size[q];
        ++m;
      }
    }
    qsort(busy, (size_t)m, 2 * sizeof(int64_t), tvn_by_start);
    int64_t at = 0;
    for (int32_t p = 0; p < m && size[k] > 0; ++p) {
      if (at + size[k] <= busy[2 * p]) break;
      const int64_t end = (busy[2 * p + 1] + 63) & ~(int64_t)63;
      if (end > at) at = end;
    }
    offset[k] = at;
    if (at + size[k] > total) total = at + size[k];
  }
  al->free(al->user, order);
  al->free(al->user, busy);
  return total;
}

/* The end of a call that began with tvn_arena_begin (a, possibly NULL), after its registers are released:
   a view still alive (it reached the caller) detaches the arena, which its views then own; after a call
   that ended well (ok: a return or a tail call) and took pool blocks for some slots, the block is placed
   anew for the largest size each slot has needed (slots this call did not reach keep theirs). */
TV_UNUSED static void tvn_arena_end(tv_ctx* ctx, tv_arena* a, int32_t fidx, int32_t ok, const int32_t (*span)[2]) {
  if (a == NULL) return;
  tv_pool* pool = ctx->pool;
  a->busy = 0;
  if (a->live != 0) {
    a->detached = 1;
    pool->refcount += 1;  /* (the detached arena's reference: it gives memory back to the pool's allocator) */
    /* (in its place an arena that places nothing: the function takes pool blocks from now on) */
    if ((pool->arenas[fidx] = tvn_arena_new(pool, a->slots)) != NULL) pool->arenas[fidx]->disabled = 1;
    return;
  }
  if (!ok || !a->grew) return;
  tv_arena_drop_block(a);  /* (every view is released: nothing reads it) */
  for (int32_t k = 0; k < a->slots; ++k) {
    if (a->seen[k] > a->planned[k]) a->planned[k] = a->seen[k];
    a->seen[k] = -1;
  }
  const int64_t total = tvn_arena_place(&pool->allocator, a->slots, a->planned, span, a->offsets);
  const int64_t bytes = total > 64 ? total : 64;
  /* (a block past the bound, or no memory: the slots keep taking pool blocks) */
  if (total < 0 || total > TVN_ARENA_MAX || (a->block = (char*)tv_pool_fresh_block(pool, bytes)) == NULL) {
    a->disabled = 1;
    return;
  }
  a->block_bytes = bytes;
  a->grew = 0;
  pool->bytes_arena += bytes;  /* (tv_pool_fresh_block counted them in bytes_reserved) */
}

TV_UNUSED static int32_t tvn_alloc_tensor(tv_ctx* ctx, const tv_obj* storage, int64_t offset, const int64_t* dims, int32_t ndim,
                                int32_t code, int32_t bits, tv_obj** dst, int32_t fidx, int32_t pc) {
  if (storage == NULL || storage->kind != TV_KIND_STORAGE)
    return tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "alloc_tensor: expected a storage");
  tv_storage* s = (tv_storage*)storage;
  const int64_t nbytes = tvn_nbytes(dims, ndim, bits == 1 ? 1 : bits / 8);
  if (offset < 0) return tv_error_set(ctx, TV_ERR_SHAPE, fidx, pc, "alloc_tensor: negative byte offset %lld", (long long)offset);
  if (nbytes < 0 || offset > s->nbytes || nbytes > s->nbytes - offset)
    return tv_error_set(ctx, TV_ERR_SHAPE, fidx, pc, "alloc_tensor: a tensor of %lld bytes at byte offset %lld does not "
                        "fit in a storage of %lld bytes", (long long)nbytes, (long long)offset, (long long)s->nbytes);
  tv_tensor* t = tv_tensor_new(ctx->pool, s, (char*)s->data + offset, code, bits, ndim, dims);
  if (t == NULL) return tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "out of memory (alloc_tensor)");
  tv_decref(*dst);
  *dst = &t->h;
  return 0;
}
TV_UNUSED static int32_t tvn_shape_of(tv_ctx* ctx, const tv_obj* o, tv_obj** dst, int32_t fidx, int32_t pc) {
  if (o == NULL || o->kind != TV_KIND_TENSOR) return tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "shape_of: expected a tensor");
  const tv_tensor* t = (const tv_tensor*)o;
  tv_storage* s = tv_pool_alloc(ctx->pool, 8 * (int64_t)t->ndim);
  if (s == NULL) return tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "out of memory (shape_of)");
  for (int32_t i = 0; i < t->ndim; ++i) ((int64_t*)s->data)[i] = t->shape[i];
  const int64_t rank = t->ndim;
  tv_tensor* r = tv_tensor_new(ctx->pool, s, s->data, 0, 64, 1, &rank);
  tv_decref(&s->h);
  if (r == NULL) return tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "out of memory (shape_of)");
  tv_decref(*dst);
  *dst = &r->h;
  return 0;
}
/* ShapeOf into a register that only shape functions read, and only its dims (native_emit's shape_of
   registers): a tensor of the dims alone, no storage. Such a register is never killed, and had it held the
   tensor itself, every intermediate whose shape was taken stayed allocated to the end of the call
   (MobileNetV3-small at batch 8: 54 MB live at once instead of 9). */
TV_UNUSED static int32_t tvn_shape_header(tv_ctx* ctx, const tv_obj* o, tv_obj** dst, int32_t fidx, int32_t pc) {
  if (o == NULL || o->kind != TV_KIND_TENSOR) return tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "shape_of: expected a tensor");
  const tv_tensor* t = (const tv_tensor*)o;
  tv_tensor* r = tv_tensor_new(ctx->pool, NULL, NULL, t->dtype_code, t->dtype_bits, t->ndim, t->shape);
  if (r == NULL) return tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "out of memory (shape_of)");
  tv_decref(*dst);
  *dst = &r->h;
  return 0;
}
TV_UNUSED static int32_t tvn_reshape(tv_ctx* ctx, const tv_obj* o, const tv_obj* shape, tv_obj** dst, int32_t fidx, int32_t pc) {
  int64_t dims[TV_MAX_RANK];
  int32_t ndim;
  if (o == NULL || o->kind != TV_KIND_TENSOR) return tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "reshape_tensor: expected a tensor");
  if (tvn_shape_operand(ctx, shape, dims, &ndim, fidx, pc, "reshape_tensor")) return ctx->error.kind;
  const tv_tensor* t = (const tv_tensor*)o;
  if (tvn_nbytes(dims, ndim, 1) != tv_numel(t))
    return tv_error_set(ctx, TV_ERR_SHAPE, fidx, pc, "reshape_tensor: cannot view a tensor of %lld elements as a shape "
                        "of %lld", (long long)tv_numel(t), (long long)tvn_nbytes(dims, ndim, 1));
  tv_tensor* r = tv_tensor_new(ctx->pool, t->storage, t->data, t->dtype_code, t->dtype_bits, ndim, dims);
  if (r == NULL) return tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "out of memory (reshape_tensor)");
  tv_decref(*dst);
  *dst = &r->h;
  return 0;
}
TV_UNUSED static int32_t tvn_get_field(tv_ctx* ctx, const tv_obj* o, int64_t index, tv_obj** dst, int32_t fidx, int32_t pc) {
  /* (the index is the file's: any 64-bit value, checked against the value's fields) */
  if (o == NULL || o->kind != TV_KIND_ADT || index < 0 || index >= ((const tv_adt*)o)->nfields)
    return tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "get_field: expected an ADT or tuple value with field %lld",
                        (long long)index);
  tv_obj* f = ((const tv_adt*)o)->fields[index];
  tv_incref(f);
  tv_decref(*dst);
  *dst = f;
  return 0;
}
/* ``ref_write``: ``value`` into the reference cell ``cell`` (an ADT of TV_REF_TAG, whose one field changes: the
   only ADT that does), and ``()`` into *dst. */
TV_UNUSED static int32_t tvn_ref_write(tv_ctx* ctx, tv_obj* cell, tv_obj* value, tv_obj** dst, int32_t fidx,
                                       int32_t pc) {
  if (cell == NULL || cell->kind != TV_KIND_ADT || ((tv_adt*)cell)->tag != TV_REF_TAG || ((tv_adt*)cell)->nfields != 1)
    return tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "ref_write: expected a reference");
  tv_adt* unit = tv_adt_new(0, 0, NULL);
  if (unit == NULL) return tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "ref_write: out of memory");
  tv_incref(value);
  tv_obj* old = ((tv_adt*)cell)->fields[0];
  ((tv_adt*)cell)->fields[0] = value;
  tv_decref(old);
  tv_cells_note(ctx->pool, cell, value);
  tv_decref(*dst);
  *dst = &unit->h;
  return 0;
}
/* code 0: past the depth limit; 1: near the end of this thread's C stack (the caller may run again on a
   thread with a larger stack). */
TV_UNUSED static int32_t tvn_depth_error(tv_ctx* ctx, int32_t fidx, int32_t pc) {
  const int stack = ctx->depth <= ctx->max_depth;
  if (stack)
    tv_error_set(ctx, TV_ERR_DEPTH, fidx, pc, "recursion of %lld nested calls reaches the end of the thread's C "
                 "stack in native mode", (long long)ctx->depth);
  else
    tv_error_set(ctx, TV_ERR_DEPTH, fidx, pc, "recursion deeper than %lld nested calls in native mode",
                 (long long)ctx->max_depth);
  ctx->error.code = stack;
  return TV_ERR_DEPTH;
}
TV_UNUSED static inline int tvn_too_deep(tv_ctx* ctx, const void* here) {
  return ++ctx->depth > ctx->max_depth || (ctx->stack_limit != NULL && (const char*)here < ctx->stack_limit);
}
/* Tail calls of other functions and of closures: the calling function's frame ends first, and the frame
   that called it makes the call (tvn_trampoline), so that a loop of any length through several functions or
   closures runs in constant stack, as the bytecode VM reuses its frames (a self tail call is a goto, in the
   function itself). The function leaving asks for the call by moving the callee and its arguments into
   tvn_tail (tvn_tail_invoke, tvn_tail_closure: the references are the slot's) and returning TVN_TAIL; the
   code of every call checks for it. Per thread: the slot is filled and emptied with no call between. */
#define TVN_TAIL 0x5441494c /* (no error kind: those are small) */
#ifndef TVN_MAX_ARGS /* (the generated code defines it first: the most values one of its functions takes) */
#define TVN_MAX_ARGS 16
#endif
typedef struct {
  int32_t func, n;
  tv_obj* args[TVN_MAX_ARGS > 0 ? TVN_MAX_ARGS : 1];
} tvn_tail_call;
static _Thread_local tvn_tail_call tvn_tail;

TV_UNUSED static int32_t tvn_tail_invoke(int32_t f, tv_obj* const* args, int32_t n) {
  tvn_tail.func = f;
  tvn_tail.n = n;
  for (int32_t i = 0; i < n; ++i) {
    tvn_tail.args[i] = args[i];
    tv_incref(args[i]);
  }
  return TVN_TAIL;
}
/* The tail calls asked for, one after the other (each callee may ask for the next); *ret the last one's. */
TV_UNUSED static int32_t tvn_trampoline(tv_ctx* ctx, tv_obj** ret) {
  int32_t rc = TVN_TAIL;
  while (rc == TVN_TAIL) {
    tv_obj* a[TVN_MAX_ARGS > 0 ? TVN_MAX_ARGS : 1];
    a[0] = NULL;  /* (a function of no parameters reads none) */
    const int32_t n = tvn_tail.n;
    for (int32_t i = 0; i < n; ++i) a[i] = tvn_tail.args[i];
    rc = tvn_function(tvn_tail.func)(ctx, a, ret);
    for (int32_t i = 0; i < n; ++i) tv_decref(a[i]);
  }
  return rc;
}
/* VM function f on args (borrowed), its tail calls included; *ret a new reference. */
TV_UNUSED static int32_t tvn_call(tv_ctx* ctx, int32_t f, tv_obj* const* args, tv_obj** ret) {
  const int32_t rc = tvn_function(f)(ctx, args, ret);
  return rc == TVN_TAIL ? tvn_trampoline(ctx, ret) : rc;
}
/* The closure o's function (checked) and the number of values it takes, captured + nargs. */
static int32_t tvn_closure_of(tv_ctx* ctx, const tv_obj* o, int32_t nargs, int32_t fidx, int32_t pc,
                              const tv_closure** c) {
  if (o == NULL || o->kind != TV_KIND_CLOSURE)
    return tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "invoke_closure: expected a closure");
  *c = (const tv_closure*)o;
  const int32_t n = (*c)->nfree + nargs;
  if (tvn_function_arity((*c)->func) != n)
    return tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "invoke_closure: the closure's function takes a different number "
                        "of values (captured + arguments = %d)", n);
  return 0;
}
/* InvokeClosure: the closure's function with its captured values then args; *ret a new reference. */
TV_UNUSED static int32_t tvn_call_closure(tv_ctx* ctx, const tv_obj* o, tv_obj* const* args, int32_t nargs, tv_obj** ret,
                                int32_t fidx, int32_t pc) {
  const tv_closure* c = NULL;
  const int32_t bad = tvn_closure_of(ctx, o, nargs, fidx, pc, &c);
  if (bad) return bad;
  const int32_t n = c->nfree + nargs;
  tv_obj* all[n > 0 ? n : 1];
  all[0] = NULL;
  for (int32_t i = 0; i < c->nfree; ++i) all[i] = c->free_vars[i];
  for (int32_t i = 0; i < nargs; ++i) all[c->nfree + i] = args[i];
  if (tvn_too_deep(ctx, all)) return tvn_depth_error(ctx, fidx, pc);
  const int32_t rc = tvn_call(ctx, c->func, all, ret);
  ctx->depth -= 1;
  return rc;
}
/* InvokeClosure in tail position: the call asked for (TVN_TAIL), or the error. */
TV_UNUSED static int32_t tvn_tail_closure(tv_ctx* ctx, const tv_obj* o, tv_obj* const* args, int32_t nargs, int32_t fidx,
                                          int32_t pc) {
  const tv_closure* c = NULL;
  const int32_t bad = tvn_closure_of(ctx, o, nargs, fidx, pc, &c);
  if (bad) return bad;
  tv_obj* all[c->nfree + nargs > 0 ? c->nfree + nargs : 1];
  all[0] = NULL;
  for (int32_t i = 0; i < c->nfree; ++i) all[i] = c->free_vars[i];
  for (int32_t i = 0; i < nargs; ++i) all[c->nfree + i] = args[i];
  return tvn_tail_invoke(c->func, all, c->nfree + nargs);
}

/* DeviceCopy: the host is the one device, so a copy of a tensor is a new tensor of the pool with the same
   dtype, shape and bytes; any other value is shared (the bytecode VM's copy is an alias: same values). */
TV_UNUSED static int32_t tvn_device_copy(tv_ctx* ctx, tv_obj* o, tv_obj** dst, int32_t fidx, int32_t pc) {
  if (o == NULL || o->kind != TV_KIND_TENSOR) {
    tv_incref(o);
    tv_decref(*dst);
    *dst = o;
    return 0;
  }
  const tv_tensor* t = (const tv_tensor*)o;
  const int64_t nbytes = tv_numel(t) * tv_itemsize(t);
  tv_storage* s = tv_pool_alloc(ctx->pool, nbytes);
  if (s == NULL) return tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "out of memory (device_copy of %lld bytes)", (long long)nbytes);
  if (nbytes > 0) memcpy(s->data, t->data, (size_t)nbytes);
  tv_tensor* r = tv_tensor_new(ctx->pool, s, s->data, t->dtype_code, t->dtype_bits, t->ndim, t->shape);
  tv_decref(&s->h);
  if (r == NULL) return tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "out of memory (device_copy)");
  tv_decref(*dst);
  *dst = &r->h;
  return 0;
}

/* Profiling (VirtualMachine.profile in native mode): a thread sets its buffer of (calls, ns) rows, one per
   packed index, with tvn_profile_swap; tvn_invoke hands it to the call's context, and every kernel and
   shape-function call adds itself to its row. Thread-local, so VMs running this library on other threads
   are not counted. */
static __thread int64_t* tvn_profile_buffer;
static int32_t tvn_profiling_threads; /* threads with a buffer set: tvn_invoke reads the thread-local only then */

__attribute__((visibility("default"))) int64_t* tvn_profile_swap(int64_t* buffer) {
  int64_t* previous = tvn_profile_buffer;
  tvn_profile_buffer = buffer;
  __atomic_add_fetch(&tvn_profiling_threads, (buffer != NULL) - (previous != NULL), __ATOMIC_SEQ_CST);
  return previous;
}
TV_UNUSED static inline int64_t* tvn_profile_of_thread(void) {
  return __atomic_load_n(&tvn_profiling_threads, __ATOMIC_RELAXED) != 0 ? tvn_profile_buffer : NULL;
}
TV_UNUSED __attribute__((cold, noinline)) static int64_t tvn_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + (int64_t)t.tv_nsec;
}
TV_UNUSED __attribute__((cold, noinline)) static void tvn_profile_add(tv_ctx* ctx, int32_t packed, int64_t start) {
  ctx->profile[2 * packed] += 1;
  ctx->profile[2 * packed + 1] += tvn_now() - start;
}

/* An integer (GetTag, LoadConsti) in a register that also holds values: a 0-d int64 tensor from the pool,
   which every reader of the register takes as the VM takes the Python int (If, sizes, offsets: tv_scalar). */
TV_UNUSED static int32_t tvn_box_int(tv_ctx* ctx, int64_t value, tv_obj** dst, int32_t fidx, int32_t pc) {
  tv_storage* s = tv_pool_alloc(ctx->pool, 8);
  if (s == NULL) return tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "out of memory (an integer register)");
  *(int64_t*)s->data = value;
  tv_tensor* t = tv_tensor_new(ctx->pool, s, s->data, 0, 64, 0, NULL);
  tv_decref(&s->h);
  if (t == NULL) return tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "out of memory (an integer register)");
  tv_decref(*dst);
  *dst = &t->h;
  return 0;
}

/* The number of tensors a kernel's arguments flatten to (tuples expanded), or -1 (a value is neither). */
TV_UNUSED static int32_t tvn_flat_count(tv_obj* const* a, int32_t n) {
  int32_t count = 0;
  for (int32_t i = 0; i < n; ++i) {
    if (a[i] == NULL) return -1;
    if (a[i]->kind == TV_KIND_TENSOR) { ++count; continue; }
    if (a[i]->kind != TV_KIND_ADT) return -1;
    const tv_adt* adt = (const tv_adt*)a[i];
    const int32_t k = tvn_flat_count(adt->fields, adt->nfields);
    if (k < 0) return -1;
    count += k;
  }
  return count;
}

/* Primitive `packed` run by the host's Python callable (a kernel or shape function with no C function, or a
   case a C shape function leaves to Python): the arguments flattened as for a kernel, the call timed like a
   kernel's when profiling. Without a host callback (the standalone AOT library) it is an error, which its
   builder refuses before (aot/dynamic.py). */
TV_UNUSED __attribute__((noinline)) static int32_t tvn_callback(tv_ctx* ctx, tv_obj* const* a, int32_t n, int32_t fidx,
                                                                 int32_t pc, int32_t packed, uint64_t of_tensor) {
  if (ctx->callback == NULL)
    return tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "PackedFunc[%d] runs in Python, and this library runs without "
                        "Python", packed);
  const int32_t count = tvn_flat_count(a, n);
  if (count < 0) return tvn_count_error(ctx, fidx, pc, packed, n);
  tv_tensor* local[16];
  tv_tensor** t = count <= 16 ? local : (tv_tensor**)malloc(sizeof(tv_tensor*) * (size_t)count);
  if (t == NULL) return tv_error_set(ctx, TV_ERR_EXEC, fidx, pc, "out of memory (PackedFunc[%d]'s arguments)", packed);
  tvn_flatten(a, n, t, count);
  int32_t rc;
  if (__builtin_expect(ctx->profile == NULL, 1)) rc = ctx->callback(ctx, packed, t, count, of_tensor);
  else { const int64_t start = tvn_now(); rc = ctx->callback(ctx, packed, t, count, of_tensor); tvn_profile_add(ctx, packed, start); }
  if (t != local) free(t);
  if (rc != 0) {
    tv_error_set(ctx, TV_ERR_PYTHON, fidx, pc, "PackedFunc[%d]: its Python callable raised", packed);
    ctx->error.packed = packed;
    return TV_ERR_PYTHON;
  }
  return 0;
}
