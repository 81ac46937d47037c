"""The 8-device simulated mesh, second part (``mesh_worker.py families``): ``plan`` against the programs the runtime
runs there, and the VAE programs sharded over it. A minute of an 8-device worker, so CI's second command
(``-m mesh_slow``), not README's. (Every pipeline class's mesh run — "np", "pil", a second call compiling nothing,
LTX-2's soundtrack — is the parity sweep's: ``pytest -m sweep``, CI's third command.)"""

import pytest

from tests.runtime.test_mesh import mesh_report

pytestmark = pytest.mark.mesh_slow


@pytest.fixture(scope="module")
def report():
    return mesh_report("families")


def test_plan_matches_the_runtime_program_on_the_mesh(report):
    run = report["plan"]
    assert run["planned"]["cfg_batch"] == 2 and run["planned"]["mesh"] == {"dp": 2, "sp": 1, "tp": 4}
    for key in ("argument_bytes", "output_bytes", "alias_bytes", "temp_bytes", "peak_bytes"):
        assert run["planned"][key] == run["actual"][key], (key, run)
    # both VAE decode programs are spatially sharded: each device holds an eighth of the pixels and feature cache
    # (the first program was once replicated by XLA's partitioner)
    for program in ("decode_first", "decode_chunk"):
        mesh, one = run["vae"]["8"][program], run["vae"]["1"][program]
        assert mesh["output_bytes"] <= one["output_bytes"] / 4, (program, mesh, one)
    # and CogVideoX's decoder programs (their outputs, the carried conv cache among them, were once replicated)
    mesh, one = run["cogvideox_vae"]["8"], run["cogvideox_vae"]["1"]
    assert len(mesh) == len(one) == 2
    for on_mesh, alone in zip(mesh, one):
        assert on_mesh["output_bytes"] <= alone["output_bytes"] / 4, (on_mesh, alone)
