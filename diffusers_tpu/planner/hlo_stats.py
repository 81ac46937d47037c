"""What a compiled program holds, read from its optimized HLO text (``compiled.as_text()``), any backend.

XLA's own cost analysis counts a while loop's body once, whatever its trip count, and a Pallas kernel as nearly
nothing. Here every instruction is weighted by how often it runs: a loop body by its trip count (``known_trip_count``
in its backend config, else read from its condition's comparison with a constant), nested loops multiplied. Counted
per program and per loop body: copies (layout changes and moves XLA inserted; async ``copy-start`` pairs counted
once), fusions, custom calls by target (Pallas kernels are ``tpu_custom_call``), collectives by kind with the bytes
of their result per device (those the TPU compiler fused with a neighbouring op included).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re

from ..interop.program_figures import memory_report
from .hlo_text import ARRAY, Instruction, parse, shape_bytes

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute", "ragged-all-to-all")


def _trip_count(instruction: Instruction, computations: dict) -> int | None:
    config = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', instruction.rest)
    if config:
        return int(config.group(1))
    condition = computations.get(instruction.attribute("condition") or "", [])
    constants = {i.name: i for i in condition if i.opcode == "constant"}
    for compare in (i for i in condition if i.opcode == "compare"):
        direction = compare.attribute("direction")
        for name in re.findall(r"%([\w.\-]+)", compare.rest.split(")")[0]):
            value = re.match(r"(-?\d+)\)", constants[name].rest) if name in constants else None
            if value and direction in ("LT", "GT", "NE"):
                return int(value.group(1))
            if value and direction in ("LE", "GE"):
                return int(value.group(1)) + 1
    return None


def _branches(ins: Instruction) -> list[str]:
    listed = re.search(r"branch_computations=\{([^}]*)\}", ins.rest)
    if listed:
        return [name.strip().lstrip("%") for name in listed.group(1).split(",") if name.strip()]
    return [b for b in (ins.attribute("true_computation"), ins.attribute("false_computation")) if b]


@dataclasses.dataclass
class Counts:
    """Instruction counts of one computation (or a program), each weighted by how often it runs."""

    copies: int = 0
    fusions: int = 0
    instructions: int = 0
    flops: float = 0.0  # matrix products and convolutions (2 per multiply-add), Pallas kernels not included
    bytes: float = 0.0  # read and written by the program's top-level instructions (a fusion: its inputs and outputs)
    attention_flops: float = 0.0  # the project's attention kernel: 4 x batch*heads x q x kv x head_dim, as padded
    attention_calls: int = 0
    custom_calls: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    collectives: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    collective_bytes: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def add(self, other: Counts, times: int = 1) -> None:
        self.copies += other.copies * times
        self.fusions += other.fusions * times
        self.instructions += other.instructions * times
        self.flops += other.flops * times
        self.bytes += other.bytes * times
        self.attention_flops += other.attention_flops * times
        self.attention_calls += other.attention_calls * times
        for mine, theirs in (
            (self.custom_calls, other.custom_calls),
            (self.collectives, other.collectives),
            (self.collective_bytes, other.collective_bytes),
        ):
            for key, value in theirs.items():
                mine[key] += value * times

    def non_attention_custom_calls(self) -> int:
        return sum(n for target, n in self.custom_calls.items() if target != "tpu_custom_call")

    def as_dict(self) -> dict:
        return {
            "copies": self.copies,
            "fusions": self.fusions,
            "instructions": self.instructions,
            "flops": self.flops,
            "bytes": self.bytes,
            "attention_flops": self.attention_flops,
            "attention_calls": self.attention_calls,
            "custom_calls": dict(self.custom_calls),
            "collectives": dict(self.collectives),
            "collective_bytes": dict(self.collective_bytes),
        }


ATTENTION_KERNEL = "diffusers_tpu_flash_attention"  # the Pallas call's name (``kernels.flash``)
_CONTROL = (
    "parameter",
    "get-tuple-element",
    "tuple",
    "bitcast",
    "constant",
    "while",
    "conditional",
    "call",
    "after-all",
    "partition-id",
    "replica-id",
    "opt-barrier",
)


def _dims(shape: str) -> list[int]:
    found = ARRAY.search(shape)
    return [int(d) for d in found.group(2).split(",") if d] if found else []


def _product(values) -> int:
    total = 1
    for v in values:
        total *= v
    return total


def _matmul_flops(ins: Instruction, shapes: dict) -> float:
    """2 x multiply-adds of a ``dot`` or ``convolution`` (operand shapes from ``shapes``)."""
    operands = ins.operands()
    if ins.opcode == "dot" and operands:
        contracting = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", ins.rest)
        lhs = _dims(shapes.get(operands[0], ""))
        k = _product(lhs[int(i)] for i in contracting.group(1).split(",") if i) if contracting and lhs else 1
        return 2.0 * _product(_dims(ins.shape)) * k
    if ins.opcode == "convolution" and len(operands) > 1:
        labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", ins.rest)
        lhs, rhs, out = (_dims(shapes.get(operands[0], "")), _dims(shapes.get(operands[1], "")), _dims(ins.shape))
        if not labels or len(labels.group(2)) != len(rhs) or len(labels.group(1)) != len(lhs):
            return 0.0
        lhs_labels, kernel, out_labels = labels.groups()
        features = _product(n for n, label in zip(rhs, kernel) if label == "i")  # per group
        window = _window(ins.rest)
        positions = taps = 1
        for axis, label in enumerate(label for label in kernel if label.isdigit()):
            size = out[out_labels.index(label)]
            positions *= size
            taps *= _valid_taps(lhs[lhs_labels.index(label)], rhs[kernel.index(label)], size, window, axis)
        return 2.0 * _product(out) / max(positions, 1) * taps * features
    return 0.0


def _window(rest: str) -> dict:
    """A convolution's ``window={size=2x3 stride=.. pad=1_1x0_0 lhs_dilate=.. rhs_dilate=..}``, per spatial axis."""
    found = re.search(r"window=\{([^}]*)\}", rest)
    return dict(item.split("=", 1) for item in found.group(1).split()) if found else {}


def _valid_taps(size: int, kernel: int, outputs: int, window: dict, axis: int) -> int:
    """(output position, kernel tap) pairs along one spatial axis that read the input, not its padding or the holes
    of an input dilation — as XLA's own cost analysis counts a convolution (a dot the TPU compiler turns into a
    convolution over a padded axis of 1 reads one tap of its window of 2: counting the window would double it)."""

    def value(name: str, default: str) -> str:
        return (window.get(name, "").split("x") + [default] * (axis + 1))[axis] or default

    stride, lhs_dilation, rhs_dilation = (int(value(n, "1")) for n in ("stride", "lhs_dilate", "rhs_dilate"))
    low = int(value("pad", "0_0").split("_")[0])
    extent = (size - 1) * lhs_dilation + 1
    valid = 0
    for tap in range(kernel):
        start = tap * rhs_dilation - low  # where position 0 reads
        if lhs_dilation == 1:  # the positions reading 0 <= start + position * stride < extent
            first, last = max(0, -(start // stride)), min(outputs - 1, (extent - 1 - start) // stride)
            valid += max(0, last - first + 1)
        else:
            valid += sum(
                0 <= start + p * stride < extent and (start + p * stride) % lhs_dilation == 0 for p in range(outputs)
            )
    return valid


def _fused_flops(name: str, computations: dict, depth: int = 0) -> float:
    """Matrix-product FLOPs of a fused computation, fusions nested in it included (the TPU compiler nests them)."""
    fused = computations.get(name, [])
    shapes = {i.name: i.shape for i in fused}
    total = sum(_matmul_flops(i, shapes) for i in fused)
    if depth < 8:
        total += sum(
            _fused_flops(i.attribute("calls") or "", computations, depth + 1) for i in fused if i.opcode == "fusion"
        )
    return total


_SLICES = ("slice", "dynamic-slice", "slice-start")  # read only the part they return


def _moved_bytes(ins: Instruction, shapes: dict) -> float:
    """Bytes an instruction reads and writes, as XLA's cost analysis counts them: its operands and its result,
    except that an async start's result tuple repeats its operands (aliases) beside its output, a slice reads only
    what it returns and an in-place dynamic-update-slice touches only the update. (TPU memory-space assignment
    streams big operands into VMEM as many ``slice-start`` pieces; counting the whole operand per piece made a
    69 MB query read as 1.2 GB.)"""
    operands = [shape_bytes(shapes.get(name, "")) for name in ins.operands()]
    read, written = sum(operands), ins.result_bytes
    if ins.opcode.endswith("-start") and ins.shape.startswith("("):
        written = max(written - read, 0.0)
    if ins.opcode in _SLICES:
        read = written
    elif ins.opcode == "dynamic-update-slice" and len(operands) > 1:
        read = written = operands[1]
    return read + written


def _own_counts(instructions: list[Instruction], computations: dict | None = None) -> Counts:
    counts = Counts()
    shapes = {ins.name: ins.shape for ins in instructions}
    for ins in instructions:
        if ins.opcode.endswith("-done"):
            continue
        if ins.opcode not in _CONTROL:
            counts.bytes += _moved_bytes(ins, shapes)
        counts.flops += _matmul_flops(ins, shapes)
        if ins.opcode == "fusion" and computations is not None:
            counts.flops += _fused_flops(ins.attribute("calls") or "", computations)
        if ins.opcode in ("parameter", "get-tuple-element", "tuple", "bitcast", "constant"):
            continue
        counts.instructions += 1
        base = ins.opcode[: -len("-start")] if ins.opcode.endswith("-start") else ins.opcode
        if base == "copy":
            counts.copies += 1
        elif base == "fusion":
            counts.fusions += 1
        elif base == "custom-call":
            target = re.search(r'custom_call_target="([^"]+)"', ins.rest)
            counts.custom_calls[target.group(1) if target else "?"] += 1
            if ins.name.startswith(ATTENTION_KERNEL):  # ``kernels.flash``: [chunk table,] q, k, v[, mask]
                # q/k folded [BH, S, D] or packed [B, S, H*D]: 4 * Sq * Skv * (B*H*D) either way
                q, k = ([d for d in (_dims(shapes.get(n, "")) for n in ins.operands()) if len(d) == 3] + [(), ()])[:2]
                if len(q) == len(k) == 3:
                    counts.attention_flops += 4.0 * q[0] * q[1] * k[1] * q[2]
                    counts.attention_calls += 1
        elif base in COLLECTIVES:
            counts.collectives[base] += 1
            counts.collective_bytes[base] += _collective_bytes(ins)
    return counts


def _collective_bytes(ins: Instruction) -> float:
    """Bytes a collective's result holds on one device (for async ``*-start`` tuples, the largest element: the
    result buffer, not the operand alias)."""
    if ins.opcode.endswith("-start") and ins.shape.startswith("("):
        return max((shape_bytes(f"{d}[{s}]") for d, s in ARRAY.findall(ins.shape)), default=0.0)
    return ins.result_bytes


@dataclasses.dataclass
class Loop:
    body: str
    trip_count: int | None
    counts: Counts  # one run of the body (its nested loops multiplied in)


@dataclasses.dataclass
class ProgramStats:
    total: Counts  # the whole program, loop bodies times their trip counts
    per_run: Counts  # the instructions as written (every loop body once)
    loops: list[Loop]

    def largest_loop(self) -> Loop | None:
        return max(self.loops, key=lambda loop: loop.counts.instructions, default=None)

    def as_dict(self) -> dict:
        return {
            "total": self.total.as_dict(),
            "as_written": self.per_run.as_dict(),
            "loops": [
                {"body": loop.body, "trip_count": loop.trip_count, **loop.counts.as_dict()} for loop in self.loops
            ],
        }


def stats(hlo: str) -> ProgramStats:
    """Counts of the program ``hlo`` (optimized HLO text): see the module docstring."""
    computations, entry = parse(hlo)
    loops: list[Loop] = []
    memo: dict[str, tuple[Counts, Counts]] = {}

    def visit(name: str) -> tuple[Counts, Counts]:
        """(weighted, as written) counts of computation ``name`` and the loops and calls it runs."""
        if name in memo:
            return memo[name]
        weighted, written = Counts(), Counts()
        instructions = computations.get(name, [])
        own = _own_counts(instructions, computations)
        weighted.add(own)
        written.add(own)
        for ins in instructions:
            if ins.opcode == "while":
                body = ins.attribute("body")
                trips = _trip_count(ins, computations)
                body_weighted, body_written = visit(body)
                loops.append(Loop(body, trips, body_weighted))
                weighted.add(body_weighted, trips or 1)
                written.add(body_written)
            elif ins.opcode == "fusion":  # the TPU compiler fuses collectives with their neighbours (kCustom)
                inner = _own_counts(computations.get(ins.attribute("calls") or "", []))  # (its FLOPs: own counts)
                fused = Counts(collectives=inner.collectives, collective_bytes=inner.collective_bytes)
                weighted.add(fused)
                written.add(fused)
            elif ins.opcode == "conditional":  # one branch runs: the largest is counted, every branch as written
                branches = [visit(b) for b in _branches(ins)]
                if branches:
                    weighted.add(max((b[0] for b in branches), key=lambda c: c.instructions))
                    for _, branch_written in branches:
                        written.add(branch_written)
            elif ins.opcode in ("call", "async-start"):
                called = ins.attribute("to_apply") or ins.attribute("calls")
                if called:
                    sub_weighted, sub_written = visit(called)
                    weighted.add(sub_weighted)
                    written.add(sub_written)
        memo[name] = (weighted, written)
        return memo[name]

    total, per_run = visit(entry) if entry else (Counts(), Counts())
    return ProgramStats(total, per_run, loops)


def cost_per_run(cost: dict | list | None) -> dict:
    """XLA's cost analysis as a flat dict (jax returns a dict, older versions a list of one)."""
    if isinstance(cost, list):
        cost = cost[0] if cost else {}
    return {k: float(v) for k, v in (cost or {}).items() if isinstance(v, (int, float))}


def summary(compiled, seconds: float | None = None) -> dict:
    """One compiled program (``jax.stages.Compiled``): memory per device, XLA's cost analysis as it reports it (loop
    bodies once), the weighted instruction counts, code size, compile seconds."""
    report = memory_report(compiled)
    report["generated_code_bytes"] = compiled.memory_analysis().generated_code_size_in_bytes
    cost = cost_per_run(compiled.cost_analysis())
    report["xla_cost"] = {
        k: cost[k] for k in ("flops", "bytes accessed", "transcendentals", "optimal_seconds") if k in cost
    }
    report["hlo"] = stats(compiled.as_text()).as_dict()
    if seconds is not None:
        report["compile_seconds"] = round(seconds, 2)
    return report


def dumps(report: dict) -> str:
    return json.dumps(report, indent=1, default=str)
