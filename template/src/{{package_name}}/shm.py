# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""Shared memory (/dev/shm): what the loaders' workers need of it, what is free, what dead runs left there.

# NOTE [ The loaders' batches and a container's /dev/shm ]
# A loader worker hands each batch to the training process in shared memory, a file in /dev/shm
# (torch unlinks its name once the file is open; its pages stay until both sides drop it). A
# container's /dev/shm is small: Docker gives 64 MB unless told otherwise (`--shm-size`), and a
# Kubernetes pod its node's default unless a memory-backed volume is mounted there. A loader with
# w workers and prefetch_factor p has up to w x p batches in flight while the training process
# holds 2 (the one it trains on, the one before): torch's own way needs (w x p + 2) batches of
# /dev/shm, and the hand-off pool (handoff.py) keeps up to ``most`` blocks a worker on top, as
# long as its workers live (a train loader's persist through validation). A worker that finds no
# room fails in the middle of an epoch, and torch leaves the file it could not fill behind. So:
#
# - before any worker starts, the loaders' needs are held against what is free (:func:`plan`):
#   each pool gets as many blocks as fit beside the other loaders' needs, down to none (torch's
#   own way); when even that cannot fit, the command stops with one line (SharedMemoryFull)
#   naming /dev/shm's size, what the settings need and the fixes;
# - a worker that still finds no room (something else filled /dev/shm since) removes the file
#   torch failed to fill (:func:`remove_failed`) and stops with the same kind of line;
# - each process of this project that may create blocks leaves a mark in /dev/shm while it
#   runs (:func:`mark_process`), and its multiprocessing semaphores (the loaders' queues' locks,
#   which Python's resource tracker removes, unless a kill of the process group took it too) are
#   named after it (:func:`name_semaphores`); a start removes what marked processes that died
#   left there (:func:`clear_dead`). Files of processes that are not this project's are never
#   touched.
#
# Where there is no /dev/shm (macOS, Windows) none of this applies: :func:`space` is None.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import re
from dataclasses import dataclass

from .errors import SharedMemoryFull

PATH = "/dev/shm"
HELD = 2  # batches the training process holds while the next one arrives
MARGIN = 2 << 20  # left for the rest: the batches' small tensors, the pools' flags, multiprocessing's own
MB = 1e6
# torch names a block /dev/shm/torch_<pid>_<random>_<counter> (at::NewProcessWideShmHandle)
TORCH_BLOCK = re.compile(r"torch_(\d+)_\d+_\d+")
FAILED = re.compile(r"unable to allocate shared memory\(shm\) for file <(/torch_\d+_\d+_\d+)>")
MARK = "{prefix}-{namespace}-{pid}"  # a process of this project that may create blocks


@dataclass(frozen=True)
class Space:
    """/dev/shm's size and the bytes free in it."""

    size: int
    free: int


def space() -> Space | None:
    """/dev/shm's size and free bytes; ``None`` where there is none (macOS, Windows: no such limit)."""
    path = PATH
    if not os.path.isdir(path):
        return None
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return Space(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize)


@dataclass(frozen=True)
class Demand:
    """One loader's use of /dev/shm: its batches' size and how many it keeps there.

    Args:
        name (str): how a message names it (``"the train loader"``).
        batch_bytes (int): the shared bytes of one batch.
        workers, prefetch (int): ``num_workers`` and ``prefetch_factor``.
        persistent (bool): its workers, and their pool, live through the other loaders' epochs.
        batch (str): what makes a batch that big, in the keys that set it.
    """

    name: str
    batch_bytes: int
    workers: int
    prefetch: int
    persistent: bool
    batch: str  # what makes a batch that big, in the keys that set it: "loader.batch_size=64 of 3x224x224 uint8"

    def need(self, blocks: int = 0) -> int:
        """The most it holds while it runs, with a pool of ``blocks`` a worker (0: torch's own way)."""
        if self.workers == 0:
            return 0
        return (self.workers * max(blocks, self.prefetch) + HELD) * self.batch_bytes

    def resident(self, blocks: int) -> int:
        """What its pool keeps while another loader runs."""
        return self.workers * blocks * self.batch_bytes if self.persistent else 0


def plan(demands: list[Demand], room: Space, most: int, processes: int = 1) -> list[int]:
    """The blocks each loader's pool may keep per worker, the loaders of ``processes`` training processes
    sharing ``room``'s free bytes: the most that fit (up to ``most``), pools that persist first.

    Raises :class:`SharedMemoryFull` naming the first loader whose workers cannot run even with no pool.

    >>> train = Demand("the train loader", 10, workers=2, prefetch=2, persistent=True, batch="")
    >>> val = Demand("the val loader", 10, workers=2, prefetch=2, persistent=False, batch="")
    >>> plan([train, val], Space(10**9, 10_000 + MARGIN), most=8)
    [8, 8]
    >>> plan([train, val], Space(10**9, 100 + MARGIN), most=8)  # the train pool sits through validation
    [2, 2]
    >>> plan([train, val], Space(10**9, 60 + MARGIN), most=8)  # no train pool; val's 2 are its batches in flight
    [0, 2]
    """
    budget = room.free // max(1, processes) - MARGIN
    for d in demands:
        if d.need() > budget:
            raise SharedMemoryFull(too_small(d, room, processes, full(demands, most, processes)))
    blocks = [0] * len(demands)
    for i in sorted(range(len(demands)), key=lambda i: not demands[i].persistent):
        for n in range(most, 1, -1):
            trial = [*blocks[:i], n, *blocks[i + 1 :]]
            if _peak(demands, trial) <= budget:
                blocks = trial
                break
    return blocks


def _peak(demands: list[Demand], blocks: list[int]) -> int:
    """The most the loaders hold at once: one runs, the others' persistent pools wait."""
    resident = [d.resident(n) for d, n in zip(demands, blocks)]
    return max(d.need(n) + sum(resident) - resident[j] for j, (d, n) in enumerate(zip(demands, blocks)))


def full(demands: list[Demand], most: int, processes: int = 1) -> int:
    """What the loaders of ``processes`` processes would hold with every pool at ``most`` blocks a worker."""
    return processes * (_peak(demands, [most] * len(demands)) + MARGIN) if demands else 0


def too_small(d: Demand, room: Space, processes: int, wanted: int) -> str:
    """The line of a /dev/shm too small for loader ``d`` run torch's own way (no pool)."""
    need = d.need()
    each = f" of each of the {processes} training processes on this node" if processes > 1 else ""
    total = f" ({mb(need * processes)} in all)" if processes > 1 else ""
    return (
        f"/dev/shm holds {mb(room.size)} ({mb(room.free)} free), and {d.name}{each} needs {mb(need)} of it"
        f"{total}: loader.num_workers={d.workers} x loader.prefetch_factor={d.prefetch} batches in flight and "
        f"{HELD} the training process holds, each {mb(d.batch_bytes)} ({d.batch}); {fixes(wanted)}; or lower "
        "loader.num_workers (0 needs none), loader.prefetch_factor or loader.batch_size"
    )


def mb(n: float) -> str:
    """``n`` bytes in MB, as a message gives them.

    >>> mb(9_633_792), mb(67_108_864), mb(512)
    ('9.6 MB', '67 MB', '0.00051 MB')
    """
    return f"{n / MB:.2g} MB" if n < 10 * MB else f"{n / MB:.0f} MB"


def sizes(n: int) -> tuple[str, str]:
    """At least ``n`` bytes, a power of two in MiB or GiB, as ``docker run --shm-size`` and Kubernetes write it.

    >>> sizes(57_800_000), sizes(700_000_000), sizes(3_000_000_000)
    (('64m', '64Mi'), ('1g', '1Gi'), ('4g', '4Gi'))
    """
    mib = 2 ** max(6, math.ceil(math.log2(max(n, 1) / 2**20)))
    return (f"{mib // 1024}g", f"{mib // 1024}Gi") if mib >= 1024 else (f"{mib}m", f"{mib}Mi")


def fixes(wanted: int) -> str:
    """The ways to more /dev/shm, sized to ``wanted`` bytes."""
    docker, kubernetes = sizes(wanted)
    return (
        f"give it more: `docker run --shm-size={docker}` (or `--ipc=host`), on Kubernetes a volume "
        f"`emptyDir: {{medium: Memory, sizeLimit: {kubernetes}}}` mounted at /dev/shm"
    )


def no_room_in_worker() -> str:
    """The line of a loader worker that found no room in /dev/shm for its batch (after the start allowed for it)."""
    room = space() or Space(0, 0)
    return (
        f"a loader worker (pid {os.getpid()}) found no room for its batch in /dev/shm ({mb(room.size)}, "
        f"{mb(room.free)} free): something else fills it (`df -h /dev/shm`), or the batches are larger than the "
        f"first ones; {fixes(2 * room.size)}; or lower loader.num_workers (0 needs none), loader.prefetch_factor "
        "or loader.batch_size"
    )


def remove_failed(error: BaseException) -> str | None:
    """Remove the file torch could not fill, which an ``unable to allocate shared memory`` error names
    (torch leaves it in /dev/shm); returns its name, or ``None`` when ``error`` is no such error."""
    found = FAILED.search(str(error))
    if found is None:
        return None
    with contextlib.suppress(OSError):
        os.unlink(os.path.join(PATH, found.group(1).lstrip("/")))
    return found.group(1)


def _namespace() -> str:
    """This process's pid namespace (a pid means one process only within it)."""
    try:
        return re.sub(r"\D", "", os.readlink("/proc/self/ns/pid")) or "0"
    except OSError:
        return "0"


def mark_process(prefix: str) -> str | None:
    """Mark this process as one of the project's that may create blocks (an empty file in /dev/shm);
    returns the mark's path (remove it at a clean exit: :func:`unmark`), ``None`` without /dev/shm."""
    if space() is None:
        return None
    path = os.path.join(PATH, MARK.format(prefix=prefix, namespace=_namespace(), pid=os.getpid()))
    try:
        with open(path, "w"):
            pass
    except OSError:  # no room even for a name, or not ours to write: nothing can be cleared after it
        return None
    return path


def name_semaphores(prefix: str) -> None:
    """Name this process's multiprocessing semaphores (the locks of the loaders' queues: files
    ``sem.mp-*`` in /dev/shm) after it, as :func:`mark_process` names a process: Python's resource
    tracker removes them when the process ends, but a kill of its process group kills the tracker too,
    and :func:`clear_dead` then finds them by the name. Where multiprocessing keeps no such prefix
    (its ``_config``, a private dict), they keep its own names."""
    config = getattr(multiprocessing.current_process(), "_config", None)
    if isinstance(config, dict) and "semprefix" in config:
        config["semprefix"] = "/mp-" + MARK.format(prefix=prefix, namespace=_namespace(), pid=os.getpid())


def unmark(path: str | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)


def clear_dead(prefix: str) -> tuple[int, int]:
    """Remove what this project's processes that died left in /dev/shm: the blocks of a process marked by
    :func:`mark_process` (in this pid namespace) that no longer runs, the semaphores named after one
    (:func:`name_semaphores`), and their marks.

    Returns the ``(files, bytes)`` of blocks and semaphores removed. Other programs' files are never touched.
    """
    if space() is None:
        return 0, 0
    ours = re.escape(MARK.format(prefix=prefix, namespace=_namespace(), pid=""))
    mark, semaphore = re.compile(ours + r"(\d+)"), re.compile(r"sem\.mp-" + ours + r"(\d+)-.+")
    try:
        names = os.listdir(PATH)
    except OSError:
        return 0, 0
    owners = {}  # name -> (the pid it belongs to, whether it says that pid is ours)
    for name in names:
        for pattern, says in ((mark, True), (semaphore, True), (TORCH_BLOCK, False)):
            if found := pattern.fullmatch(name):
                owners[name] = (int(found.group(1)), says)
                break
    dead = {pid for pid, says in owners.values() if says and not alive(pid)}
    files = size = 0
    for name, (pid, _) in owners.items():
        if pid not in dead:
            continue
        path = os.path.join(PATH, name)
        try:
            nbytes = os.stat(path).st_size
            os.unlink(path)
        except OSError:  # gone meanwhile (another rank cleared it)
            continue
        if not mark.fullmatch(name):
            files, size = files + 1, size + nbytes
    return files, size


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
