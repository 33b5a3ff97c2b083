"""One thread pool per process (``codegen/pool.py``, ``lib/tv_pool.c``): every library tensorvm loads runs
its parallel loops on it, results stay right at 1..3 threads and across thread-count changes, a kernel
called from a pool worker runs (serially) instead of deadlocking, a library nobody attaches keeps its own
pool; and the rules derived from the pool's measured timings (``host.kernel_rules``), with fake hosts.
Oracle: NumPy (float64) and hand-computed rule values."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import threading

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.codegen import build, pool
from tensorvm.codegen import host as hostmod
from tensorvm.codegen.build import have_compiler
from tensorvm.codegen.host import FORK_JOIN_CYCLES, TEAM_SPIN_NS, HostDescription, kernel_rules
from tensorvm.runtime import library

needs_pool = pytest.mark.skipif(not have_compiler() or not build.find_toolchain().openmp,
                                reason="the pool is built with the kernels' threads (OpenMP toolchains)")


_MATMUL = """
def @main(%a: Tensor[(?, {k}), float32], %b: Tensor[({n}, {k}), float32]) {{ nn.matmul(%a, %b, transpose_b=True) }}
"""
_SOFTMAX_ADD = """
def @main(%a: Tensor[(?, {n}), float32], %b: Tensor[(?, {n}), float32]) {{ nn.softmax(add(%a, %b), axis=-1) }}
"""


def _executables():
    """Two executables with different kernels (so two libraries) whose loops split over threads."""
    first = tv.vm.compile(tv.parse(_MATMUL.format(k=200, n=520)), target="c")
    second = tv.vm.compile(tv.parse(_SOFTMAX_ADD.format(n=1031)), target="c")
    return first, second


def _run_both(first, second, rows: int, seed: int):
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((rows, 200)).astype(np.float32), rng.standard_normal((520, 200)).astype(np.float32)
    got = tv.vm.VirtualMachine(first).run(a, b).numpy()
    np.testing.assert_allclose(got, a.astype(np.float64) @ b.T.astype(np.float64), rtol=1e-4, atol=1e-3)
    x, y = rng.standard_normal((rows, 1031)).astype(np.float32), rng.standard_normal((rows, 1031)).astype(np.float32)
    s = (x.astype(np.float64) + y) - (x.astype(np.float64) + y).max(axis=-1, keepdims=True)
    want = np.exp(s) / np.exp(s).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(tv.vm.VirtualMachine(second).run(x, y).numpy(), want, rtol=1e-4, atol=1e-6)


@needs_pool
def test_two_executables_share_the_process_pool(threads):
    """Both executables' libraries report the same pool, the process's (the pool library's), and the jobs
    of either are counted on it: one set of workers, whichever model runs."""
    first, second = _executables()
    assert first.c_library.library_path != second.c_library.library_path
    threads(2)
    _run_both(first, second, 97, 0)
    one, two = (exe.stats()["kernel_library"]["product_pool"] for exe in (first, second))
    table = ctypes.cast(pool.pool_table(), ctypes.POINTER(pool._Table)).contents
    assert one["pool"] == two["pool"] == table.state
    before = two["jobs"]
    _run_both(first, second, 64, 1)
    after = first.stats()["kernel_library"]["product_pool"]
    assert after["jobs"] > before and after == second.stats()["kernel_library"]["product_pool"]
    assert after["workers"] >= 1


@needs_pool
def test_results_at_one_to_three_threads_and_changing_between_calls(threads):
    """Against NumPy at 1, 2, 3 threads, the count changed between calls and back (the pool starts the
    workers a larger count needs; a smaller one leaves the extra workers idle)."""
    first, second = _executables()
    for seed, count in enumerate([1, 2, 3, 1, 3, 2, 1]):
        threads(count)
        _run_both(first, second, 33 + 16 * seed, seed)


@needs_pool
def test_a_kernel_called_from_a_pool_worker_runs_serially(threads):
    """A chunk of a job on the process pool calls a product of another library (itself parallel, on the
    same pool): the nested call finds the pool busy and runs on the calling thread, on every worker, with
    the right result; nothing waits for itself (the job finishes within the timeout)."""
    threads(2)
    params = hostmod.gemm_params()
    library = hostmod.vgemm_library(params)  # (loaded through load_cdll: attached to the process pool)
    product = library.function("tv_vgemm_call", 3, 0)
    product.argtypes = [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 3
    m, n, k = 64, 32 * params.nr, 256  # above the product's parallel threshold: a job of its own when alone
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    packed = hostmod.pack_panels(w, params.nr)
    out = np.full((4, m, n), np.nan, np.float32)
    codes = [None] * 4
    chunk_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)

    def chunk(_ctx, i):
        codes[i] = product(m, n, k, x[i].ctypes.data, packed.ctypes.data, out[i].ctypes.data)

    callback = chunk_type(chunk)
    table = ctypes.cast(pool.pool_table(), ctypes.POINTER(pool._Table)).contents
    run = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int, chunk_type, ctypes.c_void_p)(table.run)
    job = threading.Thread(target=run, args=(4, 2, callback, None), daemon=True)
    job.start()
    job.join(timeout=120)
    assert not job.is_alive(), "the job on the process pool did not finish (a nested call waited for itself?)"
    assert codes == [0] * 4
    np.testing.assert_allclose(out, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-4, atol=1e-3)


@needs_pool
def test_a_library_detached_runs_its_own_pool(threads):
    """``tv_team_attach(NULL)`` (what a library nobody attaches has: the standalone AOT library) runs the
    library's own pool, with the same results; attaching it again joins the process pool."""
    threads(2)
    params = hostmod.gemm_params()
    cdll = hostmod.vgemm_library(params)._cdll
    product = cdll.tv_vgemm_call
    product.argtypes, product.restype = [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 3, ctypes.c_int32
    pool_id = cdll.tv_team_pool_id
    pool_id.restype, pool_id.argtypes = ctypes.c_int64, []
    attach = cdll.tv_team_attach
    attach.restype, attach.argtypes = ctypes.c_int32, [ctypes.c_void_p]
    shared = pool_id()
    table = pool.pool_table()
    assert shared == ctypes.cast(table, ctypes.POINTER(pool._Table)).contents.state
    m, n, k = 70, 24 * params.nr + 3, 300
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32)
    packed = hostmod.pack_panels(w, params.nr)
    try:
        attach(None)
        assert pool_id() != shared
        for table_now in (None, table):
            attach(table_now)
            out = np.full((m, n), np.nan, np.float32)
            assert product(m, n, k, x.ctypes.data, packed.ctypes.data, out.ctypes.data) == 0
            np.testing.assert_allclose(out, x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-4, atol=1e-3)
    finally:
        attach(table)
    assert pool_id() == shared


class _Entry:
    """A C entry point as a fake library exposes it: called with its arguments, recorded."""

    def __init__(self, result, calls):
        self.result, self.calls = result, calls

    def __call__(self, *args):
        self.calls.append(args)
        return self.result


@needs_pool
@pytest.mark.parametrize("abi", [1, library.TEAM_ABI + 1, None])
def test_a_library_of_another_pool_layout_is_not_attached(abi):
    """A library built with another layout of the pool's state (``tv_team_abi`` other than the pool
    library's, or none: built before the layout had a number) is not handed the process's pool, which it
    would misread; one of the pool's layout is, and the pool library itself reports that layout."""
    pool.pool_table()
    own = pool.process_pool().tv_team_abi
    own.restype, own.argtypes = ctypes.c_int32, []
    assert own() == library.TEAM_ABI
    for layout, attached in ((abi, False), (library.TEAM_ABI, True)):
        calls: list = []
        fake = type("FakeLibrary", (), {"tv_team_attach": _Entry(0, calls)})()
        if layout is not None:
            fake.tv_team_abi = _Entry(layout, [])
        library._attach_pool(fake)
        assert bool(calls) == attached, (layout, calls)


class _FakePool:
    """Stands for the pool library in the timing tests: ``tv_pool_fork_join_ns`` answers ``spin_ns`` for a
    split over spinning workers and ``wake_ns`` for sleeping ones, and counts the measurements."""

    def __init__(self, spin_ns, wake_ns):
        self.spin_ns, self.wake_ns, self.calls = spin_ns, wake_ns, 0

    def tv_pool_fork_join_ns(self, threads, rounds, sleep):
        self.calls += 1
        return self.wake_ns if sleep else self.spin_ns


def test_pool_timings_are_measured_once_and_read_from_the_cache(tmp_path, monkeypatch):
    """A host key without a cached file is measured and written; a file with other values is what a later
    process reads (the memo cleared); a malformed file is measured again."""
    monkeypatch.setenv("TENSORVM_CACHE_DIR", str(tmp_path))
    fake = _FakePool(1500, 30000)
    monkeypatch.setattr(pool, "process_pool", lambda: fake)
    key = "fake cpu for test_pool|avx2|avx2|1/2/3"
    try:
        assert pool.pool_timings(key) == pool.PoolTimings(1500.0, 30000.0) and fake.calls == 6
        (path,) = tmp_path.glob("pool-*.json")
        assert json.loads(path.read_text())["fork_join_ns"] == 1500.0
        assert pool.pool_timings(key) == pool.PoolTimings(1500.0, 30000.0) and fake.calls == 6  # (the memo)
        path.write_text(json.dumps({"fork_join_ns": 1234.0, "wake_ns": 56789.0}))
        pool._TIMINGS.pop(key)
        assert pool.pool_timings(key) == pool.PoolTimings(1234.0, 56789.0) and fake.calls == 6
        path.write_text(json.dumps({"fork_join_ns": "fast", "wake_ns": 1.0}))
        pool._TIMINGS.pop(key)
        assert pool.pool_timings(key) == pool.PoolTimings(1500.0, 30000.0) and fake.calls == 12
    finally:
        pool._TIMINGS.pop(key, None)


@pytest.mark.parametrize("spin_ns, wake_ns", [(1_000_000, 30000), (1500, 2_000_000)])
def test_a_measurement_disturbed_by_other_work_is_neither_used_nor_cached(tmp_path, monkeypatch, spin_ns, wake_ns):
    """Rounds that all waited for another process's time slice (~1 ms) give None (the rules' defaults) and
    no file, and a file holding such numbers (an older version cached them) is measured again."""
    monkeypatch.setenv("TENSORVM_CACHE_DIR", str(tmp_path))
    fake = _FakePool(spin_ns, wake_ns)
    monkeypatch.setattr(pool, "process_pool", lambda: fake)
    key = "fake busy cpu for test_pool|avx512|avx512f|1/2/3"
    try:
        assert pool.pool_timings(key) is None and list(tmp_path.glob("pool-*.json")) == []
        pool._TIMINGS.pop(key)
        fake.spin_ns, fake.wake_ns = 1500, 30000
        path = pool.timings_path(key)
        assert path.parent == tmp_path
        path.write_text(json.dumps({"fork_join_ns": float(spin_ns), "wake_ns": float(wake_ns)}))
        assert pool.pool_timings(key) == pool.PoolTimings(1500.0, 30000.0)
        assert json.loads(path.read_text())["fork_join_ns"] == 1500.0
    finally:
        pool._TIMINGS.pop(key, None)


@needs_pool
def test_measuring_the_real_pool_gives_positive_times_or_none_when_disturbed(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORVM_CACHE_DIR", str(tmp_path))
    key = "fake cpu for a real measurement|avx2|avx2|1/2/3"
    try:
        measured = pool.pool_timings(key)
        assert measured is None or 0 < measured.fork_join_ns <= pool._MAX_FORK_JOIN_NS
        assert (measured is None) == (list(tmp_path.glob("pool-*.json")) == [])
    finally:
        pool._TIMINGS.pop(key, None)


@needs_pool
def test_the_pool_spins_as_the_host_rule_says():
    pool.pool_table()
    spin = pool.process_pool().tv_pool_spin_ns
    spin.restype, spin.argtypes = ctypes.c_int64, []
    assert spin() == kernel_rules(hostmod.host()).team_spin_ns > 0


@needs_pool
def test_the_detected_host_carries_the_pool_timings():
    detected = hostmod.detect_host()
    timings = pool.pool_timings(detected.key)
    described = hostmod._with_pool_timings(detected)
    want = (0.0, 0.0) if timings is None else (timings.fork_join_ns, timings.wake_ns)  # (None: a busy machine)
    assert (described.fork_join_ns, described.wake_ns) == want


_AVX2 = HostDescription(isa="avx2", vector_bytes=32, vector_registers=16, fma=True)


@pytest.mark.parametrize("fork_join_ns, ghz, cycles", [
    (0.0, 3.0, FORK_JOIN_CYCLES),  # unmeasured: the constant
    (1000.0, 0.0, FORK_JOIN_CYCLES),  # no clock: the constant
    (1000.0, 4.0, 4096),  # 4000 cycles -> the nearest power of two
    (2500.0, 2.0, 4096),  # 5000 -> 4096 (log2 12.29 rounds down)
    (3500.0, 2.0, 8192),  # 7000 -> 8192 (12.77 rounds up)
    (330.0, 2.6, 1024),  # 858 cycles (a Zen 5's two vCPUs) -> 1024
    (100.0, 3.0, FORK_JOIN_CYCLES // 16),  # 300 cycles: at least a sixteenth of the constant
    (1e6, 3.0, FORK_JOIN_CYCLES * 16),  # a loaded machine's millisecond: at most sixteen times it
])
def test_team_chunk_elements_follow_the_measured_fork_join(fork_join_ns, ghz, cycles):
    """A fake AVX2 host (8 lanes: 4 elements per cycle): a chunk holds at least a sixteenth of what a
    fork-join costs in elements; AVX-512 (16 lanes) twice that."""
    desc = dataclasses.replace(_AVX2, fork_join_ns=fork_join_ns, clock_ghz=ghz)
    assert hostmod.fork_join_cycles(desc) == cycles
    assert kernel_rules(desc).team_chunk_elements == cycles * 4 // 16
    wide = dataclasses.replace(hostmod.isa_host("avx512", desc), fork_join_ns=fork_join_ns, clock_ghz=ghz)
    assert kernel_rules(wide).team_chunk_elements == cycles * 8 // 16
    # (a library's text holds the unmeasured host's rule, the same in every process; it derives this one at
    # run time from the split cost the running pool holds)
    assert f"-DTV_TEAM_CHUNK_ELEMENTS={FORK_JOIN_CYCLES * 4 // 16}" in hostmod.rule_defines(desc)


@pytest.mark.parametrize("wake_ns, spin", [
    (0.0, TEAM_SPIN_NS[0]), (45000.0, 45000), (10.0, TEAM_SPIN_NS[1]), (5e7, TEAM_SPIN_NS[2])])
def test_workers_spin_as_long_as_a_wake_costs(wake_ns, spin):
    assert kernel_rules(dataclasses.replace(_AVX2, wake_ns=wake_ns)).team_spin_ns == spin


def test_a_process_whose_first_library_is_built_for_a_set_host_gets_the_machine_s_split_cost():
    """The pool's split cost is the machine's measurement even when the process builds its first library
    under ``set_host`` (no detection had run: getting the cost then failed the build). A fresh process sets
    a portable host, compiles and runs a product on target c, and its pool holds the detected host's cost."""
    import subprocess
    import sys

    program = """
import numpy as np
import tensorvm as tv
from tensorvm.codegen import host, pool
host.set_host("portable")
mod = tv.parse('def @main(%x: Tensor[(4, 8), float32], %w: Tensor[(3, 8), float32]) { nn.dense(%x, %w) }')
x, w = np.ones((4, 8), np.float32), np.ones((3, 8), np.float32)
got = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c")).run(x, w).numpy()
assert (got == 8).all(), got
host.set_host(None)
print(host.machine_fork_join_cycles(), host.fork_join_cycles(host.host()) if host.host().fork_join_ns > 0 else 0)
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    machine, detected = done.stdout.split()
    assert machine == detected


_RULE_CALLER = """
int32_t tv_test_measured_rules(int64_t* out) {
  out[0] = tv_team_narrow_work((int64_t)TV_GEMM_PARALLEL_WORK_NARROW);
  out[1] = tv_team_chunk_elements(TV_TEAM_CHUNK_ELEMENTS);
  out[2] = tv_team_wide_work((int64_t)TV_GEMM_PARALLEL_WORK);
  return 0;
}
"""


@needs_pool
@pytest.mark.parametrize("isa", ["avx2", "avx512", "portable"])
def test_a_library_derives_the_measured_rules_as_kernel_rules_does(isa):
    """The three thresholds that follow the measured split cost are written twice: ``kernel_rules`` (Python,
    for strategy and reports) and ``tv_team_narrow_work`` / ``tv_team_chunk_elements`` /
    ``tv_team_wide_work`` (``tv_team.h``, each
    library applying them at run time to the cost the running pool holds). Built for each instance and
    called with the pool holding costs from the low to the high clamp, the library's values are
    ``kernel_rules``' for that instance measured at that cost; with no measurement, its built-in ones,
    which are the unmeasured instance's."""
    from tensorvm.codegen.c_emit import prelude

    hostmod.set_host(isa)
    try:
        desc = hostmod.host()
        library = build.build_library([(prelude() + _RULE_CALLER, ())])
    finally:
        hostmod.set_host(None)
    call = library._cdll.tv_test_measured_rules
    call.restype, call.argtypes = ctypes.c_int32, [ctypes.c_void_p]
    out = np.zeros(3, np.int64)
    try:
        for cycles in (FORK_JOIN_CYCLES // 16, FORK_JOIN_CYCLES // 8, FORK_JOIN_CYCLES // 2, FORK_JOIN_CYCLES,
                       FORK_JOIN_CYCLES * 16):
            pool.set_fork_join_cycles(cycles)
            assert call(out.ctypes.data) == 0
            # (a description measured at `cycles` ns on a 1 GHz clock: fork_join_cycles gives `cycles` back)
            measured = kernel_rules(dataclasses.replace(desc, fork_join_ns=float(cycles), clock_ghz=1.0))
            assert out.tolist() == [measured.parallel_work_narrow, measured.team_chunk_elements,
                                    measured.parallel_work], cycles
        pool.set_fork_join_cycles(0)
        assert call(out.ctypes.data) == 0
        built = kernel_rules(hostmod.unmeasured(desc))
        assert out.tolist() == [built.parallel_work_narrow, built.team_chunk_elements, built.parallel_work]
    finally:
        pool.share_fork_join()
