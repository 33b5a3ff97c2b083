"""The register VM on hand-written bytecode: branches, loops, calls, closures, ADTs, tail calls, kills.

Each program runs in both exec modes (the dispatch loop and compiled Python) and is checked against
plain Python/NumPy arithmetic.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorvm.errors import ExecutionError, ShapeError
from tensorvm.ir.types import Any, SymDim, TensorType, TupleType
from tensorvm.runtime.ndarray import NDArray
from tensorvm.runtime.object import ADT
from tensorvm.vm import SKIP_RUN, VirtualMachine
from tensorvm.vm import bytecode as bc
from tensorvm.vm.executable import AdtInfo, Executable, PrimitiveInfo

I64 = TensorType((), "int64")
MODES = ["bytecode", "compiled"]


# --- a tiny assembler: labels instead of hand-counted jump offsets ---------------------------------
def asm(*items) -> tuple:
    """Instructions, with ``"label:"`` strings marking targets and ``If``/``Goto`` given label names."""
    labels, pc = {}, 0
    for item in items:
        if isinstance(item, str):
            labels[item.rstrip(":")] = pc
        else:
            pc += 1
    out, pc = [], 0
    for item in items:
        if isinstance(item, str):
            continue
        if isinstance(item, bc.If) and isinstance(item.true_offset, str):
            item = bc.If(item.test, item.target, labels[item.true_offset] - pc, labels[item.false_offset] - pc)
        elif isinstance(item, bc.Goto) and isinstance(item.pc_offset, str):
            item = bc.Goto(labels[item.pc_offset] - pc)
        out.append(item)
        pc += 1
    return tuple(out)


def k_add(a, b, out):
    np.add(a, b, out=out)


def k_sub(a, b, out):
    np.subtract(a, b, out=out)


def k_mul(a, b, out):
    np.multiply(a, b, out=out)


def k_eq(a, b, out):
    np.equal(a, b, out=out)


def k_fail(a, out):
    raise ShapeError("k_fail: shapes do not fit")


KERNELS = [k_add, k_sub, k_mul, k_eq, k_fail]
PRIMS = [PrimitiveInfo(k.__name__, num_inputs=k.__code__.co_argcount - 1, num_outputs=1) for k in KERNELS]
ADD, SUB, MUL, EQ, FAIL = range(5)
LIST = AdtInfo("List", (("Cons", 2), ("Nil", 0)))
CONS, NIL = bc.adt_tag(0, 0), bc.adt_tag(0, 1)

# Constants shared by the programs: 0: int64 0, 1: int64 1, 2: 8 (bytes of an int64), 3: bool True
CONSTS = [np.array(0, "int64"), np.array(1, "int64"), np.array(8, "int64"), np.array(True)]


def scalar_out(dst: int, storage: int, size_reg: int = 90, offset_reg: int = 91) -> list:
    """Allocate an int64 scalar into ``dst`` (storage in ``storage``)."""
    return [bc.LoadConst(2, size_reg), bc.AllocStorage(size_reg, 64, "int64", storage),
            bc.LoadConst(0, offset_reg), bc.AllocTensor(storage, offset_reg, (), "int64", dst)]


def bool_out(dst: int, storage: int) -> list:
    return [bc.LoadConst(1, 92), bc.AllocStorage(92, 64, "bool", storage),
            bc.LoadConst(0, 93), bc.AllocTensor(storage, 93, (), "bool", dst)]


def make_exe(functions, mode="bytecode", adts=(LIST,)) -> Executable:
    exe = Executable(functions, CONSTS, PRIMS, adts=list(adts), exec_mode=mode, kernel_overrides=KERNELS)
    exe.verify()
    return exe


def fn(name, params, instrs, types=None, ret=None, nregs=100):
    return bc.VMFunction(name, params, instrs, nregs, types, ret)


# --- programs ------------------------------------------------------------------------------------
def select_fn():
    # select(c, a, b) = if c then a else b, with the Relay VM's merge-register pattern
    return fn("select", ("c", "a", "b"), asm(
        bc.LoadConsti(1, 3),
        bc.If(0, 3, "then", "else"),
        "then:", bc.Move(1, 4), bc.Goto("end"),
        "else:", bc.Move(2, 4),
        "end:", bc.Ret(4),
    ), (TensorType((), "bool"), I64, I64))


def sum_to_fn(index=0):
    # sum_to(n, acc) = if n == 0 then acc else sum_to(n - 1, acc + n)   (a tail call)
    return fn("sum_to", ("n", "acc"), asm(
        bc.LoadConst(0, 2), *bool_out(3, 4), bc.InvokePacked(EQ, 3, 1, (0, 2, 3)),
        bc.LoadConsti(1, 5),
        bc.If(3, 5, "done", "step"),
        "done:", bc.Move(1, 6), bc.Goto("end"),
        "step:",
        bc.LoadConst(1, 7), *scalar_out(8, 9), bc.InvokePacked(SUB, 3, 1, (0, 7, 8)),
        *scalar_out(10, 11, 94, 95), bc.InvokePacked(ADD, 3, 1, (1, 0, 10)),
        bc.Invoke(index, (8, 10), 12), bc.Move(12, 6),
        "end:", bc.Ret(6),
    ), (I64, I64), I64)


def count_fn(index=0):
    # count(n) = if n == 0 then 0 else count(n - 1) + 1   (not a tail call)
    return fn("count", ("n",), asm(
        bc.LoadConst(0, 2), *bool_out(3, 4), bc.InvokePacked(EQ, 3, 1, (0, 2, 3)),
        bc.LoadConsti(1, 5), bc.If(3, 5, "zero", "rec"),
        "zero:", bc.Move(2, 6), bc.Goto("end"),
        "rec:", bc.LoadConst(1, 7), *scalar_out(8, 9), bc.InvokePacked(SUB, 3, 1, (0, 7, 8)),
        bc.Invoke(index, (8,), 10),
        *scalar_out(11, 12, 94, 95), bc.InvokePacked(ADD, 3, 1, (10, 7, 11)), bc.Move(11, 6),
        "end:", bc.Ret(6),
    ), (I64,), I64)


def goto_loop_fn():
    # acc = 0; while n != 0: acc += n; n -= 1   -- a backward Goto, registers reassigned
    return fn("goto_loop", ("n",), asm(
        bc.LoadConst(0, 1), bc.Move(1, 2), bc.Move(0, 3), bc.LoadConsti(1, 5),
        "head:", *bool_out(4, 6), bc.InvokePacked(EQ, 3, 1, (3, 1, 4)),
        bc.If(4, 5, "exit", "body"),
        "body:", *scalar_out(7, 8), bc.InvokePacked(ADD, 3, 1, (2, 3, 7)), bc.Move(7, 2),
        bc.LoadConst(1, 9), *scalar_out(10, 11, 94, 95), bc.InvokePacked(SUB, 3, 1, (3, 9, 10)), bc.Move(10, 3),
        bc.Goto("head"),
        "exit:", bc.Ret(2),
    ), (I64,), I64)


@pytest.fixture(params=MODES)
def mode(request):
    return request.param


def run(functions, name, *args, mode="bytecode", allocator="pooled", **kw):
    vm = VirtualMachine(make_exe(functions, mode, **kw), allocator=allocator)
    return vm, vm.invoke(name, *args)


@given(c=st.booleans(), a=st.integers(-100, 100), b=st.integers(-100, 100))
@settings(max_examples=25, deadline=None)
def test_if_selects_a_branch_through_the_merge_register(c, a, b):
    for m in MODES:
        _, out = run([select_fn()], "select", np.array(c), np.array(a, "int64"), np.array(b, "int64"), mode=m)
        assert isinstance(out, NDArray) and out.numpy() == (a if c else b)


@given(n=st.integers(0, 60), acc=st.integers(-50, 50))
@settings(max_examples=25, deadline=None)
def test_tail_recursive_sum_matches_python(n, acc):
    for m in MODES:
        _, out = run([sum_to_fn()], "sum_to", np.array(n, "int64"), np.array(acc, "int64"), mode=m)
        assert out.numpy() == acc + n * (n + 1) // 2


def test_tail_calls_reuse_the_frame_for_100000_steps(mode):
    n = 100_000
    vm, out = run([sum_to_fn()], "sum_to", np.array(n, "int64"), np.array(0, "int64"), mode=mode)
    assert out.numpy() == n * (n + 1) // 2
    stats = vm.memory_stats()
    assert stats["num_allocations"] == 3 * n + 1  # eq, sub, add per step; eq at the end
    # Each replaced frame drops its registers, so at most a couple of iterations' storages are live at
    # once; without frame reuse every iteration's storages would stay live until the end (3 * n * 8 bytes).
    assert stats["peak_bytes"] <= 20 * 8
    assert stats["bytes_live"] == 8  # only the result's storage


def test_tail_calls_are_detected_through_move_kill_and_goto():
    f = sum_to_fn()
    assert bc.tail_call_pcs(f) == {i for i, ins in enumerate(f.instructions) if isinstance(ins, bc.Invoke)}
    # a non-tail call: its result feeds a kernel
    assert bc.tail_call_pcs(count_fn()) == frozenset()


def test_non_tail_recursion_matches_python(mode):
    for n in (0, 1, 7, 3000):
        _, out = run([count_fn()], "count", np.array(n, "int64"), mode=mode)
        assert out.numpy() == n


def test_backward_goto_loop(mode):
    for n in (0, 1, 10, 250):
        _, out = run([goto_loop_fn()], "goto_loop", np.array(n, "int64"), mode=mode)
        assert out.numpy() == n * (n + 1) // 2


def test_calls_between_functions_and_registers_of_the_callee(mode):
    # main(x) = add(double(x), x) where double(y) = y + y
    double = fn("double", ("y",), (*scalar_out(1, 2), bc.InvokePacked(ADD, 3, 1, (0, 0, 1)), bc.Ret(1)), (I64,))
    main = fn("main", ("x",), (bc.Invoke(1, (0,), 1), *scalar_out(2, 3), bc.InvokePacked(ADD, 3, 1, (1, 0, 2)),
                               bc.Ret(2)), (I64,))
    _, out = run([main, double], "main", np.array(7, "int64"), mode=mode)
    assert out.numpy() == 21


def test_closures_capture_values(mode):
    # adder(k, x) = k + x as a closure function (captured k first); main(k, x) builds it and calls it
    adder = fn("adder", ("k", "x"), (*scalar_out(2, 3), bc.InvokePacked(ADD, 3, 1, (0, 1, 2)), bc.Ret(2)))
    main = fn("main", ("k", "x"), (bc.AllocClosure(1, (0,), 2), bc.InvokeClosure(2, (1,), 3), bc.Ret(3)),
              (I64, I64))
    vm, out = run([main, adder], "main", np.array(5, "int64"), np.array(-2, "int64"), mode=mode)
    assert out.numpy() == 3
    # a closure returned to Python can be passed back in
    make = fn("make", ("k",), (bc.AllocClosure(1, (0,), 1), bc.Ret(1)), (I64,))
    exe = make_exe([make, adder, fn("apply", ("f", "x"), (bc.InvokeClosure(0, (1,), 2), bc.Ret(2)))], mode)
    vm = VirtualMachine(exe)
    clo = vm.invoke("make", np.array(10, "int64"))
    assert vm.invoke("apply", clo, np.array(1, "int64")).numpy() == 11


def test_closure_tail_calls_run_in_constant_space(mode):
    # loop(k, n) = if n == 0 then k else (closure loop capturing k)(n - 1): a tail InvokeClosure
    loop = fn("loop", ("k", "n"), asm(
        bc.LoadConst(0, 2), *bool_out(3, 4), bc.InvokePacked(EQ, 3, 1, (1, 2, 3)), bc.LoadConsti(1, 5),
        bc.If(3, 5, "done", "step"),
        "done:", bc.Ret(0),
        "step:", bc.LoadConst(1, 6), *scalar_out(7, 8), bc.InvokePacked(SUB, 3, 1, (1, 6, 7)),
        bc.AllocClosure(0, (0,), 9), bc.InvokeClosure(9, (7,), 10), bc.Ret(10),
    ), (I64, I64))
    _, out = run([loop], "loop", np.array(42, "int64"), np.array(100_000, "int64"), mode=mode)
    assert out.numpy() == 42


def list_sum_fn():
    # sum(l) = match l { Cons(h, t) => h + sum(t), Nil => 0 }: GetTag / LoadConsti / If, then Fatal
    return fn("sum", ("l",), asm(
        bc.GetTag(0, 1), bc.LoadConsti(CONS, 2), bc.If(1, 2, "cons", "next"),
        "cons:", bc.GetField(0, 0, 3), bc.GetField(0, 1, 4), bc.Invoke(0, (4,), 5), *scalar_out(6, 7),
        bc.InvokePacked(ADD, 3, 1, (3, 5, 6)), bc.Move(6, 8), bc.Goto("end"),
        "next:", bc.LoadConsti(NIL, 9), bc.If(1, 9, "nil", "fail"),
        "nil:", bc.LoadConst(0, 8), bc.Goto("end"),
        "fail:", bc.Fatal(),
        "end:", bc.Ret(8),
    ))


def build_list_fn():
    # build(a, b) = Cons(a, Cons(b, Nil)), plus a tuple (a, b) in a tuple result
    return fn("build", ("a", "b"), (
        bc.AllocADT(NIL, (), 2), bc.AllocADT(CONS, (1, 2), 3), bc.AllocADT(CONS, (0, 3), 4),
        bc.AllocADT(0, (0, 1), 5), bc.AllocADT(0, (4, 5), 6), bc.Ret(6)), (I64, I64))


def test_adts_match_and_come_back_named(mode):
    exe = make_exe([list_sum_fn(), build_list_fn()], mode)
    vm = VirtualMachine(exe)
    lst, pair = vm.invoke("build", np.array(3, "int64"), np.array(4, "int64"))
    assert isinstance(lst, ADT) and lst.constructor == "Cons" and lst.tag == 0
    assert lst.fields[1].constructor == "Cons" and lst.fields[1].fields[1].constructor == "Nil"
    assert lst.fields[1].fields[1].tag == 1
    assert isinstance(pair, tuple) and [p.numpy() for p in pair] == [3, 4]
    # a Python-built list (constructor names, user tags) is accepted and summed
    values = [5, -1, 7, 11]
    py_list = ADT(1, (), "Nil")
    for v in reversed(values):
        py_list = ADT(0, (np.array(v, "int64"), py_list), "Cons")
    assert vm.invoke("sum", py_list).numpy() == sum(values)
    assert vm.invoke("sum", lst).numpy() == 7  # a VM result passed back in


def test_fatal_names_function_and_pc_and_leaves_the_vm_usable(mode):
    exe = make_exe([list_sum_fn(), build_list_fn()], mode, adts=(LIST, AdtInfo("Other", (("Weird", 0),))))
    vm = VirtualMachine(exe)
    bogus = ADT(0, (), "Weird")  # a constructor the match does not handle
    with pytest.raises(ExecutionError, match=r"Fatal.*'sum' at pc 1[0-9]"):
        vm.invoke("sum", bogus)
    good = ADT(0, (np.array(2, "int64"), ADT(1, (), "Nil")), "Cons")
    assert vm.invoke("sum", good).numpy() == 2


def test_kernel_errors_keep_their_class_and_gain_a_location(mode):
    f = fn("bad", ("x",), (*scalar_out(1, 2), bc.InvokePacked(FAIL, 2, 1, (0, 1)), bc.Ret(1)), (I64,))
    vm = VirtualMachine(make_exe([f], mode))
    with pytest.raises(ShapeError, match=r"k_fail: shapes do not fit.*'bad' at pc 4"):
        vm.invoke("bad", np.array(1, "int64"))
    with pytest.raises(ShapeError):  # and again: the VM is still usable
        vm.invoke("bad", np.array(1, "int64"))
    # a NumPy error inside a kernel becomes an ExecutionError with the location
    g = fn("bad_add", ("x", "y"), (*scalar_out(2, 3), bc.InvokePacked(ADD, 3, 1, (0, 1, 2)), bc.Ret(2)))
    vm = VirtualMachine(make_exe([g], mode))
    with pytest.raises(ExecutionError, match=r"'bad_add' at pc 4"):
        vm.invoke("bad_add", np.ones(3), np.ones(4))


def test_kill_register_frees_storage_before_the_function_ends(mode):
    seen = []
    kernels = KERNELS + [lambda x, out: seen.append(vm.memory_stats()["bytes_live"])]
    prims = PRIMS + [PrimitiveInfo("probe", num_inputs=1, num_outputs=1)]
    big = np.array(4096, "int64")
    f = fn("main", ("x",), (
        bc.LoadConst(4, 1), bc.AllocStorage(1, 64, "float32", 2), bc.LoadConst(0, 3),
        bc.AllocTensor(2, 3, (1024,), "float32", 4),                       # 4 KiB, dead after the probe
        bc.InvokePacked(5, 2, 1, (0, 4)),
        bc.KillRegister(4), bc.KillRegister(2),
        *scalar_out(5, 6), bc.InvokePacked(5, 2, 1, (0, 5)), bc.Ret(5)), (I64,))
    exe = Executable([f], CONSTS + [big], prims, exec_mode=mode, kernel_overrides=kernels)
    vm = VirtualMachine(exe)
    vm.invoke("main", np.array(1, "int64"))
    assert seen == [4096, 8]


def test_naive_and_pooled_allocators_agree_and_pool_reuses(mode):
    results = {}
    for kind in ("naive", "pooled"):
        vm, out = run([sum_to_fn()], "sum_to", np.array(30, "int64"), np.array(0, "int64"), mode=mode,
                      allocator=kind)
        results[kind] = (int(out.numpy()), vm.memory_stats())
    assert results["naive"][0] == results["pooled"][0] == 465
    assert results["naive"][1]["reuse_hits"] == 0
    pooled = results["pooled"][1]
    assert pooled["num_allocations"] == 91 and pooled["num_allocations"] - pooled["reuse_hits"] <= 6


def test_instrument_sees_every_kernel_call_and_can_skip_it(mode):
    exe = make_exe([sum_to_fn()], mode)
    vm = VirtualMachine(exe)
    calls = []

    def record(name, before, ret, *args):
        calls.append((name, before, tuple(a.numpy().item() for a in args[:-1])))  # inputs (the output is last)

    vm.set_instrument(record)
    assert vm.invoke("sum_to", np.array(2, "int64"), np.array(0, "int64")).numpy() == 3
    assert [c for c in calls if c[1]][:2] == [("k_eq", True, (2, 0)), ("k_sub", True, (2, 1))]
    assert len(calls) == 2 * (3 + 2 + 2)

    def skip_adds(name, before, ret, *args):
        if name == "k_add" and before:
            args[-1].numpy()[...] = 100  # pretend: the instrument fills the output itself
            return SKIP_RUN
    vm.set_instrument(skip_adds)
    assert vm.invoke("sum_to", np.array(2, "int64"), np.array(0, "int64")).numpy() == 100
    vm.set_instrument(None)
    assert vm.invoke("sum_to", np.array(2, "int64"), np.array(0, "int64")).numpy() == 3


def test_arguments_are_checked_against_parameter_types():
    types = (TensorType((SymDim("n"), 3), "float32"), TensorType((SymDim("n"), Any()), "float32"),
             TupleType((I64, TensorType((2,), "int32"))))
    f = fn("main", ("x", "y", "t"), (bc.Ret(0),), types)
    vm = VirtualMachine(make_exe([f]))
    x, y, t = np.ones((2, 3), "float32"), np.ones((2, 5), "float32"), (np.array(1, "int64"), np.arange(2, dtype="int32"))
    assert vm.invoke("main", x, y, t).shape == (2, 3)
    with pytest.raises(ExecutionError, match="parameter 'x': expected dtype float32, got float64"):
        vm.invoke("main", x.astype("float64"), y, t)
    with pytest.raises(ShapeError, match="parameter 'x': expected rank 2"):
        vm.invoke("main", np.ones(3, "float32"), y, t)
    with pytest.raises(ShapeError, match="parameter 'x': dimension 1 must be 3"):
        vm.invoke("main", np.ones((2, 4), "float32"), y, t)
    with pytest.raises(ShapeError, match="parameter 'y'.*symbolic dimension n, bound to 2"):
        vm.invoke("main", x, np.ones((4, 5), "float32"), t)
    with pytest.raises(ExecutionError, match=r"parameter 't'\[1\]: expected dtype int32"):
        vm.invoke("main", x, y, (t[0], np.arange(2)))
    with pytest.raises(ExecutionError, match="parameter 't': expected a tuple of 2"):
        vm.invoke("main", x, y, t[0])
    with pytest.raises(ExecutionError, match="takes 3 argument"):
        vm.invoke("main", x, y, t, t)
    with pytest.raises(ExecutionError, match="missing argument.*t"):
        vm.invoke("main", x, y)
    # keyword arguments, NDArrays and Python scalars
    assert vm.invoke("main", y=y, x=NDArray(x), t=(1, [5, 6])).shape == (2, 3)
    with pytest.raises(ExecutionError, match="expected int64, got 1.5"):
        vm.invoke("main", x, y, (1.5, [5, 6]))


def test_verifier_rejects_out_of_range_bytecode():
    from tensorvm.errors import FormatError
    bad = [
        fn("f", ("x",), (bc.Ret(7),), nregs=2),                                 # register out of range
        fn("f", ("x",), (bc.Goto(5), bc.Ret(0)), nregs=2),                      # jump outside
        fn("f", ("x",), (bc.Goto(0),), nregs=2),                                # jump by zero
        fn("f", ("x",), (bc.LoadConst(99, 1), bc.Ret(1)), nregs=2),             # no such constant
        fn("f", ("x",), (bc.InvokePacked(42, 1, 0, (0,)), bc.Ret(0)), nregs=2),  # no such kernel
        fn("f", ("x",), (bc.Invoke(3, (0,), 1), bc.Ret(1)), nregs=2),           # no such function
        fn("f", ("x",), (bc.Invoke(0, (0, 0), 1), bc.Ret(1)), nregs=2),         # wrong argument count
        fn("f", ("x",), (bc.Move(0, 1),), nregs=2),                              # falls off the end
    ]
    for f in bad:
        with pytest.raises(FormatError):
            make_exe([f])


def test_text_forms_follow_the_relay_vm():
    texts = [str(i) for i in (
        bc.Move(1, 2), bc.Ret(3), bc.Invoke(0, (5,), 6), bc.InvokeClosure(1, (2, 3), 4),
        bc.InvokePacked(0, 2, 1, (0, 2)), bc.AllocTensor(1, 4, (), "bool", 2),
        bc.AllocTensorReg(1, 2, 3, "float32", 4), bc.AllocADT(0, (1, 2), 3), bc.AllocClosure(2, (1,), 3),
        bc.GetField(1, 0, 2), bc.If(2, 3, 1, 2), bc.LoadConst(0, 1), bc.Goto(9), bc.GetTag(1, 2),
        bc.LoadConsti(1, 3), bc.Fatal(), bc.AllocStorage(1, 64, "bool", 2), bc.ShapeOf(1, 2),
        bc.ReshapeTensor(1, 2, 3), bc.DeviceCopy(1, 0, 0, 2), bc.KillRegister(4))]
    assert texts == [
        "move $2 $1", "ret $3", "invoke $6 VMFunc[0]($5)", "invoke_closure $4 $1($2, $3)",
        "invoke_packed PackedFunc[0] (in: $0, out: $2)", "alloc_tensor $2 $1 $4 [] uint1",
        "alloc_tensor_reg $4 $1 $2 $3 float32", "alloc_data $3 tag(0) [$1, $2]", "alloc_closure $3 VMFunc[2]($1)",
        "get_field $2 $1[0]", "if $2 $3 1 2", "load_const $1 Const[0] 0", "goto 9", "get_tag $2 $1",
        "load_consti $3 1", "fatal", "alloc_storage $2 $1 64 uint1 0", "shape_of $2 $1",
        "reshape_tensor $3 $1 $2", "device_copy $2 $1 0 0", "kill_register $4"]
    assert [int(op) for op in bc.Opcode] == list(range(21))


instructions = st.one_of(
    st.builds(bc.Move, st.integers(0, 9), st.integers(0, 9)),
    st.builds(bc.Invoke, st.integers(0, 3), st.lists(st.integers(0, 9), max_size=4), st.integers(0, 9)),
    st.builds(lambda a, o: bc.InvokePacked(1, len(a), min(o, len(a)), a), st.lists(st.integers(0, 9), max_size=5),
              st.integers(0, 3)),
    st.builds(bc.AllocTensor, st.integers(0, 9), st.integers(0, 9), st.lists(st.integers(0, 50), max_size=4),
              st.sampled_from(["float32", "bool", "int64", "uint8"]), st.integers(0, 9)),
    st.builds(bc.AllocStorage, st.integers(0, 9), st.sampled_from([1, 8, 64]), st.sampled_from(["float16", "int8"]),
              st.integers(0, 9), st.just(0), st.booleans()),
    st.builds(bc.If, st.integers(0, 9), st.integers(0, 9), st.integers(-5, 5), st.integers(-5, 5)),
    st.builds(bc.LoadConsti, st.integers(-2**40, 2**40), st.integers(0, 9)),
    st.builds(bc.AllocADT, st.integers(0, 2**30), st.lists(st.integers(0, 9), max_size=3), st.integers(0, 9)),
    st.just(bc.Fatal()),
)


@given(instructions)
@settings(max_examples=50, deadline=None)
def test_instructions_round_trip_through_words_and_text(ins):
    assert bc.decode_instruction(ins.to_words()) == ins
    assert str(ins).split()[0] in {
        "move", "invoke", "invoke_packed", "alloc_tensor", "alloc_storage", "if", "load_consti", "alloc_data", "fatal"}


# --- storage and allocators ----------------------------------------------------------------------------
def test_size_classes_bound_the_waste():
    from tensorvm.runtime.memory import size_class
    for n in [0, 1, 63, 64, 65, 100, 1000, 4097, 10**6, 123457]:
        c = size_class(n)
        assert c >= n and c % 64 == 0
        assert c <= max(64, n * 1.125 + 64)


def test_storage_lives_as_long_as_its_tensors():
    from tensorvm.runtime.memory import PooledAllocator, alloc_tensor
    pool = PooledAllocator()
    storage = pool.alloc(64, 64, "float32")
    a = alloc_tensor(storage, 0, (4,), "float32")
    b = alloc_tensor(storage, 16, (2, 2), "float32")
    a[...] = 1.0
    b[...] = 2.0
    del storage
    assert pool.stats()["bytes_live"] == 64  # the views keep it
    view_of_view = b.reshape(4)[1:]
    del a, b
    assert pool.stats()["bytes_live"] == 64 and np.all(view_of_view == 2.0)
    del view_of_view
    assert pool.stats()["bytes_live"] == 0 and pool.stats()["num_frees"] == 1
    again = pool.alloc(40, 64, "float32")  # same size class: the block comes back
    assert pool.stats()["reuse_hits"] == 1 and again.size == 40


def test_tensor_views_are_bounds_checked():
    from tensorvm.runtime.memory import NaiveAllocator, alloc_tensor
    storage = NaiveAllocator().alloc(32)
    with pytest.raises(ShapeError, match="needs 36 bytes, but the storage has 32"):
        alloc_tensor(storage, 4, (8,), "float32")
    with pytest.raises(ShapeError):
        alloc_tensor(storage, -8, (2,), "float32")


def test_allocation_failure_is_a_clear_error_and_the_pool_retries_after_releasing_its_cache():
    from tensorvm.runtime.memory import PooledAllocator
    pool = PooledAllocator(limit_bytes=4096)
    held = pool.alloc(3000)
    with pytest.raises(ExecutionError, match=r"pooled allocator could not allocate 2000 bytes.*limit 4096"):
        pool.alloc(2000)
    del held  # its block goes to the cache ...
    assert pool.stats()["bytes_cached"] > 0
    fresh = pool.alloc(2000)  # ... and is released so that a block of another class fits
    assert fresh.size == 2000 and pool.stats()["bytes_cached"] == 0
    # through the VM: the failing AllocStorage is located, and the VM stays usable
    f = fn("big", ("x",), (bc.LoadConst(4, 1), bc.AllocStorage(1, 64, "float32", 2), bc.Ret(0)), (I64,))
    exe = Executable([f], CONSTS + [np.array(1 << 20, "int64")], PRIMS, kernel_overrides=KERNELS)
    vm = VirtualMachine(exe, allocator=PooledAllocator(limit_bytes=1 << 16))
    with pytest.raises(ExecutionError, match=r"could not allocate 1048576 bytes.*'big' at pc 1"):
        vm.invoke("big", np.array(1, "int64"))
    with pytest.raises(ValueError, match="unknown allocator"):
        VirtualMachine(exe, allocator="buddy")


def test_a_negative_offset_in_bytecode_cannot_reach_outside_the_storage(mode):
    # NumPy would happily view memory before the buffer; the VM checks every offset
    f = fn("f", ("x",), (bc.LoadConst(2, 1), bc.AllocStorage(1, 64, "int64", 2), bc.LoadConst(4, 3),
                         bc.AllocTensor(2, 3, (), "int64", 4), bc.Ret(4)), (I64,))
    exe = Executable([f], CONSTS + [np.array(-8, "int64")], PRIMS, exec_mode=mode, kernel_overrides=KERNELS)
    with pytest.raises(ShapeError, match="negative byte offset -8.*pc 3"):
        VirtualMachine(exe).invoke("f", np.array(0, "int64"))


def _random_function(draw):
    """A verified function of random instructions with forward jumps only (so it terminates)."""
    n, nregs = draw(st.integers(1, 12)), 6
    reg = st.integers(0, nregs - 1)
    body = []
    for pc in range(n):
        forward = st.integers(1, n - pc)  # may land on the final Ret
        body.append(draw(st.one_of(
            st.builds(bc.Move, reg, reg), st.builds(bc.LoadConst, st.integers(0, len(CONSTS)), reg),
            st.builds(bc.LoadConsti, st.integers(-3, 3), reg), st.builds(bc.GetField, reg, st.integers(0, 2), reg),
            st.builds(bc.GetTag, reg, reg), st.builds(bc.KillRegister, reg), st.builds(bc.ShapeOf, reg, reg),
            st.builds(bc.AllocADT, st.sampled_from([0, CONS, NIL]), st.lists(reg, max_size=2), reg),
            st.builds(bc.AllocStorage, reg, st.just(64), st.sampled_from(["int64", "bool"]), reg),
            st.builds(bc.AllocTensor, reg, reg, st.lists(st.integers(0, 3), max_size=2), st.just("int64"), reg),
            st.builds(bc.AllocTensorReg, reg, reg, reg, st.just("float32"), reg),
            st.builds(bc.ReshapeTensor, reg, reg, reg),
            st.builds(lambda a, o: bc.InvokePacked(ADD, 3, 1, (a, o, o)), reg, reg),
            st.builds(bc.If, reg, reg, forward, forward), st.builds(bc.Goto, forward),
            st.builds(bc.AllocClosure, st.just(0), st.lists(reg, max_size=1), reg), st.just(bc.Fatal()),
        )))
    body.append(bc.Ret(draw(reg)))
    return fn("main", ("x",), tuple(body), (I64,), nregs=nregs)


@given(st.data())
@settings(max_examples=50, deadline=None)
def test_random_verified_bytecode_never_escapes_as_a_python_error(data):
    f = data.draw(st.composite(_random_function)())
    for m in MODES:
        exe = Executable([f], CONSTS + [np.array([2, 2], "int64")], PRIMS, exec_mode=m, kernel_overrides=KERNELS)
        exe.verify()
        try:
            VirtualMachine(exe).invoke("main", np.array(3, "int64"))
        except (ExecutionError, ShapeError):
            pass
