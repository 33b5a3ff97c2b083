"""What every benchmark model shares: cases, runtime descriptions, and the runners that execute a model.

A ``ModelGroup`` is one benchmarked model (LSTM, BERT-base, ...): its cases (sequence lengths, batch
sizes), the runtimes that run it (tensorvm variants and peers), which runtime is the correctness
reference, and an optional ``prepare`` step that writes artifacts (ONNX exports, PyTorch weights) once.

A runner lives in a worker process of its own (see ``harness.py``). ``setup()`` builds the model
(compiles it, for tensorvm) and returns facts about that; ``call(case)`` returns a zero-argument
callable that runs the case once with prebuilt inputs (so timing covers the runtime, not input
generation) and returns the raw result; ``outputs(raw)`` flattens that result into NumPy arrays for
the correctness check. Heavy imports (tensorvm, torch, onnxruntime) happen only inside runners, so
a worker's resident memory counts only the runtime it measures.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

TENSORVM, PEER = "tensorvm", "peer"


@dataclass(frozen=True)
class Case:
    """One measured input configuration. ``units`` is what latency is divided by (tokens, nodes, 1)."""

    name: str
    label: str
    units: int
    x: int | None = None  # the chart's x value (sequence length), when there is one


@dataclass(frozen=True)
class RuntimeSpec:
    """A way to run a model. ``make(group, ctx)`` builds the runner inside the worker process."""

    key: str
    label: str
    family: str  # TENSORVM or PEER
    make: Callable

    def label_for(self, info: dict) -> str:
        """The row's name for what ran: a VM in exec mode "compiled" on target "c" ran native mode
        (``info["exec_mode"]``, set by ``TensorVMRunner``), so its row says "native"; after a fall back
        to target "python" it says "compiled"."""
        if info.get("exec_mode") == "native" and self.label.endswith(" compiled"):
            return self.label.removesuffix(" compiled") + " native"
        return self.label


@dataclass(frozen=True)
class ModelGroup:
    """One benchmarked model with its cases and runtimes."""

    key: str
    title: str
    unit: str  # "token", "node" or "inference": latency is reported per this
    cases: tuple[Case, ...]
    runtimes: tuple[RuntimeSpec, ...]
    reference: str  # the runtime key whose outputs the others are checked against
    atol: float
    rtol: float
    prepare: Callable[[Path], None] | None = None  # writes artifacts into a directory (in a torch process)
    artifact_key: str = ""  # what the artifacts depend on (part of the cache directory's name)
    description: str = ""
    show_per_inference: bool = False  # also report ms per inference (BERT)
    #: seconds one runtime may spend on this model per thread count (setup, checks, timing); a runtime
    #: over it is killed with its children and its row says "timeout" with where it was
    budget_s: float = math.inf
    corpus: bool = False  # a model of the real-model corpus (ONNX exports of PyTorch models)
    #: ``align(got, ref, atol, rtol)``: ``got``'s outputs put in ``ref``'s order before the check
    #: (detections whose scores tie may come in either order)
    align: Callable | None = None

    def runtime(self, key: str) -> RuntimeSpec:
        for spec in self.runtimes:
            if spec.key == key:
                return spec
        raise KeyError(f"model {self.key} has no runtime {key!r}; it has {[r.key for r in self.runtimes]}")

    def case(self, name: str) -> Case:
        for case in self.cases:
            if case.name == name:
                return case
        raise KeyError(f"model {self.key} has no case {name!r}")


class NotAvailable(Exception):
    """A runtime that cannot run here (a tensorvm feature not built yet, a missing package)."""


def flatten_outputs(value) -> list[np.ndarray]:
    """Arrays of a result in order: tensors, tuples/lists and ADT fields, recursively."""
    if isinstance(value, np.ndarray):
        return [value]
    if hasattr(value, "numpy") and callable(value.numpy):  # tv.NDArray, torch.Tensor
        return [np.asarray(value.detach().numpy() if hasattr(value, "detach") else value.numpy())]
    if hasattr(value, "fields"):  # tv.ADT
        return flatten_outputs(tuple(value.fields))
    if isinstance(value, (tuple, list)):
        out = []
        for item in value:
            out.extend(flatten_outputs(item))
        return out
    return [np.asarray(value)]


# --- tensorvm --------------------------------------------------------------------------------------
def _short(err: Exception) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text if len(text) <= 120 else text[:117] + "..."


def not_built(err: Exception) -> bool:
    """Whether ``err`` says a tensorvm feature is missing (rather than broken)."""
    from tensorvm.errors import UnsupportedError

    return isinstance(err, (UnsupportedError, ModuleNotFoundError)) or (
        isinstance(err, AttributeError) and "tensorvm" in str(err))


def _c_build_stats() -> dict:
    """What compiling C cost in this process so far (empty when the C back end is absent)."""
    try:
        from tensorvm.codegen.build import build_stats
    except ImportError:
        return {}
    try:
        return dict(build_stats())
    except Exception:  # a stats helper must never fail the benchmark
        return {}


def executable_summary(exe) -> dict:
    """What ``exe.stats()`` says of a VM executable, short enough for the report: kernel counts, the
    kernels that fell back to NumPy on target "c" (with why), instruction counts, C source size, the
    kernel variants compiled and the host instances of the product and convolution kernels."""
    try:
        stats = exe.stats()
    except Exception as err:  # a stats helper must never fail the benchmark
        return {"error": _short(err)}
    library = stats.get("kernel_library") or {}
    fallbacks = library.get("numpy_fallbacks", {})
    return {
        "kernels": stats["num_kernels"],
        "c_kernels": len(library.get("c_kernels", ())),
        "numpy_fallbacks": {name: str(why)[:200] for name, why in fallbacks.items()},
        "instructions": stats["num_instructions"],
        "top_opcodes": dict(list(stats["instructions_by_opcode"].items())[:6]),
        "c_source_bytes": library.get("source_bytes"),
        "kernel_variants": library.get("variants", {}),  # e.g. convolutions: direct / blas (im2col + product)
        "product_kernels": stats.get("product_kernels", {}),  # the host's instances (tiles) and why
        "c_compile_s": library.get("compile_seconds"),
    }


class TensorVMRunner:
    """Runs a model with tensorvm: ``executor`` is ``"vm"`` (exec mode bytecode or compiled), ``"graph"``
    or ``"aot"``. Target "c" is tried first; when it is not available the runner falls back to
    "python" and says so in ``info["target"]``.

    ``build()`` returns ``(mod, params)`` (the IR, or an ONNX import); ``make_args(case, mod)`` returns
    the argument tuples of one measured call (several for a batch of trees)."""

    def __init__(self, build: Callable, make_args: Callable, executor: str = "vm",
                 exec_mode: str = "bytecode", targets: Sequence[str] = ("c", "python"),
                 compile_twice: bool = True):
        self.build, self.make_args = build, make_args
        self.executor, self.exec_mode, self.targets = executor, exec_mode, tuple(targets)
        self.compile_twice = compile_twice
        self.vm = None
        self.function = None
        self.mod = None
        self.arguments: dict = {}  # case name -> the argument tuples of one measured call

    def _compile(self, target: str):
        import tensorvm as tv

        if self.executor == "vm":
            exe = tv.vm.compile(self.mod, target=target, params=self.params or None, exec_mode=self.exec_mode)
            return exe
        executor = tv.create_executor(self.executor, self.mod, target=target, params=self.params or None)
        return executor.evaluate()

    def setup(self) -> dict:
        import tensorvm  # noqa: F401 - imported here so import time is not counted as build time

        info: dict = {}
        start = time.perf_counter()
        try:
            self.mod, self.params = self.build()
        except Exception as err:
            if not_built(err):
                raise NotAvailable(f"import/build: {_short(err)}") from err
            raise
        info["build_s"] = time.perf_counter() - start
        notes = []
        built = None
        for target in self.targets:
            start = time.perf_counter()
            try:
                built = self._compile(target)
            except Exception as err:
                if not_built(err):
                    notes.append(f"target {target}: {_short(err)}")
                    continue
                raise
            info["compile_cold_s"] = time.perf_counter() - start
            info["target"] = target
            break
        if built is None:
            raise NotAvailable("; ".join(notes) or "no target")
        if self.executor == "vm":
            info["exe"] = executable_summary(built)
        c_stats = _c_build_stats()
        if c_stats:
            info["c_compiler_s"] = c_stats.get("compile_seconds")
        if self.compile_twice:  # a freshly built module (no in-memory reuse), kernel libraries cached on disk
            built = self.mod = self.params = None  # (the first build's weights are not kept alive meanwhile)
            gc.collect()
            self.mod, self.params = self.build()
            start = time.perf_counter()
            built = self._compile(info["target"])
            info["compile_cached_s"] = time.perf_counter() - start
        if notes:
            info["fallback"] = "; ".join(notes)
        if self.executor == "vm":  # what ran: exec mode "compiled" is native mode on target c
            info["exec_mode"] = built.exec_mode
        self.info = info
        if self.executor == "vm":
            import tensorvm as tv

            self.vm = tv.vm.VirtualMachine(built)
        else:
            self.function = built
        return info

    def fall_back(self, err: Exception) -> dict | None:
        """After ``err`` at run time with target "c": recompile for the next target (the row then says
        so); returns the updated info, or None when there is no other target to try."""
        targets = self.targets
        current = self.info.get("target")
        if current not in targets or targets.index(current) + 1 >= len(targets):
            return None
        target = targets[targets.index(current) + 1]
        if self.mod is None:  # released by ready()
            self.mod, self.params = self.build()
        built = self._compile(target)
        note = f"target {current} failed at run time: {_short(err)}"
        self.info["fallback"] = "; ".join(filter(None, [self.info.get("fallback"), note]))
        self.info["target"] = target
        if self.executor == "vm":
            self.info["exec_mode"] = built.exec_mode
        self.info["runtime_fallback"] = True
        if self.executor == "vm":
            import tensorvm as tv

            self.vm = tv.vm.VirtualMachine(built)
        else:
            self.function = built
        return self.info

    def _arguments(self, case: Case) -> list:
        if case.name not in self.arguments:
            self.arguments[case.name] = self.make_args(case, self.mod)
        return self.arguments[case.name]

    def ready(self) -> None:
        """Setup is over (every case's call made): the IR and its weights go, as in a deployment that
        keeps only the executable; the peak RSS still counts them from import and compile."""
        self.mod = self.params = None
        gc.collect()

    def call(self, case: Case) -> Callable:
        arg_lists = self._arguments(case)
        if self.vm is not None:
            invoke = self.vm.invoke
            return lambda: [invoke("main", *args) for args in arg_lists]
        function = self.function
        return lambda: [function(*args) for args in arg_lists]

    def outputs(self, raw) -> list[np.ndarray]:
        return flatten_outputs(raw)

    def profile(self, case: Case, top: int = 8) -> dict | None:
        """The VM profile of one call of ``case``: the top rows and the dispatch share."""
        if self.vm is None:
            return None
        arg_lists = self._arguments(case)
        rows: dict[str, list] = {}
        total_us = 0.0
        for args in arg_lists:
            report = self.vm.profile("main", *args, warmup=0)
            total_us += report.total_us
            for row in report.rows:
                entry = rows.setdefault(row.name, [row.kind, 0, 0.0, ""])
                entry[1] += row.calls
                entry[2] += row.total_us
                shapes = getattr(row, "arg_shapes", ())
                entry[3] = entry[3] or (shapes[0] if shapes else "")
        measured_us = sum(v[2] for v in rows.values())
        ordered = sorted(rows.items(), key=lambda kv: -kv[1][2])
        return {
            "total_us": total_us,
            "kernel_us": sum(v[2] for v in rows.values() if v[0] == "kernel"),
            "vm_op_us": sum(v[2] for v in rows.values() if v[0] != "kernel"),
            "other_us": max(total_us - measured_us, 0.0),
            "rows": [{"name": k, "kind": v[0], "calls": v[1], "total_us": v[2], "shape": v[3]}
                     for k, v in ordered[:top]],
            "num_rows": len(rows),
        }


# --- PyTorch ---------------------------------------------------------------------------------------
_TORCH_THREADS: list[int] = []


def import_torch(threads: int):
    """``torch`` with intra-op threads pinned to ``threads`` and one inter-op thread (set once)."""
    import torch

    if not _TORCH_THREADS:
        torch.set_num_threads(threads)
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already started; only the intra-op count matters for these models
            pass
        _TORCH_THREADS.append(threads)
    return torch


class TorchRunner:
    """Runs a PyTorch callable under ``inference_mode``. ``build(torch)`` returns the callable;
    ``make_args(case, torch)`` the argument tuples of one measured call."""

    def __init__(self, build: Callable, make_args: Callable, threads: int):
        self.build_fn, self.make_args, self.threads = build, make_args, threads

    def setup(self) -> dict:
        self.torch = import_torch(self.threads)
        start = time.perf_counter()
        with self.torch.inference_mode():
            self.module = self.build_fn(self.torch)
        return {"build_s": time.perf_counter() - start, "torch": self.torch.__version__}

    def call(self, case: Case) -> Callable:
        torch, module = self.torch, self.module
        arg_lists = self.make_args(case, torch)

        def run():
            with torch.inference_mode():
                return [module(*args) for args in arg_lists]
        return run

    def outputs(self, raw) -> list[np.ndarray]:
        return flatten_outputs(raw)

    def profile(self, case: Case) -> None:
        return None


# --- ONNX Runtime ----------------------------------------------------------------------------------
class OrtRunner:
    """Runs an ONNX file with ONNX Runtime (CPU), ``intra_op_num_threads`` pinned, one inter-op thread.
    ``make_feeds(case)`` returns the input dicts of one measured call."""

    def __init__(self, path: Path, make_feeds: Callable, threads: int):
        self.path, self.make_feeds, self.threads = Path(path), make_feeds, threads

    def setup(self) -> dict:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        start = time.perf_counter()
        self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        return {"build_s": time.perf_counter() - start, "onnxruntime": ort.__version__}

    def call(self, case: Case) -> Callable:
        session, feeds = self.session, self.make_feeds(case)
        return lambda: [session.run(None, feed) for feed in feeds]

    def outputs(self, raw) -> list[np.ndarray]:
        return flatten_outputs(raw)

    def profile(self, case: Case) -> None:
        return None


# --- helpers for model definitions -----------------------------------------------------------------
def rng_for(*parts) -> np.random.Generator:
    """A generator seeded by ``parts`` (strings and ints), so every process draws the same numbers."""
    seed = [sum(ord(ch) * (i + 1) for i, ch in enumerate(p)) if isinstance(p, str) else int(p) for p in parts]
    return np.random.default_rng(seed)


def uniform(rng: np.random.Generator, shape, scale: float) -> np.ndarray:
    """float32 values uniform in [-scale, scale] (PyTorch's default init range for linear layers)."""
    return rng.uniform(-scale, scale, size=shape).astype(np.float32)


def import_from_onnx(path: Path, shape: dict | None = None):
    """``tv.frontend.from_onnx`` of the file at ``path``: ``(mod, params)``."""
    import onnx

    import tensorvm as tv

    frontend = getattr(tv, "frontend", None)
    if frontend is None:
        import importlib

        frontend = importlib.import_module("tensorvm.frontend")
    model = onnx.load(str(path))
    return frontend.from_onnx(model, shape=shape)


@dataclass
class Artifacts:
    """Where a group's prepared files are (set by the harness in the worker's context)."""

    directory: Path
    files: dict = field(default_factory=dict)


def static_runtimes(build_ir: Callable, inputs: Callable, build_torch: Callable, onnx_file: str,
                    input_name: str) -> tuple[RuntimeSpec, ...]:
    """The runtimes of a static model: tensorvm's VM (bytecode and compiled), graph executor and AOT
    on the IR, PyTorch eager, and ONNX Runtime on the export in ``onnx_file``.

    ``inputs(case)`` returns the model's one input array; ``build_torch(torch)`` the PyTorch module."""
    def tvm_args(case, mod):
        return [(inputs(case),)]

    def torch_args(case, torch):
        return [(torch.from_numpy(inputs(case)),)]

    def tvm(executor, exec_mode="bytecode"):
        return lambda grp, ctx: TensorVMRunner(build_ir, tvm_args, executor=executor, exec_mode=exec_mode)

    return (
        RuntimeSpec("tvm-vm", "tensorvm VM", TENSORVM, tvm("vm")),
        RuntimeSpec("tvm-vm-compiled", "tensorvm VM compiled", TENSORVM, tvm("vm", "compiled")),
        RuntimeSpec("tvm-graph", "tensorvm graph executor", TENSORVM, tvm("graph")),
        RuntimeSpec("tvm-aot", "tensorvm AOT", TENSORVM, tvm("aot")),
        RuntimeSpec("torch", "PyTorch eager", PEER,
                    lambda grp, ctx: TorchRunner(build_torch, torch_args, ctx["threads"])),
        RuntimeSpec("ort", "ONNX Runtime", PEER,
                    lambda grp, ctx: OrtRunner(ctx["artifacts"] / onnx_file,
                                               lambda case: [{input_name: inputs(case)}], ctx["threads"])),
    )


def export_static_onnx(module, example: np.ndarray, path: Path, input_name: str) -> None:
    """ONNX export (fixed shapes) of a PyTorch module with one input."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.from_numpy(example),), str(path), input_names=[input_name],
                          output_names=["out"], opset_version=17, dynamo=False)
