"""The host's BLAS: now ``tensorvm.runtime.blas`` (a loaded kernel library needs it without the compiler).

This name stays an alias of that very module (same state, so monkeypatching either affects both)."""

import sys

from ..runtime import blas as _blas

sys.modules[__name__] = _blas
