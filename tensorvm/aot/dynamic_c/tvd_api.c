/* The C API of a standalone library of a dynamic program (tensorvm AOT with dynamic=True; the generated
   unit is described in tensorvm/aot/dynamic.py, the API in docs/aot_dynamic.md). This text follows the
   runtime (tv_runtime.c), the kernels, the C shape functions and the native functions of the program
   (native_emit.py); the generated unit defines TVD_FN(x) (the model's prefix: tvd_<name>_x) before it and
   the tables declared below after it, then the entry points, constructors and type checks, which call the
   helpers here. No Python: values are the runtime's reference-counted objects, memory comes from the
   application's allocator through the pool. */
#include <pthread.h>

/* ---- what the generated unit defines after this text ----------------------------------------------- */
typedef struct {
  const void* data;
  int32_t code, bits, ndim;
  const int64_t* shape;
} tvd_constant;

static int64_t tvd_num_constants(void);
static const tvd_constant* tvd_constant_info(int64_t k);
static const char* tvd_function_name(int32_t f);   /* the VM function's name ("?" when out of range) */
static const char* tvd_closure_signature(int32_t f); /* its type as a closure's ("?": the program makes none) */
static const char* tvd_sym_name(int32_t k);          /* a named dim of the parameters' types (tvd_syms) */
/* A kernel's (packed index) name and the message of its error code; *runtime: a run-time fault (else a shape
   check). */
static const char* tvd_kernel_error(int32_t packed, int32_t code, const char** kernel, int* runtime);
static const char* tvd_packed_name(int32_t packed);

#define TVD_DEFAULT_MAX_DEPTH 10000
#define TVD_STACK_MARGIN (256 * 1024) /* bytes of C stack a call keeps free (ASan's frames are large) */

struct tvd_model {
  tv_ctx ctx;
  tv_pool* pool;
  tv_obj** constants;
  int64_t nconstants;   /* (0 until a params blob is loaded, in a library built with constants="blob") */
  unsigned char* blob; /* that blob's block (tvd_blob.c), which the constants view; NULL: embedded constants */
  char message[1024]; /* the last error ("" after a success) */
};

/* ---- the application's allocator for ADTs, closures and kernel temporaries (tvd_prologue.h) ----------
   Each block starts with the pool it came from (one counted reference), so a value freed after its model is
   gone still goes back to the allocator that made it. The API functions set the calling thread's current
   pool; on a thread without one (a kernel's OpenMP worker asking for a temporary) the C library's heap
   serves, recorded as pool NULL. */
static _Thread_local tv_pool* tvd_current_pool;
#define TVD_HEADER 16

static void* tvd_obj_malloc(size_t size) {
  tv_pool* pool = tvd_current_pool;
  char* block = pool != NULL ? (char*)pool->allocator.alloc(pool->allocator.user, size + TVD_HEADER, 16)
                             : (char*)malloc(size + TVD_HEADER);
  if (block == NULL) return NULL;
  *(tv_pool**)block = pool;
  if (pool != NULL) pool->refcount += 1;
  return block + TVD_HEADER;
}

static void tvd_obj_free(void* ptr) {
  if (ptr == NULL) return;
  char* block = (char*)ptr - TVD_HEADER;
  tv_pool* pool = *(tv_pool**)block;
  if (pool == NULL) {
    free(block);
    return;
  }
  pool->allocator.free(pool->allocator.user, block);
  tv_pool_decref(pool);
}

/* A storage the pool does not own (a constant, or an argument's data lent for one call): only its struct goes
   back to the pool. */
static char tvd_lent_marker;
static void tvd_release_foreign(tv_storage* s) {
  tv_pool* pool = s->pool;
  tv_pool_keep(pool, &pool->spare_storages, &pool->num_spare_storages, s);
  tv_pool_decref(pool);
}

/* ---- errors ---------------------------------------------------------------------------------------- */
__attribute__((format(printf, 3, 4))) static int32_t tvd_fail(tvd_model* m, int32_t status, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(m->message, sizeof m->message, fmt, ap);
  va_end(ap);
  return status;
}

const char* TVD_FN(last_error)(const tvd_model* m) { return m != NULL ? m->message : "no model (NULL)"; }

/* Saves and sets the thread's current pool for the duration of one API call. */
typedef struct {
  tv_pool* saved;
} tvd_scope;

static tvd_scope tvd_enter(tvd_model* m) {
  tvd_scope scope = {tvd_current_pool};
  tvd_current_pool = m->pool;
  m->message[0] = '\0';
  return scope;
}

static void tvd_leave(tvd_scope scope) { tvd_current_pool = scope.saved; }

/* ---- the model ------------------------------------------------------------------------------------- */
static int64_t tvd_constant_bytes(const tvd_constant* c) {
  int64_t n = c->bits == 1 ? 1 : c->bits / 8;
  for (int32_t i = 0; i < c->ndim; ++i) n *= c->shape[i];
  return n;
}

static int32_t tvd_constant_object(tvd_model* m, const tvd_constant* c, const void* data, tv_obj** out) {
  tv_pool* pool = m->pool;
  tv_storage* s = (tv_storage*)tv_pool_take(pool, &pool->spare_storages, &pool->num_spare_storages, sizeof *s);
  if (s == NULL) return TVD_ERR_MEMORY;
  const int64_t n = tvd_constant_bytes(c);
  s->h.refcount = 1;
  s->h.kind = TV_KIND_STORAGE;
  s->data = (void*)(uintptr_t)data; /* (read only: results viewing a constant are copied, tvd_own) */
  s->nbytes = n;
  s->block_bytes = 0;
  s->pool = pool;
  pool->refcount += 1;
  s->py_owner = NULL;
  s->release = tvd_release_foreign;
  tv_tensor* t = tv_tensor_new(pool, s, s->data, c->code, c->bits, c->ndim, c->shape);
  tv_decref(&s->h);
  if (t == NULL) return TVD_ERR_MEMORY;
  *out = &t->h;
  return TVD_OK;
}

void TVD_FN(destroy)(tvd_model* m) {
  if (m == NULL) return;
  tvd_scope scope = tvd_enter(m);
  tv_cells_release(m->pool);
  for (int64_t k = 0; k < m->nconstants; ++k) tv_decref(m->constants[k]);
  tv_pool* pool = m->pool;
  if (m->constants != NULL) pool->allocator.free(pool->allocator.user, m->constants);
  if (m->blob != NULL) pool->allocator.free(pool->allocator.user, m->blob); /* (no value views a constant) */
  pool->allocator.free(pool->allocator.user, m);
  tvd_leave(scope);
  tv_pool_decref(pool); /* (freed when the last value made by the model goes too) */
}

int32_t TVD_FN(create)(const tvd_options* options, tvd_model** out) {
  if (out == NULL) return TVD_ERR_ARGUMENT;
  *out = NULL;
  const tvd_allocator* a = options != NULL ? options->allocator : NULL;
  if (a != NULL && (a->alloc == NULL || a->free == NULL)) return TVD_ERR_ARGUMENT;
  tv_allocator allocator = {tv_default_alloc, tv_default_free, NULL};
  if (a != NULL) allocator = (tv_allocator){a->alloc, a->free, a->user};
  tv_pool* pool = tv_pool_new_with(options != NULL ? options->memory_limit : -1, &allocator);
  if (pool == NULL) return TVD_ERR_MEMORY;
  tvd_model* m = (tvd_model*)allocator.alloc(allocator.user, sizeof(tvd_model), 64);
  if (m == NULL) {
    tv_pool_decref(pool);
    return TVD_ERR_MEMORY;
  }
  memset(m, 0, sizeof *m);
  m->pool = pool;
  m->ctx.pool = pool;
  m->ctx.max_depth = options != NULL && options->max_depth > 0 ? options->max_depth : TVD_DEFAULT_MAX_DEPTH;
  const int64_t n = tvd_num_constants();
  m->constants = (tv_obj**)allocator.alloc(allocator.user, sizeof(tv_obj*) * (size_t)(n > 0 ? n : 1), 16);
  if (m->constants == NULL) {
    TVD_FN(destroy)(m);
    return TVD_ERR_MEMORY;
  }
#ifndef TVD_BLOB_PARAMS /* (else the constants come with load_params, tvd_blob.c) */
  for (int64_t k = 0; k < n; ++k) {
    if (tvd_constant_object(m, tvd_constant_info(k), tvd_constant_info(k)->data, &m->constants[k]) != TVD_OK) {
      TVD_FN(destroy)(m);
      return TVD_ERR_MEMORY;
    }
    m->nconstants = k + 1;
  }
#endif
  m->ctx.constants = m->constants;
  m->ctx.nconstants = m->nconstants;
  *out = m;
  return TVD_OK;
}

int32_t TVD_FN(set_num_threads)(int32_t n) {
  tv_set_num_threads(n);
  return tv_get_num_threads();
}

void TVD_FN(trim)(tvd_model* m) {
  if (m != NULL) tv_pool_release_cached(m->pool);
}

void TVD_FN(memory_stats)(const tvd_model* m, tvd_memory_stats* out) {
  if (m == NULL || out == NULL) return;
  const tv_pool* p = m->pool;
  *out = (tvd_memory_stats){p->num_allocations, p->num_frees, p->reuse_hits, p->bytes_live, p->peak_bytes,
                            p->bytes_reserved, p->bytes_cached};
}

/* ---- values ---------------------------------------------------------------------------------------- */
static tv_obj* tvd_obj(const tvd_value* v) { return (tv_obj*)(uintptr_t)v; }

void TVD_FN(retain)(tvd_value* v) { tv_incref(tvd_obj(v)); }

/* (no current pool needed: each block records the pool it goes back to) */
void TVD_FN(release)(tvd_value* v) { tv_decref(tvd_obj(v)); }

int32_t TVD_FN(is_tensor)(const tvd_value* v) { return v != NULL && tvd_obj(v)->kind == TV_KIND_TENSOR; }

int32_t TVD_FN(is_closure)(const tvd_value* v) { return v != NULL && tvd_obj(v)->kind == TV_KIND_CLOSURE; }

int64_t TVD_FN(tag)(const tvd_value* v) {
  return v != NULL && tvd_obj(v)->kind == TV_KIND_ADT ? ((const tv_adt*)tvd_obj(v))->tag : -1;
}

int32_t TVD_FN(num_fields)(const tvd_value* v) {
  return v != NULL && tvd_obj(v)->kind == TV_KIND_ADT ? ((const tv_adt*)tvd_obj(v))->nfields : -1;
}

tvd_value* TVD_FN(field)(const tvd_value* v, int32_t i) {
  if (v == NULL || tvd_obj(v)->kind != TV_KIND_ADT) return NULL;
  const tv_adt* a = (const tv_adt*)tvd_obj(v);
  return i >= 0 && i < a->nfields ? (tvd_value*)a->fields[i] : NULL;
}

int32_t TVD_FN(tensor_get)(const tvd_value* v, tvd_tensor* out) {
  if (v == NULL || out == NULL || tvd_obj(v)->kind != TV_KIND_TENSOR) return TVD_ERR_ARGUMENT;
  tv_tensor* t = (tv_tensor*)tvd_obj(v);
  *out = (tvd_tensor){t->data, {TVD_DEVICE_CPU, 0}, t->ndim, {(uint8_t)t->dtype_code, (uint8_t)t->dtype_bits, 1},
                      t->shape, NULL, 0};
  return TVD_OK;
}

static int tvd_dtype_known(int32_t code, int32_t bits) {
  switch (code * 100 + bits) {
    case 8: case 16: case 32: case 64: case 101: case 108: case 116: case 132: case 164: case 216: case 232: case 264:
      return 1;
    default:
      return 0;
  }
}

static void tvd_shape_text(char* buf, size_t size, int32_t ndim, const int64_t* shape) {
  size_t used = (size_t)snprintf(buf, size, "(");
  for (int32_t i = 0; i < ndim && used + 24 < size; ++i)
    used += (size_t)snprintf(buf + used, size - used, i ? ", %lld" : "%lld", (long long)shape[i]);
  snprintf(buf + used, size - used, ")");
}

/* A tensor object for the DLPack-style tensor dl: its data copied into the pool (copy), or lent for one
   call (tvd_own copies what a result keeps of it). Checks what a tensor must be; dtype code < 0: any. */
static int32_t tvd_tensor_object(tvd_model* m, const tvd_tensor* dl, int copy, int32_t code, int32_t bits, int32_t ndim,
                                 const int64_t* dims, const char* where, tv_obj** out) {
  char got[200];
  if (dl == NULL) return tvd_fail(m, TVD_ERR_ARGUMENT, "%s: expected a tensor, got NULL", where);
  if (dl->device.device_type != TVD_DEVICE_CPU)
    return tvd_fail(m, TVD_ERR_ARGUMENT, "%s: expected a CPU tensor (device type %d), got device type %d", where,
                    TVD_DEVICE_CPU, dl->device.device_type);
  if (dl->ndim < 0 || dl->ndim > TV_MAX_RANK || (dl->ndim > 0 && dl->shape == NULL))
    return tvd_fail(m, TVD_ERR_ARGUMENT, "%s: a tensor of rank %d (at most %d dims, with a shape)", where, dl->ndim,
                    TV_MAX_RANK);
  tvd_shape_text(got, sizeof got, dl->ndim, dl->shape);
  if (dl->dtype.lanes != 1 || !tvd_dtype_known(dl->dtype.code, dl->dtype.bits) ||
      (code >= 0 && (dl->dtype.code != code || dl->dtype.bits != bits)))
    return tvd_fail(m, TVD_ERR_ARGUMENT, "%s: expected dtype code %d bits %d, got code %d bits %d lanes %d (shape %s)",
                    where, code, bits, dl->dtype.code, dl->dtype.bits, dl->dtype.lanes, got);
  if (ndim >= 0 && dl->ndim != ndim)
    return tvd_fail(m, TVD_ERR_ARGUMENT, "%s: expected a tensor of rank %d, got rank %d (shape %s)", where, ndim,
                    dl->ndim, got);
  int64_t numel = 1, stride = 1;
  for (int32_t i = dl->ndim - 1; i >= 0; --i) {
    if (dl->shape[i] < 0) return tvd_fail(m, TVD_ERR_ARGUMENT, "%s: negative dimension in shape %s", where, got);
    if (ndim >= 0 && dims[i] >= 0 && dl->shape[i] != dims[i])
      return tvd_fail(m, TVD_ERR_ARGUMENT, "%s: dimension %d must be %lld, got shape %s", where, i,
                      (long long)dims[i], got);
    if (dl->strides != NULL && dl->shape[i] > 1 && dl->strides[i] != stride)
      return tvd_fail(m, TVD_ERR_ARGUMENT, "%s: the tensor must be compact row-major (strides NULL or compact)", where);
    if (dl->shape[i] != 0 && numel > INT64_MAX / 16 / dl->shape[i])
      return tvd_fail(m, TVD_ERR_ARGUMENT, "%s: shape %s is too large", where, got);
    numel *= dl->shape[i];
    stride *= dl->shape[i];
  }
  const int64_t nbytes = numel * (dl->dtype.bits == 1 ? 1 : dl->dtype.bits / 8);
  if (dl->data == NULL && nbytes > 0) return tvd_fail(m, TVD_ERR_ARGUMENT, "%s: tensor data is NULL", where);
  const char* data = dl->data != NULL ? (const char*)dl->data + dl->byte_offset : NULL; /* (empty: may be NULL) */
  tv_pool* pool = m->pool;
  tv_storage* s;
  if (copy) {
    if ((s = tv_pool_alloc(pool, nbytes)) == NULL)
      return tvd_fail(m, TVD_ERR_MEMORY, "%s: out of memory (%lld bytes)", where, (long long)nbytes);
    if (nbytes > 0) memcpy(s->data, data, (size_t)nbytes);
  } else {
    s = (tv_storage*)tv_pool_take(pool, &pool->spare_storages, &pool->num_spare_storages, sizeof *s);
    if (s == NULL) return tvd_fail(m, TVD_ERR_MEMORY, "%s: out of memory", where);
    s->h.refcount = 1;
    s->h.kind = TV_KIND_STORAGE;
    s->data = (void*)(uintptr_t)data;
    s->nbytes = nbytes;
    s->block_bytes = 0;
    s->pool = pool;
    pool->refcount += 1;
    s->py_owner = &tvd_lent_marker;
    s->release = tvd_release_foreign;
  }
  tv_tensor* t = tv_tensor_new(pool, s, s->data, dl->dtype.code, dl->dtype.bits, dl->ndim, dl->shape);
  tv_decref(&s->h);
  if (t == NULL) return tvd_fail(m, TVD_ERR_MEMORY, "%s: out of memory", where);
  *out = &t->h;
  return TVD_OK;
}

int32_t TVD_FN(tensor)(tvd_model* m, const tvd_tensor* dl, tvd_value** out) {
  if (m == NULL || out == NULL) return TVD_ERR_ARGUMENT;
  *out = NULL;
  tvd_scope scope = tvd_enter(m);
  tv_obj* o = NULL;
  const int32_t rc = tvd_tensor_object(m, dl, 1, -1, 0, -1, NULL, "tensor", &o);
  *out = (tvd_value*)o;
  tvd_leave(scope);
  return rc;
}

/* A new ADT of tag with these fields (new references), after check (the constructor's field types). */
TV_UNUSED static int32_t tvd_construct(tvd_model* m, const char* what, int64_t tag, int32_t n, tvd_value* const* fields,
                             int32_t (*check)(tvd_model*, tv_obj* const*), tvd_value** out) {
  if (m == NULL || out == NULL) return TVD_ERR_ARGUMENT;
  *out = NULL;
  tvd_scope scope = tvd_enter(m);
  int32_t rc = TVD_OK;
  tv_obj* values[n > 0 ? n : 1];
  values[0] = NULL;
  for (int32_t i = 0; i < n && rc == TVD_OK; ++i) {
    values[i] = tvd_obj(fields[i]);
    if (values[i] == NULL) rc = tvd_fail(m, TVD_ERR_ARGUMENT, "%s: field %d is NULL", what, i);
  }
  if (rc == TVD_OK && check != NULL) rc = check(m, values);
  if (rc == TVD_OK) {
    tv_adt* a = tv_adt_new(tag, n, values);
    if (a == NULL) rc = tvd_fail(m, TVD_ERR_MEMORY, "%s: out of memory", what);
    else *out = (tvd_value*)&a->h;
  }
  tvd_leave(scope);
  return rc;
}

int32_t TVD_FN(tuple)(tvd_model* m, int32_t n, tvd_value* const* fields, tvd_value** out) {
  if (n < 0 || (n > 0 && fields == NULL)) return m != NULL ? tvd_fail(m, TVD_ERR_ARGUMENT, "tuple: bad fields") : TVD_ERR_ARGUMENT;
  return tvd_construct(m, "tuple", 0, n, fields, NULL, out);
}

/* ---- type checks (the generated checks call these) ------------------------------------------------- */
TV_UNUSED static int32_t tvd_check_tensor(tvd_model* m, const tv_obj* o, int32_t code, int32_t bits, int32_t ndim,
                                const int64_t* dims, const char* where, const char* type) {
  if (o == NULL || o->kind != TV_KIND_TENSOR)
    return tvd_fail(m, TVD_ERR_ARGUMENT, "%s: expected a tensor %s, got %s", where, type,
                    o == NULL ? "NULL" : o->kind == TV_KIND_ADT ? "an ADT value or tuple" : "a closure");
  const tv_tensor* t = (const tv_tensor*)o;
  int ok = t->dtype_code == code && t->dtype_bits == bits && t->ndim == ndim;
  for (int32_t i = 0; ok && i < ndim; ++i) ok = dims[i] < 0 || t->shape[i] == dims[i];
  if (!ok) {
    char got[200];
    tvd_shape_text(got, sizeof got, t->ndim, t->shape);
    return tvd_fail(m, TVD_ERR_ARGUMENT, "%s: expected %s, got a tensor of dtype code %d bits %d, shape %s", where, type,
                    t->dtype_code, t->dtype_bits, got);
  }
  return TVD_OK;
}

/* An ADT value of the ADT with type index `type` (tags (type + 1) << 24 | constructor, nctors of them), or a
   tuple of n fields (type < 0). */
TV_UNUSED static int32_t tvd_check_adt(tvd_model* m, const tv_obj* o, int32_t type, int32_t nctors, const int32_t* arity,
                             int32_t n, const char* where, const char* name) {
  if (o == NULL || o->kind != TV_KIND_ADT)
    return tvd_fail(m, TVD_ERR_ARGUMENT, "%s: expected %s %s, got %s", where, type < 0 ? "a tuple" : "a value of type",
                    name, o == NULL ? "NULL" : o->kind == TV_KIND_TENSOR ? "a tensor" : "a closure");
  const tv_adt* a = (const tv_adt*)o;
  if (type < 0) {
    if (a->tag != 0 || a->nfields != n)
      return tvd_fail(m, TVD_ERR_ARGUMENT, "%s: expected a tuple of %d fields %s, got %s of %d fields", where, n, name,
                      a->tag == 0 ? "a tuple" : "an ADT value", a->nfields);
    return TVD_OK;
  }
  const int64_t t = (a->tag >> 24) - 1, c = a->tag & ((1 << 24) - 1);
  if (t != type || c >= nctors || a->nfields != arity[c])
    return tvd_fail(m, TVD_ERR_ARGUMENT, "%s: expected a value of type %s, got %s (tag %lld)", where, name,
                    a->tag == 0 ? "a tuple" : "a value of another type", (long long)a->tag);
  return TVD_OK;
}

/* A closure of this program taking nargs arguments whose function is one of accept (those whose signature fits
   the parameter's function type; the generated check lists them). */
TV_UNUSED static int32_t tvd_check_closure(tvd_model* m, const tv_obj* o, int32_t nargs, int32_t naccept,
                                           const int32_t* accept, const char* where, const char* type) {
  if (o == NULL || o->kind != TV_KIND_CLOSURE)
    return tvd_fail(m, TVD_ERR_ARGUMENT, "%s: expected a function %s (a closure returned by the program), got %s", where,
                    type, o == NULL ? "NULL" : o->kind == TV_KIND_TENSOR ? "a tensor" : "an ADT value or tuple");
  const tv_closure* c = (const tv_closure*)o;
  const int32_t arity = tvn_function_arity(c->func);
  if (arity < 0)
    return tvd_fail(m, TVD_ERR_ARGUMENT, "%s: expected a function %s, got a closure of no function of this program "
                    "(index %d: another model's?)", where, type, c->func);
  if (arity - c->nfree != nargs)
    return tvd_fail(m, TVD_ERR_ARGUMENT, "%s: expected a function of %d argument(s) %s, got a closure of %d argument(s) "
                    "%s (VM function '%s')", where, nargs, type, arity - c->nfree, tvd_closure_signature(c->func),
                    tvd_function_name(c->func));
  for (int32_t i = 0; i < naccept; ++i)
    if (accept[i] == c->func) return TVD_OK;
  return tvd_fail(m, TVD_ERR_ARGUMENT, "%s: expected a function %s, got a closure of another signature %s (VM function "
                  "'%s')", where, type, tvd_closure_signature(c->func), tvd_function_name(c->func));
}

/* The values the named dims (Tensor[(n, 4)]) take in one call's arguments: bound at their first tensor, in
   parameter order and depth first through tuples and ADT fields, as the VM binds them; where[k] NULL: unbound. */
typedef struct {
  int64_t value[TVD_NUM_SYMS];
  const char* where[TVD_NUM_SYMS];
} tvd_syms;

/* Binds or checks the named dims of a tensor of type `type` (sym[i] >= 0: dimension i is named dim sym[i]). */
TV_UNUSED static int32_t tvd_bind_dims(tvd_model* m, tvd_syms* s, int32_t ndim, const int64_t* shape, const int32_t* sym,
                                       const char* where, const char* type) {
  for (int32_t i = 0; i < ndim; ++i) {
    const int32_t k = sym[i];
    if (k < 0) continue;
    if (s->where[k] == NULL) {
      s->value[k] = shape[i];
      s->where[k] = where;
    } else if (s->value[k] != shape[i]) {
      char got[200];
      tvd_shape_text(got, sizeof got, ndim, shape);
      return tvd_fail(m, TVD_ERR_ARGUMENT, "%s: expected %s, got a tensor of shape %s: dimension %d is %s = %lld, but %s "
                      "has %s = %lld", where, type, got, i, tvd_sym_name(k), (long long)shape[i], s->where[k],
                      tvd_sym_name(k), (long long)s->value[k]);
    }
  }
  return TVD_OK;
}

/* ---- calls ----------------------------------------------------------------------------------------- */
/* The lowest address this thread's calls may reach (NULL: unknown), found once per thread. */
static const char* tvd_stack_limit(void) {
  static _Thread_local int known = 0;
  static _Thread_local const char* limit = NULL;
  if (known) return limit;
  known = 1;
#ifdef __GLIBC__
  pthread_attr_t attr;
  void* addr = NULL;
  size_t size = 0;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) return NULL;
  const int ok = pthread_attr_getstack(&attr, &addr, &size) == 0;
  pthread_attr_destroy(&attr);
  if (ok && size > 2 * TVD_STACK_MARGIN) limit = (const char*)addr + TVD_STACK_MARGIN;
#endif
  return limit;
}

/* Makes the result the caller's: a tensor viewing memory the pool does not own (an argument's data lent for
   the call, or a constant) is replaced in its slot by a tensor over a copy (never changed in place: the
   constants' tensor objects are shared by every call). The ADTs and closures holding such tensors were made
   by this call (the caller's values hold pool memory only), so their slots are ours to change. Loops along
   the last field (a long list in constant stack). */
static int32_t tvd_own(tvd_model* m, tv_obj** slot, const char* what) {
  while (*slot != NULL) {
    tv_obj* o = *slot;
    if (o->kind == TV_KIND_TENSOR) {
      const tv_tensor* t = (const tv_tensor*)o;
      const tv_storage* s = t->storage;
      if (s->release == tv_pool_give_back) return TVD_OK;
      tv_storage* copy = tv_pool_alloc(m->pool, s->nbytes);
      if (copy == NULL) return tvd_fail(m, TVD_ERR_MEMORY, "%s: out of memory copying a result", what);
      if (s->nbytes > 0) memcpy(copy->data, s->data, (size_t)s->nbytes);
      tv_tensor* fresh = tv_tensor_new(m->pool, copy, (char*)copy->data + ((const char*)t->data - (const char*)s->data),
                                       t->dtype_code, t->dtype_bits, t->ndim, t->shape);
      tv_decref(&copy->h);
      if (fresh == NULL) return tvd_fail(m, TVD_ERR_MEMORY, "%s: out of memory copying a result", what);
      tv_decref(o);
      *slot = &fresh->h;
      return TVD_OK;
    }
    tv_obj** fields;
    int32_t n;
    if (o->kind == TV_KIND_ADT) {
      fields = ((tv_adt*)o)->fields;
      n = ((tv_adt*)o)->nfields;
    } else if (o->kind == TV_KIND_CLOSURE) {
      fields = ((tv_closure*)o)->free_vars;
      n = ((tv_closure*)o)->nfree;
    } else {
      return TVD_OK;
    }
    if (n == 0) return TVD_OK;
    for (int32_t i = 0; i < n - 1; ++i) {
      const int32_t rc = tvd_own(m, &fields[i], what);
      if (rc != TVD_OK) return rc;
    }
    slot = &fields[n - 1];
  }
  return TVD_OK;
}

/* The status and message of a failed native call. */
static int32_t tvd_call_error(tvd_model* m, const char* what) {
  const tv_error* e = &m->ctx.error;
  char where[160];
  snprintf(where, sizeof where, " [in VM function '%s' at pc %d]", tvd_function_name(e->func), e->pc);
  switch (e->kind) {
    case TV_ERR_KERNEL: {
      const char* kernel = "?";
      int runtime = 1;
      const char* text = tvd_kernel_error(e->packed, e->code, &kernel, &runtime);
      return tvd_fail(m, runtime ? TVD_ERR_EXEC : TVD_ERR_SHAPE, "%s: %s: %s (code %d)%s", what, kernel, text, e->code,
                      where);
    }
    case TV_ERR_SHAPE_FUNC:
      return tvd_fail(m, TVD_ERR_SHAPE, "%s: %s (shape function %s)%s", what, e->message, tvd_packed_name(e->packed),
                      where);
    case TV_ERR_SHAPE:
      return tvd_fail(m, TVD_ERR_SHAPE, "%s: %s%s", what, e->message, where);
    case TV_ERR_DEPTH:
      return tvd_fail(m, TVD_ERR_DEPTH, "%s: %s%s", what, e->message, where);
    default:
      return tvd_fail(m, TVD_ERR_EXEC, "%s: %s%s", what, e->message, where);
  }
}

/* Runs VM function f on args (borrowed); *result a new reference the caller owns. */
TV_UNUSED static int32_t tvd_call(tvd_model* m, int32_t f, tv_obj* const* args, const char* what, tvd_value** result) {
  tv_obj* ret = NULL;
  if (m->nconstants != tvd_num_constants())
    return tvd_fail(m, TVD_ERR_ARGUMENT, "%s: the model's params are not loaded (load_params or load_params_file first)",
                    what);
  m->ctx.depth = 0;
  m->ctx.stack_limit = tvd_stack_limit();
  m->ctx.error.kind = 0;
  int32_t rc = tvn_call(&m->ctx, f, args, &ret);
  if (m->pool->ncells > 0) tv_cells_collect(m->pool); /* (cycles the call made and dropped: tv_runtime.c) */
  if (rc != 0) {
    tv_decref(ret);
    return tvd_call_error(m, what);
  }
  if ((rc = tvd_own(m, &ret, what)) != TVD_OK) {
    tv_decref(ret);
    return rc;
  }
  *result = (tvd_value*)ret;
  return TVD_OK;
}
