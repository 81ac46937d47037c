"""The demo's world: captions from a tiny grammar, the clips they describe, and an analyser that reads a video back.

"a red square moves left": one shape of a named colour crossing a plain dark background in a named direction.
Clips are drawn at the latent resolution (the demo VAE's latents are half-size pixels, see ``build``), so the
training data needs no encoder. The analyser works on any uint8 video: it finds the pixels that differ from the
background, names their mean colour (nearest palette entry), the shape that fits them best (a square or a circle of
their area at their centroid), the direction their centroid travels, and how clean the rest of the frame is.
"""

from __future__ import annotations

import dataclasses

import numpy as np

COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 200, 60),
    "blue": (50, 90, 240),
    "yellow": (235, 215, 40),
    "purple": (160, 60, 210),
    "white": (240, 240, 240),
}
SHAPES = ("square", "circle")
DIRECTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}  # (dx, dy), y grows downwards
BACKGROUND = (24, 24, 32)
# Colour/direction pairs never shown in training (either shape): the held-out half of the accuracy report.
HELD_OUT = (
    ("red", "down"),
    ("green", "left"),
    ("blue", "up"),
    ("yellow", "right"),
    ("purple", "down"),
    ("white", "left"),
)
DEFAULT_PROMPT = "a blue circle moves up"
# Latent pixels a shape moves per latent frame: 12 of 32 over a clip, i.e. 38% of the frame.
STEP = 3.0
# A square's half-width as a share of the frame (jittered by +-15% per clip); a circle's radius is 1.15x that, so
# the two cover about the same area and only their outline tells them apart. At 1/7 (the first model) the outlines
# differ by a few latent pixels and a model trained as long drew squares as circles (shape 60% / 38% held-out).
RADIUS = 0.18
# A background pixel is "clean" within this many levels (per channel) of BACKGROUND.
CLEAN_LEVELS = 8
# A blob or smear away from the shape: a 4-connected patch of pixels more than BLOB_LEVELS off the background, of at
# least BLOB_PIXELS in one frame (0.4% of a 64x64 frame: a speckle is a pixel or two); a video with none keeps a clean
# background (``Reading.blob``).
BLOB_LEVELS, BLOB_PIXELS = 24, 16


def caption(colour: str, shape: str, direction: str) -> str:
    return f"a {colour} {shape} moves {direction}"


def vocabulary() -> list[str]:
    return ["a", "moves", *COLOURS, *SHAPES, *DIRECTIONS]


def captions(held_out: bool) -> list[tuple[str, str, str]]:
    """(colour, shape, direction) of the training set (``held_out=False``) or of the held-out pairs."""
    return [(c, s, d) for c in COLOURS for s in SHAPES for d in DIRECTIONS if ((c, d) in HELD_OUT) == held_out]


def render(
    colour: str, shape: str, direction: str, frames: int, size: int, rng: np.random.Generator, step: float = STEP
) -> np.ndarray:
    """A clip as float32 ``[3, frames, size, size]`` in [-1, 1]: the shape (half-width ~``RADIUS`` of the frame)
    moves ``step`` pixels per frame, starting wherever it stays inside the frame."""
    radius = size * RADIUS * rng.uniform(0.85, 1.15)
    dx, dy = DIRECTIONS[direction]
    travel = step * (frames - 1)
    margin = radius * 1.15 + 0.5
    across = rng.uniform(margin, size - margin)  # the coordinate that stays fixed
    start = rng.uniform(margin, max(margin, size - margin - travel))
    if dx + dy < 0:
        start = size - start
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
    video = np.empty((frames, size, size, 3), np.float32)
    video[:] = BACKGROUND
    for t in range(frames):
        along = start + step * (dx + dy) * t
        cx, cy = (along, across) if dx else (across, along)
        video[t][_outline(shape, xs, ys, cx, cy, radius)] = COLOURS[colour]
    return (video.transpose(3, 0, 1, 2) / 127.5 - 1.0).astype(np.float32)


def _outline(shape: str, xs, ys, cx: float, cy: float, radius: float) -> np.ndarray:
    """The pixels (centres ``xs``, ``ys``) inside a square of half-width ``radius`` or a circle of 1.15x it."""
    if shape == "square":
        return (np.abs(xs - cx) <= radius) & (np.abs(ys - cy) <= radius)
    return (xs - cx) ** 2 + (ys - cy) ** 2 <= (radius * 1.15) ** 2


@dataclasses.dataclass
class Reading:
    colour: str | None  # nearest palette colour of the foreground, None if there is none
    direction: str | None  # dominant axis of the centroid's travel, None if it travels < 10% of the frame
    travel: tuple[float, float]  # centroid displacement (x, y), first to last frame, in frame widths/heights
    coverage: float  # mean fraction of pixels that are foreground
    shape: str | None = None  # the outline (square or circle) that fits the foreground best, None if there is none
    fit: dict = dataclasses.field(default_factory=dict)  # mean intersection-over-union with each outline
    clean: float = 1.0  # share of the pixels away from the shape within CLEAN_LEVELS of the background colour
    blob: int = 0  # pixels of the largest patch away from the shape more than BLOB_LEVELS off the background

    @property
    def clean_background(self) -> bool:
        """No blob or smear away from the shape (``BLOB_PIXELS``)."""
        return self.blob < BLOB_PIXELS

    def follows(self, colour: str, direction: str, shape: str | None = None) -> bool:
        """Colour and direction (and the shape, when one is given) are what was asked."""
        return self.colour == colour and self.direction == direction and (shape is None or self.shape == shape)


def analyse(video) -> Reading:
    """Read a uint8 ``[frames, height, width, 3]`` video (or a list of PIL images)."""
    video = np.stack([np.asarray(f) for f in video]).astype(np.float32)
    frames, height, width, _ = video.shape
    foreground = np.linalg.norm(video - np.asarray(BACKGROUND, np.float32), axis=-1) > 80
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32) + 0.5
    centroids, fits, shape_area = [], {name: [] for name in SHAPES}, np.zeros(foreground.shape, bool)
    for t in range(frames):
        mask = foreground[t]
        if mask.sum() >= max(4, mask.size // 400):
            cx, cy = xs[mask].mean(), ys[mask].mean()
            centroids.append((cx / width, cy / height))
            half = np.sqrt(mask.sum()) / 2  # the square of the foreground's area; the circle of it is 1.15x wider
            for name in SHAPES:
                outline = _outline(name, xs, ys, cx, cy, half if name == "square" else half * 2 / np.sqrt(np.pi) / 1.15)
                fits[name].append((mask & outline).sum() / (mask | outline).sum())
            # the shape and its soft edge (what a 2-pixel margin around it holds) are not background
            shape_area[t] = _outline("circle", xs, ys, cx, cy, half * np.sqrt(2) / 1.15 + 2) | mask
    coverage = float(foreground.mean())
    levels = np.abs(video - np.asarray(BACKGROUND, np.float32)).max(-1) <= CLEAN_LEVELS
    clean = float(levels[~shape_area].mean()) if (~shape_area).any() else 0.0
    dirty = (np.abs(video - np.asarray(BACKGROUND, np.float32)).max(-1) > BLOB_LEVELS) & ~shape_area
    blob = max((_largest_patch(frame) for frame in dirty), default=0)
    if not centroids:
        return Reading(None, None, (0.0, 0.0), coverage, clean=clean, blob=blob)
    fit = {name: float(np.mean(values)) for name, values in fits.items()}
    colour = _name(video[foreground])
    tx, ty = (centroids[-1][0] - centroids[0][0], centroids[-1][1] - centroids[0][1])
    direction = None
    if max(abs(tx), abs(ty)) >= 0.1 and len(centroids) >= frames // 2:
        direction = ("right" if tx > 0 else "left") if abs(tx) >= abs(ty) else ("down" if ty > 0 else "up")
    return Reading(colour, direction, (float(tx), float(ty)), coverage, max(fit, key=fit.get), fit, clean, blob)


def _largest_patch(mask: np.ndarray) -> int:
    """Pixels of the largest 4-connected patch of ``mask`` (a frame's few off-background pixels: a flood fill each)."""
    seen, largest = np.zeros_like(mask), 0
    height, width = mask.shape
    for start in zip(*np.nonzero(mask)):
        if seen[start]:
            continue
        seen[start], stack, size = True, [start], 0
        while stack:
            y, x = stack.pop()
            size += 1
            for ny, nx in ((y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1)):
                if 0 <= ny < height and 0 <= nx < width and mask[ny, nx] and not seen[ny, nx]:
                    seen[ny, nx] = True
                    stack.append((ny, nx))
        largest = max(largest, size)
    return largest


def _name(pixels: np.ndarray) -> str:
    """The palette colour whose blends with the background (``bg + a * (colour - bg)``, 0 <= a <= 1: a shape's
    soft or faded edges included) fit the foreground pixels best."""
    background = np.asarray(BACKGROUND, np.float32)
    offsets = pixels - background
    errors = []
    for name in COLOURS:
        towards = np.asarray(COLOURS[name], np.float32) - background
        a = np.clip(offsets @ towards / (towards @ towards), 0.0, 1.0)
        errors.append(np.linalg.norm(offsets - a[:, None] * towards, axis=-1).mean())
    return list(COLOURS)[int(np.argmin(errors))]
