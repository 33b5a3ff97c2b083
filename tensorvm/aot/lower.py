"""The AOT lowering: a static module becomes a straight-line schedule of kernel calls.

``lower_static(mod, params)`` uses the static executors' shared lowering
(``tensorvm.transform.memory_planner.lower_static``: the VM passes up to, not including,
``ManifestAlloc`` — fold, fuse, A-normal form, lambda lifting) and its walk over ``@main``
(``static_schedule``), which refuses ``if``, ``match``, closures, ADTs, calls of other functions and
``?``/symbolic dims with an ``UnsupportedError`` pointing to the VM.

The result, an ``AotSchedule``, knows every tensor of the run function as a ``Tensor`` record:

* ``input``: a (flattened) parameter of ``@main``, ``param``: a constant linked into the library,
  ``temp``: a kernel result, placed in the workspace by the memory planner, or bound to an output
  buffer when it is (a field of) the result of ``@main`` (the kernel then writes there directly);
* a temp produced by a ``reshape_only`` kernel is an *alias* of its input (same bytes, no copy)
  unless it must land in an output buffer.

Outputs that cannot be written in place (an input, a constant, an alias, or the same tensor twice)
are copied by ``CopyStep``s after the last kernel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ..errors import UnsupportedError
from ..ir.expr import Function
from ..ir.module import IRModule
from ..ir.types import TensorType, TupleType
from ..transform.memory_planner import lower_static as planner_lower_static
from ..transform.memory_planner import static_schedule

__all__ = ["Tensor", "KernelStep", "CopyStep", "AotSchedule", "ParamTable", "lower_static"]

_HINT = "AOT compiles static dataflow programs only; run this program on the VM (tv.vm.compile)"


@dataclass(eq=False)
class Tensor:
    """One tensor of the run function (compared by identity)."""

    kind: str  # "input" | "param" | "temp"
    dtype: str
    shape: tuple
    name: str  # inputs: the C member name; params: a readable name; temps: the IR variable
    index: int = -1  # position among inputs / params
    alias_of: Tensor | None = None  # temps made by a reshape-only kernel: the tensor they view
    output_index: int | None = None  # temps written straight into output buffer #i
    data: np.ndarray | None = None  # params

    @property
    def num_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def size_bytes(self) -> int:
        return self.num_elements * np.dtype(self.dtype).itemsize

    def root(self) -> Tensor:
        tensor = self
        while tensor.alias_of is not None:
            tensor = tensor.alias_of
        return tensor

    def type_text(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"


@dataclass(eq=False)
class KernelStep:
    """``outputs = kernel(inputs)``: one call of a primitive global (destination passing)."""

    kernel: str  # the primitive global's name
    function: Function
    inputs: list
    outputs: list
    binding: str  # the IR variable the result is bound to (for comments)
    reshape_only: bool = False

    @property
    def emitted(self) -> bool:
        """A reshape-only step runs only when its result must land in an output buffer."""
        return not self.reshape_only or any(t.output_index is not None for t in self.outputs)


@dataclass(eq=False)
class CopyStep:
    """``output[index] = source`` (memcpy) after every kernel has run."""

    source: Tensor
    output_index: int


@dataclass
class AotSchedule:
    """A static ``@main`` as tensors and steps; see the module docstring."""

    inputs: list  # Tensor (kind input), flattened in parameter order
    outputs: list  # Tensor per flattened output (the tensor holding the value)
    constants: ParamTable  # the linked parameters (kind param)
    steps: list  # KernelStep, in execution order
    copies: list  # CopyStep
    input_tree: tuple  # one entry per @main parameter: an input index or nested tuples of them
    param_names: tuple  # @main's (remaining) parameter names
    output_tree: object  # nested tuples of output indices mirroring @main's result (an int for a tensor)
    lowered: IRModule
    primitives: dict = field(default_factory=dict)  # kernel name -> primitive Function

    @property
    def params(self) -> list:
        return self.constants.tensors

    @property
    def temps(self) -> list:
        return [t for step in self.steps for t in step.outputs]


class ParamTable:
    """The constants linked into the library, deduplicated by value; named after the user's params."""

    def __init__(self, user_params: dict):
        self.user_params = {name: np.asarray(v.numpy() if hasattr(v, "numpy") else v)
                            for name, v in user_params.items()}
        self.tensors: list[Tensor] = []
        self._by_key: dict = {}

    def get(self, data: np.ndarray) -> Tensor:
        data = np.asarray(data, order="C")  # not ascontiguousarray: it makes a 0-d constant 1-d
        key = (data.dtype.str, data.shape, data.tobytes())
        if key in self._by_key:
            return self._by_key[key]
        static_leaves(TensorType(data.shape, data.dtype.name), "a constant")
        name = next((n for n, v in self.user_params.items()
                     if v.dtype == data.dtype and v.shape == data.shape and np.array_equal(v, data)), None)
        taken = {t.name for t in self.tensors}
        name = c_identifier(name) if name is not None else f"constant_{len(self.tensors)}"
        while name in taken:
            name += "_"
        tensor = Tensor("param", data.dtype.name, data.shape, name, index=len(self.tensors), data=data)
        self.tensors.append(tensor)
        self._by_key[key] = tensor
        return tensor


def lower_static(mod: IRModule, params: dict | None = None, opt_level: int = 3) -> AotSchedule:
    """Lower ``mod`` and turn its ``@main`` into an ``AotSchedule`` (``params`` bound by name).

    The lowering and the walk over ``@main`` are the static executors' shared ones
    (``tensorvm.transform.memory_planner.lower_static`` / ``static_schedule``); this adds what C
    emission needs: tensor records, output buffers written in place, copies, deduplicated constants.
    """
    if not isinstance(mod, IRModule):
        raise UnsupportedError(f"AOT expects an IRModule, got {type(mod).__name__}")
    if "main" not in mod:
        raise UnsupportedError("AOT: the module has no @main function")
    if mod["main"].type_params:
        raise UnsupportedError(f"AOT: @main is polymorphic; {_HINT}")
    try:
        lowered = planner_lower_static(mod, params, opt_level)
        schedule = static_schedule(lowered)
    except UnsupportedError as err:
        raise UnsupportedError(f"AOT: {err}") from None
    return _from_schedule(schedule, lowered, params or {})


def _from_schedule(sched, lowered: IRModule, user_params: dict) -> AotSchedule:
    constants = ParamTable(user_params)
    tensors: dict = {}
    inputs = []
    for name in sched.inputs:
        t = sched.tensors[name]
        tensors[name] = Tensor("input", t.dtype, tuple(t.shape), c_identifier(name), index=len(inputs))
        inputs.append(tensors[name])
    for name, data in sched.params.items():
        tensors[name] = constants.get(data)
    steps = []
    for st in sched.steps:
        outs = []
        for name in st.outputs:
            t = sched.tensors[name]
            alias = tensors[t.alias_of] if st.reshape_only and t.alias_of is not None else None
            tensors[name] = Tensor("temp", t.dtype, tuple(t.shape), name, alias_of=alias)
            outs.append(tensors[name])
        fn = sched.primitives[st.func_name]
        steps.append(KernelStep(st.func_name, fn, [tensors[n] for n in st.inputs], outs,
                                st.outputs[0] if len(st.outputs) == 1 else st.outputs[0].rsplit(".", 1)[0],
                                st.reshape_only and outs[0].alias_of is not None))
    outputs, copies = _assign_outputs([tensors[n] for n in sched.outputs])
    position = {name: i for i, name in enumerate(sched.inputs)}

    def index_tree(tree):
        return position[tree] if isinstance(tree, str) else tuple(index_tree(t) for t in tree)

    input_tree = tuple(index_tree(tree) for tree in sched.input_structure.values())
    return AotSchedule(inputs, outputs, constants, steps, copies, input_tree, tuple(sched.input_structure),
                       sched.output_structure, lowered, dict(sched.primitives))


def _assign_outputs(leaves: list):
    """Let kernels write outputs in place where they can; copy the rest at the end."""
    copies = []
    for i, tensor in enumerate(leaves):
        if tensor.kind == "temp" and tensor.output_index is None:
            tensor.alias_of = None  # a view that is an output: its reshape kernel copies into the buffer
            tensor.output_index = i
        else:  # an input, a constant, or a tensor already written to another output
            copies.append(CopyStep(tensor, i))
    return list(leaves), copies


def static_leaves(ty, what: str) -> list:
    """The tensor types of ``ty`` (a tensor or nested tuple of tensors), in order; refuse the rest."""
    if isinstance(ty, TensorType):
        for d in ty.shape:
            if not isinstance(d, int):
                raise UnsupportedError(f"AOT needs static shapes, but {what} has type {ty} (dim {d!r} is only "
                                       f"known at run time); {_HINT}")
        return [ty]
    if isinstance(ty, TupleType):
        return [leaf for i, f in enumerate(ty.fields) for leaf in static_leaves(f, f"{what}.{i}")]
    raise UnsupportedError(f"AOT handles tensors and tuples of tensors, but {what} has type {ty}; {_HINT}")


def c_identifier(name: str) -> str:
    clean = re.sub(r"\W", "_", name.encode("ascii", "replace").decode()).strip("_") or "t"
    return clean if not clean[0].isdigit() else "t" + clean
