"""Process-group set-up and teardown, and rank helpers that also work without torchrun.

One process runs the same code as many: without torchrun's environment, rank is 0 and the
world size is 1, and nothing distributed is started.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterable, Iterator

import torch
import torch.distributed as torch_dist

_cpu_group = None  # a gloo group for small host-side agreements (the default group when it is gloo)


def is_torchrun() -> bool:
    """True when started by torchrun (it sets RANK, WORLD_SIZE, LOCAL_RANK, ...)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def is_distributed() -> bool:
    """True inside a joined process group."""
    return torch_dist.is_available() and torch_dist.is_initialized()


def get_rank() -> int:
    return torch_dist.get_rank() if is_distributed() else int(os.environ.get("RANK", 0))


def get_world_size() -> int:
    return torch_dist.get_world_size() if is_distributed() else int(os.environ.get("WORLD_SIZE", 1))


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
    global _cpu_group
    if not is_torchrun() or is_distributed():
        return is_distributed()
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=timeout_s)
    torch_dist.init_process_group(backend=backend, timeout=timeout, device_id=device if device.type == "cuda" else None)
    _cpu_group = torch_dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
    return True


def teardown() -> None:
    global _cpu_group
    if is_distributed():
        torch_dist.destroy_process_group()
    _cpu_group = None


def barrier() -> None:
    if is_distributed():
        torch_dist.barrier()


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """Sum a tensor over all ranks, in place (itself in a single process)."""
    if is_distributed():
        torch_dist.all_reduce(values)
    return values


def all_gather_object(obj) -> list:
    """``[obj of rank 0, obj of rank 1, ...]`` (just ``[obj]`` in a single process)."""
    if not is_distributed():
        return [obj]
    out = [None] * torch_dist.get_world_size()
    torch_dist.all_gather_object(out, obj)
    return out


def broadcast_from_main(obj):
    """Rank 0's ``obj`` on every rank (``obj`` itself in a single process)."""
    if not is_distributed():
        return obj
    box = [obj]
    torch_dist.broadcast_object_list(box, src=0)
    return box[0]


def stop_together(batches: Iterable) -> Iterator:
    """Yield from ``batches`` while every rank still has one; all ranks stop at the shortest.

    # NOTE [ Uneven data hangs DDP ]
    # A rank that runs out of data leaves the loop while the others wait in backward's
    # all-reduce forever. When a source can count its rows, every rank knows the epoch's
    # length up front and this is not used. Otherwise the ranks agree batch by batch with a
    # MIN all-reduce of "I have a batch" on a CPU (gloo) group, so the host never waits on the
    # device for it. The next batch is fetched only after the caller's step, so the loader's
    # position (a checkpoint's resume point) is always that of the last batch trained.
    """
    if not is_distributed():
        yield from batches
        return
    for batch in _with_end(batches):
        if not _all_have(batch is not None):
            return
        yield batch


def _with_end(batches: Iterable) -> Iterator:
    yield from batches
    yield None


def _all_have(flag: bool) -> bool:
    tensor = torch.tensor([int(flag)], dtype=torch.int32)
    torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.MIN, group=_cpu_group)
    return bool(tensor.item())  # a CPU tensor: no device sync


def agree_min(value: int | None) -> int | None:
    """The smallest ``value`` over all ranks, ``None`` if any rank has ``None`` (on the CPU group)."""
    if not is_distributed():
        return value
    tensor = torch.tensor([-1 if value is None else value], dtype=torch.int64)
    torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.MIN, group=_cpu_group)
    return None if tensor.item() < 0 else int(tensor.item())
