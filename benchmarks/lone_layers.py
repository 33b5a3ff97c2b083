"""What the lone-layer benchmarks (``conv_layers.py``, ``depthwise_layers.py``) share: their command line,
the ONNX model of one convolution layer (for ONNX Runtime), and the hand-written C kernels of this
checkout and of another one side by side in one process (``--against``): the text of the C library
(``tensorvm/codegen/lib``) with a benchmark's own callers appended, built once from each checkout's
files."""

from __future__ import annotations

from pathlib import Path

import numpy as np

# hard-swish as the convolution kernels' clamped affine activation: (alpha, beta, lo, hi), v min(max(v/6 + 1/2, 0), 1)
HARD_SWISH = np.array([1 / 6, 0.5, 0.0, 1.0], np.float32)

LIBRARY_FILES = ["tv_kernel.h", "tv_gemm.h"]


def library_text(calls: str, checkout: str | None = None) -> str:
    """The C library of ``checkout`` (this one when None), instantiated for this host, then ``calls``.
    ``c_emit`` keeps each file's text once read, so that cache is emptied before and after reading
    another checkout's (else both texts are this checkout's)."""
    from tensorvm.codegen import c_emit

    defines = c_emit._rule_defines() + c_emit._product_defines()
    if checkout is None:
        return defines + c_emit.library_text(LIBRARY_FILES) + calls
    own = c_emit.LIBRARY_DIR
    c_emit.LIBRARY_DIR = Path(checkout) / "tensorvm" / "codegen" / "lib"
    c_emit._library_file.cache_clear()
    try:
        return defines + c_emit.library_text(LIBRARY_FILES) + calls
    finally:
        c_emit.LIBRARY_DIR = own
        c_emit._library_file.cache_clear()


def libraries(calls: str, against: str | None) -> dict:
    """{"here": this checkout's library (a ctypes CDLL), "there": ``against``'s when given}."""
    from tensorvm.codegen.build import build_library

    built = {"here": build_library(library_text(calls))._cdll}
    if against:
        built["there"] = build_library(library_text(calls, against))._cdll
    return built


def layer_arguments(description: str, rounds: int, kernels: str):
    """The command line of a lone-layer benchmark: --batch, --threads, --rounds, --against (another
    checkout whose ``kernels`` to time beside this one's)."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--against", help=f"another tensorvm checkout whose {kernels} to time beside this one's")
    return parser.parse_args()


def ort_options(threads: int):
    """ONNX Runtime's session options for a lone layer: ``threads`` intra-op threads that do not spin
    (see conv_variants.py)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def interleaved_times(calls: dict, rounds: int, before=None) -> dict:
    """{name: the us of each of ``rounds`` calls of ``calls[name]()``}, the calls interleaved, each round
    in another order (a call right after one that read the same input finds it in cache, which had
    favoured whichever came second). ``before()``, when given, runs ahead of each call, untimed."""
    import time

    times: dict = {name: [] for name in calls}
    names = list(calls)
    for round_ in range(rounds):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            if before is not None:
                before()
            start = time.perf_counter()
            calls[name]()
            times[name].append((time.perf_counter() - start) * 1e6)
    return times


def interleaved_minimum(calls: dict, rounds: int) -> dict:
    """{name: the least us of ``rounds`` interleaved calls of ``calls[name]()``} (``interleaved_times``)."""
    return {name: min(v) for name, v in interleaved_times(calls, rounds).items()}


def onnx_conv_layer(c: int, side: int, o: int, k: int, stride: int, groups: int, activation: str, batch: int, rng):
    """A k x k convolution (padding k // 2, ``groups``) then ``activation`` (an ONNX op: Relu, HardSwish) as an
    ONNX model, with its weight and bias (random, the weight scaled by 1 / sqrt(its fan-in))."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    weight = (rng.standard_normal((o, c // groups, k, k)) / np.sqrt(k * k * c // groups)).astype(np.float32)
    bias = rng.standard_normal(o).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "W", "B"], ["y"], pads=[k // 2] * 4, strides=[stride] * 2, group=groups),
         helper.make_node(activation, ["y"], ["z"])], "layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, c, side, side])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(bias, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model, weight, bias


def onnx_matmul(w):
    """``y = x w^T`` (``w``: out x in, ``x``: any rows) as an ONNX model of one MatMul, input "x"."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "wt"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, w.shape[1]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, w.shape[0]])],
        [numpy_helper.from_array(np.ascontiguousarray(w.T), "wt")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def checked_call(entry, arrays: tuple, out, want):
    """A callable running the C ``entry`` over ``arrays`` (NumPy arrays passed as pointers, ``out`` among
    them), after one call whose ``out`` must equal ``want``."""
    import numpy as np

    pointers = [a.ctypes.data for a in arrays]
    assert entry(*pointers) == 0
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    # (the arrays ride along: the pointers alone would outlive them)
    return lambda keep=arrays: entry(*pointers)


def ratio_line(label: str, width: int, best: dict, against: bool) -> str:
    """A layer's row: this checkout's time, ONNX Runtime's, their ratio (and this checkout's over the other's)."""
    line = (f"  {label:{width}s} {best['tensorvm here']:9.1f} {best['onnxruntime']:11.1f} "
            f"{best['tensorvm here'] / best['onnxruntime']:6.2f}")
    return line + (f"  {best['tensorvm here'] / best['tensorvm there']:.3f}" if against else "")


def prepare(description: str, rounds: int, calls: str, entries: dict):
    """What a lone-layer benchmark of hand-written kernels sets up: its command line (``layer_arguments``),
    tensorvm's thread count, the libraries of ``calls`` (``libraries``; ``entries``: {C function: number of
    pointer arguments}) and ONNX Runtime's session options. Returns (args, libraries, options)."""
    import ctypes

    import tensorvm as tv

    args = layer_arguments(description, rounds, "kernels")
    tv.set_num_threads(args.threads)
    built = libraries(calls, args.against)
    for lib in built.values():
        for entry, count in entries.items():
            getattr(lib, entry).argtypes = [ctypes.c_void_p] * count
    return args, built, ort_options(args.threads)


def table_header(title: str, width: int, args) -> None:
    """The title line of a lone-layer table (batch, threads, rounds) and its column heads."""
    print(f"{title}, batch {args.batch}, {args.threads} thread(s), {args.rounds} interleaved rounds; us per call, min")
    print(f"  {'layer':{width}s} {'tensorvm':>9s} {'onnxruntime':>11s} {'ratio':>6s}" + ("  here / there" if args.against else ""))


def peer_call(model, options, x) -> tuple:
    """ONNX Runtime's session of a lone-layer ``model`` (input "x"): its output for ``x`` and {"onnxruntime": a
    call of it}, the dict a benchmark adds tensorvm's calls to."""
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0], {"onnxruntime": lambda: session.run(None, {"x": x})}
