"""The ``tensorvm`` command: compile a model to an executable file, run it, inspect it, benchmark it.

    tensorvm compile model.onnx -o model.tvx [--target c|python] [--shape input=1,?,128] [--threads N]
    tensorvm run model.tvx --input x=x.npy [--output out.npz] [--function main]
    tensorvm inspect model.tvx [--bytecode] [--kernels]
    tensorvm bench model.tvx --input x=x.npy [--repeat 20] [--warmup 3] [--function main]
    tensorvm ops [--missing]

``ops`` reports the parts of every registered operator (see docs/ops.md). ``compile`` reads ONNX
(``.onnx``) or Relay text (any other file). Inputs are ``.npy`` files (or
``name=file.npz`` holding an array of that name). Progress goes to stderr; an error is one line
``tensorvm: error: ...`` and a non-zero exit status, never a traceback. ``--threads N`` (every command)
sets the thread budget of the kernels and BLAS (``tv.set_num_threads``; default: the cores the process may
use). ``compile``'s default target is "c" when a C compiler is found, else "python".
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import numpy as np

__all__ = ["main"]


class CliError(Exception):
    """A user-facing error: printed as one line, exit status 1."""


# ---- progress ------------------------------------------------------------------------------------------


class Progress:
    """Stage lines on stderr (``[  1.2s] importing ...``); on a terminal, a ticking clock while a stage runs."""

    def __init__(self, enabled: bool = True, stream=None):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        self._stage = None
        self._stop = threading.Event()
        self._thread = None

    def _elapsed(self) -> str:
        return f"[{time.perf_counter() - self.start:6.1f}s]"

    def stage(self, text: str) -> None:
        self.done()
        if not self.enabled:
            return
        self._stage = text
        self.stream.write(f"{self._elapsed()} {text}\n")
        self.stream.flush()
        if self.stream.isatty():
            self._stop.clear()
            self._thread = threading.Thread(target=self._tick, daemon=True)
            self._thread.start()

    def note(self, text: str) -> None:
        if self.enabled:
            self.stream.write(f"{self._elapsed()}   {text}\n")
            self.stream.flush()

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            self.stream.write(f"\r{self._elapsed()} {self._stage} ...")
            self.stream.flush()

    def done(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.stream.write("\r\033[K")
            self.stream.flush()


# ---- argument parsing helpers ---------------------------------------------------------------------------


def parse_shape(spec: str) -> tuple[str, list]:
    """``name=1,?,128`` -> ``("name", [1, Any(), 128])``; a name (``seq``) is a symbolic dim."""
    from .ir.types import Any, SymDim

    name, sep, dims = spec.partition("=")
    if not sep or not name:
        raise CliError(f"--shape expects name=d1,d2,... (e.g. input=1,?,128), got {spec!r}")
    out = []
    for text in filter(None, (d.strip() for d in dims.split(","))):
        if text in ("?", "-1"):
            out.append(Any())
        elif text.isdigit():
            out.append(int(text))
        elif text.isidentifier():
            out.append(SymDim(text))
        else:
            raise CliError(f"--shape {name}: a dim must be an integer, '?' or a name, got {text!r}")
    return name, out


def load_inputs(specs: list[str], param_names: list[str], function: str = "main") -> list[np.ndarray]:
    """The arrays for ``function``'s parameters, in order, from ``name=file.npy`` (or ``file.npz``) specs;
    arrays of another byte order are converted to the machine's."""
    given: dict[str, np.ndarray] = {}
    given_by: dict[str, str] = {}

    def give(name: str, array: np.ndarray, spec: str) -> None:
        # a second value for a parameter is a mistake on the command line, not an override
        if name in given:
            raise CliError(f"--input {spec}: {name!r} is already given by --input {given_by[name]}; "
                           f"expected one --input per parameter")
        given[name] = array if array.dtype.isnative else array.astype(array.dtype.newbyteorder("="))
        given_by[name] = spec

    for spec in specs or []:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = "", spec
        if not os.path.exists(path):
            raise CliError(f"--input {spec}: no such file {path!r}")
        try:
            if path.endswith(".npz"):
                with np.load(path, allow_pickle=False) as archive:
                    if name:
                        if name not in archive:
                            raise CliError(f"--input {spec}: {path} holds {sorted(archive)}, not {name!r}")
                        give(name, archive[name], spec)
                    else:
                        for key in archive:
                            give(key, archive[key], spec)
            else:
                if not name:
                    raise CliError(f"--input {spec}: name the parameter (name=file.npy)")
                give(name, np.load(path, allow_pickle=False), spec)
        except (OSError, ValueError) as err:
            raise CliError(f"--input {spec}: cannot read {path}: {err}") from None
    unknown = sorted(set(given) - set(param_names))
    if unknown:
        raise CliError(f"unknown input(s) {', '.join(unknown)}; {function} takes "
                       f"{', '.join(param_names) or 'nothing'}")
    missing = [p for p in param_names if p not in given]
    if missing:
        raise CliError(f"missing input(s) {', '.join(missing)}; give --input name=file.npy for each")
    return [given[p] for p in param_names]


def _outputs(value) -> list[np.ndarray]:
    from .runtime.object import ADT

    if isinstance(value, (tuple, list)):
        return [a for v in value for a in _outputs(v)]
    if isinstance(value, ADT):
        return [a for v in value.fields for a in _outputs(v)]
    return [np.asarray(value.numpy() if hasattr(value, "numpy") else value)]


def _param_names(exe, function: str = "main") -> list[str]:
    try:
        return [str(p) for p in exe.get_function_params(function)]
    except KeyError as err:
        raise CliError(f"--function {function}: {err.args[0]}") from None


def _load_exe(path: str):
    from .op import onnx_ops  # noqa: F401 - kernels of imported models may use these ops
    from .vm import load_executable

    if not os.path.exists(path):
        raise CliError(f"no such file {path!r}")
    return load_executable(path)


# ---- commands -------------------------------------------------------------------------------------------


def cmd_compile(args, progress: Progress) -> int:
    from . import vm

    if not os.path.exists(args.model):
        raise CliError(f"no such file {args.model!r}")
    shapes = dict(parse_shape(s) for s in args.shape or [])
    params = None
    if args.model.endswith(".onnx"):
        from .frontend.onnx_importer import from_onnx

        progress.stage(f"importing {args.model}")
        mod, params = from_onnx(args.model, shape=shapes or None, progress=progress.note)
    else:
        if shapes:
            raise CliError("--shape applies to ONNX models only")
        from .parser import parse

        progress.stage(f"parsing {args.model}")
        with open(args.model, "rb") as f:
            data = f.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise CliError(f"{args.model}: expected Relay text or an ONNX model (named .onnx), but the file is "
                           f"not text; it starts with {data[:16]!r}") from None
        mod = parse(text)
    if args.target is None:
        from .codegen.build import default_target, default_target_reason

        args.target = default_target()
        progress.stage(f"target {args.target!r} by default ({default_target_reason()})")
    progress.stage(f"compiling for target {args.target!r} (opt level {args.opt_level})")
    exe = vm.compile(mod, target=args.target, params=params, opt_level=args.opt_level, exec_mode=args.exec_mode)
    output = args.output or os.path.splitext(args.model)[0] + ".tvx"
    progress.stage(f"saving {output}")
    exe.save(output)
    progress.done()
    stats = exe.stats()
    print(f"wrote {output}: {stats['num_functions']} function(s), {stats['num_instructions']} instructions, "
          f"{stats['num_kernels']} kernels, {stats['num_constants']} constants ({stats['constant_bytes']} bytes), "
          f"target {args.target}, exec mode {exe.exec_mode}")
    return 0


def cmd_run(args, progress: Progress) -> int:
    from .vm import VirtualMachine

    exe = _load_exe(args.executable)
    inputs = load_inputs(args.input, _param_names(exe, args.function), args.function)
    result = VirtualMachine(exe).invoke(args.function, *inputs)
    outputs = _outputs(result)
    np.set_printoptions(threshold=20, edgeitems=3)
    for i, out in enumerate(outputs):
        print(f"output {i}: shape {tuple(out.shape)} {out.dtype}")
        print("  " + np.array2string(out, prefix="  "))
    if args.output:
        # np.savez adds ".npz" to a name without it: report the file it really wrote
        path = args.output if args.output.endswith(".npz") else args.output + ".npz"
        np.savez(path, **{f"output_{i}": out for i, out in enumerate(outputs)})
        print(f"wrote {path}")
    return 0


def cmd_inspect(args, progress: Progress) -> int:
    exe = _load_exe(args.executable)
    print(f"executable {args.executable} (target {getattr(exe, 'target', '?')})")
    print(f"main({', '.join(_param_names(exe))})")
    print(str(exe.stats()))
    if args.bytecode or args.kernels:
        print()
        print(exe.as_text(kernels=args.kernels))
    return 0


def cmd_bench(args, progress: Progress) -> int:
    from .vm import VirtualMachine

    exe = _load_exe(args.executable)
    inputs = load_inputs(args.input, _param_names(exe, args.function), args.function)
    vm = VirtualMachine(exe)
    for _ in range(args.warmup):
        vm.invoke(args.function, *inputs)
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        vm.invoke(args.function, *inputs)
        times.append(time.perf_counter() - start)
    ms = np.array(times) * 1e3
    print(f"{args.repeat} runs after {args.warmup} warm-up: mean {ms.mean():.3f} ms, median {np.median(ms):.3f} ms, "
          f"min {ms.min():.3f} ms, max {ms.max():.3f} ms, std {ms.std():.3f} ms")
    return 0


def op_parts(opdef) -> dict:
    """The report's columns for one op: how it is computed, its shape function (Python; compiled to C:
    yes, no or n.a. for an op the VM never runs, ``op.shape_coverage``), strategy and file; ``why``: the
    reason of a C shape function's "no" or "n.a."."""
    from .op.shape_coverage import c_shape_function

    if opdef.kind == "dialect":
        compute = "dialect"
    elif opdef.compute is not None:
        compute = "te"
    elif opdef.library is not None:
        compute = "library"
    elif opdef.legalize is not None:
        compute = "legalize"
    else:
        compute = "MISSING"
    c_shape, why = c_shape_function(opdef)
    return {"op": opdef.name, "pattern": opdef.pattern.name.lower(), "compute": compute,
            "shape_func": "python" if opdef.shape_func is not None else "none",
            "c_shape_func": c_shape, "why": why,
            "strategy": "yes" if opdef.strategy is not None else "no",
            "file": opdef.defined_in.replace(".", "/") + ".py" if opdef.defined_in else "?"}


def cmd_ops(args, progress: Progress) -> int:
    from .op import get_op, op_names

    rows = [op_parts(get_op(name)) for name in op_names()]
    shown = [r for r in rows if r["compute"] == "MISSING"] if args.missing else rows
    columns = ["op", "pattern", "compute", "shape_func", "c_shape_func", "strategy", "file"]
    widths = {c: max(len(c), *(len(r[c]) for r in shown)) if shown else len(c) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns).rstrip())
    for r in shown:
        line = "  ".join(r[c].ljust(widths[c]) for c in columns).rstrip()
        print(f"{line}  ({r['why']})" if args.why and r["why"] else line)

    def count(column, value):
        return sum(r[column] == value for r in rows)

    print(f"{len(rows)} ops: compute te {count('compute', 'te')}, library {count('compute', 'library')}, "
          f"legalize {count('compute', 'legalize')}, dialect {count('compute', 'dialect')}, "
          f"MISSING {count('compute', 'MISSING')}; shape function python {count('shape_func', 'python')}, "
          f"none {count('shape_func', 'none')}; C shape function {count('c_shape_func', 'yes')}, "
          f"no {count('c_shape_func', 'no')}, n.a. {count('c_shape_func', 'n.a.')}; strategy {count('strategy', 'yes')}")
    return 0


def _positive_count(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return int(text)


def _non_negative_count(text: str) -> int:
    if not text.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tensorvm", description="Compile and run dynamic ML models.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                        help="no progress lines on stderr")
    common.add_argument("--threads", type=_positive_count, metavar="N",
                        help="threads for kernels and BLAS (default: the cores this process may use)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compile", parents=[common], help="compile an ONNX model (or Relay text) to an executable file")
    p.add_argument("model")
    p.add_argument("-o", "--output", help="the executable to write (default: the model's name with .tvx)")
    p.add_argument("--target", choices=("python", "c"), default=None,
                   help='kernels in generated C or NumPy (default: "c" when a C compiler is found)')
    p.add_argument("--shape", action="append", metavar="NAME=D1,D2,...",
                   help="override an input's shape: ints, ? for unknown, a name for a symbolic dim")
    p.add_argument("--opt-level", type=int, default=3)
    p.add_argument("--exec-mode", choices=("auto", "bytecode", "native", "compiled"), default="auto",
                   help='how the VM runs the program (default "auto": native on target c for a program with '
                        'control flow, else the bytecode loop)')
    p.set_defaults(run=cmd_compile)

    p = sub.add_parser("run", parents=[common], help="run an executable on inputs from .npy/.npz files")
    p.add_argument("executable")
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy")
    p.add_argument("--output", help="write the outputs to this .npz file")
    p.add_argument("--function", default="main")
    p.set_defaults(run=cmd_run)

    p = sub.add_parser("inspect", parents=[common], help="show an executable's statistics, bytecode and kernels")
    p.add_argument("executable")
    p.add_argument("--bytecode", action="store_true", help="also list the bytecode and tables")
    p.add_argument("--kernels", action="store_true", help="also print every kernel's source")
    p.set_defaults(run=cmd_inspect)

    p = sub.add_parser("bench", parents=[common], help="time an executable on given inputs")
    p.add_argument("executable")
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy")
    p.add_argument("--repeat", type=_positive_count, default=20, metavar="N", help="timed runs (at least 1)")
    p.add_argument("--warmup", type=_non_negative_count, default=3, metavar="N", help="untimed runs first (0 or more)")
    p.add_argument("--function", default="main")
    p.set_defaults(run=cmd_bench)

    p = sub.add_parser("ops", parents=[common], help="report every operator's parts (compute, shape function and its C form, strategy)")
    p.add_argument("--missing", action="store_true", help="list only the ops without a compute or library call")
    p.add_argument("--why", action="store_true", help="say why an op has no C shape function (or needs none)")
    p.set_defaults(run=cmd_ops)
    return parser


def main(argv: list[str] | None = None) -> int:
    from .errors import TensorVMError

    parser = build_parser()
    args = parser.parse_args(argv)
    progress = Progress(enabled=not args.quiet)
    try:
        if getattr(args, "threads", None) is not None:
            from .codegen.build import set_num_threads

            set_num_threads(args.threads)
        return args.run(args, progress)
    except (CliError, TensorVMError, OSError, ValueError, TypeError, KeyError) as err:
        progress.done()
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if isinstance(err, TensorVMError):
            message = f"{type(err).__name__}: {message}"
        print(f"tensorvm: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        progress.done()
        print("tensorvm: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
