"""Child-sum Tree-LSTM (Tai et al. 2015) over binary trees: tensorvm's IR with a ``Tree`` ADT, and PyTorch.

For a node with input ``x`` and children ``k`` (states ``h_k``, ``c_k``; none for a leaf)::

    h_sum = sum_k h_k
    i, o, u = sigmoid, sigmoid, tanh of  W_iou x + U_iou h_sum + b_iou   (split in three)
    f_k   = sigmoid(W_f x + U_f h_k + b_f)
    c     = i * u + sum_k f_k * c_k
    h     = o * tanh(c)

The IR matches on ``type Tree { Leaf(Tensor[(1, I)]), Node(Tree, Tree, Tensor[(1, I)]) }`` and
recurses into both children; the PyTorch peer is the same recursion in eager Python with the same
weights. The data is a fixed set of random full binary trees of 21-39 nodes; latency is per node.
"""

from __future__ import annotations

import functools

import numpy as np

from .common import (
    PEER,
    TENSORVM,
    Case,
    ModelGroup,
    RuntimeSpec,
    TensorVMRunner,
    TorchRunner,
    rng_for,
    uniform,
)

INPUT_SIZE, HIDDEN_SIZE = 300, 150
NUM_TREES = 16
MIN_NODES, MAX_NODES = 20, 40


def make_weights(input_size: int, hidden_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = rng_for("treelstm", input_size, hidden_size, seed)
    scale = 1.0 / np.sqrt(hidden_size)
    h3 = 3 * hidden_size
    return {
        "w_iou": uniform(rng, (h3, input_size), scale), "u_iou": uniform(rng, (h3, hidden_size), scale),
        "b_iou": uniform(rng, (h3,), scale), "w_f": uniform(rng, (hidden_size, input_size), scale),
        "u_f": uniform(rng, (hidden_size, hidden_size), scale), "b_f": uniform(rng, (hidden_size,), scale),
    }


def random_tree(rng: np.random.Generator, num_leaves: int, input_size: int):
    """A random full binary tree as nested tuples: ``("leaf", x)`` or ``("node", left, right, x)``."""
    x = rng.standard_normal((1, input_size)).astype(np.float32)
    if num_leaves == 1:
        return ("leaf", x)
    left_leaves = int(rng.integers(1, num_leaves))
    return ("node", random_tree(rng, left_leaves, input_size),
            random_tree(rng, num_leaves - left_leaves, input_size), x)


def tree_lines(tree, out: list) -> list:
    """The tree in preorder as text lines appended to ``out`` (read by C programs: ``benchmarks/aot_dynamic_bench.c``,
    ``tests/aot/dynamic_main.c``): ``L x1..xI`` for a leaf, ``N`` then both children then ``x1..xI`` for a node."""
    if tree[0] == "leaf":
        out.append("L " + " ".join(f"{v:.9g}" for v in tree[1].reshape(-1)))
    else:
        out.append("N")
        tree_lines(tree[1], out)
        tree_lines(tree[2], out)
        out.append(" ".join(f"{v:.9g}" for v in tree[3].reshape(-1)))
    return out


def count_nodes(tree) -> int:
    return 1 if tree[0] == "leaf" else 1 + count_nodes(tree[1]) + count_nodes(tree[2])


def make_trees(num_trees: int, input_size: int, min_nodes: int = MIN_NODES, max_nodes: int = MAX_NODES,
               seed: int = 0) -> list:
    """``num_trees`` full binary trees with node counts (odd) in ``[min_nodes, max_nodes]``."""
    rng = rng_for("trees", num_trees, input_size, min_nodes, max_nodes, seed)
    min_leaves, max_leaves = (min_nodes + 2) // 2, (max_nodes + 1) // 2  # a full tree of k leaves has 2k-1 nodes
    if min_leaves > max_leaves:
        raise ValueError(f"no full binary tree has between {min_nodes} and {max_nodes} nodes")
    return [random_tree(rng, int(rng.integers(min_leaves, max_leaves + 1)), input_size) for _ in range(num_trees)]


def treelstm_relay_text(input_size: int, hidden_size: int) -> str:
    """The Tree-LSTM in Relay text: ``@main(%tree, weights) -> (h, c)`` of the root."""
    i, h, h3 = input_size, hidden_size, 3 * hidden_size
    weights = (f"%w_iou: Tensor[({h3}, {i}), float32], %u_iou: Tensor[({h3}, {h}), float32], "
               f"%b_iou: Tensor[({h3},), float32], %w_f: Tensor[({h}, {i}), float32], "
               f"%u_f: Tensor[({h}, {h}), float32], %b_f: Tensor[({h},), float32]")
    names = "%w_iou, %u_iou, %b_iou, %w_f, %u_f, %b_f"
    state = f"(Tensor[(1, {h}), float32], Tensor[(1, {h}), float32])"
    return f"""
type Tree {{
  Leaf(Tensor[(1, {i}), float32]),
  Node(Tree, Tree, Tensor[(1, {i}), float32]),
}}

def @main(%tree: Tree, {weights}) -> {state} {{
  @tree_lstm(%tree, {names})
}}

def @tree_lstm(%tree: Tree, {weights}) -> {state} {{
  match (%tree) {{
    Leaf(%x) => {{
      %iou = split(add(nn.dense(%x, %w_iou), %b_iou), indices_or_sections=3, axis=1);
      %c = multiply(sigmoid(%iou.0), tanh(%iou.2));
      (multiply(sigmoid(%iou.1), tanh(%c)), %c)
    }},
    Node(%left, %right, %x) => {{
      %l = @tree_lstm(%left, {names});
      %r = @tree_lstm(%right, {names});
      %h_sum = add(%l.0, %r.0);
      %iou = split(add(add(nn.dense(%x, %w_iou), nn.dense(%h_sum, %u_iou)), %b_iou),
                   indices_or_sections=3, axis=1);
      %wf = add(nn.dense(%x, %w_f), %b_f);
      %f_l = sigmoid(add(%wf, nn.dense(%l.0, %u_f)));
      %f_r = sigmoid(add(%wf, nn.dense(%r.0, %u_f)));
      %c = add(multiply(sigmoid(%iou.0), tanh(%iou.2)), add(multiply(%f_l, %l.1), multiply(%f_r, %r.1)));
      (multiply(sigmoid(%iou.1), tanh(%c)), %c)
    }},
  }}
}}
"""


def build_ir(input_size: int, hidden_size: int, weights: dict):
    import tensorvm as tv

    return tv.parse(treelstm_relay_text(input_size, hidden_size)), dict(weights)


def tree_value(mod, tree):
    """The tree as a tensorvm ADT value built with the module's constructors."""
    if tree[0] == "leaf":
        return mod.constructor("Leaf").value(tree[1])
    return mod.constructor("Node").value(tree_value(mod, tree[1]), tree_value(mod, tree[2]), tree[3])


# --- PyTorch ---------------------------------------------------------------------------------------
def torch_tree_lstm(torch, weights: dict):
    """An eager recursive Tree-LSTM over trees of torch tensors; returns the root's ``(h, c)``."""
    w = {k: torch.from_numpy(v) for k, v in weights.items()}
    linear, sigmoid, tanh = torch.nn.functional.linear, torch.sigmoid, torch.tanh

    def node(tree):
        if tree[0] == "leaf":
            i, o, u = linear(tree[1], w["w_iou"], w["b_iou"]).chunk(3, dim=1)
            c = sigmoid(i) * tanh(u)
            return sigmoid(o) * tanh(c), c
        (hl, cl), (hr, cr) = node(tree[1]), node(tree[2])
        x = tree[3]
        i, o, u = (linear(x, w["w_iou"], w["b_iou"]) + linear(hl + hr, w["u_iou"])).chunk(3, dim=1)
        wf = linear(x, w["w_f"], w["b_f"])
        c = sigmoid(i) * tanh(u) + sigmoid(wf + linear(hl, w["u_f"])) * cl + sigmoid(wf + linear(hr, w["u_f"])) * cr
        return sigmoid(o) * tanh(c), c

    return node


def torch_tree(torch, tree):
    if tree[0] == "leaf":
        return ("leaf", torch.from_numpy(tree[1]))
    return ("node", torch_tree(torch, tree[1]), torch_tree(torch, tree[2]), torch.from_numpy(tree[3]))


def group(input_size: int = INPUT_SIZE, hidden_size: int = HIDDEN_SIZE, num_trees: int = NUM_TREES) -> ModelGroup:
    weights = functools.cache(lambda: make_weights(input_size, hidden_size))
    trees = functools.cache(lambda: make_trees(num_trees, input_size))
    nodes = sum(count_nodes(t) for t in trees())
    cases = (Case(f"trees{num_trees}", f"{num_trees} trees, {nodes} nodes", nodes),)

    def tvm_args(case, mod):
        return [(tree_value(mod, t),) for t in trees()]

    def torch_args(case, torch):
        return [(torch_tree(torch, t),) for t in trees()]

    def ir_runner(exec_mode):  # exec mode "compiled" runs native mode on target c (the row says which ran)
        return lambda grp, ctx: TensorVMRunner(lambda: build_ir(input_size, hidden_size, weights()), tvm_args,
                                               exec_mode=exec_mode)

    runtimes = (
        RuntimeSpec("tvm-ir-vm", "tensorvm IR · VM", TENSORVM, ir_runner("bytecode")),
        RuntimeSpec("tvm-ir-vm-compiled", "tensorvm IR · VM compiled", TENSORVM, ir_runner("compiled")),
        RuntimeSpec("torch", "PyTorch eager (recursive)", PEER,
                    lambda grp, ctx: TorchRunner(lambda torch: torch_tree_lstm(torch, weights()), torch_args,
                                                 ctx["threads"])),
    )
    return ModelGroup(
        key="treelstm", title=f"Tree-LSTM (child-sum, input {input_size}, hidden {hidden_size})", unit="node",
        cases=cases, runtimes=runtimes, reference="torch", atol=1e-4, rtol=1e-3,
        description=f"{num_trees} random full binary trees of {MIN_NODES}-{MAX_NODES} nodes; one call runs them all")
