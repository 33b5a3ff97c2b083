"""The host description (``tensorvm.codegen.host``) and the packed product written once with vector
extensions (``codegen/lib/tv_vgemm.h``), instantiated for every ISA.

Every instance runs here, whatever this machine's vectors: the 64-byte (AVX-512) instance is lowered by
gcc to pairs of 256-bit (or four 128-bit) operations, the 16-byte one is the portable fallback. The
oracle is NumPy's float64 product of the same operands.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import math
import shutil
import subprocess

import numpy as np
import pytest

from tensorvm.codegen import build
from tensorvm.codegen import host as hostmod
from tensorvm.codegen.c_emit import LIBRARY_DIR
from tensorvm.errors import AttrError

needs_cc = pytest.mark.skipif(not build.have_compiler(), reason="no C compiler")


# ---- the description and the rule -------------------------------------------------------------------


def test_detected_host_is_consistent_with_proc_cpuinfo():
    desc = hostmod.detect_host()
    assert desc.isa in hostmod.ISAS
    assert (desc.vector_bytes, desc.vector_registers, desc.fma) == hostmod.ISAS[desc.isa]
    assert 0 < desc.l1d < desc.l2 < desc.l3
    if "avx512f" in desc.flags:
        assert desc.isa == "avx512"
    elif {"avx2", "fma"} <= set(desc.flags):
        assert desc.isa == "avx2"


def test_environment_fakes_the_host(monkeypatch):
    monkeypatch.setattr(hostmod, "_OVERRIDE", [None])
    monkeypatch.setenv("TENSORVM_HOST", "avx512")
    desc = hostmod.host()
    assert (desc.isa, desc.vector_bytes, desc.vector_registers) == ("avx512", 64, 32)
    fake = {"isa": "avx2", "l2": 2 << 20, "model": "Fake CPU", "flags": ["avx2", "fma"]}
    monkeypatch.setenv("TENSORVM_HOST", json.dumps(fake))
    desc = hostmod.host()
    assert (desc.isa, desc.vector_bytes, desc.l2, desc.model, desc.flags) == \
        ("avx2", 32, 2 << 20, "Fake CPU", ("avx2", "fma"))
    assert desc.key.startswith("Fake CPU|avx2|avx2+fma|")
    for bad in ("avx9", '{"vector_bits": 3}', "{nope"):
        monkeypatch.setenv("TENSORVM_HOST", bad)
        with pytest.raises(AttrError, match="host"):
            hostmod.host()


def test_set_host_overrides_the_environment(monkeypatch):
    monkeypatch.setattr(hostmod, "_OVERRIDE", [None])
    monkeypatch.setenv("TENSORVM_HOST", "avx2")
    hostmod.set_host("portable")
    assert hostmod.host().vector_bytes == 16
    hostmod.set_host(None)
    assert hostmod.host().vector_bytes == 32


@pytest.mark.parametrize("isa,l2,want", [
    # (registers - 3) // 2 rows, two vectors of columns; mc covers 128 rows; kc: (mc + nr) kc 4 bytes ~ 3/4 L2;
    # the packed convolution's rows: max(mr, the ISA's registers / 4)
    ("avx2", 512 << 10, (8, 6, 16, 132, 768, 6)),      # Zen 3: today's hand-set constants
    ("avx512", 1 << 20, (16, 14, 32, 140, 1024, 14)),  # Skylake/Ice Lake server
    ("avx512", 2 << 20, (16, 14, 32, 140, 2304, 14)),  # Sapphire Rapids
    ("avx512-ymm", 1 << 20, (8, 6, 16, 132, 1280, 8)),  # Zen 4: a 256-bit FMA datapath, AVX-512VL's 32 registers
    ("portable", 256 << 10, (4, 6, 8, 132, 256, 6)),
])
def test_gemm_params_follow_the_rule(isa, l2, want):
    if isa == "avx512-ymm":
        avx512 = dataclasses.replace(hostmod.isa_host("avx512"), fma_bits=256, flags=("avx512f", "avx512vl"))
        desc = dataclasses.replace(hostmod.fma_vector_host(avx512), l2=l2)
    else:
        desc = dataclasses.replace(hostmod.isa_host(isa), l2=l2)
    p = hostmod.gemm_params(desc)
    assert (p.lanes, p.mr, p.nr, p.mc, p.kc, p.conv_mr) == want
    assert 2 * p.mr + 3 <= desc.vector_registers  # accumulators + 2 weight vectors + 1 broadcast
    assert hostmod.gemm_defines(p) == (f"-DTV_VEC_BYTES={p.vector_bytes}", f"-DTV_VGEMM_MR={p.mr}",
                                       f"-DTV_VGEMM_KC={p.kc}", f"-DTV_VGEMM_MC={p.mc}",
                                       f"-DTV_VGEMM_ONTHEFLY={l2 // 8}",  # B packed on the fly up to L2 / 2
                                       f"-DTV_VGEMM_L1_BYTES={desc.l1d // 2}", f"-DTV_VGEMM_GROUP_BYTES={l2 // 2}",
                                       f"-DTV_CONV_MR={p.conv_mr}")


def test_pack_panels_layout():
    w = np.arange(37 * 5, dtype=np.float32).reshape(37, 5)
    for nr in (8, 16, 32):
        packed = hostmod.pack_panels(w, nr)
        assert packed.shape == (-(-37 // nr), 5, nr) and packed.ctypes.data % 64 == 0
        assert packed[1, 3, 2] == w[nr + 2, 3]
        assert not packed[-1, :, 37 % nr:].any()


# ---- every instance against NumPy ---------------------------------------------------------------------

# Small KC/MC as well, so that reduction and row blocks have remainders at small sizes, and small cache
# budgets, so that panels go in groups of 3 or more with a remainder group.
_INSTANCES = {f"{isa}{'-small' if small else ''}": (isa, small) for isa in hostmod.ISAS for small in (False, True)}


@pytest.fixture(scope="module")
def instances():
    made = {}
    for name, (isa, small) in _INSTANCES.items():
        params = hostmod.gemm_params(hostmod.isa_host(isa))
        if small:
            params = dataclasses.replace(params, kc=48, mc=2 * params.mr + 1, l1_bytes=1024,
                                         group_bytes=3 * 48 * params.nr * 4 + 4)
        fn = hostmod.vgemm_library(params).function("tv_vgemm_call", 3, 0)
        fn.argtypes = [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 3
        made[name] = (fn, params)
    return made


_SHAPES = [(1, 1, 1), (1, 17, 3), (2, 5, 1), (7, 33, 5), (13, 31, 97), (29, 64, 130), (3, 100, 2000),
           (1, 40, 4099), (150, 20, 7), (64, 10, 512), (5, 3, 0), (0, 3, 4),
           # many panels (groups of them, a last partial panel) and row counts that are not multiples of
           # the tile (tiles of balanced sizes)
           (8, 301, 9), (29, 301, 130), (43, 517, 64), (128, 2057, 40),
           # two and three rows (their tiles read the reduction as two halves): odd reductions, several
           # reduction blocks (the small instances' kc), a last partial panel
           (2, 37, 131), (3, 19, 97), (2, 64, 1001), (3, 33, 3), (2, 16, 2)]


@needs_cc
@pytest.mark.parametrize("name", list(_INSTANCES))
@pytest.mark.parametrize("threads", [1, 2])
def test_every_instance_matches_numpy(instances, name, threads):
    fn, params = instances[name]
    previous = build._NUM_THREADS[0]
    build.set_num_threads(threads)
    try:
        rng = np.random.default_rng(len(name))
        for m, n, k in _SHAPES:
            x = rng.standard_normal((m, k)).astype(np.float32)
            w = rng.standard_normal((n, k)).astype(np.float32)
            out = np.full((m, n), np.nan, np.float32)
            packed = hostmod.pack_panels(w, params.nr)
            assert fn(m, n, k, x.ctypes.data, packed.ctypes.data, out.ctypes.data) == 0
            want = x.astype(np.float64) @ w.T.astype(np.float64)
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * max(1.0, np.sqrt(k)),
                                       err_msg=f"{name} at m={m} n={n} k={k}, {threads} thread(s)")
    finally:
        build.set_num_threads(previous)


# Products of 1-3 rows (the tiles' reductions in blocks of 2 or 4 steps: odd K leaves 1-3 steps after the
# last block), odd N that is no multiple of any panel width, enough work to split over
# threads (TV_GEMM_PARALLEL_WORK: 2^18 multiply-adds), and one that does not split; the last three stream
# a weight larger than L2 panel after panel (the streaming tiles).
_NARROW_SHAPES = [(1, 1001, 515), (1, 517, 1022), (2, 777, 389), (3, 1001, 131), (1, 45, 7), (3, 19, 4097),
                  (1, 8001, 67), (2, 4001, 67), (3, 4001, 67)]


@needs_cc
@pytest.mark.parametrize("name", list(_INSTANCES))
def test_narrow_products_match_numpy_and_agree_at_1_2_3_threads(instances, name, kernel_threads):
    fn, params = instances[name]
    rng = np.random.default_rng(7)
    for m, n, k in _NARROW_SHAPES:
        x = rng.standard_normal((m, k)).astype(np.float32)
        if m > 1 or n < 100:
            x[-1, k // 2] = np.nan  # (the last row's outputs are NaN, as NumPy's)
        w = rng.standard_normal((n, k)).astype(np.float32)
        packed = hostmod.pack_panels(w, params.nr)
        want = x.astype(np.float64) @ w.T.astype(np.float64)
        outs = []
        for threads in (1, 2, 3):
            kernel_threads(threads)
            out = np.full((m, n), -7.0, np.float32)
            assert fn(m, n, k, x.ctypes.data, packed.ctypes.data, out.ctypes.data) == 0
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * np.sqrt(k),
                                       err_msg=f"{name} at m={m} n={n} k={k}, {threads} thread(s)")
            outs.append(out)
        # a split hands out whole panels: every output is the same sum in the same order at every count
        for threads, out in zip((2, 3), outs[1:]):
            np.testing.assert_array_equal(out, outs[0], err_msg=f"{name} m={m} n={n} k={k}: {threads} threads")


@needs_cc
@pytest.mark.parametrize("name", list(_INSTANCES))
def test_a_weight_beyond_l2_read_back_and_forth_gives_the_same_bits_every_call(instances, name, kernel_threads):
    """One row tile over a weight larger than L2 reads its panels last to first on every other call of the
    same weight (tv_vgemm_turn: the panels read last are still in L2; with threads, each reverses its home
    range of chunks, tv_team_mirror); another weight between two calls starts it over. Every call gives
    NumPy's result and the same bits."""
    fn, params = instances[name]
    rng = np.random.default_rng(11)
    n, k = 2 * params.group_bytes // (4 * 67) + 3 * params.nr + 5, 67  # (past 2 x the group budget, a partial panel)
    other = hostmod.pack_panels(rng.standard_normal((n, k)).astype(np.float32), params.nr)
    for m in (1, 2, params.mr):
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((n, k)).astype(np.float32)
        packed = hostmod.pack_panels(w, params.nr)
        want = x.astype(np.float64) @ w.T.astype(np.float64)
        for threads in (1, 2, 3):
            kernel_threads(threads)
            outs = []
            for call in range(5):
                if call == 3:  # (another weight: the next call reads in order again)
                    scratch = np.empty((m, n), np.float32)
                    assert fn(m, n, k, x.ctypes.data, other.ctypes.data, scratch.ctypes.data) == 0
                out = np.full((m, n), -7.0, np.float32)
                assert fn(m, n, k, x.ctypes.data, packed.ctypes.data, out.ctypes.data) == 0
                outs.append(out)
            np.testing.assert_allclose(outs[0], want, rtol=1e-4, atol=1e-4 * np.sqrt(k))
            for call, out in enumerate(outs[1:], 1):
                np.testing.assert_array_equal(out, outs[0], err_msg=f"{name} m={m}: call {call}, {threads} threads")


@needs_cc
@pytest.mark.parametrize("name", list(_INSTANCES))
def test_weights_taking_turns_read_back_and_forth_give_the_same_bits_every_call(instances, name, kernel_threads):
    """Three weights below L2 (but of at least TV_VGEMM_TURN_BYTES) called in turn, as a Tree-LSTM node's
    are: each is read in the opposite order from its call before (its own slot of tv_vgemm_turn's table),
    and every call of each gives NumPy's result and the same bits, at 1-3 threads."""
    fn, params = instances[name]
    rng = np.random.default_rng(12)
    k = 75
    sizes = (65536 // (4 * k) + params.nr + 3, 2 * params.nr + 1, 3 * 65536 // (4 * k))  # (one below the size)
    weights = [rng.standard_normal((n, k)).astype(np.float32) for n in sizes]
    packed = [hostmod.pack_panels(w, params.nr) for w in weights]
    for m in (1, 2):
        x = rng.standard_normal((m, k)).astype(np.float32)
        for threads in (1, 2, 3):
            kernel_threads(threads)
            outs: list = [[] for _ in weights]
            for _ in range(4):
                for w, p, got in zip(weights, packed, outs):
                    out = np.full((m, w.shape[0]), -7.0, np.float32)
                    assert fn(m, w.shape[0], k, x.ctypes.data, p.ctypes.data, out.ctypes.data) == 0
                    got.append(out)
            for w, got in zip(weights, outs):
                np.testing.assert_allclose(got[0], x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-4,
                                           atol=1e-4 * np.sqrt(k))
                for call, out in enumerate(got[1:], 1):
                    np.testing.assert_array_equal(out, got[0], err_msg=f"{name} m={m} n={w.shape[0]}: call {call}, "
                                                                       f"{threads} threads")


@needs_cc
@pytest.mark.parametrize("isa", list(hostmod.ISAS))
def test_kernel_reports_its_panel_width(instances, isa):
    fn, params = instances[isa]
    lanes = hostmod.vgemm_library(params).function("tv_vgemm_lanes", 0, 0)
    assert lanes() == params.nr == 2 * params.vector_bytes // 4


@pytest.mark.parametrize("isa", list(hostmod.ISAS))
def test_header_compiles_warning_free(tmp_path, isa):
    """tv_gemm.h with the product instantiated for each ISA (tv_vgemm.h is included there)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    flags = ["-std=gnu11", "-O2", "-fopenmp", "-Wall", "-Wextra", "-Werror", "-DTV_PACKED_KERNELS",
             *hostmod.gemm_defines(hostmod.gemm_params(hostmod.isa_host(isa)))]
    result = subprocess.run([cc, *flags, "-x", "c", "-c", str(LIBRARY_DIR / "tv_gemm.h"), "-o",
                             str(tmp_path / "unit.o")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[:4000]


# ---- calibration: choice per shape class, cached per host, pinned (no timing asserted) ---------------


@pytest.fixture
def calibration(tmp_path, monkeypatch):
    from tensorvm.codegen import calibrate

    monkeypatch.setenv("TENSORVM_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TENSORVM_VARIANT", raising=False)
    calibrate.reset()
    yield calibrate
    calibrate.reset()


def _fake(model="Fake CPU A", isa="avx512"):
    return dataclasses.replace(hostmod.isa_host(isa), model=model, l1d=32 << 10, l2=1 << 20, l3=16 << 20)


def test_shape_classes_follow_rows_and_the_caches():
    desc = _fake()
    assert hostmod.gemm_params(desc).mr == 14
    from tensorvm.codegen.calibrate import shape_class

    assert shape_class(1, 64, 64, desc) == "m1-l1"          # 16 KB of weight
    assert shape_class(16, 256, 512, desc) == "m16-l2"      # 512 KB
    assert shape_class(128, 768, 768, desc) == "m128-l3"    # 2.25 MB
    assert shape_class(500, 3072, 3072, desc) == "mbig-dram"


def test_calibration_runs_every_candidate_once_per_class_and_caches_it(calibration):
    calls = {"a": 0, "b": 0}

    def runner(name):
        def run():
            calls[name] += 1
        return run

    desc = _fake()
    candidates = {"a": runner("a"), "b": runner("b")}
    first = calibration.choose("dense", (16, 256, 512), candidates, runs=2, desc=desc)
    assert first.why == "calibrated" and first.variant in candidates and calls == {"a": 3, "b": 3}
    assert {name for name, _ in first.seconds} == {"a", "b"}
    # same class (another shape in it): remembered, nothing runs
    again = calibration.choose("dense", (9, 200, 500), candidates, runs=2, desc=desc)
    assert again.variant == first.variant and calls == {"a": 3, "b": 3}
    # a new process (memory forgotten): read from the disk cache of this host, nothing runs
    calibration.reset()
    cached = calibration.choose("dense", (16, 256, 512), candidates, desc=desc)
    assert (cached.variant, cached.why) == (first.variant, "cached") and calls == {"a": 3, "b": 3}
    # another CPU model: calibrates afresh
    calibration.choose("dense", (16, 256, 512), candidates, runs=1, desc=_fake("Fake CPU B"))
    assert calls == {"a": 5, "b": 5}
    assert [c.why for c in calibration.choices()] == ["cached", "calibrated"]


def test_a_pin_wins_and_a_bad_pin_is_an_error(calibration, monkeypatch):
    ran = []
    candidates = {"blas": lambda: ran.append("blas"), "packed": lambda: ran.append("packed")}
    desc = _fake()
    calibration.pin("dense", "blas")
    choice = calibration.choose("dense", (1, 64, 64), candidates, desc=desc)
    assert (choice.variant, choice.why, ran) == ("blas", "pinned", [])
    calibration.pin("dense", None)
    monkeypatch.setenv("TENSORVM_VARIANT", "conv=blas,dense=packed")
    assert calibration.choose("dense", (1, 64, 64), candidates, desc=desc).variant == "packed"
    monkeypatch.setenv("TENSORVM_VARIANT", "avx9")
    with pytest.raises(AttrError, match="avx9"):
        calibration.choose("dense", (1, 64, 64), candidates, desc=desc)
    assert ran == []


def test_a_corrupt_cache_file_is_recalibrated(calibration, tmp_path):
    desc = _fake()
    calibration.choose("dense", (1, 64, 64), {"a": lambda: None}, runs=1, desc=desc)
    (path,) = tmp_path.glob("calibration-*.json")
    path.write_text("{not json")
    calibration.reset()
    assert calibration.choose("dense", (1, 64, 64), {"a": lambda: None}, runs=1, desc=desc).why == "calibrated"
    assert json.loads(path.read_text())["dense|m1-l1"]["variant"] == "a"


def test_report_names_the_instance_and_where_the_description_came_from(calibration, monkeypatch):
    monkeypatch.setattr(hostmod, "_OVERRIDE", [None])
    monkeypatch.setenv("TENSORVM_HOST", "avx512")
    product = calibration.report()["packed_product"]
    assert product["isa"] == "avx512" and product["tile"] == "14x32" and "$TENSORVM_HOST" in product["why"]


# ---- the epilogue in the tiles (tv_vgemm_epilogue) against float64 NumPy -------------------------------

_ACT_LO, _ACT_HI, _ACT_GATE, _GELU, _GELU_TANH = 1, 2, 4, 8, 16
_ERFC = np.vectorize(math.erfc, otypes=[np.float64])  # (1 + erf(-z) cancels in the tail)


def _gelu64(v, act):
    with np.errstate(all="ignore"):
        if act == _GELU:
            return 0.5 * v * _ERFC(-v / math.sqrt(2.0))
        # 0.5 v (1 + tanh(u)) = v / (1 + exp(-2 u)), which does not cancel in the tail
        return v / (1.0 + np.exp(-2.0 * math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))


def _activation64(v, act, alpha, beta, lo, hi):
    if act & (_GELU | _GELU_TANH):
        return _gelu64(v, act)
    if not act:
        return v
    s = alpha * v + beta
    if act & _ACT_LO:
        s = np.where(s < lo, lo, s)
    if act & _ACT_HI:
        s = np.where(s > hi, hi, s)
    return v * s if act & _ACT_GATE else s


def _epi_function(params):
    fn = hostmod.vgemm_library(params).function("tv_vgemm_epi_call", 0, 0)
    fn.argtypes = ([ctypes.c_int64] * 4 + [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                   ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64] + [ctypes.c_float] * 4 + [ctypes.c_void_p])
    return fn


def _epi_call(fn, x, packed, lanes, n, out, col_bias=None, row_bias=None, residual=None, act=(0, 1.0, 0.0, 0.0, 0.0)):
    m, k = x.shape

    def ptr(a):
        return None if a is None else a.ctypes.data

    return fn(m, n, k, lanes, x.ctypes.data, packed.ctypes.data, ptr(col_bias), int(col_bias is not None),
              ptr(row_bias), int(row_bias is not None), ptr(residual), int(residual is not None), *act,
              out.ctypes.data)


# (bits, alpha, beta, lo, hi): relu, hard-swish (the gate), clip to [-1, 2], GELU with erf and with tanh
_ACTS = [(0, 1.0, 0.0, 0.0, 0.0), (_ACT_LO, 1.0, 0.0, 0.0, 0.0),
         (_ACT_LO | _ACT_HI | _ACT_GATE, 1 / 6, 0.5, 0.0, 1.0), (_ACT_LO | _ACT_HI, 1.0, 0.0, -1.0, 2.0),
         (_GELU, 1.0, 0.0, 0.0, 0.0), (_GELU_TANH, 1.0, 0.0, 0.0, 0.0)]
_EPI_SHAPES = [(1, 1, 1), (1, 17, 3), (7, 33, 5), (13, 31, 97), (29, 64, 130), (150, 20, 7), (3, 100, 2000),
               (43, 517, 64), (5, 3, 0)]


@needs_cc
@pytest.mark.parametrize("name", list(_INSTANCES))
@pytest.mark.parametrize("threads", [1, 2])
def test_epilogue_of_every_instance_matches_numpy(instances, name, threads):
    """Bias per column and per row, a residual and each activation, on every tail of rows, panels and
    reduction blocks (the small instances cut the reduction in blocks: the epilogue runs after the last)."""
    _, params = instances[name]
    fn = _epi_function(params)
    previous = build._NUM_THREADS[0]
    build.set_num_threads(threads)
    try:
        rng = np.random.default_rng(len(name) + threads)
        for index, (m, n, k) in enumerate(_EPI_SHAPES):
            x = rng.standard_normal((m, k)).astype(np.float32)
            w = rng.standard_normal((n, k)).astype(np.float32)
            packed = hostmod.pack_panels(w, params.nr)
            col = rng.standard_normal(n).astype(np.float32)
            row = rng.standard_normal(m).astype(np.float32)
            res = rng.standard_normal((m, n)).astype(np.float32)
            product = x.astype(np.float64) @ w.T.astype(np.float64)
            for act in _ACTS:
                use_row = act[0] in (0, _GELU)  # (the row bias, a 1x1 convolution's, with and without the others)
                out = np.full((m, n), np.nan, np.float32)
                assert _epi_call(fn, x, packed, params.nr, n, out, col, row if use_row else None,
                                 res if index % 2 else None, act) == 0
                v = product + col + (row[:, None] if use_row else 0) + (res if index % 2 else 0)
                want = _activation64(v, *act)
                np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * max(1.0, np.sqrt(k)),
                                           err_msg=f"{name} at m={m} n={n} k={k}, act {act}, {threads} thread(s)")
            # weights packed for another width: the plain loops, the same epilogue
            other = hostmod.pack_panels(w, 8 if params.nr != 8 else 16)
            out = np.full((m, n), np.nan, np.float32)
            assert _epi_call(fn, x, other, other.shape[2], n, out, col, None, res, _ACTS[4]) == 0
            np.testing.assert_allclose(out, _gelu64(product + col + res, _GELU), rtol=1e-4,
                                       atol=1e-4 * max(1.0, np.sqrt(k)))
    finally:
        build.set_num_threads(previous)


@needs_cc
@pytest.mark.parametrize("name", ["avx2", "avx512", "portable"])
@pytest.mark.parametrize("act", [_GELU, _GELU_TANH])
def test_gelu_is_accurate_on_the_whole_line_and_keeps_nan_and_inf(instances, name, act):
    """The values reach the activation exactly (a zero product plus the residual): GELU within 2e-6 of
    float64 math relative to the value itself (the tanh form: 2e-6 |v|), tails included (down to ~1e-30),
    and NaN, +-inf as the formula gives them."""
    _, params = instances[name]
    fn = _epi_function(params)
    values = np.concatenate([np.linspace(-14, 14, 4001), np.geomspace(1e-7, 30, 300), -np.geomspace(1e-7, 30, 300),
                             [0.0, -0.0, 1e30, -1e30, np.inf, -np.inf, np.nan]]).astype(np.float32)
    n = 37  # (a partial last vector in every row)
    values = np.concatenate([values, np.zeros(-len(values) % n, np.float32)]).reshape(-1, n)
    m = values.shape[0]
    x = np.zeros((m, 1), np.float32)
    packed = hostmod.pack_panels(np.ones((n, 1), np.float32), params.nr)
    out = np.full((m, n), 7.0, np.float32)
    assert _epi_call(fn, x, packed, params.nr, n, out, residual=values, act=(act, 1.0, 0.0, 0.0, 0.0)) == 0
    want = _gelu64(values.astype(np.float64), act)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    finite = np.isfinite(want) & (np.abs(want) > 1e-30)
    # (the tanh form's argument 2u, up to ~30 where the value is above 1e-30, is rounded to float32 first)
    rtol = 2e-6 * (np.maximum(1.0, np.abs(values[finite])) if act == _GELU_TANH else 1.0)
    assert np.all(np.abs(out[finite] - want[finite]) <= rtol * np.abs(want[finite])), \
        np.max(np.abs(out[finite] / want[finite] - 1))
    np.testing.assert_array_equal(out[np.isinf(want)], want[np.isinf(want)])
    small = np.isfinite(want) & ~finite
    assert np.all(np.abs(out[small]) <= 1e-30)
