"""One process of a 2-process x 4-device CPU "pod" (tests/runtime/test_mesh.py launches two). The cluster comes from the
environment (DIFFUSERS_TPU_COORDINATOR / _NUM_PROCESSES / _PROCESS_ID), read by ``import diffusers_tpu``. Prints one
JSON report; process 0 adds its frames so the test can compare them with the 1-process x 8-device run."""

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
os.environ["DIFFUSERS_TPU_PLATFORM"] = "cpu"  # "tpu" rehearses on CPU

import base64  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository
import jax  # noqa: E402

import diffusers_tpu  # noqa: E402
from diffusers_tpu import TPUConfig
from diffusers_tpu.commands import cli
from diffusers_tpu.interop import compile_accounting
from diffusers_tpu.testing import tiny, tiny_families  # noqa: E402
from tests.conftest import generate  # noqa: E402

MESHES = {"dp2-sp1-tp4": {"dp": 2, "sp": 1, "tp": 4}, "dp1-sp2-tp4": {"dp": 1, "sp": 2, "tp": 4}}


def encode(frames) -> str:
    return base64.b64encode(np.ascontiguousarray(frames, dtype=np.float32).tobytes()).decode()


def wan_runs(report):
    pipe = tiny.wan_pipeline("wan-4head")
    reference = generate(pipe, output_type="np")
    for name, mesh in MESHES.items():
        pipe.to("tpu", config=TPUConfig(mesh=mesh, attention_kv_threshold=16))
        out = generate(pipe, output_type="np")
        with compile_accounting.compile_log() as log:
            generate(pipe, output_type="np")
        report[f"wan-{name}"] = dict(
            np_max_abs=float(np.abs(out - reference).max()),
            warm_compilations=log.compilations,
            shape=list(out.shape),
            frames=encode(out) if jax.process_index() == 0 else None,
        )
        pipe.to("cpu")
    # Text encoders on the devices (what TPUConfig(text_encoder="auto") picks on accelerators with room): the
    # token ids enter the pod like any host input, every process gets the same embeddings.
    pipe.to("tpu", config=TPUConfig(mesh=MESHES["dp2-sp1-tp4"], attention_kv_threshold=16, text_encoder="jax"))
    report["wan-encoders-on-devices"] = dict(
        np_max_abs=float(np.abs(generate(pipe, output_type="np") - reference).max()),
        placement=pipe._diffusers_tpu_runtime.text_encoder_placement,
    )
    pipe.to("cpu")
    # Each process reads its own devices' memory; the placement rule decides on the smallest, the same everywhere.
    from diffusers_tpu.interop import processes

    report["agreed_limit"] = processes.smallest_across_processes(100 - 50 * jax.process_index())
    report["agreed_none"] = processes.smallest_across_processes(None if jax.process_index() else 7)
    # Different host inputs on the processes (another seed on process 1) must fail loudly, not mix.
    pipe.to("tpu", config=TPUConfig(mesh=MESHES["dp2-sp1-tp4"], attention_kv_threshold=16))
    try:
        generate(pipe, seed=jax.process_index(), output_type="np")
        report["disagreement"] = "no error"
    except Exception as error:  # noqa: BLE001 - the report says what was raised
        report["disagreement"] = f"{type(error).__name__}: {error}"
    pipe.to("cpu")


def ltx_runs(report):
    pipe, call = tiny_families.pipeline("ltx")
    run = lambda: pipe(**copy.deepcopy(call), output_type="np", generator=torch.Generator().manual_seed(0)).frames  # noqa: E731
    reference = run()
    for name, mesh in MESHES.items():
        pipe.to("tpu", config=TPUConfig(mesh=mesh, attention_kv_threshold=16))
        report[f"ltx-{name}"] = dict(np_max_abs=float(np.abs(run() - reference).max()))
        pipe.to("cpu")


def loading_run(report, directory):
    """Sharded loading on the pod: each process reads only its devices' slices; equal to stock + .to()."""
    folder = os.path.join(directory, f"checkpoint-{jax.process_index()}")  # every host has its own copy
    tiny.wan_pipeline("wan-4head").save_pretrained(folder, max_shard_size="20KB")
    config = TPUConfig(mesh=MESHES["dp1-sp2-tp4"])
    stock = type(tiny.wan_pipeline("wan-4head")).from_pretrained(folder).to("tpu", config=config)
    pipe = diffusers_tpu.from_pretrained(folder, device="tpu", config=config)
    reference = dict(stock.transformer.named_parameters())
    equal = True
    for name, tensor in pipe.transformer.named_parameters():
        a, b = tensor.jax(), reference[name].jax()
        equal &= a.sharding == b.sharding and not a.is_fully_addressable
        equal &= all(np.array_equal(x.data, y.data) for x, y in zip(a.addressable_shards, b.addressable_shards))
    report["loading_equal"] = bool(equal)


def cli_run(report, directory):
    """The CLI on every process, staged: process 0 alone writes the video; every process its stage files."""
    output = os.path.join(directory, "video.mp4")
    code = cli.main(
        [
            "generate",
            "--model",
            "tiny:wan-4head",
            "--platform",
            "cpu",
            "--mesh",
            "2,1,4",
            "--stage-dir",
            os.path.join(directory, "stages"),
            "--output",
            output,
        ]
    )
    report["cli"] = dict(code=code, wrote=os.path.exists(output))


def main():
    report = {
        "process": jax.process_index(),
        "processes": jax.process_count(),
        "devices": len(jax.devices()),
        "local_devices": len(jax.local_devices()),
    }
    wan_runs(report)
    ltx_runs(report)
    loading_run(report, sys.argv[1])
    cli_run(report, sys.argv[1])
    print("REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
