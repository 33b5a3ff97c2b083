"""The library products' parallel-for (``codegen/lib/tv_team.h``): the caller and the workers claim chunks
from the same words (each thread its home range first, then the others'), so every chunk runs exactly
once, on whichever thread got to it; nested and
concurrent calls run serially; a forked child starts its own workers. Oracle: NumPy (float64)."""

from __future__ import annotations

import ctypes
import os
import threading

import numpy as np
import pytest

from tensorvm.codegen import build
from tensorvm.codegen import host as hostmod
from tensorvm.codegen.build import have_compiler

pytestmark = pytest.mark.skipif(not have_compiler() or not build.find_toolchain().openmp,
                                reason="the pool is built with the kernels' threads (OpenMP toolchains)")


@pytest.fixture(scope="module")
def product():
    params = hostmod.gemm_params()
    library = hostmod.vgemm_library(params)
    fn = library.function("tv_vgemm_call", 3, 0)
    fn.argtypes = [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 3
    stats = library._cdll.tv_team_stats
    stats.argtypes, stats.restype = [ctypes.c_void_p], ctypes.c_int32
    return fn, params, stats


def _check(fn, params, m, n, k, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    out = np.full((m, n), np.nan, np.float32)
    assert fn(m, n, k, x.ctypes.data, hostmod.pack_panels(w, params.nr).ctypes.data, out.ctypes.data) == 0
    np.testing.assert_allclose(out, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-4, atol=1e-3,
                               err_msg=f"m={m} n={n} k={k}")


def _stats(stats) -> np.ndarray:
    out = np.zeros(4, np.int64)
    assert stats(out.ctypes.data) == 0
    return out


def test_every_chunk_runs_once_on_caller_or_worker(product, threads):
    """A product above the parallel threshold is one job of min(units, 4 x threads) chunks; the chunks
    the caller and the workers ran add up to exactly that, and the result is right."""
    fn, params, stats = product
    threads(2)
    m, n, k = 64, 32 * params.nr, 256  # 32 panels >= 2 per thread: split by panels
    before = _stats(stats)
    for seed in range(5):
        _check(fn, params, m, n, k, seed)
    after = _stats(stats)
    assert after[0] - before[0] == 5
    assert (after[1] - before[1]) + (after[2] - before[2]) == 5 * min(32, 4 * 2)
    assert after[3] >= 1


def test_more_threads_than_cores_and_rows_split(product, threads):
    """Oversubscribed (8 threads here: workers that are not scheduled leave their chunks to the caller),
    panels and row blocks, with remainders."""
    fn, params, stats = product
    threads(8)
    for m, n, k in [(97, 3 * params.nr + 5, 300), (400, params.nr, 700), (33, 40 * params.nr - 1, 129)]:
        _check(fn, params, m, n, k)


def test_jobs_of_other_team_sizes_one_after_another_run_every_chunk_once(product, threads):
    """Each job's chunks are cut into home ranges, one per thread of its team: jobs of 8, 2, 3 and 5
    threads alternate, so a job finds the words of ranges it does not use left by a larger job before it.
    Every chunk still runs exactly once (the counts add up) and every result is right."""
    fn, params, stats = product
    m, n, k = 64, 29 * params.nr + 3, 128  # 30 panels: split by panels, min(30, 4 x threads) chunks
    for round_ in range(3):
        for count in (8, 2, 3, 5):
            threads(count)
            before = _stats(stats)
            _check(fn, params, m, n, k, seed=round_ * 10 + count)
            after = _stats(stats)
            assert after[0] - before[0] == 1
            assert (after[1] - before[1]) + (after[2] - before[2]) == min(30, 4 * count)


def test_concurrent_callers_run_serially_and_correctly(product, threads):
    """Two Python threads (ctypes drops the GIL) call products at once: one holds the pool, the other
    runs its chunks itself."""
    fn, params, _ = product
    threads(2)
    errors = []

    def work(seed):
        try:
            for i in range(6):
                _check(fn, params, 48 + i, 20 * params.nr, 200, seed * 10 + i)
        except AssertionError as err:
            errors.append(err)

    workers = [threading.Thread(target=work, args=(s,)) for s in range(3)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not errors, errors[0]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX only")
def test_forked_child_starts_its_own_workers(product, threads):
    """The parent's workers do not exist in a forked child: the child starts its own (a pool that
    waited for the parent's would hang) and computes the same product."""
    fn, params, _ = product
    threads(2)
    _check(fn, params, 64, 32 * params.nr, 256)  # the parent's workers are running
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 when the product is right, 2 when no worker was started
        try:
            m, n, k = 64, 32 * params.nr, 256
            x, w = np.ones((m, k), np.float32), np.ones((n, k), np.float32)
            packed, out = hostmod.pack_panels(w, params.nr), np.zeros((m, n), np.float32)
            tasks = len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else None
            assert fn(m, n, k, x.ctypes.data, packed.ctypes.data, out.ctypes.data) == 0
            if tasks is not None and len(os.listdir("/proc/self/task")) != tasks + 1:
                os._exit(2)  # (the child believed the parent's worker was its own)
            np.testing.assert_array_equal(out, np.full((m, n), k, np.float32))
            _check(fn, params, 64, 32 * params.nr, 256, seed=3)
            os._exit(0)
        except BaseException:  # noqa: BLE001 - reported by the exit status
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child computed a wrong product or started no worker"


def test_exe_stats_report_the_pool(threads):
    """``exe.stats()["kernel_library"]["product_pool"]`` counts the jobs of a library's products and where
    their chunks ran (every chunk once: the chunks of a job split by panels add up)."""
    import tensorvm as tv

    threads(2)
    exe = tv.vm.compile(tv.parse("""
def @main(%a: Tensor[(?, 256), float32], %b: Tensor[(512, 256), float32]) { nn.matmul(%a, %b, transpose_b=True) }
"""), target="c")
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 256)).astype(np.float32), rng.standard_normal((512, 256)).astype(np.float32)
    before = exe.stats()["kernel_library"]["product_pool"]
    got = tv.vm.VirtualMachine(exe).run(a, b).numpy()
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.T.astype(np.float64), rtol=1e-4, atol=1e-3)
    after = exe.stats()["kernel_library"]["product_pool"]
    assert after["jobs"] > before["jobs"] and after["workers"] >= 1
    assert after["caller_chunks"] + after["worker_chunks"] > before["caller_chunks"] + before["worker_chunks"]


def test_jobs_publish_and_join_without_a_data_race_under_thread_sanitizer(tmp_path):
    """``c/team_race.c`` runs jobs on the pool compiled with ``-fsanitize=thread``: each chunk reads what the
    caller wrote before the job and writes what the caller reads after it, so a publication or a join
    without its release/acquire pairing is a race TSAN reports (it does when they are weakened to relaxed).
    Oracle: the chunks' outputs (2 x input + 1) and TSAN's verdict."""
    import subprocess

    from tensorvm.codegen.c_emit import LIBRARY_DIR

    source = os.path.join(os.path.dirname(__file__), "c", "team_race.c")
    binary = tmp_path / "team_race"
    compiler = build.find_toolchain().compiler
    built = subprocess.run([compiler, "-O1", "-g", "-std=gnu11", "-Wall", "-Werror", "-fsanitize=thread",
                            f"-I{LIBRARY_DIR}", source, "-o", str(binary), "-lpthread"], capture_output=True, text=True)
    if built.returncode != 0 and "tsan" in built.stderr.lower():
        pytest.skip(f"no ThreadSanitizer runtime for {compiler}: {built.stderr.strip()[-200:]}")
    assert built.returncode == 0, built.stderr
    ran = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TSAN_OPTIONS": "exitcode=66"})
    assert "ThreadSanitizer" not in ran.stderr, ran.stderr[-4000:]
    assert ran.returncode == 0, ran.stdout + ran.stderr[-2000:]
    jobs, worker_chunks = (int(word) for word in ran.stdout.split()[1::2])
    assert jobs == 4000 and worker_chunks > 0  # (the workers took part: the test saw threads meet)
