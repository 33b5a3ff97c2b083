"""The virtual machine: bytecode, the VM compiler, executables (+ binary format), the VM, compiled mode.

    exe = tv.vm.compile(mod, target="python")        # lowered by tensorvm.transform.lower_for_vm
    vm = tv.vm.VirtualMachine(exe)                    # allocator="pooled" | "naive"
    out = vm.invoke("main", x, y)                     # or vm["main"](x, y)
    exe.save("model.tvx"); exe2 = tv.vm.load_executable("model.tvx")
"""

from .bytecode import Opcode, VMFunction  # noqa: F401
from .compiler import auto_exec_mode, compile  # noqa: F401
from .executable import AdtInfo, Executable, PrimitiveInfo  # noqa: F401
from .serialize import load_executable  # noqa: F401
from .vm import SKIP_RUN, InstrumentReturn, VirtualMachine  # noqa: F401

__all__ = ["compile", "auto_exec_mode", "VirtualMachine", "Executable", "load_executable", "SKIP_RUN", "InstrumentReturn",
           "Opcode", "VMFunction", "PrimitiveInfo", "AdtInfo"]
