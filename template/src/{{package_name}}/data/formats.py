"""Sample formats: bytes -> tensor decoders and the collate that batches them.

Every source (a file, a database row, a tar member) hands a format the raw bytes of one
sample, so decoding is written once here and shared by all sources.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info
from torchvision.io import ImageReadMode, decode_image


class ImageFormat:
    """JPEG/PNG bytes -> uint8 CHW RGB tensor (normalised later, on the device).

    Args:
        image_size (int): side of the square crop the transforms produce.
    """

    name = "image"
    extensions = (".jpg", ".jpeg", ".png")

    def __init__(self, image_size: int) -> None:
        self.image_size = image_size

    def decode(self, data: bytes) -> torch.Tensor:
        if not data:
            raise ValueError("empty image file")
        return decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)

    def sample_shape(self) -> tuple[int, ...]:
        return (3, self.image_size, self.image_size)

    def collate(self, samples: list[dict]) -> dict[str, Any]:
        return _stack(samples, self.sample_shape(), torch.uint8)


class TensorFormat:
    """``.npy`` bytes -> float32 tensor of one fixed shape (``allow_pickle=False``).

    Args:
        shape (tuple, optional): the expected shape; ``None`` takes the first decoded sample's.
    """

    name = "tensor"
    extensions = (".npy",)

    def __init__(self, shape: tuple[int, ...] | None = None) -> None:
        self.shape = None if shape is None else tuple(shape)

    def decode(self, data: bytes) -> torch.Tensor:
        array = np.load(io.BytesIO(data), allow_pickle=False)
        if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
            raise ValueError(f"array dtype {array.dtype} is not numeric")
        if self.shape is None:
            self.shape = tuple(array.shape)
        elif tuple(array.shape) != self.shape:
            raise ValueError(f"array shape {tuple(array.shape)} differs from the dataset's {self.shape}")
        return torch.from_numpy(array.astype(np.float32, copy=False))

    def sample_shape(self) -> tuple[int, ...]:
        if self.shape is None:
            raise RuntimeError("TensorFormat.shape is unknown until a sample has been decoded")
        return self.shape

    def collate(self, samples: list[dict]) -> dict[str, Any]:
        return _stack(samples, self.sample_shape(), torch.float32)


class SequenceFormat:
    """UTF-8 text bytes -> byte-level token ids (uint8 values 0..255, int64 once batched).

    Texts longer than ``max_len`` bytes are truncated by the transform; the collate pads to
    the longest text in the batch with 0 and returns ``mask`` (True on real tokens).
    """

    name = "sequence"
    extensions = (".txt",)
    vocab_size = 256

    def decode(self, data: bytes) -> torch.Tensor:
        data.decode("utf-8")  # raises UnicodeDecodeError on bad text; ids are the raw bytes
        if not data:
            raise ValueError("empty text")
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)

    def sample_shape(self) -> tuple[int, ...]:
        return (0,)  # variable length

    def collate(self, samples: list[dict]) -> dict[str, Any]:
        longest = max((len(s["input"]) for s in samples), default=0)
        tokens = torch.zeros((len(samples), longest), dtype=torch.int64)
        mask = torch.zeros((len(samples), longest), dtype=torch.bool)
        for row, s in enumerate(samples):
            n = len(s["input"])
            tokens[row, :n] = s["input"]
            mask[row, :n] = True
        return {
            "input": tokens,
            "mask": mask,
            "target": torch.tensor([s["target"] for s in samples], dtype=torch.int64),
            "key": [s["key"] for s in samples],
        }


def _stack(samples: list[dict], shape: tuple[int, ...], dtype: torch.dtype) -> dict[str, Any]:
    if samples:
        inputs = torch.stack([s["input"] for s in samples])
    else:  # every sample of the batch was bad: keep the shape so the step still runs
        inputs = torch.empty((0, *shape), dtype=dtype)
    return {
        "input": inputs,
        "target": torch.tensor([s["target"] for s in samples], dtype=torch.int64),
        "key": [s["key"] for s in samples],
    }


class SkipBadCollate:
    """Batch the good samples and carry the bad ones' ``(key, reason)`` in ``batch["bad"]``.

    # NOTE [ Bad samples travel with the batch ]
    # A worker process cannot stop the run or keep a count the main process sees, so a
    # sample that fails to read or decode becomes ``{"key", "bad"}`` and rides along with
    # its batch; the training loop counts them in one place (``BadSampleBudget``).
    # ``batch["worker"]`` says which worker made the batch, so a resumed stream knows how many
    # rows each worker had consumed.
    """

    def __init__(self, collate) -> None:
        self.collate = collate

    def __call__(self, samples: list[dict]) -> dict[str, Any]:
        good = [s for s in samples if "bad" not in s]
        batch = self.collate(good)
        batch["bad"] = [(s["key"], s["bad"]) for s in samples if "bad" in s]
        info = get_worker_info()
        batch["worker"] = info.id if info is not None else 0
        return batch


def fix_tensor_shape(fmt, payloads: list[bytes], where: str) -> None:
    """Set a TensorFormat's shape from the first decodable payload, before any worker forks.

    Every worker then checks samples against one shape (the train split's), instead of each
    adopting whatever its first sample happens to be.
    """
    if not isinstance(fmt, TensorFormat) or fmt.shape is not None:
        return
    errors = []
    for data in payloads:
        try:
            fmt.decode(data)
            return
        except Exception as e:
            errors.append(f"{type(e).__name__}: {e}")
    raise ValueError(f"no readable .npy among the first {len(payloads)} train samples of {where}: {errors[:3]}")


def build_format(name: str, image_size: int = 64):
    """The format object for ``data_format`` ``name`` (image | tensor | sequence)."""
    if name == "image":
        return ImageFormat(image_size)
    if name == "tensor":
        return TensorFormat()
    if name == "sequence":
        return SequenceFormat()
    raise ValueError(f"data format {name!r} is unknown (expected image, tensor or sequence)")
