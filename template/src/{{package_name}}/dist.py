# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""Process-group set-up and teardown, and rank helpers that also work without torchrun.

One process runs the same code as many: without torchrun's environment, rank is 0 and the
world size is 1, and nothing distributed is started.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import logging
import os
import time
from collections.abc import Iterable, Iterator

import torch
import torch.distributed as torch_dist

from . import project
from .errors import Stalled, UserError

log = logging.getLogger(__name__)
_cpu_group = None  # a gloo group for small host-side agreements (the default group when it is gloo)
_store = None  # the job's key-value store (torchrun's), this attempt's keys only
_timeout_s = 0
ROLL_CALL_S = 10.0  # after a collective failed, how long a rank waits for the others to answer
COLLECTIVE_ERRORS = ("gloo", "pair closure")  # what a failed collective's RuntimeError says of itself


class RanksLost(Stalled):
    """A collective failed because some ranks stopped answering (dead, stopped or stuck)."""


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


def processes_per_node() -> int:
    """The training processes this node runs, which share its CPUs for loader workers.

    Under torchrun, those it started; otherwise those ``launch`` would start (one per GPU the
    answers name), so a plain ``bench`` tunes for the run that follows it, and its settings
    match that run's.
    """
    if is_torchrun():
        return local_world_size()
    return max(1, project.NUM_GPUS)


def usable_cpus() -> int:
    """CPUs this process may run on (CPU affinity, e.g. a SLURM or container limit)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def is_main_process() -> bool:
    return get_rank() == 0


def pick_device(num_gpus: int) -> torch.device:
    """``cuda:<LOCAL_RANK>`` when GPUs were asked for and exist, else the CPU.

    A local rank without a GPU of its own is an error naming the visible GPUs; one process
    on a machine of several GPUs (plain ``train``, not ``launch``) says it uses one.
    """
    if num_gpus == 0:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        _warn_no_gpu(num_gpus)
        return torch.device("cpu")
    visible = torch.cuda.device_count()
    check_gpus(local_world_size(), visible)
    if not is_torchrun() and visible > 1 and num_gpus > 1:
        log.warning("training on cuda:0 alone of %d GPUs: `launch -- train` uses %d", visible, min(visible, num_gpus))
    device = torch.device("cuda", local_rank())
    torch.cuda.set_device(device)
    return device


@functools.cache  # once a process
def _warn_no_gpu(num_gpus: int) -> None:
    log.warning(
        "the project was made for %d GPU(s) per node, but torch finds none (torch %s, CUDA %s): training on the "
        "CPU, far slower. Install a CUDA build of torch, or check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES",
        num_gpus,
        torch.__version__,
        torch.version.cuda or "none: a CPU build",
    )


def check_gpus(processes: int, visible: int) -> None:
    """Refuse more processes per node than GPUs visible (each process takes the GPU of its local rank)."""
    if processes > visible:
        shown = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
        raise UserError(
            f"{processes} processes per node but {visible} GPU(s) visible (CUDA_VISIBLE_DEVICES={shown}): "
            f"launch --nproc-per-node {visible}, or make more GPUs visible"
        )


def backend_for(backend: str, device: torch.device) -> str:
    """``dist.backend`` for a process on ``device``: ``auto`` is nccl on CUDA, gloo on the CPU.

    >>> backend_for("auto", torch.device("cpu"))
    'gloo'
    """
    if backend == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise UserError(
            f"dist.backend=nccl needs CUDA GPUs, and this run trains on the {device.type}: set dist.backend=auto"
        )
    return backend


def setup(backend: str, timeout_s: int, device: torch.device) -> bool:
    """Join the process group when started by torchrun; returns whether one was joined.

    Args:
        backend (str): ``auto`` (nccl on CUDA, gloo on the CPU), ``nccl`` or ``gloo``.
        timeout_s (int): how long a collective waits before failing instead of hanging.
        device (torch.device): this process's device; on CUDA it is bound to the group.
    """
    global _cpu_group, _store, _timeout_s
    if not is_torchrun() or is_distributed():
        return is_distributed()
    backend = backend_for(backend, device)
    timeout = datetime.timedelta(seconds=timeout_s)
    store, rank, world_size = next(torch_dist.rendezvous("env://", timeout=timeout))
    # NOTE [ Restarted ranks read their peers' old addresses ]
    # A process group writes its ranks' addresses in the job's store ("default_pg/0/rank_1", ...),
    # under the same keys in every restart. `launch` starts torchrun with a store per rendezvous
    # round (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: rank 0 hosts a new one each time), so a
    # restarted group finds no old address, on any node. A torchrun started by hand shares its
    # agents' store across restarts; there a prefix per attempt keeps the keys apart, but only on
    # one node: each node's agent counts its own restarts (the node whose rank died counts one,
    # the other does not), so on several nodes the ranks would wait on each other's keys for ever.
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        store = torch_dist.PrefixStore(f"attempt{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
        if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) and project.NUM_NODES > 1:
            log.warning("torchrun was started by hand: a restart on several nodes may hang; start with `launch`")
    torch_dist.init_process_group(
        backend=backend,
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=timeout,
        device_id=device if device.type == "cuda" else None,
    )
    _cpu_group = torch_dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
    _store, _timeout_s = store, timeout_s
    return True


def teardown() -> None:
    global _cpu_group, _store
    if is_distributed():
        torch_dist.destroy_process_group()
    _cpu_group = _store = None


@contextlib.contextmanager
def name_lost_ranks() -> Iterator[None]:
    """Turn a failed collective into :class:`RanksLost` naming the ranks that stopped answering.

    A collective that times out (``dist.timeout_s``) or loses a peer says neither which rank nor
    why. Every rank that gets such an error answers a roll call in the job's store (which does
    not depend on the broken process group); the ranks that have not answered after
    ``ROLL_CALL_S`` seconds are named. Errors of any other kind pass through unchanged.
    """
    try:
        yield
    except RuntimeError as e:
        # gloo says "gloo" in most of its errors, not in all (a pair closed on its timeout); the roll call
        # below decides: with every rank answering, the error passes through unchanged
        collective = isinstance(e, torch_dist.DistError) or any(s in str(e) for s in COLLECTIVE_ERRORS)
        if not is_distributed() or _store is None or not collective:
            raise
        lost = _roll_call()
        if not lost:
            raise
        names = ", ".join(str(r) for r in lost)
        raise RanksLost(
            f"rank(s) {names} stopped answering (dead, stopped or stuck: their log may say which), so rank "
            f"{get_rank()} stops: a collective failed on a lost connection or after dist.timeout_s={_timeout_s}"
        ) from e


def _roll_call() -> list[int]:
    """The ranks that have not said "here" in the store within ``ROLL_CALL_S`` ([] if it is unreachable)."""
    try:
        _store.set(f"here/{get_rank()}", "1")
        keys = [f"here/{r}" for r in range(get_world_size())]
        deadline = time.monotonic() + ROLL_CALL_S
        while True:
            lost = [r for r, key in enumerate(keys) if not _store.check([key])]
            if not lost or time.monotonic() > deadline:
                return lost
            time.sleep(0.5)
    except (RuntimeError, OSError):  # the store is gone too (its host, torchrun's rank 0 agent, died)
        return []


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


def store():
    """The job's key-value store (torchrun's: this attempt's keys), or ``None`` outside a process group."""
    return _store


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


def agree_max(value: int) -> int:
    """The largest ``value`` over all ranks (on the CPU group: no device sync)."""
    if not is_distributed():
        return value
    tensor = torch.tensor([value], dtype=torch.int64)
    torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.MAX, group=_cpu_group)
    return int(tensor.item())
