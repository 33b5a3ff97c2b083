"""The FMA datapath's width (``host.fma_bits``, ``codegen/fma.py``) and the rule that follows it: an AVX-512
host whose FMAs are full width (an Intel server) keeps 64-byte vectors and counts 32 multiply-adds per
cycle; one that runs a 512-bit operation as two halves (Zen 4) gets the 32-byte instance and counts 16;
a pin ($TENSORVM_HOST) overrides either; a probe disturbed by other work is neither used nor cached. The
probe's decisions are tested on fake timings (no timing asserts); the real probe only has to run."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.codegen import calibrate, fma
from tensorvm.codegen import host as hostmod
from tensorvm.codegen.build import have_compiler

FLAGS = ("avx2", "avx512f", "fma")


def fake(fma_bits: int, **fields) -> hostmod.HostDescription:
    base = hostmod.HostDescription(model=f"Fake AVX-512 ({fma_bits})", flags=FLAGS, l2=1 << 20, **fields)
    return hostmod.fma_vector_host(dataclasses.replace(hostmod.isa_host("avx512", base), fma_bits=fma_bits))


def test_a_full_width_host_keeps_64_byte_vectors_and_twice_the_work_per_cycle():
    full, unmeasured = fake(512), fake(0)
    for desc in (full, unmeasured):  # (unmeasured: the ISA's own width, as before the probe)
        assert (desc.vector_bytes, desc.vector_registers) == (64, 32)
        assert hostmod.kernel_rules(desc).macs_per_cycle == 32
        assert (hostmod.gemm_params(desc).mr, hostmod.gemm_params(desc).nr) == (14, 32)
    assert "64-byte vectors" in hostmod.width_why(full)


def test_a_split_host_gets_the_32_byte_instance_and_the_avx2_thresholds():
    split = fake(256)
    avx2 = hostmod.kernel_rules(hostmod.isa_host("avx2", hostmod.HostDescription(flags=FLAGS, l2=1 << 20)))
    assert (split.isa, split.vector_bytes, split.vector_registers, split.fma_bits) == ("avx512", 32, 16, 256)
    assert hostmod.kernel_rules(split) == avx2  # (the same work per cycle, the same vectors)
    params = hostmod.gemm_params(split)
    assert (params.vector_bytes, params.mr, params.nr) == (32, 6, 16)
    assert "-DTV_VEC_BYTES=32" in hostmod.rule_defines(split)
    assert "halves" in hostmod.width_why(split)


def test_64_byte_vectors_pinned_on_a_split_host_count_the_datapath_not_the_vector():
    """What the thresholds did before the rule on Zen 4: twice the work per cycle for none more."""
    pinned = hostmod.isa_host("avx512", fake(256))
    full = fake(512)
    assert pinned.vector_bytes == 64 and pinned.fma_bits == 256
    rules, full_rules = hostmod.kernel_rules(pinned), hostmod.kernel_rules(full)
    assert rules.macs_per_cycle == full_rules.macs_per_cycle // 2 == 16
    assert rules.parallel_work == full_rules.parallel_work // 2
    assert rules.parallel_elements == full_rules.parallel_elements // 2
    assert rules.vector_width == full_rules.vector_width == 16  # (the vectors' own multiples stay)
    assert "pinned" in hostmod.width_why(pinned)


@pytest.mark.parametrize("detected_bits,pin,want", [
    (256, '{"fma_bits": 512}', (64, 32, 512)),
    (512, '{"fma_bits": 256}', (32, 16, 256)),
    (256, "avx512", (64, 32, 256)),
    (256, '{"vector_bytes": 64, "vector_registers": 32}', (64, 32, 256)),
    (256, "", (32, 16, 256)),
])
def test_the_environment_pins_the_width(monkeypatch, detected_bits, pin, want):
    monkeypatch.setattr(hostmod, "_OVERRIDE", [None])
    monkeypatch.setattr(hostmod, "_DETECTED", [fake(detected_bits)])
    monkeypatch.setenv("TENSORVM_HOST", pin)
    desc = hostmod.host()
    assert (desc.vector_bytes, desc.vector_registers, desc.fma_bits) == want
    report = calibrate.report()["vector_width"]
    assert (report["vector_bytes"], report["fma_bits"]) == (want[0], want[2])
    assert report["source"] == ("$TENSORVM_HOST" if pin else "detected")


def test_detection_applies_the_probe_only_on_avx512(monkeypatch):
    asked = []
    monkeypatch.setattr(fma, "fma_bits", lambda key: asked.append(key) or 256)
    avx512 = hostmod.isa_host("avx512", hostmod.HostDescription(model="Fake", flags=FLAGS))
    got = hostmod._with_fma_width(avx512)
    assert (got.vector_bytes, got.fma_bits) == (32, 256) and asked == [avx512.key]
    avx2 = hostmod.isa_host("avx2", hostmod.HostDescription(model="Fake", flags=("avx2", "fma")))
    assert hostmod._with_fma_width(avx2) == avx2 and len(asked) == 1


def _times(ns32, ns64, repeats=7):
    return {32: [float(ns32)] * repeats, 64: [float(ns64)] * repeats}


def test_the_probe_decides_by_the_throughput_ratio():
    # the same number of FMA instructions at each width: 64 bytes in the same time is twice the work
    assert fma.decide(_times(100_000, 100_000)) == 512
    assert fma.decide(_times(100_000, 200_000)) == 256
    assert fma.decide(_times(100_000, 140_000)) == 0  # (between: neither)
    disturbed = _times(100_000, 200_000)
    disturbed[64][1:5] = [900_000.0] * 4  # (most rounds at one width waited for another process)
    assert fma.decide(disturbed) == 0


@pytest.fixture
def fresh_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TENSORVM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(fma, "_BITS", {})
    return tmp_path


def test_a_disturbed_probe_is_not_cached_and_a_clean_one_is(fresh_cache, monkeypatch):
    disturbed = _times(100_000, 200_000)
    disturbed[32][2:6] = [1_000_000.0] * 4
    probes = []
    assert fma.fma_bits("host-a", measure_fn=lambda: probes.append(1) or disturbed) == 0
    assert len(probes) == fma._ATTEMPTS and not list(fresh_cache.glob("fma-*.json"))
    monkeypatch.setattr(fma, "_BITS", {})
    answers = iter([disturbed, _times(100_000, 100_000)])  # (disturbed once, then clean: full width)
    assert fma.fma_bits("host-d", measure_fn=lambda: next(answers)) == 512
    assert len(list(fresh_cache.glob("fma-*.json"))) == 1
    for path in fresh_cache.glob("fma-*.json"):
        path.unlink()
    monkeypatch.setattr(fma, "_BITS", {})  # (a later process)
    assert fma.fma_bits("host-a", measure_fn=lambda: _times(100_000, 200_000)) == 256
    files = list(fresh_cache.glob("fma-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["fma_bits"] == 256
    monkeypatch.setattr(fma, "_BITS", {})

    def must_not_measure():
        raise AssertionError("measured again although cached")
    assert fma.fma_bits("host-a", measure_fn=must_not_measure) == 256
    assert fma.fma_bits("host-b", measure_fn=lambda: _times(100_000, 100_000)) == 512  # (another host)


def test_a_cache_file_that_is_not_a_width_is_ignored(fresh_cache):
    key = "host-c"
    import hashlib

    path = fresh_cache / f"fma-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    path.write_text(json.dumps({"fma_bits": 384}))
    assert fma.fma_bits(key, measure_fn=lambda: _times(100_000, 200_000)) == 256


@pytest.mark.skipif(not have_compiler(), reason="no C compiler")
def test_the_real_probe_runs():
    times = fma.measure()
    assert set(times) == {32, 64} and all(t > 0 for ts in times.values() for t in ts)
    assert fma.decide(times) in (0, 256, 512)


@pytest.mark.skipif(not have_compiler(), reason="no C compiler")
def test_a_model_built_for_the_split_host_matches_the_interpreter_and_says_why(monkeypatch):
    monkeypatch.setattr(hostmod, "_OVERRIDE", [None])
    monkeypatch.delenv("TENSORVM_HOST", raising=False)
    hostmod.set_host(fake(256))
    try:
        mod = tv.parse('''#[version = "0.0.5"]
def @main(%x: Tensor[(20, 96), float32], %w: Tensor[(40, 96), float32]) {
  nn.softmax(nn.relu(nn.dense(%x, %w)), axis=-1)
}''')
        rng = np.random.default_rng(0)
        x, w = rng.standard_normal((20, 96)).astype(np.float32), rng.standard_normal((40, 96)).astype(np.float32)
        exe = tv.vm.compile(mod, target="c")
        got = tv.vm.VirtualMachine(exe).run(x, w).numpy()
        want = tv.create_executor("debug", mod).evaluate()(x, w).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        report = exe.stats()["product_kernels"]
        assert report["vector_width"]["vector_bytes"] == 32 and report["vector_width"]["fma_bits"] == 256
        assert report["softmax"]["vector_bytes"] == 32 and report["packed_product"]["tile"] == "6x16"
    finally:
        hostmod.set_host(None)
