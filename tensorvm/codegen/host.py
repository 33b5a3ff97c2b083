"""The host the C kernels are built for, and the kernel shapes derived from it.

``host()`` describes this CPU: its vector width in bytes, its number of vector registers, whether it
has fused multiply-add, its cache sizes (``/sys/devices/system/cpu/cpu0/cache``, else ``sysconf``), its
model name and feature flags (``/proc/cpuinfo``). ``gemm_params(desc)`` turns a description into the
packed product's register tile and cache blocks by the rule written there (no per-CPU constants), and
``gemm_defines`` into the ``-D`` macros that instantiate the one C micro-kernel (``tv_vgemm.h``) for it.

The description can be faked, for tests and for building for another machine:
``$TENSORVM_HOST`` (or ``set_host``) names an ISA (``avx512``, ``avx2``, ``portable``) or gives a JSON
object of ``HostDescription`` fields, over the detected host. A fake ISA changes which kernel is built,
not the flags the compiler targets: an ``avx512`` kernel built on an AVX2 machine has its 64-byte vectors
lowered by gcc to pairs of 256-bit operations (correct, not fast), which is how that variant is tested
here.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
from dataclasses import dataclass
from pathlib import Path

from ..errors import AttrError

__all__ = ["HostDescription", "GemmParams", "KernelRules", "host", "detect_host", "set_host", "isa_host",
           "fma_vector_host", "width_why", "gemm_params", "gemm_defines", "kernel_rules", "rule_defines", "ISAS"]

# The ISAs a kernel is instantiated for: vector bytes, vector registers, FMA.
ISAS = {
    "avx512": (64, 32, True),   # AVX-512F: zmm0-31
    "avx2": (32, 16, True),     # AVX2 + FMA: ymm0-15
    "portable": (16, 16, False),  # SSE2 / any 128-bit SIMD gcc's vector extensions lower to (NEON has 32)
}


@dataclass(frozen=True)
class HostDescription:
    """What the kernels need to know about a CPU. Cache sizes are in bytes, per core (L3: shared)."""

    isa: str = "portable"
    vector_bytes: int = 16
    vector_registers: int = 16
    fma: bool = False
    fma_units: int = 2  # vector FMA (or multiply + add) pipes per core: 2 on Zen 3 and server AVX-512 parts
    l1d: int = 32 * 1024
    l2: int = 256 * 1024
    l3: int = 8 * 1024 * 1024
    model: str = ""
    flags: tuple = ()
    clock_ghz: float = 0.0  # the cores' clock (/proc/cpuinfo's "cpu MHz"; 0: unknown)
    fork_join_ns: float = 0.0  # a split over two threads of the process's pool (codegen/pool.py; 0: unmeasured)
    wake_ns: float = 0.0  # ... when its worker sleeps (0: unmeasured)
    # The FMA datapath's width in bits (codegen/fma.py's probe): 512 where 64-byte FMAs are full width
    # (Intel servers with two 512-bit units), 256 where a 512-bit operation runs as two 256-bit halves
    # (Zen 4); 0: unmeasured, taken to be the vectors' width. ``fma_vector_host`` builds the kernels with
    # vectors no wider than it, and ``kernel_rules`` counts the multiply-adds per cycle by it.
    fma_bits: int = 0

    @property
    def key(self) -> str:
        """What identifies this host for cached choices (calibration): the model and the features kernels use."""
        features = [f for f in ("avx512f", "avx2", "fma", "avx", "sse4_2", "asimd", "sve") if f in self.flags]
        return f"{self.model or platform.machine()}|{self.isa}|{'+'.join(features)}|{self.l1d}/{self.l2}/{self.l3}"


@dataclass(frozen=True)
class GemmParams:
    """The packed product's shape for one host: ``lanes`` floats per vector, register tile ``mr`` rows x
    ``nr`` columns (``nr`` = the packed weight's panel width, ``packed_lanes()``), reduction blocks of at
    most ``kc`` steps and row blocks of ``mc`` rows; a product packs its B on the fly when B has at most
    ``onthefly`` floats. A product whose x rows and one panel fit in ``l1_bytes`` runs panel after panel
    (the panel stays in L1 for every row tile); else in groups of panels of at most ``group_bytes`` (the
    group stays in L2 while each row tile sweeps it)."""

    vector_bytes: int
    lanes: int
    mr: int
    nr: int
    kc: int
    mc: int
    onthefly: int = 65536
    l1_bytes: int = 16384
    group_bytes: int = 262144
    conv_mr: int = 0  # the packed convolution's tile rows (0: ``mr``)


def _cpuinfo() -> tuple[str, tuple, float]:
    """The model name, the feature flags and the highest clock (GHz, 0 when not given) of /proc/cpuinfo."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), (), 0.0
    model, flags, mhz = "", (), 0.0
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name in ("model name", "Processor", "cpu model") and not model:
            model = value.strip()
        elif name in ("flags", "Features") and not flags:
            flags = tuple(sorted(value.split()))
        elif name == "cpu MHz":
            try:
                mhz = max(mhz, float(value))
            except ValueError:
                pass
    return model or platform.machine(), flags, mhz / 1000


def _size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(text[-1:], 1)
    return int(text.rstrip("KMG") or 0) * scale


def _caches() -> dict:
    """L1 data, L2, L3 sizes of cpu0 (sysfs, else sysconf, else the dataclass defaults)."""
    found = {}
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(root.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = _size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified") and size > 0:
            found.setdefault({1: "l1d", 2: "l2", 3: "l3"}.get(level, ""), size)
    for field, name in (("l1d", "SC_LEVEL1_DCACHE_SIZE"), ("l2", "SC_LEVEL2_CACHE_SIZE"), ("l3", "SC_LEVEL3_CACHE_SIZE")):
        if field not in found and name in os.sysconf_names:
            try:
                value = os.sysconf(name)
            except (OSError, ValueError):
                continue
            if value > 0:
                found[field] = value
    found.pop("", None)
    return found


def detect_host() -> HostDescription:
    """This CPU, as far as /proc and /sys tell (the portable ISA when they do not)."""
    model, flags, ghz = _cpuinfo()
    if "avx512f" in flags:
        isa = "avx512"
    elif "avx2" in flags and "fma" in flags:
        isa = "avx2"
    else:
        isa = "portable"
    return isa_host(isa, HostDescription(model=model, flags=flags, clock_ghz=ghz, **_caches()))


def isa_host(isa: str, base: HostDescription | None = None) -> HostDescription:
    """``base`` (default: the detected host) with the vector unit of ``isa`` (one of ``ISAS``)."""
    if isa not in ISAS:
        raise AttrError(f"host: unknown ISA {isa!r}; expected one of {', '.join(ISAS)}")
    width, registers, fma = ISAS[isa]
    return dataclasses.replace(base or detect_host(), isa=isa, vector_bytes=width, vector_registers=registers, fma=fma)


def fma_vector_host(desc: HostDescription) -> HostDescription:
    """``desc`` with its ISA's vectors, or, where the FMA datapath is narrower than them (``fma_bits``:
    AVX-512 on Zen 4), the vectors and registers of the widest ISA of ``ISAS`` that fits the datapath (the
    ``avx2`` instance: 32-byte vectors, 16 registers; the instructions stay the host's, ``-march=native``).
    The rule: a vector wider than the FMA datapath retires no more multiply-adds per cycle, and costs
    registers, and tiles padded further past small images and channel counts; measured on Zen 4
    (docs/kernels.md) the 32-byte build with the thresholds of the real throughput ran MobileNetV3 and
    DistilBERT-128 1.07-1.13x faster at 1 and 2 threads, products of 64+ rows 1.03-1.26x, and lost
    only on products of 16 rows (0.90) and long softmax rows. ``$TENSORVM_HOST`` (an ISA name, or JSON with ``vector_bytes`` or
    ``fma_bits``) pins either."""
    width, registers, fma = ISAS.get(desc.isa, (desc.vector_bytes, desc.vector_registers, desc.fma))
    if 0 < desc.fma_bits < 8 * width:
        fitting = [spec for spec in ISAS.values() if 8 * spec[0] <= desc.fma_bits and spec[2] == fma]
        if fitting:
            width, registers, _ = max(fitting)
    return dataclasses.replace(desc, vector_bytes=width, vector_registers=registers)


def width_why(desc: HostDescription) -> str:
    """Why ``desc``'s kernels have the vectors they have (for ``calibrate.report`` and ``exe.stats()``)."""
    own = ISAS.get(desc.isa, (desc.vector_bytes,))[0]
    if desc.fma_bits <= 0:
        datapath = "FMA datapath unmeasured (taken as the vectors' width)"
    else:
        datapath = f"{desc.fma_bits}-bit FMA datapath (codegen/fma.py's probe, or pinned)"
    if desc.vector_bytes < own:
        return (f"{desc.vector_bytes}-byte vectors, {desc.vector_registers} registers: {desc.isa}'s {own}-byte "
                f"vectors run as halves on this {datapath} (no more multiply-adds per cycle, measured slower)")
    if 0 < desc.fma_bits < 8 * desc.vector_bytes:
        return (f"{desc.vector_bytes}-byte vectors as pinned, over a {datapath}: thresholds count "
                f"{desc.fma_bits // 32} lanes of work per FMA")
    return f"{desc.isa}'s {desc.vector_bytes}-byte vectors, {desc.vector_registers} registers; {datapath}"


_OVERRIDE: list = [None]  # set_host's description
_DETECTED: list = [None]


def set_host(description: HostDescription | str | None):
    """Build kernels for ``description`` (a ``HostDescription`` or an ISA name) instead of the detected
    host; ``None`` goes back to ``$TENSORVM_HOST`` / detection."""
    if isinstance(description, str):
        description = isa_host(description)
    _OVERRIDE[0] = description


def _from_environment(detected: HostDescription) -> HostDescription | None:
    value = os.environ.get("TENSORVM_HOST", "").strip()
    if not value:
        return None
    if not value.startswith("{"):
        return isa_host(value, detected)
    try:
        fields = json.loads(value)
    except ValueError as err:
        raise AttrError(f"host: $TENSORVM_HOST is neither an ISA name nor JSON: {err}") from None
    known = {f.name for f in dataclasses.fields(HostDescription)}
    if not isinstance(fields, dict) or not set(fields) <= known:
        raise AttrError(f"host: $TENSORVM_HOST must be a JSON object with fields among {sorted(known)}, got {value!r}")
    if "isa" in fields:
        detected = isa_host(fields["isa"], detected)
    if "flags" in fields:
        fields["flags"] = tuple(fields["flags"])
    if "fma_bits" in fields and not {"vector_bytes", "vector_registers"} & set(fields):
        # (a pinned datapath width: the vectors follow it by the rule, from the ISA's own)
        return fma_vector_host(dataclasses.replace(isa_host(detected.isa, detected), **fields))
    return dataclasses.replace(detected, **fields)


def host() -> HostDescription:
    """The description kernels are built for: ``set_host``'s, else ``$TENSORVM_HOST``'s, else this CPU."""
    if _OVERRIDE[0] is not None:
        return _OVERRIDE[0]
    detected = _detected()
    return _from_environment(detected) or detected


def _detected() -> HostDescription:
    """This CPU's description with its measurements, detected once per process whatever ``set_host`` says."""
    if _DETECTED[0] is None:
        _DETECTED[0] = detect_host()  # (first, so that a call of host() while the pool is measured has one)
        _DETECTED[0] = _with_fma_width(_with_pool_timings(_DETECTED[0]))
    return _DETECTED[0]


def _with_fma_width(desc: HostDescription) -> HostDescription:
    """``desc`` with its FMA datapath's width (measured once per CPU model and cached, ``codegen/fma.py``;
    only AVX-512 hosts have a choice) and the vectors that follow from it (``fma_vector_host``)."""
    if desc.isa != "avx512":
        return desc
    from .fma import fma_bits

    return fma_vector_host(dataclasses.replace(desc, fma_bits=fma_bits(desc.key)))


def _with_pool_timings(desc: HostDescription) -> HostDescription:
    """``desc`` with the process pool's timings on this host (measured once per CPU model and cached,
    ``codegen/pool.py``), or as it is where there is no pool."""
    from .pool import pool_timings

    timings = pool_timings(desc.key)
    if timings is None:
        return desc
    return dataclasses.replace(desc, fork_join_ns=timings.fork_join_ns, wake_ns=timings.wake_ns)


def gemm_params(desc: HostDescription | None = None) -> GemmParams:
    """The packed product's register tile and cache blocks for ``desc``, by this rule:

    * a tile row is two vectors wide (``nr = 2 * lanes``): two weight loads per reduction step against
      ``mr`` broadcasts of x keep the loads below the FMAs;
    * ``mr`` takes every register that is left: ``2 mr`` accumulators + 2 weight vectors + 1 broadcast
      <= registers, so ``mr = (registers - 3) // 2`` (6 with 16 registers, 14 with 32), which also gives
      ``2 mr`` >= 12 independent FMA chains, more than latency x throughput (4-5 cycles x 2 ports);
    * ``mc`` is the rows one pass over the weight serves: a multiple of ``mr`` covering 128 rows (a
      transformer's sequence), so a weight that comes from DRAM is read once for such a sequence;
    * ``kc`` makes the x block (``mc`` x ``kc``) and one weight panel block (``kc`` x ``nr``) fill 3/4
      of L2, rounded to the nearest multiple of 256 (at least 256): each reduction block after the
      first reloads the output tiles, so blocks are as long as L2 allows;
    * a product's B is packed on the fly (``onthefly``) when it fills at most half of L2;
    * panels run one after the other (each in L1 while every row tile reads it) when x's rows and one
      panel fill at most half of L1d (``l1_bytes``: few rows, a product bound by the weight's stream from
      memory), else in groups filling at most half of L2 (``group_bytes``): a row tile then sweeps a group
      with its x rows in L1 and stores runs of consecutive outputs (with 128 rows of a 50257-column LM
      head, one panel at a time read x from L2 and stored one line in each of 128 rows per panel: 1.4x
      the time);
    * the convolutions' tiles (the packed one's pixels, the direct 2-row tile's output channels) have
      ``conv_mr = max(mr, isa_registers / 4)`` rows, ``isa_registers``
      being the registers the instructions address at this width (32 for an AVX-512 host's 32-byte
      instance: AVX-512VL), accumulators in at most half of them: 8 on Zen 4, where the product keeps 6
      (8 rows: ResNet-18 2-3% faster; the product at 8 rows no faster and 9% slower on 128 x 1024 x 256;
      10 rows as fast as 8, 12 and 14 slower: docs/kernels.md).
    """
    desc = desc or host()
    lanes = max(1, desc.vector_bytes // 4)
    mr = max(1, (desc.vector_registers - 3) // 2)
    conv_mr = max(mr, _isa_registers(desc) // 4)
    nr = 2 * lanes
    mc = -(-128 // mr) * mr
    kc = max(256, round(0.75 * desc.l2 / (4 * (mc + nr)) / 256) * 256)
    return GemmParams(desc.vector_bytes, lanes, mr, nr, kc, mc, desc.l2 // 8, desc.l1d // 2, desc.l2 // 2, conv_mr)


def _isa_registers(desc: HostDescription) -> int:
    """The vector registers the host's instructions address at ``desc``'s vector width: AVX-512's 32 for
    its 32- and 16-byte vectors too (AVX-512VL encodes ymm16-31), else the description's own."""
    if desc.isa == "avx512" and ("avx512vl" in desc.flags or not desc.flags):
        return max(desc.vector_registers, ISAS["avx512"][1])
    return desc.vector_registers


# Costs that are fixed in *time* (cycles), measured on the development machine (Zen 3, 2 cores); the
# rules of ``kernel_rules`` turn them into thresholds in *work* by the host's throughput, so that a
# host that does twice the work per cycle (AVX-512: 16 lanes) needs twice the work to amortize them.
FORK_JOIN_CYCLES = 16384  # waking the other threads of a parallel split and joining them (~5 us)
LIBRARY_CALL_CYCLES = 1024  # a call of a library product from a kernel (packing B on the fly, the call)
PYTHON_CALL_CYCLES = 65536  # an external variant's Python dispatcher and NumPy's BLAS call (~20 us)
TEAM_SPIN_NS = (20000, 2000, 200000)  # an idle worker's spin: unmeasured, and the bounds of the measured rule
# A product narrower than a vector streams its weights: each FMA reads a vector of them, and a core brings in
# at most one 64-byte line from its L2 per cycle, so it does at most 16 float32 multiply-adds a cycle
# however wide its vectors (a 450 x 300 GEMV ran at 7 a cycle on a Zen 5, 1 thread).
STREAM_MACS_PER_CYCLE = 16
# A product or convolution splits from this many measured fork-joins of work at its peak rate: a small one
# runs at a fraction of the peak (so its time is longer than the work says), but a split also costs each
# thread its setup (a padded copy, a packed panel) and the last chunk's wait.
WIDE_SPLITS = 4


def fork_join_cycles(desc: HostDescription) -> int:
    """A split's cost in cycles on ``desc``: its measured ``fork_join_ns`` times its clock, rounded to a power
    of two (a measurement's noise does not change the kernels' text) and kept within 16x of
    ``FORK_JOIN_CYCLES``, which it is when either is unknown."""
    if desc.fork_join_ns <= 0 or desc.clock_ghz <= 0:
        return FORK_JOIN_CYCLES
    cycles = 2 ** round(math.log2(max(1.0, desc.fork_join_ns * desc.clock_ghz)))
    return min(max(cycles, FORK_JOIN_CYCLES // 16), FORK_JOIN_CYCLES * 16)


@dataclass(frozen=True)
class KernelRules:
    """The thresholds the kernels choose by, derived from the host by ``kernel_rules`` (see there); each
    field's rule is in ``why``."""

    macs_per_cycle: int
    narrow_macs_per_cycle: int  # ... of a product narrower than a vector (it streams its weights)
    parallel_work: int  # multiply-adds from which a library product is split over threads
    parallel_work_narrow: int  # ... when it has fewer rows than a vector has lanes (memory-bound)
    parallel_elements: int  # elements from which a vector loop (generated, softmax) runs in parallel
    team_chunk_elements: int  # the least elements a chunk of a generated parallel loop holds (tv_team_chunks)
    team_spin_ns: int  # how long an idle worker of the pool spins before it sleeps (tv_team_set_spin_ns)
    sort_parallel_elements: int  # elements from which lines are sorted / scanned in parallel (algorithm.c)
    gemm_min_work: int  # multiply-adds from which a product calls the library (tv_gemm_*) from C
    blas_min_rows: int  # rows from which BLAS through NumPy may pay off (fewer: GEMV-like, memory-bound)
    blas_min_flops: int  # ... and multiply-adds (static N and K)
    blas_min_flops_dynamic: int  # ... with N or K dynamic
    blas_thread_factor: int  # the BLAS thresholds grow by this per extra kernel thread
    vector_width: int  # the "vec" variant's multiple for a dynamic N (one vector of float32)
    reduction_width: int  # ... and for a dynamic K (two vectors); a reduction this short is not vectorized along
    jam: int  # outputs a generated reduction computes per pass when they share an input (register blocking)

    def why(self) -> dict:
        return {
            "macs_per_cycle": "float32 lanes per vector, at most the FMA datapath's (fma_bits / 32: a 64-byte "
                              "FMA on a 256-bit datapath is two operations), x FMA pipes (x 1 without FMA)",
            "narrow_macs_per_cycle": "multiply-adds per cycle, at most STREAM_MACS_PER_CYCLE "
                                     f"({STREAM_MACS_PER_CYCLE}: a 64-byte line of weights per cycle)",
            "parallel_work": f"WIDE_SPLITS ({WIDE_SPLITS}) x the measured fork-join (fork_join_cycles), at most "
                             f"FORK_JOIN_CYCLES ({FORK_JOIN_CYCLES}, also its value unmeasured), x multiply-adds "
                             "per cycle",
            "parallel_work_narrow": "twice the measured fork-join (fork_join_cycles), at most FORK_JOIN_CYCLES "
                                    "(also its value unmeasured), x the narrow multiply-adds per cycle: a split "
                                    "pays once the half of the work it hands the other thread outlasts it; and "
                                    "a product this narrow streams its weights (each read serves fewer FMAs "
                                    "than a vector has lanes), so two threads also bring two cores' caches and "
                                    "bandwidth (a Tree-LSTM's 1.1 MB of weights: half in each 1 MB L2)",
            "parallel_elements": "FORK_JOIN_CYCLES x half a vector per cycle (a load, an operation and a store "
                                 "per vector; the datapath's lanes where narrower than the vector)",
            "team_chunk_elements": "the measured fork-join (fork_join_cycles: fork_join_ns x clock, else "
                                   "FORK_JOIN_CYCLES) x half a vector per cycle / 16: a loop that just pays for "
                                   "a split still splits into 16 chunks (4 per thread at 4 threads), each a "
                                   "sixteenth of a fork-join, several times the claim of a chunk (a "
                                   "compare-and-swap on a shared line and a call)",
            "team_spin_ns": "the measured cost of waking a sleeping worker (wake_ns, within "
                            f"{TEAM_SPIN_NS[1]}..{TEAM_SPIN_NS[2]} ns; else {TEAM_SPIN_NS[0]}): spinning longer "
                            "than a sleep and a wake cost wastes more than it saves (at most twice the best "
                            "choice, whatever the gap to the next job), and a spinning worker holds a core "
                            "another process may need",
            "sort_parallel_elements": "FORK_JOIN_CYCLES x 2 elements per cycle (comparisons, not vectors)",
            "gemm_min_work": f"LIBRARY_CALL_CYCLES ({LIBRARY_CALL_CYCLES}) x multiply-adds per cycle",
            "blas_min_rows": "one vector's lanes: with fewer rows each weight vector read serves fewer FMAs "
                             "than it has lanes (memory-bound; BLAS has no edge there)",
            "blas_min_flops": f"PYTHON_CALL_CYCLES ({PYTHON_CALL_CYCLES}) x multiply-adds per cycle",
            "blas_min_flops_dynamic": "blas_min_flops / 16: a generated kernel over dynamic N or K (no constant "
                                      "strides) crossed BLAS 16x earlier",
            "blas_thread_factor": "2 x lanes: the generated kernels scale with the threads, BLAS through NumPy "
                                  "runs on one (measured 16 at 8 lanes and 2 threads)",
            "vector_width": "float32 lanes per vector", "reduction_width": "two vectors of float32",
            "jam": "a quarter of the vector registers (accumulators and their loads stay in registers)",
        }


def kernel_rules(desc: HostDescription | None = None) -> KernelRules:
    """The kernels' thresholds for ``desc`` (see ``KernelRules.why``): fixed costs in cycles times the
    host's work per cycle. On AVX2 with 2 FMA pipes (16 multiply-adds per cycle) they are the values that
    had been measured there (parallel product 2^18, parallel loop 2^16, library call 2^14, BLAS through
    NumPy 2^20); an AVX-512 host doubles each work threshold and the vector multiples."""
    desc = desc or host()
    lanes = max(1, desc.vector_bytes // 4)
    work_lanes = _work_lanes(desc)
    macs = work_lanes * (max(1, desc.fma_units) if desc.fma else 1)
    narrow_macs = min(macs, STREAM_MACS_PER_CYCLE)
    blas_min_flops = PYTHON_CALL_CYCLES * macs
    return KernelRules(
        macs_per_cycle=macs, narrow_macs_per_cycle=narrow_macs,
        parallel_work=min(FORK_JOIN_CYCLES, WIDE_SPLITS * fork_join_cycles(desc)) * macs,
        parallel_work_narrow=min(FORK_JOIN_CYCLES, 2 * fork_join_cycles(desc)) * narrow_macs,
        parallel_elements=FORK_JOIN_CYCLES * max(1, work_lanes // 2),
        team_chunk_elements=max(1, fork_join_cycles(desc) * max(1, work_lanes // 2) // 16),
        team_spin_ns=_spin_ns(desc), sort_parallel_elements=FORK_JOIN_CYCLES * 2,
        gemm_min_work=LIBRARY_CALL_CYCLES * macs, blas_min_rows=lanes, blas_min_flops=blas_min_flops,
        blas_min_flops_dynamic=blas_min_flops // 16, blas_thread_factor=2 * lanes, vector_width=lanes,
        reduction_width=2 * lanes, jam=max(2, desc.vector_registers // 4))


def _work_lanes(desc: HostDescription) -> int:
    """The float32 lanes the vector unit works on per operation: the vector's, or the FMA datapath's where
    that is narrower (a 64-byte operation on a 256-bit datapath takes two issue slots: Zen 4)."""
    lanes = max(1, desc.vector_bytes // 4)
    return min(lanes, desc.fma_bits // 32) if desc.fma_bits > 0 else lanes


def _spin_ns(desc: HostDescription) -> int:
    if desc.wake_ns <= 0:
        return TEAM_SPIN_NS[0]
    return int(min(max(desc.wake_ns, TEAM_SPIN_NS[1]), TEAM_SPIN_NS[2]))


def machine_fork_join_cycles() -> int:
    """``fork_join_cycles`` of this machine's measured description (whatever ``set_host`` or
    ``$TENSORVM_HOST`` describe: the measurement is the machine's), 0 when it was not measured."""
    detected = _detected()
    return fork_join_cycles(detected) if detected.fork_join_ns > 0 and detected.clock_ghz > 0 else 0


def unmeasured(desc: HostDescription) -> HostDescription:
    """``desc`` without its measured fields (``clock_ghz``, ``fork_join_ns``, ``wake_ns``): they differ a
    little in every process, and a busy machine disturbs them (a disturbed measurement is neither cached nor
    used, so one process can have a measurement and the next none)."""
    return dataclasses.replace(desc, clock_ghz=0.0, fork_join_ns=0.0, wake_ns=0.0)


def codegen_view(desc: HostDescription | None = None) -> str:
    """``desc`` as the generated C depends on it, for keys of kernels kept across processes: its
    ``unmeasured`` form and the thresholds of that. The measurements are in no kernel's text: the running
    pool holds them (``pool.share_fork_join``, ``team_spin_ns``) and each library derives
    ``parallel_work_narrow`` and ``team_chunk_elements`` from the pool's split cost at run time, so
    libraries built with and without a measurement are the same file."""
    static = unmeasured(desc or host())
    return f"{static!r} {kernel_rules(static)!r}"


def rule_defines(desc: HostDescription | None = None) -> tuple:
    """The ``-D`` flags that give the C library its thresholds and vector width for ``desc``
    (``c_emit.prelude`` writes them into every shared library's text): the rules of its ``unmeasured``
    form, and what the library needs to apply the two measured ones to the split cost the running pool
    holds (``pool.share_fork_join``; see ``codegen_view``)."""
    desc = desc or host()
    rules = kernel_rules(unmeasured(desc))
    return (f"-DTV_VEC_BYTES={desc.vector_bytes}", f"-DTV_GEMM_PARALLEL_WORK={rules.parallel_work}.0",
            f"-DTV_GEMM_PARALLEL_WORK_NARROW={rules.parallel_work_narrow}.0",
            f"-DTV_PARALLEL_ELEMENTS={rules.parallel_elements}", f"-DTV_TEAM_CHUNK_ELEMENTS={rules.team_chunk_elements}",
            f"-DTV_LIB_PARALLEL_WORK={rules.sort_parallel_elements}",
            f"-DTV_MACS_PER_CYCLE={rules.macs_per_cycle}", f"-DTV_NARROW_MACS_PER_CYCLE={rules.narrow_macs_per_cycle}",
            f"-DTV_WORK_LANES={_work_lanes(desc)}",
            f"-DTV_FORK_JOIN_CYCLES={FORK_JOIN_CYCLES}", f"-DTV_TEAM_WIDE_SPLITS={WIDE_SPLITS}",
            f"-DTV_L1D={desc.l1d}", f"-DTV_L2={desc.l2}", f"-DTV_L3={desc.l3}")


def gemm_defines(params: GemmParams) -> tuple:
    """The ``-D`` flags that instantiate ``tv_vgemm.h`` for ``params``."""
    return (f"-DTV_VEC_BYTES={params.vector_bytes}", f"-DTV_VGEMM_MR={params.mr}", f"-DTV_VGEMM_KC={params.kc}",
            f"-DTV_VGEMM_MC={params.mc}", f"-DTV_VGEMM_ONTHEFLY={params.onthefly}",
            f"-DTV_VGEMM_L1_BYTES={params.l1_bytes}", f"-DTV_VGEMM_GROUP_BYTES={params.group_bytes}",
            f"-DTV_CONV_MR={params.conv_mr or params.mr}")


def pack_panels(weight, nr: int, dtype="float32"):
    """The (units, in_dim) weight as ceil(units / nr) zero-padded panels of in_dim x nr, the layout
    ``tv_vgemm_packed_f32`` built for panel width ``nr`` reads (64-byte aligned, so that a panel row of
    16 floats is one cache line)."""
    import numpy as np

    dtype = np.dtype(dtype)
    weight = np.asarray(weight, dtype)
    units, in_dim = weight.shape
    panels = -(-units // nr)
    packed = aligned_zeros((panels, in_dim, nr), dtype)
    padded = np.zeros((panels * nr, in_dim), dtype)
    padded[:units] = weight
    packed[...] = padded.reshape(panels, nr, in_dim).transpose(0, 2, 1)
    return packed


def aligned_zeros(shape: tuple, dtype):
    """A zero array of ``shape`` whose data starts on a 64-byte boundary (a cache line)."""
    import numpy as np

    dtype = np.dtype(dtype)
    size = int(np.prod(shape)) * dtype.itemsize
    raw = np.zeros(size + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + size].view(dtype).reshape(shape)


def vgemm_library(params: GemmParams):
    """A library holding ``tv_vgemm_packed_f32`` (``tv_vgemm_call``) and its epilogue entry
    ``tv_gemm_packed_epi_f32`` (``tv_vgemm_epi_call``) for ``params`` alone (tests, benchmarks, calibration),
    built with the toolchain's flags (``-march=native``: a kernel wider than the machine's vectors is
    lowered to several native operations)."""
    from .build import build_library
    from .c_emit import library_text

    text = '#define TV_PACKED_KERNELS\n' + library_text(["tv_gemm.h"]) + (
        "int32_t tv_vgemm_call(int64_t m, int64_t n, int64_t k, const float* x, const float* packed, float* out) {\n"
        "  return tv_vgemm_packed_f32(m, n, k, x, packed, out);\n}\n"
        "int32_t tv_vgemm_epi_call(int64_t m, int64_t n, int64_t k, int64_t lanes, const float* x, const float* packed,\n"
        "    const float* col_bias, int64_t has_col_bias, const float* row_bias, int64_t has_row_bias,\n"
        "    const float* residual, int64_t has_residual, int64_t act, float alpha, float beta, float lo, float hi,\n"
        "    float* out) {\n"
        "  return tv_gemm_packed_epi_f32(m, n, k, lanes, x, packed, col_bias, has_col_bias, row_bias, has_row_bias,\n"
        "                                 residual, has_residual, act, alpha, beta, lo, hi, out);\n}\n")
    return build_library([(text, gemm_defines(params))])
