"""The rotary kernel in the pipelines: Wan's self-attention (``families/wan_attention.py``: installed on stock
processors only, undone by ``pipe.to("cpu")``, exact against stock, free of layout copies once compiled for TPU) and
HunyuanVideo-1.5's joint attention (diffusers' ``apply_rotary_emb`` rule)."""

import re

import numpy as np
import pytest
import torch
from diffusers.models.transformers.transformer_wan import WanAttnProcessor

from diffusers_tpu import TPUConfig
from diffusers_tpu.planner import tpu_compiler
from diffusers_tpu.runtime.attention import rotary
from diffusers_tpu.testing import tiny, tiny_hunyuan
from tests.conftest import assert_np_matches, generate


def step_for_tpu(pipe, mesh: dict, chips: str, size: dict, text_tokens: int) -> str:
    """The bfloat16 denoiser step of ``pipe`` at 64x64 compiled for ``chips`` as ``plan`` compiles it: its HLO."""
    from diffusers_tpu.planner import hlo_stats, plan

    texts = []

    def analyse(lowered):
        compiled = lowered.compile()
        texts.append(compiled.as_text())
        return hlo_stats.summary(compiled)

    config = TPUConfig(dtype=torch.bfloat16, mesh=mesh, compile_cache_dir=False)
    devices = tpu_compiler.devices(chips)
    plan.start_denoiser_memory(
        pipe, dict(size, height=64, width=64), config, devices, text_tokens, vae=False, analyse=analyse
    )()
    return texts[0]


def processors(pipe):
    return [module.processor for module in pipe.transformer.modules() if hasattr(module, "processor")]


def test_rotary_runs_through_the_kernel_and_matches_stock(monkeypatch):
    """Head dim 128 (the kernel's lanes): every block's q and k rotate in one kernel call per block, and the video is
    stock's; ``pipe.to("cpu")`` gives the stock processors back."""
    pipe = tiny.wan_pipeline("wan-d128")
    reference = generate(pipe, output_type="np")
    calls, traced = [], []
    rotary._rotate_jitted.clear_cache()  # traced afresh here, whatever ran before in this process
    seam, kernel = rotary.rotate, rotary.interleaved_rotary
    monkeypatch.setattr(rotary, "rotate", lambda *xs, **kw: calls.append(len(xs)) or seam(*xs, **kw))
    monkeypatch.setattr(rotary, "interleaved_rotary", lambda *xs, **kw: traced.append(len(xs)) or kernel(*xs, **kw))
    pipe.to("jax", config=TPUConfig(scan_blocks=False))
    ours = processors(pipe)
    assert ours and all(isinstance(p, WanAttnProcessor) and type(p) is not WanAttnProcessor for p in ours)
    assert_np_matches(generate(pipe, output_type="np"), reference)
    assert set(calls) == {2} and len(calls) == pipe.transformer.config.num_layers  # q and k together, every block
    assert traced == [2]  # the kernel (one trace: every block's call has the same shapes)
    pipe.to("cpu")
    assert all(type(p) is WanAttnProcessor for p in processors(pipe))
    np.testing.assert_array_equal(generate(pipe, output_type="np"), reference)


def test_a_users_own_processor_is_kept():
    class Mine(WanAttnProcessor):
        pass

    pipe = tiny.wan_pipeline("wan-d128")
    pipe.transformer.blocks[0].attn1.set_processor(Mine())
    pipe.to("jax")
    assert type(pipe.transformer.blocks[0].attn1.processor) is Mine
    assert type(pipe.transformer.blocks[1].attn1.processor) is not WanAttnProcessor
    pipe.to("cpu")


def test_every_restated_processor_is_the_installed_diffusers_source():
    """Fails when a diffusers in the declared range changes a ``__call__`` a subclass restates: restate it again."""
    from diffusers_tpu.families import cogvideox_attention, wan_attention
    from diffusers_tpu.runtime.attention import kernel_processors

    kinds = [*wan_attention._processors().values(), cogvideox_attention.KernelRotaryCogVideoXAttnProcessor]
    assert len(kinds) == 3
    for kind in kinds:
        assert kernel_processors.still_restated(kind), kind.__name__


def test_a_changed_stock_source_keeps_the_stock_processor(monkeypatch):
    """Another diffusers whose ``WanAttnProcessor.__call__`` differs: no swap, and the video is still stock's."""
    from diffusers_tpu.runtime.attention import kernel_processors

    pipe = tiny.wan_pipeline("wan-d128")
    reference = generate(pipe, output_type="np")
    monkeypatch.setattr(kernel_processors, "source_digest", lambda function: "a changed source")
    kernel_processors.still_restated.cache_clear()
    try:
        pipe.to("jax")
        assert all(type(p) is WanAttnProcessor for p in processors(pipe))
        assert_np_matches(generate(pipe, output_type="np"), reference)
        pipe.to("cpu")
    finally:
        kernel_processors.still_restated.cache_clear()


@pytest.mark.skipif(not tpu_compiler.available(), reason="libtpu (the TPU compiler) not installed")
def test_tpu_program_has_no_layout_copy_of_q_or_k():
    """Compiled for a v6e chip, the bfloat16 step holds no copy of a q/k-sized bfloat16 tensor (tokens x heads x
    head_dim, or half of it): diffusers' pair-layout rotary made the TPU compiler copy q and k sequence-minor, into
    pairs and back in every block. (The float32 residual stream, tokens x dim, has the same size: not counted.)"""
    pipe = tiny.wan_pipeline("wan-d128")
    texts = [step_for_tpu(pipe, {"dp": 1, "sp": 1, "tp": 1}, "v6e-1", dict(num_frames=9, guidance_scale=5.0), 200)]
    transformer = pipe.transformer.config
    tokens = 3 * (64 // 8 // 2) ** 2  # 3 latent frames of 4x4 patches
    q_size = tokens * transformer.num_attention_heads * transformer.attention_head_dim
    copies = [line for line in texts[0].splitlines() if re.search(r"= bf16\S+ copy\(", line)]
    sizes = [np.prod([int(d) for d in re.search(r"\[([0-9,]*)\]", line).group(1).split(",") if d]) for line in copies]
    assert copies and not {q_size, q_size // 2} & set(sizes), [c.strip()[:120] for c, n in zip(copies, sizes)]
    assert "diffusers_tpu_rotary" in texts[0]


def test_hunyuan15_rotary_runs_through_the_kernel_and_matches_stock(monkeypatch):
    """HunyuanVideo-1.5 with heads of 128 (its real size): q and k of every block through the kernel under the
    "lanes" rule, the video equal to stock's."""
    import diffusers

    from diffusers_tpu.kernels import rotary as kernel
    from tests.families.test_hunyuan15 import CALL

    pipe = tiny.hunyuan15_pipeline()
    torch.manual_seed(0)
    config = dict(
        tiny_hunyuan.HUNYUAN15_TRANSFORMER, num_attention_heads=2, attention_head_dim=128, rope_axes_dim=(32, 48, 48)
    )
    pipe.transformer = diffusers.HunyuanVideo15Transformer3DModel(**config).eval()
    call = dict(CALL, num_inference_steps=2)
    reference = pipe(**call, generator=torch.Generator().manual_seed(0), output_type="np").frames
    rules, pallas = [], kernel._pallas_rotary
    rotary._rotate_jitted.clear_cache()  # traced afresh here, whatever ran before in this process
    monkeypatch.setattr(kernel, "_pallas_rotary", lambda *a, **kw: rules.append(kw["tables"]) or pallas(*a, **kw))
    pipe.to("jax")
    assert_np_matches(pipe(**call, generator=torch.Generator().manual_seed(0), output_type="np").frames, reference)
    assert rules and set(rules) == {"lanes"}
    pipe.to("cpu")


def test_cogvideox_rotary_runs_through_the_kernel_and_matches_stock(monkeypatch):
    """CogVideoX with heads of 64 (its real size, two to a lane tile): every block's q and k rotate in one kernel
    call over the joint sequence (the text tokens' rows the identity), the video equal to stock's; ``pipe.to("cpu")``
    gives the stock processors back."""
    from diffusers.models.attention_processor import CogVideoXAttnProcessor2_0

    from diffusers_tpu.kernels import rotary as kernel
    from tests.families.test_parity import cogvideox

    pipe, call = cogvideox("cogvideox-d64", "ddim")()
    reference = generate(pipe, output_type="np", **call)
    calls, shapes, pallas = [], [], kernel._pallas_rotary
    rotary._rotate_jitted.clear_cache()  # traced afresh here, whatever ran before in this process
    seam = rotary.rotate
    monkeypatch.setattr(rotary, "rotate", lambda *xs, **kw: calls.append(kw["tables"]) or seam(*xs, **kw))
    monkeypatch.setattr(
        kernel, "_pallas_rotary", lambda flat, *a, **kw: shapes.append(flat[0].shape) or pallas(flat, *a, **kw)
    )
    pipe.to("jax", config=TPUConfig(scan_blocks=False))
    assert all(type(p) is not CogVideoXAttnProcessor2_0 for p in processors(pipe))
    assert_np_matches(generate(pipe, output_type="np", **call), reference)
    assert calls == ["lanes"] * pipe.transformer.config.num_layers
    config = pipe.transformer.config
    assert shapes and all(s[-1] == config.num_attention_heads * config.attention_head_dim for s in shapes)
    pipe.to("cpu")
    assert all(type(p) is CogVideoXAttnProcessor2_0 for p in processors(pipe))
    np.testing.assert_array_equal(generate(pipe, output_type="np", **call), reference)


@pytest.mark.skipif(not tpu_compiler.available(), reason="libtpu (the TPU compiler) not installed")
def test_cogvideox_rotary_tables_stay_whole_on_the_mesh():
    """Compiled for a v6e-4 slice (dp2·tp2): CogVideoX's rotary tables, transformer arguments of the video tokens'
    length, arrive whole (the batch rule splits only arguments whose leading dimension is the call's batch) and no
    block gathers them; the rotary kernel runs in the step."""
    from tests.families.test_parity import cogvideox

    pipe, call = cogvideox("cogvideox-d64", "ddim")()
    texts = [step_for_tpu(pipe, {"dp": 2, "sp": 1, "tp": 2}, "v6e-4", dict(num_frames=17, guidance_scale=6.0), 32)]
    transformer = pipe.transformer.config
    tokens = 5 * (64 // 8 // transformer.patch_size) ** 2  # 5 latent frames of 4x4 patches
    head_dim = transformer.attention_head_dim
    entry = texts[0].split("ENTRY")[1].split("\n}")[0]
    tables = [line for line in entry.splitlines() if f"f32[{tokens},{head_dim}]" in line and "parameter(" in line]
    assert len(tables) == 2 and all("sharding={replicated}" in line for line in tables), tables
    assert not re.search(rf"all-gather[^\n]*f32\[{tokens // 2},{head_dim}\]", texts[0])
    assert "diffusers_tpu_rotary" in texts[0]
