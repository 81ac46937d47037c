"""Programs each family's first call compiles (tests/interop/test_first_call.py runs this in a fresh process: JAX keeps
every program it compiled for the process, so counts are only meaningful from a cold start). Prints one JSON line:
{family: {"programs": n, "cache_hits": loaded from the persistent cache, "seconds": s}}, the families in a fixed order
(later ones reuse the eager programs of earlier ones with the same shapes)."""

import json
import sys

import torch

import diffusers_tpu  # noqa: F401  (registers the backend)
from diffusers_tpu.interop import compile_accounting
from diffusers_tpu.testing import tiny, tiny_families, tiny_images

PROMPTS = dict(
    prompt=["a cat walks on the grass", "a red fox jumps over a sleeping dog in the snow"],
    negative_prompt=["blurry", "low quality, static, deformed"],
)
VIDEO = dict(PROMPTS, height=32, width=32, num_frames=9, num_inference_steps=2)


def calls():
    yield "wan", tiny.wan_pipeline("wan"), VIDEO
    yield "cogvideox", tiny.cogvideox_pipeline("cogvideox-5b"), dict(VIDEO, num_frames=9)
    yield "hunyuanvideo15", tiny.hunyuan15_pipeline(), dict(VIDEO, prompt="a cat", negative_prompt="blurry")
    pipe, call = tiny_families.pipeline("ltx")
    yield "ltx", pipe, dict(call, num_inference_steps=2)
    pipe, call = tiny_images.pipeline("flux")
    yield "flux", pipe, dict(call, num_inference_steps=2)


def main(names: list[str]) -> None:
    report = {}
    for name, pipe, call in calls():
        if names and name not in names:
            continue
        pipe.to("jax")
        with compile_accounting.compile_log() as log:
            pipe(**call, output_type="np", generator=torch.Generator().manual_seed(0))
        report[name] = {"programs": log.compilations, "cache_hits": log.cache_hits, "seconds": round(log.seconds, 2)}
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
