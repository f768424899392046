"""The default model for each sample format. They are small on purpose: replace them.

Each takes ``(input, mask=None)`` as the training step passes it and returns class logits.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def _conv_block(cin: int, cout: int) -> nn.Sequential:
    # GroupNorm, not BatchNorm: independent of the batch size, so a batch that lost samples
    # to the bad-sample filter (even all of them) still trains in step with the other ranks.
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False),
        nn.GroupNorm(8, cout),
        nn.ReLU(inplace=True),
    )


class SmallCNN(nn.Module):
    """Four stride-2 conv blocks and global average pooling: works at any image size."""

    def __init__(self, num_classes: int, width: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _conv_block(3, width),
            _conv_block(width, width * 2),
            _conv_block(width * 2, width * 4),
            _conv_block(width * 4, width * 4),
        )
        self.head = nn.Linear(width * 4, num_classes)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


class MLP(nn.Module):
    """Flatten, two hidden layers, logits."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 256) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_features, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, hidden),
            nn.ReLU(inplace=True),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.net(x)


class SequenceCNN(nn.Module):
    """Byte embedding, two 1-D convolutions, mean over the real (unpadded) tokens."""

    def __init__(self, num_classes: int, vocab_size: int = 256, dim: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.conv = nn.Sequential(
            nn.Conv1d(dim, dim * 2, 5, padding=2),
            nn.ReLU(inplace=True),
            nn.Conv1d(dim * 2, dim * 2, 5, padding=2),
            nn.ReLU(inplace=True),
        )
        self.head = nn.Linear(dim * 2, num_classes)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.conv(self.embed(x).transpose(1, 2)).transpose(1, 2)  # (N, L, C)
        if mask is None:
            mask = torch.ones(x.shape, dtype=torch.bool, device=x.device)
        m = mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * m).sum(1) / m.sum(1).clamp(min=1)
        return self.head(pooled)


def build_model(format_name: str, num_classes: int, sample_shape: tuple[int, ...]) -> nn.Module:
    """The default model for a format.

    Args:
        format_name (str): image | tensor | sequence.
        num_classes (int): outputs of the last layer.
        sample_shape (tuple): one sample's input shape (used by the tensor MLP).
    """
    if format_name == "image":
        return SmallCNN(num_classes)
    if format_name == "tensor":
        return MLP(math.prod(sample_shape), num_classes)
    if format_name == "sequence":
        return SequenceCNN(num_classes)
    raise ValueError(f"data format {format_name!r} is unknown (expected image, tensor or sequence)")
