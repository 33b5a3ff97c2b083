/* A CPython extension module of wrappers (a translation unit of its own, so the kernels stay plain
   C). Each function takes the arrays, checks them through the buffer protocol (C-contiguous, writable
   outputs, dtype, rank, static dims), calls the kernel without the GIL and returns its code; -1: the
   arguments do not fit (Python then explains why). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdbool.h>
#include <string.h>

__attribute__((unused)) static int tvpy_is(const Py_buffer* v, const char* accepted, Py_ssize_t itemsize) {
  const char* f = v->format;
  if (f == NULL || v->itemsize != itemsize) return 0;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  if (*f == '<') f++;
#endif
  if (*f == '@' || *f == '=') f++;
  return f[0] != 0 && f[1] == 0 && strchr(accepted, f[0]) != NULL;
}
