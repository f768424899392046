"""How training steps compute on the device: precision, loss scaling, memory format.

:func:`setup_compute` applies the usual settings of PyTorch's performance tuning guide on a
GPU and returns the :class:`Compute` that ``train`` and ``bench`` step with:

- mixed precision (``train.amp``): bf16 autocast on GPUs that compute in bf16 natively
  (compute capability 8.0 and later: A100, H100, RTX 30xx and later); fp16 autocast with
  loss scaling on older ones (V100, T4, where bf16 is only emulated, slowly); float32
  otherwise, with TF32 matrix products where the GPU has them;
- cuDNN's autotuner (``cudnn.benchmark``): inputs keep their shape, so the fastest
  convolution kernels are picked once;
- ``channels_last`` for models with 2-d convolutions (faster on tensor cores);
- the fused AdamW kernel (:func:`make_optimizer`), which also takes the loss scale without
  reading it back to the host.

On the CPU everything stays float32 and contiguous.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

NATIVE_BF16 = (8, 0)  # the first compute capability (Ampere) with bf16 tensor cores


def precision_for(amp, device_type: str, capability: tuple[int, int] | None) -> str:
    """``"bf16"``, ``"fp16"`` or ``"fp32"`` for ``train.amp`` on a device.

    >>> [precision_for("auto", "cuda", c) for c in [(9, 0), (7, 5)]] + [precision_for("auto", "cpu", None)]
    ['bf16', 'fp16', 'fp32']
    """
    if device_type != "cuda" or amp is False:
        return "fp32"
    return "bf16" if capability is not None and capability >= NATIVE_BF16 else "fp16"


@dataclass
class Compute:
    """The device, the autocast dtype (``None``: float32), the loss scaler (fp16 only), the memory format."""

    device: torch.device
    dtype: torch.dtype | None = None
    scaler: torch.amp.GradScaler | None = None
    channels_last: bool = False

    @property
    def precision(self) -> str:
        return {torch.bfloat16: "bf16", torch.float16: "fp16", None: "fp32"}[self.dtype]

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def inputs(self, task, batch: dict) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """The model's arguments and the targets on the device (the task's ``to_device``)."""
        inputs, target = task.to_device(batch, self.device)
        if self.channels_last:
            inputs = tuple(x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x for x in inputs)
        return inputs, target

    def backward_and_step(self, loss: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is None:
            loss.backward()
            optimizer.step()
        else:  # fp16: scale the loss so small gradients do not flush to zero; skip steps that overflow
            self.scaler.scale(loss).backward()
            self.scaler.step(optimizer)
            self.scaler.update()


def setup_compute(amp, device: torch.device, model: nn.Module) -> Compute:
    """Apply the GPU settings, move ``model`` to its memory format, and say how steps compute."""
    if device.type != "cuda":
        return Compute(device)
    torch.backends.cudnn.benchmark = True
    torch.set_float32_matmul_precision("high")  # TF32 for float32 matrix products (Ampere and later)
    precision = precision_for(amp, device.type, torch.cuda.get_device_capability(device))
    channels_last = any(isinstance(m, nn.Conv2d) for m in model.modules())
    if channels_last:
        model.to(memory_format=torch.channels_last)
    return Compute(
        device,
        dtype={"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision],
        scaler=torch.amp.GradScaler("cuda") if precision == "fp16" else None,
        channels_last=channels_last,
    )


def make_optimizer(model: nn.Module, lr: float, weight_decay: float, device: torch.device) -> torch.optim.Optimizer:
    """AdamW; on a GPU its fused kernel (one launch for all parameters)."""
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, fused=device.type == "cuda")
