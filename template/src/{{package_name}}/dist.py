"""Process-group set-up and teardown, and rank helpers that also work without torchrun.

One process runs the same code as many: without torchrun's environment, rank is 0 and the
world size is 1, and nothing distributed is started.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as torch_dist


def is_torchrun() -> bool:
    """True when started by torchrun (it sets RANK, WORLD_SIZE, LOCAL_RANK, ...)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def get_rank() -> int:
    if torch_dist.is_available() and torch_dist.is_initialized():
        return torch_dist.get_rank()
    return int(os.environ.get("RANK", 0))


def get_world_size() -> int:
    if torch_dist.is_available() and torch_dist.is_initialized():
        return torch_dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", 1))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


def local_world_size() -> int:
    """Processes on this node (they share its CPUs for DataLoader workers)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", 1))


def usable_cpus() -> int:
    """CPUs this process may run on (CPU affinity, e.g. a SLURM or container limit)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def is_main_process() -> bool:
    return get_rank() == 0


def pick_device(num_gpus: int) -> torch.device:
    """``cuda:<LOCAL_RANK>`` when GPUs were asked for and exist, else the CPU."""
    if num_gpus > 0 and torch.cuda.is_available():
        device = torch.device("cuda", local_rank())
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def setup(backend: str, timeout_s: int, device: torch.device) -> bool:
    """Join the process group when started by torchrun; returns whether one was joined.

    Args:
        backend (str): ``auto`` (nccl on CUDA, gloo on the CPU), ``nccl`` or ``gloo``.
        timeout_s (int): how long a collective waits before failing instead of hanging.
        device (torch.device): this process's device; on CUDA it is bound to the group.
    """
    if not is_torchrun() or torch_dist.is_initialized():
        return torch_dist.is_initialized()
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    torch_dist.init_process_group(
        backend=backend,
        timeout=datetime.timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )
    return True


def teardown() -> None:
    if torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.destroy_process_group()


def barrier() -> None:
    if torch_dist.is_available() and torch_dist.is_initialized():
        torch_dist.barrier()


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum a few numbers over all ranks (identity in a single process)."""
    if not (torch_dist.is_available() and torch_dist.is_initialized()):
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    torch_dist.all_reduce(t)
    return t.tolist()


def stop_together(batches, device: torch.device):
    """Yield from ``batches`` while every rank still has one; all ranks stop at the shortest.

    # NOTE [ Uneven streams hang DDP ]
    # With an IterableDataset each rank reads its own share, and shares differ by a few rows
    # (or by much, for a live stream). A rank that runs out leaves the loop while the others
    # wait in backward's all-reduce forever. One tiny all-reduce (MIN) per step lets every rank
    # learn that someone is out and stop at the same step. Map-style datasets need none of this:
    # DistributedSampler gives every rank the same number of batches.
    """
    if not (torch_dist.is_available() and torch_dist.is_initialized()):
        yield from batches
        return
    flag = torch.zeros(1, dtype=torch.int32, device=device)
    for batch in _with_sentinel(batches):
        flag.fill_(0 if batch is None else 1)
        torch_dist.all_reduce(flag, op=torch_dist.ReduceOp.MIN)
        if flag.item() == 0:
            return
        yield batch


def _with_sentinel(iterable):
    yield from iterable
    yield None


def all_gather_object(obj) -> list:
    """``[obj of rank 0, obj of rank 1, ...]`` (just ``[obj]`` in a single process)."""
    if not (torch_dist.is_available() and torch_dist.is_initialized()):
        return [obj]
    out = [None] * torch_dist.get_world_size()
    torch_dist.all_gather_object(out, obj)
    return out


def all_reduce_min_max(value: int, device: torch.device) -> tuple[int, int]:
    """The smallest and largest ``value`` over all ranks."""
    if not (torch_dist.is_available() and torch_dist.is_initialized()):
        return value, value
    t = torch.tensor([value, -value], dtype=torch.int64, device=device)
    torch_dist.all_reduce(t, op=torch_dist.ReduceOp.MAX)
    return -int(t[1]), int(t[0])


def agree_min(value: int | None, device: torch.device) -> int | None:
    """The smallest ``value`` over all ranks; ``None`` if any rank has ``None`` (it cannot tell)."""
    lo, _ = all_reduce_min_max(-1 if value is None else value, device)
    return None if lo < 0 else lo


def broadcast_from_main(obj):
    """Rank 0's ``obj`` on every rank (``obj`` itself in a single process)."""
    if not (torch_dist.is_available() and torch_dist.is_initialized()):
        return obj
    box = [obj]
    torch_dist.broadcast_object_list(box, src=0)
    return box[0]


def check_in_sync(model: torch.nn.Module, device: torch.device) -> None:
    """Raise if the DDP replicas' parameters differ (they must stay identical step after step)."""
    if not (torch_dist.is_available() and torch_dist.is_initialized()):
        return
    with torch.no_grad():
        total = sum(p.double().sum() for p in model.parameters()).to(device)
    t = torch.stack([total, -total])
    torch_dist.all_reduce(t, op=torch_dist.ReduceOp.MAX)
    spread = float(t[0] + t[1])
    if spread > 1e-6 * max(1.0, abs(float(t[0]))):
        raise RuntimeError(
            f"DDP model replicas diverged (parameter sums differ by {spread:.3g} across ranks): "
            "ranks took different steps or learning rates"
        )
