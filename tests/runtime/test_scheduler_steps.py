"""Scheduler steps as compiled programs (``runtime/call/scheduler_steps.py``): stock's result for every scheduler the
supported pipelines use, one program for the many steps that take one path, random draws from the call's generator
as stock makes them, nothing compiled the second time, and stock's eager step where no program can carry the state."""

import copy

import diffusers
import numpy as np
import pytest
import torch

from diffusers_tpu.interop import backend, compile_accounting
from diffusers_tpu.runtime.call import schedulers
from diffusers_tpu.runtime.call.scheduler_steps import CompiledSchedulerMethod

STEPS = 10


def stand_in_model(x, t):
    """A deterministic denoiser: enough to drive every branch of a step."""
    return torch.tanh(x * 0.7) * 0.5 + 0.1


def run(scheduler, compiled: bool, seed: int = 0, steps: int = STEPS, generator: bool = True, held=None):
    """The denoising loop of a pipeline around ``scheduler`` (stock torch on the host, or compiled on JAX as a pipeline
    call installs it: ``held`` keeps the programs from an earlier loop); the final sample and the compiled methods."""
    held = {} if held is None else held
    undo = schedulers.compile_steps(scheduler, held) if compiled else []
    scheduler.set_timesteps(steps)
    draw = torch.Generator().manual_seed(seed) if generator else None
    x = torch.randn(2, 4, 6, 6, generator=torch.Generator().manual_seed(1)) * getattr(
        scheduler, "init_noise_sigma", 1.0
    )
    takes_generator = "generator" in type(scheduler).step.__code__.co_varnames
    methods = held[id(scheduler)][1] if compiled else {}
    with backend.jax_mode() if compiled else torch.no_grad():
        timesteps = scheduler.timesteps
        if compiled:
            x, timesteps = backend.wrap(backend.host_to_jax(x)), backend.wrap(backend.host_to_jax(timesteps))
        for t in timesteps:
            model_input = scheduler.scale_model_input(x, t) if hasattr(scheduler, "scale_model_input") else x
            extra = {"generator": draw} if takes_generator else {}
            x = scheduler.step(stand_in_model(model_input, t), t, x, return_dict=False, **extra)[0]
        result = np.asarray(backend.to_jax_array(x)) if compiled else x.numpy()
    for step in undo:
        step()
    return result, methods


def close(ours, stock) -> float:
    return float(np.abs(ours - stock).max() / max(np.abs(stock).max(), 1.0))


# (class, config, most programs its methods may compile for STEPS steps: shared across steps where the Python allows;
# a schedule's first step, which finds its counter, is one of them)
SHARED = [
    (diffusers.UniPCMultistepScheduler, {}, 4),
    (
        diffusers.UniPCMultistepScheduler,
        dict(prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=3.0),
        4,
    ),
    (diffusers.FlowMatchEulerDiscreteScheduler, dict(shift=7.0), 2),
    (diffusers.DPMSolverMultistepScheduler, {}, 4),
    (diffusers.DPMSolverMultistepScheduler, dict(algorithm_type="sde-dpmsolver++"), 4),
    (diffusers.EulerAncestralDiscreteScheduler, {}, 3),
    (diffusers.HeunDiscreteScheduler, {}, 5),
    (diffusers.KDPM2AncestralDiscreteScheduler, {}, 6),
    (diffusers.FlowMatchLCMScheduler, {}, 2),
    (diffusers.EDMDPMSolverMultistepScheduler, {}, 7),
]
# the Python reads a schedule value (``if prev_timestep >= 0``, ``s_tmin <= sigma``): one program per step
PER_STEP = [
    diffusers.DDIMScheduler,
    diffusers.DDPMScheduler,
    diffusers.EulerDiscreteScheduler,
    diffusers.LCMScheduler,
    diffusers.PNDMScheduler,
    diffusers.LMSDiscreteScheduler,
    diffusers.TCDScheduler,
    diffusers.DEISMultistepScheduler,
    diffusers.DPMSolverSinglestepScheduler,
    diffusers.CogVideoXDDIMScheduler,
]


@pytest.mark.parametrize("cls, config, most", SHARED, ids=lambda v: getattr(v, "__name__", None) or str(v)[:30])
def test_steps_that_take_one_path_share_a_program(cls, config, most):
    stock, _ = run(cls(**config), compiled=False)
    scheduler, held = cls(**config), {}
    ours, methods = run(scheduler, compiled=True, held=held)
    assert close(ours, stock) <= 1e-5
    step = methods["step"]
    calls = STEPS * (2 if cls.__name__.startswith(("Heun", "KDPM2")) else 1) - (1 if "KDPM2" in cls.__name__ else 0)
    assert step.eager_reason is None and step.compiled_calls >= calls - 1
    assert 1 <= len(step.shared.executables) <= most
    with compile_accounting.compile_log() as log:  # the same schedule again: nothing new
        again, _ = run(scheduler, compiled=True, held=held)
    assert log.compilations == 0 and close(again, stock) <= 1e-5


@pytest.mark.parametrize("cls", PER_STEP, ids=lambda c: c.__name__)
def test_steps_whose_python_reads_a_schedule_value_run_one_program_each(cls):
    stock, _ = run(cls(), compiled=False)
    ours, methods = run(cls(), compiled=True)
    assert close(ours, stock) <= 1e-5
    step = methods["step"]
    assert step.eager_reason is None and step.compiled_calls >= STEPS - 1
    assert all(not isinstance(v, str) for v in step.programs.values())  # none eager


def test_random_draws_follow_the_calls_generator_and_torchs_default():
    """An ancestral sampler draws noise every step: from the generator the pipeline passes, as stock draws it (other
    seeds, other results), and from torch's default generator when none is passed."""
    cls = diffusers.EulerAncestralDiscreteScheduler
    for seed in (0, 5):
        stock, _ = run(cls(), compiled=False, seed=seed)
        ours, _ = run(cls(), compiled=True, seed=seed)
        assert close(ours, stock) <= 1e-5
    assert close(run(cls(), compiled=True, seed=0)[0], run(cls(), compiled=True, seed=5)[0]) > 1e-3
    torch.manual_seed(3)
    stock, _ = run(cls(), compiled=False, generator=False)
    torch.manual_seed(3)
    ours, _ = run(cls(), compiled=True, generator=False)
    assert close(ours, stock) <= 1e-5


def test_state_no_program_carries_keeps_stocks_eager_step(caplog):
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler(shift=7.0)
    scheduler.helper = object()  # an object of its own: no program can carry it
    stock, _ = run(diffusers.FlowMatchEulerDiscreteScheduler(shift=7.0), compiled=False)
    with caplog.at_level("INFO", logger="diffusers_tpu.runtime.call.scheduler_steps"):
        ours, methods = run(scheduler, compiled=True)
    assert close(ours, stock) <= 1e-5
    assert methods["step"].compiled_calls == 0 and "object" in methods["step"].eager_reason
    assert sum("runs eagerly" in r.message for r in caplog.records) == 1  # named once


def test_a_deep_copied_scheduler_runs_the_originals_programs():
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler(shift=7.0)
    scheduler.set_timesteps(STEPS)
    vars(scheduler)["step"] = original = CompiledSchedulerMethod(scheduler, "step")
    duplicate = copy.deepcopy(scheduler)
    assert duplicate.step is not original and duplicate.step.scheduler is duplicate
    assert duplicate.step.programs is original.programs
    assert copy.deepcopy(vars(scheduler))["step"] is original  # a copied __dict__ put back on the same scheduler


def test_the_signature_is_stocks():
    """Pipelines ask whether ``step`` takes ``eta`` and ``generator`` (CogVideoX, Stable Diffusion)."""
    import inspect

    scheduler = diffusers.CogVideoXDPMScheduler()
    method = CompiledSchedulerMethod(scheduler, "step")
    assert {"eta", "generator"} <= set(inspect.signature(method).parameters)


def run_cogvideox_dpm(compiled: bool, held: dict | None = None):
    """CogVideoX's own loop around its DPM scheduler: the previous step's timestep is ``timesteps[i - 1]``, on JAX a
    view of the timesteps tensor, and the previous prediction is carried from step to step."""
    scheduler, held = diffusers.CogVideoXDPMScheduler(), {} if held is None else held
    undo = schedulers.compile_steps(scheduler, held) if compiled else []
    scheduler.set_timesteps(STEPS)
    draw = torch.Generator().manual_seed(0)
    x, old = torch.randn(2, 4, 6, 6, generator=torch.Generator().manual_seed(1)), None
    with backend.jax_mode() if compiled else torch.no_grad():
        timesteps = scheduler.timesteps
        if compiled:
            x, timesteps = backend.wrap(backend.host_to_jax(x)), backend.wrap(backend.host_to_jax(timesteps))
        for i, t in enumerate(timesteps):
            back = timesteps[i - 1] if i > 0 else None
            x, old = scheduler.step(stand_in_model(x, t), old, t, back, x, generator=draw, return_dict=False)
        result = np.asarray(backend.to_jax_array(x)) if compiled else x.numpy()
    for step in undo:
        step()
    return result, held[id(scheduler)][1] if compiled else {}


def test_cogvideox_dpm_runs_every_step_compiled():
    """Its steps after the first read ``timestep_back``, a view: the per-step program reads its value on the host
    before the trace (inside it the slice was staged, every such step fell back to stock's op-by-op step)."""
    stock, _ = run_cogvideox_dpm(compiled=False)
    ours, methods = run_cogvideox_dpm(compiled=True)
    assert close(ours, stock) <= 1e-5
    step = methods["step"]
    assert step.eager_reason is None and step.compiled_calls == STEPS
    assert all(not isinstance(v, str) for v in step.programs.values())  # none eager


def test_a_draw_found_by_the_first_trace_is_traced_not_computed():
    """The trace that finds a step's random draws stands zeros in for them: made from the program's input, so the
    arithmetic on them is staged too (concrete zeros ran every op on them eagerly, each a program of its own)."""
    import jax

    from diffusers_tpu.runtime.call.scheduler_trace import TraceMode

    seen = []

    def traced(counter):
        with jax.ensure_compile_time_eval(), TraceMode([], recorded := [], [], counter):
            noise = torch.randn(2, 3) * 2.0
        seen.append((len(recorded), backend.to_jax_array(noise)))
        return backend.to_jax_array(noise)

    with backend.jax_mode():
        jax.jit(traced).lower(np.int32(0))
    ((count, array),) = seen
    assert count == 1 and isinstance(array, jax.core.Tracer) and array.shape == (2, 3)
