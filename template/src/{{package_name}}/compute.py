# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
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
- the fused optimizer kernel (AdamW's or SGD's, :func:`make_optimizer`), which also takes the
  loss scale without reading it back to the host.

On the CPU everything stays float32 and contiguous. :func:`train_step`, the step both take,
lives here: ``bench`` times it without importing the training loop.
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


def make_optimizer(model: nn.Module, optim, device: torch.device) -> torch.optim.Optimizer:
    """The optimizer ``optim`` (:class:`~.config.OptimConfig`) names; on a GPU its fused kernel
    (one launch for all parameters)."""
    fused = device.type == "cuda"
    if optim.name == "sgd":
        return torch.optim.SGD(
            model.parameters(),
            lr=optim.lr,
            momentum=optim.momentum,
            nesterov=optim.momentum > 0,
            weight_decay=optim.weight_decay,
            fused=fused,
        )
    return torch.optim.AdamW(model.parameters(), lr=optim.lr, weight_decay=optim.weight_decay, fused=fused)


def train_step(model, task, optimizer, batch: dict, compute: Compute, weight: float = 1.0) -> torch.Tensor:
    """Forward, backward and an optimizer step on one batch; returns the (detached) mean loss.

    ``weight=0`` is a stand-in step: it takes part in DDP's all-reduce with zero gradients, so
    every rank takes the same steps.
    """
    inputs, target = compute.inputs(task, batch)
    with compute.autocast():
        logits = model(*inputs)
    loss = task.loss(logits, target)
    optimizer.zero_grad(set_to_none=True)
    compute.backward_and_step(loss * weight, optimizer)
    return loss.detach()
