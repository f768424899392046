# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""Loader workers: how they start (forkserver or spawn), what each does first, and how one that dies is told.

    ctx = worker_context(cfg.loader.start_method)      # DataLoader(..., multiprocessing_context=ctx)
    worker_init_fn = functools.partial(init_worker, os.getpid(), blocks=8)

The loader factory (data/loader.py) builds its loaders with these; ``pack --to cache`` starts its
decoding processes from the same context.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import multiprocessing
import multiprocessing.forkserver
import multiprocessing.resource_tracker
import multiprocessing.util
import os
import random
import re
import select
import signal
import threading
import time
from contextlib import contextmanager
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

from .. import handoff, project, shm
from ..errors import UserError, WorkerLost
from ..stopping import STOP_SIGNALS

METHODS = ("forkserver", "spawn")
PRELOAD = f"{__package__}.loader"  # what the forkserver imports once: the whole data stack


def start_method(method: str = "auto") -> str:
    """``loader.start_method`` resolved: ``auto`` is ``$<PACKAGE>_START_METHOD`` when set (e.g.
    ``MY_PROJECT_START_METHOD=spawn``: how macOS and Windows start workers, on Linux), else a forkserver
    where the system has one, else spawn."""
    variable = f"{project.PACKAGE.upper()}_START_METHOD"
    if method == "auto":
        method = os.environ.get(variable) or "auto"
        if method not in ("auto", *METHODS):
            raise UserError(f"{variable}={method!r} is no start method (expected one of: {', '.join(METHODS)})")
    if method == "auto":
        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
    return method


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn``: seed NumPy and ``random`` from the worker's torch seed.

    # NOTE [ Different augmentation in every worker, rank and epoch ]
    # The loader's ``generator`` is seeded with seed + rank, and draws a new base seed each
    # time workers start (each epoch, or once with persistent workers whose RNGs then run on);
    # each worker's torch seed is base seed + worker id. Seeding NumPy and ``random`` from it
    # keeps third-party augmentations from repeating the same "random" numbers in every worker.
    """
    seed = torch.initial_seed() % 2**32
    np.random.seed(seed)
    random.seed(seed)


def exit_with(pid: int) -> None:
    """End this process as soon as process ``pid`` ends (a daemon thread waits for it).

    # NOTE [ Workers end with their rank ]
    # DataLoader's workers stop when their parent process changes. A worker started from the
    # forkserver (see worker_context) has the forkserver as its parent, and the forkserver
    # lives while any of its workers does: a rank killed with kill -9 (or by the OOM killer)
    # would leave its workers and forkserver running, and holding memory, forever. So each
    # worker watches its rank itself.
    """
    try:
        handle = os.pidfd_open(pid)  # Linux: readable when the process ends
    except ProcessLookupError:
        os._exit(0)
    except (AttributeError, OSError):
        handle = None

    def wait() -> None:
        if handle is not None:
            select.select([handle], [], [])
        else:  # elsewhere: poll
            while psutil.pid_exists(pid):
                time.sleep(2)
        os._exit(0)

    threading.Thread(target=wait, name=f"exit-with-{pid}", daemon=True).start()


def init_worker(rank_pid: int, worker_id: int, blocks: int = handoff.MOST_BLOCKS) -> None:
    """``worker_init_fn``: seed the worker (:func:`seed_worker`), end it with its rank (:func:`exit_with`),
    let the signals that stop a run pass it by (stopping.py: its rank stops it), keep at most ``blocks``
    in its hand-off pool (what fits in /dev/shm: shm.py) and mark it as a process that may leave blocks
    there (a start clears those of marked processes that died: shm.clear_dead)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    handoff.set_most(blocks)
    multiprocessing.util.Finalize(None, shm.unmark, (shm.mark_process(project.PACKAGE),), exitpriority=0)
    seed_worker(worker_id)
    exit_with(rank_pid)


def worker_context(method: str = "auto"):
    """The multiprocessing context DataLoader workers start from (``loader.start_method``).

    ``auto`` is what the environment variable ``<PACKAGE>_START_METHOD`` names (:func:`start_method`),
    else a forkserver where the system has one (Linux, macOS), else spawn (Windows).

    # NOTE [ Workers start from a forkserver ]
    # A worker forked from the training process copies every lock that process holds at that
    # moment, and that process runs threads (gloo's, tqdm's monitor, the queue feeders of
    # persistent workers): a lock held by one of them is copied locked, and the new worker hangs
    # before it runs a line, with its rank waiting on it forever and the other ranks waiting in
    # a collective. A forkserver is a separate, single-threaded process started on first use;
    # each worker is forked from it, and gets the dataset by pickling (so a source holds only
    # what pickles cheaply: paths, NumPy arrays, no open handle). Importing the data stack in
    # the forkserver once keeps worker start-up fast. The forkserver is a fresh interpreter: it
    # finds this package as a plain `python` would (installed, or on PYTHONPATH), so the folder
    # holding the package goes on PYTHONPATH for it (a source tree that pytest's `pythonpath`
    # makes importable is not visible there); otherwise each worker would import torch itself.
    # spawn starts each worker as a fresh interpreter: as safe, slower to start. fork is never used.
    """
    method = start_method(method)
    root = str(Path(__file__).resolve().parents[2])
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([root, *paths])
    ctx = multiprocessing.get_context(method)
    shm.name_semaphores(project.PACKAGE)  # a start clears those a killed run left (its queues' locks)
    _end_workers_at_exit()
    # NOTE [ Workers start with the stop signals blocked ]
    # A signal sent to a rank's whole process group (torchrun's, Slurm's, Ctrl-C's) stops the
    # rank alone, which then stops its workers (stopping.py): every process started for them
    # inherits the signals blocked. Blocked, not ignored: none is lost. multiprocessing's resource
    # tracker starts first, on its own: starting it *unblocks* SIGINT and SIGTERM in the caller
    # (CPython's resource_tracker.ensure_running), and started on the way to the first worker it
    # would leave that worker, or the forkserver, to die of the signal (the rank then waits for
    # batches that never come, or fails with `EOFError: unexpected EOF`).
    with stop_signals_blocked():
        multiprocessing.resource_tracker.ensure_running()
    if method == "forkserver":
        ctx.set_forkserver_preload([PRELOAD])  # takes effect when the server starts
        with stop_signals_blocked():  # the forkserver, and so every worker it forks, inherits the mask
            multiprocessing.forkserver.ensure_running()
    return ctx


@contextmanager
def stop_signals_blocked():
    """Block the signals that stop a run (stopping.py) in this thread for the ``with`` block: a
    process started in it inherits the mask. One that arrives meanwhile waits, it is not lost."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


@functools.cache
def _end_workers_at_exit() -> None:
    """At exit, kill the workers still running, before multiprocessing stops them with SIGTERM.

    multiprocessing's exit handler sends its daemonic children SIGTERM and waits for them; the
    workers block it (see worker_context), so a worker that a failed run left behind (an error
    raised while its loader was open) would make the process wait forever after its ``error:``
    line. This runs first (a finalizer of high priority) and kills them.
    """

    def kill() -> None:
        for worker in worker_processes():
            try:
                worker.kill()
            except psutil.Error:  # it ended meanwhile
                continue

    multiprocessing.util.Finalize(None, kill, exitpriority=100)


def worker_processes() -> list[psutil.Process]:
    """This process's DataLoader workers: the children of its forkserver, or its spawned children."""
    workers = []
    for child in psutil.Process().children():
        try:
            cmdline = " ".join(child.cmdline())
            if "forkserver" in cmdline:
                workers += child.children()
            elif "spawn_main" in cmdline:
                workers.append(child)
        except psutil.Error:  # it ended meanwhile
            continue
    return workers


# NOTE [ A worker that dies is named ]
# A worker killed in the middle of an epoch (SIGKILL: the kernel's out-of-memory killer, most
# often) sends no batch and no error. torch notices it only when a wait for a batch times out
# (then it looks at its workers), or, for workers it started itself (spawn), on SIGCHLD; its
# "DataLoader worker (pid(s) 1234) exited unexpectedly" says neither which worker nor why.
# The loader waits in short intervals (data/loader.py: CHECK_S), so torch's own look at its
# workers comes every few seconds, and :func:`lost` turns torch's error into one line naming the
# loader, the worker, its signal, the likely cause and what to lower.
LOST = re.compile(r"DataLoader worker \(pid\(?s?\)? ([\d, ]+)\) (?:exited unexpectedly|is killed by signal)")


def lost(error: BaseException, loaders: dict[str, Any]) -> WorkerLost | None:
    """The :class:`WorkerLost` that torch's error of a dead worker means (``None``: not such an error).

    ``loaders``: the loaders it may be of, by split; the worker is looked up in their iterators.
    """
    found = LOST.search(str(error))
    if found is None:
        return _sender_died(loaders) if isinstance(error, HANDOVER_BROKEN) else None
    pids = [int(p) for p in found.group(1).replace(" ", "").split(",") if p]
    for split, loader in loaders.items():
        for worker_id, process in enumerate(_workers_of(loader)):
            if process.pid in pids:
                return WorkerLost(died(split, worker_id, process.pid, process.exitcode))
    return WorkerLost(died(next(iter(loaders), "a"), None, pids[0] if pids else None, None))


# NOTE [ A worker that dies while its batch is taken ]
# A batch's tensors come from a worker as file descriptors that this process asks the worker for
# (multiprocessing's resource sharer) as it unpickles the batch. A worker killed at that moment
# breaks the connection: ConnectionResetError (or EOFError, a refused connection) comes out of
# the loader's wait instead of torch's "DataLoader worker ... is killed". Where one of the
# loaders' workers has ended, that is the worker's death, named as any other; else the error
# stands as it was raised.
HANDOVER_BROKEN = (ConnectionError, EOFError, FileNotFoundError)
DEATH_SEEN_S = 5.0  # how long a worker that broke the hand-over may take to be seen ended (it is being killed)


def _workers_of(loader: Any) -> list:
    """torch's (private) list of ``loader``'s worker processes: of its persistent iterator, else of the
    iterator it waits on now (data/loader.py: ``Loader.watched``)."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is None and callable(watched := getattr(loader, "watched", None)):
        iterator = watched()
    return getattr(iterator, "_workers", None) or []


def _sender_died(loaders: dict[str, Any]) -> WorkerLost | None:
    """The :class:`WorkerLost` of a worker of ``loaders`` that has ended (``None``: all are alive)."""
    deadline = time.monotonic() + DEATH_SEEN_S
    while True:
        for split, loader in loaders.items():
            for worker_id, process in enumerate(_workers_of(loader)):
                if process.exitcode is not None:
                    return WorkerLost(died(split, worker_id, process.pid, process.exitcode))
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def died(split: str, worker_id: int | None, pid: int | None, exitcode: int | None) -> str:
    """The line of a loader worker that died: which, how, the likely cause and what to lower.

    >>> died("train", 1, 4242, -9).split(":")[0]
    "the train loader's worker 1 (pid 4242) was killed by SIGKILL in the middle of an epoch"
    """
    who = f"the {split} loader's worker {worker_id if worker_id is not None else ''} (pid {pid})".replace("  ", " ")
    memory = (
        "most likely the kernel's out-of-memory killer: this machine or container ran out of memory (`dmesg | grep "
        "-i oom`; on Kubernetes, OOMKilled in `kubectl describe pod`); lower loader.num_workers, "
        "loader.prefetch_factor or loader.batch_size (each worker holds its own copy of what it reads and "
        "prefetch_factor batches), or give it more memory"
    )
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else f"signal {-exitcode}"
        why = memory if -exitcode == signal.SIGKILL else "a crash in native code (a decoder, a library of yours)"
        return f"{who} was killed by {name} in the middle of an epoch: {why}"
    if exitcode:
        return f"{who} exited with status {exitcode} in the middle of an epoch (its stderr, above, may say why)"
    return f"{who} ended in the middle of an epoch, killed or exited (its stderr may say why); if killed, {memory}"


def unpicklable(error: BaseException, split: str, parts: dict[str, Any], method: str) -> UserError | None:
    """A :class:`UserError` naming what of ``parts`` (what a worker gets: the dataset, the collate) cannot
    be pickled, when ``error`` is pickling's (``None`` otherwise).

    # NOTE [ Workers get the dataset by pickling ]
    # A forkserver's or spawn's worker gets the dataset, its task and the collate pickled. A lambda or a
    # function defined inside another one (a transform of task.py's, say) has no name pickle can find
    # again, and an open file, lock or connection does not pickle at all: Python's error then names
    # neither where it is nor what to do. This walks the parts to the first object that fails.
    """
    if not isinstance(error, (AttributeError, TypeError)) and type(error).__name__ != "PicklingError":
        return None
    if "pickle" not in str(error):
        return None
    for name, part in parts.items():
        found = _first_unpicklable(part, name)
        if found is not None:
            path, obj = found
            return UserError(
                f"the {split} loader's workers (loader.start_method={method}) get the {name} by pickling, and {path} "
                f"cannot be pickled: {_what(obj)}"
            )
    return UserError(f"the {split} loader's workers (loader.start_method={method}) cannot get their work: {error}")


def _first_unpicklable(obj, path: str, depth: int = 0) -> tuple[str, Any] | None:
    """``(path, object)`` of the innermost object under ``obj`` that does not pickle, else ``None``."""
    try:
        ForkingPickler.dumps(obj)
        return None
    except Exception:
        pass
    if depth < 12:
        for name, child in _children(obj):
            found = _first_unpicklable(child, f"{path}{name}", depth + 1)
            if found is not None:
                return found
    return path, obj


def _children(obj) -> list[tuple[str, Any]]:
    if isinstance(obj, dict):
        return [(f"[{k!r}]", v) for k, v in obj.items()]
    if isinstance(obj, (list, tuple)):
        return [(f"[{i}]", v) for i, v in enumerate(obj)]
    if isinstance(obj, functools.partial):
        return [(".func", obj.func), (".args", obj.args), (".keywords", obj.keywords)]
    getstate = getattr(obj, "__getstate__", None)
    state = None
    try:
        state = getstate() if callable(getstate) and not inspect.isclass(obj) else None
    except Exception:
        state = None
    if not isinstance(state, dict):
        state = getattr(obj, "__dict__", None)
    return [(f".{k}", v) for k, v in state.items()] if isinstance(state, dict) else []


def _what(obj) -> str:
    """What an unpicklable object is, where it was made, and the fix."""
    if inspect.isfunction(obj):
        where = ""
        with contextlib.suppress(OSError, TypeError, ValueError):
            where = f" ({os.path.relpath(inspect.getsourcefile(obj))}, line {inspect.getsourcelines(obj)[1]})"
        kind = "a lambda" if obj.__name__ == "<lambda>" else f"the function {obj.__qualname__}, defined inside another,"
        return (
            f"it is {kind}{where}, which a worker cannot find by name: define it as a function at the top level "
            "of its module (or a class with __call__)"
        )
    return (
        f"it is {type(obj).__module__}.{type(obj).__qualname__} (an open file, lock or connection does not pickle): "
        "keep what opens it (a path, a URL) and open it in the worker, on first use"
    )
