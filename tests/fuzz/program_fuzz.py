"""The differential runner: a generated program (``program_gen.Case``) on the interpreter and on every
executor that accepts it, compared call by call.

``run_case(case)`` parses and type-checks the program, makes the inputs of several *shape sets* (the
program's dim variables drawn anew for each; a static program has one), and calls the interpreter (the
oracle) and each executor ``CALLS_PER_SET`` times per set with fresh values of the same shapes. Every
result is copied when it is returned; after each call, every earlier result of that executor is checked
unchanged against its copy (a result must not alias memory that a later call reuses), and every result
must equal the interpreter's. An executor that refuses the program with ``UnsupportedError`` when it is
built (the graph executor and AOT on dynamic programs) is *not applicable*; any other exception, at build
or call time, is a mismatch.

The counts are ``Stats``: programs, program x executor x call combinations, refusals and mismatches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

import tensorvm as tv
from tensorvm.errors import TensorVMError, UnsupportedError
from tensorvm.runtime.object import ADT

CALLS_PER_SET = 3   # same shapes, fresh values: the VM specializes a shape on its second sighting
SHAPE_SETS = 4      # the first set, two new ones, the first again (a static program: new values only)
RTOL = ATOL = 1e-4
VALUES = np.arange(-3, 4, dtype=np.float32)  # small integers: sums and products are exact


def _vm(target: str, mode: str, saved: bool):
    def build(mod):
        exe = tv.vm.compile(mod, target=target, exec_mode=mode)
        if saved:
            exe = tv.vm.load_executable(exe.save_bytes())
        machine = tv.vm.VirtualMachine(exe)
        return lambda *args: machine.invoke("main", *args)
    return build


def _executor(kind: str, target: str):
    def build(mod):
        return tv.create_executor(kind, mod, target=target).evaluate()
    return build


# exec mode "compiled" is native mode on target "c" (executable.resolve_exec_mode): one name for it here
EXECUTORS: dict[str, Callable] = {
    f"vm-{target}-{mode}{'-saved' if saved else ''}": _vm(target, mode, saved)
    for target, mode in (("python", "bytecode"), ("python", "compiled"), ("c", "bytecode"), ("c", "native"))
    for saved in (False, True)
}
EXECUTORS["graph-python"] = _executor("graph", "python")
EXECUTORS["graph-c"] = _executor("graph", "c")
EXECUTORS["aot"] = _executor("aot", "c")


@dataclass
class Mismatch:
    executor: str
    call: int
    what: str

    def __str__(self) -> str:
        return f"{self.executor} call {self.call}: {self.what}"


@dataclass
class Stats:
    programs: int = 0
    combinations: int = 0  # program x executor x call, each checked against the oracle
    calls: int = 0         # oracle calls
    executors: set = field(default_factory=set)         # names of the executors run
    not_applicable: dict = field(default_factory=dict)  # executor -> programs it refused
    features: dict = field(default_factory=dict)        # construct -> programs using it
    failures: list = field(default_factory=list)        # (case, [Mismatch])

    @property
    def mismatches(self) -> int:
        return sum(len(m) for _, m in self.failures)

    def summary(self) -> str:
        executors = len(self.executors)
        refused = ", ".join(f"{k} {v}" for k, v in sorted(self.not_applicable.items()))
        return (f"{self.programs} programs, {self.calls} oracle calls, {executors} executors: {self.combinations} "
                f"program x executor x call combinations checked, {self.mismatches} mismatches "
                f"in {len(self.failures)} programs (not applicable: {refused or 'none'})")


@dataclass(frozen=True)
class AdtValue:
    """A snapshot of an ADT value: constructor (name, or tag when unnamed) and fields."""

    constructor: object
    fields: tuple


# --- values ---------------------------------------------------------------------------------------------
def snapshot(value):
    """A deep copy of an executor's result in plain Python/NumPy form (taken as soon as it is returned)."""
    if isinstance(value, ADT):
        return AdtValue(value.constructor or value.tag, tuple(snapshot(f) for f in value.fields))
    if isinstance(value, (tuple, list)):
        return tuple(snapshot(v) for v in value)
    return np.array(value.numpy() if hasattr(value, "numpy") else value, copy=True)


def difference(actual, expected, path: str = "result") -> str | None:
    """How ``actual`` differs from ``expected`` (both snapshots), or None when equal (NaN equals NaN)."""
    if isinstance(expected, AdtValue):
        if not isinstance(actual, AdtValue) or actual.constructor != expected.constructor \
                or len(actual.fields) != len(expected.fields):
            return f"{path}: expected {_describe(expected)}, got {_describe(actual)}"
        return next((d for i, (a, e) in enumerate(zip(actual.fields, expected.fields))
                     if (d := difference(a, e, f"{path}.{expected.constructor}[{i}]"))), None)
    if isinstance(expected, tuple):
        if not isinstance(actual, tuple) or len(actual) != len(expected):
            return f"{path}: expected {_describe(expected)}, got {_describe(actual)}"
        return next((d for i, (a, e) in enumerate(zip(actual, expected)) if (d := difference(a, e, f"{path}.{i}"))),
                    None)
    if not isinstance(actual, np.ndarray):
        return f"{path}: expected a tensor, got {_describe(actual)}"
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return f"{path}: expected {expected.dtype}{list(expected.shape)}, got {actual.dtype}{list(actual.shape)}"
    if expected.dtype.kind == "f":
        ok = np.allclose(actual, expected, rtol=RTOL, atol=ATOL, equal_nan=True)
    else:
        ok = np.array_equal(actual, expected)
    if ok:
        return None
    err = np.nanmax(np.abs(actual.astype(np.float64) - expected.astype(np.float64))) if actual.size else 0
    return f"{path}: values differ (max abs error {err})"


def _describe(value) -> str:
    if isinstance(value, np.ndarray):
        return f"tensor {value.dtype}{list(value.shape)}"
    if isinstance(value, AdtValue):
        return f"{value.constructor}(... {len(value.fields)} fields)"
    return f"tuple of {len(value)}" if isinstance(value, tuple) else type(value).__name__


def shape_sets(case, rng: np.random.Generator) -> list[dict]:
    """Values of the dim variables per shape set, each variable in 2..5: distinct sets, the last one the
    first again (a VM that specialized the first shapes runs that code again after others)."""
    if not case.variables:
        return [{}] * SHAPE_SETS  # fixed shapes: new values only
    sets: list[dict] = []
    while len(sets) < SHAPE_SETS - 1:
        env = {v: int(rng.integers(2, 6)) for v in case.variables}
        if env not in sets or len(sets) >= 4 ** len(case.variables):
            sets.append(env)
    return sets + sets[:1]


def inputs(case, env: dict, rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.choice(VALUES, size=tuple(d.evaluate(env) for d in p.shape)).astype(np.float32)
            for p in case.params]


def case_from_text(text: str, seed: int = 0):
    """A ``Case`` for a program text (a saved failure, a regression test): each ``?`` of @main's
    parameters is a dim variable of its own, each named dim one variable wherever it recurs."""
    from program_gen import Case, Dim, Param

    from tensorvm.ir.types import Any, SymDim

    if not text.lstrip().startswith("#[version"):
        text = '#[version = "0.0.5"]\n' + text
    main = tv.parse(text)["main"]
    names: dict[str, Dim] = {}
    variables: list[int] = []
    params = []

    def new_var() -> Dim:
        variables.append(len(variables))
        return Dim.var(variables[-1])
    for p in main.params:
        shape = []
        for d in p.type_annotation.shape:
            if isinstance(d, Any):
                shape.append(new_var())
            elif isinstance(d, SymDim):
                shape.append(names[d.name] if d.name in names else names.setdefault(d.name, new_var()))
            else:
                shape.append(Dim.const(int(d)))
        params.append(Param(f"%{p.name_hint}", tuple(shape), ""))
    return Case(text, tuple(params), tuple(variables), seed)


# --- the runner -------------------------------------------------------------------------------------------
class OracleError(Exception):
    """The program is rejected by InferType or fails on the interpreter: a generator (or interpreter) bug."""


def run_case(case, stats: Stats | None = None, executors: dict | None = None) -> list[Mismatch]:
    """Runs ``case`` on the oracle and ``executors`` (default ``EXECUTORS``); returns the mismatches and
    adds to ``stats``. Raises ``OracleError`` when the program itself is at fault."""
    stats = stats if stats is not None else Stats()
    executors = EXECUTORS if executors is None else executors
    try:
        mod = tv.transform.InferType()(tv.parse(case.text))
    except TensorVMError as err:
        raise OracleError(f"the generated program is rejected: {err}\n{case.text}") from err
    rng = np.random.default_rng(case.seed)
    calls = [inputs(case, env, rng) for env in shape_sets(case, rng) for _ in range(CALLS_PER_SET)]
    oracle = tv.create_executor("debug", mod).evaluate()
    expected = []
    for args in calls:
        try:
            expected.append(snapshot(oracle(*args)))
        except Exception as err:  # noqa: BLE001 - any failure of the oracle is reported with the program
            raise OracleError(f"the interpreter fails: {type(err).__name__}: {err}\n{case.text}") from err

    mismatches: list[Mismatch] = []
    stats.executors.update(executors)
    for name, build in executors.items():
        try:
            fn = build(mod)
        except UnsupportedError:
            stats.not_applicable[name] = stats.not_applicable.get(name, 0) + 1
            continue
        except Exception as err:  # noqa: BLE001 - a crash while building is a defect
            mismatches.append(Mismatch(name, -1, f"build failed: {_error(err)}"))
            continue
        kept: list[tuple] = []  # (returned value, its snapshot) of every call so far
        for i, args in enumerate(calls):
            stats.combinations += 1
            try:
                result = fn(*[a.copy() for a in args])
            except Exception as err:  # noqa: BLE001 - the oracle succeeded: any exception is a defect
                mismatches.append(Mismatch(name, i, f"raised {_error(err)}"))
                break
            copy = snapshot(result)
            if (d := difference(copy, expected[i])) is not None:
                mismatches.append(Mismatch(name, i, d))
            kept.append((result, copy))
            for j, (earlier, its_copy) in enumerate(kept[:-1]):
                if (d := difference(snapshot(earlier), its_copy, f"call {j}'s result")) is not None:
                    mismatches.append(Mismatch(name, i, f"changed after this call: {d}"))
                    kept[j] = (earlier, snapshot(earlier))  # report each change once
            if len(mismatches) > 20:
                break
    stats.programs += 1
    stats.calls += len(calls)
    for feature in features(case):
        stats.features[feature] = stats.features.get(feature, 0) + 1
    if mismatches:
        stats.failures.append((case, mismatches))
    return mismatches


def _error(err: Exception) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    where = f" at {frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else ""
    return f"{type(err).__name__}: {str(err)[:300]}{where}"


_FEATURES = {
    "shape_of": "shape_of(", "arange": "arange(", "argwhere": "argwhere(", "reshape": "reshape(",
    "view": ("transpose(", "expand_dims(", "squeeze(", "strided_slice("), "concatenate": "concatenate(",
    "split": "split(", "reduce": ("sum(", "max(", "min(", "mean(", "argmax("), "dense": "nn.dense(",
    "conv2d": "nn.conv2d(", "batch_matmul": "nn.batch_matmul(", "if": "if (", "tail_loop": "@loop",
    "grow_loop": "@grow", "fill_loop": "@fill", "recursion": "@rec", "closure": "fn (", "map": "@map(", "foldl": "@foldl(",
    "match": "match (", "option": "Some(", "tree": "Rose(", "symbolic_dim": ("(n", ", n", "(m", ", m"),
    "list_out": "Nil)\n}", "ref": "ref_write(", "shared_ref": ") -> () { ref_write(", "knot": "= ref(fn (",
    "shared_effect": "{ let %o", "dropped_effect": "let %dr",
}


def features(case) -> list[str]:
    """The constructs a program uses (for the campaign's coverage counts)."""
    text = case.text
    out = []
    for name, marks in _FEATURES.items():
        marks = (marks,) if isinstance(marks, str) else marks
        if any(m in text for m in marks):
            out.append(name)
    if re.search(r"%\w+\.\d", text):
        out.append("tuple")
    main = text[text.index("def @main"):]
    if not case.variables:
        out.append("static")
    elif not any(m in main for m in ("if (", "@", "match", "fn (")):
        out.append("dynamic_dataflow")
    return out


def report(case, mismatches: list[Mismatch]) -> str:
    lines = [f"program (seed {case.seed}):", case.text.rstrip()]
    lines += [f"  {m}" for m in mismatches[:10]]
    return "\n".join(lines)


# --- a reintroduced defect, to check that the fuzzer finds it ----------------------------------------------
@contextlib.contextmanager
def broken_specialization():
    """Reintroduces issue 16's defect 1 while active: the shape slice's kernels write their outputs (the
    values preset in a specialized body) into the storage the memory planner gave them, which later
    tensors of the body or the slice may share, instead of memory of their own (``ShapeSlice.private``,
    the fix). On a tree without the fix this changes nothing: the defect is there already."""
    from tensorvm.vm import specialize
    from tensorvm.vm import vm as vm_module

    original = specialize.shape_slice

    def shape_slice(fn):
        plan = original(fn)
        if plan is not None and getattr(plan, "private", None):
            plan = dataclasses.replace(plan, private=frozenset())
        return plan

    modules = [m for m in (specialize, vm_module) if getattr(m, "shape_slice", None) is original]
    for m in modules:
        m.shape_slice = shape_slice
    try:
        yield
    finally:
        for m in modules:
            m.shape_slice = original


@contextlib.contextmanager
def broken_native_arena():
    """Ends every slot of native mode's arenas at the first instruction touching it while active (a span
    that forgets the slot's later uses), so the C placement lets a tensor share bytes with one still read.
    Without native arenas this changes nothing."""
    from tensorvm.vm import native_emit

    original = getattr(native_emit, "arena_slots", None)
    if original is None:
        yield
        return

    def forgetful(fn):
        return tuple((pc, first, first) for pc, first, _ in original(fn))

    native_emit.arena_slots = forgetful
    try:
        yield
    finally:
        native_emit.arena_slots = original


@contextlib.contextmanager
def broken_arena_placement():
    """Shortens every arena storage's span by its last instruction while active (an off-by-one: the last use
    taken as exclusive), so the VM's placement of a specialized body's arena lets a kernel's output share
    bytes with an input it still reads. Without placed arenas this changes nothing."""
    from tensorvm.vm import specialize

    original = getattr(specialize, "_arena_spans", None)
    if original is None:
        yield
        return

    def shortened(*args):
        return {storage: [first, max(first, last - 1)] for storage, (first, last) in original(*args).items()}

    specialize._arena_spans = shortened
    try:
        yield
    finally:
        specialize._arena_spans = original
