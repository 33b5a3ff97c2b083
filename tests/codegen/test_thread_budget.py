"""The thread budget (``tv.set_num_threads``): it reaches the kernels (a C library reports the count its
OpenMP loops use) and the host BLAS, its default is the cores the process may use, and idle OpenMP
threads sleep unless the user chose a wait policy."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.codegen import blas, build
from tensorvm.codegen.build import have_compiler

needs_cc = pytest.mark.skipif(not have_compiler(), reason="no C compiler")
needs_openmp = pytest.mark.skipif(not have_compiler() or not build.find_toolchain().openmp,
                                  reason="kernels are single-threaded without OpenMP")

SOURCE = """
def @main(%x: Tensor[(?, 8), float32]) { nn.relu(add(%x, 1f)) }
"""


@pytest.fixture
def restore_threads():
    previous = build._NUM_THREADS[0]
    yield
    build.set_num_threads(previous)


def _c_executable():
    return tv.vm.compile(tv.parse(SOURCE), target="c")


@needs_openmp
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_setting_reaches_the_kernels_of_libraries_loaded_before_and_after(restore_threads, threads):
    before = _c_executable()
    before.stats()  # builds and loads the library
    tv.set_num_threads(threads)
    assert tv.get_num_threads() == threads
    assert before.stats()["kernel_library"]["threads"] == threads
    # a library loaded after the setting (another source) gets it on load
    after = tv.vm.compile(tv.parse(SOURCE.replace("1f", f"{threads + 10}f")), target="c")
    assert after.stats()["kernel_library"]["threads"] == threads
    x = np.linspace(-2, 2, 24, dtype="float32").reshape(3, 8)
    np.testing.assert_array_equal(tv.vm.VirtualMachine(before).invoke("main", x).numpy(), np.maximum(x + 1, 0))


TEAM_SIZE = r"""
int32_t tv_team_size(void) {  /* how many threads a parallel region of a kernel gets now */
  int32_t team = 1;
#ifdef _OPENMP
  #pragma omp parallel num_threads(tv_threads())
  {
    #pragma omp single
    team = omp_get_num_threads();
  }
#endif
  return team;
}
"""


@needs_openmp
@pytest.mark.parametrize("threads", [1, 3])
def test_kernels_called_from_any_python_thread_get_the_budget(restore_threads, threads):
    """omp_set_num_threads sets the calling thread's count only: the budget is the library's own."""
    from tensorvm.codegen.c_emit import prelude

    library = build.build_library(prelude(products=False) + TEAM_SIZE)
    team_size = library._cdll.tv_team_size
    team_size.restype, team_size.argtypes = ctypes.c_int32, []
    tv.set_num_threads(threads)
    seen = []
    worker = threading.Thread(target=lambda: seen.extend([team_size(), build.library_threads(library)]))
    worker.start()
    worker.join()
    assert seen == [threads, threads] and team_size() == threads


@needs_cc
def test_the_setting_reaches_the_host_blas(restore_threads):
    _c_executable().stats()  # a kernel library is loaded: BLAS joins the budget
    host = blas.host_blas()
    if host is None or host.get_threads is None:
        pytest.skip("no OpenBLAS with a thread setter is loaded in this process")
    for threads in (1, 2):
        tv.set_num_threads(threads)
        assert host.get_threads() == threads


def test_default_is_the_cores_this_process_may_use(restore_threads, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    tv.set_num_threads(None)
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert tv.get_num_threads() == build.available_cores() == expected
    monkeypatch.setenv("OMP_NUM_THREADS", "3,1")  # OpenMP's own variable, first level
    assert tv.get_num_threads() == 3


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_counts_are_rejected(restore_threads, bad):
    with pytest.raises(ValueError, match="positive integer"):
        tv.set_num_threads(bad)


@pytest.mark.parametrize("preset, expected", [({}, "None 20000"), ({"OMP_WAIT_POLICY": "active"}, "active None"),
                                              ({"OMP_WAIT_POLICY": "passive"}, "passive None"),
                                              ({"GOMP_SPINCOUNT": "1000"}, "None 1000")])
def test_idle_openmp_threads_spin_briefly_then_sleep_unless_the_user_chose(preset, expected):
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "TENSORVM_NUM_THREADS")} | preset
    code = ("import os, tensorvm.codegen.build; "
            "print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == expected


def test_environment_variable_sets_the_initial_budget():
    env = dict(os.environ, TENSORVM_NUM_THREADS="3")
    code = "import tensorvm as tv; print(tv.get_num_threads())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "3"


@needs_openmp
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is a Linux call")
def test_a_process_pinned_to_one_core_runs_its_kernels_on_one_thread():
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "TENSORVM_NUM_THREADS")}
    code = ("import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
            "import tensorvm as tv\n"
            f"exe = tv.vm.compile(tv.parse({SOURCE!r}), target='c')\n"
            "print(tv.get_num_threads(), exe.stats()['kernel_library']['threads'])")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "1"]


@needs_openmp
@pytest.mark.parametrize("threads", [1, 3])
def test_aot_models_follow_the_budget_loaded_before_and_after(restore_threads, threads):
    """An AOT model's kernels read the budget through ``tvmgen_<name>_set_num_threads``, which the loader
    ties to ``tv.set_num_threads`` (before, each model's loops used OpenMP's default whatever was set)."""
    from tensorvm import aot

    source = "def @main(%x: Tensor[(64, 64), float32]) { nn.relu(add(%x, NUMf)) }"
    before = aot.build(tv.parse(source.replace("NUM", "1")), name="budget_before").load()
    tv.set_num_threads(threads)
    after = aot.build(tv.parse(source.replace("NUM", str(threads + 1))), name="budget_after").load()
    assert before.num_threads == after.num_threads == threads
    tv.set_num_threads(2)
    assert before.num_threads == after.num_threads == 2
    x = np.linspace(-3, 3, 64 * 64, dtype="float32").reshape(64, 64)
    np.testing.assert_array_equal(np.asarray(before(x)), np.maximum(x + 1, 0))
