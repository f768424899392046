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
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from . import dist
from .errors import UserError

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


def learning_rate(step: int, total_steps: int | None, optim) -> float:
    """``optim.lr`` on ``optim.schedule``: cosine decays it to 0 over ``total_steps`` (``optim.lr``
    while the length is unknown), constant keeps it.

    >>> from types import SimpleNamespace as S
    >>> [learning_rate(step, 100, S(lr=1.0, schedule="cosine")) for step in (0, 50, 100)]
    [1.0, 0.5, 0.0]
    >>> learning_rate(50, 100, S(lr=1.0, schedule="constant"))
    1.0
    """
    if not total_steps or optim.schedule == "constant":
        return optim.lr
    return 0.5 * optim.lr * (1 + math.cos(math.pi * min(step / total_steps, 1.0)))


def set_learning_rate(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


class FiniteGuard:
    """Watches for a NaN or Inf loss without a host read per step, and stops the run naming it.

    # NOTE [ One bad value must not become the last checkpoint ]
    # A NaN or Inf in one sample (or a learning rate too high) turns the loss, then every
    # weight, non-finite; saved, it would replace the last good checkpoint. Each step records
    # ``isfinite(loss)`` on the device, with the step and its batch's keys on the host; the
    # flags are read at each log interval and before every checkpoint write (together with
    # the weights'), agreed over ranks, and a bad one stops the run before anything is saved.
    """

    def __init__(self, device: torch.device, size: int, checkpoint: Path) -> None:
        self.flags = torch.ones(size, dtype=torch.bool, device=device)
        self.steps: list[tuple[int, int, list[str]]] = []  # (step, epoch, batch keys) since the last check
        self.checkpoint = checkpoint  # where the last good weights are, if anywhere

    def record(self, loss: torch.Tensor, progress, keys: list[str]) -> None:
        self.flags[len(self.steps)] = torch.isfinite(loss)
        self.steps.append((progress.step, progress.epoch, keys))

    def check(self, model) -> None:
        finite = [self.flags[: len(self.steps)].all(), *(torch.isfinite(p).all() for p in model.parameters())]
        ok = int(torch.stack(finite).all())
        if dist.is_distributed():
            ok = dist.agree_min(ok)
        if not ok:
            bad = (~self.flags[: len(self.steps)]).nonzero()
            mine = self.steps[int(bad[0])] if len(bad) else None
            reports = [r for r in dist.all_gather_object(mine) if r is not None]
            step, epoch, keys = min(reports) if reports else (self.steps[-1][0], self.steps[-1][1], [])
            saved = self.checkpoint
            kept = f"{saved} holds the last good weights" if saved.is_file() else "no checkpoint was written"
            listed = saved.with_name("nonfinite_batch.txt")  # the batch's keys, all of them, to look into
            if dist.is_main_process():
                listed.parent.mkdir(parents=True, exist_ok=True)
                listed.write_text("".join(f"{key}\n" for key in keys), encoding="utf-8")
            shown = ", ".join(keys[:4]) + (f", ... ({len(keys)} in all)" if len(keys) > 4 else "")
            raise UserError(
                f"the training loss became NaN or Inf at step {step} (epoch {epoch}) on the batch of {shown}, listed "
                f"in {listed}: look for bad values in those samples, or lower optim.lr; nothing was saved after it "
                f"({kept})"
            )
        self.steps.clear()
        self.flags.fill_(True)
