"""``runtime.call.schedulers``: tables device timesteps index moved for a call and back, the latents' dtype kept,
and a scheduler that is a plain host object between calls."""

import torch
from diffusers import DDIMScheduler, FlowMatchEulerDiscreteScheduler

from diffusers_tpu.interop import backend
from diffusers_tpu.runtime.call import schedulers


class MyDDIM(DDIMScheduler):  # a user's subclass keeps its base's tables
    pass


def test_ddim_tables_go_to_the_devices_unchanged_and_come_back_as_they_were():
    for kind in (DDIMScheduler, MyDDIM):
        scheduler = kind()
        table, final = scheduler.alphas_cumprod, scheduler.final_alpha_cumprod
        with backend.jax_mode():
            undo = schedulers.place(scheduler)
            assert len(undo) == 2 and backend.is_jax_tensor(scheduler.alphas_cumprod)
            torch.testing.assert_close(schedulers._on_host(scheduler.alphas_cumprod), table, rtol=0, atol=0)
            for step in undo:
                step()
        assert scheduler.alphas_cumprod is table and scheduler.final_alpha_cumprod is final


def test_a_scheduler_without_device_tables_is_left_alone():
    scheduler = FlowMatchEulerDiscreteScheduler()
    before = dict(vars(scheduler))
    with backend.jax_mode():
        assert schedulers.place(scheduler) == []
    assert vars(scheduler) == before


def test_keep_dtype_casts_latents_not_timesteps_and_is_undone():
    scheduler = FlowMatchEulerDiscreteScheduler()
    scheduler.set_timesteps(4)
    seen = []
    stock_step = scheduler.step

    def recording_step(output, timestep, sample, **kwargs):
        seen.append((output.dtype, timestep.dtype, sample.dtype))
        return stock_step(output, timestep, sample, **kwargs)

    object.__setattr__(scheduler, "step", recording_step)
    undo = schedulers.keep_dtype(scheduler, torch.bfloat16)
    latents = torch.randn(1, 4, 2, 8, 8)
    out = scheduler.step(latents, scheduler.timesteps[0], latents, return_dict=False)[0]
    assert seen == [(torch.bfloat16, scheduler.timesteps.dtype, torch.bfloat16)] and out.dtype == torch.bfloat16
    for step in undo:
        step()
    assert "step" not in vars(scheduler)  # the class's own method again


def test_to_host_leaves_no_device_tensor_on_the_scheduler():
    scheduler = FlowMatchEulerDiscreteScheduler()
    scheduler.set_timesteps(3)
    with backend.jax_mode():
        sigmas = scheduler.sigmas.clone()
        scheduler.sigmas = backend.wrap(backend.host_to_jax(sigmas))
        scheduler.history = [backend.wrap(backend.host_to_jax(sigmas)), 3]
    schedulers.to_host(scheduler)
    assert not backend.is_jax_tensor(scheduler.sigmas) and scheduler.sigmas.device.type == "cpu"
    torch.testing.assert_close(scheduler.sigmas, sigmas, rtol=0, atol=0)
    assert not backend.is_jax_tensor(scheduler.history[0]) and scheduler.history[1] == 3
