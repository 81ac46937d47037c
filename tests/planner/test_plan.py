"""diffusers-tpu plan: its memory figures are XLA's analysis of the very program the runtime compiles."""

import jax
import pytest
import torch

from diffusers_tpu import TPUConfig
from diffusers_tpu.families import wan_vae
from diffusers_tpu.interop import program_figures
from diffusers_tpu.planner import architectures, call_probe, chips, plan
from diffusers_tpu.runtime.attach import pipeline_runtime
from diffusers_tpu.testing import tiny, tiny_unet

CALL = dict(
    prompt="a cat walks on the grass",
    negative_prompt="blurry",
    height=32,
    width=48,
    num_frames=9,
    num_inference_steps=2,
    max_sequence_length=24,
)
SIZE = {k: CALL[k] for k in ("height", "width", "num_frames", "num_inference_steps")}


def runtime_step_memory(pipe, config, call=CALL) -> list[dict]:
    """Attach for real, run, and analyse the programs the denoiser's calls actually ran with their arguments (the
    first call of each program, in order)."""
    pipe.to("jax", config=config)
    entry = next(iter(pipe._diffusers_tpu_runtime.denoisers.values()))
    calls, whole = {}, entry.whole

    def recorded(*args, **kwargs):
        static = tuple((k, v) for k, v in kwargs.items() if isinstance(v, (bool, int, float, str, type(None))))
        calls.setdefault(static, (args, kwargs))
        return whole(*args, **kwargs)

    entry.whole = recorded
    try:
        pipe(**call, generator=torch.Generator().manual_seed(0))
        return [program_figures.memory_analysis(whole, *args, **kwargs) for args, kwargs in calls.values()]
    finally:
        entry.whole = whole
        pipe.to("cpu")


HUNYUAN_CALL = dict(
    prompt="a cat", negative_prompt="blurry, low quality", height=32, width=48, num_frames=9, num_inference_steps=2
)
CAUSAL_CALL = dict(prompt="a cat walks on the grass", num_blocks=2, height=32, width=48, max_sequence_length=24)
PIPELINES = {
    "wan": (lambda: tiny.wan_pipeline("wan-4head"), CALL),
    "cogvideox": (lambda: tiny.cogvideox_pipeline("cogvideox-5b"), CALL),
    "hunyuanvideo15": (tiny.hunyuan15_pipeline, HUNYUAN_CALL),
    # 9 frames: 3 latent frames, whole blocks of 2 -> the call's 2 blocks
    "causal_wan": (tiny.causal_wan_pipeline, CAUSAL_CALL),
    "sdxl": (
        lambda: tiny_unet.sdxl()[0],
        dict(prompt="a cat walks on the grass", negative_prompt="blurry", height=32, width=48, num_inference_steps=2),
    ),
}


@pytest.mark.parametrize(
    "settings,family",
    [
        (dict(), "wan"),
        (dict(dtype=torch.bfloat16, quantize="int8"), "wan"),
        (dict(), "cogvideox"),
        (dict(), "hunyuanvideo15"),
        (dict(), "causal_wan"),
        (dict(), "sdxl"),
    ],
    ids=["wan-fp32", "wan-int8", "cogvideox-fp32", "hunyuanvideo15-fp32", "causal-wan-fp32", "sdxl-fp32"],
)
@pytest.mark.slow
def test_plan_reports_the_runtime_programs_memory(settings, family):
    config = TPUConfig(**settings)
    build, call = PIPELINES[family]
    actual = runtime_step_memory(build(), config, call)
    planned = plan.denoiser_memory(
        build(), dict(SIZE, guidance_scale=5.0), config, jax.devices()[:1], text_tokens=CALL["max_sequence_length"]
    )
    assert len(planned["passes"]) == len(actual) == (2 if family == "causal_wan" else 1)
    for planned_pass, actual_pass in zip(planned["passes"], actual):
        for key in ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "peak_bytes"):
            assert planned_pass[key] == actual_pass[key], (key, planned_pass, actual_pass)
    assert planned["peak_bytes"] == max(p["peak_bytes"] for p in actual)
    assert planned["argument_bytes"] > 0 and planned["mesh"] == {"dp": 1, "sp": 1, "tp": 1}
    assert planned["guided"] == (family != "causal_wan")


def test_int8_halves_the_planned_weights():
    sizes = {}
    for quantize in (None, "int8"):
        config = TPUConfig(dtype=torch.bfloat16, quantize=quantize)
        sizes[quantize] = plan.denoiser_memory(
            tiny.wan_pipeline("wan-4head"), dict(SIZE, guidance_scale=5.0), config, jax.devices()[:1], 24
        )["argument_bytes"]
    assert sizes["int8"] < 0.75 * sizes[None]


@pytest.mark.slow
def test_plan_command(tmp_path, capfd):
    import json

    from diffusers_tpu.commands import cli

    out = tmp_path / "plan.json"
    assert (
        cli.main(
            [
                "plan",
                "--model",
                "tiny:wan-4head",
                "--mesh",
                "1,1,1",
                "--hbm-gb",
                "0.00001",
                "--height",
                "32",
                "--width",
                "48",
                "--frames",
                "9",
                "--max-sequence-length",
                "24",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    report = json.loads(out.read_text())
    bf16, hosted, int8 = report["candidates"]  # 10 KB: bf16 does not fit, host memory, then int8: none fits
    assert not bf16["fits"] and bf16["quantize"] is None and int8["quantize"] == "int8"
    assert hosted["weights_in_host_memory"] is True and not hosted["fits"]
    assert int8["memory_per_device"]["argument_bytes"] < bf16["memory_per_device"]["argument_bytes"]
    assert report["recommended"] is None and bf16["flops_per_step"] > 0
    assert "does not fit" in capfd.readouterr().out
    assert cli.main(["plan", "--model", "tiny:wan-4head"]) == 2  # no target: a clear error, nothing compiled
    assert "--chips" in capfd.readouterr().err


@pytest.mark.slow
def test_plan_offers_weights_in_host_memory(tmp_path, capfd):
    """Weights in host memory are planned after the device-memory layouts and before int8: the step's device
    arguments lose the stored weights (apart as host arguments), and a target only that fits gets it recommended."""
    import json

    from diffusers_tpu.commands import cli

    def planned(hbm_bytes, *extra):
        out = tmp_path / "plan.json"
        argv = ["plan", "--model", "tiny:wan-4head", "--mesh", "1,1,1", "--hbm-gb", str(hbm_bytes / 2**30)]
        argv += ["--height", "32", "--width", "48", "--frames", "9", "--max-sequence-length", "24", "--no-vae"]
        assert cli.main([*argv, *extra, "--json", str(out)]) == 0
        return json.loads(out.read_text())

    rules, hosted, int8 = planned(1e4)["candidates"]
    assert (rules["weights_in_host_memory"], hosted["weights_in_host_memory"]) == (False, True)
    device, host = hosted["memory_per_device"]["argument_bytes"], hosted["memory_per_device"]["host_argument_bytes"]
    assert device + host == rules["memory_per_device"]["argument_bytes"] and device < host
    assert hosted["total_bytes_per_device"] < int8["total_bytes_per_device"] < rules["total_bytes_per_device"]
    between = (hosted["total_bytes_per_device"] + int8["total_bytes_per_device"]) / 2
    report = planned(between)
    assert report["recommended"]["weights_in_host_memory"] is True and len(report["candidates"]) == 2
    assert "TPUConfig(weights_in_host_memory=True)" in capfd.readouterr().out
    refused = planned(between, "--weights-in-host-memory", "no")
    assert refused["recommended"] is None and not any(r["weights_in_host_memory"] for r in refused["candidates"])
    assert cli.main(["plan", "--model", "tiny:wan-4head", "--mesh", "1,1,1", "--hbm-gb", "1", "--quantize", "int8",
                     "--weights-in-host-memory", "yes"]) == 2  # fmt: skip
    assert "drop --quantize" in capfd.readouterr().err
    only = planned(between, "--weights-in-host-memory", "yes")  # the fix the refusal names
    assert [row["weights_in_host_memory"] for row in only["candidates"]] == [True] and only["recommended"]["fits"]


def test_weights_in_host_memory_are_held_only_by_their_programs():
    """The figure ``text_encoder="auto"`` decides on: host-memory weights are not held between programs, but a text
    encoder's program holds all of its weights at once (counted when it is the largest in host memory)."""
    from diffusers_tpu.runtime import decision

    pipe, mesh = tiny.wan_pipeline("wan-4head"), {"dp": 1, "sp": 1, "tp": 1}

    def held(hosted=False):
        return decision.weights_per_device(
            pipe, TPUConfig(dtype=torch.bfloat16, weights_in_host_memory=hosted), "tpu", mesh
        )

    encoder_alone = held(tuple(name for name in pipe.components if name != "text_encoder"))
    assert held(True) == encoder_alone and 0 < encoder_alone < held(("transformer",)) < held()


@pytest.mark.slow
def test_plan_places_text_encoders_as_pipe_to_would(tmp_path, monkeypatch):
    """``plan --text-encoder auto`` (default) plans the encoders where ``TPUConfig(text_encoder="auto")`` puts them
    on the target: on the devices when all weights take <= 40% of its memory (then their programs are planned too),
    else on the host; and the runtime, given that memory, decides the same."""
    import json

    from diffusers_tpu.commands import cli
    from diffusers_tpu.runtime import decision, text_encoder_placement
    from diffusers_tpu.runtime.attach import pipeline_runtime

    config = TPUConfig(dtype=torch.bfloat16)  # plan's --dtype default
    weights = decision.weights_per_device(tiny.wan_pipeline("wan-4head"), config, "tpu", {"dp": 1, "sp": 1, "tp": 1})
    rows = {}
    for label, hbm_bytes in (
        ("room", weights / text_encoder_placement.WEIGHT_SHARE * 1.01),
        ("tight", weights / text_encoder_placement.WEIGHT_SHARE * 0.99),
    ):
        out = tmp_path / f"{label}.json"
        assert (
            cli.main(
                [
                    "plan",
                    "--model",
                    "tiny:wan-4head",
                    "--mesh",
                    "1,1,1",
                    "--hbm-gb",
                    str(hbm_bytes / 2**30),
                    "--height",
                    "32",
                    "--width",
                    "48",
                    "--frames",
                    "9",
                    "--max-sequence-length",
                    "24",
                    "--json",
                    str(out),
                ]
            )
            == 0
        )
        rows[label] = json.loads(out.read_text())["candidates"][0]
        monkeypatch.setattr(
            text_encoder_placement, "device_memory_limit", lambda devices, _limit=hbm_bytes: int(_limit)
        )
        pipe = tiny.wan_pipeline("wan-4head").to("jax", config=config)
        assert pipeline_runtime.runtime_of(pipe).text_encoder_placement == rows[label]["text_encoder"]
        pipe.to("cpu")
    assert (
        rows["room"]["text_encoder"] == "jax" and rows["room"]["memory_per_device"]["text_encoders"]["weight_bytes"] > 0
    )
    assert rows["tight"]["text_encoder"] == "host" and "text_encoders" not in rows["tight"]["memory_per_device"]
    assert rows["room"]["total_bytes_per_device"] > rows["tight"]["total_bytes_per_device"]


def test_plan_of_a_folder_reads_no_weights(tmp_path):
    """A saved pipeline plans with its denoiser on meta and no text encoder: the same figures as in memory."""
    tiny.wan_pipeline("wan-4head").save_pretrained(tmp_path)
    folder = architectures.folder_pipeline(str(tmp_path), None)
    assert all(p.is_meta for p in folder.transformer.parameters()) and folder.text_encoder is None
    config, size = TPUConfig(), dict(SIZE, guidance_scale=5.0)
    planned = plan.denoiser_memory(folder, size, config, jax.devices()[:1], 24)
    in_memory = plan.denoiser_memory(tiny.wan_pipeline("wan-4head"), size, config, jax.devices()[:1], 24)
    assert {k: v for k, v in planned.items()} == in_memory


def test_check_needs_an_accelerator(capfd):
    from diffusers_tpu.commands import cli

    assert cli.main(["plan", "--model", "tiny:wan-4head", "--chips", "v5e-1", "--check"]) == 2
    assert "TPU or GPU" in capfd.readouterr().err


def test_plan_reports_the_runtime_vae_decode_programs():
    """The Wan VAE's two decode programs, planned with abstract weights, match the placed runtime's programs."""
    from diffusers_tpu.runtime.attach import pipeline_runtime

    config = TPUConfig(vae_decode_chunk=2)
    planned = plan.denoiser_memory(
        tiny.wan_pipeline("wan-4head"), dict(SIZE, guidance_scale=5.0), config, jax.devices()[:1], 24, vae=True
    )["vae_decode"]
    pipe = tiny.wan_pipeline("wan-4head").to("jax", config=config)
    programs = pipe.vae._diffusers_tpu_programs
    frames = (SIZE["num_frames"] - 1) // 4 + 1  # latent frames of the call
    head = torch.zeros(1, 16, wan_vae.FIRST_FRAMES, SIZE["height"] // 8, SIZE["width"] // 8)
    with pipeline_runtime.runtime_of(pipe).jax_context():
        _, cache = programs["decode_first"](head)
    chunk = torch.zeros(1, 16, 2, SIZE["height"] // 8, SIZE["width"] // 8)
    assert frames > 2
    assert planned["decode_first"] == program_figures.memory_analysis(programs["decode_first"], head)
    assert planned["decode_chunk"] == program_figures.memory_analysis(programs["decode_chunk"], chunk, cache)
    pipe.to("cpu")


def test_json_reports_get_the_users_file_mode(tmp_path):
    import os

    from diffusers_tpu.runtime.files.outputs import write_atomically as _write_atomically

    path = tmp_path / "report.json"
    _write_atomically(str(path), lambda temp: open(temp, "w").write("{}"))
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600


def runtime_decoder_memory(pipe, call) -> list[dict]:
    """Run a pipeline placed on JAX; XLA's memory analysis of each program its compiled VAE decoder ran (first
    call of each shape, in order); the pipeline goes back to the CPU."""
    from torch.utils import _pytree as pytree

    decoder = pipe.vae.decoder
    guarded, seen = decoder.forward, {}

    def recorded(*args, **kwargs):
        key = tuple(tuple(x.shape) if isinstance(x, torch.Tensor) else x for x in pytree.tree_leaves((args, kwargs)))
        seen.setdefault(key, (args, kwargs))
        return guarded(*args, **kwargs)

    vars(decoder)["forward"] = recorded
    try:
        pipe(**call, generator=torch.Generator().manual_seed(0))
        compiled = pipeline_runtime.runtime_of(pipe).compiled_of(decoder)  # the decoder's program, found by name
        return [program_figures.memory_analysis(compiled, *args, **kwargs) for args, kwargs in seen.values()]
    finally:
        vars(decoder)["forward"] = guarded
        pipe.to("cpu")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["hunyuanvideo15", "cogvideox", "sdxl"])
def test_plan_reports_the_runtime_vae_method_programs(family):
    """VAEs compiled by method (HunyuanVideo-1.5's decoder, CogVideoX's frame batches, SDXL's image decoder): the
    programs the stock decode ran through them on the placed pipeline, planned from the denoiser's latents with
    abstract weights."""
    build, call = PIPELINES[family]
    frames = 17 if family == "cogvideox" else 9  # CogVideoX: 5 latent frames, two frame batches (the cache carried)
    call = dict(call, num_frames=frames) if family != "sdxl" else call
    planned = plan.denoiser_memory(
        build(), dict(SIZE, num_frames=frames, guidance_scale=5.0), TPUConfig(), jax.devices()[:1], 24, vae=True
    )["vae_decode"]
    actual = runtime_decoder_memory(build().to("jax"), call)
    assert len(actual) == (2 if family == "cogvideox" else 1) and planned["programs"] == actual
    assert planned["peak_bytes"] == max(a["peak_bytes"] for a in actual) > 0


@pytest.mark.slow
def test_plan_reports_the_runtime_text_encoder_programs():
    """TPUConfig(text_encoder="jax"): the programs HunyuanVideo-1.5's two text encoders (the MLLM, and ByT5 for the
    prompt's quoted text) ran on the placed pipeline, planned with abstract replicated weights."""
    config = TPUConfig(text_encoder="jax")
    planned = plan.denoiser_memory(
        tiny.hunyuan15_pipeline(), dict(SIZE, guidance_scale=5.0), config, jax.devices()[:1], 24, vae=True
    )["text_encoders"]
    pipe = tiny.hunyuan15_pipeline().to("jax", config=config)
    actual = []
    for name in ("text_encoder", "text_encoder_2"):
        module = getattr(pipe, name)
        compiled, outer = pipeline_runtime.runtime_of(pipe).compiled_of(module), module.forward  # found by name
        calls = []

        def recorded(*args, _calls=calls, _outer=outer, **kwargs):
            _calls.append((args, kwargs))
            return _outer(*args, **kwargs)

        vars(module)["forward"] = recorded
        actual.append((module, outer, compiled, calls))
    try:
        pipe(
            **dict(HUNYUAN_CALL, prompt=call_probe.PLAN_PROMPT, negative_prompt=""),
            generator=torch.Generator().manual_seed(0),
        )
        analyses = [
            program_figures.memory_analysis(compiled, *calls[0][0], **calls[0][1]) for _, _, compiled, calls in actual
        ]
    finally:
        for module, outer, _, _ in actual:
            vars(module)["forward"] = outer
        pipe.to("cpu")
    assert planned["programs"] == analyses  # both encoders ran (quoted text), one program each
    weights = sum(
        p.numel() * p.element_size()
        for name in ("text_encoder", "text_encoder_2")
        for p in getattr(pipe, name).parameters()
    )
    assert planned["weight_bytes"] == weights


@pytest.mark.slow
def test_a_decode_that_does_not_fit_is_planned_tiled():
    """The whole-video decode plans untiled and tiled (the VAE's tile settings); the tiled programs are the ones
    the runtime runs with tiling on, and a budget between the two recommends pipe.vae.enable_tiling()."""

    def build():
        pipe = tiny.hunyuan15_pipeline()  # 4 x 6 latents: 2 x 2 latent tiles
        pipe.vae.enable_tiling(
            tile_sample_min_height=16,
            tile_sample_min_width=16,
            tile_latent_min_height=2,
            tile_latent_min_width=2,
            tile_overlap_factor=0.25,
        )
        pipe.vae.disable_tiling()
        return pipe

    size = dict(SIZE, guidance_scale=5.0)
    memory = plan.denoiser_memory(build(), size, TPUConfig(), jax.devices()[:1], 24, vae=True, tile_above=0)
    assert "vae_decode_tiled" not in plan.denoiser_memory(
        build(), size, TPUConfig(), jax.devices()[:1], 24, vae=True, tile_above=chips.GIB
    )  # it fits whole: no tiles planned
    whole, tiled = memory["vae_decode"], memory["vae_decode_tiled"]
    assert len(tiled["programs"]) > 1 and tiled["peak_bytes"] < whole["peak_bytes"]
    pipe = build().to("jax")
    pipe.vae.enable_tiling()
    actual = runtime_decoder_memory(pipe, HUNYUAN_CALL)
    assert tiled["programs"] == actual and all(a["argument_bytes"] > 0 for a in actual)
    between = (memory["argument_bytes"] + (whole["peak_bytes"] + tiled["peak_bytes"]) / 2) / chips.GIB
    report = plan.plan(build(), size, TPUConfig(), jax.devices()[:1], None, between, 24)
    assert report["vae_tiling"] and report["fits"]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["wan", "hunyuanvideo15"])
def test_candidates_planned_together_equal_one_by_one(family):
    """``plan_all`` (the command's loop: programs compiled in background threads, the VAE analysed once) gives the
    rows ``plan`` gives for each configuration alone, in order, the tiled decode too where a budget needs it."""

    def build():
        if family == "wan":
            return tiny.wan_pipeline("wan-4head")
        pipe = tiny.hunyuan15_pipeline()  # 4 x 6 latents: 2 x 2 latent tiles
        pipe.vae.enable_tiling(
            tile_sample_min_height=16,
            tile_sample_min_width=16,
            tile_latent_min_height=2,
            tile_latent_min_width=2,
            tile_overlap_factor=0.25,
        )
        pipe.vae.disable_tiling()
        return pipe

    pipe, size = build(), dict(SIZE, guidance_scale=5.0)
    configs = [TPUConfig(), TPUConfig(quantize="int8"), TPUConfig(dtype=torch.bfloat16)]
    budget = 0.0001  # GiB: nothing fits, so every row plans the tiled decode where the VAE tiles
    together = list(plan.plan_all(pipe, size, configs, jax.devices()[:1], None, budget, 24))
    alone = [plan.plan(build(), size, config, jax.devices()[:1], None, budget, 24) for config in configs]
    assert together == alone and len(together) == 3
    tiled = together[0]["memory_per_device"].get("vae_decode_tiled")
    assert (tiled is not None and len(tiled["programs"]) > 1) == (family == "hunyuanvideo15")


@pytest.mark.slow
def test_gpu_targets(monkeypatch, capfd):
    """NVIDIA cards as plan targets: JAX on a GPU allocates from XLA_PYTHON_CLIENT_MEM_FRACTION of the memory."""
    from diffusers_tpu.commands import cli

    chip = chips.CHIPS["h100-80gb"]
    assert chip.gpu and chip.devices == 1 and chips.CHIPS["h200-141gb-x8"].devices == 8
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    assert chip.usable_gib() == pytest.approx(79.65 * 0.75, abs=0.01)
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
    assert chip.usable_gib() == pytest.approx(79.65 * 0.9, abs=0.01)
    assert chips.CHIPS["v6e-8"].usable_gib() == 32  # a TPU's HBM as it is
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "90")
    with pytest.raises(ValueError, match="must be a fraction"):
        chip.usable_gib()
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION")
    with pytest.raises(SystemExit):
        cli.main(["plan", "--help"])
    assert "h100-80gb" in capfd.readouterr().out
    assert (
        cli.main(
            [
                "plan",
                "--model",
                "tiny:wan-4head",
                "--chips",
                "h200-141gb",
                "--height",
                "32",
                "--width",
                "48",
                "--frames",
                "9",
                "--max-sequence-length",
                "24",
            ]
        )
        == 0
    )
    out = capfd.readouterr().out
    assert "JAX's memory pool is 105.3 GiB of the 140.4 GiB per GPU" in out and "of 105.3 GiB per device: fits" in out
    assert "floor" in out and "[1/1," in out


@pytest.mark.parametrize("family", ["wan", "cogvideox", "sdxl"])
def test_the_planned_calls_per_step_are_the_ones_stock_makes(family):
    """A step's estimate multiplies its program by the denoiser's calls per step: stock Wan calls it twice (cond,
    then uncond), CogVideoX and SDXL once with the pair concatenated (counted by running stock on torch)."""
    build, call = PIPELINES[family]
    pipe = build()
    denoiser = getattr(pipe, "transformer", None) or pipe.unet
    calls = []
    handle = denoiser.register_forward_pre_hook(lambda module, args: calls.append(1))
    try:
        pipe(**dict(call, num_inference_steps=1), guidance_scale=5.0, output_type="latent")
    finally:
        handle.remove()
    size = dict(height=call["height"], width=call["width"], num_frames=call.get("num_frames", 1), guidance_scale=5.0)
    planned = plan.denoiser_memory(pipe, size, TPUConfig(), jax.devices()[:1], text_tokens=24)
    assert planned["guided"] and planned["calls_per_step"] == len(calls) == (2 if family == "wan" else 1)
