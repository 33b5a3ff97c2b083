"""VM overhead: dispatch cost per instruction and per kernel call, bytecode vs compiled vs native exec mode,
static vs dynamic shapes, the dispatch-loop design, and peak memory with and without memory planning.

    .venv/bin/python benchmarks/vm_overhead.py [--quick] [--sections 1,5] [--targets python,c]

NumPy's BLAS and the C kernels run single-threaded here (set before NumPy loads), so that the numbers
measure the VM rather than thread scheduling on a busy machine. Every time is the minimum over repeats.

Sections:

1. A tail-recursive loop of tiny scalar ops (Relay text, compiled by ``tv.vm.compile``): time per
   iteration and per executed instruction, against the kernels called directly from Python.
2. Kernel-call overhead: 1000 ``InvokePacked`` of a kernel that does nothing, against a Python loop
   calling it (TVM's C++ VM: ~1.4 us per kernel call; a NumPy ufunc call: ~0.5 us).
3. Dispatch-loop design: the VM's ``if`` chain over decoded tuples against a loop of per-instruction
   bound handler functions, on the same program.
4. Memory planning: peak live bytes and allocations per call of a static MLP and a dynamic-batch MLP,
   with and without ``MemoryPlan`` (naive allocator, so freed memory really leaves).
5. Per-kernel-call overhead in a real program: a chain of 64 tiny ops, each its own kernel (opt_level=0),
   with a static and with a dynamic shape: VM time per kernel call minus the kernels called directly
   (from Python: native mode calls them from C, below that floor, so its total per call is shown too;
   and native mode's cost above the kernel itself: its run minus an invoke without kernels minus the same
   kernels called from C, per kernel call).
6. Static vs dynamic: the 784-512-512-10 MLP compiled for the exact batch and with a ``?`` batch, run on
   the same inputs (the bar: the dynamic executable within 10% of the static one).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tensorvm as tv  # noqa: E402
from tensorvm.vm import VirtualMachine  # noqa: E402
from tensorvm.vm import bytecode as bc  # noqa: E402
from tensorvm.vm.executable import Executable, PrimitiveInfo  # noqa: E402

LOOP = """
def @main(%n: int64) -> float32 { @loop(%n, 0f) }
def @loop(%i: int64, %acc: float32) -> float32 {
  %0 = equal(%i, 0i64);
  if (%0) { %acc } else { @loop(subtract(%i, 1i64), add(%acc, 1f)) }
}
"""


def modes_for(target: str) -> tuple:
    """The exec modes to measure: on target "c" exec mode "compiled" is native mode (the VM functions compiled
    to C), on target "python" generated Python."""
    return ("bytecode", "native") if target == "c" else ("bytecode", "compiled")


def best_of(fn, repeat: int) -> float:
    """Minimum wall time of ``fn()`` over ``repeat`` runs (seconds)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def loop_path_length(fn: bc.VMFunction) -> int:
    """Instructions executed by one iteration of ``@loop``: follow the false (recursive) branch."""
    pc, count = 0, 0
    tails = bc.tail_call_pcs(fn)
    while True:
        ins = fn.instructions[pc]
        count += 1
        if pc in tails:
            return count
        if isinstance(ins, bc.If):
            pc += ins.false_offset
        elif isinstance(ins, bc.Goto):
            pc += ins.pc_offset
        else:
            pc += 1


def section_loop(n: int, repeat: int, target: str = "python") -> dict:
    mod = tv.parse(LOOP)
    results = {}
    exe = tv.vm.compile(mod, target=target)
    loop = exe.function("loop")
    per_iter_instructions = loop_path_length(loop)
    kernels = exe.kernels
    # the kernels of one iteration, called directly (the floor any executor pays)
    i, acc = np.array(5, "int64"), np.array(0, "float32")
    flag, i2, acc2 = np.empty((), "bool"), np.empty((), "int64"), np.empty((), "float32")
    names = [p.name for p in exe.primitives]
    k_eq, k_sub, k_add = (kernels[names.index(n_)] for n_ in ("fused_equal", "fused_subtract", "fused_add"))

    def kernels_only():
        for _ in range(n):
            k_eq(i, flag)
            k_sub(i, i2)
            k_add(acc, acc2)
    floor = best_of(kernels_only, repeat) / n
    for mode in modes_for(target):
        vm = VirtualMachine(exe.with_exec_mode(mode))
        assert vm.invoke("main", n).numpy() == n
        t = best_of(lambda vm=vm: vm.invoke("main", n), repeat) / n
        results[mode] = t
    print(f"\n1. [{target}] tail-recursive loop of tiny ops ({n} iterations, {per_iter_instructions} bytecode "
          f"instructions and 3 kernel calls per iteration)")
    print(f"   kernels alone (direct calls)       {floor * 1e6:7.2f} us / iteration")
    for mode, t in results.items():
        overhead = (t - floor) / per_iter_instructions
        print(f"   VM {mode:<9}                      {t * 1e6:7.2f} us / iteration -> "
              f"{overhead * 1e9:6.0f} ns / instruction of VM overhead")
    return {"floor": floor, **results, "instructions": per_iter_instructions}


def _noop(a, out):
    pass


def section_kernel_calls(calls: int, repeat: int) -> dict:
    instrs = [bc.InvokePacked(0, 2, 1, (0, 1)) for _ in range(calls)] + [bc.Ret(1)]
    fn = bc.VMFunction("main", ("a", "b"), tuple(instrs), 2)
    exe = Executable([fn], [], [PrimitiveInfo("noop", num_inputs=1, num_outputs=1)], kernel_overrides=[_noop])
    a, b = np.zeros(4, "float32"), np.zeros(4, "float32")

    def direct():
        for _ in range(calls):
            _noop(a, b)
    base = best_of(direct, repeat) / calls
    x, y = np.ones(4, "float32"), np.ones(4, "float32")
    ufunc = best_of(lambda: [np.add(x, y, out=b) for _ in range(calls)], repeat) / calls
    out = {}
    print(f"\n2. kernel-call overhead ({calls} invoke_packed of a no-op kernel; a NumPy add(out=) call is "
          f"{ufunc * 1e6:.2f} us)")
    for mode in ("bytecode", "compiled"):
        vm = VirtualMachine(exe.with_exec_mode(mode))
        t = best_of(lambda vm=vm: vm.invoke("main", a, b), repeat) / calls
        out[mode] = t - base
        print(f"   {mode:<9} {(t - base) * 1e9:6.0f} ns per kernel call on top of the call itself "
              f"({t * 1e9:.0f} ns in all)")
    return out


def section_dispatch_design(length: int, repeat: int) -> dict:
    """The VM's if-chain against per-instruction bound handlers, on one long straight-line function of
    Move/GetField/LoadConst (cheap instructions, so dispatch dominates)."""
    body = [bc.AllocADT(0, (0, 0), 1)]
    for i in range(length):
        body.append((bc.Move(0, 2), bc.GetField(1, 1, 3), bc.LoadConst(0, 4))[i % 3])
    fn = bc.VMFunction("main", ("x",), tuple(body + [bc.Ret(2)]), 5)
    exe = Executable([fn], [np.zeros(2, "float32")], [], kernel_overrides=[])
    vm = VirtualMachine(exe)
    info = vm._funcs[0]
    x = np.zeros(1, "float32")
    t_chain = best_of(lambda: vm._run(info, [x]), repeat) / len(body)

    # The alternative design: each decoded instruction becomes a closure returning the next pc.
    from tensorvm.runtime.object import ADT
    from tensorvm.vm import decoded

    def make(ins, pc):
        op = ins[0]
        if op == decoded.MOVE:
            d, s_ = ins[1], ins[2]

            def h(regs):
                regs[d] = regs[s_]
                return pc + 1
        elif op == decoded.GET_FIELD:
            d, o, k = ins[1], ins[2], ins[3]

            def h(regs):
                regs[d] = regs[o].fields[k]
                return pc + 1
        elif op == decoded.LOAD:
            d, v = ins[1], ins[2]

            def h(regs):
                regs[d] = v
                return pc + 1
        elif op == decoded.ALLOC_ADT:
            d, tag, get = ins[1], ins[2], ins[3]

            def h(regs):
                regs[d] = ADT(tag, get(regs))
                return pc + 1
        else:  # RET
            r = ins[1]

            def h(regs):
                regs[0] = regs[r]
                return -1
        return h
    handlers = [make(ins, pc) for pc, ins in enumerate(info.code)]

    def handler_loop():
        regs = [x, None, None, None, None]
        pc = 0
        while pc >= 0:
            pc = handlers[pc](regs)
        return regs[0]
    t_handlers = best_of(handler_loop, repeat) / len(body)
    print(f"\n3. dispatch design ({len(body)} straight-line Move/GetField/LoadConst instructions)")
    print(f"   if-chain over decoded tuples (the VM's loop)   {t_chain * 1e9:5.0f} ns / instruction")
    print(f"   a bound handler function per instruction       {t_handlers * 1e9:5.0f} ns / instruction")
    return {"if_chain": t_chain, "handlers": t_handlers}


MLP = """
def @main(%x: Tensor[({batch}, 256), float32], %w1: Tensor[(512, 256), float32], %w2: Tensor[(512, 512), float32],
          %w3: Tensor[(512, 512), float32], %w4: Tensor[(10, 512), float32]) {{
  %0 = nn.relu(nn.dense(%x, %w1));
  %1 = nn.relu(nn.dense(%0, %w2));
  %2 = nn.relu(nn.dense(%1, %w3));
  nn.dense(%2, %w4)
}}
"""


def section_memory(batch: int, repeat: int) -> dict:
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal(s).astype("float32") * 0.05 for s in [(512, 256), (512, 512), (512, 512), (10, 512)]]
    x = rng.standard_normal((batch, 256)).astype("float32")
    rows = {}
    print(f"\n4. memory planning (4-layer MLP, batch {batch}, naive allocator; peak live bytes of one call)")
    for label, dim in (("static MLP", str(batch)), ("dynamic-batch MLP", "?")):
        mod = tv.parse(MLP.format(batch=dim))
        for plan in (True, False):
            vm = VirtualMachine(tv.vm.compile(mod, memory_plan=plan), allocator="naive")
            vm.invoke("main", x, *weights)
            vm.reset_memory_stats()
            vm.invoke("main", x, *weights)
            stats = vm.memory_stats()
            t = best_of(lambda vm=vm: vm.invoke("main", x, *weights), repeat)
            rows[(label, plan)] = stats
            print(f"   {label:<18} memory plan {'on ' if plan else 'off'}  peak {stats['peak_bytes'] / 1024:8.1f} KiB"
                  f"  allocations/call {stats['num_allocations']:2d}  time {t * 1e6:8.1f} us")
    return rows


CHAIN_OPS = ("add", "multiply", "subtract", "maximum")


def chain_text(length: int, dim: str) -> str:
    """``length`` tiny binary ops in a row on a ``(dim,)`` float32 tensor."""
    lines = [f"def @main(%x: Tensor[({dim},), float32], %y: Tensor[({dim},), float32]) {{", "  %0 = add(%x, %y);"]
    for i in range(1, length):
        lines.append(f"  %{i} = {CHAIN_OPS[i % len(CHAIN_OPS)]}(%{i - 1}, %y);")
    lines.append(f"  %{length - 1}")
    lines.append("}")
    return "\n".join(lines)


def section_chain(length: int, repeat: int, targets) -> dict:
    """Per-kernel-call overhead of the VM in a straight-line program of tiny kernels."""
    x, y = np.ones(8, "float32"), np.full(8, 0.5, "float32")
    print(f"\n5. per-kernel-call overhead: {length} tiny ops, one kernel each (opt_level=0), tensors of 8 floats")
    print("   VM overhead per kernel call = (VM time - the same kernels called directly) / kernel calls")
    rows = {}
    for target in targets:
        for label, dim in (("static", "8"), ("dynamic", "?")):
            exe = tv.vm.compile(tv.parse(chain_text(length, dim)), target=target, opt_level=0)
            kernel_names = [p.name for p in exe.primitives if p.kind == "kernel"]
            calls = sum(1 for fn in exe.functions for ins in fn.instructions
                        if isinstance(ins, bc.InvokePacked) and exe.primitives[ins.packed_index].kind == "kernel")
            direct = []  # the kernels called directly on preallocated outputs: the floor
            kernels = dict(zip((p.name for p in exe.primitives), exe.kernels))
            out = np.empty(8, "float32")
            for fn in exe.functions:
                for ins in fn.instructions:
                    if isinstance(ins, bc.InvokePacked) and exe.primitives[ins.packed_index].kind == "kernel":
                        kernel = kernels[exe.primitives[ins.packed_index].name]
                        direct.append((kernel, (x, y, out) if ins.arity == 3 else (x, out)))

            def floor_run(direct=direct):
                for kernel, args in direct:
                    kernel(*args)
            floor = best_of(floor_run, repeat)
            for mode in modes_for(target):
                vm = VirtualMachine(exe.with_exec_mode(mode))
                got = vm.invoke("main", x, y).numpy()
                assert got.shape == (8,)
                t = best_of(lambda vm=vm: vm.invoke("main", x, y), repeat)
                per_call = (t - floor) / calls
                rows[(target, label, mode)] = per_call
                print(f"   [{target:<6}] {label:<7} {mode:<9} {t * 1e6:8.1f} us per run, kernels alone "
                      f"{floor * 1e6:7.1f} us -> {per_call * 1e9:6.0f} ns VM overhead per kernel call "
                      f"({len(kernel_names)} kernels, {calls} calls; {t / calls * 1e9:5.0f} ns per call in all)")
                if mode == "native":
                    rows[(target, label, "native-c")] = native_overhead(vm, exe, dim, x, y, calls, repeat)
    return rows


def native_overhead(vm, exe, dim: str, x, y, calls: int, repeat: int) -> float:
    """Native mode's cost per kernel call above the kernel itself: (the run - one invoke of a program with
    the same arguments and no kernel - the same kernel calls made from C) / kernel calls."""
    import ctypes

    from tensorvm.vm.native_mode import bridge_module

    library = exe.c_library
    if library is None or library.abi is None:
        print("   (native, kernels from C: the library has no kernel ABI to call them by)")
        return float("nan")
    cdll = ctypes.CDLL(library.library_path)
    out = np.empty(8, "float32")
    addresses, words = [], []
    for fn in exe.functions:
        for ins in fn.instructions:
            if isinstance(ins, bc.InvokePacked) and exe.primitives[ins.packed_index].kind == "kernel":
                abi = library.abi.kernels[exe.primitives[ins.packed_index].name]
                arrays = (x, y, out) if ins.arity == 3 else (x, out)
                dims = tuple(arrays[k].shape[axis] for k, axis in abi.dim_positions())
                addresses.append(ctypes.cast(getattr(cdll, abi.symbol), ctypes.c_void_p).value)
                words.append(tuple(a.ctypes.data for a in arrays) + dims)
    time_calls = bridge_module().time_calls
    c_floor = min(time_calls(tuple(addresses), tuple(words), 50) for _ in range(repeat))
    empty = VirtualMachine(tv.vm.compile(tv.parse(
        f"def @main(%x: Tensor[({dim},), float32], %y: Tensor[({dim},), float32]) {{ %x }}"),
        target="c", exec_mode="native"))
    t_empty, t = float("inf"), float("inf")
    for _ in range(10):  # interleaved, many runs: the difference of two small times
        t_empty = min(t_empty, best_of(lambda: empty.invoke("main", x, y), repeat))
        t = min(t, best_of(lambda: vm.invoke("main", x, y), repeat))
    per_call = (t - t_empty - c_floor) / calls
    print(f"   [c     ]         native    {t * 1e6:8.1f} us per run = invoke without kernels {t_empty * 1e6:5.2f} us "
          f"+ kernels from C {c_floor * 1e6:5.2f} us + {per_call * 1e9:5.0f} ns per kernel call above the kernel")
    return per_call


MLP_784 = """
def @main(%x: Tensor[({batch}, 784), float32], %w1: Tensor[(512, 784), float32], %b1: Tensor[(512), float32],
          %w2: Tensor[(512, 512), float32], %b2: Tensor[(512), float32], %w3: Tensor[(10, 512), float32],
          %b3: Tensor[(10), float32]) {{
  %0 = nn.relu(add(nn.dense(%x, %w1), %b1));
  %1 = nn.relu(add(nn.dense(%0, %w2), %b2));
  add(nn.dense(%1, %w3), %b3)
}}
"""


def section_static_vs_dynamic(repeat: int, targets, batches=(1, 64)) -> dict:
    rng = np.random.default_rng(0)
    shapes = {"w1": (512, 784), "b1": (512,), "w2": (512, 512), "b2": (512,), "w3": (10, 512), "b3": (10,)}
    params = {k: (rng.standard_normal(s) * 0.05).astype("float32") for k, s in shapes.items()}
    print("\n6. static vs dynamic batch: MLP 784-512-512-10, weights bound as constants; dynamic / static time")
    rows = {}
    for target in targets:
        dynamic_exe = tv.vm.compile(tv.parse(MLP_784.format(batch="?")), target=target, params=params)
        for batch in batches:
            x = rng.standard_normal((batch, 784)).astype("float32")
            static_exe = tv.vm.compile(tv.parse(MLP_784.format(batch=batch)), target=target, params=params)
            for mode in modes_for(target):
                vms = {label: VirtualMachine(exe.with_exec_mode(mode))
                       for label, exe in (("static", static_exe), ("dynamic", dynamic_exe))}
                outs = [vm.invoke("main", x).numpy() for vm in vms.values()]
                np.testing.assert_allclose(outs[0], outs[1], rtol=1e-4, atol=1e-5)
                times = {label: [] for label in vms}
                for _ in range(repeat):  # interleaved, so drift hits both alike
                    for label, vm in vms.items():
                        times[label].append(best_of(lambda vm=vm, x=x: vm.invoke("main", x), 20))
                t_static, t_dynamic = min(times["static"]), min(times["dynamic"])
                rows[(target, batch, mode)] = (t_static, t_dynamic)
                print(f"   [{target:<6}] batch {batch:<3} {mode:<9} static {t_static * 1e6:8.1f} us  dynamic "
                      f"{t_dynamic * 1e6:8.1f} us  ratio {t_dynamic / t_static:5.2f}")
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--sections", default="1,2,3,4,5,6", help="comma-separated section numbers")
    parser.add_argument("--targets", default="python,c", help="kernel targets for sections 1, 5 and 6")
    args = parser.parse_args(argv)
    n = 2000 if args.quick else 20000
    repeat = 3 if args.quick else 7
    sections = {int(x) for x in args.sections.split(",")}
    targets = [t for t in args.targets.split(",") if t]
    print(f"tensorvm VM overhead (python {sys.version.split()[0]}, numpy {np.__version__}, "
          f"OMP/BLAS threads {os.environ.get('OMP_NUM_THREADS')})")
    if 1 in sections:
        for target in targets:
            section_loop(n, repeat, target)
    if 2 in sections:
        section_kernel_calls(1000, repeat)
    if 3 in sections:
        section_dispatch_design(3000, repeat * 4)
    if 4 in sections:
        section_memory(64, repeat)
    if 5 in sections:
        section_chain(64, repeat * 4, targets)
    if 6 in sections:
        section_static_vs_dynamic(repeat, targets)


if __name__ == "__main__":
    main()
