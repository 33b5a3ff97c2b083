/* tensorvm_dynamic.h: the types every standalone library of a dynamic program shares (tensorvm AOT with
   dynamic=True; see docs/aot_dynamic.md). Each model's own header (<name>.h) includes this file and declares
   its functions, all named tvd_<name>_...; several models may be linked into one application. */
#ifndef TENSORVM_DYNAMIC_H_
#define TENSORVM_DYNAMIC_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes: every fallible function returns one; tvd_<name>_last_error(model) says what happened. */
enum {
  TVD_OK = 0,
  TVD_ERR_EXEC = 1,       /* a run-time fault (a kernel's integer division by zero, an index out of range,
                             no match clause applies, out of memory inside the program...) */
  TVD_ERR_SHAPE = 2,      /* shapes that do not fit (a kernel's entry check, a shape function, a view) */
  TVD_ERR_DEPTH = 5,      /* recursion deeper than the model's max_depth, or than the thread's C stack */
  TVD_ERR_ARGUMENT = 6,   /* an argument of an API call: wrong kind, dtype, rank, shape, NULL, device... */
  TVD_ERR_MEMORY = 7,     /* the allocator returned NULL, or the memory limit was reached */
  TVD_ERR_FORMAT = 8      /* a params blob that cannot be read, is malformed or corrupted, or is another program's */
};

/* DLPack's data type (DLDataType): code TVD_INT, TVD_UINT or TVD_FLOAT, bits, lanes (always 1). A bool
   tensor is {TVD_UINT, 1, 1}, one byte per element (0 or 1). */
typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} tvd_dtype;

enum { TVD_INT = 0, TVD_UINT = 1, TVD_FLOAT = 2 };
enum { TVD_DEVICE_CPU = 1 };

typedef struct {
  int32_t device_type; /* TVD_DEVICE_CPU */
  int32_t device_id;
} tvd_device;

/* A tensor as DLPack's DLTensor lays it out: C-contiguous (strides NULL, or the compact strides), on the CPU. */
typedef struct {
  void* data;
  tvd_device device;
  int32_t ndim;
  tvd_dtype dtype;
  int64_t* shape;
  int64_t* strides;     /* NULL: compact row-major */
  uint64_t byte_offset; /* from data to the first element */
} tvd_tensor;

/* A value of the program: a tensor, a tuple, an ADT value (a Tree, a List...) or a closure. Opaque,
   reference-counted: every tvd_value* an API function gives out is the caller's, to release once. */
typedef struct tvd_value tvd_value;

/* One instance of a model: its constants, memory pool, depth limit and last error. Not thread-safe: one
   thread at a time per model and the values it made (use one model per thread to run in parallel). */
typedef struct tvd_model tvd_model;

/* Where every byte the library uses comes from: alloc(user, size, alignment) returns a block of at least
   size bytes aligned to alignment (a power of two, at most 64) or NULL; free(user, block) gives it back.
   A pool sits on top: freed tensor memory is kept for reuse (by size class) until tvd_<name>_trim or
   until the model and every value it made are gone. */
typedef struct {
  void* (*alloc)(void* user, size_t size, size_t alignment);
  void (*free)(void* user, void* block);
  void* user;
} tvd_allocator;

typedef struct {
  const tvd_allocator* allocator; /* NULL: the C library's (posix_memalign/free); copied at create */
  int64_t memory_limit;           /* bound on the bytes of tensor memory held (live + cached); < 0: none */
  int64_t max_depth;              /* nested (non-tail) calls allowed; <= 0: 10000 */
} tvd_options;

typedef struct {
  int64_t num_allocations, num_frees, reuse_hits, bytes_live, peak_bytes, bytes_reserved, bytes_cached;
} tvd_memory_stats;

#ifdef __cplusplus
}
#endif

#endif /* TENSORVM_DYNAMIC_H_ */
