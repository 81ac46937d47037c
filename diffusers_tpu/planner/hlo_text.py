"""Optimized HLO text (``compiled.as_text()``) parsed into computations of instructions, and the bytes of a printed
HLO type: what ``hlo_stats`` counts from."""

from __future__ import annotations

import dataclasses
import re

_DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "s4": 0.5,
    "u4": 0.5,
}
_HEADER = re.compile(r"^(ENTRY )?%(\S+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(ROOT )?%(\S+) = ")
ARRAY = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]")  # an array in a printed type: (dtype, dims)


@dataclasses.dataclass
class Instruction:
    name: str
    shape: str  # the result type as printed: ``bf16[1,2]{...}`` or a tuple ``(...)``
    opcode: str
    rest: str  # operands and attributes

    def operands(self) -> list[str]:
        """Names of the operands (the instruction's argument list, before its attributes)."""
        depth, end = 1, len(self.rest)
        for i, ch in enumerate(self.rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                end = i
                break
        return re.findall(r"%([\w.\-]+)", self.rest[:end])

    def attribute(self, key: str) -> str | None:
        found = re.search(rf"\b{key}=(%?[\w.\-]+)", self.rest)
        return found.group(1).lstrip("%") if found else None

    @property
    def result_bytes(self) -> float:
        return shape_bytes(self.shape)


def shape_bytes(shape: str) -> float:
    """Bytes of every array in a printed HLO type (a tuple's elements summed; layouts ignored)."""
    total = 0.0
    for dtype, dims in ARRAY.findall(shape):
        if dtype not in _DTYPE_BYTES:
            continue
        count = 1
        for d in dims.split(","):
            if d:
                count *= int(d)
        total += count * _DTYPE_BYTES[dtype]
    return total


def _split_type(text: str) -> tuple[str, str]:
    """``text`` starts with an HLO type: (the type, what follows)."""
    if text.startswith("("):
        depth = 0
        for i, ch in enumerate(text):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                return text[: i + 1], text[i + 1 :].lstrip()
    depth = 0
    for i, ch in enumerate(text):
        depth += ch in "[{"
        depth -= ch in "]}"
        if ch == " " and depth == 0:
            return text[:i], text[i + 1 :]
    return text, ""


def parse(hlo: str) -> tuple[dict[str, list[Instruction]], str | None]:
    """``({computation name: instructions}, entry name)`` of an HLO module's text."""
    computations, entry, current = {}, None, None
    for line in hlo.splitlines():
        header = _HEADER.match(line)
        if header and not line.startswith(" "):
            current = computations.setdefault(header.group(2), [])
            if header.group(1):
                entry = header.group(2)
            continue
        if line.rstrip() == "}":  # the computation's end (a Pallas call's config may hold lines starting "}}")
            current = None
            continue
        found = _INSTRUCTION.match(line) if current is not None else None
        if found is None:
            continue
        shape, after = _split_type(line[found.end() :])
        opcode, _, rest = after.partition("(")
        current.append(Instruction(found.group(2), shape, opcode.strip(), rest))
    return computations, entry
