"""Per-split transforms applied to a decoded sample, in the worker.

Images stay uint8 here (4x less to copy to the device than float32); the training step
normalises them on the device with :func:`normalize_on_device`.
"""

from __future__ import annotations

import torch
from torchvision.transforms import v2

# ImageNet statistics, in 0..255 units, applied on the device.
MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)


class Truncate:
    """Keep the first ``max_len`` tokens of a 1-D sequence.

    >>> Truncate(3)(torch.arange(5))
    tensor([0, 1, 2])
    """

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        return tokens[: self.max_len]


def image_transform(split: str, image_size: int):
    """Random-resized crop and flip for training; resize and center crop for validation."""
    if split == "train":
        return v2.Compose(
            [
                v2.RandomResizedCrop(image_size, scale=(0.35, 1.0), antialias=True),
                v2.RandomHorizontalFlip(),
            ]
        )
    return v2.Compose([v2.Resize(round(image_size * 8 / 7), antialias=True), v2.CenterCrop(image_size)])


def build_transform(format_name: str, split: str, image_size: int, max_len: int):
    """The transform for a format and split (``None`` when the sample is used as decoded)."""
    if format_name == "image":
        return image_transform(split, image_size)
    if format_name == "sequence":
        return Truncate(max_len)
    return None


def normalize_on_device(images: torch.Tensor) -> torch.Tensor:
    """uint8 NCHW on any device -> float32 normalised with the ImageNet mean/std."""
    mean = torch.tensor(MEAN, device=images.device).view(1, 3, 1, 1)
    std = torch.tensor(STD, device=images.device).view(1, 3, 1, 1)
    return (images.float() - mean) / std
