"""``tensorvm.vm.compile``: a module to an ``Executable`` (lowering passes, then bytecode emission)."""

from __future__ import annotations

from ..errors import UnsupportedError
from .executable import EXEC_MODES, Executable

__all__ = ["compile", "auto_exec_mode"]

TARGETS = ("python", "c")
COMPILE_EXEC_MODES = ("auto",) + EXEC_MODES

# Instructions that make a program more than one pass over its kernels: calls of VM functions and closures
# (loops, recursion) and branches (if, match)
_CONTROL_FLOW = ("Invoke", "InvokeClosure", "If", "Goto")


def auto_exec_mode(exe: Executable) -> str:
    """The exec mode ``exec_mode="auto"`` runs ``exe`` in, by this rule: native mode on target "c" when a VM
    function has control flow (a call of a VM function or a closure, a branch: a loop, recursion, a match),
    where the dispatch loop interprets every instruction of every step (tensorvm's time over ONNX Runtime's
    on the corpus's bidirectional GRU at 2 x 200 steps, 1 thread: 2.07x bytecode, 1.08-1.10x native; the
    suite's Tree-LSTM: docs/native_mode.md); the bytecode loop for a straight-line program, whose time is its
    kernels' (a CNN or an encoder: native within the noise of bytecode) and which native mode's C of the
    VM functions would only add compile time to."""
    if exe.target != "c":
        return "bytecode"
    branches = any(ins.name in _CONTROL_FLOW for fn in exe.functions for ins in fn.instructions)
    return "native" if branches else "bytecode"


def _native_unless_refused(exe: Executable, lowered) -> Executable:
    """``exe`` in native mode, its library built, or ``exe`` itself (bytecode) for a program native mode
    refuses (docs/native_mode.md, "Refused": a tensor of rank above 16, read from the types, since a rank
    known only at run time would be refused only then; an alignment above 64), which the dispatch loop runs."""
    from .native_emit import NATIVE_MAX_RANK

    if _largest_rank(lowered) > NATIVE_MAX_RANK:
        return exe
    native = exe.with_exec_mode("native")
    try:
        native.kernels  # noqa: B018 - the emitter's refusals surface as the library is built
    except UnsupportedError:
        return exe
    return native


def _refuse_native_rank(lowered) -> None:
    """Native mode refuses a tensor type of rank above 16 at compile time, dims known or not (the emitter
    sees only the ranks of its instructions' static shapes: a dynamic one would be refused only when a call
    passes it)."""
    from .native_emit import NATIVE_MAX_RANK

    rank = _largest_rank(lowered)
    if rank > NATIVE_MAX_RANK:
        raise UnsupportedError(f"native mode: a tensor of rank {rank} > {NATIVE_MAX_RANK} (TV_MAX_RANK, a tensor's "
                               f"dims in its C struct); exec_mode='bytecode' or 'auto' runs it")


def _largest_rank(mod) -> int:
    """The largest rank of a tensor in the types of ``mod``'s expressions (tuples, ADTs, closures, refs)."""
    from ..ir.expr import Function
    from ..ir.types import TensorType, nested_types
    from ..transform.to_anf import post_order_iter

    return max((len(ty.shape) for fn in mod.functions.values() if isinstance(fn, Function)
                for node in post_order_iter(fn) for ty in nested_types(getattr(node, "_checked_type", None))
                if isinstance(ty, TensorType)), default=0)


def compile(mod, target: str | None = None, params: dict | None = None, opt_level: int = 3,  # noqa: A001
            exec_mode: str = "auto", memory_plan: bool = True) -> Executable:
    """Compile ``mod`` for the VM.

    ``params`` binds parameters of ``main`` by name as constants. Without ``target``, ``"c"`` when a C
    compiler is found, else ``"python"`` (``tensorvm.codegen.build.default_target``). ``target="python"`` builds NumPy
    kernels; ``target="c"`` compiles the kernels into one shared library with the system C compiler (shape
    functions stay Python; a primitive the C generator cannot handle runs on NumPy, listed in
    ``exe.stats()``). ``exec_mode="compiled"`` runs each VM function compiled for the target instead of through
    the dispatch loop (same results and API): on target "c" that is ``exec_mode="native"``, every VM function
    as C in the kernel library, called once per invocation (docs/native_mode.md); on target "python",
    generated Python (``exe.as_python()``). ``exec_mode="auto"`` (the default) is native mode on target "c"
    for a program with control flow and the bytecode dispatch loop otherwise (``auto_exec_mode``);
    ``exe.exec_mode`` says which. ``memory_plan=False`` skips storage coalescing (to measure it).
    """
    if target is None:
        from ..codegen.build import default_target

        target = default_target()
    if target not in TARGETS:
        raise UnsupportedError(f"unknown target {target!r}; expected one of {TARGETS}")
    if exec_mode not in COMPILE_EXEC_MODES:
        raise UnsupportedError(f"unknown exec_mode {exec_mode!r}; expected one of {COMPILE_EXEC_MODES}")
    if exec_mode == "native" and target != "c":
        raise UnsupportedError(f"exec_mode='native' compiles the VM functions to C: it needs target 'c', got "
                               f"{target!r}")
    if target == "c":
        from .fastcall import build_in_background

        build_in_background()  # (the VM's kernel caller: built on a cold cache while the module is lowered)
    from ..runtime.memory import LARGE_MODEL_BYTES, return_free_memory
    from ..transform.vm_pipeline import lower_for_vm
    from .codegen import generate

    large = _constant_bytes(mod, params) >= LARGE_MODEL_BYTES
    if large:
        return_free_memory()  # what the caller freed (an ONNX import's protobuf), before weights are packed
    lowered = lower_for_vm(mod, params=params, opt_level=opt_level, memory_plan=memory_plan, target=target)
    if exec_mode == "native":
        _refuse_native_rank(lowered)
    exe = generate(lowered, exec_mode="bytecode" if exec_mode == "auto" else exec_mode, target=target)
    if exec_mode == "auto" and auto_exec_mode(exe) == "native":
        exe = _native_unless_refused(exe, lowered)
    exe.kernels  # noqa: B018 - build the kernels now so a compile error surfaces here
    if large:
        del lowered
        return_free_memory()
    return exe


def _constant_bytes(mod, params: dict | None) -> int:
    """Bytes of the tensors ``mod`` holds as constants plus those ``params`` binds."""
    import numpy as np

    from ..ir.expr import Constant, Function
    from ..ir.module import IRModule
    from ..transform.to_anf import post_order_iter

    total = sum(np.asarray(v).nbytes for v in (params or {}).values())
    if isinstance(mod, IRModule):
        for fn in mod.functions.values():
            if isinstance(fn, Function):
                total += sum(n.data.nbytes for n in post_order_iter(fn.body) if isinstance(n, Constant))
    return total
