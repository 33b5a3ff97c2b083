"""The kernel cache is checked, not trusted (issue 16): a library is loaded only when its bytes match the
SHA-256 recorded when it was built, the toolchain probe file cannot name another compiler or other flags,
and a cache directory that others can write is not used."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat

import numpy as np
import pytest

from tensorvm import te
from tensorvm.codegen import build
from tensorvm.codegen.lower import lower
from tensorvm.codegen.module import build_module

pytestmark = pytest.mark.skipif(not build.have_compiler(), reason="needs a C compiler")


def _scale_kernel(name: str, factor: float):
    n = te.var("n")
    x = te.placeholder((n,), "float32", "x")
    return lower(name, [x], [te.compute((n,), lambda i: x[i] * factor + 1.0, "y")])


def _run(module, name):
    out = np.empty(3, "float32")
    module[name](np.array([1, 2, 3], "float32"), out)
    return out


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setenv("TENSORVM_CACHE_DIR", str(cache))
    build.reset_toolchain()
    yield cache
    build.reset_toolchain()


def test_a_swapped_library_is_rebuilt_not_loaded(fresh_cache):
    """Another valid library put in place of a cached one used to be loaded (and computed its own thing)."""
    first = build_module([_scale_kernel("swap_me", 3.0)])
    path = first.build_info.path
    assert os.path.exists(path + ".sha256")
    other = build_module([_scale_kernel("swap_me", 5.0)])  # same kernel name, other factor
    build._LOADED.clear()  # a new process: nothing loaded yet
    shutil.copyfile(other.build_info.path, path + ".new")  # (never write over a mapped library in place)
    os.replace(path + ".new", path)
    again = build_module([_scale_kernel("swap_me", 3.0)])
    assert not again.build_info.cached
    np.testing.assert_array_equal(_run(again, "swap_me"), np.array([1, 2, 3], "float32") * 3 + 1)


@pytest.mark.parametrize("damage", ["truncate", "no_hash"])
def test_a_damaged_or_unrecorded_library_is_rebuilt(fresh_cache, damage):
    first = build_module([_scale_kernel(f"damaged_{damage}", 2.0)])
    build._LOADED.clear()
    path = first.build_info.path
    if damage == "truncate":
        with open(path, "rb") as f:
            head = f.read(100)
        with open(path + ".new", "wb") as f:
            f.write(head)
        os.replace(path + ".new", path)
    else:
        os.unlink(path + ".sha256")
    again = build_module([_scale_kernel(f"damaged_{damage}", 2.0)])
    assert not again.build_info.cached
    np.testing.assert_array_equal(_run(again, f"damaged_{damage}"), [3, 5, 7])


def test_the_toolchain_file_cannot_name_the_compiler_to_run(fresh_cache, tmp_path):
    """``toolchain-*.json`` named the compiler that every later build ran."""
    build_module([_scale_kernel("probe_first", 2.0)])
    marker = tmp_path / "ran"
    evil = tmp_path / "evil-cc"
    evil.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    evil.chmod(0o755)
    files = list(fresh_cache.glob("toolchain-*.json"))
    assert files
    for f in files:
        data = json.loads(f.read_text())
        data["compiler"] = str(evil)
        f.write_text(json.dumps(data))
    build.reset_toolchain()
    module = build_module([_scale_kernel("after_evil_probe", 4.0)])
    assert not marker.exists()
    assert build.find_toolchain().compiler != str(evil)
    np.testing.assert_array_equal(_run(module, "after_evil_probe"), [5, 9, 13])


@pytest.mark.parametrize("edit", [
    {"flags": [*build._BASE_FLAGS, "-fplugin=/tmp/evil.so"]},
    {"flags": ["-O0"]},
    {"openmp": "yes"},
    {"python_include": "/tmp/evil"},
    {"extra": 1},
])
def test_toolchain_files_are_validated_strictly(edit):
    toolchain = build.find_toolchain()
    data = json.loads(json.dumps(dataclasses.asdict(toolchain)))  # what the probe writes
    assert build._toolchain_from_json(dict(data), toolchain.compiler, toolchain.version) == toolchain
    data.update(edit)
    assert build._toolchain_from_json(data, toolchain.compiler, toolchain.version) is None


@pytest.mark.parametrize("why", ["world-writable", "group-writable", "other owner"])
def test_a_cache_directory_others_can_write_is_not_used(tmp_path, monkeypatch, why):
    shared = tmp_path / why.replace(" ", "_")
    shared.mkdir()
    if why == "other owner":
        uid = shared.stat().st_uid
        monkeypatch.setattr(os, "getuid", lambda: uid + 1)
    else:
        shared.chmod(0o777 if why == "world-writable" else 0o770)
    monkeypatch.setenv("TENSORVM_CACHE_DIR", str(shared))
    with pytest.warns(RuntimeWarning, match="not using the kernel cache"):
        private = build.cache_dir()
    assert private != shared and not stat.S_IMODE(private.stat().st_mode) & 0o077
    assert build.cache_dir() == private  # one private cache per process, one warning


def test_a_private_cache_directory_is_used_as_is(fresh_cache):
    assert build.cache_dir() == fresh_cache
