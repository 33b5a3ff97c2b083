"""What the AOT loader reads from disk — a shared library from the build cache — is checked: a
corrupt library or one whose descriptor does not match the model is a ``FormatError`` naming the
file, never a crash or a run on the wrong buffers (issue 16, defect 5)."""

import shutil

import numpy as np
import pytest

import tensorvm as tv
import tensorvm.aot as aot
from tensorvm.aot.loader import compile_library

SMALL = "def @main(%x: Tensor[(2, 3), float32]) { add(%x, 1f) }"
OTHER = "def @main(%x: Tensor[(4, 3), float32]) { add(%x, 1f) }"


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORVM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_corrupt_cached_library_is_rebuilt_not_loaded(private_cache):
    module = aot.build(tv.parse(SMALL), name="loader_corrupt")
    path, _ = compile_library(module)
    path.write_bytes(path.read_bytes()[:200])  # its bytes no longer hash to what the build recorded
    x = np.arange(6, dtype="float32").reshape(2, 3)
    np.testing.assert_array_equal(module.load()(x), x + 1)
    assert compile_library(module)[1]["cached"]  # the rebuild is recorded and found again


def _swap_in(other_path, path, with_hash: bool):
    shutil.copyfile(other_path, path)
    if with_hash:
        shutil.copyfile(str(other_path) + ".sha256", str(path) + ".sha256")


def test_a_cached_library_of_another_model_is_rebuilt(private_cache):
    module = aot.build(tv.parse(SMALL), name="loader_swap")
    other = aot.build(tv.parse(OTHER), name="loader_swap")
    path, _ = compile_library(module)
    _swap_in(compile_library(other)[0], path, with_hash=False)  # its hash record no longer matches
    x = np.arange(6, dtype="float32").reshape(2, 3)
    np.testing.assert_array_equal(module.load()(x), x + 1)


def test_a_cached_library_of_another_model_with_its_hash_is_a_format_error(private_cache):
    module = aot.build(tv.parse(SMALL), name="loader_swap_hash")
    other = aot.build(tv.parse(OTHER), name="loader_swap_hash")
    path, _ = compile_library(module)
    _swap_in(compile_library(other)[0], path, with_hash=True)  # the library's own descriptor gives it away
    with pytest.raises(tv.FormatError, match=r"input 0 \(x\): expected shape \[2, 3\].*got shape \[4, 3\]"):
        module.load()


def test_a_good_cached_library_still_runs(private_cache):
    module = aot.build(tv.parse(SMALL), name="loader_good")
    x = np.arange(6, dtype="float32").reshape(2, 3)
    np.testing.assert_array_equal(module.load()(x), x + 1)
    np.testing.assert_array_equal(aot.build(tv.parse(SMALL), name="loader_good").load()(x), x + 1)  # from the cache
