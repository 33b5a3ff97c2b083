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
