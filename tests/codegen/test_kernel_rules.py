"""The kernels' thresholds as rules on the host description (``host.kernel_rules``): the values measured on
the AVX2 development machine come out of the rule for an AVX2 host, another host (a fake AVX-512 server
with 16 cores and other caches) gets other values by the same rule, and those values reach the generated
C (``#define`` lines of the prelude), the strategies and ``exe.stats()``. The softmax, written once over
the host's vector, is checked against NumPy at each width (the 64-byte instance lowered by gcc to pairs
of 256-bit or narrower operations here)."""

from __future__ import annotations

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.codegen import c_emit, host, strategy
from tensorvm.codegen.build import have_compiler
from tensorvm.codegen.lower import parallel_work_threshold

XEON = {"isa": "avx512", "l1d": 48 * 1024, "l2": 2 * 1024 * 1024, "l3": 60 * 1024 * 1024,
        "model": "Fake Xeon (16 cores)", "flags": ["avx512f", "avx2", "fma"]}


@pytest.fixture
def fake_host():
    def use(description):
        """The host of ``description`` (an ISA name or fields), without this machine's measured pool timings
        unless ``description`` gives them (they move thresholds: ``test_a_measured_fork_join_...``)."""
        fields = dict(description) if isinstance(description, dict) else {"isa": description}
        base = host.dataclasses.replace(host.isa_host(fields.pop("isa")), fork_join_ns=0.0, wake_ns=0.0)
        if "flags" in fields:
            fields["flags"] = tuple(fields["flags"])
        host.set_host(host.dataclasses.replace(base, **fields))
        return host.host()

    yield use
    host.set_host(None)


def test_avx2_rule_gives_the_values_measured_there(fake_host):
    rules = host.kernel_rules(fake_host("avx2"))
    assert rules.macs_per_cycle == 16
    assert (rules.parallel_work, rules.parallel_elements, rules.gemm_min_work) == (1 << 18, 1 << 16, 1 << 14)
    assert (rules.blas_min_flops, rules.blas_min_flops_dynamic, rules.blas_min_rows) == (1 << 20, 1 << 16, 8)
    assert (rules.blas_thread_factor, rules.vector_width, rules.reduction_width, rules.jam) == (16, 8, 16, 4)
    assert rules.sort_parallel_elements == 1 << 15


def test_a_measured_fork_join_lowers_the_narrow_product_threshold_down_to_twice_its_cost(fake_host):
    """A split pays once the half of the work it hands the other thread outlasts the split: with the pool's
    fork-join measured at 1,000 cycles (rounded to 1024) a product of fewer rows than a vector's lanes
    splits from 2048 cycles of work, at the narrow product's 16 multiply-adds a cycle; a slow measured pool
    never raises the threshold above the unmeasured FORK_JOIN_CYCLES; wider products split from WIDE_SPLITS
    fork-joins of work."""
    unmeasured = host.kernel_rules(fake_host("avx2"))
    assert unmeasured.parallel_work_narrow == unmeasured.parallel_work == 1 << 18
    fast = host.kernel_rules(fake_host({"isa": "avx2", "clock_ghz": 2.0, "fork_join_ns": 500.0}))
    assert fast.narrow_macs_per_cycle == fast.macs_per_cycle == 16
    assert fast.parallel_work_narrow == 2 * 1024 * 16 == unmeasured.parallel_work // 8
    # (a product as wide as a vector splits from WIDE_SPLITS fork-joins of work at the peak rate)
    assert fast.parallel_work == host.WIDE_SPLITS * 1024 * fast.macs_per_cycle == unmeasured.parallel_work // 4
    # (the libraries' text holds the unmeasured rule; each library applies the rule to the split cost the
    # running pool measured, at run time)
    assert f"#define TV_GEMM_PARALLEL_WORK_NARROW {unmeasured.parallel_work_narrow}.0\n" in c_emit.prelude()
    pool = host.kernel_rules(fake_host({"isa": "avx2", "clock_ghz": 2.0, "fork_join_ns": 3000.0}))  # 8192 cycles
    assert pool.parallel_work_narrow == host.FORK_JOIN_CYCLES * pool.macs_per_cycle == unmeasured.parallel_work
    slow = host.kernel_rules(fake_host({"isa": "avx2", "clock_ghz": 2.0, "fork_join_ns": 40000.0}))
    assert slow.parallel_work_narrow == unmeasured.parallel_work


def test_a_narrow_product_streams_at_most_a_line_of_weights_a_cycle(fake_host):
    """AVX-512 does 32 multiply-adds a cycle where its operands are in registers, but a product narrower
    than a vector reads a vector of weights per FMA: its threshold counts 16 a cycle (a 64-byte line), so
    with the same measured split it splits from half the work a compute rate would give; a portable host
    (4 lanes, no FMA) is below the line's rate and keeps its own."""
    wide = host.kernel_rules(fake_host({"isa": "avx512", "clock_ghz": 2.0, "fork_join_ns": 500.0}))
    assert (wide.macs_per_cycle, wide.narrow_macs_per_cycle) == (32, host.STREAM_MACS_PER_CYCLE)
    assert wide.parallel_work_narrow == 2 * 1024 * 16
    assert host.kernel_rules(fake_host("avx512")).parallel_work_narrow == host.FORK_JOIN_CYCLES * 16
    portable = host.kernel_rules(fake_host({"isa": "portable", "clock_ghz": 2.0, "fork_join_ns": 500.0}))
    assert portable.narrow_macs_per_cycle == portable.macs_per_cycle < 16
    assert portable.parallel_work_narrow == 2 * 1024 * portable.macs_per_cycle


def test_a_fake_avx512_server_gets_other_thresholds_by_the_same_rule(fake_host):
    avx2 = host.kernel_rules(fake_host("avx2"))
    xeon_host = fake_host(XEON)
    xeon = host.kernel_rules(xeon_host)
    assert xeon.macs_per_cycle == 2 * avx2.macs_per_cycle == 32
    for field in ("parallel_work", "parallel_elements", "gemm_min_work", "blas_min_flops", "blas_min_rows",
                  "vector_width", "reduction_width", "jam"):
        assert getattr(xeon, field) == 2 * getattr(avx2, field), field
    # one FMA pipe (a client AVX-512 part): half the work per cycle, half the work thresholds
    one_pipe = host.kernel_rules(host.dataclasses.replace(xeon_host, fma_units=1))
    assert one_pipe.parallel_work == xeon.parallel_work // 2
    # no FMA (portable, 4 lanes): a quarter of AVX2's work per cycle
    assert host.kernel_rules(host.isa_host("portable")).macs_per_cycle == 4
    # and the packed product's tile and blocks follow the caches
    assert host.gemm_params(xeon_host).mr == 14 and host.gemm_params(xeon_host).kc > host.gemm_params(
        host.isa_host("avx512", host.dataclasses.replace(xeon_host, l2=1024 * 1024))).kc


def test_the_rules_reach_the_c_text_the_lowering_and_the_strategies(fake_host):
    for description, width in (("avx2", 32), (XEON, 64), ("portable", 16)):
        desc = fake_host(description)
        rules = host.kernel_rules(desc)
        text = c_emit.prelude()
        assert f"#define TV_VEC_BYTES {width}\n" in text
        assert f"#define TV_GEMM_PARALLEL_WORK {rules.parallel_work}.0\n" in text
        assert f"#define TV_PARALLEL_ELEMENTS {rules.parallel_elements}\n" in text
        assert f"#define TV_LIB_PARALLEL_WORK {rules.sort_parallel_elements}\n" in text
        assert parallel_work_threshold() == rules.parallel_elements
        assert strategy.gemm_min_work() == rules.gemm_min_work
        assert strategy.rules() == rules


def test_vec_variant_multiples_follow_the_vector_width(fake_host):
    """A dense over dynamic N and K: the "vec" variant asks N and K to be multiples of one and two
    vectors of the host."""
    from tensorvm import te

    n, k = te.var("n"), te.var("k")
    for description in ("avx2", XEON):
        rules = host.kernel_rules(fake_host(description))
        impls = strategy.matmul_implementations(const_rows(), n, k, [], _Type(), None)
        vec = [i for i in impls if i.name == "vec"]
        assert vec and vec[0].multiples == {n: rules.vector_width, k: rules.reduction_width}


def const_rows():
    from tensorvm.te.expr import const

    return const(4)


class _Type:
    dtype = "float32"


@pytest.mark.skipif(not have_compiler(), reason="no C compiler")
@pytest.mark.parametrize("description", ["avx2", "portable", "xeon"])
@pytest.mark.parametrize("op", ["nn.softmax", "nn.log_softmax"])
def test_softmax_at_each_vector_width_matches_numpy(fake_host, description, op):
    """The softmax instantiated at 16, 32 and 64 bytes (the last lowered to narrower operations here),
    rows with a vector tail, a -inf (masked) score and a row of one element; and exe.stats() says which
    width and thresholds ran."""
    desc = fake_host(XEON if description == "xeon" else description)
    mod = tv.parse(f'''#[version = "0.0.5"]
def @main(%x: Tensor[(?, ?), float32]) {{ {op}(%x, axis=-1) }}''')
    exe = tv.vm.compile(mod, target="c")
    vm = tv.vm.VirtualMachine(exe)
    rng = np.random.default_rng(3)
    for shape in [(3, 37), (2, 64), (5, 1), (1, 1000)]:
        x = (rng.standard_normal(shape) * 4).astype(np.float32)
        if shape[1] > 3:
            x[0, 2] = -np.inf
        got = vm.run(x).numpy()
        x64 = x.astype(np.float64)
        shifted = x64 - x64.max(axis=-1, keepdims=True)
        with np.errstate(divide="ignore"):
            total = np.exp(shifted).sum(axis=-1, keepdims=True)
            want = shifted - np.log(total) if op == "nn.log_softmax" else np.exp(shifted) / total
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 if op == "nn.log_softmax" else 1e-37,
                                   err_msg=f"{description} {shape}")
    assert "tv_softmax_f32" in "".join(exe.kernel_source(p.name) for p in exe.primitives)
    report = exe.stats()["product_kernels"]
    assert report["softmax"]["vector_bytes"] == desc.vector_bytes
    assert report["thresholds"]["parallel_work"]["value"] == host.kernel_rules(desc).parallel_work
    assert "multiply-adds per cycle" in report["thresholds"]["parallel_work"]["why"]


@pytest.mark.skipif(not have_compiler(), reason="no C compiler")
@pytest.mark.parametrize("units", [24, 12, 6])
def test_generated_dense_jams_by_the_registers_and_stays_right(fake_host, monkeypatch, units):
    """The generic dense kernel computes ``jam`` outputs per pass: 8 on the fake 32-register host when the
    units are a multiple of 8 (24), else the largest power-of-two divisor from 4 (12), else none (6)."""
    from tensorvm.codegen.c_emit import emit_kernel
    from tensorvm.codegen.lower import lower
    from tensorvm.codegen.module import build_module
    from tensorvm.te import compute, placeholder, reduce_axis
    from tensorvm.te import sum as te_sum

    fake_host(XEON)
    assert host.kernel_rules().jam == 8
    x = placeholder((5, 32), "float32", "x")
    w = placeholder((units, 32), "float32", "w")
    r = reduce_axis(32, "r")
    y = compute((5, units), lambda i, j: te_sum(x[i, r] * w[j, r], axis=r), "y")
    func = lower("jam_dense", [x, w], [y])
    text = emit_kernel(func).source
    expected = 8 if units % 8 == 0 else 4 if units % 4 == 0 and units >= 8 else 1
    accumulators = {name for name in ("y_acc0", "y_acc3", "y_acc4", "y_acc7") if f"float {name};" in text}
    assert accumulators == {1: set(), 4: {"y_acc0", "y_acc3"}, 8: {"y_acc0", "y_acc3", "y_acc4", "y_acc7"}}[expected]
    kernel = build_module([func])["jam_dense"]
    rng = np.random.default_rng(units)
    a, b = rng.standard_normal((5, 32)).astype(np.float32), rng.standard_normal((units, 32)).astype(np.float32)
    out = np.empty((5, units), np.float32)
    kernel(a, b, out)
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.T.astype(np.float64), rtol=1e-5, atol=1e-5)
