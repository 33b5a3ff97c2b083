/* tensorvm's native runtime: the values, reference counting, pooled allocator and error record that the
   C of exec_mode="native" (tensorvm/vm/native_emit.py) and its CPython bridge (bridge.c) share.
   See docs/native_mode.md. Both translation units include tv_runtime.c's text (static functions), so
   every object carries what frees it (a storage's release function), whichever copy drops it last. */
#ifndef TV_RUNTIME_H
#define TV_RUNTIME_H

#include <stdint.h>
#include <stddef.h>

#define TV_MAX_RANK 16
#define TV_POOL_BUCKETS 64
#define TV_POOL_SPARE 256  /* freed tensor and storage structs a pool keeps for reuse, per kind */
/* Blocks from TV_POOL_HEAP_MIN up to TV_POOL_HEAP_MAX bytes are not kept by size class: they go back to
   the allocator at once and the next request of any size takes from its heap (docs/native_mode.md) */
#define TV_POOL_HEAP_MIN ((int64_t)1 << 18)
#define TV_POOL_HEAP_MAX ((int64_t)1 << 25)

enum { TV_KIND_TENSOR = 1, TV_KIND_ADT = 2, TV_KIND_CLOSURE = 3, TV_KIND_STORAGE = 4 };

/* Error kinds (the return value of every runtime and generated function; 0 is success). */
enum {
  TV_OK = 0,
  TV_ERR_EXEC = 1,    /* ExecutionError */
  TV_ERR_SHAPE = 2,   /* ShapeError */
  TV_ERR_KERNEL = 3,  /* a kernel's nonzero return code (error.code): its message table says which */
  TV_ERR_SHAPE_FUNC = 4, /* a C shape function's code (ShapeError through its message table) */
  TV_ERR_DEPTH = 5,   /* recursion deeper than the limit (ExecutionError) */
  TV_ERR_PYTHON = 6   /* a Python callback raised (the bridge holds the exception) */
};

typedef struct tv_obj {
  int64_t refcount;
  int32_t kind;
  int32_t gc;            /* an ADT's or closure's marks for tv_cells_collect (TV_GC_*), else unused */
} tv_obj;

struct tv_storage;
typedef void (*tv_release_fn)(struct tv_storage*);

typedef struct tv_storage {
  tv_obj h;
  void* data;
  int64_t nbytes;        /* bytes usable by tensors */
  int64_t block_bytes;   /* the pool's size class of the block (0: not from a pool) */
  struct tv_pool* pool;  /* counted reference, or NULL */
  void* py_owner;        /* the Python object owning data (a borrowed array), or NULL */
  tv_release_fn release; /* gives the block back and frees the struct; NULL: free(data) is not ours, free the struct */
} tv_storage;

typedef struct tv_tensor {
  tv_obj h;
  tv_storage* storage;   /* counted reference */
  struct tv_pool* pool;  /* counted reference to the pool whose spare structs it returns to, or NULL */
  void* data;
  int32_t dtype_code;    /* DLPack: 0 int, 1 uint (bool is uint 1), 2 float */
  int32_t dtype_bits;
  int32_t ndim;
  int64_t shape[TV_MAX_RANK];
} tv_tensor;

/* The tag of a reference cell: an ADT whose one field ref_write changes (bytecode.py: REF_TAG, a type index
   no executable's ADTs reach; tests/vm/test_native_mode.py checks the two agree). */
#define TV_REF_TAG (((int64_t)((1 << 30) - 1)) << 24)

typedef struct tv_adt {
  tv_obj h;
  int64_t tag;           /* 0: a tuple */
  int32_t nfields;
  tv_obj* fields[];      /* counted references */
} tv_adt;

typedef struct tv_closure {
  tv_obj h;
  int32_t func;
  int32_t nfree;
  tv_obj* free_vars[];   /* counted references */
} tv_closure;

typedef struct tv_free_block {
  struct tv_free_block* next;
  int64_t size;
} tv_free_block;

typedef struct tv_spare {
  struct tv_spare* next;
} tv_spare;

/* Where a pool's memory comes from: alloc(user, size, alignment) returns a block aligned to alignment (a
   power of two, at most 64) or NULL; free(user, block) gives it back. tv_pool_new uses the C library's. */
typedef struct tv_allocator {
  void* (*alloc)(void* user, size_t size, size_t alignment);
  void (*free)(void* user, void* block);
  void* user;
} tv_allocator;

typedef struct tv_pool {
  int64_t refcount;      /* the VM's reference plus one per live storage and pooled tensor */
  int64_t limit_bytes;   /* bound on the bytes reserved, live + cached (< 0: none), as runtime.memory's pools */
  int64_t num_allocations, num_frees, reuse_hits, bytes_live, peak_bytes, bytes_reserved, bytes_cached;
  tv_free_block* buckets[TV_POOL_BUCKETS]; /* free blocks by bit length of their size class */
  tv_spare* spare_tensors;  /* freed structs kept for reuse (malloc/free were a third of a dynamic call) */
  tv_spare* spare_storages;
  int32_t num_spare_tensors, num_spare_storages;
  tv_allocator allocator; /* every block and struct the pool holds comes from it */
  struct tv_arena** arenas; /* per VM function (NULL: none yet), narenas of them (tv_native.c's tvn_arena_begin) */
  int32_t narenas;
  int32_t no_arenas;        /* nonzero: every AllocStorage takes a pool block (VirtualMachine(specialize=False)) */
  int64_t bytes_arena;      /* of bytes_reserved, the arenas' blocks */
  /* Reference cells written with an ADT or a closure (the only way a cycle forms), one counted reference each,
     for tv_cells_collect; cells_new of them listed since it last ran, which runs during a call once that
     reaches cells_next */
  tv_obj** cells;
  int64_t ncells, cap_cells, cells_new, cells_next;
} tv_pool;

/* A VM function's arena (native mode; docs/native_mode.md, "Arena"): one block whose bytes the function's
   slots (vm/arena_slots.py: storages whose values stay in its registers) share where their spans (the pcs
   reading or writing their tensors) do not overlap, placed for the largest size each slot has needed; a
   call's AllocStorage of slot k views the block at offsets[k] when its size fits planned[k], else takes a
   pool block. The pool owns its arenas (their blocks count in bytes_reserved, not bytes_live); an arena
   whose view outlived its call (never expected: such storages are not slots) is detached and freed with
   its last view. */
typedef struct tv_arena_view {
  tv_storage s;            /* refcount 0: free */
  struct tv_arena* arena;
} tv_arena_view;

typedef struct tv_arena {
  int32_t slots;
  int32_t busy;            /* a call of the function is using it */
  int32_t grew;            /* this call took a pool block for a slot (or nothing is placed yet) */
  int32_t disabled;        /* never place again (too large, or a view escaped once) */
  int32_t detached;        /* owned by its live views, no longer by the pool (which it holds a reference to) */
  int64_t live;            /* views handed out and not released */
  char* block;
  int64_t block_bytes;
  tv_pool* pool;
  int64_t* planned;        /* [slots] the bytes each slot's place holds */
  int64_t* offsets;        /* [slots] */
  int64_t* seen;           /* [slots] the largest size a slot took a pool block for since the last placement */
  tv_arena_view* views;    /* [slots] */
} tv_arena;

typedef struct tv_error {
  int32_t kind, func, pc, packed, code;
  char message[512];
} tv_error;

typedef struct tv_ctx {
  tv_pool* pool;
  tv_obj* const* constants;  /* the executable's constants, then every kernel's constant arrays */
  int64_t nconstants;
  int64_t depth, max_depth;
  const char* stack_limit;   /* the lowest stack address calls may reach (NULL: no check) */
  tv_error error;
  int64_t* profile;          /* while profiling: (calls, ns) per packed index (tvn_invoke sets it), else NULL */
  /* Under Python (bridge.c; NULL elsewhere, e.g. the standalone AOT library): runs primitive `packed` with the
     Python callable the bytecode VM uses, on the flattened tensors (DPS: outputs written in place); bit i
     of of_tensor: t[i] stands for its shape. Nonzero: it raised (error kind TV_ERR_PYTHON). Last in the
     struct: a library generated before it existed never reads it. */
  int32_t (*callback)(struct tv_ctx* ctx, int32_t packed, tv_tensor* const* t, int32_t n, uint64_t of_tensor);
} tv_ctx;

typedef int32_t (*tv_function)(tv_ctx* ctx, tv_obj* const* args, tv_obj** ret);

#endif
