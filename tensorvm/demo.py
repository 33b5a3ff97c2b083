"""``make demo``: parse the seeds' dynamic programs, type-check and print them, run them on the
interpreter and the VM; then the ONNX flow on an exported model with a dynamic axis.

Run with ``python -m tensorvm.demo``.
"""

from __future__ import annotations

import numpy as np

import tensorvm as tv

SOURCE = """
#[version = "0.0.5"]
def @main(%x: Tensor[(?, ?), float32], %y: Tensor[(1, 2), float32]) -> Tensor[(?, 2), float32] {
  add(%x, %y)
}

def @sum_up(%i1: int32) -> int32 {
  %0 = equal(%i1, 0 /* ty=int32 */) /* ty=bool */;
  if (%0) {
    %i1
  } else {
    %1 = subtract(%i1, 1 /* ty=int32 */) /* ty=int32 */;
    %2 = @sum_up(%1) /* ty=int32 */;
    add(%2, %i1) /* ty=int32 */
  }
}
"""


def _section(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 60 - len(title)))


def main() -> None:
    _section("parse")
    mod = tv.parse(SOURCE)
    _section("type-check and print (note main's (?, 2) result)")
    typed = tv.transform.InferType()(mod)
    print(typed.astext(show_types=True))

    interp = tv.interpreter.Interpreter(typed)
    x = np.arange(6, dtype="float32").reshape(3, 2)
    y = np.array([[10, 20]], dtype="float32")
    _section("interpreter: @main on (3, 2) + (1, 2)")
    print(interp.run("main", x, y))
    _section("interpreter: @main on (5, 2) + (1, 2), same program")
    print(interp.run("main", np.ones((5, 2), "float32"), y))
    _section("interpreter: @sum_up(10)")
    print(interp.run("sum_up", np.int32(10)))

    try:
        interp.run("main", np.ones((3, 4), "float32"), y)
    except tv.TensorVMError as err:
        _section("a run-time broadcast mismatch is a clear error")
        print(f"{type(err).__name__}: {err}")

    if _has_vm():
        _section("VM: compile, bytecode of @sum_up, run")
        exe = tv.vm.compile(typed, target="python")
        text = exe.as_text()
        start = text.find("sum_up")
        print(text[start:] if start >= 0 else text)
        vm = tv.vm.VirtualMachine(exe)
        print("main(3x2, 1x2) =", vm["main"](x, y).numpy().tolist())
        print("sum_up(100)    =", vm["sum_up"](np.int32(100)).numpy())

    try:
        from . import demo_onnx
    except ImportError as err:  # onnx is not installed: the IR demo above still stands
        print(f"\n(ONNX demo skipped: {err})")
        return
    _section("ONNX: export with a dynamic axis, import, compile, save, load, run at two lengths")
    demo_onnx.run()


def _has_vm() -> bool:
    try:
        return hasattr(tv.vm, "compile")
    except ImportError:
        return False


if __name__ == "__main__":
    main()
