# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""Mistakes a user can fix, and parts of a run that stopped answering. The command line prints
each as one ``error:`` line (exit code 2 for a mistake, 1 for a stall).

Tracebacks are for bugs; ``--debug`` shows one for these too.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import inspect
import os
import signal
from collections.abc import Iterator
from multiprocessing.reduction import ForkingPickler
from typing import Any


class UserError(Exception):
    """A mistake in the config, the data or the command line; the message says what to change."""


class ConfigError(UserError, ValueError):
    """A config file or override names an unknown key or holds a bad value."""


class DataError(UserError, ValueError):
    """The data at ``data.root`` is missing or not laid out as this project's source expects."""


class Stalled(RuntimeError):
    """A part of the run stopped answering (a loader's workers, another rank); the message names it."""


class Outage(Stalled):
    """A server the data comes from stopped answering past its retries: not the data's fault, never a bad sample."""


class SharedMemoryFull(UserError):
    """/dev/shm cannot hold what the loaders' workers need (data/loader.py); the message names its size, the need,
    the fixes."""


class WorkerLost(Stalled):
    """A loader worker died in the middle of an epoch (killed: the OOM killer, most often); the message names it."""


class DiskFull(UserError, OSError):
    """A write failed for want of space (or past a file-size limit); the message names the path and what was kept."""


FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # no space, over quota, past the file-size limit


def is_disk_full(e: BaseException) -> bool:
    """Whether ``e`` is a write that failed for want of space (or past a file-size limit)."""
    return isinstance(e, OSError) and e.errno in FULL_ERRNOS


@contextlib.contextmanager
def held_alone(path: str | os.PathLike, what: str, fix: str) -> Iterator[None]:
    """Hold the lock file ``path`` (``flock``: it goes with the process, even on kill -9), this process's
    pid written in it; held by another process, it is one :class:`UserError`, ``"<what> (pid N): <fix>"``."""
    with open(path, "a+", encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise UserError(f"{what} ({f.read().strip() or 'another process'}): {fix}") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()}\n")
        f.flush()
        yield


def require(key: str, value: object, ok: bool, expected: str) -> None:
    """Raise :class:`ConfigError` naming ``key`` and what is allowed unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key}={value!r} is not valid (expected {expected})")


SIZE_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
SIZE_UNITS |= {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(text: str, key: str) -> int:
    """Bytes in ``"50GB"``, ``"512MiB"``, ``"1e9"`` (decimal units, and binary ones with an ``i``).

    >>> parse_size("1.5GB", "k"), parse_size("64MiB", "k"), parse_size("0", "k")
    (1500000000, 67108864, 0)
    """
    raw = str(text).strip().upper().replace(" ", "")
    number = raw.rstrip("BKMGTI")
    try:
        value = float(number) * SIZE_UNITS[raw[len(number) :]]
    except (KeyError, ValueError):
        raise ConfigError(f"{key}={text!r} is not a size (e.g. 50GB, 512MiB; 0 for none)") from None
    if not 0 <= value < float("inf"):  # negative, infinite or nan
        raise ConfigError(f"{key}={text!r} is not valid (expected a size >= 0)")
    return int(value)


def died(split: str, pid: int, exitcode: int | None) -> str:
    """The line of a loader worker that died: how, the likely cause and what to lower.

    >>> died("train", 4242, -9).split(":")[0]
    "the train loader's worker (pid 4242) was killed by SIGKILL in the middle of an epoch"
    """
    who = f"the {split} loader's worker (pid {pid})"
    if exitcode is None or exitcode >= 0:
        return f"{who} exited with status {exitcode} in the middle of an epoch (its stderr, above, may say why)"
    name = signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else f"signal {-exitcode}"
    why = "a crash in native code (a decoder, a library of yours)"
    if -exitcode == signal.SIGKILL:
        why = (
            "most likely the kernel's out-of-memory killer: this machine or container ran out of memory (`dmesg | "
            "grep -i oom`; on Kubernetes, OOMKilled in `kubectl describe pod`); lower loader.num_workers, "
            "loader.prefetch_factor or loader.batch_size (each worker holds its own copy of what it reads and "
            "prefetch_factor batches), or give it more memory"
        )
    return f"{who} was killed by {name} in the middle of an epoch: {why}"


def unpicklable(parts: dict[str, Any], split: str, method: str) -> UserError | None:
    """A line naming the first thing a worker gets by pickling that does not pickle (``None``: all do).

    A lambda or a function defined inside another (a transform of task.py's, say) has no name pickle
    can find again, and an open file, lock or connection does not pickle at all; Python's error names
    neither where it is nor what to do, so this walks the parts to the innermost object that fails.
    """
    for name, part in parts.items():
        if (found := first_unpicklable(part, name)) is None:
            continue
        path, obj = found
        what = (
            f"it is {type(obj).__module__}.{type(obj).__qualname__} (an open file, lock or connection does not "
            "pickle): keep what opens it (a path, a URL) and open it in the worker, on first use"
        )
        if inspect.isfunction(obj):
            kind = (
                "a lambda"
                if obj.__name__ == "<lambda>"
                else f"the function {obj.__qualname__}, defined inside another,"
            )
            where = f"{os.path.relpath(obj.__code__.co_filename)}, line {obj.__code__.co_firstlineno}"
            what = (
                f"it is {kind} ({where}), which a worker cannot find by name: define it at the top level of its module"
            )
        return UserError(
            f"the {split} loader's workers (loader.start_method={method}) get the {name} by pickling, and {path} "
            f"cannot be pickled: {what}"
        )
    return None


def first_unpicklable(obj, path: str, depth: int = 0) -> tuple[str, Any] | None:
    """``(path, object)`` of the innermost object under ``obj`` that does not pickle, else ``None``."""
    try:
        ForkingPickler.dumps(obj)
        return None
    except Exception:
        pass
    if isinstance(obj, dict):
        children = [(f"[{k!r}]", v) for k, v in obj.items()]
    elif isinstance(obj, (list, tuple)):
        children = [(f"[{i}]", v) for i, v in enumerate(obj)]
    elif isinstance(obj, functools.partial):
        children = [(".func", obj.func), (".args", obj.args), (".keywords", obj.keywords)]
    else:
        state = None if inspect.isclass(obj) else getattr(obj, "__dict__", None)
        children = [(f".{k}", v) for k, v in state.items()] if isinstance(state, dict) else []
    for name, child in children if depth < 12 else []:
        if (found := first_unpicklable(child, path + name, depth + 1)) is not None:
            return found
    return path, obj
