"""Threads: a VM shared by threads serialises its calls, VMs in threads (kernels without the GIL) give the
interpreter's answers, the graph executor and the interpreter can be shared, and deep recursions in
several threads, interrupted or failing, leave the process healthy (crash tests run in a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import tensorvm as tv
from tensorvm.codegen.build import have_compiler
from tensorvm.errors import ExecutionError
from tensorvm.vm import VirtualMachine

MODES = ["bytecode", "compiled"]
TARGETS = ["python", pytest.param("c", marks=pytest.mark.skipif(not have_compiler(), reason="no C compiler"))]

# dynamic batch, straight-line: shapes seen twice run specialized, with buffers kept per VM and shape
CHAIN = """
def @main(%x: Tensor[(?, 64), float32], %w: Tensor[(64, 64), float32], %b: Tensor[(64), float32]) {
  %0 = tanh(add(nn.dense(%x, %w), %b));
  %1 = tanh(add(nn.dense(%0, %w), %b));
  %2 = tanh(add(nn.dense(%1, %w), %b));
  multiply(%2, 2f)
}
"""

SUM_UP = """
def @main(%i: int32) -> int32 { @sum_up(%i) }
def @sum_up(%i1: int32) -> int32 {
  %0 = equal(%i1, 0);
  if (%0) { %i1 } else { %1 = subtract(%i1, 1); %2 = @sum_up(%1); add(%2, %i1) }
}
"""


@pytest.fixture(scope="module")
def chain_mod():
    return tv.parse(CHAIN)


@pytest.fixture(scope="module")
def reference(chain_mod):
    return tv.create_executor("debug", chain_mod).evaluate()


@pytest.fixture
def fast_switching():
    """Threads switch every 10 us (default 5 ms), so that races show within a few calls."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(old)


def _inputs(seed: int, count: int):
    """``count`` argument tuples, batches mostly 8, 16 or 32 (repeated, so that shapes get specialized,
    and shared by the threads), sometimes 1..40."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((64, 64)) / 8).astype("float32")
    b = rng.standard_normal(64).astype("float32")
    return [(rng.standard_normal((int(rng.choice([8, 16, 32, int(rng.integers(1, 41))])), 64)).astype("float32"),
             w, b) for _ in range(count)]


def _run_threads(work, count: int) -> list:
    """Runs ``work(k)`` on ``count`` threads; returns the exceptions they raised."""
    errors: list = []

    def guarded(k):
        try:
            work(k)
        except BaseException as err:  # noqa: BLE001 - reported by the test
            errors.append(err)

    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def _check_concurrent(make_vm, reference, threads: int, calls: int):
    """``threads`` threads x ``calls`` calls, each result compared to the interpreter's."""
    jobs = [_inputs(k, calls) for k in range(threads)]
    wants = [[reference(*args).numpy() for args in job] for job in jobs]
    wrong: list = []

    def work(k):
        vm = make_vm()
        for args, want in zip(jobs[k], wants[k]):
            got = vm.invoke("main", *args).numpy()
            if got.shape != want.shape or not np.allclose(got, want, rtol=1e-4, atol=1e-5):
                wrong.append((k, args[0].shape))

    errors = _run_threads(work, threads)
    assert not errors, errors[:3]
    assert not wrong, f"{len(wrong)} of {threads * calls} results differ from the interpreter's: {wrong[:5]}"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mode", MODES)
def test_one_vm_shared_by_threads_gives_the_interpreters_answers(chain_mod, reference, fast_switching, target,
                                                                 mode):
    vm = VirtualMachine(tv.vm.compile(chain_mod, target=target, exec_mode=mode))
    _check_concurrent(lambda: vm, reference, threads=4, calls=25)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mode", MODES)
def test_a_call_on_a_busy_vm_does_not_overwrite_the_running_ones_buffers(chain_mod, reference, target, mode):
    """Thread A stops before its last kernel (its intermediates are in the buffers the VM keeps for the
    shape) and waits up to 0.5 s for thread B's whole call on the same VM and shape: B must wait for A
    instead of writing A's intermediates."""
    exe = tv.vm.compile(chain_mod, target=target, exec_mode=mode)
    kernels = exe.kernels
    main_kernels = [i for i, p in enumerate(exe.primitives) if p.kind == "kernel"]
    state = {"calls": 0, "last": None}
    b_done = threading.Event()

    def pausing(kernel):
        def call(*args):
            if threading.current_thread().name == "A":
                state["calls"] += 1
                if state["calls"] == state["last"]:
                    b_done.wait(0.5)
            return kernel(*args)
        return call

    for i in main_kernels:
        kernels[i] = pausing(kernels[i])
    vm = VirtualMachine(exe)
    (xa, w, b), (xb, _, _) = _inputs(1, 1)[0], _inputs(2, 1)[0]
    xa, xb = np.resize(xa, (16, 64)), np.resize(xb, (16, 64)) + 1
    for _ in range(2):  # the shape is specialized (buffers kept) from its second call
        vm.invoke("main", xa, w, b)
    results: dict = {}

    def run_a():
        state["calls"], state["last"] = 0, len(main_kernels)
        results["a"] = vm.invoke("main", xa, w, b).numpy()

    def run_b():
        results["b"] = vm.invoke("main", xb, w, b).numpy()
        b_done.set()

    a = threading.Thread(target=run_a, name="A")
    a.start()
    while state["calls"] < len(main_kernels) and a.is_alive():  # A is at its last kernel
        time.sleep(0.001)
    bt = threading.Thread(target=run_b, name="B")
    bt.start()
    a.join(10)
    bt.join(10)
    np.testing.assert_allclose(results["a"], reference(xa, w, b).numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(results["b"], reference(xb, w, b).numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("mode", MODES)
def test_vms_in_threads_give_the_interpreters_answers(chain_mod, reference, fast_switching, target, mode):
    exe = tv.vm.compile(chain_mod, target=target, exec_mode=mode)  # one executable, a VM per thread
    _check_concurrent(lambda: VirtualMachine(exe), reference, threads=3, calls=50)


@pytest.mark.parametrize("kind", ["graph", "debug", pytest.param("aot", marks=pytest.mark.skipif(
    not have_compiler(), reason="no C compiler"))])
def test_graph_aot_and_interpreter_executors_shared_by_threads(fast_switching, kind):
    static = tv.parse(CHAIN.replace("?", "8"))
    reference = tv.create_executor("debug", static).evaluate()
    run = tv.create_executor(kind, static).evaluate()
    jobs = [[(np.resize(x, (8, 64)), w, b) for x, w, b in _inputs(k, 20)] for k in range(4)]
    wants = [[reference(*args).numpy() for args in job] for job in jobs]
    wrong: list = []

    def work(k):
        for args, want in zip(jobs[k], wants[k]):
            if not np.allclose(np.asarray(run(*args).numpy()), want, rtol=1e-4, atol=1e-5):
                wrong.append(k)

    assert not _run_threads(work, 4)
    assert not wrong, f"{kind}: {len(wrong)} of 80 results differ from the interpreter's"


@pytest.mark.parametrize("mode", MODES)
def test_a_busy_vm_makes_other_threads_wait(mode):
    """A call from another thread waits for the running one (held inside a kernel here), then runs."""
    vm = VirtualMachine(tv.vm.compile(tv.parse(SUM_UP), exec_mode=mode))
    inside, release = threading.Event(), threading.Event()

    def hold(name, before, *_):
        if before and not inside.is_set():
            inside.set()
            assert release.wait(10)

    vm.set_instrument(hold)
    results: dict = {}
    first = threading.Thread(target=lambda: results.setdefault("first", vm.invoke("main", 10).numpy()))
    first.start()
    assert inside.wait(10)
    second = threading.Thread(target=lambda: results.setdefault("second", vm.invoke("main", 20).numpy()))
    second.start()
    second.join(0.3)
    assert second.is_alive() and "second" not in results  # waiting for the first call
    release.set()
    first.join(10)
    second.join(10)
    assert results == {"first": 55, "second": 210}


@pytest.mark.parametrize("mode", MODES)
def test_a_call_from_an_instrument_callback_runs(mode):
    vm = VirtualMachine(tv.vm.compile(tv.parse(SUM_UP), exec_mode=mode))
    inner: list = []

    def callback(name, before, *_):
        if before and not inner:
            inner.append(None)  # (the nested call runs this callback too)
            inner[0] = int(vm.invoke("main", 4).numpy())

    vm.set_instrument(callback)
    assert int(vm.invoke("main", 6).numpy()) == 21
    assert inner == [10]


@pytest.mark.parametrize("mode", MODES)
def test_a_reentrant_call_in_plain_mode_is_refused(chain_mod, mode):
    """A call nested in a running one without instrumentation (in practice: a signal handler) would share
    the running call's buffers: refused with an ExecutionError, and the VM works afterwards."""
    vm = VirtualMachine(tv.vm.compile(chain_mod, exec_mode=mode))
    args = _inputs(0, 1)[0]

    def callback(name, before, *_):
        vm.set_instrument(None)  # back to the plain program, inside the running call
        vm.invoke("main", *args)

    vm.set_instrument(callback)
    with pytest.raises(ExecutionError, match="already running a call on this thread"):
        vm.invoke("main", *args)
    want = tv.create_executor("debug", chain_mod).evaluate()(*args).numpy()
    np.testing.assert_allclose(vm.invoke("main", *args).numpy(), want, rtol=1e-4, atol=1e-5)


def test_only_programs_whose_calls_can_nest_count_as_recursion_users(chain_mod):
    """(compiled mode: a call of such a program holds the recursion limit from being lowered under it)"""
    from tensorvm.vm.compiled import may_nest

    loop = tv.parse("""
    def @main(%i: int32) -> int32 { @loop(%i, 0) }
    def @loop(%i: int32, %acc: int32) -> int32 {
      if (equal(%i, 0)) { %acc } else { @loop(subtract(%i, 1), add(%acc, %i)) }
    }
    """)
    assert may_nest(tv.vm.compile(tv.parse(SUM_UP)))  # add(@sum_up(..), ..): not a tail call
    assert not may_nest(tv.vm.compile(loop))          # a tail call: a loop
    assert not may_nest(tv.vm.compile(chain_mod))


# --- deep recursion in threads (subprocess: a failure may abort the interpreter) ---------------------
_PRELUDE = textwrap.dedent('''
    import gc, signal, sys, threading, time
    import tensorvm as tv
    import tensorvm.ir.functor  # (raises the recursion limit once when it loads; `import tensorvm` is lazy)
    from tensorvm.errors import ExecutionError
    SUM_UP = """{sum_up}"""
    NAT = """
    type Nat {{ Z, S(Nat), }}
    def @build(%i: int32) -> Nat {{
      %0 = equal(%i, 0);
      if (%0) {{ Z }} else {{ %1 = subtract(%i, 1); S(@build(%1)) }}
    }}
    def @count(%n: Nat) -> int32 {{ match? (%n) {{ S(%m) => add(@count(%m), 1), }} }}
    def @main(%i: int32) -> int32 {{ @count(@build(%i)) }}
    """
    LIMIT = sys.getrecursionlimit()

    def healthy():
        assert sys.getrecursionlimit() == LIMIT, (sys.getrecursionlimit(), LIMIT)
        for t in threading.enumerate():  # a worker may still be returning from its thread function
            if t.name.startswith("tensorvm-deep"):
                t.join(1.0)
                assert not t.is_alive(), t.name
        assert gc.isenabled()
''').format(sum_up=SUM_UP)

_TWO_DEEP = _PRELUDE + textwrap.dedent('''
    N = 20000
    errors = []
    def work(k):
        try:
            for mode in ("compiled", "bytecode"):
                vm = tv.vm.VirtualMachine(tv.vm.compile(tv.parse(SUM_UP), exec_mode=mode))
                got = int(vm.invoke("main", N + k).numpy())
                assert got == (N + k) * (N + k + 1) // 2, (mode, got)
            # an error at the bottom of the recursion: thread 0 in compiled mode, thread 1 in bytecode
            failing = tv.vm.VirtualMachine(tv.vm.compile(tv.parse(NAT), exec_mode=("compiled", "bytecode")[k]))
            try:
                failing.invoke("main", N)
                raise AssertionError("no error from the failing recursion")
            except ExecutionError as err:
                assert "no match clause" in str(err), err
            # the interpreter raises the limit (a recursion user) while the other thread runs the VM
            assert int(tv.create_executor("debug", tv.parse(SUM_UP)).evaluate()(2000).numpy()) == 2001000
        except BaseException as err:
            errors.append(repr(err))
    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads: t.start()
    for t in threads: t.join()
    assert not errors, errors
    healthy()
    print("ok")
''')

_INTERRUPTED = _PRELUDE + textwrap.dedent('''
    main = threading.get_ident()
    for mode in ("compiled", "bytecode"):
        vm = tv.vm.VirtualMachine(tv.vm.compile(tv.parse(SUM_UP), exec_mode=mode))
        vm.invoke("main", 100)
        # a Ctrl-C in the middle of a 100,000-deep recursion (in compiled mode: on the deep stack)
        timer = threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT))
        timer.start()
        try:
            # (until the interrupt comes, however fast the calls: a fixed count finished before the timer
            # fired on a busy machine)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                vm.invoke("main", 100000)
            raise AssertionError("not interrupted within 60 s")
        except KeyboardInterrupt:
            pass
        timer.join()
        healthy()
        assert int(vm.invoke("main", 30000).numpy()) == 30000 * 30001 // 2
        healthy()
    print("ok")
''')


def _run_script(source: str, tmp_path: Path):
    script = tmp_path / "script.py"
    script.write_text(source)
    env = dict(os.environ, PYTHONPATH=str(Path(tv.__file__).resolve().parents[1]))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)


def test_deep_recursions_in_two_threads_leave_the_process_healthy(tmp_path):
    done = _run_script(_TWO_DEEP, tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_an_interrupted_deep_recursion_leaves_the_process_healthy(tmp_path):
    done = _run_script(_INTERRUPTED, tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


@pytest.mark.parametrize("value", ["abc", "0", "-1", "1.5", ""])
def test_a_bad_thread_count_in_the_environment_warns_and_keeps_the_default(monkeypatch, value):
    from tensorvm.runtime import library

    monkeypatch.setenv("TENSORVM_NUM_THREADS", value)
    monkeypatch.setattr(library, "_NUM_THREADS", [None])
    with pytest.warns(RuntimeWarning, match=f"TENSORVM_NUM_THREADS={value!r}: expected a positive integer; "
                                            f"using the default"):
        library._threads_from_environment()
    assert library._NUM_THREADS == [None]


def test_importing_tensorvm_with_a_bad_thread_count_warns_and_runs():
    """At import: a warning on stderr, not a failed import; the budget is the default."""
    env = dict(os.environ, TENSORVM_NUM_THREADS="abc", OMP_NUM_THREADS="1")
    code = "import tensorvm as tv; print(tv.get_num_threads())"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "1", done.stderr[-3000:]
    assert "RuntimeWarning: tensorvm: ignoring TENSORVM_NUM_THREADS='abc'" in done.stderr
