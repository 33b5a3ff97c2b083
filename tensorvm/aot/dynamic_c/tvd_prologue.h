/* The first lines of a standalone library of a dynamic program (tensorvm/aot/dynamic.py): before the
   runtime's text, route its ADT and closure allocations to the application's allocator (tvd_api.c); the
   kernels' temporaries go there too (dynamic.py renames their malloc/free calls to these functions). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* pthread_getattr_np: the C stack's end, for the depth check */
#endif
#ifndef TV_NO_LOOP_IF_CONVERSION
/* kernels with a select between two loads are built without loop if-conversion (GCC 12.2 -O3 AVX2
   vectorized them wrongly; tv_kernel.h): the unknown compiler of the application gets the safe choice */
#define TV_NO_LOOP_IF_CONVERSION
#endif
#include <stddef.h>

static void* tvd_obj_malloc(size_t size);
static void tvd_obj_free(void* block);
#define TV_OBJ_MALLOC(size) tvd_obj_malloc(size)
#define TV_OBJ_FREE(ptr) tvd_obj_free(ptr)
