"""Relay operators that are other operators in another form: declared here by what they become.

``nn.conv1d`` is ``nn.conv2d`` over a height of 1 (its fast kernels included), ``nn.conv3d`` the N-d
convolution of the ONNX importer, ``nn.max_pool1d`` a 2-d pool of height 1, ``fast_exp`` is ``exp``,
``scatter_add`` is ``scatter_elements`` with an add, ``invert_permutation`` an ``argsort``, and so on.
Each is declared once, by its attributes and ``expand(attrs, args) -> Expr`` (the expression it stands
for, over the argument expressions, whose types it may not read: it runs before type inference):

* the ``Legalize`` pass (early in every compiled path) replaces a call by its expansion, so the VM, the
  graph executor and AOT compile only the ops it is made of;
* its type relation is the expansion's type over variables of the argument types;
* its reference kernel (the interpreter's) runs the expansion on the interpreter.

A constant argument an expansion reshapes (a convolution's weight) is reshaped here, so that the weight
packing after legalization sees a constant.
"""

from __future__ import annotations

import numpy as np

from ..errors import AttrError, TypeInferenceError
from ..ir.expr import Constant, Function, Var
from ..ir.types import TensorType
from ._common import register_checked
from .nn import _positive_int
from .nn_relay import _one, _padding2, _with_h
from .registry import AttrDef, OpDef, OpPattern, make_call
from .transform import int_ntuple, int_tuple, one_of, optional_layout, padding_of, to_float, to_out_dtype

__all__ = ["RELAY_FORMS"]

RELAY_FORMS: dict = {}  # op name -> its expand function


def _expand_dims(x, axis: int):
    if isinstance(x, Constant):
        return Constant(np.expand_dims(np.asarray(x.data), axis))
    return make_call("expand_dims", x, axis=axis)


def _relation(expand, check=None):
    def rel(types, attrs, consts=None):
        from ..transform.infer_type import infer_expr

        if check is not None:
            check(types, attrs)
        params = [Var(f"a{i}", t) for i, t in enumerate(types)]
        return infer_expr(Function(tuple(params), expand(attrs, params))).ret_type

    return rel


def _kernel(expand):
    def kernel(attrs, *arrays):
        from ..executor import DebugExecutor
        from ..ir.module import IRModule

        arrays = [np.asarray(a) for a in arrays]
        params = [Var(f"a{i}", TensorType(a.shape, a.dtype.name)) for i, a in enumerate(arrays)]
        run = DebugExecutor(IRModule()).evaluate(Function(tuple(params), expand(attrs, params)))
        result = run(*arrays)
        return tuple(r.numpy() for r in result) if isinstance(result, tuple) else result.numpy()

    return kernel


def relay_form(name: str, num_inputs: int, attrs, expand, doc: str, pattern=OpPattern.OPAQUE, check=None) -> OpDef:
    """Register ``name`` as the expression ``expand(attrs, args)``; ``check(types, attrs)`` refuses what the
    expression alone would accept (attributes contradicting the arguments' types)."""
    RELAY_FORMS[name] = expand
    return register_checked(OpDef(
        name=name, num_inputs=num_inputs, type_rel=_relation(expand, check), kernel=_kernel(expand), pattern=pattern,
        attrs=attrs, legalize=expand, doc=doc))


def _transpose(x, axes):
    if isinstance(x, Constant):
        return Constant(np.ascontiguousarray(np.transpose(np.asarray(x.data), axes)))
    return make_call("transpose", x, axes=list(axes))


def _cast_inputs(attrs, args):
    """The arguments in ``attrs.out_dtype`` when one is given (nn.conv2d and the N-d ops compute in their inputs'
    one dtype)."""
    if not attrs.out_dtype:
        return args
    return [make_call("cast", a, dtype=attrs.out_dtype) for a in args]


# ---- convolutions and pools of one dimension: the 2-d ops over a height of 1 ---------------------------

def _conv1d(attrs, args):
    x, w = args
    data_layout, kernel_layout = attrs.data_layout, attrs.kernel_layout
    out_layout = attrs.out_layout or data_layout
    if out_layout != data_layout:
        raise AttrError(f"nn.conv1d: out_layout {out_layout!r} must be the data layout {data_layout!r}")
    x, w = _cast_inputs(attrs, (x, w))  # (uint8 data with an int8 weight into int32, as Relay: nn.conv2d wants one)
    y = make_call("nn.conv2d", _expand_dims(x, data_layout.index("W")), _expand_dims(w, kernel_layout.index("W")),
              strides=(1, *attrs.strides), padding=(0, attrs.padding[0], 0, attrs.padding[1]),
              dilation=(1, *attrs.dilation), groups=attrs.groups, channels=attrs.channels,
              kernel_size=None if attrs.kernel_size is None else (1, *attrs.kernel_size),
              data_layout=_with_h(data_layout), kernel_layout=_with_h(kernel_layout))
    return make_call("squeeze", y, axis=[data_layout.index("W")])


relay_form(
    "nn.conv1d", 2, (
        AttrDef("strides", (1,), _one(1)), AttrDef("padding", (0, 0), _padding2, "(left, right); 1 value pads both"),
        AttrDef("dilation", (1,), _one(1)), AttrDef("groups", 1, _positive_int),
        AttrDef("channels", None, _positive_int), AttrDef("kernel_size", None, _one(1)),
        AttrDef("data_layout", "NCW", one_of("NCW", "NWC")), AttrDef("kernel_layout", "OIW", one_of("OIW", "WIO")),
        AttrDef("out_layout", "", optional_layout("NCW")), AttrDef("out_dtype", "", to_out_dtype),
    ), _conv1d, "1-d convolution: nn.conv2d over a height of 1 (layouts NCW/NWC, kernels OIW/WIO).",
    OpPattern.OUT_ELEMWISE_FUSABLE)


def _pool1d(op2d: str, avg: bool):
    def expand(attrs, args):
        layout = attrs.layout
        if attrs.out_layout and attrs.out_layout != layout:
            raise AttrError(f"{op2d.replace('2d', '1d')}: out_layout {attrs.out_layout!r} must be the layout {layout!r}")
        extra = {"count_include_pad": attrs.count_include_pad} if avg else {}
        y = make_call(op2d, _expand_dims(args[0], layout.index("W")), pool_size=(1, *attrs.pool_size),
                  strides=(1, *attrs.strides), dilation=(1, *attrs.dilation),
                  padding=(0, attrs.padding[0], 0, attrs.padding[1]), layout=_with_h(layout),
                  ceil_mode=attrs.ceil_mode, **extra)
        return make_call("squeeze", y, axis=[layout.index("W")])

    return expand


_POOL1D_ATTRS = (
    AttrDef("pool_size", (1,), _one(1)), AttrDef("strides", (1,), _one(1)), AttrDef("dilation", (1,), _one(1)),
    AttrDef("padding", (0, 0), _padding2, "(left, right); 1 value pads both"),
    AttrDef("layout", "NCW", one_of("NCW", "NWC")), AttrDef("out_layout", "", optional_layout("NCW")),
    AttrDef("ceil_mode", False, lambda v: bool(v)),
)
relay_form("nn.max_pool1d", 1, _POOL1D_ATTRS, _pool1d("nn.max_pool2d", False),
           "1-d max pooling: nn.max_pool2d over a height of 1.", OpPattern.OUT_ELEMWISE_FUSABLE)
relay_form("nn.avg_pool1d", 1, _POOL1D_ATTRS + (AttrDef("count_include_pad", False, lambda v: bool(v)),),
           _pool1d("nn.avg_pool2d", True), "1-d average pooling: nn.avg_pool2d over a height of 1.",
           OpPattern.OUT_ELEMWISE_FUSABLE)


def _adaptive1d(op2d: str):
    def expand(attrs, args):
        layout = attrs.layout
        size = None if attrs.output_size is None else (1, *attrs.output_size)
        y = make_call(op2d, _expand_dims(args[0], layout.index("W")), output_size=size, layout=_with_h(layout))
        return make_call("squeeze", y, axis=[layout.index("W")])

    return expand


_ADAPTIVE1D_ATTRS = (AttrDef("output_size", None, _one(1)), AttrDef("layout", "NCW", one_of("NCW", "NWC")),
                     AttrDef("out_layout", "", optional_layout("NCW")))
relay_form("nn.adaptive_avg_pool1d", 1, _ADAPTIVE1D_ATTRS, _adaptive1d("nn.adaptive_avg_pool2d"),
           "1-d adaptive average pooling: nn.adaptive_avg_pool2d over a height of 1.")
relay_form("nn.adaptive_max_pool1d", 1, _ADAPTIVE1D_ATTRS, _adaptive1d("nn.adaptive_max_pool2d"),
           "1-d adaptive max pooling: nn.adaptive_max_pool2d over a height of 1.")


# ---- convolutions and pools of three dimensions: the N-d ops (NCDHW) ------------------------------------

_padding6 = padding_of(3, "front, top, left, back, bottom, right")


_TO_NCDHW, _FROM_NCDHW, _DHWIO_TO_OIDHW = (0, 4, 1, 2, 3), (0, 2, 3, 4, 1), (4, 3, 0, 1, 2)


def _conv3d(attrs, args):
    x, w = _cast_inputs(attrs, args)
    channels_last = attrs.data_layout == "NDHWC"
    if channels_last:
        x = _transpose(x, _TO_NCDHW)
    if attrs.kernel_layout == "DHWIO":
        w = _transpose(w, _DHWIO_TO_OIDHW)
    y = make_call("nn.conv_nd", x, w, strides=attrs.strides, pads=attrs.padding, dilations=attrs.dilation,
              group=attrs.groups)
    return _transpose(y, _FROM_NCDHW) if (attrs.out_layout or attrs.data_layout) == "NDHWC" else y


def _check_conv3d(types, attrs):
    """channels and kernel_size, when given, are the weight's (Relay's Conv3DRel asserts them)."""
    w = types[1]
    if not isinstance(w, TensorType) or len(w.shape) != 5:
        return
    layout = attrs.kernel_layout
    out_axis = layout.index("O")
    sizes = tuple(w.shape[layout.index(a)] for a in "DHW")
    if attrs.channels is not None and isinstance(w.shape[out_axis], int) and w.shape[out_axis] != attrs.channels:
        raise TypeInferenceError(f"nn.conv3d: channels={attrs.channels} but the weight has {w.shape[out_axis]} "
                                 f"output channels")
    if attrs.kernel_size is not None and all(isinstance(d, int) for d in sizes) and tuple(attrs.kernel_size) != sizes:
        raise TypeInferenceError(f"nn.conv3d: kernel_size={tuple(attrs.kernel_size)} but the weight's is {sizes}")


def _conv3d_transpose(attrs, args):
    x, w = _cast_inputs(attrs, args)
    return make_call("nn.conv_transpose_nd", x, w, strides=attrs.strides, pads=attrs.padding, dilations=attrs.dilation,
                 group=attrs.groups, output_padding=attrs.output_padding)


_CONV3D_ATTRS = (
    AttrDef("strides", (1, 1, 1), int_ntuple(3, 1)), AttrDef("padding", (0,) * 6, _padding6,
                                                      "(front, top, left, back, bottom, right); 1 or 3 values too"),
    AttrDef("dilation", (1, 1, 1), int_ntuple(3, 1)), AttrDef("groups", 1, _positive_int),
    AttrDef("channels", None, _positive_int), AttrDef("kernel_size", None, int_ntuple(3, 1)),
    AttrDef("out_dtype", "", to_out_dtype),
)
relay_form("nn.conv3d", 2, _CONV3D_ATTRS + (
    AttrDef("data_layout", "NCDHW", one_of("NCDHW", "NDHWC")), AttrDef("out_layout", "", one_of("", "NCDHW", "NDHWC")),
    AttrDef("kernel_layout", "OIDHW", one_of("OIDHW", "DHWIO"))), _conv3d,
           "3-d convolution (NCDHW or NDHWC; OIDHW or DHWIO): the N-d convolution nn.conv_nd.", check=_check_conv3d)
relay_form("nn.conv3d_transpose", 2,
           _CONV3D_ATTRS + (AttrDef("data_layout", "NCDHW", one_of("NCDHW")), AttrDef("out_layout", "", one_of("", "NCDHW")),
                            AttrDef("kernel_layout", "IODHW", one_of("IODHW")),
                            AttrDef("output_padding", (0, 0, 0), int_ntuple(3, 0))),
           _conv3d_transpose, "3-d transposed convolution (NCDHW, IODHW): nn.conv_transpose_nd.")


def _pool3d(mode: str):
    def expand(attrs, args):
        extra = {"count_include_pad": attrs.count_include_pad} if mode == "avg" else {}
        return make_call("nn.pool_nd", args[0], kernel_shape=attrs.pool_size, mode=mode, strides=attrs.strides,
                     pads=attrs.padding, dilations=attrs.dilation, ceil_mode=attrs.ceil_mode, **extra)

    return expand


_POOL3D_ATTRS = (
    AttrDef("pool_size", (1, 1, 1), int_ntuple(3, 1)), AttrDef("strides", (1, 1, 1), int_ntuple(3, 1)),
    AttrDef("dilation", (1, 1, 1), int_ntuple(3, 1)), AttrDef("padding", (0,) * 6, _padding6),
    AttrDef("layout", "NCDHW", one_of("NCDHW")), AttrDef("out_layout", "", one_of("", "NCDHW")),
    AttrDef("ceil_mode", False, lambda v: bool(v)),
)
relay_form("nn.max_pool3d", 1, _POOL3D_ATTRS, _pool3d("max"), "3-d max pooling (NCDHW): nn.pool_nd.")
relay_form("nn.avg_pool3d", 1, _POOL3D_ATTRS + (AttrDef("count_include_pad", False, lambda v: bool(v)),),
           _pool3d("avg"), "3-d average pooling (NCDHW): nn.pool_nd.")


# ---- other names of existing ops ----------------------------------------------------------------------

for _fast, _op in (("fast_exp", "exp"), ("fast_tanh", "tanh"), ("fast_erf", "erf")):
    relay_form(_fast, 1, (), lambda attrs, args, op=_op: make_call(op, args[0]),
               f"{_op} (Relay's fast approximation is computed exactly here).", OpPattern.ELEMWISE)

relay_form("nn.fast_softmax", 1, (AttrDef("axis", -1, int),),
           lambda attrs, args: make_call("nn.softmax", args[0], axis=attrs.axis),
           "nn.softmax (Relay's fast approximation is computed exactly here).", OpPattern.OPAQUE)

relay_form("scatter", 3, (AttrDef("axis", 0, int),),
           lambda attrs, args: make_call("scatter_elements", *args, axis=attrs.axis),
           "scatter_elements: updates written at the indices along axis (Relay's older name).")
relay_form("scatter_add", 3, (AttrDef("axis", 0, int),),
           lambda attrs, args: make_call("scatter_elements", *args, axis=attrs.axis, reduction="add"),
           "scatter_elements with reduction add (Relay's older name).")


def _l2_normalize(attrs, args):
    x = args[0]
    squares = make_call("sum", make_call("multiply", x, x), axis=attrs.axis, keepdims=True)
    floor = Constant(np.array(attrs.eps, dtype=np.float64))
    return make_call("divide", x, make_call("sqrt", make_call("maximum", squares, make_call("cast_like", floor, x))))


relay_form("nn.l2_normalize", 1, (AttrDef("eps", 1e-12, to_float), AttrDef("axis", (), int_tuple())),
           _l2_normalize, "x / sqrt(max(sum(x * x, axis, keepdims), eps)).")


def _batch_mean_of_negated(products, predictions):
    """-sum(products) / predictions.shape[0], in the predictions' dtype."""
    batch = make_call("cast_like", make_call("take", make_call("shape_of", predictions), Constant(np.array(0, np.int64)), axis=0),
                  predictions)
    return make_call("divide", make_call("negative", make_call("sum", products)), batch)


relay_form("nn.cross_entropy", 2, (),
           lambda attrs, args: _batch_mean_of_negated(make_call("multiply", make_call("log", args[0]), args[1]), args[0]),
           "-sum(log(predictions) * targets) / batch (the first dim of predictions).")
relay_form("nn.cross_entropy_with_logits", 2, (),
           lambda attrs, args: _batch_mean_of_negated(make_call("multiply", args[0], args[1]), args[0]),
           "-sum(predictions * targets) / batch (predictions already log-probabilities).")
relay_form("invert_permutation", 1, (),
           lambda attrs, args: make_call("cast_like", make_call("argsort", args[0], dtype="int64"), args[0]),
           "out[data[i]] = i for a permutation data (its argsort, in data's dtype).")


def _layout_transform(attrs, args):
    src, dst = attrs.src_layout, attrs.dst_layout
    if not (src.isalpha() and src.isupper() and sorted(src) == sorted(dst)):
        raise TypeInferenceError(f"layout_transform: only a permutation of one layout's axes is supported "
                                 f"(e.g. NCHW to NHWC), got {src!r} to {dst!r}")
    return make_call("transpose", args[0], axes=[src.index(axis) for axis in dst])


relay_form("layout_transform", 1, (AttrDef("src_layout", "NCHW", str), AttrDef("dst_layout", "NCHW", str)),
           _layout_transform, "A transpose from src_layout to dst_layout (a permutation, e.g. NCHW to NHWC).",
           OpPattern.INJECTIVE)
