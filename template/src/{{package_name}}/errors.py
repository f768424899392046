# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""Mistakes a user can fix, and parts of a run that stopped answering. The command line prints
each as one ``error:`` line (exit code 2 for a mistake, 1 for a stall).

Tracebacks are for bugs; ``--debug`` shows one for these too.
"""

from __future__ import annotations

import errno


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
    """/dev/shm cannot hold what the loaders' workers need (shm.py); the message names its size, the need, the fixes."""


class WorkerLost(Stalled):
    """A loader worker died in the middle of an epoch (killed: the OOM killer, most often); the message names it."""


class DiskFull(UserError, OSError):
    """A write failed for want of space (or past a file-size limit); the message names the path and what was kept."""


FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # no space, over quota, past the file-size limit


def is_disk_full(e: BaseException) -> bool:
    """Whether ``e`` is a write that failed for want of space (or past a file-size limit)."""
    return isinstance(e, OSError) and e.errno in FULL_ERRNOS


def require(key: str, value: object, ok: bool, expected: str) -> None:
    """Raise :class:`ConfigError` naming ``key`` and what is allowed unless ``ok``."""
    if not ok:
        raise ConfigError(f"{key}={value!r} is out of range (expected {expected})")
