"""Storage blocks and allocators for the VM.

A ``Storage`` is a 1-D uint8 NumPy array of exactly the requested size, carved from an allocator's
block. Tensors are zero-copy views into it (``alloc_tensor``): NumPy records the storage as the base of
every view, so the storage stays alive while any view (or register) refers to it, and when the last
reference drops, ``Storage.__del__`` hands the block back to its allocator. (That finalizer costs about
0.1 µs; ``weakref.finalize`` costs ~2 µs per object, hence ``__del__``.)

Why the block is a ``_Block`` subclass: NumPy collapses chains of views to the first array of the same
type that owns memory; keeping the block and the storage of distinct subclasses makes NumPy stop at the
``Storage``, which is what keeps a storage alive exactly as long as its tensors.

Allocators:

* ``NaiveAllocator``: a fresh block per allocation, released to NumPy on free.
* ``PooledAllocator``: blocks are rounded up to size classes (8 classes per power of two above 64 bytes,
  so at most 12.5% waste) and kept on a free list per class when freed; an allocation that fails
  releases the cached blocks and retries once. ``limit_bytes`` caps the bytes held (live + cached).
  Blocks of ``HEAP_BLOCKS`` sizes (256 KB up to 32 MB) are not kept but freed, so that the C library's
  heap, which coalesces freed memory and serves any size from it, keeps a call's activations near its
  peak live bytes: a cache of exact classes holds a block of every class a call used (MobileNetV3-small
  at batch 8: 37 MB for 9 MB live, past the L3, 1.1-1.25x slower). Above 32 MB glibc maps and unmaps
  each block, and reusing it from the cache saves faulting in fresh pages on every call. The native
  runtime's pool does the same (``tv_runtime.h``).

Both keep statistics (``stats()``): bytes live, peak bytes live, allocations, frees, reuse hits and the
bytes reserved from the system.

Native fast path: creating a ``Storage`` (a NumPy subclass instance with a finalizer) and viewing it costs
~1.5 µs per allocation in Python. The VM may ``attach_native`` a compiled helper (``tensorvm.vm.fastcall``,
built where a C compiler and Python's headers exist; this layer never builds anything itself) whose
``storage(block, nbytes, owner)`` returns a plain uint8 array over the block whose *base* is a small C
guard object: when the storage and every view of it are gone, the guard's deallocation calls
``owner._release(block, nbytes)``, exactly as ``Storage.__del__`` does. Same lifetimes and statistics, a
third of the cost.
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import ExecutionError, ShapeError

__all__ = ["Storage", "Allocator", "NaiveAllocator", "PooledAllocator", "make_allocator", "alloc_tensor",
           "return_free_memory", "LARGE_MODEL_BYTES",
           "size_class", "DEFAULT_ALIGNMENT"]

DEFAULT_ALIGNMENT = 64
HEAP_BLOCKS = range(1 << 18, 1 << 25)  # block sizes the pooled allocator frees instead of caching
_UINT8 = np.dtype("uint8")
_INT64_MAX = 2**63 - 1


class _Block(np.ndarray):
    """An allocator's aligned memory block (a distinct type so NumPy's base collapsing stops at Storage)."""


class Storage(np.ndarray):
    """A storage block: uint8 bytes that tensors view; returns its block to the allocator when it dies.

    (A slice of a storage is a ``Storage`` too, without an allocator: its ``__del__`` does nothing.)
    """

    __slots__ = ("allocator", "block")

    def __del__(self):
        try:
            release = self.allocator._release
        except AttributeError:
            return
        release(self.block, self.size)

    def __repr__(self) -> str:
        return f"Storage({self.size} bytes)"


def alloc_tensor(storage: Storage, offset: int, shape: tuple, dtype) -> np.ndarray:
    """A tensor of ``shape``/``dtype`` viewing ``storage`` at byte ``offset`` (bounds-checked, zero-copy)."""
    if offset < 0:  # NumPy accepts a negative offset and reads before the buffer
        raise ShapeError(f"alloc_tensor: negative byte offset {offset}")
    try:
        return np.ndarray(shape, dtype, buffer=storage, offset=offset)
    except (TypeError, ValueError) as err:
        raise _bad_view(storage, offset, shape, dtype, err) from None


def _bad_view(storage, offset, shape, dtype, err) -> Exception:
    if not isinstance(storage, np.ndarray):
        return ExecutionError(f"alloc_tensor expected a storage block, got {type(storage).__name__}")
    try:
        need = int(offset) + math.prod(int(d) for d in shape) * np.dtype(dtype).itemsize
    except (TypeError, ValueError):
        return ShapeError(f"alloc_tensor: invalid shape {shape!r} or dtype {dtype!r} ({err})")
    return ShapeError(f"alloc_tensor: a {dtype} tensor of shape {tuple(shape)} at byte offset {offset} needs "
                      f"{need} bytes, but the storage has {storage.size} ({err})")


def size_class(nbytes: int) -> int:
    """The pooled size class of a request: a multiple of 64, with 8 classes per power of two."""
    if nbytes <= 64:
        return 64
    step = 1 << max((nbytes - 1).bit_length() - 4, 6)
    return (nbytes + step - 1) & -step


_COUNTERS = ("num_allocations", "num_frees", "reuse_hits", "bytes_live", "peak_bytes", "bytes_reserved")


class _Counters:
    """The statistics an allocator keeps (the native pool keeps the same fields in C)."""

    __slots__ = _COUNTERS

    def __init__(self):
        for name in _COUNTERS:
            setattr(self, name, 0)


def _counter(name: str):
    return property(lambda self: getattr(self._c, name), lambda self, value: setattr(self._c, name, value))


class Allocator:
    """Base class: hands out ``Storage`` blocks and keeps statistics."""

    kind = "base"
    num_allocations = _counter("num_allocations")
    num_frees = _counter("num_frees")
    reuse_hits = _counter("reuse_hits")
    bytes_live = _counter("bytes_live")
    peak_bytes = _counter("peak_bytes")
    bytes_reserved = _counter("bytes_reserved")

    def __init__(self, limit_bytes: int | None = None):
        self.limit_bytes = limit_bytes
        self._native_storage = None
        self._c = _Counters()

    def attach_native(self, module) -> None:
        """Make storages with the compiled helper ``module`` (see the module docstring)."""
        self._native_storage = module.storage

    def reset_stats(self) -> None:
        """Zero the counters (the live and reserved byte counts stay, since blocks are still out)."""
        c = self._c
        c.peak_bytes = c.bytes_live
        c.num_allocations = c.num_frees = c.reuse_hits = 0

    def stats(self) -> dict:
        c = self._c
        return {
            "allocator": self.kind,
            "bytes_live": c.bytes_live,
            "peak_bytes": c.peak_bytes,
            "bytes_reserved": self.bytes_reserved,
            "num_allocations": c.num_allocations,
            "num_frees": c.num_frees,
            "reuse_hits": c.reuse_hits,
        }

    def alloc(self, nbytes: int, alignment: int = DEFAULT_ALIGNMENT, dtype_hint: str = "uint8") -> Storage:
        raise NotImplementedError

    def _release(self, block, nbytes: int) -> None:
        raise NotImplementedError

    # --- shared helpers ---------------------------------------------------------------------------
    def _storage(self, block, nbytes: int) -> Storage:
        """A ``Storage`` of ``nbytes`` over ``block``, counted as live."""
        if self._native_storage is not None:
            storage = self._native_storage(block, nbytes, self)
        else:
            storage = block[:nbytes].view(Storage)
            storage.allocator = self
            storage.block = block
        c = self._c
        c.num_allocations += 1
        c.bytes_live += nbytes
        c.peak_bytes = max(c.peak_bytes, c.bytes_live)
        return storage

    def _fresh_block(self, size: int, alignment: int) -> _Block:
        """A new block of ``size`` bytes whose first byte is ``alignment``-aligned."""
        if size + alignment > _INT64_MAX:  # (more than native mode's C counts: the same error there, tv_native.c)
            raise ShapeError(f"alloc_storage: invalid byte count {size} (a shape whose bytes overflow int64)")
        if self.limit_bytes is not None and self.bytes_reserved + size > self.limit_bytes:
            raise MemoryError(f"limit of {self.limit_bytes} bytes reached")
        raw = np.empty(size + alignment, _UINT8)
        start = -raw.ctypes.data % alignment
        block = raw[start:start + size].view(_Block)
        self.bytes_reserved += size
        return block

    def _check_request(self, nbytes, alignment) -> int:
        try:
            nbytes = int(nbytes)
        except (TypeError, ValueError):
            raise ExecutionError(f"alloc_storage: the size must be an integer byte count, got {nbytes!r}") from None
        if nbytes < 0:
            raise ExecutionError(f"alloc_storage: negative size {nbytes}")
        if alignment <= 0 or alignment & (alignment - 1):
            raise ExecutionError(f"alloc_storage: alignment must be a power of two, got {alignment}")
        return nbytes

    def _out_of_memory(self, nbytes: int, err: Exception) -> ExecutionError:
        limit = "no limit" if self.limit_bytes is None else f"limit {self.limit_bytes}"
        return ExecutionError(
            f"{self.kind} allocator could not allocate {nbytes} bytes ({err}); live {self.bytes_live} bytes, "
            f"reserved {self.bytes_reserved} bytes, {limit}")


class NaiveAllocator(Allocator):
    """A fresh block per allocation; freeing returns the memory to NumPy at once."""

    kind = "naive"

    def alloc(self, nbytes, alignment=DEFAULT_ALIGNMENT, dtype_hint="uint8") -> Storage:
        nbytes = self._check_request(nbytes, alignment)
        try:
            block = self._fresh_block(max(nbytes, 1), alignment)
        except MemoryError as err:
            raise self._out_of_memory(nbytes, err) from None
        return self._storage(block, nbytes)

    def _release(self, block, nbytes):
        c = self._c
        c.num_frees += 1
        c.bytes_live -= nbytes
        self.bytes_reserved -= block.size


class PooledAllocator(Allocator):
    """Size-class free lists: a freed block is kept and handed out again for a request of its class.

    With the native helper attached, ``alloc`` is its C ``Pool.alloc`` (same free lists, same counters,
    kept in C); requests it does not handle (a non-int size, alignment above 64) and new blocks come back
    to the Python code below."""

    kind = "pooled"

    def __init__(self, limit_bytes: int | None = None):
        super().__init__(limit_bytes)
        self._free: dict[int, list] = {}

    def attach_native(self, module) -> None:
        super().attach_native(module)
        pool_type = getattr(module, "Pool", None)
        if pool_type is None:
            return
        pool = pool_type(self, self._free)
        for name in _COUNTERS:
            setattr(pool, name, getattr(self._c, name))
        self._c = pool
        self.alloc = pool.alloc  # the C hot path (an instance attribute shadows the method)

    def _alloc_python(self, nbytes, alignment=DEFAULT_ALIGNMENT, dtype_hint="uint8") -> Storage:
        if nbytes.__class__ is not int or nbytes < 0 or alignment > DEFAULT_ALIGNMENT:
            nbytes = self._check_request(nbytes, alignment)
            if alignment > DEFAULT_ALIGNMENT:  # rare: a fresh block, aligned as asked, not from the pool
                return self._storage(self._new_block(size_class(nbytes), alignment, nbytes), nbytes)
        # (the hot path: inline size class of small requests, one dict lookup, no helper calls)
        c = self._c
        free = self._free.get(64 if nbytes <= 64 else size_class(nbytes))  # (no HEAP_BLOCKS size is kept)
        if free:
            block = free.pop()
            c.reuse_hits += 1
        else:
            block = self._new_block(size_class(nbytes), DEFAULT_ALIGNMENT, nbytes)
        native = self._native_storage
        if native is not None:
            storage = native(block, nbytes, self)
        else:
            storage = block[:nbytes].view(Storage)
            storage.allocator = self
            storage.block = block
        c.num_allocations += 1
        live = c.bytes_live = c.bytes_live + nbytes
        if live > c.peak_bytes:
            c.peak_bytes = live
        return storage

    alloc = _alloc_python

    def _new_block(self, size: int, alignment: int, nbytes: int) -> _Block:
        try:
            return self._fresh_block(size, alignment)
        except MemoryError:
            self.release_cached()  # like TVM: drop the cache and retry once
            try:
                return self._fresh_block(size, alignment)
            except MemoryError as err:
                raise self._out_of_memory(nbytes, err) from None

    def _release(self, block, nbytes):
        c = self._c
        c.num_frees += 1
        c.bytes_live -= nbytes
        if block.size in HEAP_BLOCKS:
            c.bytes_reserved -= block.size
            return
        try:
            self._free[block.size].append(block)
        except KeyError:
            self._free[block.size] = [block]

    def release_cached(self) -> int:
        """Give every cached (free) block back to NumPy; returns the bytes released."""
        released = sum(block.size for blocks in self._free.values() for block in blocks)
        self._free.clear()
        self.bytes_reserved -= released
        return released

    @property
    def bytes_cached(self) -> int:
        return sum(block.size for blocks in self._free.values() for block in blocks)

    def stats(self) -> dict:
        stats = super().stats()
        stats["bytes_cached"] = self.bytes_cached
        return stats


_ALLOCATORS = {"naive": NaiveAllocator, "pooled": PooledAllocator}


_LIBC_TRIM: list = []  # [malloc_trim or None], looked up once


def return_free_memory() -> None:
    """Hands the C heap's free pages back to the system (glibc's ``malloc_trim``; elsewhere nothing).

    Compiling a large model frees as much as it allocates (an ONNX import's protobuf, weights copied
    while they are packed), but glibc keeps freed blocks of a few MB in its heap: after the first such
    free it stops giving them their own mappings. The process would keep that memory resident for good
    (430 MB after importing and compiling BERT-base), so ``tv.vm.compile`` calls this on entry and exit
    for a model with ``LARGE_MODEL_BYTES`` of constants. It collects garbage first (a protobuf message
    in a reference cycle is freed only then), which is why small models skip it."""
    if not _LIBC_TRIM:
        import ctypes
        import ctypes.util

        try:
            trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
            trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
        except (OSError, AttributeError):  # not glibc
            trim = None
        _LIBC_TRIM.append(trim)
    if _LIBC_TRIM[0] is not None:
        import gc

        gc.collect()
        _LIBC_TRIM[0](0)


# Models with at least this many bytes of constants get their freed memory returned after compiling.
LARGE_MODEL_BYTES = 64 << 20


def make_allocator(kind: str | Allocator = "pooled", limit_bytes: int | None = None) -> Allocator:
    """An allocator by name (``"pooled"`` or ``"naive"``), or ``kind`` itself if it is one."""
    if isinstance(kind, Allocator):
        return kind
    try:
        return _ALLOCATORS[kind](limit_bytes)
    except KeyError:
        raise ValueError(f"unknown allocator {kind!r}; expected one of {sorted(_ALLOCATORS)}") from None
