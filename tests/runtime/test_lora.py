"""LoRA on a moved pipeline: the whole diffusers lifecycle, each step equal to stock torch doing the same."""

import numpy as np
import pytest
import safetensors.torch
import torch

from diffusers_tpu.interop import compile_accounting
from diffusers_tpu.testing import tiny
from tests.conftest import assert_np_matches, generate

STEPS = 2
TARGETS = (
    "attn1.to_q",
    "attn1.to_k",
    "attn1.to_v",
    "attn1.to_out.0",
    "attn2.to_q",
    "attn2.to_out.0",
    "ffn.net.0.proj",
    "ffn.net.2",
)


def run(pipe, **overrides):
    return generate(pipe, **dict(dict(output_type="np", num_inference_steps=STEPS), **overrides))


def diffusers_lora(variant: str, seed: int, rank: int = 4, prefix: str = "transformer.") -> dict:
    """Random adapter weights in diffusers' key format (peft names under the component prefix)."""
    generator, state = torch.Generator().manual_seed(seed), {}
    model = tiny.wan_pipeline(variant).transformer
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.split(".", 2)[-1] in TARGETS:
            state[f"{prefix}{name}.lora_A.weight"] = torch.randn(rank, module.in_features, generator=generator) * 0.3
            state[f"{prefix}{name}.lora_B.weight"] = torch.randn(module.out_features, rank, generator=generator) * 0.3
    return state


def original_wan_lora(path, seed: int, rank: int = 2) -> str:
    """An adapter in the original Wan (ComfyUI / trainer) format: lora_down/up, alpha, bias deltas (diff_b), the
    output head; written as a safetensors file."""
    generator, state = torch.Generator().manual_seed(seed), {}
    model = tiny.wan_pipeline("wan").transformer
    dim, ffn = model.config.num_attention_heads * model.config.attention_head_dim, model.config.ffn_dim

    def pair(key, out_features, in_features, alpha=None):
        state[f"diffusion_model.{key}.lora_down.weight"] = torch.randn(rank, in_features, generator=generator) * 0.3
        state[f"diffusion_model.{key}.lora_up.weight"] = torch.randn(out_features, rank, generator=generator) * 0.3
        state[f"diffusion_model.{key}.diff_b"] = torch.randn(out_features, generator=generator) * 0.1  # lora_B bias
        if alpha is not None:
            state[f"diffusion_model.{key}.alpha"] = torch.tensor(alpha)

    for block in range(model.config.num_layers):
        for name in ("q", "k", "v", "o"):
            pair(f"blocks.{block}.self_attn.{name}", dim, dim, alpha=4.0)
        pair(f"blocks.{block}.cross_attn.q", dim, dim)
        pair(f"blocks.{block}.ffn.0", ffn, dim)
        pair(f"blocks.{block}.ffn.2", dim, ffn)
    pair("head.head", model.proj_out.out_features, dim)
    safetensors.torch.save_file(state, str(path))
    return str(path)


@pytest.fixture(scope="module")
def base():
    return run(tiny.wan_pipeline("wan"))


def test_lifecycle_matches_stock(tmp_path, base):
    ref, pipe = tiny.wan_pipeline("wan"), tiny.wan_pipeline("wan")
    for p in (ref, pipe):
        p.load_lora_weights(diffusers_lora("wan", 1), adapter_name="a")  # loaded (on torch) before the move
    pipe.to("jax")
    wan_file = original_wan_lora(tmp_path / "wan_lora.safetensors", 2)

    def step(operation, expect_compiles=None, **call):
        operation(ref)
        operation(pipe)
        expected = run(ref, **call)
        with compile_accounting.compile_log() as log:
            out = run(pipe, **call)
        assert_np_matches(out, expected)
        if expect_compiles is not None:
            assert log.compilations == expect_compiles, f"{log.compilations} programs compiled"
        return expected

    with_a = step(lambda p: None)
    assert np.abs(with_a - base).max() > 1e-2  # the adapter changes the video
    step(lambda p: p.load_lora_weights(wan_file, adapter_name="b"))  # after the move, from a file
    step(lambda p: p.set_adapters(["a", "b"], adapter_weights=[0.3, 0.7]))
    step(lambda p: p.set_adapters(["a", "b"], adapter_weights=[0.5, -0.2]), expect_compiles=0)  # scales: inputs
    step(lambda p: None, attention_kwargs={"scale": 0.5})
    step(lambda p: None, expect_compiles=0, attention_kwargs={"scale": 0.8})
    assert_np_matches(step(lambda p: p.disable_lora()), base)
    step(lambda p: p.enable_lora(), expect_compiles=0)
    step(lambda p: p.fuse_lora(lora_scale=0.8))
    step(lambda p: p.unfuse_lora(), expect_compiles=0)
    step(lambda p: p.delete_adapters("a"))
    assert_np_matches(step(lambda p: p.unload_lora_weights()), base)
    pipe.to("cpu")  # back on torch: the same weights as the torch pipeline that did the same
    theirs = ref.transformer.state_dict()
    assert all(torch.equal(value, theirs[key]) for key, value in pipe.transformer.state_dict().items())


def test_peft_format_fused_move_and_saving(tmp_path):
    ref, pipe = tiny.wan_pipeline("wan"), tiny.wan_pipeline("wan")
    peft_keys = diffusers_lora("wan", 3, prefix="")  # a peft adapter: no component prefix
    for p in (ref, pipe):
        p.load_lora_weights(diffusers_lora("wan", 4), adapter_name="fused")
        p.fuse_lora(lora_scale=0.6)  # fused on torch, then moved
    pipe.to("jax")
    for p in (ref, pipe):
        p.transformer.load_lora_adapter(peft_keys, prefix=None, adapter_name="peft")
    expected = run(ref)
    assert_np_matches(run(pipe), expected)

    from peft.utils import get_peft_model_state_dict

    pipe.save_lora_weights(
        str(tmp_path), transformer_lora_layers=get_peft_model_state_dict(pipe.transformer, adapter_name="peft")
    )
    saved = safetensors.torch.load_file(str(tmp_path / "pytorch_lora_weights.safetensors"))
    assert saved and all(type(v) is torch.Tensor for v in saved.values())
    fresh = tiny.wan_pipeline("wan")
    fresh.load_lora_weights(str(tmp_path), adapter_name="peft")
    for name, module in fresh.transformer.named_modules():
        if hasattr(module, "lora_A") and "peft" in module.lora_A:
            original = ref.transformer.get_submodule(name)
            assert torch.equal(module.lora_A["peft"].weight, original.lora_A["peft"].weight)


def test_an_adapter_added_to_a_moved_denoiser_matches_stock():
    """``transformer.add_adapter(LoraConfig(...))`` after the move (diffusers' own LoRA tests do it): peft's new
    layers keep their adapters on the host, the runtime shards them before the call; the same video as stock."""
    from peft import LoraConfig

    config = LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "proj_out"], init_lora_weights=False)
    stock = tiny.wan_pipeline("wan")
    torch.manual_seed(3)
    stock.transformer.add_adapter(config)
    expected = run(stock)
    pipe = tiny.wan_pipeline("wan").to("jax")
    torch.manual_seed(3)
    pipe.transformer.add_adapter(config)
    assert_np_matches(run(pipe), expected)
    assert not np.allclose(run(tiny.wan_pipeline("wan")), expected, atol=1e-3)  # the adapter changed the video
