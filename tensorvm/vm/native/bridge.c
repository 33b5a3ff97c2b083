/* The CPython bridge of exec_mode="native": the extension _tensorvm_native (built once per machine by
   tensorvm/vm/native_mode.py through the code generator's cache, like fastcall.c). A Runtime object holds
   one VM's context (pool, constants, depth limit) and calls the library's entry point tvn_invoke once per
   invocation: ndarrays, tuples/ADTs and closures in (arrays are borrowed, never copied), results out as
   ndarrays whose base object holds a reference to the C storage (no copy). The GIL is released during the
   C call (run_native): the call touches no Python object, and a result array of an earlier call that
   Python frees meanwhile (on another thread) gives its storage back after the call (Runtime.deferred),
   since the pool and the constants' storages are the call's. A VirtualMachine runs one call at a time,
   and a Runtime refuses a second call while one runs. See docs/native_mode.md.

   native_mode.py puts the runtime's text (tv_runtime.c with tv_runtime.h) in place of the #include
   below, so this file and the generated library share one definition of every value. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "tv_runtime.c"

typedef int32_t (*tv_invoke_fn)(tv_ctx*, int32_t, tv_obj* const*, int32_t, tv_obj**);

/* The pool's counters in the order Runtime.stats() names them (after "allocator"). */
#define POOL_COUNTERS 9
static void pool_counters(const tv_pool* p, int64_t* out) {
  const int64_t v[POOL_COUNTERS] = {p->bytes_live, p->peak_bytes, p->bytes_reserved, p->num_allocations, p->num_frees,
                                    p->reuse_hits, p->bytes_cached, p->bytes_arena, p->ncells};
  memcpy(out, v, sizeof v);
}

/* ---- storages of NumPy arrays (arguments and constants) -------------------------------------------- */
static void release_py_owner(tv_storage* s) {
  /* (run while holding the GIL: the bridge holds every argument and constant until the call is over, but
     a release without it must not corrupt the interpreter) */
  const PyGILState_STATE gil = PyGILState_Ensure();
  Py_XDECREF((PyObject*)s->py_owner);
  PyGILState_Release(gil);
  free(s);
}

/* The base object of a result array: one reference to a C storage, and to the Runtime whose call made it
   (while that Runtime runs a call without the GIL, the storage is given back after the call). */
typedef struct {
  PyObject_HEAD
  tv_storage* storage;
  PyObject* runtime;
} StorageRef;

static void runtime_defer(PyObject* runtime, tv_storage* storage);

static void storage_ref_dealloc(PyObject* op) {
  StorageRef* self = (StorageRef*)op;
  runtime_defer(self->runtime, self->storage);
  Py_XDECREF(self->runtime);
  PyObject_Free(self);
}

static PyTypeObject StorageRefType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_tensorvm_native.StorageRef",
    .tp_basicsize = sizeof(StorageRef),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = storage_ref_dealloc,
    .tp_doc = "Keeps a native-mode storage alive while a NumPy array views it.",
};

static int dtype_of(PyArray_Descr* d, int32_t* code, int32_t* bits) {
  switch (d->type_num) {
    case NPY_BOOL: *code = 1; *bits = 1; return 0;
    case NPY_INT8: *code = 0; *bits = 8; return 0;
    case NPY_INT16: *code = 0; *bits = 16; return 0;
    case NPY_INT32: *code = 0; *bits = 32; return 0;
    case NPY_INT64: *code = 0; *bits = 64; return 0;
    case NPY_UINT8: *code = 1; *bits = 8; return 0;
    case NPY_UINT16: *code = 1; *bits = 16; return 0;
    case NPY_UINT32: *code = 1; *bits = 32; return 0;
    case NPY_UINT64: *code = 1; *bits = 64; return 0;
    case NPY_FLOAT16: *code = 2; *bits = 16; return 0;
    case NPY_FLOAT32: *code = 2; *bits = 32; return 0;
    case NPY_FLOAT64: *code = 2; *bits = 64; return 0;
    default: return -1;
  }
}

static int type_num_of(int32_t code, int32_t bits) {
  switch (code * 100 + bits) {
    case 101: return NPY_BOOL;
    case 8: return NPY_INT8;
    case 16: return NPY_INT16;
    case 32: return NPY_INT32;
    case 64: return NPY_INT64;
    case 108: return NPY_UINT8;
    case 116: return NPY_UINT16;
    case 132: return NPY_UINT32;
    case 164: return NPY_UINT64;
    case 216: return NPY_FLOAT16;
    case 232: return NPY_FLOAT32;
    case 264: return NPY_FLOAT64;
    default: return -1;
  }
}

typedef struct {
  PyObject_HEAD
  tv_invoke_fn invoke;
  tv_ctx ctx;
  tv_obj** constants;
  Py_ssize_t nconstants;
  PyObject* adt_type;      /* tensorvm.runtime.object.ADT */
  PyObject* make_closure;  /* make_closure(func_index, free_vars tuple) -> VMClosure */
  PyObject* on_error;      /* on_error(kind, func, pc, packed, code, message) -> exception instance */
  /* set by set_argument_specs (native_mode.argument_specs): invoke() checks and converts in C */
  PyObject* specs;         /* tuple of spec nodes */
  Py_ssize_t nsymbols;     /* symbolic dims named in the specs */
  PyObject* wrap;          /* NDArray.wrap: a result array in the user's form */
  PyObject* user_tags;     /* dict: VM tag -> (user tag, constructor name) */
  /* a call runs without the GIL (run_native): storages Python drops meanwhile wait here */
  int busy;
  tv_storage** deferred;
  Py_ssize_t ndeferred, cap_deferred;
  int64_t stats_at_call[POOL_COUNTERS]; /* the pool's counters when the running call began (stats() while busy) */
  /* primitives without C functions: the native code calls back (python_callback) */
  PyObject* callbacks;     /* tuple: the bytecode VM's callable per packed index (exe.kernels) */
  PyObject* py_error;      /* the exception the last failed callback raised (until the call reports it) */
  int64_t python_calls;    /* callbacks made */
} Runtime;

/* Drops a result array's reference to storage: now, or after the running call of runtime. */
static void runtime_defer(PyObject* runtime, tv_storage* storage) {
  Runtime* rt = (Runtime*)runtime;
  if (rt == NULL || !rt->busy) {
    tv_decref(&storage->h);
    return;
  }
  if (rt->ndeferred == rt->cap_deferred) {
    const Py_ssize_t cap = rt->cap_deferred ? 2 * rt->cap_deferred : 16;
    tv_storage** grown = (tv_storage**)realloc(rt->deferred, (size_t)cap * sizeof(tv_storage*));
    if (grown == NULL) return; /* out of memory: the storage is leaked, never freed while the call uses the pool */
    rt->deferred = grown;
    rt->cap_deferred = cap;
  }
  rt->deferred[rt->ndeferred++] = storage;
}

static int32_t run_native(Runtime* rt, int32_t index, tv_obj* const* values, int32_t n, tv_obj** ret);

/* The lowest address this thread's stack may reach, keeping a margin for the bridge and the kernels.
   Found once per thread: pthread_getattr_np reads /proc/self/maps for the main thread (milliseconds). */
static __thread const char* thread_stack_limit = NULL;
static __thread int thread_stack_known = 0;

static const char* stack_limit(void) {
  if (thread_stack_known) return thread_stack_limit;
  pthread_attr_t attr;
  void* addr = NULL;
  size_t size = 0;
  thread_stack_known = 1;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) return NULL;
  const int ok = pthread_attr_getstack(&attr, &addr, &size) == 0;
  pthread_attr_destroy(&attr);
  if (!ok || size < (1u << 20)) return NULL;
  thread_stack_limit = (const char*)addr + (size_t)(256 * 1024);
  return thread_stack_limit;
}

/* Whether converting a value one level deeper would come near the end of this thread's C stack; if so
   the Python error is StackExhausted (native_mode.call_native runs the call again on a deep stack). */
static int stack_exhausted(Runtime* rt) {
  const char probe = 0;
  const char* limit = stack_limit();
  if (limit == NULL || &probe >= limit) return 0;
  PyObject* exc = PyObject_CallFunction(rt->on_error, "iiiiis", 5, -1, -1, -1, 1,
                                        "native mode: a value nests too deeply for this thread's C stack");
  if (exc != NULL) {
    PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
    Py_DECREF(exc);
  }
  return 1;
}

/* Sets the project's ExecutionError (on_error of an execution fault without a place) with ``message``. */
static void set_exec_error(Runtime* rt, const char* message) {
  PyObject* exc = PyObject_CallFunction(rt->on_error, "iiiiis", 1, -1, -1, -1, 0, message);
  if (exc != NULL) {
    PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
    Py_DECREF(exc);
  }
}

static tv_obj* to_native(Runtime* rt, PyObject* value, int depth);

static tv_obj* array_to_native(PyObject* value) {
  PyArrayObject* a = (PyArrayObject*)value;
  int32_t code, bits;
  if (dtype_of(PyArray_DESCR(a), &code, &bits) || !PyArray_IS_C_CONTIGUOUS(a) || PyArray_NDIM(a) > TV_MAX_RANK) {
    PyErr_Format(PyExc_TypeError, "native mode: cannot pass an array of dtype %R and %d dims (C-contiguous, at most "
                 "%d dims, a tensorvm dtype)", (PyObject*)PyArray_DESCR(a), PyArray_NDIM(a), TV_MAX_RANK);
    return NULL;
  }
  tv_storage* s = (tv_storage*)malloc(sizeof(tv_storage));
  if (s == NULL) { PyErr_NoMemory(); return NULL; }
  s->h.refcount = 1;
  s->h.kind = TV_KIND_STORAGE;
  s->data = PyArray_DATA(a);
  s->nbytes = (int64_t)PyArray_NBYTES(a);
  s->block_bytes = 0;
  s->pool = NULL;
  Py_INCREF(value);
  s->py_owner = value;
  s->release = release_py_owner;
  int64_t shape[TV_MAX_RANK];
  for (int i = 0; i < PyArray_NDIM(a); ++i) shape[i] = (int64_t)PyArray_DIMS(a)[i];
  tv_tensor* t = tv_tensor_new(NULL, s, s->data, code, bits, PyArray_NDIM(a), shape);
  tv_decref(&s->h);
  if (t == NULL) { PyErr_NoMemory(); return NULL; }
  return &t->h;
}

static tv_obj* sequence_to_native(Runtime* rt, PyObject* fields, int64_t tag, int closure, int64_t func, int depth) {
  PyObject* seq = PySequence_Fast(fields, "native mode: fields must be a sequence");
  if (seq == NULL) return NULL;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  tv_obj** values = (tv_obj**)calloc((size_t)(n > 0 ? n : 1), sizeof(tv_obj*));
  tv_obj* result = NULL;
  if (values == NULL) { Py_DECREF(seq); PyErr_NoMemory(); return NULL; }
  Py_ssize_t i = 0;
  for (; i < n; ++i) {
    values[i] = to_native(rt, PySequence_Fast_GET_ITEM(seq, i), depth + 1);
    if (values[i] == NULL) break;
  }
  if (i == n) {
    result = closure ? (tv_obj*)tv_closure_new((int32_t)func, (int32_t)n, values)
                     : (tv_obj*)tv_adt_new(tag, (int32_t)n, values);
    if (result == NULL) PyErr_NoMemory();
  }
  for (Py_ssize_t j = 0; j < i; ++j) tv_decref(values[j]);
  free(values);
  Py_DECREF(seq);
  return result;
}

/* A VM value (ndarray, ADT with its bytecode tag, VMClosure: what VirtualMachine._convert_inputs gives)
   as a native value: a new reference, or NULL with a Python error set. */
static tv_obj* to_native(Runtime* rt, PyObject* value, int depth) {
  if (stack_exhausted(rt)) return NULL;
  if (PyArray_Check(value)) return array_to_native(value);
  if (PyObject_TypeCheck(value, (PyTypeObject*)rt->adt_type)) {
    PyObject* tag = PyObject_GetAttrString(value, "tag");
    PyObject* fields = tag ? PyObject_GetAttrString(value, "fields") : NULL;
    tv_obj* r = NULL;
    if (fields != NULL) {
      const long long t = PyLong_AsLongLong(tag);
      if (!(t == -1 && PyErr_Occurred())) r = sequence_to_native(rt, fields, t, 0, 0, depth);
    }
    Py_XDECREF(tag);
    Py_XDECREF(fields);
    return r;
  }
  if (PyObject_HasAttrString(value, "func_index") && PyObject_HasAttrString(value, "free_vars")) {
    PyObject* func = PyObject_GetAttrString(value, "func_index");
    PyObject* free_vars = func ? PyObject_GetAttrString(value, "free_vars") : NULL;
    tv_obj* r = NULL;
    if (free_vars != NULL) {
      const long long f = PyLong_AsLongLong(func);
      if (!(f == -1 && PyErr_Occurred())) r = sequence_to_native(rt, free_vars, 0, 1, f, depth);
    }
    Py_XDECREF(func);
    Py_XDECREF(free_vars);
    return r;
  }
  if (strcmp(Py_TYPE(value)->tp_name, "RefValue") == 0) {  /* (as from_native: a copy would not share writes) */
    set_exec_error(rt, "native mode: a reference cannot be passed from Python (its writes would not be shared); "
                       "run the program with exec_mode='bytecode'");
    return NULL;
  }
  PyErr_Format(PyExc_TypeError, "native mode: cannot pass a %s", Py_TYPE(value)->tp_name);
  return NULL;
}

static PyObject* from_native(Runtime* rt, tv_obj* o, int depth);

static PyObject* tensor_to_array(Runtime* rt, tv_tensor* t) {
  const int type_num = type_num_of(t->dtype_code, t->dtype_bits);
  if (type_num < 0) {
    PyErr_SetString(PyExc_TypeError, "native mode: a result has an unknown dtype");
    return NULL;
  }
  StorageRef* ref = PyObject_New(StorageRef, &StorageRefType);
  if (ref == NULL) return NULL;
  ref->storage = t->storage;
  tv_incref(&t->storage->h);
  Py_INCREF(rt);
  ref->runtime = (PyObject*)rt;
  npy_intp dims[TV_MAX_RANK];
  for (int32_t i = 0; i < t->ndim; ++i) dims[i] = (npy_intp)t->shape[i];
  PyObject* arr = PyArray_NewFromDescr(&PyArray_Type, PyArray_DescrFromType(type_num), t->ndim, dims, NULL,
                                       t->data, NPY_ARRAY_CARRAY, NULL);
  if (arr == NULL) { Py_DECREF(ref); return NULL; }
  if (PyArray_SetBaseObject((PyArrayObject*)arr, (PyObject*)ref) < 0) { Py_DECREF(arr); return NULL; }
  /* a view of a read-only array (a constant of the executable) stays read-only */
  PyObject* owner = (PyObject*)t->storage->py_owner;
  if (owner != NULL && PyArray_Check(owner) && !PyArray_ISWRITEABLE((PyArrayObject*)owner))
    PyArray_CLEARFLAGS((PyArrayObject*)arr, NPY_ARRAY_WRITEABLE);
  return arr;
}

/* ctx->callback: primitive `packed` run by its Python callable (the one the bytecode VM calls), with the GIL
   taken back for it. The tensors go in as arrays over their data, no copies (the outputs are written in
   place: destination passing, as the VM calls kernels); an input standing for its shape (of_tensor) as an
   int64 array of its dims. A Python exception is kept for the call's error report (TV_ERR_PYTHON). */
static int32_t python_callback(tv_ctx* ctx, int32_t packed, tv_tensor* const* t, int32_t n, uint64_t of_tensor) {
  Runtime* rt = (Runtime*)(void*)((char*)ctx - offsetof(Runtime, ctx));
  const PyGILState_STATE gil = PyGILState_Ensure();
  rt->python_calls += 1;
  int32_t rc = 0;
  PyObject* args = PyTuple_New(n);
  if (args == NULL) rc = 1;
  for (int32_t i = 0; rc == 0 && i < n; ++i) {
    PyObject* v;
    if (i < 64 && (of_tensor >> i & 1)) {
      npy_intp rank = t[i]->ndim;
      v = PyArray_SimpleNew(1, &rank, NPY_INT64);
      if (v != NULL) memcpy(PyArray_DATA((PyArrayObject*)v), t[i]->shape, sizeof(int64_t) * (size_t)rank);
    } else {
      v = tensor_to_array(rt, t[i]);
    }
    if (v == NULL) { rc = 1; break; }
    PyTuple_SET_ITEM(args, i, v);
  }
  if (rc == 0) {
    if (packed < 0 || packed >= PyTuple_GET_SIZE(rt->callbacks)) {
      PyErr_Format(PyExc_IndexError, "native mode: no Python callable for PackedFunc[%d]", (int)packed);
      rc = 1;
    } else {
      PyObject* r = PyObject_Call(PyTuple_GET_ITEM(rt->callbacks, packed), args, NULL);
      if (r == NULL) rc = 1;
      Py_XDECREF(r);
    }
  }
  Py_XDECREF(args); /* (storages of the arrays go back after the call: runtime_defer) */
  if (rc != 0) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value != NULL && tb != NULL) PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    Py_XSETREF(rt->py_error, value);
  }
  PyGILState_Release(gil);
  return rc;
}

static PyObject* values_to_tuple(Runtime* rt, tv_obj* const* values, int32_t n, int depth) {
  PyObject* tuple = PyTuple_New(n);
  if (tuple == NULL) return NULL;
  for (int32_t i = 0; i < n; ++i) {
    PyObject* v = from_native(rt, values[i], depth + 1);
    if (v == NULL) { Py_DECREF(tuple); return NULL; }
    PyTuple_SET_ITEM(tuple, i, v);
  }
  return tuple;
}

/* A native value in the VM's Python form (what the bytecode VM returns before _to_user). */
static PyObject* from_native(Runtime* rt, tv_obj* o, int depth) {
  if (o == NULL) {
    set_exec_error(rt, "native mode: a result register is empty (its value was released or never written)");
    return NULL;
  }
  if (stack_exhausted(rt)) return NULL;
  switch (o->kind) {
    case TV_KIND_TENSOR:
      return tensor_to_array(rt, (tv_tensor*)o);
    case TV_KIND_ADT: {
      tv_adt* a = (tv_adt*)o;
      if (a->tag == TV_REF_TAG) {  /* (a copy in Python would not see the program's later writes, nor it Python's) */
        set_exec_error(rt, "native mode: a reference cannot be handed to Python (its writes would not be shared); "
                           "run the program with exec_mode='bytecode'");
        return NULL;
      }
      PyObject* fields = values_to_tuple(rt, a->fields, a->nfields, depth);
      if (fields == NULL) return NULL;
      PyObject* r = PyObject_CallFunction(rt->adt_type, "LO", (long long)a->tag, fields);
      Py_DECREF(fields);
      return r;
    }
    case TV_KIND_CLOSURE: {
      tv_closure* c = (tv_closure*)o;
      PyObject* free_vars = values_to_tuple(rt, c->free_vars, c->nfree, depth);
      if (free_vars == NULL) return NULL;
      PyObject* r = PyObject_CallFunction(rt->make_closure, "iO", (int)c->func, free_vars);
      Py_DECREF(free_vars);
      return r;
    }
    default:
      set_exec_error(rt, "native mode: a result is a storage, not a value");
      return NULL;
  }
}

static int refuse_if_busy(Runtime* rt) {
  if (!rt->busy) return 0;
  PyErr_SetString(PyExc_RuntimeError, "native mode: this runtime is running a call (a VirtualMachine runs one call "
                  "at a time)");
  return 1;
}

/* The library's entry point, without the GIL (the call touches no Python object); then the storages of
   result arrays Python dropped meanwhile go back. */
static int32_t run_native(Runtime* rt, int32_t index, tv_obj* const* values, int32_t n, tv_obj** ret) {
  pool_counters(rt->ctx.pool, rt->stats_at_call);
  rt->ctx.stack_limit = stack_limit();
  rt->busy = 1;
  int32_t rc;
  Py_BEGIN_ALLOW_THREADS
  rc = rt->invoke(&rt->ctx, index, values, n, ret);
  Py_END_ALLOW_THREADS
  rt->busy = 0;
  for (Py_ssize_t i = 0; i < rt->ndeferred; ++i) tv_decref(&rt->deferred[i]->h);
  rt->ndeferred = 0;
  return rc;
}

static PyObject* to_user(Runtime* rt, tv_obj* o);

/* Runs function index on values; its result in the user's form (user) or the VM's, or NULL with the
   Python error on_error makes of the call's error record. */
static PyObject* call_converted(Runtime* rt, int32_t index, tv_obj* const* values, int32_t n, int user) {
  tv_obj* ret = NULL;
  if (run_native(rt, index, values, n, &ret) == 0) {
    PyObject* result = user ? to_user(rt, ret) : from_native(rt, ret, 0);
    tv_decref(ret);
    return result;
  }
  const tv_error* e = &rt->ctx.error;
  PyObject* exc;
  if (e->kind == TV_ERR_PYTHON && rt->py_error != NULL) { /* (on_error locates the callable's exception) */
    PyObject* raised = rt->py_error;
    rt->py_error = NULL;
    exc = PyObject_CallFunction(rt->on_error, "iiiiiO", (int)e->kind, (int)e->func, (int)e->pc, (int)e->packed,
                                (int)e->code, raised);
    Py_DECREF(raised);
  } else {
    exc = PyObject_CallFunction(rt->on_error, "iiiiis", (int)e->kind, (int)e->func, (int)e->pc, (int)e->packed,
                                (int)e->code, e->message);
  }
  if (exc != NULL) {
    PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
    Py_DECREF(exc);
  }
  return NULL;
}

/* rt.call(index, args: tuple) -> the result in the VM's Python form */
static PyObject* runtime_call(PyObject* op, PyObject* const* args, Py_ssize_t nargs) {
  Runtime* rt = (Runtime*)op;
  if (nargs != 2 || !PyLong_Check(args[0]) || !PyTuple_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "call(index: int, args: tuple)");
    return NULL;
  }
  if (refuse_if_busy(rt)) return NULL;
  const long index = PyLong_AsLong(args[0]);
  const Py_ssize_t n = PyTuple_GET_SIZE(args[1]);
  tv_obj** values = (tv_obj**)calloc((size_t)(n > 0 ? n : 1), sizeof(tv_obj*));
  if (values == NULL) return PyErr_NoMemory();
  PyObject* result = NULL;
  Py_ssize_t i = 0;
  for (; i < n; ++i) {
    values[i] = to_native(rt, PyTuple_GET_ITEM(args[1], i), 0);
    if (values[i] == NULL) break;
  }
  if (i == n) result = call_converted(rt, (int32_t)index, values, (int32_t)n, 0);
  for (Py_ssize_t j = 0; j < i; ++j) tv_decref(values[j]);
  free(values);
  return result;
}

/* ---- invoke: arguments checked and converted in C, results in the user's form ----------------------
   The specs (native_mode.argument_specs) describe the parameters' types as a table of nodes:
     (0, dtype, dims)                 a tensor: dims[i] >= 0 static, -1 any, -2-k the symbolic dim k
     (1, (node, ...))                 a tuple (a Python tuple of that length)
     (2, {name: (tag, vm_tag, (node, ...))})   an ADT value: its constructor by name, the tag that
                                      constructor has in the IR, its tag in the VM and its fields' nodes
   A value the C checks accept converts exactly as runtime.convert.convert_argument + VirtualMachine's
   conversion would convert it; any other value (a wrong one, or one of the forms only Python converts:
   lists, scalars, NDArrays, non-contiguous arrays) "declines" the fast path before anything runs, and
   the VM's Python conversion then converts it or raises its own error (same type, same message). */
enum { SPEC_OK = 0, SPEC_DECLINE = 1, SPEC_ERROR = -1 };

typedef struct {
  int64_t* values;
  char* bound;
} spec_symbols;

static int spec_convert(Runtime* rt, Py_ssize_t node, PyObject* value, spec_symbols* syms, tv_obj** out);

static int spec_fields(Runtime* rt, PyObject* nodes, PyObject* values, int64_t tag, spec_symbols* syms, tv_obj** out) {
  const Py_ssize_t n = PyTuple_GET_SIZE(nodes);
  if (PyTuple_GET_SIZE(values) != n) return SPEC_DECLINE;
  tv_adt* a = (tv_adt*)malloc(sizeof(tv_adt) + sizeof(tv_obj*) * (size_t)(n > 0 ? n : 1));
  if (a == NULL) { PyErr_NoMemory(); return SPEC_ERROR; }
  a->h.refcount = 1;
  a->h.kind = TV_KIND_ADT;
  a->h.gc = 0;
  a->tag = tag;
  a->nfields = 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    const int rc = spec_convert(rt, PyLong_AsSsize_t(PyTuple_GET_ITEM(nodes, i)), PyTuple_GET_ITEM(values, i), syms,
                                &a->fields[i]);
    if (rc != SPEC_OK) {
      tv_decref(&a->h); /* (frees the fields converted so far) */
      return rc;
    }
    a->nfields = (int32_t)(i + 1);
  }
  *out = &a->h;
  return SPEC_OK;
}

static int spec_tensor(PyObject* spec, PyObject* value, spec_symbols* syms, tv_obj** out) {
  if (!PyArray_CheckExact(value)) return SPEC_DECLINE;
  PyArrayObject* a = (PyArrayObject*)value;
  PyArray_Descr* want = (PyArray_Descr*)PyTuple_GET_ITEM(spec, 1);
  if (PyArray_DESCR(a) != want && !PyArray_EquivTypes(PyArray_DESCR(a), want)) return SPEC_DECLINE;
  if (!PyArray_IS_C_CONTIGUOUS(a)) return SPEC_DECLINE;
  PyObject* dims = PyTuple_GET_ITEM(spec, 2);
  const int ndim = PyArray_NDIM(a);
  if (PyTuple_GET_SIZE(dims) != ndim) return SPEC_DECLINE;
  for (int i = 0; i < ndim; ++i) {
    const long long d = PyLong_AsLongLong(PyTuple_GET_ITEM(dims, i));
    const int64_t actual = (int64_t)PyArray_DIMS(a)[i];
    if (d >= 0) {
      if (d != actual) return SPEC_DECLINE;
    } else if (d <= -2) {
      const long long k = -2 - d;
      if (syms->bound[k]) {
        if (syms->values[k] != actual) return SPEC_DECLINE;
      } else {
        syms->bound[k] = 1;
        syms->values[k] = actual;
      }
    }
  }
  *out = array_to_native(value);
  return *out != NULL ? SPEC_OK : SPEC_ERROR;
}

static int spec_adt(Runtime* rt, PyObject* spec, PyObject* value, spec_symbols* syms, tv_obj** out) {
  static PyObject *s_constructor = NULL, *s_tag = NULL, *s_fields = NULL;
  if (s_constructor == NULL) {
    s_constructor = PyUnicode_InternFromString("constructor");
    s_tag = PyUnicode_InternFromString("tag");
    s_fields = PyUnicode_InternFromString("fields");
    if (s_constructor == NULL || s_tag == NULL || s_fields == NULL) return SPEC_ERROR;
  }
  if (Py_TYPE(value) != (PyTypeObject*)rt->adt_type) return SPEC_DECLINE;
  PyObject* name = PyObject_GetAttr(value, s_constructor);
  if (name == NULL) return SPEC_ERROR;
  PyObject* ctor = PyUnicode_CheckExact(name) ? PyDict_GetItemWithError(PyTuple_GET_ITEM(spec, 1), name) : NULL;
  Py_DECREF(name);
  if (ctor == NULL) return PyErr_Occurred() ? SPEC_ERROR : SPEC_DECLINE;
  PyObject* tag = PyObject_GetAttr(value, s_tag);
  if (tag == NULL) return SPEC_ERROR;
  const int same_tag = PyLong_CheckExact(tag) &&
                       PyLong_AsLongLong(tag) == PyLong_AsLongLong(PyTuple_GET_ITEM(ctor, 0));
  Py_DECREF(tag);
  if (PyErr_Occurred()) return SPEC_ERROR;
  if (!same_tag) return SPEC_DECLINE;
  PyObject* fields = PyObject_GetAttr(value, s_fields);
  if (fields == NULL) return SPEC_ERROR;
  int rc = SPEC_DECLINE;
  if (PyTuple_CheckExact(fields))
    rc = spec_fields(rt, PyTuple_GET_ITEM(ctor, 2), fields, PyLong_AsLongLong(PyTuple_GET_ITEM(ctor, 1)), syms, out);
  Py_DECREF(fields);
  return rc;
}

/* value against spec node `node`: SPEC_OK (*out: a new reference), SPEC_DECLINE, or SPEC_ERROR (a Python
   error is set: out of memory, or StackExhausted for a value nested deeper than this thread's stack). */
static int spec_convert(Runtime* rt, Py_ssize_t node, PyObject* value, spec_symbols* syms, tv_obj** out) {
  if (stack_exhausted(rt)) return SPEC_ERROR;
  PyObject* spec = PyTuple_GET_ITEM(rt->specs, node);
  switch (PyLong_AsLong(PyTuple_GET_ITEM(spec, 0))) {
    case 0:
      return spec_tensor(spec, value, syms, out);
    case 1:
      if (!PyTuple_CheckExact(value)) return SPEC_DECLINE;
      return spec_fields(rt, PyTuple_GET_ITEM(spec, 1), value, 0, syms, out);
    case 2:
      return spec_adt(rt, spec, value, syms, out);
    default:
      return SPEC_DECLINE;
  }
}

static PyObject* fields_to_user(Runtime* rt, tv_adt* a) {
  PyObject* tuple = PyTuple_New(a->nfields);
  if (tuple == NULL) return NULL;
  for (int32_t i = 0; i < a->nfields; ++i) {
    PyObject* v = to_user(rt, a->fields[i]);
    if (v == NULL) { Py_DECREF(tuple); return NULL; }
    PyTuple_SET_ITEM(tuple, i, v);
  }
  return tuple;
}

/* A native value in the user's form (VirtualMachine._to_user of from_native's value): NDArrays over the
   C storage, tuples, ADTs with the user's tags and constructor names; closures as the VM holds them. */
static PyObject* to_user(Runtime* rt, tv_obj* o) {
  if (o == NULL || o->kind != TV_KIND_ADT) {
    if (o != NULL && o->kind == TV_KIND_TENSOR) {
      PyObject* arr = tensor_to_array(rt, (tv_tensor*)o);
      if (arr == NULL) return NULL;
      PyObject* r = PyObject_CallOneArg(rt->wrap, arr);
      Py_DECREF(arr);
      return r;
    }
    return from_native(rt, o, 0);
  }
  if (stack_exhausted(rt)) return NULL;
  tv_adt* a = (tv_adt*)o;
  if (a->tag == TV_REF_TAG) return from_native(rt, o, 0);  /* (its error: a cell is not handed to Python) */
  PyObject* fields = fields_to_user(rt, a);
  if (fields == NULL || a->tag == 0) return fields;
  PyObject* tag = PyLong_FromLongLong((long long)a->tag);
  PyObject* known = tag != NULL ? PyDict_GetItemWithError(rt->user_tags, tag) : NULL;
  PyObject* r = NULL;
  if (known != NULL)
    r = PyObject_CallFunctionObjArgs(rt->adt_type, PyTuple_GET_ITEM(known, 0), fields, PyTuple_GET_ITEM(known, 1), NULL);
  else if (tag != NULL && !PyErr_Occurred())
    r = PyObject_CallFunctionObjArgs(rt->adt_type, tag, fields, NULL);
  Py_XDECREF(tag);
  Py_DECREF(fields);
  return r;
}

/* rt.invoke(index, params: tuple of spec nodes, args: tuple) -> the result in the user's form, or
   NotImplemented when an argument declines the C checks (nothing has run then). */
static PyObject* runtime_invoke(PyObject* op, PyObject* const* args, Py_ssize_t nargs) {
  Runtime* rt = (Runtime*)op;
  if (nargs != 3 || !PyLong_Check(args[0]) || !PyTuple_Check(args[1]) || !PyTuple_Check(args[2]) ||
      rt->specs == NULL) {
    PyErr_SetString(PyExc_TypeError, "invoke(index: int, params: tuple, args: tuple) after set_argument_specs");
    return NULL;
  }
  if (refuse_if_busy(rt)) return NULL;
  const long index = PyLong_AsLong(args[0]);
  const Py_ssize_t n = PyTuple_GET_SIZE(args[2]);
  if (PyTuple_GET_SIZE(args[1]) != n) Py_RETURN_NOTIMPLEMENTED;
  int64_t sym_values[16];
  char sym_bound[16] = {0};
  spec_symbols syms = {sym_values, sym_bound};
  if (rt->nsymbols > 16) {
    syms.values = (int64_t*)calloc((size_t)rt->nsymbols, sizeof(int64_t));
    syms.bound = (char*)calloc((size_t)rt->nsymbols, 1);
    if (syms.values == NULL || syms.bound == NULL) { free(syms.values); free(syms.bound); return PyErr_NoMemory(); }
  }
  tv_obj* stack_values[8];
  tv_obj** values = n <= 8 ? stack_values : (tv_obj**)calloc((size_t)n, sizeof(tv_obj*));
  PyObject* result = NULL;
  Py_ssize_t i = 0;
  int rc = SPEC_OK;
  if (values == NULL) { rc = SPEC_ERROR; PyErr_NoMemory(); }
  for (; rc == SPEC_OK && i < n; ++i) {
    rc = spec_convert(rt, PyLong_AsSsize_t(PyTuple_GET_ITEM(args[1], i)), PyTuple_GET_ITEM(args[2], i), &syms,
                      &values[i]);
    if (rc != SPEC_OK) break;
  }
  if (rc == SPEC_DECLINE) {
    result = Py_NewRef(Py_NotImplemented);
  } else if (rc == SPEC_OK) {
    result = call_converted(rt, (int32_t)index, values, (int32_t)n, 1);
  }
  if (values != NULL)
    for (Py_ssize_t j = 0; j < i; ++j) tv_decref(values[j]);
  if (values != stack_values) free(values);
  if (syms.values != sym_values) { free(syms.values); free(syms.bound); }
  return result;
}

/* rt.set_argument_specs(nodes: tuple, nsymbols, wrap, user_tags: dict) (see above) */
static PyObject* runtime_set_argument_specs(PyObject* op, PyObject* args) {
  Runtime* rt = (Runtime*)op;
  PyObject *specs, *wrap, *user_tags;
  Py_ssize_t nsymbols;
  if (!PyArg_ParseTuple(args, "O!nOO!", &PyTuple_Type, &specs, &nsymbols, &wrap, &PyDict_Type, &user_tags))
    return NULL;
  Py_INCREF(specs); Py_XSETREF(rt->specs, specs);
  Py_INCREF(wrap); Py_XSETREF(rt->wrap, wrap);
  Py_INCREF(user_tags); Py_XSETREF(rt->user_tags, user_tags);
  rt->nsymbols = nsymbols;
  Py_RETURN_NONE;
}

/* The pool's statistics (while a call runs on another thread: as they were when it began). */
static PyObject* runtime_stats(PyObject* op, PyObject* unused) {
  (void)unused;
  Runtime* rt = (Runtime*)op;
  int64_t now[POOL_COUNTERS];
  pool_counters(rt->ctx.pool, now);
  const int64_t* v = rt->busy ? rt->stats_at_call : now;
  return Py_BuildValue("{s:s,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L,s:L}", "allocator", "native-pooled", "bytes_live",
                       (long long)v[0], "peak_bytes", (long long)v[1], "bytes_reserved", (long long)v[2],
                       "num_allocations", (long long)v[3], "num_frees", (long long)v[4], "reuse_hits",
                       (long long)v[5], "bytes_cached", (long long)v[6], "bytes_arena", (long long)v[7], "cells",
                       (long long)v[8]);
}

static PyObject* runtime_python_calls(PyObject* op, PyObject* unused) {
  (void)unused;
  return PyLong_FromLongLong((long long)((Runtime*)op)->python_calls);
}

static PyObject* runtime_reset_stats(PyObject* op, PyObject* unused) {
  (void)unused;
  if (refuse_if_busy((Runtime*)op)) return NULL;
  tv_pool* p = ((Runtime*)op)->ctx.pool;
  p->peak_bytes = p->bytes_live;
  p->num_allocations = p->num_frees = p->reuse_hits = 0;
  Py_RETURN_NONE;
}

static PyObject* runtime_release_cached(PyObject* op, PyObject* unused) {
  (void)unused;
  if (refuse_if_busy((Runtime*)op)) return NULL;
  return PyLong_FromLongLong((long long)tv_pool_release_cached(((Runtime*)op)->ctx.pool));
}

static PyObject* runtime_set_arenas(PyObject* op, PyObject* on) {
  if (refuse_if_busy((Runtime*)op)) return NULL;
  const int truth = PyObject_IsTrue(on);
  if (truth < 0) return NULL;
  ((Runtime*)op)->ctx.pool->no_arenas = !truth;
  Py_RETURN_NONE;
}

static void runtime_dealloc(PyObject* op) {
  Runtime* self = (Runtime*)op;
  for (Py_ssize_t i = 0; i < self->nconstants; ++i) tv_decref(self->constants[i]);
  free(self->constants);
  tv_cells_release(self->ctx.pool);
  tv_pool_decref(self->ctx.pool); /* freed when the last storage of it goes too */
  Py_XDECREF(self->adt_type);
  Py_XDECREF(self->make_closure);
  Py_XDECREF(self->on_error);
  Py_XDECREF(self->specs);
  Py_XDECREF(self->wrap);
  Py_XDECREF(self->user_tags);
  Py_XDECREF(self->callbacks);
  Py_XDECREF(self->py_error);
  free(self->deferred);
  PyObject_Free(self);
}

/* Runtime(invoke_address, constants: tuple of ndarrays, limit_bytes, max_depth, adt_type, make_closure, on_error,
           callbacks: tuple, the Python callable per packed index) */
static PyObject* runtime_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  (void)kwargs;
  unsigned long long address;
  long long limit, max_depth;
  PyObject *constants, *adt_type, *make_closure, *on_error, *callbacks;
  if (!PyArg_ParseTuple(args, "KO!LLOOOO!", &address, &PyTuple_Type, &constants, &limit, &max_depth, &adt_type,
                        &make_closure, &on_error, &PyTuple_Type, &callbacks))
    return NULL;
  if (address == 0 || !PyType_Check(adt_type)) {
    PyErr_SetString(PyExc_ValueError, "Runtime: no entry point, or adt_type is not a type");
    return NULL;
  }
  Runtime* self = PyObject_New(Runtime, type);
  if (self == NULL) return NULL;
  self->invoke = (tv_invoke_fn)(uintptr_t)address;
  memset(&self->ctx, 0, sizeof self->ctx);
  self->nconstants = 0;
  self->constants = NULL;
  Py_INCREF(adt_type); self->adt_type = adt_type;
  Py_INCREF(make_closure); self->make_closure = make_closure;
  Py_INCREF(on_error); self->on_error = on_error;
  Py_INCREF(callbacks); self->callbacks = callbacks;
  self->py_error = NULL;
  self->python_calls = 0;
  self->specs = self->wrap = self->user_tags = NULL;
  self->nsymbols = 0;
  self->busy = 0;
  self->deferred = NULL;
  self->ndeferred = self->cap_deferred = 0;
  self->ctx.pool = tv_pool_new(limit);
  const Py_ssize_t n = PyTuple_GET_SIZE(constants);
  self->constants = (tv_obj**)calloc((size_t)(n > 0 ? n : 1), sizeof(tv_obj*));
  if (self->ctx.pool == NULL || self->constants == NULL) { Py_DECREF(self); return PyErr_NoMemory(); }
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* c = PyTuple_GET_ITEM(constants, i);
    if (!PyArray_Check(c)) { Py_DECREF(self); PyErr_SetString(PyExc_TypeError, "Runtime: constants must be arrays"); return NULL; }
    self->constants[i] = array_to_native(c);
    if (self->constants[i] == NULL) { Py_DECREF(self); return NULL; }
    self->nconstants = i + 1;
  }
  self->ctx.constants = self->constants;
  self->ctx.nconstants = n;
  self->ctx.max_depth = max_depth;
  self->ctx.callback = python_callback;
  return (PyObject*)self;
}

/* ---- the benchmarks' floor: kernels called from C ---------------------------------------------------
   time_calls(addresses: tuple, words: tuple of tuples, repeat) -> seconds: calls the C function at
   addresses[i] with the 64-bit integer words[i] (data pointers, then dims: the kernel ABI), one after the
   other, repeat times; returns the fastest pass. What native mode's kernel calls cost without the VM
   (benchmarks/vm_overhead.py). */
typedef int32_t (*tv_w0)(void);
typedef int32_t (*tv_w1)(intptr_t);
typedef int32_t (*tv_w2)(intptr_t, intptr_t);
typedef int32_t (*tv_w3)(intptr_t, intptr_t, intptr_t);
typedef int32_t (*tv_w4)(intptr_t, intptr_t, intptr_t, intptr_t);
typedef int32_t (*tv_w5)(intptr_t, intptr_t, intptr_t, intptr_t, intptr_t);
typedef int32_t (*tv_w6)(intptr_t, intptr_t, intptr_t, intptr_t, intptr_t, intptr_t);
typedef int32_t (*tv_w7)(intptr_t, intptr_t, intptr_t, intptr_t, intptr_t, intptr_t, intptr_t);
typedef int32_t (*tv_w8)(intptr_t, intptr_t, intptr_t, intptr_t, intptr_t, intptr_t, intptr_t, intptr_t);

static int32_t call_words(void* fn, const intptr_t* w, int n) {
  switch (n) {
    case 0: return ((tv_w0)fn)();
    case 1: return ((tv_w1)fn)(w[0]);
    case 2: return ((tv_w2)fn)(w[0], w[1]);
    case 3: return ((tv_w3)fn)(w[0], w[1], w[2]);
    case 4: return ((tv_w4)fn)(w[0], w[1], w[2], w[3]);
    case 5: return ((tv_w5)fn)(w[0], w[1], w[2], w[3], w[4]);
    case 6: return ((tv_w6)fn)(w[0], w[1], w[2], w[3], w[4], w[5]);
    case 7: return ((tv_w7)fn)(w[0], w[1], w[2], w[3], w[4], w[5], w[6]);
    default: return ((tv_w8)fn)(w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]);
  }
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static PyObject* time_calls(PyObject* module, PyObject* args) {
  (void)module;
  PyObject *addresses, *words;
  long repeat;
  if (!PyArg_ParseTuple(args, "O!O!l", &PyTuple_Type, &addresses, &PyTuple_Type, &words, &repeat)) return NULL;
  const Py_ssize_t n = PyTuple_GET_SIZE(addresses);
  if (PyTuple_GET_SIZE(words) != n || repeat < 1) {
    PyErr_SetString(PyExc_ValueError, "time_calls: one words tuple per address, repeat >= 1");
    return NULL;
  }
  void** fns = (void**)calloc((size_t)(n > 0 ? n : 1), sizeof(void*));
  intptr_t* w = (intptr_t*)calloc((size_t)(n > 0 ? n : 1) * 8, sizeof(intptr_t));
  int* counts = (int*)calloc((size_t)(n > 0 ? n : 1), sizeof(int));
  PyObject* result = NULL;
  if (fns == NULL || w == NULL || counts == NULL) { PyErr_NoMemory(); goto done; }
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* ws = PyTuple_GET_ITEM(words, i);
    if (!PyTuple_Check(ws) || PyTuple_GET_SIZE(ws) > 8) {
      PyErr_SetString(PyExc_ValueError, "time_calls: at most 8 words per call");
      goto done;
    }
    fns[i] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(addresses, i));
    counts[i] = (int)PyTuple_GET_SIZE(ws);
    for (int k = 0; k < counts[i]; ++k) w[8 * i + k] = (intptr_t)PyLong_AsSsize_t(PyTuple_GET_ITEM(ws, k));
    if (PyErr_Occurred()) goto done;
    if (fns[i] == NULL) { PyErr_SetString(PyExc_ValueError, "time_calls: a null address"); goto done; }
  }
  double best = -1.0;
  for (long r = 0; r < repeat; ++r) {
    const double start = now_seconds();
    for (Py_ssize_t i = 0; i < n; ++i)
      if (call_words(fns[i], &w[8 * i], counts[i]) != 0) {
        PyErr_Format(PyExc_RuntimeError, "time_calls: call %zd returned an error", i);
        goto done;
      }
    const double t = now_seconds() - start;
    if (best < 0 || t < best) best = t;
  }
  result = PyFloat_FromDouble(best);
done:
  free(fns);
  free(w);
  free(counts);
  return result;
}

static PyMethodDef module_methods[] = {
    {"time_calls", time_calls, METH_VARARGS, "time_calls(addresses, words, repeat) -> the fastest pass's seconds"},
    {NULL, NULL, 0, NULL},
};

static PyMethodDef runtime_methods[] = {
    {"call", (PyCFunction)(void (*)(void))runtime_call, METH_FASTCALL, "call(index, args) -> result"},
    {"invoke", (PyCFunction)(void (*)(void))runtime_invoke, METH_FASTCALL,
     "invoke(index, params, args) -> the result in the user's form, or NotImplemented"},
    {"set_argument_specs", runtime_set_argument_specs, METH_VARARGS, "set_argument_specs(nodes, nsymbols, wrap, user_tags)"},
    {"stats", runtime_stats, METH_NOARGS, "the pool's statistics"},
    {"python_calls", runtime_python_calls, METH_NOARGS, "how many calls went through Python callbacks"},
    {"reset_stats", runtime_reset_stats, METH_NOARGS, "zero the counters"},
    {"release_cached", runtime_release_cached, METH_NOARGS, "free the cached blocks; returns the bytes"},
    {"set_arenas", runtime_set_arenas, METH_O, "set_arenas(on): whether functions place arenas"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RuntimeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_tensorvm_native.Runtime",
    .tp_basicsize = sizeof(Runtime),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = runtime_new,
    .tp_dealloc = runtime_dealloc,
    .tp_methods = runtime_methods,
    .tp_doc = "One VM's native-mode context: calls the library's tvn_invoke.",
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_tensorvm_native", NULL, -1, module_methods, NULL, NULL,
                                       NULL, NULL};

PyMODINIT_FUNC PyInit__tensorvm_native(void) {
  import_array();
  if (PyType_Ready(&RuntimeType) < 0 || PyType_Ready(&StorageRefType) < 0) return NULL;
  PyObject* module = PyModule_Create(&moduledef);
  if (module == NULL) return NULL;
  Py_INCREF(&RuntimeType);
  if (PyModule_AddObject(module, "Runtime", (PyObject*)&RuntimeType) < 0) {
    Py_DECREF(&RuntimeType);
    return NULL;
  }
  return module;
}
