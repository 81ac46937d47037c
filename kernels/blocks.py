"""The exp2 kernel's tile sizes as a dataclass, and how they are fitted to a call's sequences and a chip's VMEM."""

from __future__ import annotations

import dataclasses

_LANES, _SUBLANES = 128, 8


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def heads_per_block(heads: int, head_dim: int) -> int:
    """Heads that share one 128-lane tile of the projections' ``[B, S, H*D]`` layout in a kernel's grid step:
    ``128 / D`` of them when they fill it exactly and divide ``heads`` (CogVideoX's and LTX's 64-wide heads: 2),
    else 1."""
    group = _LANES // head_dim if head_dim < _LANES and _LANES % head_dim == 0 else 1
    return group if heads % group == 0 else 1


def check_lane_multiples(sizes) -> None:
    """Every field of a block-size dataclass must be a positive multiple of the 128-wide TPU lane."""
    for field in dataclasses.fields(sizes):
        value = getattr(sizes, field.name)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value % _LANES:
            raise ValueError(f"{type(sizes).__name__}.{field.name}={value!r} must be a positive multiple of {_LANES}.")


# VMEM per TensorCore as the TPU compiler reports it ("Used X of Y vmem"; libtpu 0.0.42), by JAX ``device_kind``.
VMEM_BYTES = {
    "TPU v4": 16 << 20,
    "TPU v5": 64 << 20,
    "TPU v5p": 64 << 20,
    "TPU v5 lite": 128 << 20,
    "TPU v6 lite": 128 << 20,
}
DEFAULT_VMEM_BYTES = 64 << 20  # an unknown chip (or a CPU process lowering for TPU): the smaller recent VMEM


def vmem_capacity(devices=None) -> int:
    """VMEM per core of the TPU ``devices`` run on (the first one's kind), else ``DEFAULT_VMEM_BYTES``."""
    kind = getattr(next(iter(devices), None), "device_kind", None) if devices is not None else None
    return VMEM_BYTES.get(kind, DEFAULT_VMEM_BYTES)


def block_for(length: int, limit: int, tolerance: float = 0.005) -> int:
    """The block (a multiple of 128, between ``limit / 2`` and ``limit``) for a sequence of ``length``: the largest
    whose padded length is within ``tolerance`` of the least padding any of them gives. 32,760 tokens with a 3,328
    limit: 2,048 (pads to 32,768; 3,328 itself would pad to 33,280)."""
    if length <= limit:
        return round_up(length, _LANES)
    top = max(limit - limit % _LANES, _LANES)
    candidates = [(round_up(length, b), b) for b in range(top, max(_LANES, top // 2) - 1, -_LANES)]
    least = min(padded for padded, _ in candidates)
    return next(b for padded, b in candidates if padded <= least * (1 + tolerance))


def _largest_divisor(limit: int, total: int) -> int:
    """The largest multiple of 128 that divides ``total`` and is at most ``limit``."""
    for size in range(limit - limit % _LANES, 0, -_LANES):
        if total % size == 0:
            return size
    return _LANES


@dataclasses.dataclass(frozen=True)
class BlockSizes:
    """Tile sizes, all multiples of 128. Defaults: the Wan 2.1 TPU guide's (tuned for 720p on v6e).

    block_q: queries per grid step. block_kv: keys per grid step. block_kv_compute: keys per score matmul.
    block_kv_compute_in: keys per softmax-update sub-block (the fine-grained inner loop).
    """

    block_q: int = 3328
    block_kv: int = 2816
    block_kv_compute: int = 256
    block_kv_compute_in: int = 256

    def __post_init__(self):
        check_lane_multiples(self)
        if self.block_kv % self.block_kv_compute or self.block_kv_compute % self.block_kv_compute_in:
            raise ValueError(
                f"BlockSizes needs block_kv_compute_in | block_kv_compute | block_kv, got {self.block_kv_compute_in}, "
                f"{self.block_kv_compute}, {self.block_kv}."
            )

    def fit(
        self, q_len: int, kv_len: int, head_dim: int = 128, itemsize: int = 2, vmem_bytes: int | None = None
    ) -> BlockSizes:
        """The sizes for these sequences: blocks that pad them least (``block_for``: never past the next block of
        the kernel's own granularity where a smaller block avoids it), short sequences in one block, the
        divisibility the kernel needs kept; with ``vmem_bytes``, halved until the blocks fit that VMEM."""
        block_q, block_kv = block_for(q_len, self.block_q), block_for(kv_len, self.block_kv)
        while True:
            compute = _largest_divisor(min(self.block_kv_compute, block_kv), block_kv)
            compute_in = _largest_divisor(min(self.block_kv_compute_in, compute), compute)
            sizes = BlockSizes(block_q, block_kv, compute, compute_in)
            if vmem_bytes is None or sizes.vmem_bytes(head_dim, itemsize) <= vmem_bytes or block_q + block_kv <= 512:
                return sizes
            if block_q >= block_kv:
                block_q = block_for(q_len, max(_LANES, block_q // 2))
            else:
                block_kv = block_for(kv_len, max(_LANES, block_kv // 2))

    def vmem_bytes(self, head_dim: int, itemsize: int) -> int:
        """Rough VMEM need: double-buffered q/k/v/out blocks, scratch, and one chunk of scores."""
        blocks = 2 * itemsize * head_dim * (2 * self.block_q + 2 * self.block_kv)
        scratch = 4 * self.block_q * (2 * _SUBLANES + head_dim)
        scores = 3 * 4 * self.block_kv_compute * self.block_q
        return blocks + scratch + scores
