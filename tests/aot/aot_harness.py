"""Helpers for the AOT tests: write a C application that runs several AOT models, build it with cc.

``write_application(modules, directory)`` writes every model's sources (as an application would
lay them out after unpacking a Model Library Format tarball) and a ``main.c`` that, for each model,
reads its inputs from ``<dir>/<model>_in<i>.bin``, runs it, writes ``<dir>/<model>_out<i>.bin`` and
prints ``AOT_TEST_SUCCESS`` when every run and every descriptor check passed. Models with an internal
workspace are called through their own structs and ``tvmgen_<name>_run``; models with an external
workspace through the shim (``tvaot_fill_inputs`` / ``tvaot_run``) with a static buffer of
``TVMGEN_<NAME>_WORKSPACE_SIZE`` bytes. The application also checks that the shim rejects a wrong
buffer size and a wrong buffer count.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path

import numpy as np

import tensorvm.aot as aot


def _buffer(name: str, size_macro: str) -> str:
    return f"static _Alignas(16) uint8_t {name}[{size_macro} > 0 ? {size_macro} : 1];"


def _model_block(m) -> tuple[list, list]:
    """(file-scope declarations, statements in main) for one model."""
    p, macro = m.prefix, f"TVMGEN_{m.name.upper()}"
    decls, body = [], [f"  /* ---- model {m.name} ---- */", "  {"]
    for i, t in enumerate(m.inputs):
        decls.append(_buffer(f"{m.name}_in{i}", f"{macro}_{t.name.upper()}_SIZE"))
    for i, t in enumerate(m.outputs):
        decls.append(_buffer(f"{m.name}_out{i}", f"{macro}_{t.name.upper()}_SIZE"))
    if m.workspace_external:
        decls.append(f"static _Alignas({macro}_WORKSPACE_ALIGNMENT) uint8_t {m.name}_workspace"
                     f"[{macro}_WORKSPACE_SIZE > 0 ? {macro}_WORKSPACE_SIZE : 1];")
    body.append(f'    CHECK({p}_model.num_inputs == {macro}_NUM_INPUTS && {p}_model.num_outputs == {macro}_NUM_OUTPUTS, '
                f'"{m.name}: descriptor counts");')
    body.append(f'    CHECK(tvaot_check_model(&{p}_model) == TVAOT_OK, "{m.name}: descriptor ABI");')
    body.append(f'    CHECK({p}_model.workspace_size == {macro}_WORKSPACE_SIZE, "{m.name}: workspace size");')
    for i, t in enumerate(m.inputs):
        body.append(f'    CHECK(read_file(dir, "{m.name}_in{i}.bin", {m.name}_in{i}, {macro}_{t.name.upper()}_SIZE), '
                    f'"{m.name}: reading input {i}");')
        body.append(f'    CHECK(tvaot_find_input(&{p}_model, "{t.name}") == {i}, "{m.name}: find input");')
    n_in, n_out = len(m.inputs), len(m.outputs)
    in_list = ", ".join(f"{m.name}_in{i}" for i in range(n_in)) or "NULL"
    out_list = ", ".join(f"{m.name}_out{i}" for i in range(n_out))
    in_sizes = ", ".join(f"{macro}_{t.name.upper()}_SIZE" for t in m.inputs) or "0"
    out_sizes = ", ".join(f"{macro}_{t.name.upper()}_SIZE" for t in m.outputs)
    body.append(f"    void* in_buffers[{max(n_in, 1)}] = {{{in_list}}};")
    body.append(f"    size_t in_sizes[{max(n_in, 1)}] = {{{in_sizes}}};")
    body.append(f"    void* out_buffers[{n_out}] = {{{out_list}}};")
    body.append(f"    size_t out_sizes[{n_out}] = {{{out_sizes}}};")
    if m.workspace_external:
        body.append(f"    struct {p}_inputs inputs;")
        body.append(f"    struct {p}_outputs outputs;")
        body.append(f'    CHECK(tvaot_fill_inputs(&{p}_model, &inputs, in_buffers, in_sizes, {n_in}) == TVAOT_OK, '
                    f'"{m.name}: fill inputs");')
        body.append(f'    CHECK(tvaot_fill_outputs(&{p}_model, &outputs, out_buffers, out_sizes, {n_out}) == TVAOT_OK, '
                    f'"{m.name}: fill outputs");')
        body.append(f"    int32_t rc = {p}_run(&inputs, &outputs, {m.name}_workspace);")
        body.append(f'    CHECK(rc == TVAOT_OK, "{m.name}: run");')
        body.append(f"    rc = tvaot_run(&{p}_model, in_buffers, in_sizes, {n_in}, out_buffers, out_sizes, {n_out}, "
                    f"{m.name}_workspace, sizeof({m.name}_workspace));")
        body.append(f'    CHECK(rc == TVAOT_OK, "{m.name}: tvaot_run");')
    else:
        members_in = ", ".join(f".{t.name} = {m.name}_in{i}" for i, t in enumerate(m.inputs)) or ".unused_ = NULL"
        members_out = ", ".join(f".{t.name} = {m.name}_out{i}" for i, t in enumerate(m.outputs))
        body.append(f"    struct {p}_inputs inputs = {{{members_in}}};")
        body.append(f"    struct {p}_outputs outputs = {{{members_out}}};")
        body.append(f"    int32_t rc = {p}_run(&inputs, &outputs);")
        body.append(f'    CHECK(rc == TVAOT_OK, "{m.name}: run");')
    # The shim must refuse a wrong size and a wrong count without running anything.
    body.append("    out_sizes[0] += 1;")
    body.append(f"    rc = tvaot_run(&{p}_model, in_buffers, in_sizes, {n_in}, out_buffers, out_sizes, {n_out}, NULL, 0);")
    body.append(f'    CHECK(rc == TVAOT_ERR_SIZE, "{m.name}: a wrong output size is refused");')
    body.append("    out_sizes[0] -= 1;")
    body.append(f"    rc = tvaot_run(&{p}_model, in_buffers, in_sizes, {n_in}, out_buffers, out_sizes, {n_out} + 1, "
                f"NULL, 0);")
    body.append(f'    CHECK(rc == TVAOT_ERR_NUM_TENSORS, "{m.name}: a wrong buffer count is refused");')
    for i, t in enumerate(m.outputs):
        body.append(f'    CHECK(write_file(dir, "{m.name}_out{i}.bin", {m.name}_out{i}, '
                    f'{macro}_{t.name.upper()}_SIZE), "{m.name}: writing output {i}");')
    body.append("  }")
    return decls, body


_MAIN_HEAD = r"""/* A test application linking several tensorvm AOT models (generated by tests/aot/aot_harness.py). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "tensorvm_aot.h"
%INCLUDES%

#define CHECK(cond, what)                                  \
  do {                                                     \
    if (!(cond)) {                                         \
      fprintf(stderr, "AOT_TEST_FAILURE: %s\n", what);     \
      return 1;                                            \
    }                                                      \
  } while (0)

static int read_file(const char* dir, const char* name, void* buffer, size_t size) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE* f = fopen(path, "rb");
  if (f == NULL) return 0;
  size_t got = size ? fread(buffer, 1, size, f) : 0;
  int extra = fgetc(f);
  fclose(f);
  return got == size && extra == EOF;
}

static int write_file(const char* dir, const char* name, const void* buffer, size_t size) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE* f = fopen(path, "wb");
  if (f == NULL) return 0;
  size_t put = size ? fwrite(buffer, 1, size, f) : 0;
  return fclose(f) == 0 && put == size;
}
"""


def write_application(modules, directory: Path, via_mlf: bool = True) -> dict:
    """Lay out the sources and ``main.c`` under ``directory``; returns include dirs and C sources.

    With ``via_mlf`` the models are exported to one Model Library Format tarball and unpacked, as an
    application build would consume them."""
    directory = Path(directory)
    tree = directory / "mlf"
    if via_mlf:
        archive = aot.export_model_library_format(list(modules), directory / "models.tar")
        with tarfile.open(archive) as tar:
            tar.extractall(tree, filter="data")
    else:
        for m in modules:
            for fname, text in m.sources.items():
                sub = "include" if fname.endswith(".h") else "src"
                (tree / "codegen/host" / sub).mkdir(parents=True, exist_ok=True)
                (tree / "codegen/host" / sub / fname).write_text(text)
        for rel, text in aot.runtime_files().items():
            (tree / "runtime" / rel).parent.mkdir(parents=True, exist_ok=True)
            (tree / "runtime" / rel).write_text(text)
    decls, body = [], []
    for m in modules:
        d, b = _model_block(m)
        decls += d
        body += b
    includes = "\n".join(f'#include "{m.header_name}"' for m in modules)
    main = [_MAIN_HEAD.replace("%INCLUDES%", includes), *decls, "",
            "int main(int argc, char** argv) {",
            '  if (argc != 2) { fprintf(stderr, "usage: %s DIR\\n", argv[0]); return 2; }',
            "  const char* dir = argv[1];", *body, '  printf("AOT_TEST_SUCCESS\\n");', "  return 0;", "}"]
    (directory / "main.c").write_text("\n".join(main) + "\n")
    sources = sorted((tree / "codegen/host/src").glob("*.c")) + sorted((tree / "runtime/src").glob("*.c"))
    return {"include_dirs": [tree / "codegen/host/include", tree / "runtime/include"],
            "sources": [directory / "main.c", *sources]}


def compile_application(layout: dict, output: Path, flags: list) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    command = [compiler, *flags, *[f"-I{d}" for d in layout["include_dirs"]], *map(str, layout["sources"]),
               "-o", str(output), "-lm"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"compiling the application failed:\n{' '.join(command)}\n{result.stderr}"
    return output


def write_inputs(module, directory: Path, flat_inputs: list):
    for i, (info, value) in enumerate(zip(module.inputs, flat_inputs)):
        array = np.ascontiguousarray(np.asarray(value, dtype=info.dtype))
        assert array.shape == tuple(info.shape)
        (Path(directory) / f"{module.name}_in{i}.bin").write_bytes(array.tobytes())


def read_outputs(module, directory: Path) -> list:
    return [np.frombuffer((Path(directory) / f"{module.name}_out{i}.bin").read_bytes(), dtype=info.dtype)
            .reshape(info.shape) for i, info in enumerate(module.outputs)]
