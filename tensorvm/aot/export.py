"""Model Library Format: AOT models as a tarball laid out like TVM's (``export_model_library_format``).

    tv.aot.export_model_library_format([net, other], "models.tar")

Layout (one entry per model under ``codegen``, ``parameters`` and ``src``; the shim once)::

    metadata.json                               version 7, {"modules": {<name>: {...}}}
    codegen/host/src/tvmgen_<name>.c            kernels + run function
    codegen/host/src/tvmgen_<name>_params.c     the linked parameters
    codegen/host/include/tvmgen_<name>.h        the C interface
    parameters/<name>.params                    the parameters again, in tensorvm's binary params format
    src/<name>.relay                            the source module as Relay text
    runtime/include/tensorvm_aot.h, runtime/src/tensorvm_aot.c

``metadata.json`` holds per model: ``model_name``, ``export_datetime``, ``target``, ``executors``
(``["aot"]``), ``style`` (``"full-model"``), ``memory.functions.main`` (``workspace_size_bytes``,
``constants_size_bytes``, ``io_size_bytes``, ``inputs``/``outputs`` with dtype, shape and size),
``memory.functions.operator_functions`` (per kernel the workspace scratch and stack bytes),
``external_dependencies`` (the shim under ``./runtime``) and a ``tensorvm`` section (workspace
alignment and kind, planner, the memory plan). Build with e.g.
``cc -Icodegen/host/include -Iruntime/include codegen/host/src/*.c runtime/src/*.c app.c -lm``.
"""

from __future__ import annotations

import calendar
import io
import json
import tarfile
import time
from pathlib import Path

from ..errors import FormatError
from .build import AOTModule, runtime_files

__all__ = ["export_model_library_format", "MLF_VERSION"]

MLF_VERSION = 7


def export_model_library_format(modules, path) -> Path:
    """Write one or several ``AOTModule``s (distinct names) to the tarball ``path``; returns the path."""
    modules = [modules] if isinstance(modules, AOTModule) else list(modules)
    if not modules or not all(isinstance(m, AOTModule) for m in modules):
        raise FormatError("export_model_library_format expects an AOTModule or a list of them (from tv.aot.build)")
    names = [m.name for m in modules]
    if len(set(names)) != len(names):
        raise FormatError(f"module names must be unique within one Model Library Format archive, got {names}")
    stamp = time.gmtime()
    files = {}
    metadata = {"version": MLF_VERSION, "modules": {}}
    for m in modules:
        for fname, text in m.sources.items():
            sub = "include" if fname.endswith(".h") else "src"
            files[f"codegen/host/{sub}/{fname}"] = text.encode()
        files[f"parameters/{m.name}.params"] = _params_bytes(m)
        files[f"src/{m.name}.relay"] = m.relay_text.encode()
        metadata["modules"][m.name] = _module_metadata(m, stamp)
    for rel, text in runtime_files().items():
        files[f"runtime/{rel}"] = text.encode()
    files = {"metadata.json": json.dumps(metadata, indent=2, sort_keys=True).encode(), **files}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = "w:gz" if path.name.endswith((".tar.gz", ".tgz")) else "w"
    mtime = calendar.timegm(stamp)
    with tarfile.open(path, mode) as tar:
        added_dirs = set()
        for rel, data in files.items():
            for parent in reversed(Path(rel).parents[:-1]):
                if str(parent) not in added_dirs:
                    added_dirs.add(str(parent))
                    tar.addfile(_info(str(parent), 0, mtime, directory=True))
            tar.addfile(_info(rel, len(data), mtime), io.BytesIO(data))
    return path


def _info(name: str, size: int, mtime: int, directory: bool = False) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = mtime
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mode = 0o755 if directory else 0o644
    if directory:
        info.type = tarfile.DIRTYPE
    return info


def _params_bytes(module: AOTModule) -> bytes:
    from ..graph.params import save_params

    return save_params(dict(module.constants))


def _module_metadata(m: AOTModule, stamp) -> dict:
    def tensors(infos):
        return {t.name: {"dtype": t.dtype, "shape": list(t.shape), "size": t.size_bytes} for t in infos}

    return {
        "model_name": m.name,
        "export_datetime": time.strftime("%Y-%m-%d %H:%M:%SZ", stamp),
        "target": ["c"],
        "executors": ["aot"],
        "style": "full-model",
        "memory": {
            "functions": {
                "main": [{
                    "device": 1,
                    "workspace_size_bytes": m.workspace_size,
                    "constants_size_bytes": m.constants_size,
                    "io_size_bytes": m.io_size,
                    "inputs": tensors(m.inputs),
                    "outputs": tensors(m.outputs),
                }],
                "operator_functions": [
                    {"function_name": k.name, "workspace": [{"device": 1, "workspace_size_bytes": k.scratch_bytes}],
                     "stack_size_bytes": k.stack_bytes}
                    for k in m.kernels],
            },
        },
        "external_dependencies": [{"short_name": "tensorvm_aot_runtime", "url": "./runtime", "url_type": "mlf_path",
                                   "version_spec": "1"}],
        "tensorvm": {
            "header": f"codegen/host/include/{m.header_name}",
            "run_function": f"{m.prefix}_run",
            "descriptor": f"{m.prefix}_model",
            "workspace_alignment": m.workspace_alignment,
            "workspace_external": m.workspace_external,
            "reentrant": m.reentrant,
            "planner": m.planner,
            "intermediates_size_bytes": m.memory_plan.unplanned_bytes,
            "memory_plan": m.memory_plan.to_dict(),
        },
    }
