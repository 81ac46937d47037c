"""Reading a Pallas kernel's LLO: the operations Mosaic's last pass (``post-finalize-llo``) issues per grid step,
counted per TPU unit and summed over the grid the kernel actually runs.

The dump is one function per kernel: the body of one grid step, with ``scf.for`` loops (bounds are SSA scalars) and
``scf.if`` branches (``pl.when``: the first / last key block, a chunk with no visible key). Counts are dynamic: the
scalar code that decides each branch and trip count is evaluated for every grid index, so an initialisation that runs
once per query block is counted once per query block. A condition computed from memory (a mask table read with
``sld``) cannot be evaluated statically and is counted as taken (``assumed_taken`` says how often).

These are operations issued, not scheduled bundles: a static proxy for a kernel's work per unit, not a time.
"""

from __future__ import annotations

import collections
import dataclasses
import re

# Each op's unit; first match wins. MXU: pushes of operands, weight latches and result pops. Transcendental: the
# EUP's ops. Cross-lane: the XLU (transposes, lane/sublane reductions and rotations, broadcasts across sublanes).
# Free: values that are renamed, not computed (constants, bitcasts, type markers).
UNITS = ("mxu", "vector", "transcendental", "load/store", "cross-lane", "scalar")
_UNIT_RULES = (
    ("free", re.compile(r"^llo\.(constant|type|vbitcast|sbitcast)$")),
    ("mxu", re.compile(r"^llo\.(vmat|vlatch|vdwg)")),
    ("transcendental", re.compile(r"^llo\.v(pow2|exp|log|log2|recip|rsqrt|sqrt|tanh|sin|cos|erf|sigmoid)\b")),
    ("load/store", re.compile(r"^llo\.(vector_load|vector_store|vld|vst|sld|sst|dma|enqueue_dma|wait_dma)")),
    ("cross-lane", re.compile(r"^llo\.v(xpose|rot|perm|shuffle|slreplicate|bcast|broadcast)|\.(xlane|slane)\.")),
    ("vector", re.compile(r"^llo\.v")),
    ("scalar", re.compile(r"^llo\.s")),
)

_OP = re.compile(r'^\s*(?:(%[\w#]+)(?::\d+)?\s*=\s*)?"?((?:llo|scf)\.[\w.]+)"?')
_FOR = re.compile(r"^\s*scf\.for\s+(%\w+)\s*=\s*(%\w+)\s+to\s+(%\w+)\s+step\s+(%\w+)")
_IF = re.compile(r"^\s*scf\.if\s+(%\w+)")
_FUNC = re.compile(r"^\s*func\.func\s+@([\w$.-]+)\(")
_BOUNDS = re.compile(r"iteration_bounds\s*=\s*array<i64:\s*([\d,\s]+)>")
_CONSTANT = re.compile(r"value\s*=\s*(-?\d+)\s*:\s*i\d+\s*\}")
_OPERANDS = re.compile(r"%[\w#]+")
_SMEM = re.compile(
    r"(%arg\d+): i32 \{llo\.type = memref<([\dx]+)xi32, #tpu\.tiled<\(([\d,]+)\),\[([\d,]+)\]>, "
    r"#tpu\.memory_space<smem>>\}"
)


def unit_of(op: str) -> str | None:
    """The unit an LLO op name runs on (``UNITS``), or None for ops that compute nothing."""
    for unit, pattern in _UNIT_RULES:
        if pattern.search(op):
            return None if unit == "free" else unit
    return None


@dataclasses.dataclass
class Region:
    """Straight-line ops of one region (a counter by op name), then its nested loops and branches in order."""

    ops: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    scalars: list = dataclasses.field(default_factory=list)  # (result, op, operands, constant) in program order
    nested: list = dataclasses.field(
        default_factory=list
    )  # ("for", var, lo, hi, step, body) | ("if", cond, then, else)


@dataclasses.dataclass
class Kernel:
    name: str
    grid: tuple[int, ...]
    body: Region
    smem: list = dataclasses.field(default_factory=list)  # int32 SMEM arguments: (name, shape, tile, tile strides)

    def smem_words(self, index: int, table) -> dict[int, int]:
        """The word offsets of a 2-D int32 ``table`` as the ``index``-th SMEM argument lays it out (tiled), for
        ``work(tables=...)``: what ``llo.sld`` reads where a branch depends on a table (scalar prefetch)."""
        _, shape, tile, strides = self.smem[index]
        rows, cols = (len(table), len(table[0])) if len(shape) == 2 else (1, len(table))
        t0, t1 = tile if len(tile) == 2 else (1, tile[0])
        s0, s1 = strides if len(strides) == 2 else (0, strides[0])
        words = {}
        for r in range(rows):
            for c in range(cols):
                value = table[r][c] if len(shape) == 2 else table[c]
                words[((r // t0) * s0 + (c // t1) * s1) * t0 * t1 + (r % t0) * t1 + c % t1] = int(value)
        return words


def parse(text: str) -> list[Kernel]:
    """The kernels (functions with ``iteration_bounds``) of one ``post-finalize-llo`` dump."""
    kernels, stack, kernel = [], [], None
    for line in text.splitlines():
        stripped = line.strip()
        function = _FUNC.match(line)
        if function:
            bounds = _BOUNDS.search(line)
            kernel = None
            if bounds:
                grid = tuple(int(n) for n in bounds.group(1).replace(" ", "").split(",") if n)
                smem = [
                    (
                        name,
                        tuple(int(n) for n in shape.split("x")),
                        tuple(int(n) for n in tile.split(",")),
                        tuple(int(n) for n in strides.split(",")),
                    )
                    for name, shape, tile, strides in _SMEM.findall(line)
                ]
                kernel = Kernel(function.group(1), grid, Region(), smem)
                kernels.append(kernel)
                stack = [kernel.body]
            continue
        if kernel is None or not stack:
            continue
        if stripped.startswith("}"):
            if stripped.startswith("} else {"):
                stack.pop()
                node = stack[-1].nested[-1]
                node[3] = Region()
                stack.append(node[3])
            else:
                stack.pop()
                if not stack:
                    kernel = None
            continue
        loop, branch = _FOR.match(line), _IF.match(line)
        if loop:
            body = Region()
            stack[-1].nested.append(["for", *loop.groups(), body])
            stack.append(body)
            continue
        if branch:
            then = Region()
            stack[-1].nested.append(["if", branch.group(1), then, None])
            stack.append(then)
            continue
        op = _OP.match(line)
        if not op or op.group(2).startswith("scf."):
            continue
        result, name = op.groups()
        stack[-1].ops[name] += 1
        if (
            result
            and (name.startswith(("llo.s", "llo.p")) or name == "llo.constant")
            and "vector<" not in line.split("=", 1)[1]
        ):
            constant = _CONSTANT.search(line) if name == "llo.constant" else None
            operands = _OPERANDS.findall(line.split(name, 1)[1].split("{")[0].split(":")[0])
            stack[-1].scalars.append((result, name, operands, int(constant.group(1)) if constant else None))
    return kernels


_BINARY = {
    "sadd": lambda a, b: a + b,
    "ssub": lambda a, b: a - b,
    "smul": lambda a, b: a * b,
    "sfloordiv": lambda a, b: a // b if b else None,
    "sfloorrem": lambda a, b: a % b if b else None,
    "sdiv": lambda a, b: int(a / b) if b else None,
    "srem": lambda a, b: a - b * int(a / b) if b else None,
    "seq": lambda a, b: int(a == b),
    "sne": lambda a, b: int(a != b),
    "slt": lambda a, b: int(a < b),
    "sle": lambda a, b: int(a <= b),
    "sgt": lambda a, b: int(a > b),
    "sge": lambda a, b: int(a >= b),
    "sand": lambda a, b: a & b,
    "sor": lambda a, b: a | b,
    "sxor": lambda a, b: a ^ b,
    "sshll": lambda a, b: a << b,
    "sshra": lambda a, b: a >> b,
    "shrl": lambda a, b: (a % (1 << 32)) >> b,
    "smin": lambda a, b: min(a, b),
    "pand": lambda a, b: int(bool(a) and bool(b)),  # predicates
    "por": lambda a, b: int(bool(a) or bool(b)),
    "pxor": lambda a, b: int(bool(a) != bool(b)),
    "smax": lambda a, b: max(a, b),
}


def _evaluate(region: Region, values: dict) -> None:
    """Fold the region's scalar ops into ``values`` (None where a value is not static, e.g. read from memory)."""
    for result, name, operands, constant in region.scalars:
        if constant is not None:
            values[result] = constant
            continue
        base = name.split(".")[1]
        args = [values.get(operand) for operand in operands]
        if base == "sselect" and len(args) == 3 and args[0] is not None:
            values[result] = args[1] if args[0] else args[2]
        elif base == "sld" and f"@{operands[0]}" in values:  # a read of a table the caller supplied
            offset = args[1] if len(args) > 1 else 0
            values[result] = None if offset is None else values[f"@{operands[0]}"].get(offset)
        elif base == "pnot" and len(args) == 1 and args[0] is not None:
            values[result] = int(not args[0])
        elif base in _BINARY and len(args) == 2 and None not in args:
            values[result] = _BINARY[base](*args)
        else:
            values[result] = None


@dataclasses.dataclass
class Work:
    """A kernel's ops summed over its whole grid: by op name, and how often a branch was taken without proof."""

    name: str
    grid: tuple[int, ...]
    ops: collections.Counter
    assumed_taken: int = 0

    @property
    def steps(self) -> int:
        total = 1
        for n in self.grid:
            total *= n
        return total

    def by_unit(self) -> dict[str, int]:
        units = dict.fromkeys(UNITS, 0)
        for op, count in self.ops.items():
            unit = unit_of(op)
            if unit is not None:
                units[unit] += count
        return units


_EXACT_AXIS = 32  # grid axes up to this long are walked index by index; longer ones are sampled (``_axis_samples``)


def _axis_samples(n: int) -> list[tuple[int, int]]:
    """(index, weight) covering ``range(n)``: every index of a short axis; of a long one the first and last eight
    indices (where the first/last-block branches and the padded end live) and eight interior indices, each standing
    for its stretch. Exact for branches that test an index against the ends or a threshold the samples bracket."""
    if n <= _EXACT_AXIS:
        return [(i, 1) for i in range(n)]
    edge = list(range(8)) + list(range(n - 8, n))
    interior = n - 16
    samples = [(i, 1) for i in edge]
    for k in range(8):
        lo, hi = 8 + interior * k // 8, 8 + interior * (k + 1) // 8
        if hi > lo:
            samples.append(((lo + hi) // 2, hi - lo))
    return samples


def work(kernel: Kernel, tables: dict | None = None) -> Work:
    """The kernel's dynamic op counts over its grid. ``tables``: {index of an SMEM argument: its 2-D int32 values}
    (a scalar-prefetch table), so branches read from it are decided, not assumed taken."""
    memory = {f"@{kernel.smem[i][0]}": kernel.smem_words(i, table) for i, table in (tables or {}).items()}
    total, assumed = collections.Counter(), [0]

    def run(region: Region, values: dict, weight: int) -> None:
        values = dict(values)
        _evaluate(region, values)
        for op, count in region.ops.items():
            total[op] += count * weight
        for node in region.nested:
            if node[0] == "for":
                _, var, lo, hi, step, body = node
                bounds = [values.get(lo), values.get(hi), values.get(step)]
                if None in bounds or bounds[2] <= 0:
                    raise ValueError(f"{kernel.name}: a loop's bounds are not static ({lo}, {hi}, {step}).")
                for index in range(*bounds):
                    run(body, {**values, var: index}, weight)
            else:
                _, cond, then, otherwise = node
                taken = values.get(cond)
                if taken is None:
                    assumed[0] += weight
                if taken is None or taken:
                    run(then, values, weight)
                elif otherwise is not None:
                    run(otherwise, values, weight)

    grid = kernel.grid
    points = [((), 1)]
    for axis, n in enumerate(grid):
        # the leading axis is parallel (batch x heads): without tables its branches do not depend on it (index 0
        # stands for all); a table is read per batch row
        samples = [(0, n)] if axis == 0 and len(grid) > 1 and not memory else _axis_samples(n)
        points = [((*index, i), weight * w) for index, weight in points for i, w in samples]
    for indices, weight in points:
        run(kernel.body, {**memory, **{f"%arg{axis}": index for axis, index in enumerate(indices)}}, weight)
    return Work(kernel.name, grid, total, assumed[0])
