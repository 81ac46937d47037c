"""Stock diffusers.CogVideoXPipeline (1.0 and 1.5) on JAX: frame counts, dtypes, the subclass (parity: test_parity)."""

import diffusers
import pytest

import diffusers_tpu
from diffusers_tpu.interop import compile_accounting
from diffusers_tpu.testing import tiny
from tests.conftest import assert_np_matches, generate

CALL = dict(max_sequence_length=32, num_frames=17)  # 5 latent frames: the VAE decodes 3 chunks


@pytest.mark.parametrize("num_frames, decoded", [(8, 8), (13, 16), (12, 9)])
def test_every_frame_count_stock_runs_runs_with_stocks_frames(caplog, num_frames, decoded):
    """Stock decodes n latent frames into 4n (n even) or 4n - 3 (n odd) frames, whatever was asked: the same frames
    here (diffusers' own tests run num_frames=8), and the log names the counts that come out as asked."""
    stock = tiny.cogvideox_pipeline("cogvideox1.5")
    call = dict(output_type="np", max_sequence_length=32, num_frames=num_frames, num_inference_steps=2)
    reference = generate(stock, **call)
    assert reference.shape[1] == decoded
    pipe = stock.to("jax")
    with caplog.at_level("WARNING", logger="diffusers_tpu.families.cogvideox"):
        assert_np_matches(generate(pipe, **call), reference)
    said = f"num_frames={num_frames}: CogVideoX (stock and here alike) returns {decoded} frames"
    assert (said in caplog.text) == (decoded != num_frames)


def test_a_bfloat16_denoiser_in_a_float32_pipeline_is_refused_before_anything_compiles():
    """Stock CogVideoX feeds the text encoder's dtype to the denoiser uncast: TPUConfig(dtype=bf16) on a float32
    pipeline is named, not a conv dtype error inside the first step; casting the pipeline works."""
    import torch

    from diffusers_tpu import TPUConfig

    pipe = tiny.cogvideox_pipeline("cogvideox-5b").to("jax", config=TPUConfig(dtype=torch.bfloat16))
    with (
        compile_accounting.compile_log() as log,
        pytest.raises(ValueError, match="pipe.to\\(torch.bfloat16\\) before the move"),
    ):
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
