"""ONNX's DFT and STFT (``frontend/onnx_signal.py``) against NumPy's FFT in double precision: forward,
inverse, one-sided (rfft), one-sided inverse (irfft), truncating and zero-padding dft_length, real and
complex input, and an STFT with a Hann window, as a model has them (constant lengths and axis), over a
dynamic batch on bytecode and native; ONNX's node tests also cover run-time lengths and axes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx import numpy_helper as nh
from onnx_cases import onnx_model, tensorvm_runs

VI = helper.make_tensor_value_info
F = TensorProto.FLOAT


def _run(node, inits, x, out_dims):
    model = onnx_model([node], [VI("x", F, ["b", *x.shape[1:]])], [VI("y", F, out_dims)], inits, opset=20,
                       ir_version=9)
    return [run(x)[0] for _, run in tensorvm_runs(model)]


def _complex(y):
    return y[..., 0] + 1j * y[..., 1]


@pytest.mark.parametrize("n", [None, 6, 12])
@pytest.mark.parametrize("inverse, onesided", [(0, 0), (1, 0), (0, 1)])
def test_dft_along_an_axis_matches_numpy(n, inverse, onesided):
    rng = np.random.default_rng(0)
    complex_input = not onesided  # (a one-sided transform takes a real signal)
    x = rng.standard_normal((3, 8, 5, 2 if complex_input else 1)).astype(np.float32)
    inits = [nh.from_array(np.array(1, np.int64), "axis")]
    names = ["x", "", "axis"]
    if n is not None:
        inits.append(nh.from_array(np.array(n, np.int64), "n"))
        names[1] = "n"
    node = helper.make_node("DFT", names, ["y"], inverse=inverse, onesided=onesided)
    signal = x[..., 0] + (1j * x[..., 1] if complex_input else 0)
    length = n or 8
    want = (np.fft.ifft if inverse else np.fft.fft)(signal.astype(np.complex128), n=length, axis=1)
    if onesided:
        want = want[:, : length // 2 + 1]
    for got in _run(node, inits, x, ["b", "k", 5, 2]):
        np.testing.assert_allclose(_complex(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [8, 9])
def test_one_sided_inverse_is_numpys_irfft(n):
    rng = np.random.default_rng(1)
    spectrum = np.fft.rfft(rng.standard_normal((2, n)), axis=1)
    x = np.stack([spectrum.real, spectrum.imag], axis=-1).astype(np.float32)  # (2, n // 2 + 1, 2)
    node = helper.make_node("DFT", ["x", "n", "axis"], ["y"], inverse=1, onesided=1)
    inits = [nh.from_array(np.array(n, np.int64), "n"), nh.from_array(np.array(1, np.int64), "axis")]
    want = np.fft.irfft(spectrum, n=n, axis=1)
    for got in _run(node, inits, x, ["b", n, 1]):
        np.testing.assert_allclose(got[..., 0], want, rtol=1e-5, atol=1e-5)


def test_stft_with_a_hann_window_matches_numpy_frames():
    rng = np.random.default_rng(2)
    size, step, length = 16, 6, 64
    window = np.hanning(size + 1)[:-1].astype(np.float32)  # (periodic Hann)
    x = rng.standard_normal((2, length, 1)).astype(np.float32)
    node = helper.make_node("STFT", ["x", "step", "window", "size"], ["y"], onesided=1)
    inits = [nh.from_array(np.array(step, np.int64), "step"), nh.from_array(window, "window"),
             nh.from_array(np.array(size, np.int64), "size")]
    frames = 1 + (length - size) // step
    framed = np.stack([x[:, f * step:f * step + size, 0] for f in range(frames)], axis=1) * window
    want = np.fft.rfft(framed.astype(np.float64), axis=2)
    for got in _run(node, inits, x, ["b", frames, size // 2 + 1, 2]):
        np.testing.assert_allclose(_complex(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mels, n, rate, low, high", [(80, 400, 16000, 0.0, 8000.0), (40, 512, 22050, 20.0, 8000.0),
                                                      (8, 64, 8000, 100.0, 3000.0)])
def test_mel_weight_matrix_matches_onnx_reference(mels, n, rate, low, high):
    from onnx.reference import ReferenceEvaluator

    I64 = TensorProto.INT64
    node = helper.make_node("MelWeightMatrix", ["mels", "n", "rate", "low", "high"], ["w"])
    inputs = [VI("mels", I64, []), VI("n", I64, []), VI("rate", I64, []), VI("low", F, []), VI("high", F, [])]
    model = onnx_model([node], inputs, [VI("w", F, ["bins", "mels_out"])], opset=17, ir_version=9)
    feeds = {"mels": np.array(mels, np.int64), "n": np.array(n, np.int64), "rate": np.array(rate, np.int64),
             "low": np.array(low, np.float32), "high": np.array(high, np.float32)}
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    for mode, run in tensorvm_runs(model):
        np.testing.assert_allclose(run(*feeds.values())[0], want, rtol=1e-6, atol=1e-7, err_msg=mode)
