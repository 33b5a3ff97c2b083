"""A product of one column (``tv_gemm.h``: a 1x1 convolution of a 1 x 1 image, MobileNetV3's
squeeze-and-excitation layers, a GEMV per image) is as narrow as one of one row: it splits over the
threads from ``parallel_work_narrow`` (``tv_gemm_parallel_rows`` gets the narrower side), and its result
does not depend on the thread count. Oracles: the reference interpreter and NumPy (float64)."""

from __future__ import annotations

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.codegen import build
from tensorvm.codegen import host as hostmod
from tensorvm.codegen.build import have_compiler

pytestmark = pytest.mark.skipif(not have_compiler() or not build.find_toolchain().openmp,
                                reason="the split runs on the kernels' pool (OpenMP toolchains)")


def _layer(c: int, o: int, act: str) -> str:
    body = "nn.bias_add(nn.conv2d(%x, %w), %b)"
    body = {"relu": f"nn.relu({body})", "none": body}[act]
    return (f"def @main(%x: Tensor[(1, {c}, 1, 1), float32], %w: Tensor[({o}, {c}, 1, 1), float32], "
            f"%b: Tensor[({o}), float32]) {{ {body} }}")


def _sizes() -> tuple[int, int]:
    """In and out channels whose multiply-adds reach the narrow threshold but not the general one where
    the two differ (the rule before split such a layer only from ``parallel_work``)."""
    rules = hostmod.kernel_rules()
    o = 576
    c = -(-rules.parallel_work_narrow // o) + 3
    return c, o


@pytest.mark.parametrize("act", ["relu", "none"])
def test_one_column_product_splits_and_matches_at_one_to_three_threads(threads, act):
    c, o = _sizes()
    mod = tv.parse(_layer(c, o, act))
    rng = np.random.default_rng(c)
    x = rng.standard_normal((1, c, 1, 1)).astype(np.float32)
    w = (rng.standard_normal((o, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    want = np.einsum("oc,c->o", w[:, :, 0, 0].astype(np.float64), x[0, :, 0, 0].astype(np.float64)) + b
    if act == "relu":
        want = np.maximum(want, 0)
    reference = tv.create_executor("debug", mod).evaluate()(x, w, b).numpy()
    np.testing.assert_allclose(reference.reshape(-1), want, rtol=1e-5, atol=1e-5)
    exe = tv.vm.compile(mod, target="c")
    vm = tv.vm.VirtualMachine(exe)
    results = {}
    for count in (1, 2, 3):
        threads(count)
        before = exe.stats()["kernel_library"]["product_pool"]
        results[count] = vm.run(x, w, b).numpy()
        after = exe.stats()["kernel_library"]["product_pool"]
        np.testing.assert_allclose(results[count], reference, rtol=1e-5, atol=1e-5, err_msg=f"{count} threads")
        if count > 1 and before is not None:  # (split: a job on the pool, its chunks run once each)
            assert after["jobs"] > before["jobs"], f"{count} threads: the {o}x{c} product did not split"
    # each output is one row's dot product, the same whichever share of the rows computed it
    np.testing.assert_array_equal(results[2], results[1])
    np.testing.assert_array_equal(results[3], results[1])


def test_a_small_one_column_product_stays_serial(threads):
    """Below the narrow threshold the layer runs on the caller (no job)."""
    rules = hostmod.kernel_rules()
    c, o = 16, max(1, rules.parallel_work_narrow // 64)
    mod = tv.parse(_layer(c, o, "none"))
    rng = np.random.default_rng(1)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((1, c, 1, 1), (o, c, 1, 1), (o,)))
    exe = tv.vm.compile(mod, target="c")
    threads(2)
    vm = tv.vm.VirtualMachine(exe)
    before = exe.stats()["kernel_library"]["product_pool"]
    got = vm.run(x, w, b).numpy()
    after = exe.stats()["kernel_library"]["product_pool"]
    want = np.einsum("oc,c->o", w[:, :, 0, 0].astype(np.float64), x[0, :, 0, 0].astype(np.float64)) + b
    np.testing.assert_allclose(got.reshape(-1), want, rtol=1e-4, atol=1e-4)
    if before is not None:
        assert after["jobs"] == before["jobs"]


def test_the_narrow_threshold_follows_the_running_pool_s_measurement(threads):
    """The narrow threshold follows the split cost the running pool measured (``pool.share_fork_join``),
    which is in no library's text: the same executable splits the same product or not as that cost says,
    twice it in multiply-adds (``kernel_rules``' rule, applied by the library)."""
    from tensorvm.codegen import pool

    macs = hostmod.kernel_rules().narrow_macs_per_cycle
    c, o = 128 * macs, 64  # 8192 cycles of a narrow product's multiply-adds: above a cheap split's threshold, below a dear one's
    mod = tv.parse(_layer(c, o, "none"))
    rng = np.random.default_rng(2)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((1, c, 1, 1), (o, c, 1, 1), (o,)))
    exe = tv.vm.compile(mod, target="c")
    if exe.stats()["kernel_library"]["product_pool"] is None:
        pytest.skip("no process pool on this host")
    threads(2)
    vm = tv.vm.VirtualMachine(exe)
    want = vm.run(x, w, b).numpy()
    jobs = {}
    try:
        for cycles in (hostmod.FORK_JOIN_CYCLES, hostmod.FORK_JOIN_CYCLES // 8):  # thresholds 16384, 4096 x macs
            pool.set_fork_join_cycles(cycles)
            before = exe.stats()["kernel_library"]["product_pool"]["jobs"]
            np.testing.assert_array_equal(vm.run(x, w, b).numpy(), want)
            jobs[cycles] = exe.stats()["kernel_library"]["product_pool"]["jobs"] - before
    finally:
        pool.share_fork_join()
    assert jobs == {hostmod.FORK_JOIN_CYCLES: 0, hostmod.FORK_JOIN_CYCLES // 8: 1}
