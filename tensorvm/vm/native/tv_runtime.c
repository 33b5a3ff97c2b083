/* tensorvm's native runtime functions (see tv_runtime.h and docs/native_mode.md). All static: the
   generated library and the bridge each include this text. */
#include "tv_runtime.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TV_UNUSED __attribute__((unused))

/* ADTs, closures and structs not from a pool: the C library's heap unless the including unit says
   otherwise (the standalone AOT library routes them to the application's allocator). */
#ifndef TV_OBJ_MALLOC
#define TV_OBJ_MALLOC(size) malloc(size)
#define TV_OBJ_FREE(ptr) free(ptr)
#endif

/* ---- errors -------------------------------------------------------------------------------------- */
TV_UNUSED static int32_t tv_error_set(tv_ctx* ctx, int32_t kind, int32_t func, int32_t pc, const char* fmt, ...) {
  va_list ap;
  ctx->error.kind = kind;
  ctx->error.func = func;
  ctx->error.pc = pc;
  ctx->error.packed = -1;
  ctx->error.code = 0;
  va_start(ap, fmt);
  vsnprintf(ctx->error.message, sizeof ctx->error.message, fmt, ap);
  va_end(ap);
  return kind;
}

/* ---- the pool ------------------------------------------------------------------------------------ */
static int tv_bit_length(uint64_t x) { return x ? 64 - __builtin_clzll(x) : 0; }

/* runtime.memory.size_class: a multiple of 64, 8 classes per power of two. */
TV_UNUSED static int64_t tv_size_class(int64_t nbytes) {
  if (nbytes <= 64) return 64;
  int shift = tv_bit_length((uint64_t)(nbytes - 1)) - 4;
  if (shift < 6) shift = 6;
  const int64_t step = (int64_t)1 << shift;
  return (nbytes + step - 1) & -step;
}

static void* tv_default_alloc(void* user, size_t size, size_t alignment) {
  void* block = NULL;
  (void)user;
  return posix_memalign(&block, alignment < sizeof(void*) ? sizeof(void*) : alignment, size) == 0 ? block : NULL;
}

static void tv_default_free(void* user, void* block) {
  (void)user;
  free(block);
}

/* A pool whose memory comes from allocator (NULL: the C library's), itself included; NULL when out of memory. */
TV_UNUSED static tv_pool* tv_pool_new_with(int64_t limit_bytes, const tv_allocator* allocator) {
  const tv_allocator a = allocator != NULL ? *allocator : (tv_allocator){tv_default_alloc, tv_default_free, NULL};
  tv_pool* pool = (tv_pool*)a.alloc(a.user, sizeof(tv_pool), 64);
  if (pool == NULL) return NULL;
  memset(pool, 0, sizeof *pool);
  pool->refcount = 1;
  pool->limit_bytes = limit_bytes;
  pool->allocator = a;
  return pool;
}

TV_UNUSED static tv_pool* tv_pool_new(int64_t limit_bytes) { return tv_pool_new_with(limit_bytes, NULL); }

/* Gives an arena's block back to its pool's allocator (the next call that ends well places a new one). */
static int64_t tv_arena_drop_block(tv_arena* a) {
  const int64_t bytes = a->block_bytes;
  if (a->block != NULL) {
    a->pool->allocator.free(a->pool->allocator.user, a->block);
    a->pool->bytes_reserved -= bytes;
    a->pool->bytes_arena -= bytes;
  }
  a->block = NULL;
  a->block_bytes = 0;
  return bytes;
}

static void tv_pool_decref(tv_pool* pool);

/* Frees an arena and its block (a detached one also lets go of its pool). */
TV_UNUSED static void tv_arena_free(tv_arena* a) {
  tv_pool* pool = a->pool;
  const int32_t detached = a->detached;
  tv_arena_drop_block(a);
  pool->allocator.free(pool->allocator.user, a);
  if (detached) tv_pool_decref(pool);
}

/* Frees every cached block and every idle arena's block; returns the bytes given back. */
TV_UNUSED static int64_t tv_pool_release_cached(tv_pool* pool) {
  int64_t freed = 0, arenas = 0;
  for (int32_t f = 0; f < pool->narenas; ++f)
    if (pool->arenas[f] != NULL && !pool->arenas[f]->busy) arenas += tv_arena_drop_block(pool->arenas[f]);
  for (int b = 0; b < TV_POOL_BUCKETS; ++b) {
    tv_free_block* block = pool->buckets[b];
    while (block != NULL) {
      tv_free_block* next = block->next;
      freed += block->size;
      pool->allocator.free(pool->allocator.user, block);
      block = next;
    }
    pool->buckets[b] = NULL;
  }
  pool->bytes_cached -= freed;
  pool->bytes_reserved -= freed;
  return freed + arenas;
}

/* A struct of size bytes: a spare one of the list, else a new one (NULL when out of memory). */
static void* tv_pool_take(tv_pool* pool, tv_spare** list, int32_t* count, size_t size) {
  tv_spare* spare = *list;
  if (spare == NULL) return pool->allocator.alloc(pool->allocator.user, size, 16);
  *list = spare->next;
  *count -= 1;
  return spare;
}

/* Keeps a freed struct for reuse (up to TV_POOL_SPARE), else frees it. */
static void tv_pool_keep(tv_pool* pool, tv_spare** list, int32_t* count, void* o) {
  if (*count >= TV_POOL_SPARE) {
    pool->allocator.free(pool->allocator.user, o);
    return;
  }
  ((tv_spare*)o)->next = *list;
  *list = (tv_spare*)o;
  *count += 1;
}

static void tv_free_spares(tv_pool* pool, tv_spare* spare) {
  while (spare != NULL) {
    tv_spare* next = spare->next;
    pool->allocator.free(pool->allocator.user, spare);
    spare = next;
  }
}

TV_UNUSED static void tv_pool_decref(tv_pool* pool) {
  if (pool != NULL && --pool->refcount == 0) {
    for (int32_t f = 0; f < pool->narenas; ++f)
      if (pool->arenas[f] != NULL) tv_arena_free(pool->arenas[f]);
    if (pool->arenas != NULL) pool->allocator.free(pool->allocator.user, pool->arenas);
    pool->arenas = NULL;
    pool->narenas = 0;
    tv_pool_release_cached(pool);
    if (pool->cells != NULL) pool->allocator.free(pool->allocator.user, pool->cells); /* (tv_cells_release empties it) */
    tv_free_spares(pool, pool->spare_tensors);
    tv_free_spares(pool, pool->spare_storages);
    const tv_allocator a = pool->allocator;
    a.free(a.user, pool);
  }
}

/* Whether a block of this size class bypasses the size-class cache. A cache of exact classes keeps a
   block of every class a call uses, so a call's activations cover the sum of the classes, not its peak
   live bytes: MobileNetV3-small at batch 8 held 37 MB for 9 MB live (past the last-level cache) and ran
   1.25x slower than with the allocator's heap, which coalesces freed blocks and reuses them for any size.
   Below the range, blocks are small and many (the allocator's call would cost as much as their use);
   above it, the C library's malloc maps and unmaps each block, and every call would fault in fresh pages. */
static inline bool tv_pool_heap_block(int64_t size) { return size >= TV_POOL_HEAP_MIN && size < TV_POOL_HEAP_MAX; }

static void tv_pool_give_back(tv_storage* s) {
  tv_pool* pool = s->pool;
  pool->num_frees += 1;
  pool->bytes_live -= s->nbytes;
  if (tv_pool_heap_block(s->block_bytes)) {
    pool->allocator.free(pool->allocator.user, s->data);
    pool->bytes_reserved -= s->block_bytes;
  } else {
    tv_free_block* block = (tv_free_block*)s->data;
    block->size = s->block_bytes;
    const int b = tv_bit_length((uint64_t)s->block_bytes) % TV_POOL_BUCKETS;
    block->next = pool->buckets[b];
    pool->buckets[b] = block;
    pool->bytes_cached += s->block_bytes;
  }
  tv_pool_keep(pool, &pool->spare_storages, &pool->num_spare_storages, s);
  tv_pool_decref(pool);
}

/* A fresh block of size bytes within the pool's limit on reserved bytes, or NULL. */
static void* tv_pool_fresh_block(tv_pool* pool, int64_t size) {
  if (pool->limit_bytes >= 0 && pool->bytes_reserved + size > pool->limit_bytes) return NULL;
  void* data = pool->allocator.alloc(pool->allocator.user, (size_t)size, 64);
  if (data == NULL) return NULL;
  pool->bytes_reserved += size;
  return data;
}

/* A new storage of nbytes from the pool (a new reference), or NULL when out of memory. */
TV_UNUSED static tv_storage* tv_pool_alloc(tv_pool* pool, int64_t nbytes) {
  tv_storage* s = (tv_storage*)tv_pool_take(pool, &pool->spare_storages, &pool->num_spare_storages, sizeof(tv_storage));
  if (s == NULL) return NULL;
  const int64_t size = tv_size_class(nbytes);
  const int b = tv_bit_length((uint64_t)size) % TV_POOL_BUCKETS;
  void* data = NULL;
  for (tv_free_block** at = &pool->buckets[b]; *at != NULL; at = &(*at)->next) {  /* (never a heap block) */
    if ((*at)->size == size) {
      tv_free_block* block = *at;
      *at = block->next;
      data = block;
      pool->bytes_cached -= size;
      pool->reuse_hits += 1;
      break;
    }
  }
  if (data == NULL && (data = tv_pool_fresh_block(pool, size)) == NULL) {
    tv_pool_release_cached(pool); /* then once more, as the Python pool does */
    if ((data = tv_pool_fresh_block(pool, size)) == NULL) {
      tv_pool_keep(pool, &pool->spare_storages, &pool->num_spare_storages, s);
      return NULL;
    }
  }
  s->h.refcount = 1;
  s->h.kind = TV_KIND_STORAGE;
  s->data = data;
  s->nbytes = nbytes;
  s->block_bytes = size;
  s->pool = pool;
  pool->refcount += 1;
  s->py_owner = NULL;
  s->release = tv_pool_give_back;
  pool->num_allocations += 1;
  pool->bytes_live += nbytes;
  if (pool->bytes_live > pool->peak_bytes) pool->peak_bytes = pool->bytes_live;
  return s;
}

/* ---- reference counting -------------------------------------------------------------------------- */
static inline void tv_incref(tv_obj* o) {
  if (o != NULL) o->refcount += 1;
}

static void tv_decref(tv_obj* o);

/* Frees o and what only it held. The last field of an ADT or closure is freed in the same loop, not by
   recursion, so dropping a list of a million cells needs no deeper C stack than dropping one. */
static void tv_free(tv_obj* o) {
  while (o != NULL) {
    tv_obj* next = NULL; /* the last field, when this drop frees it too */
    tv_obj** fields = NULL;
    int32_t n = 0;
    switch (o->kind) {
      case TV_KIND_TENSOR: {
        tv_tensor* t = (tv_tensor*)o;
        tv_storage* storage = t->storage;
        tv_pool* pool = t->pool;
        if (pool == NULL) {
          TV_OBJ_FREE(t);
          if (storage != NULL) tv_decref(&storage->h);
          return;
        }
        tv_pool_keep(pool, &pool->spare_tensors, &pool->num_spare_tensors, t);
        if (storage != NULL) tv_decref(&storage->h);  /* (may give its block back to the pool: still alive, t held it) */
        tv_pool_decref(pool);
        return;
      }
      case TV_KIND_STORAGE: {
        tv_storage* s = (tv_storage*)o;
        if (s->release != NULL) s->release(s); /* (frees or keeps the struct) */
        else TV_OBJ_FREE(s);
        return;
      }
      case TV_KIND_ADT:
        fields = ((tv_adt*)o)->fields;
        n = ((tv_adt*)o)->nfields;
        break;
      case TV_KIND_CLOSURE:
        fields = ((tv_closure*)o)->free_vars;
        n = ((tv_closure*)o)->nfree;
        break;
      default:
        break;
    }
    for (int32_t i = 0; i + 1 < n; ++i) tv_decref(fields[i]);
    if (n > 0 && fields[n - 1] != NULL && --fields[n - 1]->refcount == 0) next = fields[n - 1];
    TV_OBJ_FREE(o);
    o = next;
  }
}

static void tv_decref(tv_obj* o) {
  if (o != NULL && --o->refcount == 0) tv_free(o);
}

/* ---- tensors ------------------------------------------------------------------------------------- */
TV_UNUSED static int64_t tv_itemsize(const tv_tensor* t) { return t->dtype_bits == 1 ? 1 : t->dtype_bits / 8; }

TV_UNUSED static int64_t tv_numel(const tv_tensor* t) {
  int64_t n = 1;
  for (int32_t i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

/* A tensor viewing storage at data (new reference; takes a new reference to storage), or NULL; its
   struct comes from pool's spares when pool is not NULL. A NULL storage (and data) makes a tensor of dims
   alone, which only a reader of its shape may be given (tvn_shape_header). */
TV_UNUSED static tv_tensor* tv_tensor_new(tv_pool* pool, tv_storage* storage, void* data, int32_t code, int32_t bits,
                                          int32_t ndim, const int64_t* shape) {
  if (ndim < 0 || ndim > TV_MAX_RANK) return NULL;
  tv_tensor* t = pool != NULL ? (tv_tensor*)tv_pool_take(pool, &pool->spare_tensors, &pool->num_spare_tensors, sizeof(tv_tensor))
                              : (tv_tensor*)TV_OBJ_MALLOC(sizeof(tv_tensor));
  if (t == NULL) return NULL;
  t->h.refcount = 1;
  t->h.kind = TV_KIND_TENSOR;
  t->storage = storage;
  if (storage != NULL) tv_incref(&storage->h);
  t->pool = pool;
  if (pool != NULL) pool->refcount += 1;
  t->data = data;
  t->dtype_code = code;
  t->dtype_bits = bits;
  t->ndim = ndim;
  for (int32_t i = 0; i < ndim; ++i) t->shape[i] = shape[i];
  return t;
}

/* ---- ADTs and closures --------------------------------------------------------------------------- */
/* A new ADT whose fields take new references to values, or NULL. */
TV_UNUSED static tv_adt* tv_adt_new(int64_t tag, int32_t nfields, tv_obj* const* values) {
  tv_adt* a = (tv_adt*)TV_OBJ_MALLOC(sizeof(tv_adt) + sizeof(tv_obj*) * (size_t)(nfields > 0 ? nfields : 1));
  if (a == NULL) return NULL;
  a->h.refcount = 1;
  a->h.kind = TV_KIND_ADT;
  a->h.gc = 0;
  a->tag = tag;
  a->nfields = nfields;
  for (int32_t i = 0; i < nfields; ++i) {
    a->fields[i] = values[i];
    tv_incref(values[i]);
  }
  return a;
}

TV_UNUSED static tv_closure* tv_closure_new(int32_t func, int32_t nfree, tv_obj* const* values) {
  tv_closure* c = (tv_closure*)TV_OBJ_MALLOC(sizeof(tv_closure) + sizeof(tv_obj*) * (size_t)(nfree > 0 ? nfree : 1));
  if (c == NULL) return NULL;
  c->h.refcount = 1;
  c->h.kind = TV_KIND_CLOSURE;
  c->h.gc = 0;
  c->func = func;
  c->nfree = nfree;
  for (int32_t i = 0; i < nfree; ++i) {
    c->free_vars[i] = values[i];
    tv_incref(values[i]);
  }
  return c;
}

/* ---- cycles through reference cells ------------------------------------------------------------- */
/* Reference counting frees every value except a cycle, and only a write to a reference cell can close one: an
   ADT or a closure takes values that exist before it does. So a cell written with an ADT or a closure is
   listed in its pool (tv_cells_note: one counted reference, the LISTED mark), and tv_cells_collect frees what
   only the list and the values it reaches hold: it gathers the ADTs and closures reachable from the listed
   cells, takes from each one's count the references the others (and the list) hold, marks what is left with a
   count above zero, and what it reaches, as live, restores the counts, and frees the rest. The walks use
   arrays, not recursion (a list of a million cells needs no deeper C stack), allocated before any count
   changes: out of memory, it does nothing. Tensors and storages are never part of a cycle; the freed values
   drop theirs as tv_free does. It runs at the end of every call that left cells listed (tvn_invoke), during a
   call once cells_next cells were listed since it last ran (at least TV_CELLS_FIRST, and twice the values it
   kept then: a long-lived structure is not walked again for every cell), and when the VM lets go of its pool
   (tv_cells_release). Its caller holds a reference to the pool. */
#define TV_GC_SEEN 1
#define TV_GC_LIVE 2
#define TV_GC_LISTED 4
#define TV_CELLS_FIRST 1024

static int tv_gc_container(const tv_obj* o) {
  return o != NULL && (o->kind == TV_KIND_ADT || o->kind == TV_KIND_CLOSURE);
}

static int32_t tv_gc_children(tv_obj* o, tv_obj*** fields) {
  if (o->kind == TV_KIND_ADT) {
    *fields = ((tv_adt*)o)->fields;
    return ((tv_adt*)o)->nfields;
  }
  *fields = ((tv_closure*)o)->free_vars;
  return ((tv_closure*)o)->nfree;
}

/* A grown copy of the array of n pointers (new capacity *cap, at least need), the old one freed; NULL when out
   of memory (the old one kept). */
static tv_obj** tv_gc_grow(tv_pool* pool, tv_obj** items, int64_t n, int64_t* cap, int64_t need) {
  int64_t grown = *cap > 0 ? 2 * *cap : 64;
  while (grown < need) grown *= 2;
  tv_obj** bigger = (tv_obj**)pool->allocator.alloc(pool->allocator.user, sizeof(tv_obj*) * (size_t)grown, 16);
  if (bigger == NULL) return NULL;
  if (n > 0) memcpy(bigger, items, sizeof(tv_obj*) * (size_t)n);
  if (items != NULL) pool->allocator.free(pool->allocator.user, items);
  *cap = grown;
  return bigger;
}

/* Adds delta to the count of every ADT and closure for each reference the n gathered values and the pool's
   list of cells hold to it. */
static void tv_gc_shift_inside(tv_pool* pool, tv_obj* const* nodes, int64_t n, int64_t delta) {
  for (int64_t i = 0; i < n; ++i) {
    tv_obj** fields;
    const int32_t count = tv_gc_children(nodes[i], &fields);
    for (int32_t k = 0; k < count; ++k)
      if (tv_gc_container(fields[k])) fields[k]->refcount += delta;
  }
  for (int64_t i = 0; i < pool->ncells; ++i) pool->cells[i]->refcount += delta;
}

static void tv_cells_collect(tv_pool* pool);

/* After ``value`` was written into ``cell``: lists the cell when the value is an ADT or a closure (a cycle may
   close through it); out of memory, the cell is not listed (a cycle through it is then not freed). */
TV_UNUSED static void tv_cells_note(tv_pool* pool, tv_obj* cell, const tv_obj* value) {
  if (pool == NULL || !tv_gc_container(value) || (cell->gc & TV_GC_LISTED)) return;
  if (pool->ncells == pool->cap_cells) {
    tv_obj** grown = tv_gc_grow(pool, pool->cells, pool->ncells, &pool->cap_cells, pool->ncells + 1);
    if (grown == NULL) return;
    pool->cells = grown;
  }
  tv_incref(cell);
  cell->gc |= TV_GC_LISTED;
  pool->cells[pool->ncells++] = cell;
  if (++pool->cells_new >= (pool->cells_next > TV_CELLS_FIRST ? pool->cells_next : TV_CELLS_FIRST))
    tv_cells_collect(pool);
}

static void tv_cells_collect(tv_pool* pool) {
  pool->cells_new = 0;
  if (pool->ncells == 0) return;
  /* gather: every ADT and closure the listed cells reach, each once (SEEN) */
  int64_t n = 0, cap = 0;
  tv_obj** nodes = tv_gc_grow(pool, NULL, 0, &cap, 2 * pool->ncells);
  int ok = nodes != NULL;
  for (int64_t i = 0; ok && i < pool->ncells; ++i) {
    pool->cells[i]->gc |= TV_GC_SEEN;
    nodes[n++] = pool->cells[i];
  }
  for (int64_t i = 0; ok && i < n; ++i) {
    tv_obj** fields;
    const int32_t count = tv_gc_children(nodes[i], &fields);
    for (int32_t k = 0; k < count; ++k) {
      tv_obj* c = fields[k];
      if (!tv_gc_container(c) || (c->gc & TV_GC_SEEN)) continue;
      if (n == cap) {
        tv_obj** grown = tv_gc_grow(pool, nodes, n, &cap, n + 1);
        if (grown == NULL) { ok = 0; break; }
        nodes = grown;
      }
      c->gc |= TV_GC_SEEN;
      nodes[n++] = c;
    }
  }
  tv_obj** work = ok ? (tv_obj**)pool->allocator.alloc(pool->allocator.user, sizeof(tv_obj*) * (size_t)n, 16) : NULL;
  if (work == NULL) { /* (out of memory: nothing changed but the marks) */
    for (int64_t i = 0; i < n; ++i) nodes[i]->gc &= ~TV_GC_SEEN;
    if (nodes != NULL) pool->allocator.free(pool->allocator.user, nodes);
    return;
  }
  /* each count less the references held inside the gathered values and by the list: what is left is held
     from outside (registers, arguments, results, the application) */
  tv_gc_shift_inside(pool, nodes, n, -1);
  /* live: held from outside, or reached from a live value */
  int64_t top = 0;
  for (int64_t i = 0; i < n; ++i)
    if (nodes[i]->refcount > 0) {
      nodes[i]->gc |= TV_GC_LIVE;
      work[top++] = nodes[i];
    }
  while (top > 0) {
    tv_obj** fields;
    const int32_t count = tv_gc_children(work[--top], &fields);
    for (int32_t k = 0; k < count; ++k) {
      tv_obj* c = fields[k];
      if (tv_gc_container(c) && !(c->gc & TV_GC_LIVE)) {
        c->gc |= TV_GC_LIVE;
        work[top++] = c;
      }
    }
  }
  tv_gc_shift_inside(pool, nodes, n, +1); /* (the counts back as they were) */
  /* the list keeps its live cells; the rest is garbage: each value drops its references to values outside
     the garbage (live ADTs and closures keep a count above zero: they are held from outside or by a live
     value; tensors may go), then every garbage value is freed */
  int64_t kept = 0;
  for (int64_t i = 0; i < pool->ncells; ++i)
    if (pool->cells[i]->gc & TV_GC_LIVE) pool->cells[kept++] = pool->cells[i];
  pool->ncells = kept;
  int64_t garbage = 0, live = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (nodes[i]->gc & TV_GC_LIVE) {
      nodes[i]->gc &= ~(TV_GC_SEEN | TV_GC_LIVE);
      ++live;
      continue;
    }
    work[garbage++] = nodes[i];
  }
  for (int64_t i = 0; i < garbage; ++i) {
    tv_obj** fields;
    const int32_t count = tv_gc_children(work[i], &fields);
    for (int32_t k = 0; k < count; ++k) {
      tv_obj* c = fields[k];
      if (tv_gc_container(c) && (c->gc & TV_GC_SEEN) && !(c->gc & TV_GC_LIVE)) continue; /* (garbage too) */
      tv_decref(c);
    }
  }
  for (int64_t i = 0; i < garbage; ++i) TV_OBJ_FREE(work[i]);
  pool->allocator.free(pool->allocator.user, work);
  pool->allocator.free(pool->allocator.user, nodes);
  pool->cells_next = 2 * live;
}

/* When the VM lets go of its pool: collects, then the list's references go (a cell still held from outside,
   by the application, is no longer listed) and the list with them. */
TV_UNUSED static void tv_cells_release(tv_pool* pool) {
  if (pool == NULL) return;
  tv_cells_collect(pool);
  tv_obj** cells = pool->cells;
  const int64_t count = pool->ncells;
  pool->cells = NULL;
  pool->ncells = pool->cap_cells = 0;
  for (int64_t i = 0; i < count; ++i) {
    cells[i]->gc &= ~TV_GC_LISTED;
    tv_decref(cells[i]);
  }
  if (cells != NULL) pool->allocator.free(pool->allocator.user, cells);
}

/* ---- scalars (If operands, offsets, sizes) ------------------------------------------------------ */
/* The one value of a tensor with one element, as an integer (*is_float 0) or a double (*is_float 1);
   -1 when it is not a one-element tensor of a known dtype. */
TV_UNUSED static int tv_scalar(const tv_obj* o, int64_t* i, double* d, int* is_float) {
  if (o == NULL || o->kind != TV_KIND_TENSOR) return -1;
  const tv_tensor* t = (const tv_tensor*)o;
  if (tv_numel(t) != 1) return -1;
  *is_float = 0;
  switch (t->dtype_code * 100 + t->dtype_bits) {
    case 8: *i = *(const int8_t*)t->data; return 0;
    case 16: *i = *(const int16_t*)t->data; return 0;
    case 32: *i = *(const int32_t*)t->data; return 0;
    case 64: *i = *(const int64_t*)t->data; return 0;
    case 101: *i = *(const uint8_t*)t->data != 0; return 0;
    case 108: *i = *(const uint8_t*)t->data; return 0;
    case 116: *i = *(const uint16_t*)t->data; return 0;
    case 132: *i = *(const uint32_t*)t->data; return 0;
    case 164: *i = (int64_t)*(const uint64_t*)t->data; return 0;
    case 232: *d = *(const float*)t->data; *is_float = 1; return 0;
    case 264: *d = *(const double*)t->data; *is_float = 1; return 0;
    default: return -1;
  }
}

/* Whether two If operands are equal as the VM compares them (Python ==: an int equals a float of its value). */
TV_UNUSED static int tv_values_equal(int64_t ia, double da, int fa, int64_t ib, double db, int fb) {
  if (!fa && !fb) return ia == ib;
  const double x = fa ? da : (double)ia, y = fb ? db : (double)ib;
  return x == y;
}
