"""Stock diffusers.CogVideoXPipeline (1.0 and 1.5) on JAX: frame counts, dtypes, the subclass (parity: test_parity)."""

import diffusers
import pytest

import diffusers_tpu
from diffusers_tpu.interop import jit
from diffusers_tpu.testing import tiny
from tests.conftest import assert_np_matches, generate

CALL = dict(max_sequence_length=32, num_frames=17)  # 5 latent frames: the VAE decodes 3 chunks


def test_even_latent_frame_counts_are_refused_before_anything_compiles():
    pipe = tiny.cogvideox_pipeline("cogvideox1.5").to("jax")
    with jit.compile_log() as log, pytest.raises(ValueError) as error:
        generate(pipe, output_type="np", max_sequence_length=32, num_frames=13)
    message = str(error.value)
    assert "num_frames=13 gives 4 latent frames" in message and "16 frames" in message and "Use 9 or 17" in message
    assert log.compilations == 0
    latents = generate(pipe, output_type="latent", max_sequence_length=32, num_frames=13)  # no decode: allowed
    assert latents.shape[1] == 4


def test_a_bfloat16_denoiser_in_a_float32_pipeline_is_refused_before_anything_compiles():
    """Stock CogVideoX feeds the text encoder's dtype to the denoiser uncast: TPUConfig(dtype=bf16) on a float32
    pipeline is named, not a conv dtype error inside the first step; casting the pipeline works."""
    import torch

    from diffusers_tpu import TPUConfig

    pipe = tiny.cogvideox_pipeline("cogvideox-5b").to("jax", config=TPUConfig(dtype=torch.bfloat16))
    with jit.compile_log() as log, pytest.raises(ValueError, match="pipe.to\\(torch.bfloat16\\) before the move"):
        generate(pipe, output_type="latent", max_sequence_length=32, num_frames=9)
    assert log.compilations == 0
    pipe.to("cpu").to(torch.bfloat16).to("jax")
    latents = generate(pipe, output_type="latent", max_sequence_length=32, num_frames=9)
    assert latents.dtype == torch.bfloat16 and torch.isfinite(latents.float()).all()


def test_other_frame_counts_behave_like_stock(caplog):
    pipe = tiny.cogvideox_pipeline("cogvideox-5b", scheduler="ddim")
    stock = generate(pipe, output_type="np", max_sequence_length=32, num_frames=10)  # stock: 9 frames
    pipe.to("jax")
    out = generate(pipe, output_type="np", max_sequence_length=32, num_frames=10)
    assert out.shape == stock.shape and out.shape[1] == 9
    assert_np_matches(out, stock)


def test_subclass_and_weights_layout(tmp_path):
    pipe = tiny.cogvideox_pipeline("cogvideox1.5")
    pipe.save_pretrained(str(tmp_path), safe_serialization=True)
    loaded = diffusers_tpu.CogVideoXPipeline.from_pretrained(str(tmp_path))
    assert type(loaded) is diffusers_tpu.CogVideoXPipeline and isinstance(loaded, diffusers.CogVideoXPipeline)
    reference = generate(loaded, output_type="np", **CALL)
    loaded.to("jax")
    weight = loaded.transformer.transformer_blocks[0].attn1.to_q.weight
    assert diffusers_tpu.sharding_of(weight) is not None
    assert_np_matches(generate(loaded, output_type="np", **CALL), reference)
