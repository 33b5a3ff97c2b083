"""Math intrinsics of tensor expressions, with NumPy's semantics (see ``tensorvm.te.expr.INTRINSICS``).

Integer arguments are accepted where NumPy accepts them: rounding functions return integers unchanged;
``abs``/``sign`` work on every numeric dtype; the transcendental functions need floats.
"""

from __future__ import annotations

from .expr import PrimExpr, as_expr, call, dtype_kind

__all__ = [
    "exp", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "floor",
    "ceil", "round", "trunc", "abs", "sign", "isnan", "isinf", "isfinite",
]


def exp(x) -> PrimExpr:
    return call("exp", x)


def log(x) -> PrimExpr:
    return call("log", x)


def log2(x) -> PrimExpr:
    return call("log2", x)


def log10(x) -> PrimExpr:
    return call("log10", x)


def log1p(x) -> PrimExpr:
    """log(1 + x), exact near 0."""
    return call("log1p", x)


def sqrt(x) -> PrimExpr:
    return call("sqrt", x)


def rsqrt(x) -> PrimExpr:
    """1 / sqrt(x)."""
    return call("rsqrt", x)


def tanh(x) -> PrimExpr:
    return call("tanh", x)


def sigmoid(x) -> PrimExpr:
    """1 / (1 + exp(-x)), computed without overflow."""
    return call("sigmoid", x)


def erf(x) -> PrimExpr:
    return call("erf", x)


def sin(x) -> PrimExpr:
    return call("sin", x)


def cos(x) -> PrimExpr:
    return call("cos", x)


def tan(x) -> PrimExpr:
    return call("tan", x)


def asin(x) -> PrimExpr:
    return call("asin", x)


def acos(x) -> PrimExpr:
    return call("acos", x)


def atan(x) -> PrimExpr:
    return call("atan", x)


def sinh(x) -> PrimExpr:
    return call("sinh", x)


def cosh(x) -> PrimExpr:
    return call("cosh", x)


def asinh(x) -> PrimExpr:
    return call("asinh", x)


def acosh(x) -> PrimExpr:
    return call("acosh", x)


def atanh(x) -> PrimExpr:
    return call("atanh", x)


def _rounding(name: str, x) -> PrimExpr:
    x = as_expr(x)
    return x if dtype_kind(x.dtype) in "iub" else call(name, x)


def floor(x) -> PrimExpr:
    return _rounding("floor", x)


def ceil(x) -> PrimExpr:
    return _rounding("ceil", x)


def round(x) -> PrimExpr:  # noqa: A001 - mirrors NumPy's name
    """Round half to even (like NumPy and IEEE rint)."""
    return _rounding("round", x)


def trunc(x) -> PrimExpr:
    return _rounding("trunc", x)


def abs(x) -> PrimExpr:  # noqa: A001
    x = as_expr(x)
    return x if dtype_kind(x.dtype) in "ub" else call("abs", x)


def sign(x) -> PrimExpr:
    """-1, 0 or 1 (NaN stays NaN)."""
    return call("sign", x)


def isnan(x) -> PrimExpr:
    return call("isnan", x)


def isinf(x) -> PrimExpr:
    return call("isinf", x)


def isfinite(x) -> PrimExpr:
    return call("isfinite", x)
