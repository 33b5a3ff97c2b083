"""Memory placement: tensor lifetimes in, one packed workspace (and a storage-id view) out.

``plan_memory(lifetimes, algorithm=...)`` is a pure algorithm over ``TensorLifetime`` records (name, size,
first and last step of use, optional alias). Every *intermediate* tensor gets a byte offset inside one
workspace; two tensors whose lifetimes overlap (inclusive step ranges) never share a byte. Tensors of kind
``input``/``param``/``output`` (and everything aliasing them) are never overwritten: each such group gets
a storage of its own outside the workspace, reported separately. An alias (a reshape view) shares its
root's bytes and extends the root's lifetime.

It lives in the runtime because both sides use it: the graph executor and AOT plan a static program's
workspace at build time (``tensorvm.transform.memory_planner`` derives their lifetimes), and the VM plans
the arena of a function specialized to its argument shapes at run time (``tensorvm.vm.specialize``),
where a loaded executable must not import the compiler.

Algorithms (all offset-based except ``linear_scan`` and ``no_reuse``):

* ``greedy_by_size`` — USMP's order (size desc, conflicts desc, name); each tensor goes to the
  lowest aligned offset where it fits *between* the already-placed tensors it conflicts with
  (USMP only places above the highest conflicting end; ``fill_gaps=False`` reproduces that);
* ``greedy_by_conflicts`` — the same placement, ordered by conflicts first;
* ``hill_climb`` — USMP's randomized search over placement orders (fixed seed, reproducible),
  started from the better greedy order; stops early at the lower bound;
* ``linear_scan`` — the graph executor's token reuse (GraphPlanMemory): in execution order, a
  freed block whose size is within 16x is reused and grows; blocks are laid out one after another;
* ``no_reuse`` — every tensor its own block (the baseline);
* ``best`` — run the greedy ones and ``hill_climb``, keep the smallest.

The storage-id view (``storage_ids``/``storage_sizes``, for the graph JSON) comes out of the same
plan: tensors placed at the same offset share a storage id (their lifetimes are disjoint because
their bytes overlap), and ``storage_offsets[sid]`` says where the storage lives in the workspace.
"""

from __future__ import annotations

import bisect
import heapq
import random
from collections import defaultdict
from dataclasses import dataclass, field

from ..errors import TensorVMError, UnsupportedError

__all__ = ["TensorLifetime", "StaticMemoryPlan", "plan_memory", "PLANNER_ALGORITHMS", "MemoryPlanError",
           "INTERMEDIATE", "INPUT", "PARAM", "OUTPUT"]

INTERMEDIATE, INPUT, PARAM, OUTPUT = "intermediate", "input", "param", "output"
_KINDS = (INTERMEDIATE, INPUT, PARAM, OUTPUT)
# A group containing one of these is never overwritten; the order ranks the group's reported kind.
_EXTERNAL_RANK = {OUTPUT: 3, INPUT: 2, PARAM: 1}
PLANNER_ALGORITHMS = ("greedy_by_size", "greedy_by_conflicts", "hill_climb", "linear_scan", "no_reuse", "best")
_HILL_CLIMB_ITERATIONS = 300
_TOKEN_MATCH_RANGE = 16


class MemoryPlanError(TensorVMError):
    """Invalid lifetimes, a workspace limit exceeded, or a plan that fails its own check."""


@dataclass(frozen=True)
class TensorLifetime:
    """One tensor to place: live from step ``first_use`` to step ``last_use``, both inclusive.

    ``alias_of`` names the tensor whose bytes this one views (a reshape); ``kind`` is
    ``intermediate`` (placed in the workspace) or ``input``/``param``/``output`` (never reused).
    """

    name: str
    size_bytes: int
    first_use: int
    last_use: int
    alias_of: str | None = None
    kind: str = INTERMEDIATE


@dataclass
class _Group:
    """A root tensor with all tensors aliasing it (transitively): placed as one block."""

    root: str
    members: list
    size: int  # aligned bytes
    first: int
    last: int
    kind: str

    def conflicts_with(self, other: _Group) -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclass
class StaticMemoryPlan:
    """Where every tensor lives: a workspace offset (intermediates) and a storage id (all)."""

    algorithm: str
    alignment: int
    lifetimes: tuple
    offsets: dict  # name -> byte offset in the workspace (intermediates and their aliases)
    storage_ids: dict  # name -> storage id (every tensor; an alias has its root's)
    storage_sizes: list  # sid -> bytes
    storage_offsets: list  # sid -> workspace offset, or None for an external (input/param/output) storage
    storage_kinds: list  # sid -> "intermediate" | "input" | "param" | "output"
    total_bytes: int  # workspace size
    unplanned_bytes: int  # sum of the intermediates' aligned sizes (every one in its own block)
    lower_bound_bytes: int  # the most bytes of intermediates live at one step: no plan can beat it
    external_bytes: dict = field(default_factory=dict)  # kind -> bytes of never-overwritten storages

    # --- queries ---------------------------------------------------------------------------------
    def storage_id(self, name: str) -> int:
        return self.storage_ids[name]

    @property
    def num_storages(self) -> int:
        return len(self.storage_sizes)

    @property
    def saved_bytes(self) -> int:
        return self.unplanned_bytes - self.total_bytes

    def tensors_of_storage(self, sid: int) -> list:
        return [name for name, s in self.storage_ids.items() if s == sid]

    def report(self) -> str:
        """A readable table: one row per storage id (size, offset, tensors placed), then totals."""
        lines = [f"memory plan ({self.algorithm}, alignment {self.alignment})",
                 f"{'sid':>4}  {'kind':<12} {'offset':>10} {'bytes':>10}  tensors"]
        members = defaultdict(list)
        for name, sid in self.storage_ids.items():
            members[sid].append(name)
        for sid, size in enumerate(self.storage_sizes):
            offset = self.storage_offsets[sid]
            where = "-" if offset is None else str(offset)
            lines.append(f"{sid:>4}  {self.storage_kinds[sid]:<12} {where:>10} {size:>10}  "
                         + ", ".join(members[sid]))
        ratio = self.total_bytes / self.unplanned_bytes if self.unplanned_bytes else 1.0
        lines.append(f"workspace: {self.total_bytes} bytes for {self.unplanned_bytes} bytes of "
                     f"intermediates ({ratio:.1%}); lower bound {self.lower_bound_bytes}")
        if self.external_bytes:
            lines.append("not reused: " + ", ".join(f"{k} {v} bytes" for k, v in sorted(self.external_bytes.items())))
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"algorithm": self.algorithm, "alignment": self.alignment, "total_bytes": self.total_bytes,
                "unplanned_bytes": self.unplanned_bytes, "lower_bound_bytes": self.lower_bound_bytes,
                "external_bytes": dict(self.external_bytes), "offsets": dict(self.offsets),
                "storage_ids": dict(self.storage_ids), "storage_sizes": list(self.storage_sizes),
                "storage_offsets": list(self.storage_offsets), "storage_kinds": list(self.storage_kinds)}

    def check(self) -> StaticMemoryPlan:
        """Verify the plan; raise ``MemoryPlanError`` naming the first violation, else return self.

        No two intermediates live at the same step share a byte; every block is aligned and inside
        the workspace; tensors sharing a storage id are never live at once (aliases excepted) and
        fit in it; an input/param/output storage holds nothing else.
        """
        groups = _build_groups(self.lifetimes, self.alignment)
        by_name = {lt.name: lt for lt in self.lifetimes}
        placed = [g for g in groups if g.kind == INTERMEDIATE]
        for g in placed:
            for name in g.members:
                if self.offsets.get(name) != self.offsets.get(g.root):
                    raise MemoryPlanError(f"alias {name!r} is not placed at its root {g.root!r}")
            off = self.offsets.get(g.root)
            if off is None:
                raise MemoryPlanError(f"intermediate {g.root!r} has no offset")
            if off % self.alignment or off < 0 or off + g.size > self.total_bytes:
                raise MemoryPlanError(f"{g.root!r} at offset {off} (+{g.size} bytes) is unaligned or outside "
                                      f"the {self.total_bytes}-byte workspace")
        pair = _live_overlap(placed, self.offsets)
        if pair is not None:
            a, b = pair
            oa, ob = self.offsets[a.root], self.offsets[b.root]
            raise MemoryPlanError(
                f"{a.root!r} [{oa}, {oa + a.size}) and {b.root!r} [{ob}, {ob + b.size}) overlap in bytes "
                f"while both live (steps {a.first}-{a.last} and {b.first}-{b.last})")
        group_of = {name: g for g in groups for name in g.members}
        by_sid = defaultdict(list)
        for name, sid in self.storage_ids.items():
            by_sid[sid].append(name)
            if by_name[name].size_bytes > self.storage_sizes[sid]:
                raise MemoryPlanError(f"{name!r} ({by_name[name].size_bytes} bytes) does not fit storage {sid} "
                                      f"({self.storage_sizes[sid]} bytes)")
        if set(self.storage_ids) != set(by_name):
            raise MemoryPlanError("every tensor needs a storage id")
        for sid, names in by_sid.items():
            sid_groups = list({id(group_of[n]): group_of[n] for n in names}.values())
            if self.storage_kinds[sid] != INTERMEDIATE and len(sid_groups) > 1:
                raise MemoryPlanError(f"{self.storage_kinds[sid]} storage {sid} is shared by "
                                      f"{[g.root for g in sid_groups]}")
            for a, b in _conflicting_pairs(sid_groups):
                raise MemoryPlanError(f"{a.root!r} and {b.root!r} share storage {sid} while both live")
        return self


MemoryPlan = StaticMemoryPlan  # the name the briefs use; not exported (the VM pass is called MemoryPlan)


# --- grouping and conflicts ---------------------------------------------------------------------
def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _validate(lifetimes) -> dict:
    by_name = {}
    for lt in lifetimes:
        if not isinstance(lt, TensorLifetime):
            raise MemoryPlanError(f"expected TensorLifetime records, got {type(lt).__name__}")
        if lt.name in by_name:
            raise MemoryPlanError(f"tensor name {lt.name!r} appears twice")
        if not isinstance(lt.size_bytes, int) or lt.size_bytes < 0:
            raise MemoryPlanError(f"{lt.name!r}: size_bytes must be a non-negative int, got {lt.size_bytes!r}")
        if lt.first_use > lt.last_use:
            raise MemoryPlanError(f"{lt.name!r}: first_use {lt.first_use} is after last_use {lt.last_use}")
        if lt.kind not in _KINDS:
            raise MemoryPlanError(f"{lt.name!r}: kind must be one of {_KINDS}, got {lt.kind!r}")
        by_name[lt.name] = lt
    acyclic: set = set()  # names whose alias chain is known to end: each chain is walked once
    for lt in lifetimes:
        seen = {lt.name}
        cur = lt
        while cur.alias_of is not None and cur.name not in acyclic:
            if cur.alias_of not in by_name:
                raise MemoryPlanError(f"{cur.name!r} aliases unknown tensor {cur.alias_of!r}")
            cur = by_name[cur.alias_of]
            if cur.name in seen:
                raise MemoryPlanError(f"alias cycle through {cur.name!r}")
            seen.add(cur.name)
        acyclic |= seen
    return by_name


def _build_groups(lifetimes, alignment: int) -> list:
    by_name = _validate(lifetimes)

    roots: dict = {}

    def root_of(name):
        path = []
        while by_name[name].alias_of is not None and name not in roots:
            path.append(name)
            name = by_name[name].alias_of
        root = roots.get(name, name)
        for n in path:  # memoized: a long chain of views is walked once, not once per view
            roots[n] = root
        return root

    groups: dict[str, _Group] = {}
    for lt in lifetimes:
        root = root_of(lt.name)
        g = groups.get(root)
        if g is None:
            g = groups[root] = _Group(root, [], 0, lt.first_use, lt.last_use, INTERMEDIATE)
        g.members.append(lt.name)
        g.size = max(g.size, _align(max(lt.size_bytes, 1), alignment))  # a 0-byte tensor still gets an address
        g.first, g.last = min(g.first, lt.first_use), max(g.last, lt.last_use)
        if _EXTERNAL_RANK.get(lt.kind, 0) > _EXTERNAL_RANK.get(g.kind, 0):
            g.kind = lt.kind
    return list(groups.values())


def _conflicting_pairs(groups):
    """Every pair of groups whose live ranges overlap (sweep over start steps)."""
    order = sorted(groups, key=lambda g: (g.first, g.last))
    active: list = []
    for g in order:
        active = [a for a in active if a.last >= g.first]
        for a in active:
            yield a, g
        active.append(g)


def _live_overlap(groups, offsets: dict):
    """Two groups live at a common step whose bytes overlap, or ``None``.

    A sweep over start steps keeps the live blocks sorted by offset; they are disjoint (else the
    sweep has stopped), so a new block need only be compared with its two neighbours: O(n log n)
    where comparing every live pair is quadratic (a loaded graph may have 10^5 tensors live at once).
    """
    live: list = []  # (offset, end, index) of the live blocks, sorted
    ends: list = []  # heap of (last step, live key)
    order = sorted(groups, key=lambda g: (g.first, g.last))
    for i, g in enumerate(order):
        while ends and ends[0][0] < g.first:
            key = heapq.heappop(ends)[1]
            del live[bisect.bisect_left(live, key)]
        start = offsets[g.root]
        key = (start, start + g.size, i)
        pos = bisect.bisect_left(live, key)
        if pos > 0 and live[pos - 1][1] > start:
            return order[live[pos - 1][2]], g
        if pos < len(live) and live[pos][0] < start + g.size:
            return order[live[pos][2]], g
        live.insert(pos, key)
        heapq.heappush(ends, (g.last, key))
    return None


def _conflict_lists(groups) -> dict:
    conflicts = {id(g): [] for g in groups}
    for a, b in _conflicting_pairs(groups):
        conflicts[id(a)].append(b)
        conflicts[id(b)].append(a)
    return conflicts


def _lower_bound(groups) -> int:
    events = []
    for g in groups:
        events.append((g.first, 0, g.size))
        events.append((g.last + 1, -1, -g.size))  # frees sort before allocations at the same step
    live = best = 0
    for _, _, delta in sorted(events):
        live += delta
        best = max(best, live)
    return best


# --- placement ----------------------------------------------------------------------------------
def _place_in_order(order, conflicts, alignment: int, fill_gaps: bool) -> tuple[dict, int]:
    """Place groups one by one at the lowest offset clear of their already-placed conflicts."""
    offsets: dict[int, int] = {}
    total = 0
    for g in order:
        taken = sorted((offsets[id(c)], offsets[id(c)] + c.size) for c in conflicts[id(g)] if id(c) in offsets)
        if fill_gaps:
            offset = 0
            for start, end in taken:
                if offset + g.size <= start:
                    break  # fits in the gap below this block
                offset = max(offset, _align(end, alignment))
        else:
            offset = _align(max((end for _, end in taken), default=0), alignment)
        offsets[id(g)] = offset
        total = max(total, offset + g.size)
    return offsets, total


def _greedy(groups, conflicts, alignment, by_conflicts: bool, fill_gaps: bool):
    if by_conflicts:
        key = lambda g: (-len(conflicts[id(g)]), -g.size, g.first, g.root)  # noqa: E731
    else:
        key = lambda g: (-g.size, -len(conflicts[id(g)]), g.first, g.root)  # noqa: E731
    order = sorted(groups, key=key)
    return (*_place_in_order(order, conflicts, alignment, fill_gaps), order)


def _hill_climb(groups, conflicts, alignment, fill_gaps, lower_bound, iterations=_HILL_CLIMB_ITERATIONS):
    """USMP's hill climb: perturb the placement order, keep improvements (and sometimes worse)."""
    best_offsets, best_total, best_order = min(
        (_greedy(groups, conflicts, alignment, flag, fill_gaps) for flag in (False, True)), key=lambda r: r[1])
    if len(groups) < 2:
        return best_offsets, best_total
    rng = random.Random(0)  # reproducible, like USMP's fixed seed
    order, total, offsets = list(best_order), best_total, best_offsets
    for attempt in range(1, iterations + 1):
        if best_total <= lower_bound:
            break
        # Move one of the blocks that reach the top earlier in the order (or swap two at random).
        top = [i for i, g in enumerate(order) if offsets[id(g)] + g.size == total]
        i = rng.choice(top) if top and rng.random() < 0.7 else rng.randrange(len(order))
        j = rng.randrange(len(order))
        if i == j:
            continue
        candidate = list(order)
        candidate[i], candidate[j] = candidate[j], candidate[i]
        cand_offsets, cand_total = _place_in_order(candidate, conflicts, alignment, fill_gaps)
        # Sideways and better moves always; worse ones rarely, less so the worse they are and the later.
        accept = cand_total <= total or rng.random() < 0.3 * best_total / cand_total / attempt
        if accept:
            order, total, offsets = candidate, cand_total, cand_offsets
        if cand_total < best_total:
            best_offsets, best_total = cand_offsets, cand_total
    return best_offsets, best_total


def _linear_scan(groups, alignment):
    """GraphPlanMemory-style token reuse; returns offsets where each token is one contiguous block."""
    token_size: list[int] = []
    token_of: dict[int, int] = {}
    free: list[int] = []  # token ids
    releases = defaultdict(list)  # step -> tokens freed after it
    for g in sorted(groups, key=lambda g: (g.first, g.root)):
        for step in [s for s in releases if s < g.first]:
            free.extend(releases.pop(step))
        fitting = [t for t in free if g.size <= token_size[t] <= g.size * _TOKEN_MATCH_RANGE]
        smaller = [t for t in free if g.size // _TOKEN_MATCH_RANGE <= token_size[t] < g.size]
        if fitting:
            token = min(fitting, key=lambda t: (token_size[t], t))
        elif smaller:
            token = max(smaller, key=lambda t: (token_size[t], -t))
            token_size[token] = g.size  # the block grows
        else:
            token = len(token_size)
            token_size.append(g.size)
        if token in free:
            free.remove(token)
        token_of[id(g)] = token
        releases[g.last].append(token)
    starts, total = [], 0
    for size in token_size:
        starts.append(total)
        total += size
    return {gid: starts[t] for gid, t in token_of.items()}, total


def plan_memory(lifetimes, algorithm: str = "greedy_by_size", alignment: int = 64,
                workspace_limit: int | None = None, fill_gaps: bool = True,
                iterations: int = _HILL_CLIMB_ITERATIONS) -> StaticMemoryPlan:
    """Place ``lifetimes`` into one workspace with ``algorithm``; see the module docstring.

    ``fill_gaps=False`` makes the greedy placements behave exactly like USMP's (offset above the
    highest conflicting block). Raises ``MemoryPlanError`` for invalid records or when the
    workspace would exceed ``workspace_limit`` bytes.
    """
    if algorithm not in PLANNER_ALGORITHMS:
        raise UnsupportedError(f"unknown memory planning algorithm {algorithm!r}; expected one of "
                               f"{', '.join(PLANNER_ALGORITHMS)}")
    if not isinstance(alignment, int) or alignment < 1:
        raise MemoryPlanError(f"alignment must be a positive int, got {alignment!r}")
    lifetimes = tuple(lifetimes)
    groups = _build_groups(lifetimes, alignment)
    placed = [g for g in groups if g.kind == INTERMEDIATE]
    conflicts = _conflict_lists(placed)
    lower_bound = _lower_bound(placed)
    if algorithm == "best":
        candidates = [plan_memory(lifetimes, name, alignment, None, fill_gaps, iterations)
                      for name in ("greedy_by_size", "greedy_by_conflicts", "hill_climb", "linear_scan")]
        best = min(candidates, key=lambda p: p.total_bytes)
        best.algorithm = f"best ({best.algorithm})"
        _check_limit(best.total_bytes, workspace_limit, best.algorithm)
        return best
    if algorithm in ("greedy_by_size", "greedy_by_conflicts"):
        group_offsets, total, _ = _greedy(placed, conflicts, alignment, algorithm == "greedy_by_conflicts", fill_gaps)
    elif algorithm == "hill_climb":
        group_offsets, total = _hill_climb(placed, conflicts, alignment, fill_gaps, lower_bound, iterations)
    elif algorithm == "linear_scan":
        group_offsets, total = _linear_scan(placed, alignment)
    else:  # no_reuse
        group_offsets, total = {}, 0
        for g in sorted(placed, key=lambda g: (g.first, g.root)):
            group_offsets[id(g)] = total
            total += g.size
    _check_limit(total, workspace_limit, algorithm)
    return _assemble(algorithm, alignment, lifetimes, groups, group_offsets, total, lower_bound)


def _check_limit(total: int, limit: int | None, algorithm: str) -> None:
    if limit is not None and total > limit:
        raise MemoryPlanError(f"the workspace needs {total} bytes ({algorithm}) but the limit is {limit} bytes; "
                              f"raise workspace_limit or try another algorithm")


def _assemble(algorithm, alignment, lifetimes, groups, group_offsets, total, lower_bound) -> StaticMemoryPlan:
    offsets, storage_ids = {}, {}
    storage_sizes, storage_offsets, storage_kinds = [], [], []
    sid_at_offset: dict[int, int] = {}
    external = defaultdict(int)
    by_name = {lt.name: lt for lt in lifetimes}
    # Intermediates first (ordered by offset, so storage ids read bottom-up), then external storages.
    placed = sorted((g for g in groups if g.kind == INTERMEDIATE), key=lambda g: (group_offsets[id(g)], g.first))
    for g in placed:
        off = group_offsets[id(g)]
        sid = sid_at_offset.get(off)
        if sid is None:
            sid = sid_at_offset[off] = len(storage_sizes)
            storage_sizes.append(0)
            storage_offsets.append(off)
            storage_kinds.append(INTERMEDIATE)
        storage_sizes[sid] = max(storage_sizes[sid], max(by_name[n].size_bytes for n in g.members))
        for name in g.members:
            offsets[name] = off
            storage_ids[name] = sid
    for g in sorted((g for g in groups if g.kind != INTERMEDIATE), key=lambda g: (g.first, g.root)):
        sid = len(storage_sizes)
        size = max(by_name[n].size_bytes for n in g.members)
        storage_sizes.append(size)
        storage_offsets.append(None)
        storage_kinds.append(g.kind)
        external[g.kind] += size
        for name in g.members:
            storage_ids[name] = sid
    unplanned = sum(g.size for g in groups if g.kind == INTERMEDIATE)
    return StaticMemoryPlan(algorithm, alignment, lifetimes, offsets, storage_ids, storage_sizes,
                            storage_offsets, storage_kinds, total, unplanned, lower_bound, dict(external))
