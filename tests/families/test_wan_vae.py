"""Wan VAE in compiled temporal chunks: identical to the unchunked decode/encode, two programs per resolution for
any frame count, memory independent of the frame count; VAE and scheduler dtypes."""

import functools
import re

import numpy as np
import pytest
import torch

from diffusers_tpu import TPUConfig
from diffusers_tpu.families import wan_vae
from diffusers_tpu.interop import backend, jit, program_figures, sharding
from diffusers_tpu.runtime.attach import pipeline_runtime
from diffusers_tpu.testing import tiny
from tests.conftest import assert_np_matches, generate


def latents(frames, seed=0, width=6):
    return torch.randn(1, 16, frames, 4, width, generator=torch.Generator().manual_seed(seed))


def pixels(frames, seed=1):
    return torch.rand(1, 3, frames, 32, 48, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def unchunked(pipe, method):
    """The stock ``_decode`` / ``_encode`` (frame loop in Python) compiled whole, on the same placed weights."""
    attached = pipeline_runtime.runtime_of(pipe)
    vae = pipe.vae
    return jit.CompiledFunction(
        vae,
        functools.partial(getattr(type(vae), method), vae),
        state=lambda: {s.qualified: sharding.tensor_of(s).jax() for s in vae._diffusers_tpu_placement},
        jax_context=attached.jax_context,
        place_input=attached.place_vae_input,
    )


def host(value):
    return backend.jax_to_host(backend.to_jax_array(value))


_references = {}


def reference_of(pipe, method, frames, compute):
    """The unchunked result for ``frames``, compiled once for all chunk sizes (every ``chunked_pipe`` is the same
    seeded tiny pipeline: a difference in weights would show as a mismatch)."""
    if (method, frames) not in _references:
        _references[method, frames] = host(compute(unchunked(pipe, method)))
    return _references[method, frames]


@pytest.fixture(scope="module", params=[1, 2, 4], ids=lambda c: f"chunk{c}")
def chunked_pipe(request):
    return tiny.wan_pipeline("wan").to(
        "jax", config=TPUConfig(vae_decode_chunk=request.param, vae_encode_chunk=request.param)
    )


@functools.cache
def float64_decode(frames):
    """Stock's decode of ``latents(frames)`` in float64 (the same seeded tiny VAE), and how far stock's own float32
    decode is from it: this network's float32 rounding. The chunked and unchunked programs order the same sums
    differently (a chunk's convolutions, the whole video's): each is within about that of the float64 decode, so they
    differ by up to twice it (9 latent frames on an AVX2 host: stock 1.11e-5 off, chunked 1.25e-5 off, the two
    programs 1.14e-5 apart); a chunking fault (a wrong frame cache) is ~0.1."""
    z = latents(frames, seed=frames)
    vae = tiny.wan_pipeline("wan").vae.eval()
    with torch.no_grad():
        single = vae.decode(z, return_dict=False)[0].double()
        exact = vae.double().decode(z.double(), return_dict=False)[0]
    return exact, (single - exact).abs().max().item()


@pytest.mark.parametrize("frames", [1, 2, 6, 9])
def test_chunked_decode_equals_unchunked(chunked_pipe, frames):
    """Equal to the unchunked program up to float32 rounding (each within twice stock's own float32 error)."""
    z = latents(frames, seed=frames)
    reference = reference_of(chunked_pipe, "_decode", frames, lambda decode: decode(z, return_dict=False)[0])
    out = host(chunked_pipe.vae.decode(z, return_dict=False)[0])
    assert out.shape == reference.shape == (1, 3, 1 + 4 * (frames - 1), 32, 48)
    exact, rounding = float64_decode(frames)
    assert (out - reference).abs().max().item() <= 2 * rounding
    assert (out.double() - exact).abs().max().item() <= 2 * rounding


@pytest.mark.parametrize("frames", [1, 5, 13, 23])  # 23: stock ignores frames past 1 + 4k
def test_chunked_encode_equals_unchunked(chunked_pipe, frames):
    x = pixels(frames)
    reference = reference_of(chunked_pipe, "_encode", frames, lambda encode: encode(x))
    with backend.jax_mode():
        out = host(chunked_pipe.vae.encode(x).latent_dist.mean)
    assert out.shape[2] == 1 + (frames - 1) // 4 and reference.shape[1] == 2 * out.shape[1]
    assert (out - reference[:, :16]).abs().max().item() <= 1e-5


def test_two_programs_for_any_frame_count_and_memory_independent_of_it():
    pipe = tiny.wan_pipeline("wan").to("jax", config=TPUConfig(vae_decode_chunk=2))
    programs = pipe.vae._diffusers_tpu_programs
    whole_temp, seen = {}, {}
    for frames in (3, 5, 9):  # 9, 17 and 33 video frames
        z = latents(frames)
        pipe.vae.decode(z)
        executables = {
            name: [p.executable for p in programs[name].programs.values()] for name in ("decode_first", "decode_chunk")
        }
        # the same two executables serve every frame count: their memory cannot depend on it
        assert all(len(built) == 1 for built in executables.values()), (frames, executables)
        assert seen.setdefault("executables", executables) == executables, frames
        whole_temp[frames] = program_figures.memory_analysis(unchunked(pipe, "_decode"), z, return_dict=False)[
            "temp_bytes"
        ]
    with backend.jax_mode():
        _, cache = programs["decode_first"](latents(wan_vae.FIRST_FRAMES))
        chunk = program_figures.memory_analysis(programs["decode_chunk"], latents(2), cache)
    assert 0 < chunk["temp_bytes"] < whole_temp[3]
    assert whole_temp[3] < whole_temp[5] < whole_temp[9]  # the whole-video program's memory grows with frames


def test_vae_dtypes():
    pipe = tiny.wan_pipeline("wan")
    z = latents(3)
    with torch.no_grad():
        reference = pipe.vae.decode(z).sample.numpy()
    pipe.to("jax", config=TPUConfig(vae_weights_dtype=torch.bfloat16, vae_dtype=torch.bfloat16))
    assert pipe.vae.decoder.conv_in.weight.dtype == torch.bfloat16
    assert pipe.transformer.blocks[0].attn1.to_q.weight.dtype == torch.float32  # only the VAE
    out = host(pipe.vae.decode(z.to(torch.bfloat16)).sample)
    assert out.dtype == torch.bfloat16
    error = np.mean((out.float().numpy() - reference) ** 2)
    psnr = 10 * np.log10(4.0 / error)  # outputs span [-1, 1]
    assert 25 < psnr < 80, psnr  # bf16: close to the fp32 decode, but not identical


def test_scheduler_dtype_keeps_latents_in_it():
    pipe = tiny.wan_pipeline("wan")
    reference = generate(pipe, output_type="np")
    seen = []

    def record(pipe_, step, timestep, tensors):
        seen.append(tensors["latents"].dtype)
        return {}

    pipe.to("jax", config=TPUConfig(scheduler_dtype=torch.bfloat16))
    out = generate(pipe, output_type="np", callback_on_step_end=record)
    assert seen and set(seen) == {torch.bfloat16}
    assert np.isfinite(out).all() and np.abs(out - reference).max() < 0.5
    pipe.to("jax", config=TPUConfig())  # default: the pipeline's own float32 latents, stock numerics
    assert_np_matches(generate(pipe, output_type="np"), reference)


@pytest.mark.parametrize(
    "kwargs",
    [dict(vae_decode_chunk=0), dict(vae_encode_chunk=1.5), dict(vae_dtype=torch.int32), dict(scheduler_dtype="bf16")],
)
def test_vae_knobs_reject_nonsense(kwargs):
    with pytest.raises(ValueError):
        TPUConfig(**kwargs)


@pytest.mark.parametrize("precision", ["highest", "default"])
def test_matmul_precision_reaches_compiled_programs(precision):
    """TPUConfig.matmul_precision is traced into every product of the runtime's programs: TPUs and GPUs would
    otherwise run float32 convolutions and matmuls in bfloat16 passes / TF32 and leave stock's results."""
    pipe = tiny.wan_pipeline("wan").to("jax", config=TPUConfig(matmul_precision=precision))
    try:
        pipe.vae.decode(latents(2))
        text = program_figures.lower(pipe.vae._diffusers_tpu_programs["decode_first"], latents(1)).as_text()
    finally:
        pipe.to("cpu")
    products = [
        line for line in text.splitlines() if "stablehlo.convolution" in line or "stablehlo.dot_general" in line
    ]
    assert products
    # dot_general prints "precision = [HIGHEST, HIGHEST]", convolution "#stablehlo<precision HIGHEST>" twice
    found = [re.findall(r"\b(DEFAULT|HIGHEST|HIGH)\b", line) for line in products]
    wrong = [line for line, names in zip(products, found) if names != [precision.upper()] * 2]
    assert not wrong, wrong[:2]


def test_matmul_precision_is_checked():
    with pytest.raises(ValueError, match="matmul_precision"):
        TPUConfig(matmul_precision="tf32")
