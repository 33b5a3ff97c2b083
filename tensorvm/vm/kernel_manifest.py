"""What calling a built kernel library needs, kept beside it so a new process can skip lowering.

``build_c_library`` keys a whole library by its kernels' keys (``tensorvm.codegen.signature``: each
primitive's signature, the C name, the generator stamp and the codegen settings), so the same program
compiled again, in any process, has the same ``library_key``. After a build, ``save`` writes
``kernels-<key>.json`` into the kernel cache (with its SHA-256 beside it, checked before it is read): the library's path (verified by its SHA-256 when loaded),
flags and Python module name, its C text, and per kernel what the callers need: the C name, each C
function's parameters (name, dtype, static dims; ``null`` for a dynamic one), dim count, error table and
variants, and the constants passed as extra inputs. ``bind`` rebuilds the kernels from it without
lowering or emitting anything; a kernel with external variants (BLAS, chosen per call in Python) is
planned again (its plan holds Python callables), everything else comes from the file.

The file is data: it is read as JSON and checked field by field (types, names that are C identifiers,
dtypes NumPy knows, counts that agree); anything unexpected, a library that is missing or whose bytes do
not match, or a symbol the library lacks makes ``bind`` return None and the caller builds as usual.
Nothing in it is executed. Invariant: ``bind(key)`` gives the kernels a build of the same key would.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re

import numpy as np

__all__ = ["library_key", "save", "bind"]

_FORMAT = "tensorvm-kernel-manifest-1"
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_DTYPES = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
           "bfloat16", "float32", "float64"}


def library_key(kernel_keys: list, shape_keys: list) -> str:
    """The key of a library of kernels ``[(primitive name, kernel key)]`` and shape functions likewise."""
    text = "\n".join(f"k {n} {k}" for n, k in kernel_keys) + "\n" + "\n".join(f"s {n} {k}" for n, k in shape_keys)
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def _path(key: str):
    from ..codegen.build import cache_dir

    return cache_dir() / f"kernels-{key}.json"


# ---- writing -------------------------------------------------------------------------------------------
def _func_record(emitted) -> dict:
    from ..te.expr import Const

    func = emitted.func
    return {"name": func.name, "source": emitted.source, "prototype": emitted.prototype,
            "errors": [[int(code), str(message)] for code, message in sorted(emitted.errors.items())],
            "variants": list(emitted.variants), "libraries": list(emitted.libraries),
            "num_inputs": func.num_inputs, "num_dims": len(func.dim_params),
            "params": [{"name": b.name, "dtype": b.dtype,
                        "shape": [int(d.value) if isinstance(d, Const) else None for d in b.shape]}
                       for b in func.params]}


def _array_record(array) -> dict:
    array = np.array(array, order="C")  # (not ascontiguousarray, which makes a 0-d constant 1-d)
    return {"dtype": array.dtype.name, "shape": list(array.shape), "data": base64.b64encode(array.tobytes()).decode()}


def save(key: str, library, plans: dict, emitted: dict, c_names: dict) -> None:
    """Write the manifest of ``library`` (a ``CLibrary`` just built from ``plans`` / ``emitted``)."""
    import os
    import tempfile

    from ..codegen.build import record_library

    info = library.build_info
    if info is None:
        return
    kernels = {}
    for name, plan in plans.items():
        kernels[name] = {"c_name": c_names[name], "externals": bool(plan.externals),
                         "num_params": plan.lowered.num_params,
                         "constants": [_array_record(c) for c in plan.lowered.constants],
                         "funcs": [_func_record(k) for k in emitted[name]]}
    shapes = {name: {"name": spec.name, "source": spec.source, "messages": list(spec.messages),
                     "deferred": sorted(spec.deferred), "flat_is_input": [bool(f) for f in spec.flat_is_input],
                     "in_ranks": list(spec.in_ranks), "in_dtypes": list(spec.in_dtypes),
                     "out_ranks": list(spec.out_ranks), "label": spec.label}
              for name, (spec, _) in library.shape_funcs.items()}
    data = {"format": _FORMAT, "key": key, "library": info.path, "flags": list(info.flags), "portable": info.portable,
            "python_module": library.python_module, "source": library.source, "kernels": kernels,
            "fallbacks": dict(library.fallbacks), "shape_funcs": shapes,
            "shape_fallbacks": dict(library.shape_fallbacks)}
    path = _path(key)
    tmp = None
    try:  # (with its SHA-256 beside it, as a library's: a damaged file is never read)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(json.dumps(data).encode())
        record_library(tmp, path)
    except OSError:  # (a cache that cannot be written only costs the next process its lowering)
        pass
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


# ---- reading -------------------------------------------------------------------------------------------
class _Invalid(Exception):
    pass


def _check(condition, what: str):
    if not condition:
        raise _Invalid(what)


def _is_str_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _int(value, low: int = 0) -> int:
    _check(type(value) is int and value >= low, f"an integer >= {low}")
    return value


def _stub_func(record: dict):
    """A ``PrimFunc`` with the recorded signature and no body (what callers of a built kernel read)."""
    from ..codegen.loop_ir import Buffer, PrimFunc
    from ..te.expr import const, var

    _check(isinstance(record, dict) and set(record) == {"name", "source", "prototype", "errors", "variants",
                                                         "libraries", "num_inputs", "num_dims", "params"}, "a function")
    _check(isinstance(record["name"], str) and _IDENTIFIER.match(record["name"]), "a C name")
    params = []
    dims = 0
    _check(isinstance(record["params"], list), "parameters")
    for p in record["params"]:
        _check(isinstance(p, dict) and set(p) == {"name", "dtype", "shape"} and isinstance(p["name"], str)
               and p["dtype"] in _DTYPES and isinstance(p["shape"], list), "a parameter")
        shape = []
        for d in p["shape"]:
            if d is None:
                shape.append(var(f"d{dims}", "int64"))
                dims += 1
            else:
                shape.append(const(_int(d), "int64"))
        params.append(Buffer(p["name"], p["dtype"], tuple(shape)))
    _check(_int(record["num_dims"]) == dims, "one dim parameter per dynamic dim")
    _check(_int(record["num_inputs"]) <= len(params), "an input count")
    return PrimFunc(record["name"], tuple(params), tuple(var(f"n{k}", "int64") for k in range(dims)), None,
                    record["num_inputs"])


def _emitted(record: dict):
    from ..codegen.c_emit import EmittedKernel

    func = _stub_func(record)
    _check(isinstance(record["source"], str) and isinstance(record["prototype"], str), "C text")
    _check(_is_str_list(record["variants"]) and _is_str_list(record["libraries"]), "variants and libraries")
    errors = record["errors"]
    _check(isinstance(errors, list) and all(isinstance(e, list) and len(e) == 2 and type(e[0]) is int
                                            and isinstance(e[1], str) for e in errors), "an error table")
    return EmittedKernel(func.name, record["source"], {c: m for c, m in errors}, func, record["prototype"],
                         tuple(record["variants"]), tuple(record["libraries"]))


def _array(record) -> np.ndarray:
    _check(isinstance(record, dict) and set(record) == {"dtype", "shape", "data"} and record["dtype"] in _DTYPES
           and isinstance(record["shape"], list) and isinstance(record["data"], str), "a constant")
    shape = tuple(_int(d) for d in record["shape"])
    data = np.frombuffer(base64.b64decode(record["data"], validate=True), dtype=record["dtype"])
    _check(data.size == int(np.prod(shape, dtype=np.int64)), "a constant's size")
    return data.reshape(shape).copy()


def _read(key: str, kernel_names: dict, shape_names: set):
    """The manifest of ``key`` checked against what is being built, or None."""
    from ..codegen.build import verified_library

    path = _path(key)
    if not verified_library(path):  # (missing, or its bytes are not those written)
        return None
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    try:
        _check(isinstance(data, dict) and data.get("format") == _FORMAT and data.get("key") == key, "the header")
        _check(isinstance(data["library"], str) and _is_str_list(data["flags"]) and isinstance(data["portable"], str)
               and isinstance(data["python_module"], str) and isinstance(data["source"], str), "the library")
        _check(data["python_module"] == "" or _IDENTIFIER.match(data["python_module"]), "a module name")
        kernels, fallbacks = data["kernels"], data["fallbacks"]
        _check(isinstance(kernels, dict) and isinstance(fallbacks, dict)
               and set(kernels) | set(fallbacks) == set(kernel_names) and not set(kernels) & set(fallbacks)
               and all(isinstance(v, str) for v in fallbacks.values()), "the kernels built")
        for name, k in kernels.items():
            _check(isinstance(k, dict) and set(k) == {"c_name", "externals", "num_params", "constants", "funcs"}
                   and k["c_name"] == kernel_names[name] and isinstance(k["externals"], bool)
                   and isinstance(k["constants"], list) and isinstance(k["funcs"], list) and k["funcs"], "a kernel")
            k["funcs"] = [_emitted(f) for f in k["funcs"]]
            _check(k["funcs"][0].name == k["c_name"], "the kernel's C name")
            k["constants"] = [_array(c) for c in k["constants"]]
            _check(_int(k["num_params"]) + len(k["constants"]) == k["funcs"][0].func.num_inputs, "the inputs")
        shapes, shape_fallbacks = data["shape_funcs"], data["shape_fallbacks"]
        _check(isinstance(shapes, dict) and isinstance(shape_fallbacks, dict)
               and set(shapes) | set(shape_fallbacks) == shape_names and not set(shapes) & set(shape_fallbacks)
               and all(isinstance(v, str) for v in shape_fallbacks.values()), "the shape functions built")
        for name, s in shapes.items():
            shapes[name] = _shape_spec(s)
    except (_Invalid, KeyError, TypeError, ValueError):
        return None
    return data


def _shape_spec(record):
    from .shape_c import ShapeFuncC

    fields = {"name", "source", "messages", "deferred", "flat_is_input", "in_ranks", "in_dtypes", "out_ranks", "label"}
    _check(isinstance(record, dict) and set(record) == fields and isinstance(record["name"], str)
           and _IDENTIFIER.match(record["name"]) and isinstance(record["source"], str)
           and isinstance(record["label"], str) and _is_str_list(record["messages"])
           and _is_str_list(record["in_dtypes"]) and all(d in _DTYPES for d in record["in_dtypes"])
           and isinstance(record["flat_is_input"], list) and all(isinstance(f, bool) for f in record["flat_is_input"])
           and isinstance(record["deferred"], list), "a shape function")
    in_ranks = tuple(_int(r) for r in record["in_ranks"])
    out_ranks = tuple(_int(r) for r in record["out_ranks"])
    deferred = frozenset(_int(d) for d in record["deferred"])
    _check(len(in_ranks) == len(record["in_dtypes"]) == len(record["flat_is_input"]), "a shape function's inputs")
    return ShapeFuncC(record["name"], record["source"], tuple(record["messages"]), deferred,
                      tuple(record["flat_is_input"]), in_ranks, tuple(record["in_dtypes"]), out_ranks, record["label"])


def bind(key: str, library, prims: dict, kernel_names: dict, shape_names: set, replan) -> bool:
    """Fill ``library`` (an empty ``CLibrary``) from the manifest of ``key`` and the built library it names;
    ``kernel_names`` maps each primitive to build (aliases excluded) to its C name, ``replan(name)`` plans
    a kernel with external variants again. False (``library`` untouched) when there is no usable manifest."""

    from ..codegen.build import load_built_library
    from ..codegen.fused import FusedKernel, LoweredPrimitive
    from ..codegen.module import CompiledModule
    from .kernel_c import describe_if_complete, fast_kernel
    from .kernel_python import build_kernel

    data = _read(key, kernel_names, shape_names)
    if data is None:
        return False
    built = load_built_library(data["library"], data["python_module"], tuple(data["flags"]), data["portable"])
    if built is None:
        return False
    emitted = [k for record in data["kernels"].values() for k in record["funcs"]]
    try:
        module = CompiledModule(emitted, data["source"], built)
        kernels, sources, shape_funcs, abis, abi_missing = {}, {}, {}, {}, ""
        for name, record in data["kernels"].items():
            if record["externals"]:
                kernel, missing = fast_kernel(name, replan(name).make_kernel(module), None, built, (), True, abis)
            else:
                func = record["funcs"][0].func
                lowered = LoweredPrimitive(func, record["num_params"], record["constants"])
                kernel, missing = fast_kernel(name, FusedKernel(module[func.name], lowered), func, built,
                                              tuple(lowered.constants), False, abis)
            abi_missing = missing or abi_missing
            kernels[name] = kernel
            sources[name] = "\n".join(k.source for k in record["funcs"])
        for name, spec in data["shape_funcs"].items():
            shape_funcs[name] = (spec, built.function(spec.name, 3, 0))
    except AttributeError:  # a symbol the library does not have: not the library the manifest describes
        return False
    for name in data["fallbacks"]:
        kernels[name] = build_kernel(prims[name])
    library.kernels.update(kernels)
    library.sources.update(sources)
    library.fallbacks.update(data["fallbacks"])
    library.shape_funcs.update(shape_funcs)
    library.shape_fallbacks.update(data["shape_fallbacks"])
    library.source = data["source"]
    library.build_info = built.info
    library.python_module = data["python_module"]
    library.library_path = built.info.path
    library.from_manifest = True
    from ..codegen.calibrate import attach_library

    attach_library(built._cdll)  # (the user's pin or the cached product choices, as for a fresh build)
    library.reused += sum(not record["externals"] for record in data["kernels"].values())
    library.abi_missing = abi_missing
    describe_if_complete(library, abis, {name: spec for name, (spec, _) in shape_funcs.items()})
    return True
