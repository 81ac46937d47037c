"""Train the demo model: a stock ``WanTransformer3DModel`` learns, by flow matching, to draw the clips of ``scenes``.

    python -m diffusers_tpu.demo.train --output DIR [--steps 32000]
    python -m diffusers_tpu.demo.train --init DIR --steps 16000 --output SHIPPED   # the shipped weights: both runs

Deterministic (seeded data, init and noise; torch on the CPU). The text encoder and VAE are built, not trained
(``build``); text embeddings are computed once per caption through the stock pipeline's own ``encode_prompt`` so
training sees exactly what generation will. 10% of the samples use the empty caption (the default negative prompt),
which is what classifier-free guidance needs. Noise levels are drawn as the sampler visits them (uniform steps through
the shifted schedule, shift 3): most of the effort goes to the high-noise steps where layout, colour, shape and
direction are decided, and the last, low-noise steps (which clean the background) are trained too — a logit-normal
draw gave them < 1% of the samples and left patch speckle. The saved weights are the moving average of the trained
ones (``recipe.EMA_DECAY``).
"""

from __future__ import annotations

import argparse
import copy
import time

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel

from . import CALL, build, scenes
from .recipe import CLIP_NORM, LEARNING_RATE, WEIGHT_DECAY, ema_decay, schedule_factor
from .train_jax import jax_steps

# One temporal patch spans the whole clip (5 latent frames = the 9 frames of ``CALL``): each token draws its 4x4
# latent pixels through all frames, so the direction word steers a pattern inside a token, as the colour word does.
# With one-frame patches (six runs, up to 3,000 steps) the direction had to steer a shift between tokens through
# RoPE attention, and a model this size never learned it. Width 256 holds a token's 240 values (5x4x4x3).
TRANSFORMER = dict(
    patch_size=(5, 4, 4),
    num_attention_heads=4,
    attention_head_dim=64,
    in_channels=3,
    out_channels=3,
    text_dim=build.TEXT_ENCODER["d_model"],
    freq_dim=64,
    ffn_dim=512,
    num_layers=4,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    rope_max_seq_len=64,
)
SHIFT = 3.0


def new_pipeline(seed: int = 0):
    """The untrained demo pipeline (stock ``WanPipeline``): random transformer, built VAE and text encoder."""
    torch.manual_seed(seed)
    transformer = WanTransformer3DModel(**TRANSFORMER).eval()
    return WanPipeline(
        transformer=transformer,
        vae=build.pixel_vae(),
        text_encoder=build.text_encoder(seed + 1),
        tokenizer=build.word_tokenizer(scenes.vocabulary()),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=SHIFT),
    )


def _embeddings(pipe, prompts: list[str]) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        return {
            p: pipe.encode_prompt(
                p, do_classifier_free_guidance=False, device="cpu", max_sequence_length=CALL["max_sequence_length"]
            )[0][0]
            for p in prompts
        }


def _partial(item, dropped) -> str:
    """The caption with the words of the ``dropped`` attributes (0 colour, 1 shape, 2 direction) left out."""
    colour, shape, direction = (None if i in dropped else word for i, word in enumerate(item))
    return " ".join(w for w in ("a", colour, shape, "moves", direction) if w is not None)


def batches(pipe, steps: int, batch: int, seed: int, attribute_dropout: float = 0.0):
    """``steps`` training batches ``(noisy, sigma, context, target)`` (torch tensors), the same on every platform:
    rendered clips, caption embeddings (10% empty), noise levels as the sampler's steps visit them, flow-matching
    targets. ``attribute_dropout``: each of a caption's colour, shape and direction words is left out with this
    probability ("a red moves left" for a red square), so that each word's meaning is learnt apart from the others:
    the held-out colour/direction pairs are drawn from words the model never saw together."""
    latent_frames = (CALL["num_frames"] - 1) // pipe.vae_scale_factor_temporal + 1
    size = CALL["height"] // pipe.vae_scale_factor_spatial
    items = scenes.captions(held_out=False)
    partial = [(i, d) for i in items for d in _subsets() if d] if attribute_dropout else []
    texts = _embeddings(pipe, [scenes.caption(*item) for item in items] + [""] + [_partial(i, d) for i, d in partial])
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)

    def text_of(pick) -> str:
        if rng.random() < 0.1:
            return ""
        if not attribute_dropout:
            return scenes.caption(*pick)
        return _partial(pick, tuple(i for i in range(3) if rng.random() < attribute_dropout))

    for _ in range(steps):
        picks = [items[i] for i in rng.integers(len(items), size=batch)]
        clips = torch.from_numpy(np.stack([scenes.render(*p, latent_frames, size, rng) for p in picks]))
        context = torch.stack([texts[text_of(p)] for p in picks])
        noise = torch.randn(clips.shape, generator=generator)
        u = torch.rand(batch, generator=generator)  # the sampler's steps are uniform in u before the shift
        sigma = SHIFT * u / (1 + (SHIFT - 1) * u)
        s = sigma.view(-1, 1, 1, 1, 1)
        yield (1 - s) * clips + s * noise, sigma, context, noise - clips


def _subsets() -> list[tuple[int, ...]]:
    return [tuple(i for i in range(3) if mask >> i & 1) for mask in range(8)]


def train(
    pipe,
    steps: int,
    batch: int,
    seed: int,
    log_every: int = 50,
    save_every: int = 0,
    output: str | None = None,
    step_function=None,
    learning_rate: float = LEARNING_RATE,
    attribute_dropout: float = 0.0,
) -> list[float]:
    """Train ``pipe.transformer``; returns the losses and leaves the averaged weights in it. ``step_function(
    transformer, steps, learning_rate)`` (``learning_rate``: the schedule's peak) gives ``step(index, noisy, sigma,
    context, target) -> loss`` and ``averaged() -> {name: tensor}``, the moving average so far (default: torch's
    AdamW; ``demo.train_jax`` runs on JAX). ``attribute_dropout``: ``batches``."""
    transformer = pipe.transformer
    transformer.train()
    step_function = step_function or torch_steps
    step, averaged = step_function(transformer, steps, learning_rate)
    losses, start = [], time.perf_counter()
    for index, data in enumerate(batches(pipe, steps, batch, seed, attribute_dropout)):
        losses.append(step(index, *data))
        if (index + 1) % log_every == 0:
            print(
                f"step {index + 1}/{steps} loss {np.mean(losses[-log_every:]):.4f} "
                f"({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
        if save_every and (index + 1) % save_every == 0 and index + 1 < steps:
            save(pipe, f"{output}-step{index + 1}", averaged())
    _load(transformer, averaged())
    transformer.eval()
    return losses


def _load(transformer, weights: dict) -> None:
    with torch.no_grad():
        for name, p in transformer.named_parameters():
            p.copy_(weights[name])


def torch_steps(transformer, steps: int, learning_rate: float = LEARNING_RATE):
    """AdamW with gradient clipping, on torch, updating ``transformer`` in place; the average is kept beside it."""
    optimizer = torch.optim.AdamW(transformer.parameters(), lr=learning_rate, weight_decay=WEIGHT_DECAY)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: schedule_factor(s, steps))
    average = {name: p.detach().clone() for name, p in transformer.named_parameters()}

    def step(index, noisy, sigma, context, target) -> float:
        prediction = transformer(noisy, timestep=sigma * 1000, encoder_hidden_states=context, return_dict=False)[0]
        loss = torch.nn.functional.mse_loss(prediction, target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(transformer.parameters(), CLIP_NORM)
        optimizer.step()
        schedule.step()
        with torch.no_grad():
            decay = ema_decay(index)
            for name, p in transformer.named_parameters():
                average[name].mul_(decay).add_(p.detach(), alpha=1 - decay)
        return float(loss.detach())

    return step, lambda: {name: a.clone() for name, a in average.items()}


def save(pipe, folder: str, weights: dict | None = None) -> None:
    """``save_pretrained`` with the transformer's weights (``weights`` if given) stored in float16 (7.7 MB instead of
    15: the package ships them); ``demo.load_pipeline`` reads them back as float32."""
    transformer = pipe.transformer
    stored = copy.deepcopy(transformer)
    if weights is not None:
        _load(stored, weights)
    # torch's own ``Module.to``: diffusers' warns that modules it keeps in float32 are cast, which is the point here
    pipe.transformer = torch.nn.Module.to(stored, torch.float16)
    try:
        pipe.save_pretrained(folder, safe_serialization=True)
    finally:
        pipe.transformer = transformer
    build.portable_tokenizer(folder)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m diffusers_tpu.demo.train")
    parser.add_argument("--output", required=True, help="folder for the trained pipeline (save_pretrained)")
    parser.add_argument("--steps", type=int, default=32000)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--attribute-dropout",
        type=float,
        default=0.0,
        help="leave each caption word (colour, shape, direction) out with this probability (default 0)",
    )
    parser.add_argument(
        "--learning-rate", type=float, default=LEARNING_RATE, help="the schedule's peak (warm-up, then cosine to 10%%)"
    )
    parser.add_argument("--init", help="start from this saved demo pipeline's transformer (continue a run)")
    parser.add_argument("--save-every", type=int, default=0, help="also save OUTPUT-stepN every N steps")
    parser.add_argument(
        "--platform",
        choices=("torch", "jax"),
        default="torch",
        help="torch (the shipped weights) or jax: the same training traced through torchax",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: the shipped weights are what one thread computes)",
    )
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch < 1 or args.threads < 1:
        parser.error("--steps, --batch and --threads must be at least 1")
    if not args.learning_rate > 0:
        parser.error("--learning-rate must be positive")
    if not 0 <= args.attribute_dropout < 1:
        parser.error("--attribute-dropout must be in [0, 1)")
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    pipe = new_pipeline(args.seed)
    if args.init:
        pipe.transformer = WanTransformer3DModel.from_pretrained(
            args.init, subfolder="transformer", dtype=torch.float32
        ).eval()  # stored float16
    count = sum(p.numel() for p in pipe.transformer.parameters())
    print(f"training a {count / 1e6:.2f}M-parameter WanTransformer3DModel for {args.steps} steps", flush=True)
    step_function = jax_steps if args.platform == "jax" else None
    train(
        pipe,
        args.steps,
        args.batch,
        args.seed,
        save_every=args.save_every,
        output=args.output,
        step_function=step_function,
        learning_rate=args.learning_rate,
        attribute_dropout=args.attribute_dropout,
    )
    save(pipe, args.output)
    print(f"saved to {args.output}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
