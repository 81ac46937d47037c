"""The work an attention kernel issues on a TPU, per unit, read from Mosaic's own passes (``llo``): the project's exp2
kernel beside JAX's splash kernel, compiled deviceless for a chip at a real call's shapes.

Mosaic writes its passes only when libtpu starts with ``--xla_mosaic_dump_to``, a flag read once per process, so the
compiles run in a child process (``python -m diffusers_tpu.planner.kernel_work``) that starts libtpu with it; the
parent parses the dumps. Figures are per 128 x 128 tile of the call's (unpadded) scores, so kernels with different
block sizes compare per unit of useful work: padding a kernel computes is counted against it.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from ..kernels import BlockSizes, flash_attention, vmem_capacity
from ..kernels.blocks import round_up
from ..kernels.flash import chunk_visibility
from . import llo, tpu_compiler

KERNELS = ("exp2", "splash", "splash-defaults")
_TILE = 128 * 128


@dataclasses.dataclass(frozen=True)
class AttentionCall:
    """One device's attention call: q ``[batch, heads, q_len, head_dim]``, k/v over ``kv_len`` keys; ``masked``: a
    per-row key mask (padded text)."""

    batch: int
    heads: int
    q_len: int
    kv_len: int
    head_dim: int
    masked: bool = False
    visible_keys: int | None = None  # masked calls: keys 0..visible_keys-1 visible (a prompt shorter than its padding)

    @property
    def tiles(self) -> float:
        return self.batch * self.heads * self.q_len * self.kv_len / _TILE


@dataclasses.dataclass
class KernelWork:
    """One kernel's counts for one call: per unit, per 128 x 128 score tile; or the compiler's refusal."""

    kernel: str
    call: AttentionCall
    chip: str
    blocks: tuple[int, ...] = ()
    grid: tuple[int, ...] = ()
    per_tile: dict = dataclasses.field(default_factory=dict)
    ops_per_tile: dict = dataclasses.field(default_factory=dict)
    assumed_taken: int = 0
    refused: str | None = None

    def as_dict(self) -> dict:
        return {**dataclasses.asdict(self), "call": dataclasses.asdict(self.call)}


# Per-device attention calls of the real models on their default 8-chip meshes (dp2·sp1·tp4): self-attention with
# heads over tp, cross-attention with the query sequence over sp·tp; CogVideoX and HunyuanVideo attend jointly over
# text + video tokens.
REAL_CALLS = {
    "wan2.1-1.3b-480p-self": AttentionCall(1, 12 // 4, 21 * 30 * 52, 21 * 30 * 52, 128),
    # cross-attention over umT5's 512 padded text tokens, a 100-token prompt
    "wan2.1-1.3b-480p-cross": AttentionCall(1, 12, 21 * 30 * 52 // 4, 512, 128, masked=True, visible_keys=100),
    "wan2.1-14b-720p-self": AttentionCall(1, 40 // 4, 21 * 45 * 80, 21 * 45 * 80, 128),
    "wan2.1-14b-720p-cross": AttentionCall(1, 40, 21 * 45 * 80 // 4, 512, 128, masked=True, visible_keys=100),
    # 1360x768, 81 frames: 11 latent frame pairs x 48 x 85 patches + 226 text tokens
    "cogvideox1.5-5b-joint": AttentionCall(1, 48 // 4, 11 * 48 * 85 + 226, 11 * 48 * 85 + 226, 64),
    # 480x848, 121 frames: 31 x 30 x 53 latents + 1000 MLLM + 256 ByT5 tokens (padding masked; 100 text tokens seen)
    "hunyuanvideo-1.5-480p-joint": AttentionCall(
        1, 16 // 4, 31 * 30 * 53 + 1256, 31 * 30 * 53 + 1256, 128, masked=True, visible_keys=31 * 30 * 53 + 100
    ),
}


def exp2_blocks(call: AttentionCall, chip: str) -> tuple[int, int, int, int]:
    """The exp2 kernel's block sizes for a call, as ``flash_attention`` fits them to the chip's VMEM."""
    sizes = BlockSizes().fit(call.q_len, call.kv_len, call.head_dim, 2, _vmem(chip))
    return sizes.block_q, sizes.block_kv, sizes.block_kv_compute, sizes.block_kv_compute_in


def _vmem(chip: str) -> int:
    return vmem_capacity(tpu_compiler.devices(chip))


def count(specs: list[tuple[str, AttentionCall, str]], timeout: float = 900) -> list[KernelWork]:
    """Compile each (kernel, call, chip) for the TPU in one child process and count its LLO per score tile."""
    tpu_compiler.require("counting a kernel's LLO operations")
    for kernel, _, chip in specs:
        if kernel not in KERNELS:
            raise ValueError(f"Unknown kernel {kernel!r}; choose one of {', '.join(KERNELS)}.")
        tpu_compiler.chip_of(chip)
    with tempfile.TemporaryDirectory(prefix="diffusers-tpu-llo-") as dump:
        request = [{"kernel": k, "call": dataclasses.asdict(c), "chip": chip} for k, c, chip in specs]
        env = {
            **os.environ,
            "LIBTPU_INIT_ARGS": f"{os.environ.get('LIBTPU_INIT_ARGS', '')} --xla_mosaic_dump_to={dump}",
        }
        env.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        done = subprocess.run(
            [sys.executable, "-m", __name__, dump],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )
        if done.returncode:
            raise RuntimeError(f"The kernel compiles failed:\n{done.stderr[-3000:]}")
        answers = json.loads(done.stdout.strip().splitlines()[-1])
        return [_read(dump, spec, answer) for spec, answer in zip(specs, answers)]


def _read(dump: str, spec, answer: dict) -> KernelWork:
    kernel, call, chip = spec
    result = KernelWork(kernel, call, chip, blocks=tuple(answer.get("blocks", ())), refused=answer.get("refused"))
    if result.refused:
        return result
    found = []
    for path in answer["files"]:
        with open(os.path.join(dump, path)) as handle:
            found += llo.parse(handle.read())
    if len(found) != 1:
        raise RuntimeError(f"{kernel} at {call}: expected one kernel in Mosaic's dump, found {len(found)}.")
    work = llo.work(found[0], _tables(kernel, call, result.blocks))
    result.grid, result.assumed_taken = work.grid, work.assumed_taken
    scale = call.tiles
    result.per_tile = {unit: round(n / scale, 2) for unit, n in work.by_unit().items()}
    result.ops_per_tile = {
        op: round(n / scale, 2) for op, n in sorted(work.ops.items(), key=lambda item: -item[1]) if llo.unit_of(op)
    }
    return result


_dump: list[str] = []  # the directory libtpu writes Mosaic's passes into, once ``start_dump`` asked in time


def start_dump() -> str | None:
    """Ask libtpu, not yet started in this process, to write Mosaic's passes of every kernel it compiles into a fresh
    temporary directory (returned); None where libtpu may already have started (it reads the flag only then)."""
    if _dump or tpu_compiler.started() or "xla_mosaic_dump_to" in os.environ.get("LIBTPU_INIT_ARGS", ""):
        return None
    directory = tempfile.mkdtemp(prefix="diffusers-tpu-llo-")
    os.environ["LIBTPU_INIT_ARGS"] = (
        f"{os.environ.get('LIBTPU_INIT_ARGS', '')} --xla_mosaic_dump_to={directory}".strip()
    )
    _dump.append(directory)
    return directory


def counting() -> bool:
    """Whether this process's TPU compiles write Mosaic's passes (``start_dump`` asked before libtpu started)."""
    return bool(_dump)


def _written_while(directory: str, action) -> tuple:
    """(what ``action()`` returns, the ``post-finalize-llo`` dumps libtpu wrote into ``directory`` meanwhile)."""
    pattern = os.path.join(directory, "*post-finalize-llo.txt")
    before = set(glob.glob(pattern))
    result = action()
    return result, sorted(set(glob.glob(pattern)) - before)


def counted(analyse, lowered) -> dict:
    """``analyse(lowered)`` (a compile and its report) with ``kernels``: each Pallas kernel the compile issued, its
    LLO work per unit for one call and per grid step. Needs ``counting()``."""
    (directory,) = _dump
    report, written = _written_while(directory, lambda: analyse(lowered))
    kernels = []
    for path in written:
        with open(path) as handle:
            kernels += [_summary(llo.work(kernel)) for kernel in llo.parse(handle.read())]
    for path in glob.glob(os.path.join(directory, "*")):  # every pass's dump of these kernels: read, not kept
        os.remove(path)
    return dict(report, kernels=kernels)


def _summary(work: llo.Work) -> dict:
    units = work.by_unit()
    return {
        "name": work.name,
        "grid": list(work.grid),
        "per_call": units,
        "per_grid_step": {unit: round(n / work.steps, 1) for unit, n in units.items()},
        "assumed_taken": work.assumed_taken,
    }


def _tables(kernel: str, call: AttentionCall, blocks) -> dict | None:
    """The exp2 kernel's per-chunk key visibility (its scalar-prefetch table) for a masked call's visible keys."""
    if kernel != "exp2" or not call.masked:
        return None
    block_kv, compute = blocks[1], blocks[2]
    padded = round_up(call.kv_len, block_kv)
    visible = call.kv_len if call.visible_keys is None else call.visible_keys
    mask = (np.arange(padded) < visible).astype(np.int32)[None].repeat(call.batch, 0)
    return {0: np.asarray(chunk_visibility(jnp.asarray(mask), compute)).tolist()}


def _kernel_function(kernel: str, call: AttentionCall, chip: str):
    """(function of q, k, v[, mask], block sizes) compiling the named kernel for this call."""
    if kernel == "exp2":
        sizes = BlockSizes(*exp2_blocks(call, chip))
        vmem = _vmem(chip)

        def exp2(q, k, v, mask=None):
            return flash_attention(q, k, v, kv_mask=mask, block_sizes=sizes, vmem_bytes=vmem)

        return exp2, dataclasses.astuple(sizes)
    if kernel == "splash":  # the exp2 kernel's blocks, where splash accepts them
        block_q, block_kv, compute, _ = exp2_blocks(call, chip)
        sizes = splash.BlockSizes(block_q=block_q, block_kv=block_kv, block_kv_compute=compute)
    else:
        sizes = splash.BlockSizes.get_default()
    q_len, kv_len = round_up(call.q_len, sizes.block_q), round_up(call.kv_len, sizes.block_kv)
    mask = masks.MultiHeadMask([masks.FullMask((q_len, kv_len))] * call.heads)
    mha = splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1)

    def function(q, k, v, *_):  # JAX's MHA kernel as its users call it: [H, S, D] per example, no mask
        pad = lambda x, n: jnp.pad(x, ((0, 0), (0, 0), (0, n - x.shape[2]), (0, 0)))  # noqa: E731
        return jax.vmap(mha)(pad(q, q_len), pad(k, kv_len), pad(v, kv_len))

    return function, (sizes.block_q, sizes.block_kv, sizes.block_kv_compute)


def _worker(dump: str) -> None:
    """Child process: compile each requested kernel for its chip, answer with the dump files each compile wrote."""
    answers = []
    for spec in json.loads(sys.stdin.read()):
        call = AttentionCall(**spec["call"])
        function, blocks = _kernel_function(spec["kernel"], call, spec["chip"])
        devices = tpu_compiler.devices(spec["chip"])
        sharding = NamedSharding(Mesh(devices[:1], ("one",)), P())
        q = jax.ShapeDtypeStruct((call.batch, call.heads, call.q_len, call.head_dim), jnp.bfloat16, sharding=sharding)
        kv = jax.ShapeDtypeStruct((call.batch, call.heads, call.kv_len, call.head_dim), jnp.bfloat16, sharding=sharding)
        args = [q, kv, kv] + (
            [jax.ShapeDtypeStruct((call.batch, call.kv_len), jnp.bool_, sharding=sharding)] * call.masked
        )
        try:
            _, files = _written_while(dump, lambda: jax.jit(function).lower(*args).compile())
        except Exception as error:  # noqa: BLE001 (a refused configuration is that row's verdict)
            reason = tpu_compiler.refusal(error) or f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
            answers.append({"refused": reason[:300], "blocks": blocks})
            continue
        answers.append({"files": [os.path.basename(f) for f in files], "blocks": blocks})
    print(json.dumps(answers))


if __name__ == "__main__":
    _worker(sys.argv[1])
