"""Every family's pipelines on JAX against the same stock pipeline on torch CPU, one device: one table, one check.

Each row builds a tiny offline pipeline (2+ layers, a CFG pair of prompts of different padded lengths) and says
where it must land; the check is the same for all: "np" within 1e-4 and "pil" within one level of stock, the class
listed as verified and no "not compared" warning, zero compilations in a warm call, and after ``pipe.to("cpu")`` the
stock pipeline back (weights equal to a fresh build's, no compiled method left, scheduler tables restored). What
only one family has is the row's ``check``. The 8-device mesh: tests/runtime/test_mesh.py, test_mesh_families.py
and the parity sweep."""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable

import diffusers
import numpy as np
import pytest
import torch

import diffusers_tpu
from diffusers_tpu.interop import compile_accounting
from diffusers_tpu.testing import tiny, tiny_families, tiny_generic, tiny_images, tiny_parts, tiny_unet
from tests.conftest import assert_np_matches, assert_pil_matches, compiled_method, stock_pil


@dataclasses.dataclass
class Run:
    """What a row's ``check`` sees, on JAX: the moved pipeline, the stock one, the call, both outputs, the log."""

    pipe: object
    stock: object
    call: dict
    expected: object
    moved: object
    log: str


@dataclasses.dataclass(frozen=True)
class Case:
    build: Callable[[], tuple]  # -> (a fresh stock pipeline, its call arguments)
    family: str  # the family the runtime picks
    to: str = "jax"  # the device string: "tpu" rehearses on the CPU, the path is the same
    config: dict = dataclasses.field(default_factory=dict)  # TPUConfig fields
    batched_steps: int | None | type(...) = ...  # guided steps run as one CFG batch (None: the pipeline does it)
    check: Callable[[Run], None] | None = None
    rerun_on_cpu: bool = False  # also call the restored pipeline: exactly stock's output again


def wan(variant, scheduler):
    return lambda: (tiny.wan_pipeline(variant, scheduler=scheduler), dict(tiny.WAN_CALL))


def cogvideox(variant, scheduler):
    # 17 frames: 5 latent frames, the VAE decodes 3 chunks
    return lambda: (
        tiny.cogvideox_pipeline(variant, scheduler=scheduler),
        dict(tiny.WAN_CALL, max_sequence_length=32, num_frames=17),
    )


def with_call(make, **call):
    return lambda: (make(), dict(tiny.WAN_CALL, num_frames=9, **call))


def named(module, name):
    return lambda: module.pipeline(name)


def generic(name):
    def build():
        pipe = tiny_generic.generic_pipeline(name)
        return pipe, tiny_generic.generic_call(pipe)

    return build


HUNYUAN15_CALL = dict(  # the negative prompt has no quoted text: all its ByT5 tokens are padding
    prompt='a cat holding a sign saying "hello" in the rain',
    negative_prompt="blurry",
    height=32,
    width=48,
    num_frames=9,
    num_inference_steps=3,
)


def on_jax_device(run):
    assert run.pipe.device == torch.device("jax", 0)


def cogvideox_vae_programs(run):  # the conv cache: first chunk, later chunks, whatever the frame count
    assert len(compiled_method(run.pipe, run.pipe.vae.decoder).programs) == 2


def one_hunyuan15_program(run):  # cond and uncond (different padded lengths) share one program
    assert np.isfinite(run.moved.frames).all() and len(compiled_method(run.pipe, run.pipe.transformer).programs) == 1


def ltx2_soundtrack(run):  # the soundtrack too, as a host tensor
    assert type(run.moved.audio) is torch.Tensor and run.moved.audio.device.type == "cpu"
    assert run.expected.audio.abs().max() > 1e-3
    assert torch.allclose(run.moved.audio, run.expected.audio, atol=1e-4, rtol=0)


def wan22_postprocess_on_device(run):
    assert run.pipe._diffusers_tpu_runtime.config.postprocess_on_device
    assert "postprocess_video" in vars(run.pipe.video_processor)


def wan22_both_experts(run):
    wan22_postprocess_on_device(run)
    for expert in (run.pipe.transformer, run.pipe.transformer_2):
        assert diffusers_tpu.sharding_of(expert.blocks[0].attn1.to_q.weight) is not None
        assert "forward" in vars(expert)


def wan_i2v_image_encoder(run):
    wan22_postprocess_on_device(run)
    assert diffusers_tpu.sharding_of(run.pipe.image_encoder.get_input_embeddings().weight) is not None


def mochi_eager_attention(run):  # its attention compacts text tokens with torch.nonzero: that module runs eagerly
    assert "transformer_blocks.0.attn1 cannot be traced" in run.log


def easyanimate_carried_frames(run):  # its VAE decoder keeps frames on its causal convolutions: carried
    assert run.expected.frames.shape[1] == 5
    assert {name for _, name in run.pipe.vae.decoder.forward.carried} == {"prev_features"}


def sd_safety_checker(run):  # reads its scores with numpy: runs eagerly, with stock's verdicts
    assert "StableDiffusionSafetyChecker.forward cannot be traced" in run.log
    verdicts = run.expected.nsfw_content_detected
    assert run.moved.nsfw_content_detected == verdicts and len(verdicts) == 2


def unet_only(run):
    assert list(run.pipe._diffusers_tpu_runtime.denoisers) == ["unet"]


PAIRED = dict(batch_cfg=True)  # the CFG pair as one batch on one device too
UNET_CHECKS = {"sd": lambda run: (unet_only(run), sd_safety_checker(run))}
PARITY = {
    # Wan 2.1 text-to-video: each variant, scheduler and device string meets each other one once
    "wan-flow_match-jax": Case(wan("wan", "flow_match"), "wan", check=on_jax_device, rerun_on_cpu=True),
    "wan-unipc-tpu": Case(wan("wan", "unipc"), "wan", to="tpu", check=on_jax_device, rerun_on_cpu=True),
    "wan-4head-flow_match-tpu": Case(wan("wan-4head", "flow_match"), "wan", to="tpu", rerun_on_cpu=True),
    "wan-4head-unipc-jax": Case(wan("wan-4head", "unipc"), "wan", rerun_on_cpu=True),
    "wan-d128-unipc-jax": Case(wan("wan-d128", "unipc"), "wan"),
    # Wan 2.2 and image-to-video
    "wan2.2-a14b": Case(with_call(tiny.wan22_a14b_pipeline), "wan", check=wan22_both_experts),
    "wan2.2-ti2v": Case(with_call(tiny.wan22_ti2v_pipeline), "wan", check=wan22_postprocess_on_device),
    "wan2.1-i2v": Case(
        with_call(tiny.wan_i2v_pipeline, image=tiny_parts.test_image()), "wan", check=wan_i2v_image_encoder
    ),
    # first-last-frame: two images' tokens a sample, which the CFG batch must double whole (it refused to concatenate)
    "wan2.1-flf": Case(
        with_call(
            lambda: tiny.wan_i2v_pipeline(first_last=True),
            image=tiny_parts.test_image(),
            last_image=tiny_parts.test_image(seed=1),
        ),
        "wan",
        config=PAIRED,
        batched_steps=3,
    ),
    # Wan's wider family
    "wan-v2v": Case(named(tiny_families, "wan-v2v"), "wan", config=PAIRED, batched_steps=2),
    "wan-vace": Case(named(tiny_families, "wan-vace"), "wan", config=PAIRED, batched_steps=2),
    "skyreels-v2": Case(named(tiny_families, "skyreels-v2"), "wan", config=PAIRED, batched_steps=2),
    "skyreels-v2-df": Case(named(tiny_families, "skyreels-v2-df"), "wan", config=PAIRED, batched_steps=4),
    "wan-animate": Case(named(tiny_families, "wan-animate"), "generic", config=PAIRED, batched_steps=None),
    # CogVideoX 1.0 and 1.5, both schedulers
    "cogvideox-2b-dpm": Case(
        cogvideox("cogvideox-2b", "dpm"), "cogvideox", to="tpu", check=cogvideox_vae_programs, rerun_on_cpu=True
    ),
    "cogvideox-5b-ddim": Case(
        cogvideox("cogvideox-5b", "ddim"), "cogvideox", check=cogvideox_vae_programs, rerun_on_cpu=True
    ),
    "cogvideox-d64-ddim": Case(cogvideox("cogvideox-d64", "ddim"), "cogvideox"),
    "cogvideox1.5-dpm": Case(
        cogvideox("cogvideox1.5", "dpm"), "cogvideox", to="tpu", check=cogvideox_vae_programs, rerun_on_cpu=True
    ),
    "cogvideox1.5-ddim": Case(
        cogvideox("cogvideox1.5", "ddim"), "cogvideox", check=cogvideox_vae_programs, rerun_on_cpu=True
    ),
    # HunyuanVideo 1.0 and 1.5
    "hunyuan-video": Case(named(tiny_families, "hunyuan-video"), "hunyuanvideo", config=PAIRED, batched_steps=2),
    "hunyuanvideo15": Case(
        lambda: (tiny.hunyuan15_pipeline(), dict(HUNYUAN15_CALL)),
        "hunyuanvideo15",
        to="tpu",
        check=one_hunyuan15_program,
        rerun_on_cpu=True,
    ),
    "hunyuanvideo15-i2v": Case(
        named(tiny_families, "hunyuanvideo15-i2v"), "hunyuanvideo15", config=PAIRED, batched_steps=2
    ),
    # LTX-Video and LTX-2 (they batch CFG themselves)
    "ltx": Case(named(tiny_families, "ltx"), "ltx", config=PAIRED, batched_steps=None),
    "ltx-i2v": Case(named(tiny_families, "ltx-i2v"), "ltx", config=PAIRED, batched_steps=None),
    "ltx2": Case(named(tiny_families, "ltx2"), "ltx2", config=PAIRED, batched_steps=None, check=ltx2_soundtrack),
    "ltx2-i2v": Case(
        named(tiny_families, "ltx2-i2v"), "ltx2", config=PAIRED, batched_steps=None, check=ltx2_soundtrack
    ),
    # images: Flux, Qwen-Image, Z-Image
    "flux": Case(named(tiny_images, "flux"), "flux", config=PAIRED, batched_steps=2),
    "qwen-image": Case(named(tiny_images, "qwen-image"), "qwenimage", config=PAIRED, batched_steps=2),
    "z-image": Case(named(tiny_images, "z-image"), "zimage", config=PAIRED, batched_steps=None),
    # the generic path: transformer pipelines without a family file
    "latte": Case(generic("latte"), "generic"),
    "mochi": Case(generic("mochi"), "generic", check=mochi_eager_attention),
    "easyanimate": Case(generic("easyanimate"), "generic", check=easyanimate_carried_frames),
    # UNet pipelines (SVD and AnimateDiff: on the mesh in test_mesh_families, on 1 device in the parity sweep)
    **{
        f"unet-{name}": Case(
            named(tiny_unet, name),
            "unet",
            to="tpu" if name == "sd" else "jax",
            check=UNET_CHECKS.get(name, unet_only),
            rerun_on_cpu=True,  # a restored VAE whose parameters lost requires_grad decoded 1.8e-7 off stock
        )
        for name in tiny_unet.PIPELINES
        if name not in ("svd", "animatediff")
    },
}


def nucleusmoe_in_one_program(run: Run) -> None:
    """The experts' grouped matmul and the rotary tables traced: every step one program, no module run eagerly."""
    entry = run.pipe._diffusers_tpu_runtime.denoisers["transformer"]
    assert not entry.eager and entry.unit_calls == 0 and "cannot be traced" not in run.log


if hasattr(diffusers, "NucleusMoEImagePipeline"):  # diffusers 0.42+
    PARITY["nucleusmoe-image"] = Case(
        named(tiny_images, "nucleusmoe-image"),
        "nucleusmoe",
        config=PAIRED,
        batched_steps=2,
        check=nucleusmoe_in_one_program,
        rerun_on_cpu=True,  # the experts' and the rotary tables' stock methods are back
    )


def call(pipe, arguments, output_type):
    arguments = dict(copy.deepcopy(arguments), output_type=output_type)
    return pipe(**arguments, generator=torch.Generator().manual_seed(0))


def pictures(output):
    return output.frames if hasattr(output, "frames") else output.images


@pytest.mark.parametrize("name", list(PARITY))
def test_matches_stock_torch(name, caplog, monkeypatch):
    case = PARITY[name]
    monkeypatch.setenv("DIFFUSERS_TPU_PLATFORM", "cpu")  # "tpu" rehearses on the CPU
    caplog.set_level(logging.WARNING, logger="diffusers_tpu")
    stock, arguments = case.build()
    expected = call(stock, arguments, "np")
    expected_pil = stock_pil(pictures(expected))
    assert np.isfinite(pictures(expected)).all() and np.asarray(pictures(expected)).std() > 1e-3  # a real picture
    pipe, _ = case.build()
    tables = getattr(pipe.scheduler, "alphas_cumprod", None)
    pipe.to(case.to, config=diffusers_tpu.TPUConfig(**case.config)) if case.config else pipe.to(case.to)
    runtime = pipe._diffusers_tpu_runtime
    denoisers = list(runtime.denoisers)
    assert runtime.family.name == case.family
    assert diffusers_tpu.supported_pipelines()[type(pipe).__name__] == "verified"
    assert "has not been compared with stock" not in caplog.text  # a verified class: no warning
    moved = call(pipe, arguments, "np")
    assert_np_matches(pictures(moved), pictures(expected))
    assert_pil_matches(pictures(call(pipe, arguments, "pil")), expected_pil)
    if case.batched_steps is None:
        assert runtime.pairing is None
    elif case.batched_steps is not ...:
        assert runtime.pairing.batched_steps == case.batched_steps  # every step ran cond and uncond as one batch
    with compile_accounting.compile_log() as log:
        call(pipe, arguments, "np")
    assert log.compilations == 0
    if case.check is not None:
        case.check(Run(pipe, stock, arguments, expected, moved, caplog.text))
    pipe.to("cpu")  # back on torch: the stock pipeline, with the very same weights
    for denoiser in denoisers:
        module, theirs = getattr(pipe, denoiser), getattr(stock, denoiser).state_dict()
        assert "forward" not in vars(module)
        assert all(torch.equal(value, theirs[key]) for key, value in module.state_dict().items())
    assert getattr(pipe.scheduler, "alphas_cumprod", None) is tables  # the scheduler's CPU tables are back
    for name, module in pipe.components.items():  # a fine-tune after the round trip trains what it did before
        if isinstance(module, torch.nn.Module):
            theirs = dict(getattr(stock, name).named_parameters())
            assert all(p.requires_grad == theirs[n].requires_grad for n, p in module.named_parameters()), name
    if case.rerun_on_cpu:
        np.testing.assert_array_equal(pictures(call(pipe, arguments, "np")), pictures(expected))
