"""The hand-written C of the package (codegen/lib/*.h, codegen/probes/*.c, vm/native/*.c) compiles
warning-free with ``-Wall -Wextra -Werror`` in each configuration it is built in, is what the code
generator emits, and is installed with the package."""

from __future__ import annotations

import fnmatch
import platform
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

import tensorvm
from tensorvm.codegen import c_emit
from tensorvm.codegen.c_emit import LIBRARY_DIR
from tensorvm.vm import fastcall, native_emit

_WARNINGS = ("-Wall", "-Wextra", "-Werror")
_X86 = platform.machine() in ("x86_64", "AMD64")


def _compiler() -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    return cc


def _compile(tmp_path, text_or_file, flags, suffix=".c"):
    cc = _compiler()
    if isinstance(text_or_file, Path):
        source = text_or_file
    else:
        source = tmp_path / f"unit{suffix}"
        source.write_text(text_or_file)
    result = subprocess.run([cc, *flags, *_WARNINGS, "-x", "c", "-c", str(source), "-o", str(tmp_path / "unit.o")],
                            capture_output=True, text=True)
    assert result.returncode == 0, f"{source.name} with {' '.join(flags)}:\n{result.stderr[:4000]}"


def _accepted(tmp_path, flags) -> bool:
    probe = tmp_path / "probe.c"
    probe.write_text("int tv_probe(void) { return 0; }\n")
    return subprocess.run([_compiler(), *flags, "-c", str(probe), "-o", str(tmp_path / "probe.o")],
                          capture_output=True).returncode == 0


# The shared-library builds: OpenMP (threads and simd), OpenMP simd only, or neither (compilers without
# OpenMP; the generated kernels then carry the same pragmas, ignored); AVX2 tiles and the portable ones.
_ISAS = {"avx2": ("-mavx2", "-mfma"), "portable": ("-march=x86-64",)} if _X86 else {"portable": ()}
_OPENMP = {"openmp": ("-fopenmp",), "openmp-simd": ("-fopenmp-simd",),
           # (an unknown pragma is what a compiler without OpenMP is meant to skip, here as in every kernel)
           "no-openmp": ("-Wno-unknown-pragmas",)}
_CONFIGS = [(isa, omp, packed) for isa in _ISAS for omp in _OPENMP for packed in (False, True)]


@pytest.mark.parametrize("isa,openmp,packed", _CONFIGS,
                         ids=[f"{i}-{o}-{'packed' if p else 'plain'}" for i, o, p in _CONFIGS])
@pytest.mark.parametrize("header", ["tv_kernel.h", "tv_gemm.h"])
def test_kernel_headers_compile_warning_free(tmp_path, header, isa, openmp, packed):
    flags = ["-std=gnu11", "-O2", "-fwrapv", "-DTV_VECTOR_MATH", "-DTV_NO_LOOP_IF_CONVERSION", *_ISAS[isa],
             *_OPENMP[openmp]] + (["-DTV_PACKED_KERNELS"] if packed else [])
    if not _accepted(tmp_path, flags):
        pytest.skip(f"the compiler does not accept {' '.join(flags)}")
    _compile(tmp_path, LIBRARY_DIR / header, flags)


def test_prelude_compiles_warning_free_with_this_toolchain(tmp_path):
    """The whole prelude (tv_kernel.h and tv_gemm.h, products included) with the probed kernel flags."""
    from tensorvm.codegen.build import find_toolchain

    _compiler()
    toolchain = find_toolchain()
    flags = [f for f in toolchain.flags if f != "-shared"]
    _compile(tmp_path, c_emit.prelude(), flags)


@pytest.mark.parametrize("openmp", [(), ("-fopenmp",)], ids=["serial", "openmp"])
def test_aot_prelude_compiles_warning_free_as_c11(tmp_path, openmp):
    """AOT's form of tv_kernel.h (static functions, optional pragmas), as applications build it."""
    from tensorvm.aot.build import _static_prelude

    _compile(tmp_path, _static_prelude(c_emit.PRELUDE), ["-std=c11", "-O2", *openmp])


def _python_include() -> str:
    include = sysconfig.get_paths().get("include") or ""
    if not (Path(include) / "Python.h").is_file():
        pytest.skip(f"no Python.h in {include!r}")
    return include


def test_fastcall_extension_compiles_warning_free(tmp_path):
    if not (_X86 or platform.machine() in ("aarch64", "arm64")):
        pytest.skip("the fast caller is built on x86-64 and AArch64 only")
    flags = ["-std=gnu11", "-O2", "-fPIC", f"-I{_python_include()}", f"-I{np.get_include()}"]
    _compile(tmp_path, fastcall.source(), flags)


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_native_runtime_compiles_warning_free(tmp_path, opt):
    """The native exec mode's runtime (vm/native/tv_runtime.c), as the library and the bridge include it."""
    native = Path(fastcall.__file__).parent / "native"
    _compile(tmp_path, native / "tv_runtime.c", ["-std=gnu11", opt, "-fPIC", f"-I{native}"])
    # the generated code's helpers, with the two functions the generated code defines
    helpers = native_emit.runtime_text(native_emit.HELPERS_SOURCE) + (
        "static int32_t tvn_function_arity(int32_t f) { return f == 0 ? 0 : -1; }\n"
        "static tv_function tvn_function(int32_t f) { (void)f; return 0; }\n"
        "int32_t tv_use(tv_ctx* ctx, tv_obj* c, tv_obj** ret);\n"
        "int32_t tv_use(tv_ctx* ctx, tv_obj* c, tv_obj** ret) { return tvn_call_closure(ctx, c, ret, 0, ret, 0, 0); }\n")
    _compile(tmp_path, helpers, ["-std=gnu11", opt, "-fPIC"])


def test_native_bridge_compiles_warning_free(tmp_path):
    from tensorvm.vm import native_mode

    flags = ["-std=gnu11", "-O2", "-fPIC", f"-I{_python_include()}", f"-I{np.get_include()}"]
    _compile(tmp_path, native_mode.bridge_source(), flags)


def test_python_wrapper_helpers_compile_warning_free(tmp_path):
    _compile(tmp_path, LIBRARY_DIR / "tv_python.h", ["-std=gnu11", "-O2", "-fPIC", f"-I{_python_include()}"])


@pytest.mark.parametrize("probe", ["if_conversion.c", "vector_math.c"])
def test_toolchain_probes_compile_warning_free(tmp_path, probe):
    """As the toolchain probe builds them (with OpenMP when the compiler has it)."""
    probes = Path(c_emit.__file__).parent / "probes"
    flags = ["-std=gnu11", "-O3", "-fPIC", "-DTV_VECTOR_MATH", f"-I{LIBRARY_DIR}"]
    flags += ["-fopenmp"] if _accepted(tmp_path, ["-fopenmp"]) else _OPENMP["no-openmp"]
    _compile(tmp_path, probes / probe, flags)


def test_generated_text_is_the_files_text():
    """What is compiled (and hashed into the kernel cache's keys) is the files' text, so editing a file
    rebuilds the kernels that use it."""
    vec = (LIBRARY_DIR / "tv_vec.h").read_text()
    kernel = (LIBRARY_DIR / "tv_kernel.h").read_text().replace('#include "tv_vec.h"\n', vec)
    vgemm = (LIBRARY_DIR / "tv_vgemm.h").read_text().replace('#include "tv_vec.h"\n', vec)
    gemm = (LIBRARY_DIR / "tv_gemm.h").read_text().replace('#include "tv_kernel.h"\n', "")
    gemm = gemm.replace('#include "tv_vgemm.h"\n', vgemm)
    gemm = gemm.replace('#include "tv_vconv.h"\n', (LIBRARY_DIR / "tv_vconv.h").read_text())
    gemm = gemm.replace('#include "tv_vpointwise.h"\n', (LIBRARY_DIR / "tv_vpointwise.h").read_text())
    gemm = gemm.replace('#include "tv_vpool.h"\n', (LIBRARY_DIR / "tv_vpool.h").read_text())
    gemm = gemm.replace('#include "tv_clock.h"\n', (LIBRARY_DIR / "tv_clock.h").read_text())
    gemm = gemm.replace('#include "tv_team.h"\n', (LIBRARY_DIR / "tv_team.h").read_text())
    assert c_emit.PRELUDE.endswith(kernel) and c_emit.prelude().endswith(gemm)
    # the packed product is instantiated for the host by macros in the text (so the cache keys on them)
    from tensorvm.codegen.host import gemm_params

    assert f"#define TV_VGEMM_MR {gemm_params().mr}\n" in c_emit.prelude()
    assert c_emit.prelude(static_functions=True).count("tv_gemm") == 0
    native = (Path(fastcall.__file__).parent / "native" / "fastcall.c").read_text()
    head, tail = native.split('#include "tv_fastcall_config.h"')
    source = fastcall.source()
    assert source.startswith(head) and source.endswith(tail)
    assert f"numpy {np.__version__}" in source and f"python {sys.version.split()[0]}" in source
    assert f"#define MAX_ARGS {fastcall.MAX_ARGS}" in source
    assert f"case {fastcall.MAX_ARGS}: return" in source and f"case {fastcall.MAX_ARGS + 1}:" not in source


def test_every_c_file_is_package_data():
    """pyproject's package-data patterns cover each .c/.h file of the package (else an installed
    tensorvm would miss it)."""
    tomllib = pytest.importorskip("tomllib")
    package = Path(tensorvm.__file__).parent
    pyproject = package.parent / "pyproject.toml"
    if not pyproject.is_file():
        pytest.skip("not a source checkout (no pyproject.toml beside the package)")
    patterns = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"]["tensorvm"]
    files = [p.relative_to(package).as_posix() for p in package.rglob("*") if p.suffix in (".c", ".h")]
    assert "vm/native/fastcall.c" in files and "codegen/lib/tv_gemm.h" in files
    missing = [f for f in files if not any(fnmatch.fnmatchcase(f, pattern) for pattern in patterns)]
    assert missing == []


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_pool_library_compiles_warning_free(tmp_path, opt):
    """The process pool's library (codegen/lib/pool/tv_pool.c with tv_team.h), as codegen/pool.py builds it."""
    if not _accepted(tmp_path, ["-fopenmp"]):
        pytest.skip("the pool is built with OpenMP toolchains only")
    _compile(tmp_path, c_emit.library_text(["pool/tv_pool.c"]), ["-std=gnu11", opt, "-fPIC", "-fopenmp"])
