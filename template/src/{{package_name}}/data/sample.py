"""``sample-data``: a small synthetic dataset that a model can learn, in the project's format.

Each class has its own pattern (image: stripe direction and colour; tensor: a prototype
array; sequence: a vocabulary), plus noise, so a few epochs visibly lower the loss.
"""

from __future__ import annotations

import io
import os

import numpy as np
import torch
from torchvision.io import encode_jpeg, encode_png

CLASSES = ("alpha", "bravo", "charlie", "delta")
TENSOR_SHAPE = (8, 16)
WORDS = (
    ("sun", "bright", "summer", "beach", "warm", "gold", "été", "light"),
    ("rain", "cloud", "grey", "storm", "wet", "umbrella", "drizzle", "fog"),
    ("snow", "ice", "cold", "winter", "frost", "schnee", "glacier", "white"),
    ("wind", "gust", "breeze", "kite", "sail", "whirl", "draught", "blow"),
)


def _image(label: int, size: int, rng: np.random.Generator) -> np.ndarray:
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    freq = rng.uniform(0.25, 0.45)
    phase = rng.uniform(0, 2 * np.pi)
    coord = (yy, xx, xx + yy, xx - yy)[label]
    wave = 0.5 + 0.5 * np.sin(coord * freq + phase)
    colour = np.eye(3, dtype=np.float32)[label % 3] * 0.7 + 0.3 * (label == 3)
    img = wave[..., None] * colour[None, None, :] * 255
    img += rng.normal(0, 20, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def _encode(label: int, index: int, rng: np.random.Generator, fmt: str, image_size: int):
    if fmt == "image":
        chw = torch.from_numpy(_image(label, image_size, rng)).permute(2, 0, 1).contiguous()
        if index % 2:  # both container types appear in the sample data
            return ".png", encode_png(chw).numpy().tobytes()
        return ".jpg", encode_jpeg(chw, quality=90).numpy().tobytes()
    if fmt == "tensor":
        prototype = np.random.default_rng(1000 + label).normal(0, 1, TENSOR_SHAPE)
        array = (prototype + rng.normal(0, 1.0, TENSOR_SHAPE)).astype(np.float32)
        return ".npy", _npy_bytes(array)
    if fmt == "sequence":
        vocab = WORDS[label] + ("the", "and", "of", "a")
        n = int(rng.integers(4, 48))
        text = " ".join(rng.choice(vocab, size=n))
        return ".txt", text.encode("utf-8")
    raise ValueError(f"data format {fmt!r} is unknown (expected image, tensor or sequence)")


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def generate(fmt: str, per_class: dict[str, int], image_size: int = 64, seed: int = 0):
    """Yield ``(split, label, name, ext, payload)`` with the classes interleaved within each split.

    Args:
        fmt (str): image | tensor | sequence.
        per_class (dict): samples per class for each split, e.g. ``{"train": 96, "val": 24}``.
        image_size (int): side of the generated images. Default: 64.
        seed (int): the same seed makes the same samples. Default: 0.
    """
    rng = np.random.default_rng(seed)
    for split, count in per_class.items():
        for index in range(count):
            for label in range(len(CLASSES)):
                ext, payload = _encode(label, index, rng, fmt, image_size)
                yield split, label, f"{index:05d}", ext, payload


def write_folder(out: str, fmt: str, per_class: dict[str, int], image_size: int = 64, seed: int = 0) -> int:
    """Write ``out/<split>/<class>/<n>.<ext>`` (see :func:`generate`); returns the file count."""
    written = 0
    for split, label, name, ext, payload in generate(fmt, per_class, image_size, seed):
        class_dir = os.path.join(out, split, CLASSES[label])
        os.makedirs(class_dir, exist_ok=True)
        with open(os.path.join(class_dir, name + ext), "wb") as f:
            f.write(payload)
        written += 1
    return written


def write_sqlite(path: str, fmt: str, per_class: dict[str, int], image_size: int = 64, seed: int = 0) -> int:
    """Write the ``samples`` table of the stream source to ``path`` (replaced if present)."""
    import sqlite3

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp"
    if os.path.exists(tmp):
        os.remove(tmp)
    conn = sqlite3.connect(tmp)
    try:
        conn.execute("CREATE TABLE samples(id INTEGER PRIMARY KEY, split TEXT, label INTEGER, data BLOB)")
        rows = ((split, label, payload) for split, label, _, _, payload in generate(fmt, per_class, image_size, seed))
        conn.executemany("INSERT INTO samples(split, label, data) VALUES (?, ?, ?)", rows)
        conn.commit()
        written = conn.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
    finally:
        conn.close()
    os.replace(tmp, path)
    return written
