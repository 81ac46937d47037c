"""A cold process's programs, counted twice: by JAX's own backend-compile events (a listener registered before
anything else) and by the project (``diffusers_tpu.stats``). tests/interop/test_first_call.py runs it. Prints one JSON
line: {"jax": programs JAX built in the process, up to the end of the first call; "project": the first call's
``stats(pipe).process_programs``; "call": its in-call count; "placing": ``pipe.to``'s; "second_jax" /
"second_project": the second call's}.

    python program_count_worker.py [wan|wan-mesh|cogvideox]   (a tiny pipeline with UniPC/DPM, guidance, 3 steps)
"""

import json
import sys

import jax

counted = {"programs": 0}


def _count(event: str, duration: float, **_) -> None:
    counted["programs"] += event == "/jax/core/compile/backend_compile_duration"


jax.monitoring.register_event_duration_secs_listener(_count)

import torch  # noqa: E402

import diffusers_tpu  # noqa: E402
from diffusers_tpu.testing import tiny  # noqa: E402

name = sys.argv[1] if len(sys.argv) > 1 else "wan"
if name.startswith("wan"):
    pipe = tiny.wan_pipeline("wan-4head", scheduler="unipc")
    call = dict(height=32, width=48, num_frames=13, max_sequence_length=20)
else:
    pipe = tiny.cogvideox_pipeline("cogvideox-5b")
    call = dict(height=32, width=32, num_frames=9, max_sequence_length=20)
call.update(prompt="a cat walks on the grass", negative_prompt="blurry", guidance_scale=5.0, num_inference_steps=3)
pipe.to("jax")
pipe(**call, output_type="np", generator=torch.Generator().manual_seed(0))
first = diffusers_tpu.stats(pipe)
jax_first = counted["programs"]
pipe(**call, output_type="np", generator=torch.Generator().manual_seed(1))
second = diffusers_tpu.stats(pipe)
report = dict(
    jax=jax_first,
    project=first.process_programs,
    call=first.compilations,
    placing=first.placing_programs,
    second_jax=counted["programs"] - jax_first,
    second_project=second.compilations,
)
print(json.dumps(report))
