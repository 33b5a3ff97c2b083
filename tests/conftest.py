"""Suite-wide settings.

Tests that give no target run on target "python", as they did before "c" became the default
(``tensorvm.codegen.build.default_target``): most of them test the compiler and the VM, not kernels, and
on "c" the same tests took about 6x longer (tests/vm, tests/parity and the executors' tests, 2 workers:
492 s instead of 77 s). Tests that are about kernels ask for target "c" explicitly, the default choice
has its own tests (tests/vm/test_default_target.py), and ``TENSORVM_TARGET=c make test`` runs the whole
suite with "c" as the default.

``kernel_threads`` (also named ``threads``) is a function setting the C kernels' thread count for one
test, restored after it.
"""

import os

import pytest

os.environ.setdefault("TENSORVM_TARGET", "python")


def _kernel_threads():
    from tensorvm.codegen import build

    previous = build._NUM_THREADS[0]
    yield build.set_num_threads
    build.set_num_threads(previous)


kernel_threads = pytest.fixture(_kernel_threads, name="kernel_threads")
threads = pytest.fixture(_kernel_threads, name="threads")
