"""``runtime.attach.context_parallel``: diffusers' parallel configs read as a ``(dp, sp, tp)`` mesh (the 8-device
run is in ``tests/runtime/test_mesh.py``)."""

import pytest
from diffusers import ContextParallelConfig, ParallelConfig

from diffusers_tpu.runtime.attach import context_parallel


def test_ulysses_and_ring_degrees_become_sp_and_the_rest_dp():
    current = {"dp": 2, "sp": 1, "tp": 4}
    assert context_parallel.mesh_for(ContextParallelConfig(ulysses_degree=2), 8, current, 4) == {
        "dp": 1,
        "sp": 2,
        "tp": 4,
    }
    both = ParallelConfig(context_parallel_config=ContextParallelConfig(ulysses_degree=2, ring_degree=2))
    assert context_parallel.mesh_for(both, 8, current, 4) == {"dp": 2, "sp": 4, "tp": 1}  # tp 4 leaves no room
    assert context_parallel.mesh_for(ContextParallelConfig(ring_degree=8), 8, current, 4) == {"dp": 1, "sp": 8, "tp": 1}


def test_degrees_the_devices_cannot_hold_are_refused_naming_meshes_that_fit():
    with pytest.raises(ValueError, match=r"splits the sequence over 3 devices; this pipeline runs on 8") as refused:
        context_parallel.mesh_for(ContextParallelConfig(ulysses_degree=3), 8, {"dp": 8, "sp": 1, "tp": 1}, 4)
    assert "{'dp': 1, 'sp': 8, 'tp': 1}" in str(refused.value)  # what fits, named
    assert "ContextParallelConfig(ulysses_degree=8)" in str(refused.value)
