"""benchmarks/lone_layers.py: the other checkout's C library is read from its own files (``c_emit`` caches
each file's text once read; ``conv_layers.py --against`` had built this checkout's library twice)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import lone_layers  # noqa: E402

from tensorvm.codegen import c_emit  # noqa: E402


def test_the_other_checkouts_library_is_its_own_text(tmp_path):
    other = tmp_path / "other"
    shutil.copytree(c_emit.LIBRARY_DIR, other / "tensorvm" / "codegen" / "lib")
    header = other / "tensorvm" / "codegen" / "lib" / "tv_vconv.h"
    marker = "/* only in the other checkout */\n"
    header.write_text(header.read_text().replace("#ifndef TV_VCONV_H", marker + "#ifndef TV_VCONV_H", 1))
    here_before = lone_layers.library_text("/* calls */")  # (reads, and so caches, this checkout's files)
    there = lone_layers.library_text("/* calls */", str(other))
    here_after = lone_layers.library_text("/* calls */")
    assert marker in there and there.endswith("/* calls */")
    assert marker not in here_before and here_after == here_before


def test_interleaved_rounds_call_each_once_per_round_in_rotating_order():
    order = []
    calls = {name: (lambda name=name: order.append(name)) for name in "abc"}
    best = lone_layers.interleaved_minimum(calls, 3)
    assert order == list("abcbcacab")
    assert set(best) == set("abc") and all(us >= 0 for us in best.values())


def test_a_checked_call_refuses_an_output_unlike_the_peers():
    import numpy as np
    import pytest

    out, want = np.zeros(3, np.float32), np.arange(3, dtype=np.float32)
    writes = []

    def entry(*pointers):  # (a stand-in for the C entry: fills ``out`` with what it is told)
        out[:] = writes[-1]
        return 0

    writes.append(want + 1)
    with pytest.raises(AssertionError):
        lone_layers.checked_call(entry, (out,), out, want)
    writes.append(want)
    call = lone_layers.checked_call(entry, (out,), out, want)
    out[:] = 0
    assert call() == 0 and np.array_equal(out, want)
