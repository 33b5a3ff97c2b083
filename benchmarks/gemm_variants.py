"""The packed float32 product's variants side by side: the kernel written once with vector extensions
(``tv_vgemm.h``) instantiated for each ISA of ``tensorvm.codegen.host`` (``vgemm-<isa>``; the host's is
what generated kernels call as ``tv_gemm_packed_f32``), NumPy's BLAS (``x @ w.T``) and ONNX Runtime (a MatMul with a constant weight),
at the product shapes of BERT-base (16 and 128 tokens), the MLP at batch 1 and 64 and the CNN's im2col
products.

    .venv/bin/python benchmarks/gemm_variants.py               # 1 thread
    .venv/bin/python benchmarks/gemm_variants.py --threads 2
    .venv/bin/python benchmarks/gemm_variants.py --quick
    .venv/bin/python benchmarks/gemm_variants.py --encoders --threads 2   # the corpus encoders' shapes
    .venv/bin/python benchmarks/gemm_variants.py --gpt2 --threads 2       # the corpus GPT-2's

Times are medians over rounds in which every variant runs once (interleaved), in microseconds; GFLOP/s
in brackets. The last column is what ``tensorvm.codegen.calibrate`` picks between this host's packed product
and BLAS for the shape's class (calibrated on first use, then cached per CPU). A variant wider than this machine's vectors (``vgemm-avx512`` on AVX2) is lowered by gcc to
several native operations: correct, listed for reference, not a measure of the AVX-512 machine.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SHAPES = [  # (label, m, n, k)
    ("bert-128 qkv/out", 128, 768, 768), ("bert-128 ffn1", 128, 3072, 768), ("bert-128 ffn2", 128, 768, 3072),
    ("bert-16 qkv/out", 16, 768, 768), ("bert-16 ffn1", 16, 3072, 768), ("bert-16 ffn2", 16, 768, 3072),
    ("mlp-b1 784-512", 1, 512, 784), ("mlp-b1 512-512", 1, 512, 512), ("mlp-b1 512-10", 1, 10, 512),
    ("mlp-b64 784-512", 64, 512, 784), ("mlp-b64 512-512", 64, 512, 512), ("mlp-b64 512-10", 64, 10, 512),
    ("cnn conv 32x288", 32, 1024, 288), ("cnn fc 64x3136", 1, 128, 3136),
]
# The corpus's encoders (hidden 256, feed-forward 1024) at 128 and 256 token rows (batch 1 x 128, 4 x 64)
ENCODER_SHAPES = [(f"enc-{m} {label}", m, n, k) for m in (128, 256)
                  for label, n, k in (("qkv/out", 256, 256), ("ffn1", 1024, 256), ("ffn2", 256, 1024))]

# GPT-2 of the corpus (hidden 128, feed-forward 512, vocabulary 50257): its LM head and its layers' products
# at 8, 64 and 128 token rows (batch 1 x 8, 1 x 64, 4 x 32)
GPT2_SHAPES = [(f"gpt2-{m} {label}", m, n, k) for m in (8, 64, 128)
               for label, n, k in (("qkv", 384, 128), ("ffn1", 512, 128), ("ffn2", 128, 512), ("lm head", 50257, 128))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--encoders", action="store_true", help="the corpus encoders' shapes instead")
    parser.add_argument("--gpt2", action="store_true", help="the corpus GPT-2's shapes instead")
    args = parser.parse_args()
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TENSORVM_NUM_THREADS"):
        os.environ[name] = str(args.threads)
    sys.path.insert(0, str(ROOT))
    import ctypes
    import time

    import numpy as np

    from tensorvm.codegen import host as hostmod

    desc = hostmod.host()
    print(f"host: {desc.model} ({desc.isa}, {desc.vector_bytes}-byte vectors, {desc.vector_registers} registers, "
          f"L1d {desc.l1d // 1024} KB, L2 {desc.l2 // 1024} KB); {args.threads} thread(s)")
    print(f"  kernels built here: {hostmod.width_why(desc)}")

    def signature(fn):
        fn.argtypes = [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 3
        fn.restype = ctypes.c_int32
        return fn

    variants = {}
    for isa in hostmod.ISAS:
        params = hostmod.gemm_params(hostmod.isa_host(isa, desc))
        lib = hostmod.vgemm_library(params)
        variants[f"vgemm-{isa}"] = (signature(lib.function("tv_vgemm_call", 3, 0)), params.nr)
        print(f"  vgemm-{isa}: {params}")

    try:
        import onnxruntime as ort
        from lone_layers import onnx_matmul
    except ImportError:
        ort = None

    def ort_session(w):
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        options.inter_op_num_threads = 1
        return ort.InferenceSession(onnx_matmul(w).SerializeToString(), options, providers=["CPUExecutionProvider"])

    rounds = 15 if args.quick else 60
    from tensorvm.codegen import calibrate

    names = list(variants) + ["numpy-blas"] + (["onnxruntime"] if ort else [])
    print(f"{'shape':<18} {'m':>4} {'n':>5} {'k':>5}  " + "".join(f"{n:>21}" for n in names) + "  calibrated")
    rng = np.random.default_rng(0)

    def row(label, m, n, k):
        x = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((n, k)).astype(np.float32)
        want = x.astype(np.float64) @ w.T.astype(np.float64)
        runs = {}
        for name, (fn, nr) in variants.items():
            packed = hostmod.pack_panels(w, nr)
            out = np.empty((m, n), np.float32)
            runs[name] = (lambda fn=fn, packed=packed, out=out: fn(m, n, k, x.ctypes.data, packed.ctypes.data,
                                                                    out.ctypes.data), out)
        blas_out = np.empty((m, n), np.float32)
        wt = w.T
        runs["numpy-blas"] = (lambda: np.matmul(x, wt, out=blas_out), blas_out)
        if ort:
            session = ort_session(w)
            holder = [None]

            def run_ort(session=session, holder=holder):
                holder[0] = session.run(None, {"x": x})[0]
            runs["onnxruntime"] = (run_ort, None)
        times = {name: [] for name in runs}
        for _ in range(rounds):
            for name, (run, _) in runs.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
        for name, (_, out) in runs.items():
            got = holder[0] if out is None else out
            error = float(np.abs(got - want).max() / max(1.0, np.abs(want).max()))
            if error > 1e-4:
                raise SystemExit(f"{name} at {label}: relative error {error}")
        cells = []
        for name in names:
            t = float(np.median(times[name]))
            cells.append(f"{t * 1e6:>10.1f} us ({2 * m * n * k / t / 1e9:>5.1f})")
        choice = calibrate.choose("dense", (m, n, k), {"packed": runs[f"vgemm-{desc.isa}"][0],
                                                       "blas": runs["numpy-blas"][0]})
        cells.append(f"  {choice.variant} ({choice.why}, {choice.shape_class})")
        print(f"{label:<18} {m:>4} {n:>5} {k:>5}  " + "".join(f"{c:>21}" for c in cells[:-1]) + cells[-1])


    for shape in ENCODER_SHAPES if args.encoders else GPT2_SHAPES if args.gpt2 else SHAPES:
        row(*shape)

if __name__ == "__main__":
    main()
