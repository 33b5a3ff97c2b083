"""``tv.aot.build``: a static module becomes C sources with a run function, planned memory and linked params.

    module = tv.aot.build(mod, name="net", params={"w": w})     # an AOTModule
    module.sources         # {"tvmgen_net.c": ..., "tvmgen_net_params.c": ..., "tvmgen_net.h": ...}
    module.export("net.tar")                                    # Model Library Format
    runner = module.load(); runner(x)                           # compiled with cc, run from Python

What is generated (``<name>`` is the model name, every global symbol starts with ``tvmgen_<name>_``):

* ``tvmgen_<name>.h``: ``struct tvmgen_<name>_inputs`` / ``_outputs`` (one ``void*`` per tensor; tuple
  parameters and results are flattened: ``%t: (A, B)`` gives ``t_0``, ``t_1``; outputs are ``output`` or
  ``output0..N``), size macros ``TVMGEN_<NAME>_<TENSOR>_SIZE`` in bytes, ``TVMGEN_<NAME>_WORKSPACE_SIZE``,
  the prototype of ``int32_t tvmgen_<name>_run(...)`` and the descriptor ``tvmgen_<name>_model``;
* ``tvmgen_<name>.c``: the fused kernels (from ``tensorvm.codegen``) as ``static`` functions, the
  workspace (a static buffer, or the application's with ``workspace="external"``) and the run function,
  which calls the kernels in order on pointers at planned offsets, checking each return code;
* ``tvmgen_<name>_params.c``: the parameters as ``static const`` arrays, reached through the one table
  ``tvmgen_<name>_constants``.

The run function allocates nothing: intermediates live at offsets chosen at compile time by
``tensorvm.transform.memory_planner.plan_memory`` (``planner=``), kernel temporaries too large for the
stack come from a slice of the same workspace, outputs are written in place by the kernel that makes
them. OpenMP pragmas are kept under ``#ifdef _OPENMP`` (the kernels run serially without it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import UnsupportedError
from ..ir.module import IRModule
from ..transform.memory_planner import PLANNER_ALGORITHMS, TensorLifetime, plan_memory
from .lower import AotSchedule, KernelStep, Tensor, c_identifier, lower_static

__all__ = ["build", "AOTModule", "TensorInfo", "KernelInfo", "RUNTIME_DIR", "runtime_files"]

RUNTIME_DIR = Path(__file__).parent / "runtime"
SHIM_HEADER = "tensorvm_aot.h"
_SCRATCH_ALIGN = 16
_C_RESERVED = {
    "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum", "extern",
    "float", "for", "goto", "if", "inline", "int", "long", "register", "restrict", "return", "short", "signed",
    "sizeof", "static", "struct", "switch", "typedef", "union", "unsigned", "void", "volatile", "while", "bool",
    "true", "false", "_Bool", "_Alignas", "_Alignof", "_Atomic", "_Generic", "_Noreturn", "_Static_assert",
    "_Thread_local", "asm", "unused_",
}
_DTYPE_CODES = {"i": 0, "u": 1, "f": 2, "b": 6}


def runtime_files() -> dict:
    """The shim shipped with every model: ``{relative path: text}`` (``include/...``, ``src/...``)."""
    return {str(p.relative_to(RUNTIME_DIR)): p.read_text() for p in sorted(RUNTIME_DIR.rglob("*"))
            if p.is_file() and p.suffix in (".h", ".c")}


@dataclass(frozen=True)
class TensorInfo:
    """An input or output of the model as the C interface sees it."""

    name: str
    dtype: str
    shape: tuple

    @property
    def size_bytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def to_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "size": self.size_bytes}


@dataclass(frozen=True)
class KernelInfo:
    """A generated kernel: its C name, error table and memory needs beyond its arguments."""

    name: str
    errors: dict  # code -> message
    scratch_bytes: int  # taken from the workspace while it runs (temporaries too big for the stack)
    stack_bytes: int  # fixed-size temporaries on the C stack


@dataclass(frozen=True)
class StepInfo:
    """One kernel call of the run function (``index`` is the step number in error codes)."""

    index: int
    kernel: str  # C name, or "" for a reshape that is a view (no call)
    binding: str  # the IR variable bound to the result


@dataclass
class AOTModule:
    """The result of ``build``: the C sources and everything known about them."""

    name: str
    sources: dict  # file name -> text (the model C file, the params C file, the header)
    inputs: tuple  # TensorInfo
    outputs: tuple
    input_tree: tuple  # one entry per @main parameter: an input index or a nested tuple of them
    param_names: tuple  # @main's parameter names (bound params excluded)
    output_tree: object  # an output index or a nested tuple of them
    workspace_size: int
    workspace_alignment: int
    workspace_external: bool
    reentrant: bool
    constants: dict  # name -> ndarray, in table order
    memory_plan: object  # StaticMemoryPlan
    planner: str
    kernels: tuple  # KernelInfo
    steps: tuple  # StepInfo
    relay_text: str
    lowered: IRModule = field(repr=False, default=None)

    @property
    def prefix(self) -> str:
        return f"tvmgen_{self.name}"

    @property
    def header_name(self) -> str:
        return f"{self.prefix}.h"

    @property
    def c_sources(self) -> dict:
        return {k: v for k, v in self.sources.items() if k.endswith(".c")}

    @property
    def headers(self) -> dict:
        return {k: v for k, v in self.sources.items() if k.endswith(".h")}

    @property
    def constants_size(self) -> int:
        return sum(a.nbytes for a in self.constants.values())

    @property
    def io_size(self) -> int:
        return sum(t.size_bytes for t in self.inputs) + sum(t.size_bytes for t in self.outputs)

    def kernel_error(self, code: int) -> tuple[str, str]:
        """(kernel and binding, message) for a run function's ``TVAOT_KERNEL_ERROR`` code."""
        step_index, kernel_code = (code & ~0x40000000) >> 12, code & 0xFFF
        if not 0 <= step_index < len(self.steps):
            return "an unknown step", f"kernel error {kernel_code}"
        step = self.steps[step_index]
        errors = next((k.errors for k in self.kernels if k.name == step.kernel), {})
        return f"{step.kernel} (computing %{step.binding})", errors.get(kernel_code, f"kernel error {kernel_code}")

    def write_sources(self, directory) -> dict:
        """Write ``src/*.c``, ``include/*.h`` and the shim under ``runtime/``; returns the include dirs/sources."""
        directory = Path(directory)
        files = {}
        for fname, text in self.sources.items():
            sub = "include" if fname.endswith(".h") else "src"
            files[f"{sub}/{fname}"] = text
        for rel, text in runtime_files().items():
            files[f"runtime/{rel}"] = text
        for rel, text in files.items():
            path = directory / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return {"include_dirs": [directory / "include", directory / "runtime" / "include"],
                "sources": [directory / rel for rel in files if rel.endswith(".c")]}

    def export(self, path) -> Path:
        """Write a Model Library Format tarball (see ``tensorvm.aot.export``)."""
        from .export import export_model_library_format

        return export_model_library_format(self, path)

    def load(self, **options):
        """Compile with ``cc`` into a shared library and return a runner (see ``tensorvm.aot.loader``)."""
        from .loader import load

        return load(self, **options)

    def metadata(self) -> dict:
        """The model's memory and interface facts (the ``metadata.json`` entry of the MLF export)."""
        return {
            "workspace_size_bytes": self.workspace_size,
            "workspace_alignment": self.workspace_alignment,
            "workspace_external": self.workspace_external,
            "constants_size_bytes": self.constants_size,
            "io_size_bytes": self.io_size,
            "planner": self.planner,
            "intermediates_size_bytes": self.memory_plan.unplanned_bytes,
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
        }

    def __repr__(self):
        return (f"<AOTModule {self.name}: {len(self.inputs)} in, {len(self.outputs)} out, "
                f"{len(self.kernels)} kernels, workspace {self.workspace_size} bytes>")


def build(mod: IRModule, name: str = "default", params: dict | None = None, target: str = "c",
          workspace: str = "internal", planner: str = "greedy_by_size", alignment: int = 16,
          opt_level: int = 3, dynamic: bool = False, constants: str = "embed") -> AOTModule:
    """Compile the static ``@main`` of ``mod`` to C; see the module docstring.

    ``dynamic=True``: every function of ``mod`` (recursion, ADTs, closures, dynamic shapes) becomes a
    standalone C library with a header (a ``DynamicAOTModule``, ``tensorvm.aot.dynamic``, docs/aot_dynamic.md);
    ``workspace``, ``planner`` and ``alignment`` do not apply (memory comes from a pool at run time).

    ``params`` binds parameters of ``@main`` by name (linked into the library). ``workspace`` is
    ``"internal"`` (a static buffer in the model file) or ``"external"`` (the run function takes a
    ``void* workspace`` of ``TVMGEN_<NAME>_WORKSPACE_SIZE`` bytes). ``planner`` is a
    ``plan_memory`` algorithm; ``alignment`` the byte alignment of every workspace tensor.
    ``constants`` (``dynamic=True`` only): ``"embed"`` (in the C) or ``"blob"`` (a params blob loaded at run
    time, docs/aot_dynamic.md); static AOT always links its params (``<name>_params.c``).
    """
    _check_options(name, target, workspace, planner, alignment)
    if dynamic:
        from .dynamic import build_dynamic

        return build_dynamic(mod, name, params, opt_level, constants)
    if constants != "embed":
        raise UnsupportedError(f"AOT: constants={constants!r} is for dynamic=True; static AOT links its params "
                               f"into <name>_params.c")
    schedule = lower_static(mod, params, opt_level)
    return _Emitter(schedule, name, workspace == "external", planner, alignment,
                    relay_text=_module_text(mod)).run()


def _check_options(name, target, workspace, planner, alignment):
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
        raise UnsupportedError(f"AOT: the model name must be an ASCII C identifier (letters, digits, _; starting "
                               f"with a letter), got {name!r}")
    if target not in ("c", "python", None):  # "python" (the executors' default) also means C here
        raise UnsupportedError(f"AOT generates C: target must be 'c', got {target!r}")
    if workspace not in ("internal", "external"):
        raise UnsupportedError(f"AOT: workspace must be 'internal' or 'external', got {workspace!r}")
    if planner not in PLANNER_ALGORITHMS:
        raise UnsupportedError(f"AOT: unknown planner {planner!r}; expected one of {', '.join(PLANNER_ALGORITHMS)}")
    if not isinstance(alignment, int) or alignment < 1 or alignment & (alignment - 1):
        raise UnsupportedError(f"AOT: alignment must be a power of two, got {alignment!r}")


def _module_text(mod) -> str:
    try:
        return str(mod)
    except Exception as err:  # noqa: BLE001 - the text is documentation; never fail a build for it
        return f"/* the module could not be printed: {err} */\n"


# --- kernels ---------------------------------------------------------------------------------------
@dataclass
class _Kernel:
    name: str  # C name
    source: str
    errors: dict
    num_inputs: int  # buffer params before the constants
    constants: list  # Tensor (param) appended to the inputs
    num_outputs: int
    param_dtypes: list
    scratch_bytes: int
    stack_bytes: int
    libraries: tuple = ()  # the library files (codegen/lib) the kernel calls


# The static AOT model keeps OpenMP for its parallel loops (``#pragma omp parallel for`` under ``#ifdef
# _OPENMP``) rather than tensorvm's pool: its translation unit holds only the prelude (no BLAS bridge, no
# tv_team.h), allocates nothing and starts no threads of its own, so that it embeds in an application
# with whatever OpenMP runtime (or none) the application links; the pool's workers are detached threads
# living for the process, which such a library should not start behind its host's back.
def _lower_kernel(prim, cname: str, schedule: AotSchedule, prefix: str) -> _Kernel:
    from ..codegen.c_emit import EmitOptions, emit_kernel
    from ..codegen.fused import lower_primitive

    try:
        lowered = lower_primitive(prim, cname)
        emitted = emit_kernel(lowered.func, EmitOptions(team=False))
    except UnsupportedError as err:
        message = str(err).replace('; use target="python" for it', "").replace(
            '; use target="python" to run with NumPy kernels instead', "")
        raise UnsupportedError(f"AOT needs a C kernel for {cname}: {message}") from None
    func = lowered.func
    if func.dim_params:
        raise UnsupportedError(f"AOT: kernel {cname} takes run-time dims {[v.name for v in func.dim_params]}; "
                               f"AOT needs static shapes")
    heap, scratch, stack = _temporaries(func.body)
    source = _static_kernel_source(emitted.source, cname, prefix, heap)
    constants = [schedule.constants.get(array) for array in lowered.constants]
    return _Kernel(cname, source, dict(emitted.errors), lowered.num_params, constants,
                   len(func.params) - func.num_inputs, [b.dtype for b in func.params], scratch, stack,
                   emitted.libraries)


def _temporaries(body) -> tuple[int, int, int]:
    """(number of heap temporaries, peak heap bytes, peak stack bytes) of a kernel body, mirroring the
    emitter's rule: a temporary of constant size up to its stack limit lives on the stack."""
    from ..codegen import c_emit
    from ..codegen.loop_ir import Allocate, For, IfThenElse, LetStmt, Seq
    from ..te.expr import Const

    stack_limit = getattr(c_emit, "_STACK_BYTES", 32 * 1024)
    count = 0

    def walk(s) -> tuple[int, int]:
        nonlocal count
        if isinstance(s, Seq):
            peaks = [walk(x) for x in s.stmts] or [(0, 0)]
            return max(p[0] for p in peaks), max(p[1] for p in peaks)
        if isinstance(s, (For, LetStmt)):
            return walk(s.body)
        if isinstance(s, IfThenElse):
            a = walk(s.then_case)
            b = walk(s.else_case) if s.else_case is not None else (0, 0)
            return max(a[0], b[0]), max(a[1], b[1])
        if isinstance(s, Allocate):
            heap, stack = walk(s.body)
            buf = s.buffer
            itemsize = np.dtype(buf.dtype).itemsize
            if not buf.shape:
                return heap, stack + itemsize
            if isinstance(buf.size, Const) and buf.size.value * itemsize <= stack_limit:
                return heap, stack + max(buf.size.value, 1) * itemsize
            if not isinstance(buf.size, Const):
                raise UnsupportedError(f"AOT: a kernel temporary of run-time size ({buf.name}); AOT needs static "
                                       f"shapes")
            count += 1
            return heap + _round_up(max(buf.size.value, 1) * itemsize, _SCRATCH_ALIGN), stack
        return 0, 0

    heap, stack = walk(body)
    return count, heap, stack


def _static_kernel_source(source: str, cname: str, prefix: str, heap_count: int) -> str:
    """Make the kernel ``static``, its OpenMP pragmas optional, its heap temporaries workspace slices."""
    head, marked = f"int32_t {cname}(", f"TV_SELECT_OF_LOADS int32_t {cname}("
    if source.startswith(marked):  # (a select between two loads: its attribute stays in front, c_emit.py)
        source = "TV_SELECT_OF_LOADS static TVAOT_NOINLINE " + source[len("TV_SELECT_OF_LOADS "):]
    elif source.startswith(head):
        source = "static TVAOT_NOINLINE " + source
    else:
        raise UnsupportedError(f"AOT: unexpected kernel text for {cname} (expected it to start with {head!r})")
    if heap_count:
        source, mallocs = re.subn(r"\bmalloc\(", f"{prefix}_scratch_alloc(", source)
        source, frees = re.subn(r"\bfree\(", f"{prefix}_scratch_free(", source)
        if mallocs != heap_count or frees != heap_count:
            raise UnsupportedError(f"AOT: kernel {cname} allocates {mallocs} temporaries, expected {heap_count}")
    return _optional_pragmas(source, serial=bool(heap_count))


def _optional_pragmas(source: str, serial: bool = False) -> str:
    """``source`` with each OpenMP pragma line under ``#ifdef``, so that it compiles without OpenMP (and
    without warnings); ``serial`` drops the parallel-loop pragmas."""
    lines = []
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith("#pragma omp parallel"):
            if serial:  # the scratch allocator is a single stack: keep such kernels serial
                continue
            lines += ["#ifdef _OPENMP", line, "#endif"]
        elif stripped.startswith("#pragma omp"):
            lines += ["#if defined(_OPENMP) || defined(TVAOT_OMP_SIMD)", line, "#endif"]
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


_GLOBAL_DEFINITION = re.compile(
    r"^(?!static\b)(?:__attribute__\(\([^)]*\)\)[ \t]*)?"  # an optional attribute such as weak: dropped
    r"([A-Za-z_][\w \t\*]*?\b[A-Za-z_]\w*[ \t]*\([^;{\n]*\)[ \t]*\{)", re.M)


def _static_prelude(prelude: str) -> str:
    """The kernels' helper definitions with internal linkage (a model exports only ``tvmgen_<name>_*``),
    their OpenMP pragmas optional."""
    return _optional_pragmas(_GLOBAL_DEFINITION.sub(r"static inline \1", prelude))


def _round_up(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


# --- C emission --------------------------------------------------------------------------------------
class _Emitter:
    def __init__(self, schedule: AotSchedule, name: str, external: bool, planner: str, alignment: int,
                 relay_text: str):
        self.s = schedule
        self.name = name
        self.prefix = f"tvmgen_{name}"
        self.macro = f"TVMGEN_{name.upper()}"
        self.external = external
        self.planner = planner
        self.alignment = max(alignment, _SCRATCH_ALIGN)
        self.relay_text = relay_text

    def run(self) -> AOTModule:
        s = self.s
        self.input_names = self._member_names([t.name for t in s.inputs], "input")
        n_out = len(s.outputs)
        self.output_names = ["output"] if n_out == 1 else [f"output{i}" for i in range(n_out)]
        self._check_macros()
        self.kernels = self._lower_kernels()
        self.plan = self._plan()
        self.workspace_size = self.plan.total_bytes
        self.reentrant = self.external and not any(k.scratch_bytes for k in self.kernels.values())
        model_c = self._model_source()
        params_c = self._params_source()
        header = self._header()
        sources = {f"{self.prefix}.h": header, f"{self.prefix}.c": model_c, f"{self.prefix}_params.c": params_c}
        infos_in = tuple(TensorInfo(n, t.dtype, t.shape) for n, t in zip(self.input_names, s.inputs))
        infos_out = tuple(TensorInfo(n, t.dtype, t.shape) for n, t in zip(self.output_names, s.outputs))
        kernels = tuple(KernelInfo(k.name, k.errors, k.scratch_bytes, k.stack_bytes) for k in self.kernels.values())
        steps = tuple(StepInfo(i, self._kernel_name(st) if st.emitted else "", st.binding)
                      for i, st in enumerate(s.steps))
        return AOTModule(self.name, sources, infos_in, infos_out, s.input_tree, s.param_names, s.output_tree,
                         self.workspace_size, self.alignment, self.external, self.reentrant,
                         {t.name: t.data for t in s.params}, self.plan, self.planner, kernels, steps,
                         self.relay_text, s.lowered)

    # -- names --

    def _member_names(self, names: list, what: str) -> list:
        out, seen = [], {}
        for original in names:
            name = c_identifier(original)
            if name in _C_RESERVED:
                name += "_"
            if name.upper() in seen:
                raise UnsupportedError(f"AOT: {what} names {seen[name.upper()]!r} and {original!r} clash after "
                                       f"sanitizing to C identifiers ({name!r}); rename one of them")
            seen[name.upper()] = original
            out.append(name)
        return out

    def _check_macros(self):
        fixed = {"WORKSPACE", "CONSTANTS", "NUM_INPUTS", "NUM_OUTPUTS", "WORKSPACE_ALIGNMENT", "WORKSPACE_EXTERNAL",
                 "REENTRANT"}
        seen = {}
        for name in self.input_names + self.output_names:
            key = name.upper()
            if key in fixed or key in seen:
                raise UnsupportedError(f"AOT: the tensor name {name!r} clashes with another macro "
                                       f"{self.macro}_{key}_SIZE; rename the parameter")
            seen[key] = name

    def _kernel_name(self, step: KernelStep) -> str:
        return f"{self.prefix}_{c_identifier(step.kernel)}"

    def _lower_kernels(self) -> dict:
        kernels = {}
        for step in self.s.steps:
            if not step.emitted:
                continue
            cname = self._kernel_name(step)
            if cname not in kernels:
                kernels[cname] = _lower_kernel(step.function, cname, self.s, self.prefix)
            kernel = kernels[cname]
            if kernel.num_inputs != len(step.inputs) or kernel.num_outputs != len(step.outputs):
                raise UnsupportedError(f"AOT: kernel {cname} takes {kernel.num_inputs} inputs and "
                                       f"{kernel.num_outputs} outputs, the call passes {len(step.inputs)} and "
                                       f"{len(step.outputs)}")
            tensors = list(step.inputs) + kernel.constants + list(step.outputs)
            for tensor, dtype in zip(tensors, kernel.param_dtypes):
                if tensor.dtype != dtype:
                    raise UnsupportedError(f"AOT: kernel {cname} expects {dtype} where %{step.binding} passes "
                                           f"{tensor.dtype}")
        return kernels

    # -- memory plan --

    def _plan(self):
        s = self.s
        last_step = len(s.steps)  # copies into outputs run after every kernel
        last_use: dict = {}

        def use(tensor: Tensor, step: int):
            last_use[id(tensor)] = max(last_use.get(id(tensor), -1), step)

        for i, step in enumerate(s.steps):
            for t in step.inputs:
                use(t, i)
            if step.emitted:
                for t in self.kernels[self._kernel_name(step)].constants:
                    use(t, i)
        for copy in s.copies:
            use(copy.source, last_step)
        records, self.record_name = [], {}
        for t in s.inputs:
            self.record_name[id(t)] = f"input:{t.name}"
            records.append(TensorLifetime(f"input:{t.name}", t.size_bytes, 0, last_step, kind="input"))
        for t in s.params:
            self.record_name[id(t)] = f"param:{t.name}"
            records.append(TensorLifetime(f"param:{t.name}", t.size_bytes, 0, last_step, kind="param"))
        self.scratch = {}
        for i, step in enumerate(s.steps):
            for k, t in enumerate(step.outputs):
                name = f"t{i}.{k}:{t.name}"
                self.record_name[id(t)] = name
                alias = self.record_name[id(t.alias_of)] if t.alias_of is not None else None
                kind = "output" if t.output_index is not None else "intermediate"
                records.append(TensorLifetime(name, t.size_bytes, i, max(i, last_use.get(id(t), i)), alias, kind))
            kernel = self.kernels.get(self._kernel_name(step)) if step.emitted else None
            if kernel is not None and kernel.scratch_bytes:
                name = f"scratch{i}:{kernel.name}"
                self.scratch[i] = name
                records.append(TensorLifetime(name, kernel.scratch_bytes, i, i))
        plan = plan_memory(records, algorithm=self.planner, alignment=self.alignment)
        return plan.check()

    # -- C text --

    def _ctype(self, dtype: str) -> str:
        from ..codegen.c_emit import C_TYPES

        if dtype not in C_TYPES:
            raise UnsupportedError(f"AOT: no C type for dtype {dtype}")
        return C_TYPES[dtype]

    def _model_source(self) -> str:
        from ..codegen.c_emit import PRELUDE, library_text

        s, p = self.s, self.prefix
        out = [f"/* {p}.c: the tensorvm AOT model {self.name!r}: kernels and run function (generated; do not edit). */",
               "#include <stddef.h>", "#include <stdint.h>", "#include <string.h>", f'#include "{p}.h"', "",
               "/* ---- kernels: tensorvm.codegen (one static function per fused group) ---- */",
               "/* (the application's compiler is not probed: a kernel selecting between two loads is built without",
               "   GCC's loop if-conversion, which some versions vectorize wrongly, lib/tv_kernel.h) */",
               "#ifndef TV_NO_LOOP_IF_CONVERSION", "#define TV_NO_LOOP_IF_CONVERSION 1", "#endif",
               _static_prelude(PRELUDE)]
        libraries = sorted({name for kernel in self.kernels.values() for name in kernel.libraries})
        if libraries:  # (their functions are static, as the kernels are)
            out += ["/* ---- library functions the kernels call (tensorvm/codegen/lib) ---- */",
                    library_text(libraries)]
        if s.params:
            out += [f"/* The linked parameters ({p}_params.c). */",
                    f"extern const void* const {p}_constants[{len(s.params)}];", ""]
        if self.workspace_size and not self.external:
            out += [f"/* Intermediates and kernel scratch, at offsets planned at compile time ({self.planner}). */",
                    f"static _Alignas({self.alignment}) uint8_t {p}_workspace[{self.workspace_size}];", ""]
        if self.scratch:
            out += [_SCRATCH_ALLOCATOR.replace("PREFIX", p), ""]
        for kernel in self.kernels.values():
            out.append(kernel.source)
        out += self._run_function()
        out += self._thread_setter()
        out += self._descriptor()
        return "\n".join(out) + "\n"

    def _run_signature(self) -> str:
        p = self.prefix
        extra = ", void* workspace" if self.external else ""
        return f"int32_t {p}_run(struct {p}_inputs* inputs, struct {p}_outputs* outputs{extra})"

    def _run_function(self) -> list:
        s, p = self.s, self.prefix
        decls, body, used = [], [], set()
        symbols: dict = {}
        for i, t in enumerate(s.inputs):
            symbols[id(t)] = f"in_{self.input_names[i]}"
        for i, t in enumerate(s.params):
            symbols[id(t)] = f"const_{i}"
        out_symbol = {i: f"out_{name}" for i, name in enumerate(self.output_names)}
        for i, step in enumerate(s.steps):
            for t in step.outputs:
                if t.output_index is not None:
                    symbols[id(t)] = out_symbol[t.output_index]
                elif t.alias_of is not None:
                    symbols[id(t)] = symbols[id(t.alias_of)]
                else:
                    symbols[id(t)] = f"t{i}_{step.outputs.index(t)}"

        def ref(t: Tensor) -> str:
            symbol = symbols[id(t)]
            used.add(symbol)
            return symbol

        for i, step in enumerate(s.steps):
            if not step.emitted:
                body.append(f"  /* step {i}: %{step.binding} = {step.kernel}(...) is a view of its input (no copy) */")
                continue
            kernel = self.kernels[self._kernel_name(step)]
            args = [ref(t) for t in step.inputs] + [ref(t) for t in kernel.constants]
            args += [ref(t) for t in step.outputs]
            body.append(f"  /* step {i}: %{step.binding} = {step.kernel} -> "
                        f"{', '.join(t.type_text() for t in step.outputs)} */")
            if i in self.scratch:
                off = self.plan.offsets[self.scratch[i]]
                body.append(f"  {p}_scratch_top = workspace + {off};")
                body.append(f"  {p}_scratch_end = workspace + {off + kernel.scratch_bytes};")
            body.append(f"  rc = {kernel.name}({', '.join(args)});")
            body.append(f"  if (rc != 0) return TVAOT_KERNEL_ERROR({i}, rc);")
        for copy in s.copies:
            src = ref(copy.source)
            dst = out_symbol[copy.output_index]
            used.add(dst)
            body.append(f"  memcpy({dst}, {src}, {copy.source.size_bytes}); /* output {copy.output_index} is "
                        f"{'input ' + copy.source.name if copy.source.kind == 'input' else copy.source.kind} */")
        # Declarations of the pointers the body uses (unused ones would trip -Wall).
        for i, t in enumerate(s.inputs):
            symbol = symbols[id(t)]
            if symbol in used:
                ct = self._ctype(t.dtype)
                decls.append(f"  const {ct}* const {symbol} = (const {ct}*)inputs->{self.input_names[i]};")
        for i, t in enumerate(s.params):
            symbol = symbols[id(t)]
            if symbol in used:
                ct = self._ctype(t.dtype)
                decls.append(f"  const {ct}* const {symbol} = (const {ct}*){p}_constants[{i}]; /* {t.name} */")
        for i, t in enumerate(s.outputs):
            symbol = out_symbol[i]
            if symbol in used:
                ct = self._ctype(t.dtype)
                decls.append(f"  {ct}* const {symbol} = ({ct}*)outputs->{self.output_names[i]};")
        for t in s.temps:
            symbol = symbols[id(t)]
            if t.output_index is None and t.alias_of is None and symbol in used:
                ct = self._ctype(t.dtype)
                offset = self.plan.offsets[self.record_name[id(t)]]
                decls.append(f"  {ct}* const {symbol} = ({ct}*)(workspace + {offset}); "
                             f"/* %{t.name}: {t.type_text()}, {t.size_bytes} bytes */")
        checks = ["  if (inputs == NULL || outputs == NULL) return TVAOT_ERR_NULL_ARGUMENT;"]
        for name in self.input_names:
            checks.append(f"  if (inputs->{name} == NULL) return TVAOT_ERR_NULL_ARGUMENT;")
        for name in self.output_names:
            checks.append(f"  if (outputs->{name} == NULL) return TVAOT_ERR_NULL_ARGUMENT;")
        needs_workspace = any("workspace +" in line for line in decls + body)
        if self.external:
            if needs_workspace:
                checks.append("  if (workspace == NULL) return TVAOT_ERR_WORKSPACE;")
                checks.append(f"  if (((uintptr_t)workspace) % {self.alignment} != 0) return TVAOT_ERR_ALIGNMENT;")
                checks.append("  uint8_t* const workspace_bytes = (uint8_t*)workspace;")
                decls = [d.replace("(workspace + ", "(workspace_bytes + ") for d in decls]
                body = [b.replace("= workspace + ", "= workspace_bytes + ") for b in body]
            else:
                checks.append("  (void)workspace;")
        elif needs_workspace:
            checks.append(f"  uint8_t* const workspace = {p}_workspace;")
        lines = [f"/* Runs the model: {len(s.inputs)} input(s), {len(s.outputs)} output(s), "
                 f"{sum(st.emitted for st in s.steps)} kernel call(s); no allocation. */",
                 self._run_signature() + " {"]
        lines += checks + decls
        if any(line.lstrip().startswith("rc =") for line in body):
            lines.append("  int32_t rc;")
        lines += body + ["  return TVAOT_OK;", "}", ""]
        return lines

    def _thread_setter(self) -> list:
        # (the prelude's budget: tv_num_threads, read by every parallel loop of the kernels)
        return [f"{self._threads_signature()} {{", "  tv_set_num_threads(n);", "  return tv_get_num_threads();", "}",
                ""]

    def _threads_signature(self) -> str:
        return f"int32_t {self.prefix}_set_num_threads(int32_t n)"

    def _descriptor(self) -> list:
        s, p = self.s, self.prefix
        lines = ["/* ---- the model descriptor ---- */",
                 f"static int32_t {p}_run_buffers(void* const* inputs, void* const* outputs, void* workspace) {{"]
        in_fields = ", ".join(f".{n} = inputs[{i}]" for i, n in enumerate(self.input_names))
        out_fields = ", ".join(f".{n} = outputs[{i}]" for i, n in enumerate(self.output_names))
        if not self.input_names:
            lines.append("  (void)inputs;")
        lines.append(f"  struct {p}_inputs in = {{{in_fields or '.unused_ = NULL'}}};")
        lines.append(f"  struct {p}_outputs out = {{{out_fields or '.unused_ = NULL'}}};")
        if self.external:
            lines.append(f"  return {p}_run(&in, &out, workspace);")
        else:
            lines.append("  (void)workspace;")
            lines.append(f"  return {p}_run(&in, &out);")
        lines.append("}")
        lines.append("")
        for which, tensors, names in (("inputs", s.inputs, self.input_names),
                                      ("outputs", s.outputs, self.output_names)):
            if not tensors:
                continue
            for i, t in enumerate(tensors):
                if t.shape:
                    dims = ", ".join(str(d) for d in t.shape)
                    lines.append(f"static const int64_t {p}_{which}_shape{i}[{len(t.shape)}] = {{{dims}}};")
            lines.append(f"static const tvaot_tensor_info_t {p}_{which}_info[{len(tensors)}] = {{")
            for i, (t, n) in enumerate(zip(tensors, names)):
                dt = np.dtype(t.dtype)
                shape = f"{p}_{which}_shape{i}" if t.shape else "NULL"
                lines.append(f'  {{"{n}", "{t.dtype}", {_DTYPE_CODES[dt.kind]}, {dt.itemsize * 8}, {len(t.shape)}, '
                             f"{shape}, {t.size_bytes}, offsetof(struct {p}_{which}, {n})}},")
            lines.append("};")
        in_info = f"{p}_inputs_info" if s.inputs else "NULL"
        out_info = f"{p}_outputs_info" if s.outputs else "NULL"
        lines += [f"const tvaot_model_t {p}_model = {{",
                  f'  TVAOT_ABI_VERSION, "{self.name}", {len(s.inputs)}, {len(s.outputs)}, {in_info}, {out_info},',
                  f"  {self.macro}_WORKSPACE_SIZE, {self.macro}_WORKSPACE_ALIGNMENT, "
                  f"{self.macro}_WORKSPACE_EXTERNAL, {self.macro}_REENTRANT,",
                  f"  {self.macro}_CONSTANTS_SIZE, {p}_run_buffers,", "};"]
        return lines

    def _header(self) -> str:
        s, p, m = self.s, self.prefix, self.macro
        lines = [f"/* {p}.h: C interface of the tensorvm AOT model {self.name!r} (generated; do not edit). */",
                 f"#ifndef {m}_H_", f"#define {m}_H_", "", "#include <stdint.h>", "",
                 f'#include "{SHIM_HEADER}"', "", "#ifdef __cplusplus", 'extern "C" {', "#endif", ""]
        for what, tensors, names in (("Input", s.inputs, self.input_names), ("Output", s.outputs, self.output_names)):
            for t, n in zip(tensors, names):
                lines.append(f"/* {what} {n}: {t.type_text()} */")
                lines.append(f"#define {m}_{n.upper()}_SIZE {t.size_bytes}")
        lines += ["", f"#define {m}_NUM_INPUTS {len(s.inputs)}", f"#define {m}_NUM_OUTPUTS {len(s.outputs)}", "",
                  "/* One buffer holds every intermediate and kernel scratch, at offsets planned at compile time",
                  f"   ({self.planner}); {self.plan.unplanned_bytes} bytes without reuse. */",
                  f"#define {m}_WORKSPACE_SIZE {self.workspace_size}",
                  f"#define {m}_WORKSPACE_ALIGNMENT {self.alignment}",
                  f"#define {m}_WORKSPACE_EXTERNAL {int(self.external)}",
                  "/* 1 when concurrent runs with distinct buffers (and workspaces) are safe. */",
                  f"#define {m}_REENTRANT {int(self.reentrant)}",
                  f"/* Bytes of the parameters linked into {p}_params.c. */",
                  f"#define {m}_CONSTANTS_SIZE {sum(t.size_bytes for t in s.params)}", ""]
        for which, tensors, names in (("inputs", s.inputs, self.input_names),
                                      ("outputs", s.outputs, self.output_names)):
            lines.append(f"struct {p}_{which} {{")
            for t, n in zip(tensors, names):
                lines.append(f"  void* {n}; /* {t.type_text()}, {m}_{n.upper()}_SIZE bytes */")
            if not tensors:
                lines.append("  void* unused_; /* the model has no " + which + " */")
            lines.append("};")
            lines.append("")
        if self.external:
            lines += ["/* Runs the model; `workspace` is the application's buffer of at least",
                      f"   {m}_WORKSPACE_SIZE bytes aligned to {m}_WORKSPACE_ALIGNMENT (NULL when the size is 0).",
                      "   Returns TVAOT_OK or an error code (tensorvm_aot.h); allocates nothing. */"]
        else:
            lines += [f"/* Runs the model on its static workspace ({m}_WORKSPACE_SIZE bytes): not reentrant.",
                      "   Returns TVAOT_OK or an error code (tensorvm_aot.h); allocates nothing. */"]
        lines += [self._run_signature() + ";", "",
                  "/* The thread budget of the kernels' parallel loops: n threads (n <= 0: every core). Returns the",
                  "   count now in effect (always 1 when the model is compiled without OpenMP). */",
                  self._threads_signature() + ";", "",
                  "/* The descriptor: names, dtypes and shapes of the inputs and outputs, and a generic run entry. */",
                  f"extern const tvaot_model_t {p}_model;", "", "#ifdef __cplusplus", "}", "#endif", "",
                  f"#endif /* {m}_H_ */"]
        return "\n".join(lines) + "\n"

    def _params_source(self) -> str:
        s, p = self.s, self.prefix
        lines = [f"/* {p}_params.c: the linked parameters of the tensorvm AOT model {self.name!r} "
                 f"(generated; do not edit). */", "#include <stdint.h>"]
        if not s.params:
            lines += ["", "/* This model has no parameters. */", f"typedef int {p}_no_params;"]
            return "\n".join(lines) + "\n"
        body = []
        needs_math = False
        for t in s.params:
            ct = self._ctype(t.dtype)
            values, special = _c_initializer(t.data)
            needs_math |= special
            count = max(t.data.size, 1)
            body.append(f"/* {t.name}: {t.type_text()} */")
            body.append(f"static const _Alignas(16) {ct} {p}_{t.name}[{count}] = {{")
            body += ["  " + ", ".join(values[i:i + 8]) + "," for i in range(0, len(values), 8)]
            body.append("};")
        if any(t.dtype == "bool" for t in s.params):
            lines.append("#include <stdbool.h>")
        if needs_math:
            lines.append("#include <math.h>")
        lines += [""] + body + ["", f"extern const void* const {p}_constants[{len(s.params)}];",
                                f"const void* const {p}_constants[{len(s.params)}] = {{"]
        lines += [f"  {p}_{t.name}," for t in s.params]
        lines.append("};")
        return "\n".join(lines) + "\n"


def _c_initializer(array: np.ndarray) -> tuple[list, bool]:
    """C literals for every element (exact: floats as hex), and whether NAN/INFINITY appear."""
    flat = array.reshape(-1)
    if flat.size == 0:
        return ["0"], False
    kind, dtype = array.dtype.kind, array.dtype.name
    special = False
    if kind == "b":
        return ["1" if v else "0" for v in flat.tolist()], False
    if kind == "f":
        suffix = {"float32": "f", "float64": "", "float16": ""}[dtype]
        out = []
        for v in flat.astype(np.float64).tolist():
            if v != v:
                text, special = "NAN", True
            elif v in (float("inf"), float("-inf")):
                text, special = ("INFINITY" if v > 0 else "-INFINITY"), True
            else:
                text = v.hex() + suffix
            out.append(f"(_Float16){text}" if dtype == "float16" else text)
        return out, special
    info = np.iinfo(array.dtype)
    out = []
    for v in flat.tolist():
        if kind == "i" and v == info.min:
            text = f"({v + 1} - 1)"
        else:
            text = str(v)
        if dtype == "int64":
            text = f"INT64_C({text})" if v != info.min else f"(INT64_C({v + 1}) - 1)"
        elif dtype == "uint64":
            text = f"UINT64_C({v})"
        elif dtype == "uint32":
            text = f"{v}u"
        out.append(text)
    return out, special


_SCRATCH_ALLOCATOR = """/* Kernel temporaries too large for the stack come from a slice of the workspace, set by the run
   function before each such kernel; they are freed in reverse order, so a stack pointer suffices. */
static uint8_t* PREFIX_scratch_top;
static uint8_t* PREFIX_scratch_end;
static void* PREFIX_scratch_alloc(size_t bytes) {
  size_t rounded = (bytes + 15u) & ~(size_t)15u;
  if (PREFIX_scratch_top == NULL || (size_t)(PREFIX_scratch_end - PREFIX_scratch_top) < rounded) return NULL;
  void* block = PREFIX_scratch_top;
  PREFIX_scratch_top += rounded;
  return block;
}
static void PREFIX_scratch_free(void* block) {
  if (block != NULL) PREFIX_scratch_top = (uint8_t*)block;
}"""

