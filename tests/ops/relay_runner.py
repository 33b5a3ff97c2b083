"""Run a Relay-text program on the interpreter, the VM with NumPy kernels (target python) and the VM
with C kernels (target c), checking that target c ran no NumPy fallback (importable from tests/ops)."""

from __future__ import annotations

import numpy as np

import tensorvm as tv

HEADER = '#[version = "0.0.5"]\n'


def run_everywhere(text: str, *args, fallbacks_allowed: bool = False) -> dict:
    """The results of ``@main(*args)`` per executor (``debug``, ``python``, ``c``) as NumPy values."""
    mod = tv.parse(HEADER + text)
    results = {"debug": tv.create_executor("debug", mod).evaluate()(*args)}
    for target in ("python", "c"):
        exe = tv.vm.compile(mod, target=target)
        if target == "c" and not fallbacks_allowed:
            assert exe.stats()["kernel_library"]["numpy_fallbacks"] == {}, exe.stats()
        results[target] = tv.vm.VirtualMachine(exe).invoke("main", *args)
    return {k: _numpy(v) for k, v in results.items()}


def _numpy(value):
    if isinstance(value, (tuple, list)) or type(value).__name__ == "ADT" or hasattr(value, "fields"):
        return tuple(_numpy(v) for v in value)
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def check_everywhere(text: str, args, expected, rtol=1e-5, atol=1e-6, **kwargs) -> None:
    """Every executor agrees with ``expected`` (a value or a tuple of values, computed independently)."""
    for kind, result in run_everywhere(text, *args, **kwargs).items():
        _compare(kind, result, expected, rtol, atol)


def _compare(kind, result, expected, rtol, atol):
    if isinstance(expected, tuple):
        assert isinstance(result, tuple) and len(result) == len(expected), (kind, result)
        for r, e in zip(result, expected, strict=True):
            _compare(kind, r, e, rtol, atol)
        return
    expected = np.asarray(expected)
    assert result.dtype == expected.dtype and result.shape == expected.shape, (kind, result.dtype, result.shape,
                                                                               expected.dtype, expected.shape)
    if expected.dtype.kind == "f":
        np.testing.assert_allclose(result, expected, rtol=rtol, atol=atol, err_msg=kind)
    else:
        np.testing.assert_array_equal(result, expected, err_msg=kind)
