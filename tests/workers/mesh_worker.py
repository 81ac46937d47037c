"""Runs in a subprocess with 8 simulated CPU devices (the flag must precede JAX's initialization) and prints
one JSON report; tests/runtime/test_mesh.py asserts on it."""

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import base64  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import diffusers  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository
import diffusers_tpu  # noqa: E402
from diffusers_tpu import TPUConfig
from diffusers_tpu.interop import compile_accounting
from diffusers_tpu.planner import lowering
from diffusers_tpu.testing import tiny, tiny_parts
from tests.conftest import generate, pil_array, stock_pil  # noqa: E402

# (mesh, attention_kv_threshold, attention). Tokens: self-attention 24 keys, cross-attention 512. Threshold 16:
# both shard heads over tp; 10000 (the default): both shard the query sequence; 100: self queries, cross heads.
MESHES = {
    "dp2-sp1-tp4": ({"dp": 2, "sp": 1, "tp": 4}, 16, None),
    "dp1-sp2-tp4": ({"dp": 1, "sp": 2, "tp": 4}, 16, None),
    "dp2-sp2-tp2": ({"dp": 2, "sp": 2, "tp": 2}, 10000, None),
    "tp2-sp4": ({"tp": 2, "sp": 4}, 100, None),
    "default": (None, 10000, None),
    "dp2-sp1-tp4-jax-splash": ({"dp": 2, "sp": 1, "tp": 4}, 16, "splash"),
}


def weight_layout(pipe):
    block = pipe.transformer.blocks[0]
    named = {
        "to_q": block.attn1.to_q.weight,
        "to_out": block.attn1.to_out[0].weight,
        "ffn_in": block.ffn.net[0].proj.weight,
        "ffn_out": block.ffn.net[2].weight,
        "cross_k": block.attn2.to_k.weight,
        "patch": pipe.transformer.patch_embedding.weight,
    }
    layout = {}
    for name, tensor in named.items():
        sharding = diffusers_tpu.sharding_of(tensor)
        layout[name] = {
            "spec": [str(s) for s in sharding.spec],
            "shard": list(sharding.shard_shape(tensor.shape)),
            "shape": list(tensor.shape),
            "devices": len(sharding.device_set),
        }
    return layout


def compare(out, ref, pil_out, pil_ref):
    diff = np.abs(pil_array(pil_out) - pil_array(pil_ref))
    return {
        "np_max_abs": float(np.abs(out - ref).max()),
        "finite": bool(np.isfinite(out).all()),
        "pil_max_levels": int(diff.max()),
        "pil_fraction": float((diff > 0).mean()),
    }


# Two parts ("core", "families": plan on the mesh), each the subprocess of its own test file
# (test_mesh.py, test_mesh_families.py), so pytest-xdist runs them on different workers.
def main(part: str):
    started = time.perf_counter()
    report = {"devices": len(jax.devices()), "runs": {}}
    if part in ("families", "family_meshes"):  # plan on the mesh; the families on meshes the sweep does not run
        seconds = report["seconds"] = {}
        phases = (
            (("plan", plan_run),)
            if part == "families"
            else (
                ("cogvideox", cogvideox_runs),
                ("wan22", wan22_runs),
                ("hunyuan15", hunyuan15_runs),
                ("causal_wan", causal_wan_runs),
                ("odd_width", odd_width_run),
                ("freeu", freeu_run),
            )
        )
        for name, run in phases:
            began = time.perf_counter()
            report[name] = run()
            seconds[name] = time.perf_counter() - began
            print(f"phase {name}: {seconds[name]:.0f} s", file=sys.stderr, flush=True)
        print("REPORT " + json.dumps(report))
        return
    pipe = tiny.wan_pipeline("wan-4head")
    ref = generate(pipe, output_type="np")
    pil_ref = stock_pil(ref)
    for name, (mesh, threshold, kernel) in MESHES.items():
        device = "tpu" if name == "dp2-sp1-tp4" else "jax"  # "tpu" rehearses on CPU via the env var
        os.environ["DIFFUSERS_TPU_PLATFORM"] = "cpu"
        pipe.to(device, config=TPUConfig(mesh=mesh, attention_kv_threshold=threshold, attention=kernel))
        runtime = pipe._diffusers_tpu_runtime
        if name == "default":  # the layout it picks: dp2-sp1-tp4's, whose video is compared above
            report["runs"][name] = dict(mesh=dict(runtime.mesh.shape), attention=runtime.attention.implementation)
            pipe.to("cpu")
            continue
        out, pil_out = generate(pipe, output_type="np"), generate(pipe, output_type="pil")
        with compile_accounting.compile_log() as log:
            generate(pipe, output_type="np")
        report["runs"][name] = dict(
            compare(out, ref, pil_out, pil_ref),
            mesh=dict(runtime.mesh.shape),
            layout=weight_layout(pipe),
            warm_compilations=log.compilations,
            batched_steps=runtime.pairing.batched_steps if runtime.pairing else 0,
            attention=runtime.attention.implementation,
        )
        if name in ("dp2-sp1-tp4", "dp1-sp2-tp4"):  # compared with the 2-process run (test_mesh: pod)
            report["runs"][name].update(
                frames=base64.b64encode(np.ascontiguousarray(out, np.float32).tobytes()).decode(),
                shape=list(np.shape(out)),
            )
        pipe.to("cpu")
    report["restored_exactly"] = bool(np.array_equal(generate(pipe, output_type="np"), ref))
    # head_dim 128 (the exp2 kernel's packed [B, S, H*D] layout): heads over tp, then query sequences over sp
    wide = tiny.wan_pipeline("wan-d128")
    wide_ref = generate(wide, output_type="np")
    for name, mesh, threshold in (
        ("d128-dp2-sp1-tp4", MESHES["dp2-sp1-tp4"][0], 16),
        ("d128-tp2-sp4", {"tp": 2, "sp": 4}, 100),
    ):
        wide.to("jax", config=TPUConfig(mesh=mesh, attention_kv_threshold=threshold))
        out = generate(wide, output_type="np")
        report["runs"][name] = dict(
            compare(out, wide_ref, stock_pil(out), stock_pil(wide_ref)),
            mesh=dict(wide._diffusers_tpu_runtime.mesh.shape),
            attention=wide._diffusers_tpu_runtime.attention.implementation,
        )
        wide.to("cpu")
    seconds = report["seconds"] = {"wan_meshes": time.perf_counter() - started}
    for name, run in (
        ("lora", lora_runs),
        ("caches", cache_runs),
        ("quantize", quantize_run),
        ("fully_sharded", fully_sharded_run),
        ("model_offload", model_offload_run),
        ("context_parallel", context_parallel_run),
        ("sequential_offload", sequential_offload_run),
    ):
        began = time.perf_counter()
        report[name] = run()
        seconds[name] = time.perf_counter() - began
        print(f"phase {name}: {seconds[name]:.0f} s", file=sys.stderr, flush=True)  # where the worker's time goes

    errors = {}
    two_heads = tiny.wan_pipeline("wan")
    for label, mesh in {"heads": {"dp": 2, "tp": 4}, "product": {"dp": 2}}.items():
        try:
            two_heads.to("jax", config=TPUConfig(mesh=mesh))
            errors[label] = None
        except ValueError as error:
            errors[label] = str(error)
    errors["still_on_torch"] = all(type(p) is torch.nn.Parameter for p in two_heads.transformer.parameters())
    report["errors"] = errors

    mesh = diffusers_tpu.interop.backend.build_mesh({"dp": 2, "sp": 1, "tp": 4}, jax.devices())
    report["export"] = export_realistic(mesh)
    print("REPORT " + json.dumps(report))


def fully_sharded_run():
    """``TPUConfig(fully_sharded_weights=True)`` on dp2·sp2·tp2: the repeated blocks' stacks are stored over all 8
    devices (a quarter of the per-device bytes the tensor-parallel rules alone give), each layer gathered where the
    loop reads it; the video equals stock, the weights read back exactly."""
    from diffusers_tpu.interop import sharding
    from diffusers_tpu.runtime.weights import stacked_weights

    pipe = tiny.wan_pipeline("wan-4head")
    ref = generate(pipe, output_type="np")
    stock = {k: v.clone() for k, v in pipe.transformer.state_dict().items()}
    mesh = {"dp": 2, "sp": 2, "tp": 2}
    per_device = {}
    for full in (False, True):
        pipe.to("jax", config=TPUConfig(mesh=mesh, fully_sharded_weights=full))
        stacks = {id(s.stack[0]): s.stack[0] for s in sharding.slots_of(pipe.transformer) if s.stack}
        per_device[full] = sum(stack.array.addressable_shards[0].data.nbytes for stack in stacks.values())
        if full:
            out = generate(pipe, output_type="np")
            with compile_accounting.compile_log() as log:
                generate(pipe, output_type="np")
            view = pipe.transformer.blocks[1].ffn.net[0].proj.weight
            embedder = pipe.transformer.condition_embedder.time_proj.weight
            run = dict(
                embedder_spec=[str(e) for e in diffusers_tpu.sharding_of(embedder).spec],
                embedder_shards=len({str(s.index) for s in embedder.jax().addressable_shards}),
                np_max_abs=float(np.abs(out - ref).max()),
                warm_compilations=log.compilations,
                is_view=stacked_weights.is_view(view),
                stack_spec=[str(e) for e in view.stack.array.sharding.spec],
                layer_spec=[str(e) for e in diffusers_tpu.sharding_of(view).spec],
                state_dict_exact=all(torch.equal(v, stock[k]) for k, v in pipe.transformer.state_dict().items()),
            )
        pipe.to("cpu")
    run["stack_bytes_per_device"] = {"rules": per_device[False], "full": per_device[True]}
    run["restored_exactly"] = all(torch.equal(v, stock[k]) for k, v in pipe.transformer.state_dict().items())
    return run


def cogvideox_runs():
    """CogVideoX 1.0 and 1.5 at 64 px wide: the VAE's 8-wide latent is really width-sharded over 8 devices."""
    runs = {}
    cases = {
        "1.5-dpm-dp2-sp1-tp4": ("cogvideox1.5", "dpm", {"dp": 2, "sp": 1, "tp": 4}),
        "2b-dpm-dp2-sp2-tp2": ("cogvideox-2b", "dpm", {"dp": 2, "sp": 2, "tp": 2}),
        # 64-wide heads, two per device: the exp2 kernel's packed head pairs under shard_map
        "d64-ddim-dp2-sp2-tp2": ("cogvideox-d64", "ddim", {"dp": 2, "sp": 2, "tp": 2}),
    }
    call = dict(max_sequence_length=32, num_frames=17, width=64)
    for name, (variant, scheduler, mesh) in cases.items():
        pipe = tiny.cogvideox_pipeline(variant, scheduler=scheduler)
        ref = generate(pipe, output_type="np", **call)
        pil_ref = stock_pil(ref)
        pipe.to("jax", config=TPUConfig(mesh=mesh))
        out, pil_out = generate(pipe, output_type="np", **call), generate(pipe, output_type="pil", **call)
        weight = pipe.transformer.transformer_blocks[0].attn1.to_q.weight
        latent = jax.numpy.zeros((2, 4, 3, 4, 8))  # [B, C, T, H, W=8] as the VAE decoder receives it
        vae_spec = pipe._diffusers_tpu_runtime.place_vae_input(latent).sharding.spec
        runs[name] = dict(
            compare(out, ref, pil_out, pil_ref),
            q_spec=[str(s) for s in diffusers_tpu.sharding_of(weight).spec],
            vae_width_spec=[list(e) if isinstance(e, tuple) else e for e in vae_spec],
        )
    return runs


def wan22_runs():
    """Wan 2.2 A14B / TI2V and Wan I2V at 64 px wide on dp2-sp1-tp4: the VAE decodes (and I2V encodes) with the
    latent width split over the VAE's 8-device spatial axis."""
    runs = {}
    cases = {
        "a14b": (tiny.wan22_a14b_pipeline, {}),
        "ti2v": (tiny.wan22_ti2v_pipeline, {}),
        "i2v": (tiny.wan_i2v_pipeline, {"image": tiny_parts.test_image(32, 64)}),
    }
    for name, (make, extra) in cases.items():
        pipe = make()
        call = dict(extra, num_frames=9, width=64 if name != "ti2v" else 128)  # TI2V: 16x VAE, latent width 8
        ref = generate(pipe, output_type="np", **call)
        pil_ref = stock_pil(ref)
        pipe.to("jax", config=TPUConfig(mesh={"dp": 2, "sp": 1, "tp": 4}, vae_decode_chunk=2))
        out, pil_out = generate(pipe, output_type="np", **call), generate(pipe, output_type="pil", **call)
        runtime = pipe._diffusers_tpu_runtime
        runs[name] = dict(
            compare(out, ref, pil_out, pil_ref),
            vae_mesh=dict(runtime.vae_mesh.shape),
            batched_steps=runtime.pairing.batched_steps,
        )
    return runs


def hunyuan15_runs():
    """HunyuanVideo-1.5 (CFG pair of different padded lengths, ByT5 on one side) on three meshes; threshold 16
    shards the joint attention's heads over tp, 10000 its query sequence over (sp, tp)."""
    from tests.families.test_hunyuan15 import CALL as HY_CALL

    runs = {}
    pipe = tiny.hunyuan15_pipeline()
    ref = generate(pipe, output_type="np", **HY_CALL)
    pil_ref = stock_pil(ref)
    # dp2·sp2·tp2: the parity sweep (CI's third command)
    cases = {"dp2-sp1-tp4": ({"dp": 2, "sp": 1, "tp": 4}, 16), "dp1-sp2-tp4": ({"dp": 1, "sp": 2, "tp": 4}, 10000)}
    for name, (mesh, threshold) in cases.items():
        pipe.to("jax", config=TPUConfig(mesh=mesh, attention_kv_threshold=threshold))
        out, pil_out = generate(pipe, output_type="np", **HY_CALL), generate(pipe, output_type="pil", **HY_CALL)
        with compile_accounting.compile_log() as log:
            generate(pipe, output_type="np", **HY_CALL)
        weight = pipe.transformer.transformer_blocks[0].attn.add_q_proj.weight
        runs[name] = dict(
            compare(out, ref, pil_out, pil_ref),
            warm_compilations=log.compilations,
            add_q_spec=[str(s) for s in diffusers_tpu.sharding_of(weight).spec],
        )
        pipe.to("cpu")
    runs["guided_half"] = _guided_half_run(pipe, HY_CALL)
    return runs


def _guided_half_run(pipe, call):
    """A guider enabled for the first half of the steps on dp2·sp1·tp4: the pair over dp, then the single program;
    the video is stock's with the same guider, the second call compiles nothing."""
    half = diffusers.ClassifierFreeGuidance(guidance_scale=6.0, stop=0.5)
    call = dict(call, num_inference_steps=4, output_type="np")
    pipe.guider = half.new()
    ref = generate(pipe, **call)
    pipe.to("jax", config=TPUConfig(mesh={"dp": 2, "sp": 1, "tp": 4}))
    runtime, batches = pipe._diffusers_tpu_runtime, []
    chain = runtime.chain(pipe.transformer)
    inner = chain.inner
    chain.inner = lambda *a, **k: batches.append(k["hidden_states"].shape[0]) or inner(*a, **k)
    pipe.guider = half.new()
    out = generate(pipe, **call)
    pipe.guider = half.new()
    with compile_accounting.compile_log() as log:
        again = generate(pipe, **call)
    chain.inner = inner
    pipe.to("cpu")
    return dict(
        np_max_abs=float(max(np.abs(out - ref).max(), np.abs(again - ref).max())),
        batches=batches,
        warm_compilations=log.compilations,
    )


def causal_wan_runs():
    """Causal Wan streaming 3 blocks (the ring wraps) at 64 px wide on three meshes: blocks equal plain torch and
    nothing compiles after the first block."""
    from tests.families.test_causal_wan_pipeline import CALL as CAUSAL_CALL

    runs = {}
    call = dict(CAUSAL_CALL, width=64)
    pipe = tiny.causal_wan_pipeline()
    pipe.set_progress_bar_config(disable=True)
    run = lambda **extra: pipe(**call, **extra, generator=torch.Generator().manual_seed(0)).frames  # noqa: E731
    ref = run(output_type="np")
    pil_ref = stock_pil(ref)
    # dp2·sp2·tp2: the parity sweep (CI's third command)
    cases = {"dp2-sp1-tp4": ({"dp": 2, "sp": 1, "tp": 4}, 16), "dp1-sp2-tp4": ({"dp": 1, "sp": 2, "tp": 4}, 10000)}
    for name, (mesh, threshold) in cases.items():
        pipe.to("jax", config=TPUConfig(mesh=mesh, attention_kv_threshold=threshold))
        out = run(output_type="np")
        first = [block.compilations for block in pipe.block_timings]
        pil_out = run(output_type="pil")
        with compile_accounting.compile_log() as log:
            run(output_type="np")
        weight = pipe.transformer.blocks[0].attn1.to_q.weight
        runs[name] = dict(
            compare(out, ref, pil_out, pil_ref),
            first_call_compilations=first,
            warm_compilations=log.compilations,
            q_spec=[str(s) for s in diffusers_tpu.sharding_of(weight).spec],
        )
        pipe.to("cpu")
    return runs


def odd_width_run():
    """Z-Image at diffusers' test size (an MLP width of 85, two heads) moved with the defaults: the mesh ``pipe.to``
    picks, and the images against stock (dp2·sp2·tp2 would not split that width)."""
    from diffusers_tpu.testing import tiny_images

    pipe, call = tiny_images.z_image(0, dim=32, heads=2, axes_dims=(8, 4, 4))
    pipe.set_progress_bar_config(disable=True)

    def run(kind):  # a deep copy each call: stock Z-Image writes its chat template into the caller's prompts
        return pipe(**copy.deepcopy(call), output_type=kind, generator=torch.Generator().manual_seed(0)).images

    ref = run("np")
    pipe.to("jax")
    try:
        out, pil_out = run("np"), run("pil")
        with compile_accounting.compile_log() as log:
            run("np")
        return dict(
            compare(out, ref, pil_out, stock_pil(ref)),
            mesh=dict(pipe._diffusers_tpu_runtime.mesh.shape),
            warm_compilations=log.compilations,
        )
    finally:
        pipe.to("cpu")


def freeu_run():
    """SD 1.5 with FreeU (a Fourier filter of the UNet's skip features: FFTs inside the step) on dp2·sp2·tp2, the
    safety checker left out: the images against stock (XLA:CPU cannot run a split FFT: ``torchax_mesh``)."""
    from diffusers_tpu.testing import tiny_unet

    pipe, call = tiny_unet.sd(0)
    pipe.safety_checker, pipe.feature_extractor = None, None
    pipe.enable_freeu(s1=0.9, s2=0.2, b1=1.2, b2=1.4)
    pipe.set_progress_bar_config(disable=True)

    def run(kind):
        return pipe(**copy.deepcopy(call), output_type=kind, generator=torch.Generator().manual_seed(0)).images

    ref = run("np")
    pipe.to("jax", config=TPUConfig(mesh={"dp": 2, "sp": 2, "tp": 2}))
    try:
        return dict(compare(run("np"), ref, run("pil"), stock_pil(ref)))
    finally:
        pipe.to("cpu")


MESHES_13 = {"dp2-sp1-tp4": {"dp": 2, "sp": 1, "tp": 4}, "dp1-sp2-tp4": {"dp": 1, "sp": 2, "tp": 4}}


def lora_runs():
    """Adapters on the mesh: one loaded before the move, one after, both sharded like the layers they adapt;
    changing their weights recompiles nothing."""
    from tests.runtime.test_lora import diffusers_lora

    runs, call = {}, dict(num_inference_steps=2, output_type="np")

    def adapted(pipe):
        pipe.load_lora_weights(diffusers_lora("wan-4head", 1), adapter_name="a")
        return pipe

    ref = adapted(tiny.wan_pipeline("wan-4head"))
    ref.load_lora_weights(diffusers_lora("wan-4head", 2), adapter_name="b")
    ref.set_adapters(["a", "b"], adapter_weights=[0.6, 0.4])
    expected = generate(ref, **call)
    ref.set_adapters(["a", "b"], adapter_weights=[1.0, -0.5])
    expected_2 = generate(ref, **call)
    names = {
        "q_A": "attn1.to_q.lora_A",
        "q_B": "attn1.to_q.lora_B",
        "out_A": "attn1.to_out.0.lora_A",
        "out_B": "attn1.to_out.0.lora_B",
        "ffn_in_B": "ffn.net.0.proj.lora_B",
        "ffn_out_A": "ffn.net.2.lora_A",
    }
    for name in ("dp1-sp2-tp4",):  # adapters shard by tp alone: one layout with tp (and sp) proves their layout
        pipe = adapted(tiny.wan_pipeline("wan-4head")).to("jax", config=TPUConfig(mesh=MESHES_13[name]))
        pipe.load_lora_weights(diffusers_lora("wan-4head", 2), adapter_name="b")
        pipe.set_adapters(["a", "b"], adapter_weights=[0.6, 0.4])
        out = generate(pipe, **call)
        pipe.set_adapters(["a", "b"], adapter_weights=[1.0, -0.5])
        with compile_accounting.compile_log() as log:
            out_2 = generate(pipe, **call)
        block = pipe.transformer.blocks[0]
        specs = {
            f"{key}.{adapter}": [
                str(s)
                for s in diffusers_tpu.sharding_of(
                    getattr(block.get_submodule(path.rsplit(".", 1)[0]), path.rsplit(".", 1)[1])[adapter].weight
                ).spec
            ]
            for key, path in names.items()
            for adapter in ("a", "b")
        }
        runs[name] = dict(
            np_max_abs=float(max(np.abs(out - expected).max(), np.abs(out_2 - expected_2).max())),
            finite=bool(np.isfinite(out).all()),
            weight_change_compilations=log.compilations,
            specs=specs,
        )
        pipe.to("cpu")
    return runs


def quantize_run():
    """int8 weights on dp2-sp1-tp4 (float32 compute): layout and output, compared in test_mesh with one device."""
    pipe = tiny.wan_pipeline("wan-4head").to("jax", config=TPUConfig(mesh={"dp": 2, "sp": 1, "tp": 4}, quantize="int8"))
    out = generate(pipe, output_type="np")
    with compile_accounting.compile_log() as log:
        generate(pipe, output_type="np")
    layout = weight_layout(pipe)
    layout["dtypes"] = {
        name: str(getattr(pipe.transformer.blocks[0].attn1, name).weight.dtype) for name in ("to_q", "to_k")
    }
    pipe.to("cpu")
    return dict(
        layout=layout,
        warm_compilations=log.compilations,
        finite=bool(np.isfinite(out).all()),
        frames=base64.b64encode(np.ascontiguousarray(out, np.float32).tobytes()).decode(),
        shape=list(out.shape),
    )


def _offloaded(mesh: dict, enable):
    """Stock's video, then the pipeline moved onto ``mesh`` with ``enable(pipe)``: its output against stock, what its
    modules show after a call, and a second call (the same? compiling nothing?)."""
    pipe = tiny.wan_pipeline("wan-4head")
    ref = generate(pipe, output_type="np")
    pipe.to("jax", config=TPUConfig(mesh=mesh))
    enable(pipe)
    out = generate(pipe, output_type="np")
    devices = {name: m.device.type for name, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
    with compile_accounting.compile_log() as log:
        again = generate(pipe, output_type="np")
    report = dict(
        max_abs=float(np.abs(out - ref).max()),
        repeat_equal=bool(np.array_equal(out, again)),
        devices_after_call=devices,
        warm_compilations=log.compilations,
    )
    return pipe, report


def model_offload_run():
    """``enable_model_cpu_offload(device="jax")`` on dp2-sp1-tp4 (``_offloaded``)."""
    pipe, report = _offloaded({"dp": 2, "sp": 1, "tp": 4}, lambda p: p.enable_model_cpu_offload(device="jax"))
    pipe.to("cpu")
    return report


def context_parallel_run():
    """``transformer.enable_parallelism(ContextParallelConfig(...))`` after the move to dp2-sp1-tp4: refused for a
    degree 8 devices cannot hold (before anything moves), then the fix the error suggests, then Ulysses x ring
    (2 x 2): the mesh each gives and the video against stock's."""
    from diffusers import ContextParallelConfig

    pipe = tiny.wan_pipeline("wan-4head")
    ref = generate(pipe, output_type="np")
    pipe.to("jax", config=TPUConfig(mesh={"dp": 2, "sp": 1, "tp": 4}))
    report = {}
    try:
        pipe.transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=3))
    except ValueError as error:
        report["refused"] = str(error)
    report["mesh_after_refusal"] = dict(pipe._diffusers_tpu_runtime.mesh.shape)
    suggested = int(report["refused"].split("ContextParallelConfig(ulysses_degree=")[1].split(")")[0])
    pipe.transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=suggested))
    report["suggested_mesh"] = dict(pipe._diffusers_tpu_runtime.mesh.shape)
    report["suggested_max_abs"] = float(np.abs(generate(pipe, output_type="np") - ref).max())
    pipe.transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=2, ring_degree=2))
    report["mesh"] = dict(pipe._diffusers_tpu_runtime.mesh.shape)
    report["max_abs"] = float(np.abs(generate(pipe, output_type="np") - ref).max())
    pipe.to("cpu")
    report["back_on_torch"] = "enable_parallelism" not in vars(pipe.transformer)
    return report


def sequential_offload_run():
    """``enable_sequential_cpu_offload(device="jax")`` on dp2-sp2-tp2 (``_offloaded``), and where the weights are
    stored (host memory, sharded as decided); ``enable_group_offload(onload_device="jax")`` there, the VAE left on the
    devices: its output against stock."""
    mesh = {"dp": 2, "sp": 2, "tp": 2}
    pipe, report = _offloaded(mesh, lambda p: p.enable_sequential_cpu_offload(device="jax"))
    pipe.remove_all_hooks()  # the modules hold the runtime's weights again
    stored = pipe.transformer.blocks[1].attn1.to_q._parameters["weight"].stack.array.sharding
    pipe.to("cpu")
    grouped, group_report = _offloaded(
        mesh, lambda p: p.enable_group_offload(onload_device="jax", offload_type="leaf_level", exclude_modules="vae")
    )
    grouped.to("cpu")
    return dict(
        report, stack_memory_kind=stored.memory_kind, stack_spec=str(stored.spec), group_max_abs=group_report["max_abs"]
    )


def plan_run():
    """plan's figures for dp2-sp1-tp4 (the CFG pair as one batch, int8 weights) vs the program the runtime ran."""
    import torch

    from diffusers_tpu.planner import plan
    from tests.planner.test_plan import CALL, SIZE, runtime_step_memory

    config = TPUConfig(mesh={"dp": 2, "sp": 1, "tp": 4}, dtype=torch.bfloat16, quantize="int8")
    actual = runtime_step_memory(tiny.wan_pipeline("wan-4head"), config)[0]
    planned = plan.denoiser_memory(
        tiny.wan_pipeline("wan-4head"),
        dict(SIZE, guidance_scale=5.0),
        config,
        jax.devices(),
        text_tokens=CALL["max_sequence_length"],
    )
    # the VAE decode programs at a latent width of 8 (width-sharded over the 8 devices) vs on one device
    wide = dict(SIZE, width=64, guidance_scale=5.0)
    vae = {
        n: plan.denoiser_memory(
            tiny.wan_pipeline("wan-4head"), wide, TPUConfig(mesh=mesh), jax.devices()[:n], 24, vae=True
        )["vae_decode"]
        for n, mesh in ((8, None), (1, {"dp": 1}))
    }
    # CogVideoX's decoder programs (compiled by method; two frame batches, the conv cache carried) likewise
    cog = {
        n: plan.denoiser_memory(
            tiny.cogvideox_pipeline("cogvideox-5b"),
            dict(wide, num_frames=17),
            TPUConfig(mesh=mesh),
            jax.devices()[:n],
            24,
            vae=True,
        )["vae_decode"]["programs"]
        for n, mesh in ((8, None), (1, {"dp": 1}))
    }
    return dict(actual=actual, planned=planned, vae=vae, cogvideox_vae=cog)


def cache_runs():
    """First Block Cache, MagCache, TaylorSeer, FasterCache and SeaCache on the mesh: the cached video equals
    torch's, in whole-step programs with the guidance pair batched over dp where the cache allows it (no block its own
    program), warm calls compile nothing."""
    from tests.runtime.test_step_caches import CACHES, STEPS

    runs, call = {}, dict(num_inference_steps=STEPS, output_type="np")
    layouts = (("first_block", "dp2-sp1-tp4"), ("mag", "dp1-sp2-tp4"), ("mag", "dp2-sp2-tp2"))
    layouts += (("taylorseer", "dp2-sp2-tp2"), ("faster", "dp2-sp2-tp2"))
    layouts += (("sea", "dp2-sp2-tp2"),) if "sea" in CACHES else ()  # diffusers 0.42+
    for cache, name in layouts:
        ref = tiny.wan_pipeline("wan-4head")
        ref.transformer.enable_cache(CACHES[cache](ref))
        expected = generate(ref, **call)
        pipe = tiny.wan_pipeline("wan-4head")
        pipe.transformer.enable_cache(CACHES[cache](pipe))
        pipe.to("jax", config=TPUConfig(mesh=MESHES_13.get(name) or {"dp": 2, "sp": 2, "tp": 2}))
        runtime = pipe._diffusers_tpu_runtime
        entry, specs = runtime.denoisers["transformer"], []

        def kept_layout(pipeline, step, timestep, tensors):  # the state a cache keeps between steps, and its layout
            (found,) = [c for c in entry._caches.values() if c is not None]
            for state in found.states:
                if isinstance(state, list):  # TaylorSeer: per module; its factors stacked over the layers
                    kept = next(iter(getattr(state[0].taylor_factors, "store", {}).values()), None)
                elif hasattr(state, "history"):  # SeaCache: the last full executions' residuals
                    kept = state.history[-1][2] if state.history else None
                elif hasattr(state, "cache"):  # FasterCache: per attention layer; its outputs stacked over the layers
                    kept = next(iter(getattr(state.cache[-1], "store", {}).values()), None) if state.cache else None
                else:
                    kept = vars(state).get("head_block_residual", vars(state).get("previous_residual"))
                if kept is not None:
                    layout = kept.sharding if isinstance(kept, jax.Array) else diffusers_tpu.sharding_of(kept)
                    specs.append(str(layout.spec))
            return tensors

        out = generate(pipe, callback_on_step_end=kept_layout, **call)
        with compile_accounting.compile_log() as log:
            generate(pipe, **call)
        runs[f"{cache}-{name}"] = dict(
            kept_specs=sorted(set(specs)),
            np_max_abs=float(np.abs(out - expected).max()),
            finite=bool(np.isfinite(out).all()),
            warm_compilations=log.compilations,
            unit_calls=entry.unit_calls,
            batched_steps=runtime.pairing.batched_steps if runtime.pairing is not None else 0,
            programs=sum(len(compiled.programs) for compiled in entry._cached.values()),
        )
    # FasterCache where the pipeline batches the pair itself (CogVideoX): the automatic mesh keeps dp for that batch
    from tests.runtime.test_step_caches import faster_cache

    call = dict(output_type="np", max_sequence_length=32, num_frames=8, num_inference_steps=STEPS)
    ref, pipe = tiny.cogvideox_pipeline("cogvideox1.5"), tiny.cogvideox_pipeline("cogvideox1.5")
    for p in (ref, pipe):
        p.transformer.enable_cache(faster_cache(p))
    expected = generate(ref, **call)
    pipe.to("jax")
    out = generate(pipe, **call)
    entry = pipe._diffusers_tpu_runtime.denoisers["transformer"]
    with compile_accounting.compile_log() as log:
        generate(pipe, **call)
    runs["faster-cogvideox-auto"] = dict(
        mesh=dict(pipe._diffusers_tpu_runtime.mesh.shape),
        np_max_abs=float(np.abs(out - expected).max()),
        finite=bool(np.isfinite(out).all()),
        warm_compilations=log.compilations,
        unit_calls=entry.unit_calls,
        programs=sum(len(compiled.programs) for compiled in entry._cached.values()),
    )
    if hasattr(diffusers, "TextKVCacheConfig"):  # diffusers 0.42+: TextKVCache, on NucleusMoE-Image
        from tests.runtime.test_text_kv_cache import build
        from tests.runtime.test_text_kv_cache import run as image

        ref, call = build()
        expected = image(ref, call)
        pipe, _ = build()
        pipe.to("jax", config=TPUConfig(mesh={"dp": 2, "sp": 2, "tp": 2}))
        out = image(pipe, call)
        runtime = pipe._diffusers_tpu_runtime
        entry = runtime.denoisers["transformer"]
        (cache,) = [c for c in entry._caches.values() if c is not None]
        with compile_accounting.compile_log() as log:
            image(pipe, call)
        runs["text_kv-dp2-sp2-tp2"] = dict(
            kept_specs=sorted({str(array.sharding.spec) for array in cache.inputs}),  # the last step's reads
            np_max_abs=float(np.abs(out - expected).max()),
            finite=bool(np.isfinite(out).all()),
            warm_compilations=log.compilations,
            unit_calls=entry.unit_calls,
            batched_steps=runtime.pairing.batched_steps,
            computing_calls=cache.computing_calls,
            programs=sum(len(compiled.programs) for compiled in entry._cached.values()),
        )
    return runs


def export_realistic(mesh):
    """Wan2.1-1.3B at 480p x 81 frames, sharded dp2-tp4, lowered for TPU on abstract shapes."""
    import jax.numpy as jnp
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    from diffusers_tpu.families import wan
    from diffusers_tpu.planner.lowering import abstract

    with torch.device("meta"):
        transformer = WanTransformer3DModel(**wan.WAN21_1_3B)
        vae = AutoencoderKLWan()
    step = lowering.export_method(
        transformer,
        "forward",
        mesh=mesh,
        rules=wan.SHARD_RULES,
        dtype=torch.bfloat16,
        kwargs=dict(
            hidden_states=abstract((2, 16, 21, 60, 104), jnp.bfloat16, mesh, ("dp",)),
            timestep=abstract((2,), jnp.float32, mesh, ("dp",)),
            encoder_hidden_states=abstract((2, 512, 4096), jnp.bfloat16, mesh, ("dp",)),
            return_dict=False,
        ),
    )
    latents = abstract((1, 16, 3, 60, 104), jnp.float32, mesh, (None, None, None, None, ("dp", "sp", "tp")))
    decode = lowering.export_method(vae, "decode", (latents,), dict(return_dict=False), mesh=mesh, attention_impl=None)
    return {
        "step_pallas": lowering.uses_pallas_kernel(step),
        "step_devices": step.nr_devices,
        "step_out": [list(a.shape) for a in step.out_avals],
        "decode_devices": decode.nr_devices,
        "decode_out": [list(a.shape) for a in decode.out_avals],
    }


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "core")
