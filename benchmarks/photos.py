"""Synthetic photos of realistic size and weight for the loader benchmark.

    .venv/bin/python benchmarks/photos.py OUT [--images 2400]   # OUT/{train,val}/<class>/*.jpg

Each image is a smooth two-colour gradient with a few blended ellipses and sensor-like noise,
each side drawn from 400 to 600 px, JPEG quality 90: about 2.5 bits per pixel (60-90 KB),
in the range of photos of that size saved at that quality, so decoding costs what it does on photos.
:func:`write_large` writes 3000 x 2250 ones for the reduced-scale decode row.
"""

from __future__ import annotations

import argparse
import io
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

CLASSES = 8
SIDES = (400, 600)  # each side of a photo is drawn from this range
NOISE_TILE = 1024  # side of the noise bank a window is taken from (fresh noise per image is slow)


def photo(rng: np.random.Generator, width: int, height: int, noise: np.ndarray) -> np.ndarray:
    """An HWC uint8 photo-like image: gradient, ellipses, noise."""
    angle = rng.uniform(0, 2 * np.pi)
    ramp = np.linspace(0, np.sin(angle), height, dtype=np.float32)[:, None]
    ramp = ramp + np.linspace(0, np.cos(angle), width, dtype=np.float32)[None, :]
    ramp = (ramp - ramp.min()) / (np.ptp(ramp) + 1e-6)
    low, high = (rng.uniform(0, 255, 3).astype(np.float32) for _ in range(2))
    img = low + (high - low) * ramp[..., None]
    for _ in range(int(rng.integers(4, 9))):
        rx, ry = int(rng.uniform(15, width / 4)), int(rng.uniform(15, height / 4))
        cx, cy = int(rng.uniform(rx, width - rx)), int(rng.uniform(ry, height - ry))
        yy, xx = np.ogrid[-ry:ry, -rx:rx]
        inside = (xx / rx) ** 2 + (yy / ry) ** 2 < 1
        box = img[cy - ry : cy + ry, cx - rx : cx + rx]
        box[inside] = box[inside] * 0.3 + rng.uniform(0, 180, 3).astype(np.float32)
    if height > NOISE_TILE or width > NOISE_TILE:  # larger than the bank: its own noise
        img += _noise(int(rng.integers(2**31)), (height, width))
    else:
        y0 = int(rng.integers(0, NOISE_TILE - height + 1))
        x0 = int(rng.integers(0, NOISE_TILE - width + 1))
        img += noise[y0 : y0 + height, x0 : x0 + width]
    return np.clip(img, 0, 255).astype(np.uint8)


def _noise(seed: int, shape: tuple[int, int] = (NOISE_TILE, NOISE_TILE)) -> np.ndarray:
    rng = np.random.default_rng([seed, 1])
    grain = rng.standard_normal((*shape, 1), dtype=np.float32) * 6  # luminance grain
    return grain + rng.standard_normal((*shape, 3), dtype=np.float32) * 3


def jpeg(hwc: np.ndarray, quality: int = 90) -> bytes:
    """An HWC uint8 RGB image as JPEG bytes (PIL: libjpeg-turbo, 4:2:0 chroma; the same bytes as torchvision's
    deprecated ``encode_jpeg`` at that quality)."""
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(hwc).save(out, "JPEG", quality=quality)
    return out.getvalue()


def _write_part(out: str, jobs: list[tuple[str, int, int]], seed: int, sides: tuple[int, int]) -> int:
    noise, written = _noise(seed), 0
    for split, label, index in jobs:
        rng = np.random.default_rng([seed, label, index, split == "val"])
        width, height = (int(s) for s in rng.integers(sides[0], sides[1] + 1, 2))
        path = Path(out, split, f"class_{label}", f"{index:06d}.jpg")
        path.write_bytes(jpeg(photo(rng, width, height, noise)))
        written += path.stat().st_size
    return written


def write_photos(out: str | os.PathLike, train: int, val: int, seed: int = 0, workers: int = 2) -> int:
    """Write ``train`` + ``val`` photos as ``out/{train,val}/class_<k>/<n>.jpg``; returns the bytes written."""
    jobs = [(split, i % CLASSES, i) for split, count in (("train", train), ("val", val)) for i in range(count)]
    for split in ("train", "val"):
        for label in range(CLASSES):
            Path(out, split, f"class_{label}").mkdir(parents=True, exist_ok=True)
    parts = [jobs[w::workers] for w in range(workers)]
    with ProcessPoolExecutor(workers) as pool:
        return sum(pool.map(_write_part, [os.fspath(out)] * workers, parts, [seed] * workers, [SIDES] * workers))


def write_large(out: str | os.PathLike, count: int, seed: int = 0) -> list[Path]:
    """Write ``count`` 3000 x 2250 JPEGs (quality 90) into ``out``; returns their paths."""
    Path(out).mkdir(parents=True, exist_ok=True)
    noise, paths = _noise(seed), []
    for i in range(count):
        rng = np.random.default_rng([seed, 99, i])
        path = Path(out, f"large_{i:03d}.jpg")
        path.write_bytes(jpeg(photo(rng, 3000, 2250, noise)))
        paths.append(path)
    return paths


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--images", type=int, default=2400, help="train images (val: a tenth)")
    args = p.parse_args()
    size = write_photos(args.out, args.images, max(CLASSES, args.images // 10))
    print(f"wrote {args.images} train photos ({size / 1e6:.0f} MB with val) to {args.out}")


if __name__ == "__main__":
    main()
