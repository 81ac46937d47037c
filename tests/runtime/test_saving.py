"""``save_pretrained`` of a moved pipeline's parts: what it writes is the host weights, for a model nested in a
component too (``MultiAdapter`` saves each of its adapters with their own ``save_pretrained``)."""

import diffusers
import torch

from diffusers_tpu.testing import tiny_parts, tiny_unet


def test_a_moved_multi_adapter_saves_each_adapter(tmp_path):
    sd, _ = tiny_unet.pipeline("sd")
    adapters = [
        tiny_parts.seeded(seed, lambda: diffusers.T2IAdapter(channels=[32, 64], num_res_blocks=1, downscale_factor=2))
        for seed in (1, 2)
    ]
    host = [{k: v.clone() for k, v in a.state_dict().items()} for a in adapters]
    parts = {k: v for k, v in sd.components.items() if k not in ("image_encoder",)}
    pipe = diffusers.StableDiffusionAdapterPipeline(**parts, adapter=diffusers.MultiAdapter(adapters))
    pipe.to("jax")
    folder = str(tmp_path / "adapter")
    pipe.adapter.save_pretrained(folder, safe_serialization=False)  # torch.save of each adapter's state_dict
    for index, expected in enumerate(host):
        folder = folder if index == 0 else f"{folder}_{index}"
        saved = diffusers.T2IAdapter.from_pretrained(folder).state_dict()
        assert all(torch.equal(saved[k], v) for k, v in expected.items())
    pipe.to("cpu")
