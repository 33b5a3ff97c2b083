"""Where a corpus model loses time against ONNX Runtime, kernel by kernel: tensorvm's VM profile and ONNX
Runtime's node profile of the same model and input in one process, each kernel's best over several
rounds, matched by (first input shape, output shape) (a fused group and the ONNX nodes it replaces read
and write the same arrays; ONNX Runtime's layout reorders are reported apart). Rows are ranked by the time
lost (tensorvm's minus the peer's); a row without a peer has nothing of that shape in ONNX Runtime's
profile. On a shared machine only the ranking and the ratios mean anything. tensorvm's times are native
mode's profile (``--exec-mode native``, the default): its calls place their intermediates in the
functions' arenas as plain calls do, with no Python between the kernels; its rows carry no shapes, so those
come from one profile of the bytecode VM. The bytecode VM's own profile (``--exec-mode bytecode``) runs the
function's generic code, whose intermediates come from the pooled allocator, not from the placed arena of
a plain call specialized to its shapes: its kernels read and write colder memory than in a plain call
(MobileNetV3-small's stem at batch 1: 256 us there, 187 in native mode's profile, 150-170 in plain calls
by perf). A row counts every call of its kernel.

    .venv/bin/python benchmarks/kernel_gap.py mobilenetv3 --batch 8 --rounds 10
    .venv/bin/python benchmarks/kernel_gap.py resnet18 --threads 2
    .venv/bin/python benchmarks/kernel_gap.py distilbert --batch 4 --tokens 64 --threads 2

The CNNs take ``--batch`` images; the encoders (distilbert, roberta, t5-encoder) ``--batch`` rows of
``--tokens`` tokens with the corpus's padding mask.

The ONNX files are the corpus's exports in the benchmark cache (``benchmarks/run.py`` makes them).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from compile_time import SHAPES, find_onnx  # noqa: E402
from models.text import ENCODERS  # noqa: E402

_REORDERS = ("ReorderInput", "ReorderOutput")


def _shapes(text: str) -> list:
    return [tuple(int(d) for d in dims.split(",")) if dims.strip() else () for dims in re.findall(r"\[([^\]]*)\]", text)]


def _peer_time(peer: dict, key):
    """ONNX Runtime's time for tensorvm's (input shape, output shape) ``key``: the same shapes, or, for an
    image, the shapes with the channels rounded up to its channel-blocked layout's block (16 with
    AVX-512, 8 with AVX2), as its convolutions report them."""
    if key is None or key in peer:
        return peer.get(key)
    for block in (16, 8):
        blocked = tuple(s[:1] + (-(-s[1] // block) * block,) + s[2:] if len(s) == 4 else s for s in key)
        if blocked in peer:
            return peer[blocked]
    return None


def tensorvm_kernels(vm, inputs: list, rounds: int, keys: dict | None = None) -> dict:
    """{kernel name: (calls, best total us, (first input shape, output shape) or None)}; ``keys`` gives the
    shapes of kernels whose rows carry none (native mode's), by name."""
    best: dict = {}
    for _ in range(rounds):
        for row in vm.profile("main", *inputs, warmup=1).rows:
            shapes = _shapes(str(row.arg_shapes[0])) if row.arg_shapes else []
            key = (shapes[0], shapes[-1]) if row.kind == "kernel" and len(shapes) >= 2 else (keys or {}).get(row.name)
            previous = best.get(row.name)
            if previous is None or row.total_us < previous[1]:
                best[row.name] = (row.calls, row.total_us, key)
    return best


def onnxruntime_nodes(path, feeds: dict, threads: int, rounds: int) -> tuple[dict, dict]:
    """({(first input shape, output shape): best us summed over the nodes}, {op type: best us})."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    for _ in range(rounds + 1):
        session.run(None, feeds)
    with open(session.end_profiling()) as f:
        events = [e for e in json.load(f) if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    times, meta = defaultdict(list), {}
    for event in events:
        args = event["args"]
        times[event["name"]].append(event["dur"])
        inputs = [tuple(next(iter(d.values()))) for d in args.get("input_type_shape", [])]
        outputs = [tuple(next(iter(d.values()))) for d in args.get("output_type_shape", [])]
        meta[event["name"]] = (args["op_name"], (inputs[0], outputs[0]) if inputs and outputs else None)
    by_shape, by_op = defaultdict(float), defaultdict(float)
    for name, durations in times.items():
        best = float(min(durations[1:] or durations))  # (the first run warms up)
        op, key = meta[name]
        by_op[op] += best
        if op not in _REORDERS and key is not None:
            by_shape[key] += best
    return by_shape, by_op


def model_feeds(model: str, batch: int, tokens: int) -> tuple[dict, dict]:
    """The import's shapes and the inputs of one call (an encoder: ``batch`` rows of ``tokens`` ids and the
    corpus's padding mask; a CNN: ``batch`` random images)."""
    if model in ENCODERS:
        from models.corpus import padding_mask, token_ids

        vocab = ENCODERS[model][3]
        return ({"input_ids": [None, None], "attention_mask": [None, None]},
                {"input_ids": token_ids(model, batch, tokens, vocab - 3) + 3,
                 "attention_mask": padding_mask(batch, tokens)})
    (name, dims), = SHAPES[model].items()
    x = np.random.default_rng(0).standard_normal([batch if d is None else d for d in dims]).astype(np.float32)
    return SHAPES[model], {name: x}


def corpus_model(model: str, batch: int, tokens: int, threads: int, onnx_dir: str | None = None):
    """(ONNX path, module, params, one call's inputs by name) of a corpus model's export, tensorvm's thread
    count set; None, said on stdout, when the benchmark cache has no export of it."""
    path = find_onnx(model, onnx_dir)
    if path is None:
        print(f"no ONNX export of {model}: run benchmarks/run.py --models {model} first")
        return None

    from models.common import import_from_onnx

    import tensorvm as tv

    tv.set_num_threads(threads)
    shape, feeds = model_feeds(model, batch, tokens)
    mod, params = import_from_onnx(path, shape=shape)
    return path, mod, params, feeds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default="mobilenetv3", choices=sorted(SHAPES) + sorted(ENCODERS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=64, help="tokens per row (the encoders)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--rows", type=int, default=25)
    parser.add_argument("--onnx-dir")
    parser.add_argument("--exec-mode", default="native", choices=["native", "bytecode"],
                        help="whose profile gives tensorvm's times (see above)")
    args = parser.parse_args()
    loaded = corpus_model(args.model, args.batch, args.tokens, args.threads, args.onnx_dir)
    if loaded is None:
        return 1
    path, mod, params, feeds = loaded

    import tensorvm as tv

    inputs = [feeds[p.name_hint] for p in mod["main"].params]
    bytecode = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params, exec_mode="bytecode"))
    if args.exec_mode == "native":
        keys = {name: key for name, (_, _, key) in tensorvm_kernels(bytecode, inputs, 1).items()}
        native = tv.vm.VirtualMachine(tv.vm.compile(mod, target="c", params=params, exec_mode="native"))
        kernels = tensorvm_kernels(native, inputs, args.rounds, keys)
    else:
        kernels = tensorvm_kernels(bytecode, inputs, args.rounds)
    peer, ops = onnxruntime_nodes(path, feeds, args.threads, args.rounds)

    groups: dict = defaultdict(lambda: [0.0, 0, []])
    for name, (calls, us, key) in kernels.items():
        group = groups[key if key is not None else ("vm", name)]
        group[0] += us
        group[1] += calls
        group[2].append(name.replace("fused_nn_", "").replace("fused_", ""))
    rows = sorted(((us, _peer_time(peer, key), key, names) for key, (us, _, names) in groups.items()),
                  key=lambda r: -(r[0] - (r[1] or 0.0)))
    total, reorders = sum(us for _, us, _ in kernels.values()), sum(ops.get(op, 0.0) for op in _REORDERS)
    print(f"{args.model}, batch {args.batch}{f' x {args.tokens} tokens' if args.model in ENCODERS else ''}, {args.threads} thread(s), best of {args.rounds}: tensorvm kernels "
          f"{total:,.0f} us, ONNX Runtime nodes {sum(ops.values()):,.0f} us (its reorders {reorders:,.0f})")
    print(f"{'tensorvm kernels (same input and output shapes)':60s} {'tensorvm':>9s} {'peer':>9s} {'lost':>9s}  shapes")
    for us, peer_us, key, names in rows[:args.rows]:
        lost = us - (peer_us or 0.0)
        peer_text = f"{peer_us:9.0f}" if peer_us is not None else f"{'-':>9s}"
        shapes = f"{key[0]} -> {key[1]}" if key[0] != "vm" else ""
        print(f"{'+'.join(names)[:60]:60s} {us:9.0f} {peer_text} {lost:9.0f}  {shapes}")
    print("ONNX Runtime by op (us): " + ", ".join(f"{op} {us:,.0f}" for op, us in sorted(ops.items(), key=lambda kv: -kv[1])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
