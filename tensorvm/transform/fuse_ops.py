"""FuseOps: group operator calls into ``Primitive=1`` functions, each of which becomes one kernel.

Requires: a typed module (``InferType``). Works on graph form and on let-bound code (a ``let``-bound
value is a fusion boundary, as in Relay).

After it, every call of an operator (other than the memory dialect) sits inside a primitive function
``fn (%p0: T0, ..., Primitive=1) { ... }`` that is called in place: ``(fn (...) {...})(args)``. A
primitive's parameters are its inputs (non-scalar constants are passed as arguments; scalar ones
stay inside), its body is a DAG of op calls, tuples and projections, and it has exactly one output
(a tensor or a tuple). A primitive made only of reshape-like ops
(``tensorvm.op.transform.RESHAPE_ONLY_OPS``) with one data input carries ``reshape_only=1``.

The grouping follows TVM's rules, on the dataflow graph of each function body (nested functions are
separate regions; a value used inside a nested function is a group output):

* a node may fuse into its immediate post-dominator, and then every node on the paths between them
  joins the group (so a group has a single output);
* elemwise/broadcast ops fuse into a consumer that is elemwise, broadcast, injective or a reduction
  (all paths injective at most); an elemwise/broadcast chain therefore fuses;
* ``OUT_ELEMWISE_FUSABLE`` ops (dense, conv2d, matmul) and reductions take an elementwise epilogue
  (the path to the post-dominator elementwise, its ops broadcast at most), and a group never holds
  two of them -- except that a 2x2 stride-2 max pool joins the group of the unit-stride float32
  convolution (and its epilogue) it post-dominates, because the direct convolution kernel pools its
  output tiles in registers (``codegen.strategy``): the unpooled map is never stored;
* injective ops and tuples fuse into injective consumers and reductions (phase 2: into tuples
  that already fused into injective consumers);
* a transpose that only feeds a batched float product (``onnx.matmul``, ``nn.batch_matmul``) joins the
  product's group, with the reshapes before it, when the product can read it in place (its input's
  last axis stays among the last two): the kernel then reads the untransposed input with strides, as
  attention's ``Q K^T`` does; likewise a transpose of such a product's result that keeps the last axis
  last (the product writes its matrices where the transpose puts them);
* ``annotation.stop_fusion`` (opaque) stands alone, so nothing fuses across it, and is then removed
  (its value is its argument's): it costs no kernel;
* opaque ops stand alone; an op whose output shape is dynamic *and* whose shape function reads data
  (``arange``, ``argwhere``, ...) is opaque, because a composed shape function cannot read the data
  of a value computed inside the group;
* a group holds at most ``max_depth`` nodes (``fuse_opt_level=0`` puts every op alone).
"""

from __future__ import annotations

from ..errors import TypeInferenceError
from ..ir.attrs import Attrs
from ..ir.expr import (
    Call,
    Constant,
    Constructor,
    Expr,
    Function,
    GlobalVar,
    Op,
    Tuple,
    TupleGetItem,
    Var,
    is_op_call,
    op_name,
)
from ..ir.functor import call_nested
from ..ir.module import IRModule
from ..ir.types import FuncType, TensorType, TupleType
from ..op.annotation import STOP_FUSION
from ..op.nn import halves_nchw_map
from ..op.registry import OpPattern, get_op
from .pass_infra import Pass
from .to_anf import TypedMutator, copy_type, expr_children, known_type, post_order_iter, rebuild_function

__all__ = ["FuseOps"]

DEFAULT_MAX_DEPTH = 256
_MEMORY_PREFIXES = ("memory.", "vm.")
_LEAVES = (Var, GlobalVar, Constant, Op, Constructor, Function)

ELEMWISE, BROADCAST, INJECTIVE = OpPattern.ELEMWISE, OpPattern.BROADCAST, OpPattern.INJECTIVE
COMM_REDUCE, OUT_ELEMWISE_FUSABLE = OpPattern.COMM_REDUCE, OpPattern.OUT_ELEMWISE_FUSABLE
TUPLE, OPAQUE = OpPattern.TUPLE, OpPattern.OPAQUE
_ANCHORS = (OUT_ELEMWISE_FUSABLE, COMM_REDUCE)

def reshape_only_ops() -> frozenset:
    from ..op.transform import RESHAPE_ONLY_OPS

    return RESHAPE_ONLY_OPS


def is_static_type(ty) -> bool:
    if isinstance(ty, TensorType):
        return ty.is_static
    if isinstance(ty, TupleType):
        return all(is_static_type(f) for f in ty.fields)
    return True


def flatten_tensor_types(ty) -> list:
    """The tensor types of a (possibly nested) tuple type, in order."""
    if isinstance(ty, TupleType):
        return [t for f in ty.fields for t in flatten_tensor_types(f)]
    return [ty]


def _is_tensor_tree(ty) -> bool:
    if isinstance(ty, TensorType):
        return True
    return isinstance(ty, TupleType) and all(_is_tensor_tree(f) for f in ty.fields)


def _is_memory_op(call: Expr) -> bool:
    return (op_name(call) or "").startswith(_MEMORY_PREFIXES)


def _is_stop_fusion(expr: Expr) -> bool:
    return is_op_call(expr, STOP_FUSION)


def _is_op_call(expr: Expr) -> bool:
    return is_op_call(expr) and not _is_memory_op(expr)


def _type_of(expr: Expr):
    ty = known_type(expr)
    if ty is None:
        raise TypeInferenceError("FuseOps needs a typed module; run tensorvm.transform.InferType first")
    return ty


# --- the dataflow graph ------------------------------------------------------------------------
class _Node:
    __slots__ = ("expr", "pattern", "outputs", "extern", "to_exit", "parent", "depth", "dom_pattern", "group")

    def __init__(self, expr: Expr, pattern: OpPattern):
        self.expr, self.pattern = expr, pattern
        self.outputs: list[tuple[_Node, OpPattern]] = []
        self.extern = False  # used from another region (inside a nested function)
        self.to_exit = False  # the region's result
        self.parent: _Node | None = None  # immediate post-dominator
        self.depth = 1
        self.dom_pattern = OPAQUE  # combined pattern of the paths to the post-dominator
        self.group: _Group | None = None


class _Group:
    __slots__ = ("parent", "pattern", "num_nodes", "anchor_expr", "node")

    def __init__(self, node: _Node):
        self.parent: _Group | None = None
        self.pattern = node.pattern
        self.num_nodes = 1
        self.anchor_expr = node.expr if node.pattern in _ANCHORS else None  # the group's anchor op call
        self.node = node  # for a root group: the group's output node

    def root(self) -> _Group:
        group = self
        while group.parent is not None:
            group = group.parent
        # Path compression.
        node = self
        while node.parent is not None and node.parent is not group:
            node.parent, node = group, node.parent
        return group


def _pools_convolution_tiles(anchor: Expr | None, consumer: Expr) -> bool:
    """Whether ``consumer`` is a 2x2 stride-2 max pool (no padding, floor mode, NCHW) and ``anchor`` a
    float32 NCHW/OIHW convolution with unit strides and dilation, one group, a kernel larger than 1x1:
    the pair the direct convolution kernel fuses (see the module docstring)."""
    if not (is_op_call(anchor, "nn.conv2d") and is_op_call(consumer, "nn.max_pool2d")):
        return False
    conv, pool = get_op("nn.conv2d").normalize_attrs(anchor.attrs), get_op("nn.max_pool2d").normalize_attrs(consumer.attrs)
    types = [_type_of(anchor), *(_type_of(a) for a in anchor.args)]
    weight = types[2]
    return (all(isinstance(t, TensorType) and t.dtype == "float32" for t in types)
            and conv.groups == 1 and tuple(conv.strides) == (1, 1) and tuple(conv.dilation) == (1, 1)
            and conv.data_layout == "NCHW" and conv.kernel_layout == "OIHW" and (conv.out_layout or "NCHW") == "NCHW"
            and len(weight.shape) == 4 and tuple(weight.shape[2:]) != (1, 1) and halves_nchw_map(pool))


_STRIDED_PRODUCTS = ("onnx.matmul", "nn.batch_matmul")


def _transpose_of_strided_product(transpose: Expr, product: Expr) -> tuple | None:
    """The permutation of ``transpose`` when it is a transpose and ``product`` a batched float32/64
    product of operands of one rank with at most two batch dims besides static ones of 1 (what
    ``codegen.strategy.StridedGemmCall`` computes); else None."""
    from ..op.transform import transpose_axes

    if not (is_op_call(transpose, "transpose") and is_op_call(product, *_STRIDED_PRODUCTS)):
        return None
    types = [_type_of(a) for a in product.args] + [_type_of(product), _type_of(transpose.args[0])]
    if not all(isinstance(t, TensorType) and t.dtype in ("float32", "float64") for t in types):
        return None
    a, b, out, source = types
    if len(a.shape) != len(b.shape) or len(a.shape) < 2 or sum(1 for d in out.shape[:-2] if d != 1) > 2:
        return None
    return transpose_axes("transpose", get_op("transpose").normalize_attrs(transpose.attrs), len(source.shape),
                          TypeInferenceError)


def _product_reads_in_place(transpose: Expr, product: Expr) -> bool:
    """Whether the product reads the transposed operand where it lies, with a leading dimension: the
    transpose's input's last axis stays among the last two (the transpose is then never stored)."""
    axes = _transpose_of_strided_product(transpose, product)
    return axes is not None and any(a is transpose for a in product.args) and len(axes) - 1 in axes[-2:]


def _product_writes_in_place(product: Expr, transpose: Expr) -> bool:
    """Whether the product writes its matrices straight into the transpose of its result: the transpose
    keeps the last axis last."""
    axes = _transpose_of_strided_product(transpose, product)
    return axes is not None and transpose.args[0] is product and axes[-1] == len(axes) - 1


def _op_pattern(call: Call) -> OpPattern:
    opdef = get_op(call.op)
    ty = _type_of(call)
    if opdef.is_data_dependent and not is_static_type(ty):
        return OPAQUE
    if not _is_tensor_tree(ty) or not all(_is_tensor_tree(_type_of(a)) for a in call.args):
        return OPAQUE
    return OpPattern(opdef.pattern)


def _node_pattern(expr: Expr) -> OpPattern:
    if _is_op_call(expr):
        return _op_pattern(expr)
    if isinstance(expr, Tuple):
        fields_ok = all(isinstance(_type_of(f), TensorType) for f in expr.fields)
        return TUPLE if fields_ok and expr.fields else OPAQUE
    if isinstance(expr, TupleGetItem):
        ty = _type_of(expr.tuple_value)
        ok = isinstance(ty, TupleType) and all(isinstance(f, TensorType) for f in ty.fields)
        return INJECTIVE if ok else OPAQUE
    return OPAQUE


def _edge_pattern(consumer: _Node, arg: Expr) -> OpPattern:
    if consumer.pattern == OPAQUE:
        return OPAQUE
    if isinstance(consumer.expr, (Tuple, TupleGetItem)):
        return INJECTIVE
    if consumer.pattern == BROADCAST:
        arg_ty, out_ty = known_type(arg), known_type(consumer.expr)
        if isinstance(arg_ty, TensorType) and isinstance(out_ty, TensorType) and arg_ty.shape == out_ty.shape:
            return ELEMWISE
    return consumer.pattern


class _Region:
    """The dataflow graph of one function body (not entering nested functions)."""

    def __init__(self, body: Expr, owner: dict, nested: list):
        self.nodes: dict[Expr, _Node] = {}
        self.order: list[_Node] = []

        def children(expr):
            kids = expr_children(expr, enter_functions=False)
            result = []
            for kid in kids:
                if isinstance(kid, _LEAVES):
                    if isinstance(kid, Function) and not kid.is_primitive and kid not in nested:
                        nested.append(kid)
                    continue
                other = owner.get(kid)
                if other is not None and other is not self:
                    other.nodes[kid].extern = True  # a value of an enclosing region
                    continue
                result.append(kid)
            return result

        if isinstance(body, _LEAVES):
            if isinstance(body, Function) and not body.is_primitive:
                nested.append(body)
            return
        if owner.get(body) is not None:
            owner[body].nodes[body].extern = True
            return
        for expr in post_order_iter(body, children):
            node = _Node(expr, _node_pattern(expr))
            self.nodes[expr] = node
            self.order.append(node)
            owner[expr] = self
            for kid in children(expr):
                kid_node = self.nodes[kid]
                kid_node.outputs.append((node, _edge_pattern(node, kid)))
        self.nodes[body].to_exit = True


# --- partitioning ------------------------------------------------------------------------------
def _lca(a: _Node | None, b: _Node | None, pattern: OpPattern):
    while a is not b:
        if a is None or b is None:
            return None, pattern
        if a.depth < b.depth:
            pattern, b = max(pattern, b.dom_pattern), b.parent
        elif a.depth > b.depth:
            pattern, a = max(pattern, a.dom_pattern), a.parent
        else:
            pattern = max(pattern, a.dom_pattern, b.dom_pattern)
            a, b = a.parent, b.parent
    return a, pattern


def _post_dominators(region: _Region) -> None:
    for node in reversed(region.order):  # consumers before producers
        if node.extern or node.to_exit or not node.outputs:
            node.parent, node.depth, node.dom_pattern = None, 1, OPAQUE
            continue
        first, pattern = node.outputs[0]
        parent = first
        for consumer, edge in node.outputs[1:]:
            parent, pattern = _lca(parent, consumer, max(pattern, edge))
            if parent is None:
                break
        node.parent = parent
        node.depth = parent.depth + 1 if parent is not None else 1
        node.dom_pattern = pattern if parent is not None else OPAQUE


class _Partitioner:
    def __init__(self, region: _Region, max_depth: int):
        self.region, self.max_depth = region, max_depth
        for node in region.order:
            node.group = _Group(node)

    def _paths(self, src: _Node, sink: _Node) -> list[_Node]:
        """Nodes on the paths from ``src`` (excluded) to ``sink`` (included)."""
        seen, stack, result = set(), [c for c, _ in src.outputs], []
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            result.append(node)
            if node is not sink:
                stack.extend(c for c, _ in node.outputs)
        return result

    def _check_path(self, src: _Node, sink: _Node, fcond) -> bool:
        for node in self._paths(src, sink):
            if node is not sink and (node.extern or node.to_exit):
                return False
            if not fcond(node.group.root().pattern, node is sink):
                return False
        return True

    def _merge(self, child: _Group, parent: _Group) -> None:
        child, parent = child.root(), parent.root()
        if child is parent:
            return
        parent.num_nodes += child.num_nodes
        child.parent = parent
        if child.anchor_expr is not None:
            parent.anchor_expr = child.anchor_expr
            parent.pattern = max(parent.pattern, child.pattern)

    def _commit(self, src: _Node, sink: _Node) -> None:
        target = sink.group.root()
        self._merge(src.group, target)
        for node in self._paths(src, sink):
            self._merge(node.group, target)

    def _only_views(self, group: _Group) -> bool:
        """Whether ``group`` is made of transposes and reshape-only ops (strided views of its input)."""
        views = reshape_only_ops() | {"transpose"}
        return all(_is_op_call(n.expr) and n.expr.op.name in views
                   for n in self.region.order if n.group.root() is group)

    def _fused_size(self, src: _Node, sink: _Node) -> int:
        target = sink.group.root()
        roots = {src.group.root()} | {n.group.root() for n in self._paths(src, sink)}
        roots.discard(target)
        return target.num_nodes + sum(r.num_nodes for r in roots)

    def run(self) -> None:
        if self.max_depth <= 1:
            return
        for phase in (0, 1, 2):
            for node in self.region.order:
                self._try_fuse(node, phase)

    def _try_fuse(self, node: _Node, phase: int) -> None:
        group = node.group.root()
        dom = node.parent
        if group.pattern == OPAQUE or dom is None:
            return
        dom_group = dom.group.root()
        if dom_group is group:
            return
        if self._fused_size(node, dom) > self.max_depth:
            return
        if phase == 2:
            # Fuse injective ops into tuples that already fused into an injective consumer.
            if group.pattern > INJECTIVE or dom_group.pattern == TUPLE:
                return
            if dom.pattern == TUPLE and dom_group.pattern <= INJECTIVE:
                if self._check_path(node, dom, lambda kind, is_sink: kind <= INJECTIVE):
                    self._commit(node, dom)
            return
        if group.pattern in _ANCHORS:
            # An elementwise epilogue after dense/conv2d/matmul or a reduction.
            if phase == 0 and node.dom_pattern == ELEMWISE:
                if self._check_path(node, dom, lambda kind, is_sink: kind <= BROADCAST):
                    self._commit(node, dom)
            elif phase == 0 and dom_group.num_nodes == 1 and _pools_convolution_tiles(group.anchor_expr, dom.expr):
                if self._check_path(node, dom, lambda kind, is_sink: is_sink or kind <= BROADCAST):
                    self._commit(node, dom)
            elif phase == 1 and node.expr is group.anchor_expr and dom_group.num_nodes == 1 \
                    and all(c is dom for c, _ in node.outputs) and _product_writes_in_place(node.expr, dom.expr):
                self._commit(node, dom)
        elif group.pattern <= BROADCAST:
            if phase == 0 and (node.dom_pattern <= INJECTIVE or node.dom_pattern == COMM_REDUCE):
                def fcond(kind, is_sink):
                    return kind <= OUT_ELEMWISE_FUSABLE if is_sink else kind <= INJECTIVE

                if self._check_path(node, dom, fcond):
                    self._commit(node, dom)
        elif group.pattern in (INJECTIVE, TUPLE):
            if phase == 1 and all(c is dom for c, _ in node.outputs) and _product_reads_in_place(node.expr, dom.expr) \
                    and self._only_views(group):
                self._commit(node, dom)
            elif phase == 1 and (node.dom_pattern <= INJECTIVE or node.dom_pattern == COMM_REDUCE):
                def fcond(kind, is_sink):
                    return kind <= INJECTIVE or (is_sink and kind == COMM_REDUCE)

                if self._check_path(node, dom, fcond):
                    self._commit(node, dom)


# --- rewriting ---------------------------------------------------------------------------------
def _is_scalar_constant(expr: Expr) -> bool:
    return isinstance(expr, Constant) and expr.data.ndim == 0


class _Rewriter(TypedMutator):
    def __init__(self, members: dict, reshape_ops: frozenset):
        super().__init__()
        self.members = members  # group output expr -> set of member exprs (primitive groups only)
        self.reshape_ops = reshape_ops

    def visit(self, expr: Expr):
        if expr not in self.memo and expr in self.members:
            # A group's inputs are often the previous group's output: a chain of groups recurses group
            # by group, so count each as nested visits (a 30,000-op chain continues on fresh stacks).
            members = self.members[expr]
            self.memo[expr] = call_nested(self._primitive_call, expr, members, weight=len(members))
        elif expr not in self.memo and _is_stop_fusion(expr):  # grouping is done: the boundary goes
            self.memo[expr] = self.visit(expr.args[0])
        return super().visit(expr)

    def visit_function(self, fn: Function):
        return fn if fn.is_primitive else super().visit_function(fn)

    def _primitive_call(self, root: Expr, members: set) -> Call:
        params: list[Var] = []
        args: list[Expr] = []
        param_of: dict[Expr, Var] = {}
        built: dict[Expr, Expr] = {}

        def operand(expr: Expr) -> Expr:
            if expr in members:
                return build(expr)
            if _is_scalar_constant(expr):
                return expr
            var = param_of.get(expr)
            if var is None:
                ty = _type_of(expr)
                var = Var(f"p{len(params)}", ty).with_type(ty)
                param_of[expr] = var
                params.append(var)
                args.append(self.visit(expr))
            return var

        def build(expr: Expr) -> Expr:
            if expr in built:
                return built[expr]
            if isinstance(expr, Call):
                new = Call(expr.op, tuple(operand(a) for a in expr.args), expr.attrs, expr.type_args,
                           span=expr.span)
            elif isinstance(expr, Tuple):
                new = Tuple(tuple(operand(f) for f in expr.fields), span=expr.span)
            else:
                new = TupleGetItem(operand(expr.tuple_value), expr.index, span=expr.span)
            built[expr] = copy_type(new, expr)
            return built[expr]

        body = build(root)
        attrs = {"Primitive": 1}
        if self._reshape_only(members, params):
            attrs["reshape_only"] = 1
        ret_type = _type_of(root)
        fn = Function(tuple(params), body, ret_type, (), Attrs(attrs))
        fn.with_type(_func_type(params, ret_type))
        return Call(fn, tuple(args), span=getattr(root, "span", None)).with_type(ret_type)

    def _reshape_only(self, members: set, params: list) -> bool:
        if not all(_is_op_call(m) and m.op.name in self.reshape_ops for m in members):
            return False
        # The data flows through argument 0 of each op, from a single parameter.
        sources = {m.args[0] for m in members if m.args and m.args[0] not in members}
        return len(sources) == 1 and isinstance(_type_of(next(iter(sources))), TensorType)


def _func_type(params, ret_type):
    return FuncType(tuple(_type_of(p) for p in params), ret_type)


def fuse_function(fn: Function, max_depth: int = DEFAULT_MAX_DEPTH) -> Function:
    """Fuse the ops of one (non-primitive) function, nested functions included."""
    if fn.is_primitive:
        return fn
    owner: dict[Expr, _Region] = {}
    regions: list[_Region] = []
    pending = [fn.body]
    while pending:
        nested: list[Function] = []
        regions.append(_Region(pending.pop(), owner, nested))
        pending.extend(f.body for f in nested if f.body not in owner)
    members: dict[Expr, set] = {}
    for region in regions:
        _post_dominators(region)
        _Partitioner(region, max_depth).run()
        groups: dict[_Group, set] = {}
        for node in region.order:
            groups.setdefault(node.group.root(), set()).add(node.expr)
        for group, exprs in groups.items():
            if any(_is_op_call(e) and not _is_stop_fusion(e) for e in exprs):  # (a stop_fusion is alone)
                members[group.node.expr] = exprs
    body = _Rewriter(members, reshape_only_ops()).visit(fn.body)
    return rebuild_function(fn, body) if body is not fn.body else fn


class FuseOps(Pass):
    """Fuse operators into primitive functions; ``fuse_opt_level=0`` makes one primitive per op."""

    name = "FuseOps"

    def __init__(self, fuse_opt_level: int = 1, max_depth: int = DEFAULT_MAX_DEPTH):
        self.max_depth = max_depth if fuse_opt_level > 0 else 1

    def transform_module(self, mod: IRModule) -> IRModule:
        return mod.with_functions({gv: fuse_function(fn, self.max_depth) for gv, fn in mod.functions.items()})

