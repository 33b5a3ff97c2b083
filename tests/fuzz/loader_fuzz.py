"""A mutation fuzzer for tensorvm's loaders: executables (``.tvx``), the graph executor's files, parameter
blobs, Relay text and ONNX models.

Each target has *seeds* (real files written by tensorvm, with valid inputs and the unmutated file's result)
and *mutations*: bit flips, byte insertion/deletion, truncation, splicing with another seed, integer
fields replaced by boundary values (0, 1, 2^31, 2^32-1, 2^63, ...) and string fields corrupted (newlines,
quotes, code-injection canaries, invalid UTF-8, huge lengths); for formats with a checksum (``.tvx``:
SHA-256, params: CRC-32) a mutated file is resealed or not. Each mutated file is loaded (and, when
accepted, run on the seed's inputs) in a worker process with a time and an address-space limit; workers
are reused across cases and restarted after a crash or a hang.

Outcome classes (``classify``):

* ``accepted-correct``: loaded and computed what the unmutated file computes;
* ``accepted-different``: loaded and computed something else, from a resealed file (or a format without a
  checksum): a valid, different program (a changed constant) — not a defect;
* ``run-timeout``: loaded from a resealed file (or a format without a checksum), then ran past the time
  limit: a valid program may loop (a mutated jump or loop bound), which the threat model allows;
* ``clear-error``: a ``tensorvm.errors.TensorVMError`` subclass, at load or at run time;
* defects: ``exception`` (any other exception), ``crash`` (the worker died on a signal), ``hang`` (the
  time limit while loading, or running a file whose checksum was not fixed), ``memory`` (``MemoryError`` under the address-space limit), ``code-execution`` (the canary
  file a string payload would create appeared) and ``wrong-result`` (a result that differs from the
  seed's while the checksum was *not* fixed: a checksum bypass).

Used by ``tests/fuzz/test_loader_fuzz.py`` (a small budget) and ``tests/fuzz/loader_campaign.py`` (large
budgets, per-target reports, defect examples saved for reproduction).
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import random
import re
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
import zlib
from collections import Counter
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the shared program suite

BOUNDARY_VALUES = (0, 1, 2, 255, 2**16, 2**28, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63,
                   2**64 - 1)
DEFECTS = ("exception", "crash", "hang", "memory", "code-execution", "wrong-result")
OK_CLASSES = ("accepted-correct", "accepted-different", "run-timeout", "clear-error")
TARGETS = ("tvx", "graph", "params", "text", "onnx")


# --- string payloads ------------------------------------------------------------------------------
def string_corruptions(canary: str) -> list[bytes]:
    """Replacements for a string field: line breaks, quotes, code that would touch ``canary`` if pasted into
    generated Python (in a comment, on a ``def`` line, in a string literal), invalid UTF-8, long text."""
    touch = f"__import__('pathlib').Path({canary!r}).touch()"
    texts = [
        "", "a\nb", "a\rb", "x'y", 'x"y', "x y", "a#b", "é", "\x00", "..", "1", "x" * 5000, "(" * 3000,
        f"\n{touch}\n#", f"\n    pass\n{touch}\ndef _g():  #", f"'+{touch}+'", f'"+{touch}+"',
        f"x); {touch}; (", f"\n}} {touch} {{\n",
    ]
    return [t.encode() for t in texts] + [b"\xff\xfe", b"\xc3", b"a" * 70000]


# --- mutations ------------------------------------------------------------------------------------
@dataclass
class Field:
    offset: int
    size: int
    kind: str  # "int" (little-endian integer of size bytes), "str" (bytes; preceded by a u32 length at offset-4)


@dataclass
class Seed:
    target: str
    name: str
    data: bytes
    inputs: tuple = ()
    expected: object = None
    fields: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)


@dataclass
class Case:
    target: str
    seed: str
    data: bytes
    how: str
    sealed: bool | None  # the checksum matches the bytes, fixed up or by chance (None: no checksum)
    index: int = 0


def _u(value: int, size: int) -> bytes:
    return (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little")


def mutate_bytes(rng: random.Random, seed: Seed, others: list, canary: str) -> tuple[bytes, str]:
    """One random mutation of ``seed.data``: ``(bytes, description)``."""
    data = bytearray(seed.data)
    kinds = ["flip", "insert", "delete", "truncate", "splice"]
    if seed.fields:
        kinds += ["int", "int", "int", "str", "str"]
    kind = rng.choice(kinds)
    if kind == "flip":
        spots = []
        for _ in range(rng.choice((1, 1, 2, 4, 8))):
            pos = rng.randrange(len(data))
            data[pos] ^= 1 << rng.randrange(8)
            spots.append(pos)
        return bytes(data), f"flip bits at {spots}"
    if kind == "insert":
        pos = rng.randrange(len(data) + 1)
        blob = bytes(rng.randrange(256) for _ in range(rng.choice((1, 2, 4, 8, 16))))
        out = bytes(data[:pos] + blob + data[pos:])
        return _fix_lengths(rng, seed, out, pos, len(blob)), f"insert {blob.hex()} at {pos}"
    if kind == "delete":
        pos = rng.randrange(len(data))
        n = min(rng.choice((1, 2, 4, 8, 16)), len(data) - pos)
        out = bytes(data[:pos] + data[pos + n:])
        return _fix_lengths(rng, seed, out, pos, -n), f"delete {n} at {pos}"
    if kind == "truncate":
        n = rng.randrange(len(data))
        return bytes(data[:n]), f"truncate to {n}"
    if kind == "splice":
        other = rng.choice(others) if others else seed
        a, b = rng.randrange(len(data)), rng.randrange(len(other.data))
        return bytes(data[:a]) + other.data[b:], f"splice {seed.name}[:{a}] + {other.name}[{b}:]"
    if kind == "int":
        f = rng.choice([f for f in seed.fields if f.kind == "int"] or seed.fields)
        value = rng.choice(BOUNDARY_VALUES + (-1, -2**31, -2**63))
        if rng.random() < 0.3:  # near the old value
            value = int.from_bytes(data[f.offset:f.offset + f.size], "little") + rng.choice((-1, 1, 2, 64))
        data[f.offset:f.offset + f.size] = _u(value, f.size)
        return bytes(data), f"int field at {f.offset} ({f.size} bytes) := {value}"
    strings = [f for f in seed.fields if f.kind == "str"]
    if not strings:
        return mutate_bytes(rng, Seed(seed.target, seed.name, seed.data), others, canary)
    f = rng.choice(strings)
    new = rng.choice(string_corruptions(canary))
    old = bytes(data[f.offset:f.offset + f.size])
    if f.size > 200 and rng.random() < 0.7:  # a text (a primitive function's Relay, type text, C source)
        text, how = mutate_text(rng, old.decode("utf-8", "replace"), canary)
        new = text.encode("utf-8", "surrogatepass")
    elif rng.random() < 0.5:
        new = old + new  # keep the name, append the payload
    out = bytes(data[:f.offset - 4]) + struct.pack("<I", len(new)) + new + bytes(data[f.offset + f.size:])
    return _fix_lengths(rng, seed, out, f.offset, len(new) - len(old), 0.9), \
        f"string at {f.offset} {old[:40]!r} := {new[:60]!r}"


def _fix_lengths(rng: random.Random, seed: Seed, data: bytes, pos: int, delta: int, p: float = 0.5) -> bytes:
    """Mostly keep the enclosing sections' u64 lengths right after ``delta`` bytes changed at ``pos``, so
    that the mutation reaches the section's own checks (``seed.extra["lengths"]``: (field offset, start,
    end) of each length field and the payload it measures)."""
    if rng.random() >= p:
        return data
    out = bytearray(data)
    for offset, start, end in seed.extra.get("lengths", ()):
        if start <= pos <= end and offset < pos:
            struct.pack_into("<Q", out, offset, max(0, end - start + delta))
    return bytes(out)


def mutate_text(rng: random.Random, text: str, canary: str) -> tuple[str, str]:
    """Text-level mutations (Relay text, JSON): numbers to boundary values, names corrupted, nesting."""
    kind = rng.choice(["number", "number", "name", "nest", "chars"])
    if kind == "number":
        spots = [m for m in re.finditer(r"-?\d+(?:\.\d+)?", text)]
        if spots:
            m = rng.choice(spots)
            value = str(rng.choice(BOUNDARY_VALUES + (-1, -2**63)))
            return text[:m.start()] + value + text[m.end():], f"number {m.group(0)} at {m.start()} := {value}"
    if kind == "name":
        spots = [m for m in re.finditer(r"[A-Za-z_][A-Za-z0-9_.]*", text)]
        if spots:
            m = rng.choice(spots)
            new = rng.choice(string_corruptions(canary)).decode("utf-8", "replace")[:6000]
            if rng.random() < 0.5:
                new = m.group(0) + new
            return text[:m.start()] + new + text[m.end():], f"name {m.group(0)} at {m.start()} := {new[:60]!r}"
    if kind == "nest":
        pos = rng.randrange(len(text) + 1)
        depth = rng.choice((100, 1000, 5000))
        opener = rng.choice(("(", "[", "{", "fn () -> ", "Tensor[("))
        closer = {"(": ")", "[": "]", "{": "}", "fn () -> ": "", "Tensor[(": "), float32]"}[opener]
        return text[:pos] + opener * depth + closer * depth + text[pos:], f"nest {opener!r} x{depth} at {pos}"
    pos = rng.randrange(len(text) + 1)
    if rng.random() < 0.5:
        return text[:pos] + text[pos + rng.randint(1, 8):], f"delete chars at {pos}"
    junk = rng.choice(['"', "'", "\n", "\\", "%", "@", "#", "\x00", "{", "}", "\u2028", "9" * 400])
    return text[:pos] + junk + text[pos:], f"insert {junk[:10]!r} at {pos}"


def _reseal_sha256(data: bytes) -> bytes:
    if len(data) < 32:
        return data
    return data[:-32] + hashlib.sha256(data[:-32]).digest()


def _reseal_crc32(data: bytes) -> bytes:
    if len(data) < 4:
        return data
    return data[:-4] + struct.pack("<I", zlib.crc32(data[:-4]) & 0xFFFFFFFF)


# --- results --------------------------------------------------------------------------------------
def normalize(value):
    """A run's result as nested tuples of NumPy arrays (ADTs as ``("ADT", tag, fields)``)."""
    import numpy as np

    from tensorvm.runtime.object import ADT

    if isinstance(value, ADT):
        return ("ADT", int(value.tag), tuple(normalize(f) for f in value.fields))
    if isinstance(value, (tuple, list)):
        return tuple(normalize(v) for v in value)
    if hasattr(value, "numpy"):
        value = value.numpy()
    return np.array(value, copy=True)


def same_result(a, b) -> bool:
    import numpy as np

    if isinstance(a, tuple) or isinstance(b, tuple):
        return isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and all(
            same_result(x, y) for x, y in zip(a, b))
    if isinstance(a, str) or isinstance(b, str):  # (a string beside an array: not the same, not an array compare)
        return isinstance(a, str) and isinstance(b, str) and a == b
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind in "fc":
        return bool(np.allclose(a, b, rtol=1e-5, atol=1e-6, equal_nan=True))
    return bool(np.array_equal(a, b))


# --- targets: seeds (in the parent) ---------------------------------------------------------------
TVX_PROGRAMS = (  # (program of tests/programs.py, target, exec mode)
    ("dynamic_dense_bias", "python", "bytecode"),
    ("dynamic_softmax_layer_norm", "python", "compiled"),
    ("list_argument_map_sum", "python", "bytecode"),
    ("list_map_foldl", "python", "compiled"),
    ("tensor_while_loop", "python", "compiled"),
    ("sum_up_recursion", "python", "bytecode"),
    ("closure_captures_variables", "python", "compiled"),
    ("option_match", "python", "bytecode"),
    ("dynamic_dense_bias", "c", "compiled"),
    ("dynamic_elementwise", "c", "bytecode"),
    ("dynamic_elementwise", "c+embed", "bytecode"),  # with its prebuilt library in the file (KLIB)
    ("sum_up_recursion", "c", "native"),  # the program's functions are in the prebuilt library too
    ("references_shared_by_closures", "python", "bytecode"),  # reference cells (bytecode.REF_TAG)
    ("reference_counter_returned_with_its_closure", "c", "native"),
)


def _program(name):
    from programs import PROGRAMS

    return next(p for p in PROGRAMS if p.name == name)


def tvx_sections(data: bytes) -> dict:
    """``{tag: (offset of its u64 length, payload start, payload end)}`` of an executable's sections."""
    from tensorvm.vm.serialize import MAGIC

    sections, pos = {}, len(MAGIC) + 8
    for _ in range(2):
        pos += 4 + struct.unpack_from("<I", data, pos)[0]
    while pos < len(data) - 32:
        tag, size = data[pos:pos + 4], struct.unpack_from("<Q", data, pos + 4)[0]
        sections[bytes(tag)] = (pos + 4, pos + 12, pos + 12 + size)
        pos += 12 + size
    return sections


def _tvx_fields(data: bytes) -> list:
    """The integer and string fields of an executable, found by watching the loader read them."""
    from tensorvm.vm import serialize as S

    bases = {"executable header": 0}
    for tag, (_, start, _) in tvx_sections(data).items():
        bases[f"{tag.decode()} section"] = start
    fields, R = [], S._Reader
    originals = {name: getattr(R, name) for name in ("u8", "u32", "i32", "u64", "i64s", "str")}

    def recorder(name, size):
        def read(self, *args):
            start = self.pos
            value = originals[name](self, *args)
            base = bases.get(self.what)
            if base is not None:
                if name == "str":
                    fields.append(Field(base + start, 4, "int"))
                    fields.append(Field(base + start + 4, self.pos - start - 4, "str"))
                elif name == "i64s":
                    fields.extend(Field(base + start + 8 * k, 8, "int") for k in range(args[0]))
                else:
                    fields.append(Field(base + start, size, "int"))
            return value
        return read

    try:
        for name, size in (("u8", 1), ("u32", 4), ("i32", 4), ("u64", 8), ("i64s", 8), ("str", 4)):
            setattr(R, name, recorder(name, size))
        S.load_executable(data)
    finally:
        for name, fn in originals.items():
            setattr(R, name, fn)
    return fields


def tvx_seeds() -> list:
    import tensorvm as tv
    from tensorvm.codegen.build import have_compiler

    seeds = []
    for name, target, mode in TVX_PROGRAMS:
        if target.startswith("c") and not have_compiler():
            continue
        program = _program(name)
        exe = tv.vm.compile(program.parse(), target=target.split("+")[0], exec_mode=mode)
        data = exe.save_bytes(embed_library=target.endswith("+embed"))
        args = program.args_fn()
        loaded = tv.vm.load_executable(data)
        expected = normalize(tv.vm.VirtualMachine(loaded).invoke(program.entry, *args))
        seeds.append(Seed("tvx", f"{name}-{target}-{mode}", data, args, expected, _tvx_fields(data),
                          {"entry": program.entry, "lengths": list(tvx_sections(data).values())}))
    return seeds


GRAPH_PROGRAMS = ("static_mlp", "small_cnn", "tuple_out_static")


def graph_seeds() -> list:
    import tensorvm as tv

    seeds = []
    for name in GRAPH_PROGRAMS:
        program = _program(name)
        factory = tv.graph.build(program.parse(), target="python")
        members = factory._members()
        members.pop("lib.c", None)
        args = program.args_fn()
        names = [p.name_hint for p in program.parse()["main"].params]
        expected = _run_graph(factory, args, names)
        seeds.append(Seed("graph", name, b"", args, expected, extra={"members": members, "names": names}))
    return seeds


def _run_graph(factory, args, names):
    import tensorvm as tv

    return normalize(tv.graph.GraphModule(factory).run_from_values(names, list(args)))


def params_seeds() -> list:
    import numpy as np

    import tensorvm as tv

    rng = np.random.default_rng(0)
    dicts = {
        "mixed": {"w": rng.standard_normal((3, 4)).astype("float32"), "b": np.arange(4, dtype="int64"),
                  "flag": np.array(True), "h": np.ones((2, 2), "float16")},
        "graph": tv.graph.build(_program("small_cnn").parse(), target="python").params,
        "empty_and_scalar": {"e": np.zeros((0, 3), "float32"), "s": np.float64(2.5)},
    }
    seeds = []
    for name, params in dicts.items():
        data = tv.graph.save_params(params)
        expected = normalize(tuple(np.asarray(params[k]) for k in sorted(params)))
        seeds.append(Seed("params", name, data, (), expected, _params_fields(data)))
    return seeds


def _params_fields(data: bytes) -> list:
    """The fields of a params blob, by walking its layout (graph/params.py)."""
    fields, pos = [Field(8, 4, "int"), Field(12, 8, "int")], 20
    count = struct.unpack_from("<Q", data, 12)[0]
    for _ in range(count):
        n = struct.unpack_from("<I", data, pos)[0]
        fields += [Field(pos, 4, "int"), Field(pos + 4, n, "str")]
        pos += 4 + n
        d = data[pos]
        fields.append(Field(pos, 1, "int"))
        pos += 1 + d
        ndim = struct.unpack_from("<I", data, pos)[0]
        fields.append(Field(pos, 4, "int"))
        pos += 4
        fields += [Field(pos + 8 * k, 8, "int") for k in range(ndim)]
        pos += 8 * ndim
        nbytes = struct.unpack_from("<Q", data, pos)[0]
        fields.append(Field(pos, 8, "int"))
        pos += 8 + nbytes
    return fields


TEXT_PROGRAMS = ("dynamic_dense_bias", "list_map_foldl", "tensor_while_loop", "option_match", "small_cnn")


def text_seeds() -> list:
    import tensorvm as tv
    from tensorvm.ir.printer import module_to_str

    seeds = []
    for name in TEXT_PROGRAMS:
        program = _program(name)
        source = "#[version = \"0.0.5\"]\n" + program.text
        expected = module_to_str(tv.parse(source))
        seeds.append(Seed("text", name, source.encode(), (), expected))
    return seeds


def onnx_seeds() -> list:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import tensorvm as tv

    rng = np.random.default_rng(0)
    models = {}
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype("float32"), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype("float32"), "b")
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1), helper.make_node("Relu", ["y"], ["z"])],
        "gemm_relu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n", 4])], [w, b])
    models["gemm_relu"] = (helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                           (rng.standard_normal((2, 3)).astype("float32"),))
    k = numpy_helper.from_array(rng.standard_normal((2, 1, 3, 3)).astype("float32"), "k")
    shape = numpy_helper.from_array(np.array([1, -1], "int64"), "shape")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "k"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
         helper.make_node("Reshape", ["p", "shape"], ["r"]),
         helper.make_node("Softmax", ["r"], ["s"], axis=-1)],
        "conv_pool", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 8])], [k, shape])
    models["conv_pool"] = (helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
                           (rng.standard_normal((1, 1, 4, 4)).astype("float32"),))
    seeds = []
    for name, (model, args) in models.items():
        onnx.checker.check_model(model)
        data = model.SerializeToString()
        mod, params = tv.frontend.from_onnx(data)
        expected = normalize(tv.create_executor("debug", mod, params=params).evaluate()(*args))
        seeds.append(Seed("onnx", name, data, args, expected))
    return seeds


SEEDS = {"tvx": tvx_seeds, "graph": graph_seeds, "params": params_seeds, "text": text_seeds, "onnx": onnx_seeds}


def make_case(rng: random.Random, seed: Seed, others: list, canary: str) -> Case:
    """One mutated file of ``seed`` (the parent draws every case, so a run is reproducible from its seed)."""
    if seed.target in ("tvx", "params"):
        data, how = mutate_bytes(rng, seed, others, canary)
        reseal = _reseal_sha256 if seed.target == "tvx" else _reseal_crc32
        if rng.random() < 0.8:
            data = reseal(data)
        # "sealed" says whether the checksum matches the bytes (a splice may carry another file's valid one)
        return Case(seed.target, seed.name, data, how, reseal(data) == data)
    if seed.target == "text":
        text = seed.data.decode()
        if rng.random() < 0.7:
            text, how = mutate_text(rng, text, canary)
            return Case("text", seed.name, text.encode("utf-8", "surrogatepass"), how, None)
        data, how = mutate_bytes(rng, seed, others, canary)
        return Case("text", seed.name, data, how, None)
    if seed.target == "graph":
        members = dict(seed.extra["members"])
        member = rng.choice(sorted(members))
        if member.endswith(".json") and rng.random() < 0.7:
            text, how = mutate_text(rng, members[member].decode(), canary)
            members[member] = text.encode("utf-8", "surrogatepass")
            sealed = None
        else:
            sub = Seed("params", member, members[member], fields=_params_fields(members[member])
                       if member == "params.bin" else [])
            members[member], how = mutate_bytes(rng, sub, [], canary)
            sealed = None
            if member == "params.bin":
                if rng.random() < 0.8:
                    members[member] = _reseal_crc32(members[member])
                sealed = _reseal_crc32(members[member]) == members[member]
        return Case("graph", seed.name, _pack_members(members), f"{member}: {how}", sealed)
    if seed.target == "onnx":
        if rng.random() < 0.5:
            data, how = _mutate_onnx(rng, seed.data, canary)
        else:
            data, how = mutate_bytes(rng, seed, others, canary)
        return Case("onnx", seed.name, data, how, None)
    raise ValueError(f"unknown target {seed.target!r}")


def _pack_members(members: dict) -> bytes:
    out = bytearray()
    for name in sorted(members):
        out += struct.pack("<I", len(name)) + name.encode() + struct.pack("<Q", len(members[name])) + members[name]
    return bytes(out)


def _unpack_members(data: bytes) -> dict:
    members, pos = {}, 0
    while pos < len(data):
        n = struct.unpack_from("<I", data, pos)[0]
        name = data[pos + 4:pos + 4 + n].decode()
        size = struct.unpack_from("<Q", data, pos + 4 + n)[0]
        members[name] = data[pos + 12 + n:pos + 12 + n + size]
        pos += 12 + n + size
    return members


def _mutate_onnx(rng: random.Random, data: bytes, canary: str) -> tuple[bytes, str]:
    """A structural mutation of an ONNX model: dims, attributes, tensor shapes/data, names."""
    import onnx

    model = onnx.ModelProto()
    model.ParseFromString(data)
    g = model.graph
    kind = rng.choice(["dim", "attr", "tensor_dims", "tensor_data", "name", "opset", "drop_node"])
    value = rng.choice(BOUNDARY_VALUES[:-1] + (-1, -2**31))
    if kind == "dim":
        vi = rng.choice(list(g.input) + list(g.output))
        dims = vi.type.tensor_type.shape.dim
        if dims:
            d = rng.choice(dims)
            if rng.random() < 0.5:
                d.dim_value = max(min(value, 2**63 - 1), -2**63)
            else:
                d.dim_param = rng.choice(string_corruptions(canary)).decode("utf-8", "replace")[:5000]
        how = f"dim of {vi.name} := {value}"
    elif kind == "attr":
        nodes = [n for n in g.node if n.attribute]
        if nodes:
            a = rng.choice(rng.choice(nodes).attribute)
            if a.ints:
                a.ints[rng.randrange(len(a.ints))] = max(min(value, 2**63 - 1), -2**63)
            else:
                a.i = max(min(value, 2**63 - 1), -2**63)
            how = f"attribute {a.name} := {value}"
        else:
            how = "no attribute"
    elif kind == "tensor_dims" and g.initializer:
        t = rng.choice(g.initializer)
        if t.dims:
            t.dims[rng.randrange(len(t.dims))] = max(min(value, 2**63 - 1), -2**63)
        how = f"initializer {t.name} dims := {list(t.dims)}"
    elif kind == "tensor_data" and g.initializer:
        t = rng.choice(g.initializer)
        raw = bytearray(t.raw_data)
        if raw:
            del raw[rng.randrange(len(raw)):]
        t.raw_data = bytes(raw)
        how = f"initializer {t.name} data truncated to {len(raw)}"
    elif kind == "name":
        new = rng.choice(string_corruptions(canary)).decode("utf-8", "replace")[:5000]
        node = rng.choice(g.node)
        if node.output:
            node.output[0] = new
        how = f"node output name := {new[:40]!r}"
    elif kind == "opset":
        model.opset_import[0].version = rng.choice((1, 5, 99, 2**31 - 1))
        how = f"opset := {model.opset_import[0].version}"
    else:
        if len(g.node) > 1:
            del g.node[rng.randrange(len(g.node))]
        how = "drop a node"
    return model.SerializeToString(), how


# --- targets: load and run (in the workers) -------------------------------------------------------
def _load(case: Case, scratch: Path):
    """The loader under test on the mutated bytes."""
    import tensorvm as tv

    if case.target == "tvx":
        return tv.vm.load_executable(case.data)
    if case.target == "params":
        return tv.graph.load_params(case.data)
    if case.target == "text":  # the parser takes text: bytes that are not UTF-8 arrive as U+FFFD
        return tv.parse(case.data.decode("utf-8", errors="replace"))
    if case.target == "graph":
        directory = scratch / "graph"
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir()
        for name, data in _unpack_members(case.data).items():
            (directory / name).write_bytes(data)
        return tv.graph.load(str(directory))
    if case.target == "onnx":
        return tv.frontend.from_onnx(case.data)
    raise ValueError(case.target)


def _run(loaded, case: Case, seed: Seed):
    """What an accepted file computes (on the seed's inputs), normalized."""
    import numpy as np

    import tensorvm as tv

    if case.target == "tvx":
        return normalize(tv.vm.VirtualMachine(loaded).invoke(seed.extra["entry"], *seed.inputs))
    if case.target == "params":
        return normalize(tuple(np.asarray(loaded[k]) for k in sorted(loaded)))
    if case.target == "text":
        from tensorvm.ir.printer import module_to_str

        return module_to_str(loaded)
    if case.target == "graph":
        return _run_graph(loaded, seed.inputs, seed.extra["names"])
    if case.target == "onnx":
        mod, params = loaded
        return normalize(tv.create_executor("debug", mod, params=params).evaluate()(*seed.inputs))
    raise ValueError(case.target)


def _execute(case: Case, seed: Seed, scratch: Path, running=lambda: None) -> tuple[str, str]:
    """Load, then (``running()`` marks the phase) run; the outcome class and what happened."""
    from tensorvm.errors import TensorVMError

    phase = "load"
    try:
        loaded = _load(case, scratch)
        phase = "run"
        running()
        result = _run(loaded, case, seed)
    except TensorVMError as err:
        return "clear-error", f"{type(err).__name__} at {phase}: {str(err)[:300]}"
    except MemoryError as err:
        return "memory", f"MemoryError at {phase}: {str(err)[:300]}\n{traceback.format_exc()[-3000:]}"
    except BaseException as err:  # noqa: BLE001 - every other exception is what we look for
        return "exception", f"{type(err).__name__} at {phase}: {str(err)[:300]}\n{traceback.format_exc()[-3000:]}"
    if same_result(result, seed.expected):
        return "accepted-correct", ""
    if case.sealed is False:
        return "wrong-result", "accepted a file whose checksum was not fixed, with a different result"
    return "accepted-different", ""


def _worker_main(conn, seeds: dict, mem_bytes: int, scratch: str):
    """A worker: limits itself, then runs cases from ``conn`` until told to stop."""
    import resource

    if mem_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))
    import warnings

    warnings.simplefilter("ignore")
    import tensorvm  # noqa: F401 - import once, before the first case's clock starts

    scratch_dir = Path(scratch)
    scratch_dir.mkdir(parents=True, exist_ok=True)
    conn.send(("ready", os.getpid()))
    while True:
        case = conn.recv()
        if case is None:
            return
        outcome = _execute(case, seeds[(case.target, case.seed)], scratch_dir, lambda: conn.send("running"))
        conn.send(outcome)


# --- the driver -----------------------------------------------------------------------------------
@dataclass
class Report:
    target: str
    tried: int = 0
    classes: Counter = field(default_factory=Counter)
    examples: dict = field(default_factory=dict)  # class -> [(case, detail)]
    seconds: float = 0.0

    @property
    def defects(self) -> int:
        return sum(self.classes[c] for c in DEFECTS)

    def record(self, case: Case, outcome: str, detail: str, keep: int = 5):
        self.tried += 1
        self.classes[outcome] += 1
        if outcome in DEFECTS and len(self.examples.setdefault(outcome, [])) < keep:
            self.examples[outcome].append((case, detail))

    def summary(self) -> str:
        lines = [f"target {self.target}: {self.tried} mutations in {self.seconds:.0f} s"]
        for name in OK_CLASSES + DEFECTS:
            lines.append(f"  {name:<20} {self.classes.get(name, 0)}")
        for name, examples in self.examples.items():
            for case, detail in examples[:3]:
                lines.append(f"  example {name}: seed {case.seed}, {case.how[:120]}, sealed={case.sealed}: "
                             f"{detail.splitlines()[0][:200] if detail else ''}")
        return "\n".join(lines)

    def save_examples(self, directory: Path):
        for name, examples in self.examples.items():
            folder = directory / self.target / name
            folder.mkdir(parents=True, exist_ok=True)
            for k, (case, detail) in enumerate(examples):
                (folder / f"{k}.bin").write_bytes(case.data)
                (folder / f"{k}.txt").write_text(f"target {case.target}\nseed {case.seed}\ncase {case.index}\n"
                                                 f"mutation {case.how}\nsealed {case.sealed}\n\n{detail}\n")


class _Worker:
    def __init__(self, ctx, seeds, mem_bytes, scratch):
        self.parent, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child, seeds, mem_bytes, scratch), daemon=True)
        self.process.start()
        child.close()
        if not self.parent.poll(120):
            self.kill()
            raise RuntimeError("a fuzz worker did not start in 120 s")
        self.parent.recv()
        self.case = None
        self.deadline = 0.0

    def send(self, case: Case, timeout: float):
        self.case, self.deadline, self.running = case, time.monotonic() + timeout, False
        self.parent.send(case)

    def kill(self):
        if self.process.is_alive():
            self.process.kill()
        self.process.join(10)
        self.parent.close()


def run_campaign(targets=("tvx",), mutations: int = 100, workers: int = 1, seed: int = 0, timeout: float = 20.0,
                 mem_bytes: int = 2 << 30, time_budget: float | None = None, log=None) -> dict:
    """Fuzz ``targets`` with ``mutations`` cases each; ``{target: Report}``. ``time_budget`` (seconds per
    target) stops a target early."""
    rng = random.Random(seed)
    reports = {}
    scratch_root = Path(tempfile.mkdtemp(prefix="tensorvm-loader-fuzz-"))
    canary = str(scratch_root / "canary")
    ctx = mp.get_context("spawn")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    try:
        for target in targets:
            start = time.monotonic()
            seeds = SEEDS[target]()
            by_key = {(s.target, s.name): s for s in seeds}
            report = Report(target)
            pool = [_Worker(ctx, by_key, mem_bytes, str(scratch_root / f"w{k}")) for k in range(workers)]
            try:
                index = logged = 0
                idle = list(pool)
                busy: dict = {}
                while True:
                    out_of_time = time_budget is not None and time.monotonic() - start > time_budget
                    while idle and index < mutations and not out_of_time:
                        s = rng.choice(seeds)
                        case = make_case(rng, s, [o for o in seeds if o is not s], canary)
                        case.index = index
                        index += 1
                        w = idle.pop()
                        w.send(case, timeout)
                        busy[w.parent] = w
                    if not busy:
                        break
                    ready = wait(list(busy), timeout=max(0.05, min(w.deadline for w in busy.values())
                                                         - time.monotonic()))
                    now = time.monotonic()
                    for conn in list(busy):
                        w = busy[conn]
                        outcome = None
                        if conn in ready:
                            try:
                                outcome = conn.recv()
                                if outcome == "running":  # loaded; now running the program
                                    w.running, outcome = True, None
                                    continue
                            except (EOFError, OSError):
                                w.process.join(5)
                                code = w.process.exitcode
                                name = signal.Signals(-code).name if code is not None and code < 0 else code
                                outcome = ("crash", f"worker died: exit {name}")
                        elif now > w.deadline and w.running and w.case.sealed is not False:
                            # a loaded program that runs past the limit: a valid program may loop
                            outcome = ("run-timeout", f"accepted, still running after {timeout} s")
                        elif now > w.deadline:
                            outcome = ("hang", f"no answer in {timeout} s ({'running' if w.running else 'loading'})")
                        if outcome is None:
                            continue
                        del busy[conn]
                        kind, detail = outcome
                        if os.path.exists(canary):
                            kind, detail = "code-execution", f"the canary {canary} was created; {detail}"
                            os.unlink(canary)
                        report.record(w.case, kind, detail)
                        if log and kind in DEFECTS:
                            log(f"[{target}] case {w.case.index}: {kind}: {w.case.how[:100]}: "
                                f"{detail.splitlines()[0][:160] if detail else ''}")
                        if kind in ("crash", "hang", "run-timeout"):
                            w.kill()
                            pool.remove(w)
                            w = _Worker(ctx, by_key, mem_bytes, str(scratch_root / f"w{index}"))
                            pool.append(w)
                        idle.append(w)
                    if log and report.tried // 1000 > logged:
                        logged = report.tried // 1000
                        log(f"[{target}] {report.tried} cases, {dict(report.classes)}")
            finally:
                for w in pool:
                    try:
                        w.parent.send(None)
                    except OSError:
                        pass
                    w.kill()
            report.seconds = time.monotonic() - start
            reports[target] = report
    finally:
        shutil.rmtree(scratch_root, ignore_errors=True)
    return reports
