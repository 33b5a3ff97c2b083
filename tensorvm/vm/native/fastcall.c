/* tensorvm's fast kernel caller: the CPython extension _tensorvm_fastcall (see tensorvm/vm/fastcall.py,
   which builds it once per machine through the code generator's cache). Caller objects check a kernel's
   arrays and call its C function directly; StorageGuard, storage() and view() are the allocator's tensor
   views; Pool is the pooled allocator's hot path (tensorvm/runtime/memory.py).

   fastcall.py puts the text of a small generated header in place of the #include of
   tv_fastcall_config.h below: it names the Python and NumPy versions the module is built for (part of
   the cache key), defines MAX_BUFFERS, MAX_DIMS and MAX_ARGS (fastcall.py's limits) and defines
   call_kernel(fn, words, n), one case per argument count. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <structmember.h>
#include <stddef.h>
#include <stdint.h>

#if !(defined(__x86_64__) || defined(__aarch64__))
#error "the fast kernel caller passes buffers and dims as 64-bit integer arguments (x86-64 or AArch64 only)"
#endif

/* Kernels take (T0*, ..., int64_t, ...): on x86-64 and AArch64 every one of those is a 64-bit integer
   argument, passed the same way, so a kernel of n arguments is called as a function of n intptr_t:
   call_kernel(fn, words, n) calls fn with words[0..n). */
#include "tv_fastcall_config.h"

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    void* fn;
    Py_ssize_t nargs;      /* arrays passed by the caller: inputs, then outputs */
    Py_ssize_t ninputs;
    Py_ssize_t nconst;     /* constant arrays the kernel takes after its inputs */
    Py_ssize_t nbufs;      /* nargs + nconst, in kernel order */
    PyArray_Descr* descr[MAX_BUFFERS];
    int ndim[MAX_BUFFERS];
    int writeable[MAX_BUFFERS];
    Py_ssize_t nstatic;
    int *static_buf, *static_axis;
    npy_intp* static_value;
    Py_ssize_t ndyn;
    int *dyn_buf, *dyn_axis;
    PyObject* constants;   /* tuple */
    PyObject* slow;        /* the checked kernel: called when anything is unusual */
} Caller;

static PyObject* caller_call(PyObject* op, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
    Caller* self = (Caller*)op;
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    intptr_t words[MAX_BUFFERS + MAX_DIMS];
    PyArrayObject* arrays[MAX_BUFFERS];
    if (kwnames != NULL || n != self->nargs) goto slow;
    for (Py_ssize_t k = 0; k < self->nbufs; ++k) {
        PyObject* o;
        if (k < self->ninputs) o = args[k];
        else if (k < self->ninputs + self->nconst) o = PyTuple_GET_ITEM(self->constants, k - self->ninputs);
        else o = args[k - self->nconst];
        if (!PyArray_CheckExact(o)) goto slow;
        PyArrayObject* a = (PyArrayObject*)o;
        PyArray_Descr* d = PyArray_DESCR(a);
        if (d != self->descr[k] && !PyArray_EquivTypes(d, self->descr[k])) goto slow;
        if (PyArray_NDIM(a) != self->ndim[k]) goto slow;
        int flags = PyArray_FLAGS(a);
        if (!(flags & NPY_ARRAY_C_CONTIGUOUS)) goto slow;
        if (self->writeable[k] && !(flags & NPY_ARRAY_WRITEABLE)) goto slow;
        words[k] = (intptr_t)PyArray_DATA(a);
        arrays[k] = a;
    }
    for (Py_ssize_t s = 0; s < self->nstatic; ++s)
        if (PyArray_DIMS(arrays[self->static_buf[s]])[self->static_axis[s]] != self->static_value[s]) goto slow;
    for (Py_ssize_t j = 0; j < self->ndyn; ++j)
        words[self->nbufs + j] = (intptr_t)PyArray_DIMS(arrays[self->dyn_buf[j]])[self->dyn_axis[j]];
    /* Without the GIL, as the checked wrappers call kernels: other threads run meanwhile. The arrays stay
       alive (the caller holds them) and the kernel touches only their data. */
    int32_t rc;
    Py_BEGIN_ALLOW_THREADS
    rc = call_kernel(self->fn, words, (int)(self->nbufs + self->ndyn));
    Py_END_ALLOW_THREADS
    if (rc != 0) goto slow;  /* reported there */
    Py_RETURN_NONE;
slow:
    return PyObject_Vectorcall(self->slow, args, nargsf, kwnames);
}

static void caller_dealloc(PyObject* op) {
    Caller* self = (Caller*)op;
    for (Py_ssize_t k = 0; k < self->nbufs; ++k) Py_XDECREF(self->descr[k]);
    PyMem_Free(self->static_buf); PyMem_Free(self->static_axis); PyMem_Free(self->static_value);
    PyMem_Free(self->dyn_buf); PyMem_Free(self->dyn_axis);
    Py_XDECREF(self->constants);
    Py_XDECREF(self->slow);
    PyObject_Free(self);
}

static PyObject* caller_vectorcall_entry(PyObject* op, PyObject* args, PyObject* kwargs) {
    return PyVectorcall_Call(op, args, kwargs);
}

static PyTypeObject CallerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_tensorvm_fastcall.Caller",
    .tp_basicsize = sizeof(Caller),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(Caller, vectorcall),
    .tp_call = caller_vectorcall_entry,
    .tp_dealloc = caller_dealloc,
    .tp_doc = "A compiled kernel called in C: caller(*inputs, *outputs).",
};

static int int_list(PyObject* seq, Py_ssize_t n, int* out) {
    for (Py_ssize_t i = 0; i < n; ++i) {
        long v = PyLong_AsLong(PyTuple_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred()) return -1;
        out[i] = (int)v;
    }
    return 0;
}

/* make(address, ninputs, dtypes, ndims, writeable, static_buf, static_axis, static_value, dyn_buf, dyn_axis,
        constants, slow) -> Caller; every sequence argument is a tuple, dtypes in kernel buffer order. */
static PyObject* make(PyObject* module, PyObject* args) {
    (void)module;
    unsigned long long address;
    Py_ssize_t ninputs;
    PyObject *dtypes, *ndims, *writeable, *sbuf, *saxis, *svalue, *dbuf, *daxis, *constants, *slow;
    if (!PyArg_ParseTuple(args, "KnO!O!O!O!O!O!O!O!O!O", &address, &ninputs, &PyTuple_Type, &dtypes,
                          &PyTuple_Type, &ndims, &PyTuple_Type, &writeable, &PyTuple_Type, &sbuf,
                          &PyTuple_Type, &saxis, &PyTuple_Type, &svalue, &PyTuple_Type, &dbuf,
                          &PyTuple_Type, &daxis, &PyTuple_Type, &constants, &slow))
        return NULL;
    Py_ssize_t nbufs = PyTuple_GET_SIZE(dtypes), nconst = PyTuple_GET_SIZE(constants);
    Py_ssize_t nstatic = PyTuple_GET_SIZE(sbuf), ndyn = PyTuple_GET_SIZE(dbuf);
    if (nbufs > MAX_BUFFERS || ndyn > MAX_DIMS || nbufs + ndyn > MAX_ARGS || PyTuple_GET_SIZE(ndims) != nbufs
        || PyTuple_GET_SIZE(writeable) != nbufs || ninputs + nconst > nbufs || PyTuple_GET_SIZE(saxis) != nstatic
        || PyTuple_GET_SIZE(svalue) != nstatic || PyTuple_GET_SIZE(daxis) != ndyn || address == 0) {
        PyErr_SetString(PyExc_ValueError, "fastcall.make: inconsistent kernel description");
        return NULL;
    }
    Caller* self = PyObject_New(Caller, &CallerType);
    if (self == NULL) return NULL;
    self->vectorcall = caller_call;
    self->fn = (void*)(uintptr_t)address;
    self->nbufs = 0;
    self->static_buf = self->static_axis = self->dyn_buf = self->dyn_axis = NULL;
    self->static_value = NULL;
    self->constants = self->slow = NULL;
    for (Py_ssize_t k = 0; k < nbufs; ++k) {
        PyArray_Descr* d = NULL;
        if (!PyArray_DescrConverter(PyTuple_GET_ITEM(dtypes, k), &d)) { Py_DECREF(self); return NULL; }
        self->descr[k] = d;
        self->nbufs = k + 1;
    }
    self->nargs = nbufs - nconst;
    self->ninputs = ninputs;
    self->nconst = nconst;
    self->nstatic = nstatic;
    self->ndyn = ndyn;
    self->static_buf = PyMem_Malloc(sizeof(int) * (nstatic + 1));
    self->static_axis = PyMem_Malloc(sizeof(int) * (nstatic + 1));
    self->static_value = PyMem_Malloc(sizeof(npy_intp) * (nstatic + 1));
    self->dyn_buf = PyMem_Malloc(sizeof(int) * (ndyn + 1));
    self->dyn_axis = PyMem_Malloc(sizeof(int) * (ndyn + 1));
    Py_INCREF(constants); self->constants = constants;
    Py_INCREF(slow); self->slow = slow;
    if (!self->static_buf || !self->static_axis || !self->static_value || !self->dyn_buf || !self->dyn_axis) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    if (int_list(ndims, nbufs, self->ndim) || int_list(writeable, nbufs, self->writeable)
        || int_list(sbuf, nstatic, self->static_buf) || int_list(saxis, nstatic, self->static_axis)
        || int_list(dbuf, ndyn, self->dyn_buf) || int_list(daxis, ndyn, self->dyn_axis)) {
        Py_DECREF(self);
        return NULL;
    }
    for (Py_ssize_t s = 0; s < nstatic; ++s) {
        self->static_value[s] = (npy_intp)PyLong_AsSsize_t(PyTuple_GET_ITEM(svalue, s));
        if (PyErr_Occurred()) { Py_DECREF(self); return NULL; }
    }
    for (Py_ssize_t s = 0; s < nstatic; ++s)
        if (self->static_buf[s] < 0 || self->static_buf[s] >= nbufs || self->static_axis[s] < 0
            || self->static_axis[s] >= self->ndim[self->static_buf[s]]) goto bad;
    for (Py_ssize_t j = 0; j < ndyn; ++j)
        if (self->dyn_buf[j] < 0 || self->dyn_buf[j] >= nbufs || self->dyn_axis[j] < 0
            || self->dyn_axis[j] >= self->ndim[self->dyn_buf[j]]) goto bad;
    return (PyObject*)self;
bad:
    Py_DECREF(self);
    PyErr_SetString(PyExc_ValueError, "fastcall.make: a dim refers to a buffer or axis that does not exist");
    return NULL;
}

/* ---- storage guards and tensor views (the allocator's fast path) -------------------------------- */

/* The base object of a storage array: when the storage and every tensor viewing it are gone, its
   dealloc hands the block back with owner._release(block, nbytes). */
typedef struct {
    PyObject_HEAD
    PyObject* owner;
    PyObject* block;
    Py_ssize_t nbytes;
} Guard;

static PyObject* release_name = NULL;
static PyObject* new_block_name = NULL;
static PyObject* alloc_python_name = NULL;
static PyTypeObject PoolType;
static void pool_release(PyObject* pool, PyObject* block, Py_ssize_t nbytes);

static void guard_dealloc(PyObject* op) {
    Guard* self = (Guard*)op;
    if (self->owner != NULL && self->block != NULL) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (Py_TYPE(self->owner) == &PoolType) {
            pool_release(self->owner, self->block, self->nbytes);
        } else {
            PyObject* n = PyLong_FromSsize_t(self->nbytes);
            PyObject* r = n ? PyObject_CallMethodObjArgs(self->owner, release_name, self->block, n, NULL) : NULL;
            if (r == NULL) PyErr_WriteUnraisable(self->owner);
            Py_XDECREF(r);
            Py_XDECREF(n);
        }
        PyErr_Restore(type, value, tb);
    }
    Py_XDECREF(self->owner);
    Py_XDECREF(self->block);
    PyObject_Free(self);
}

static PyTypeObject GuardType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_tensorvm_fastcall.StorageGuard",
    .tp_basicsize = sizeof(Guard),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = guard_dealloc,
    .tp_doc = "Keeps an allocator block checked out while a storage or a tensor views it.",
};

/* A uint8 array of nbytes over the start of block, whose base is a guard returning block to owner. */
static PyObject* make_storage(PyObject* block, Py_ssize_t nbytes, PyObject* owner) {
    Guard* guard = PyObject_New(Guard, &GuardType);
    if (guard == NULL) return NULL;
    Py_INCREF(owner); guard->owner = owner;
    Py_INCREF(block); guard->block = block;
    guard->nbytes = nbytes;
    npy_intp dims[1] = {nbytes};
    PyArray_Descr* descr = PyArray_DescrFromType(NPY_UINT8);
    PyObject* arr = PyArray_NewFromDescr(&PyArray_Type, descr, 1, dims, NULL, PyArray_DATA((PyArrayObject*)block),
                                         NPY_ARRAY_CARRAY, NULL);
    if (arr == NULL) { Py_DECREF(guard); return NULL; }
    if (PyArray_SetBaseObject((PyArrayObject*)arr, (PyObject*)guard) < 0) { Py_DECREF(arr); return NULL; }
    return arr;
}

/* storage(block, nbytes, owner) -> a uint8 array of nbytes over the start of block; block goes back
   to owner._release(block, nbytes) when the array and all its views are gone. */
static PyObject* storage(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3 || !PyArray_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "storage(block: ndarray, nbytes: int, owner)");
        return NULL;
    }
    PyArrayObject* block = (PyArrayObject*)args[0];
    Py_ssize_t nbytes = PyLong_AsSsize_t(args[1]);
    if (nbytes == -1 && PyErr_Occurred()) return NULL;
    if (nbytes < 0 || nbytes > PyArray_NBYTES(block) || !PyArray_IS_C_CONTIGUOUS(block)
        || !PyArray_ISWRITEABLE(block)) {
        PyErr_SetString(PyExc_ValueError, "storage: the block is too small, not contiguous or read-only");
        return NULL;
    }
    return make_storage(args[0], nbytes, args[2]);
}

static PyObject* view_fallback = NULL;  /* numpy.ndarray: exact semantics and errors for unusual calls */

/* view(shape, dtype, storage, offset) -> numpy.ndarray(shape, dtype, buffer=storage, offset=offset) */
static PyObject* view(PyObject* module, PyObject* const* args, Py_ssize_t nargs) {
    (void)module;
    npy_intp dims[NPY_MAXDIMS];
    if (nargs != 4 || !PyTuple_CheckExact(args[0]) || !PyArray_DescrCheck(args[1]) || !PyArray_CheckExact(args[2])
        || !PyLong_CheckExact(args[3]))
        goto fallback;
    {
        PyArrayObject* st = (PyArrayObject*)args[2];
        PyArray_Descr* descr = (PyArray_Descr*)args[1];
        Py_ssize_t nd = PyTuple_GET_SIZE(args[0]);
        if (nd > NPY_MAXDIMS || !PyArray_IS_C_CONTIGUOUS(st)) goto fallback;
        Py_ssize_t offset = PyLong_AsSsize_t(args[3]);
        if (offset < 0) { PyErr_Clear(); goto fallback; }
        Py_ssize_t itemsize = PyDataType_ELSIZE(descr);
        if (itemsize <= 0 || PyDataType_HASSUBARRAY(descr)) goto fallback;
        Py_ssize_t count = 1;
        for (Py_ssize_t i = 0; i < nd; ++i) {
            PyObject* d = PyTuple_GET_ITEM(args[0], i);
            if (!PyLong_CheckExact(d)) goto fallback;
            Py_ssize_t v = PyLong_AsSsize_t(d);
            if (v < 0) { PyErr_Clear(); goto fallback; }
            dims[i] = v;
            if (v != 0 && count > PY_SSIZE_T_MAX / v) goto fallback;
            count *= v;
        }
        if (count > (PY_SSIZE_T_MAX - offset) / itemsize || offset + count * itemsize > PyArray_NBYTES(st))
            goto fallback;
        int flags = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED;
        if (PyArray_ISWRITEABLE(st)) flags |= NPY_ARRAY_WRITEABLE;
        Py_INCREF(descr);
        PyObject* arr = PyArray_NewFromDescr(&PyArray_Type, descr, (int)nd, dims, NULL,
                                             PyArray_BYTES(st) + offset, flags, NULL);
        if (arr == NULL) return NULL;
        Py_INCREF(args[2]);
        if (PyArray_SetBaseObject((PyArrayObject*)arr, args[2]) < 0) { Py_DECREF(arr); return NULL; }
        PyArray_UpdateFlags((PyArrayObject*)arr, NPY_ARRAY_ALIGNED);
        return arr;
    }
fallback:
    return PyObject_Vectorcall(view_fallback, args, nargs, NULL);
}

/* ---- the pooled allocator's hot path ------------------------------------------------------------- */

/* Pool(owner, free): allocation and release for tensorvm.runtime.memory.PooledAllocator. free is the
   owner's dict {block size: [blocks]}; counters live here (the owner reads them as attributes). Requests
   that are not plain (a non-int size, alignment above 64) and new blocks go to the owner in Python. */
typedef struct {
    PyObject_HEAD
    PyObject* owner;
    PyObject* free;
    Py_ssize_t num_allocations, num_frees, reuse_hits, bytes_live, peak_bytes, bytes_reserved;
} Pool;

/* Blocks of these sizes are not cached but dropped (runtime.memory.HEAP_BLOCKS, tv_runtime.h's
   TV_POOL_HEAP_MIN / TV_POOL_HEAP_MAX: the C library's heap reuses them for requests of any size). */
static int heap_block(Py_ssize_t size) { return size >= ((Py_ssize_t)1 << 18) && size < ((Py_ssize_t)1 << 25); }

static Py_ssize_t size_class(Py_ssize_t n) {
    if (n <= 64) return 64;
    int bits = 64 - __builtin_clzll((unsigned long long)(n - 1));
    int shift = bits - 4 < 6 ? 6 : bits - 4;
    Py_ssize_t step = (Py_ssize_t)1 << shift;
    return (n + step - 1) & -step;
}

static void pool_release(PyObject* op, PyObject* block, Py_ssize_t nbytes) {
    Pool* self = (Pool*)op;
    self->num_frees += 1;
    self->bytes_live -= nbytes;
    if (self->free == NULL || !PyArray_Check(block)) return;
    const Py_ssize_t size = PyArray_NBYTES((PyArrayObject*)block);
    if (heap_block(size)) {
        self->bytes_reserved -= size;
        return;
    }
    PyObject* key = PyLong_FromSsize_t(size);
    if (key == NULL) { PyErr_Clear(); return; }
    PyObject* list = PyDict_GetItemWithError(self->free, key);
    if (list == NULL) {
        if (PyErr_Occurred()) { PyErr_Clear(); Py_DECREF(key); return; }
        list = PyList_New(0);
        if (list == NULL || PyDict_SetItem(self->free, key, list) < 0) { PyErr_Clear(); Py_XDECREF(list); Py_DECREF(key); return; }
        Py_DECREF(list);  /* the dict holds it */
    }
    Py_DECREF(key);
    if (PyList_Append(list, block) < 0) PyErr_Clear();
}

static PyObject* pool_alloc(PyObject* op, PyObject* const* args, Py_ssize_t nargs) {
    Pool* self = (Pool*)op;
    if (nargs < 1 || nargs > 3 || !PyLong_CheckExact(args[0])) goto slow;
    Py_ssize_t nbytes = PyLong_AsSsize_t(args[0]);
    if (nbytes < 0) { PyErr_Clear(); goto slow; }
    if (nargs >= 2) {
        if (!PyLong_CheckExact(args[1])) goto slow;
        long alignment = PyLong_AsLong(args[1]);
        if (alignment > 64 || (alignment == -1 && PyErr_Occurred())) { PyErr_Clear(); goto slow; }
    }
    {
        Py_ssize_t cls = size_class(nbytes);
        PyObject* key = PyLong_FromSsize_t(cls);
        if (key == NULL) return NULL;
        PyObject* list = PyDict_GetItemWithError(self->free, key);
        PyObject* block = NULL;
        if (list != NULL && PyList_Check(list) && PyList_GET_SIZE(list) > 0) {  /* (never a heap block) */
            Py_ssize_t n = PyList_GET_SIZE(list);
            block = PyList_GET_ITEM(list, n - 1);
            Py_INCREF(block);
            if (PyList_SetSlice(list, n - 1, n, NULL) < 0) { Py_DECREF(block); Py_DECREF(key); return NULL; }
            self->reuse_hits += 1;
        } else {
            if (list == NULL && PyErr_Occurred()) { Py_DECREF(key); return NULL; }
            PyObject* align = PyLong_FromLong(64);
            PyObject* need = PyLong_FromSsize_t(nbytes);
            block = (align && need) ? PyObject_CallMethodObjArgs(self->owner, new_block_name, key, align, need, NULL)
                                    : NULL;
            Py_XDECREF(align);
            Py_XDECREF(need);
        }
        Py_DECREF(key);
        if (block == NULL) return NULL;
        if (!PyArray_Check(block) || PyArray_NBYTES((PyArrayObject*)block) < nbytes) {
            Py_DECREF(block);
            PyErr_SetString(PyExc_RuntimeError, "pooled allocator: a cached block is too small");
            return NULL;
        }
        PyObject* arr = make_storage(block, nbytes, op);
        Py_DECREF(block);
        if (arr == NULL) return NULL;
        self->num_allocations += 1;
        self->bytes_live += nbytes;
        if (self->bytes_live > self->peak_bytes) self->peak_bytes = self->bytes_live;
        return arr;
    }
slow:
    {
        PyObject* method = PyObject_GetAttr(self->owner, alloc_python_name);
        if (method == NULL) return NULL;
        PyObject* r = PyObject_Vectorcall(method, args, nargs, NULL);
        Py_DECREF(method);
        return r;
    }
}

static int pool_traverse(PyObject* op, visitproc visit, void* arg) {
    Pool* self = (Pool*)op;
    Py_VISIT(self->owner);
    Py_VISIT(self->free);
    return 0;
}

static int pool_clear(PyObject* op) {
    Pool* self = (Pool*)op;
    Py_CLEAR(self->owner);
    Py_CLEAR(self->free);
    return 0;
}

static void pool_dealloc(PyObject* op) {
    PyObject_GC_UnTrack(op);
    pool_clear(op);
    PyObject_GC_Del(op);
}

static PyObject* pool_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
    (void)kwargs;  /* (Pool takes positional arguments only) */
    PyObject *owner, *free;
    if (!PyArg_ParseTuple(args, "OO!", &owner, &PyDict_Type, &free)) return NULL;
    Pool* self = PyObject_GC_New(Pool, type);
    if (self == NULL) return NULL;
    Py_INCREF(owner); self->owner = owner;
    Py_INCREF(free); self->free = free;
    self->num_allocations = self->num_frees = self->reuse_hits = self->bytes_live = self->peak_bytes = 0;
    self->bytes_reserved = 0;
    PyObject_GC_Track((PyObject*)self);
    return (PyObject*)self;
}

static PyMemberDef pool_members[] = {
    {"num_allocations", T_PYSSIZET, offsetof(Pool, num_allocations), 0, NULL},
    {"num_frees", T_PYSSIZET, offsetof(Pool, num_frees), 0, NULL},
    {"reuse_hits", T_PYSSIZET, offsetof(Pool, reuse_hits), 0, NULL},
    {"bytes_live", T_PYSSIZET, offsetof(Pool, bytes_live), 0, NULL},
    {"peak_bytes", T_PYSSIZET, offsetof(Pool, peak_bytes), 0, NULL},
    {"bytes_reserved", T_PYSSIZET, offsetof(Pool, bytes_reserved), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef pool_methods[] = {
    {"alloc", (PyCFunction)(void(*)(void))pool_alloc, METH_FASTCALL, "alloc(nbytes, alignment=64, dtype_hint) -> storage"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PoolType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "_tensorvm_fastcall.Pool",
    .tp_basicsize = sizeof(Pool),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = pool_new,
    .tp_dealloc = pool_dealloc,
    .tp_traverse = pool_traverse,
    .tp_clear = pool_clear,
    .tp_members = pool_members,
    .tp_methods = pool_methods,
    .tp_doc = "The pooled allocator's hot path (see tensorvm.runtime.memory).",
};

static PyMethodDef methods[] = {
    {"make", make, METH_VARARGS, "make(...) -> Caller"},
    {"storage", (PyCFunction)(void(*)(void))storage, METH_FASTCALL, "storage(block, nbytes, owner) -> uint8 array"},
    {"view", (PyCFunction)(void(*)(void))view, METH_FASTCALL, "view(shape, dtype, storage, offset) -> array"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_tensorvm_fastcall", NULL, -1, methods, NULL, NULL,
                                       NULL, NULL};

PyMODINIT_FUNC PyInit__tensorvm_fastcall(void) {
    import_array();
    if (PyType_Ready(&CallerType) < 0 || PyType_Ready(&GuardType) < 0 || PyType_Ready(&PoolType) < 0) return NULL;
    release_name = PyUnicode_InternFromString("_release");
    new_block_name = PyUnicode_InternFromString("_new_block");
    alloc_python_name = PyUnicode_InternFromString("_alloc_python");
    if (new_block_name == NULL || alloc_python_name == NULL) return NULL;
    view_fallback = (PyObject*)&PyArray_Type;
    Py_INCREF(view_fallback);
    if (release_name == NULL) return NULL;
    PyObject* module = PyModule_Create(&moduledef);
    if (module == NULL) return NULL;
    Py_INCREF(&PoolType);
    if (PyModule_AddObject(module, "Pool", (PyObject*)&PoolType) < 0) { Py_DECREF(&PoolType); return NULL; }
    return module;
}