# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""Stopping a run on a signal: it finishes its step, every rank agrees, one checkpoint, then it exits.

    SIGTERM   (a scheduler's preemption, `scancel`, Kubernetes before its grace period ends, `kill`)
    SIGUSR1   (Slurm's warning before the time limit: `#SBATCH --signal=USR1@120`)
    SIGINT    (Ctrl-C; a second Ctrl-C, a moment later, stops at once, without a checkpoint)

``train`` then exits with 128 + the signal's number: 143, 138 or 130. Running the same command
again resumes at the step after the last one trained: none repeated, none skipped.

# NOTE [ Every rank stops at the same step ]
# The signal reaches the ranks at slightly different moments (torchrun passes it to each, Slurm
# to each node), so a rank that stopped on its own would leave the others waiting in the next
# step's all-reduce. The handler only notes the signal; after each step the ranks agree on it
# with one small collective on the CPU group (a MAX over an int: no device sync), so all of them
# see it after the same step, write one checkpoint together and leave together. Loader workers
# ignore these signals (they start with them blocked): a worker ended by the signal would break
# the last batches of its rank; they end with their rank instead.
"""

from __future__ import annotations

import logging
import signal
import threading
import time

from . import dist

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
# A SIGINT this soon after the first is the same Ctrl-C: the terminal sends it to the process group,
# and a wrapper in that group (`timeout`, `uv run`, a shell script's trap) passes it on once more.
SAME_CTRL_C_S = 0.5


class Stopped(Exception):
    """The run stopped on a signal after writing its checkpoint; ``code`` is the exit status."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.code = 128 + signum


class StopOnSignal:
    """Note SIGTERM, SIGUSR1 and SIGINT while the run is in its ``with`` block; :meth:`agreed` asks
    every rank whether one came. Outside the main thread (a run inside a library) it notes nothing."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}
        self._first_at = 0.0  # when the first signal came (time.monotonic)

    def __enter__(self) -> StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._note) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _note(self, signum: int, frame) -> None:
        if self.signum is None:
            log.warning("%s: the run stops after this step and writes its checkpoint", signal.Signals(signum).name)
            self._first_at = time.monotonic()
        elif signum == signal.SIGINT and time.monotonic() - self._first_at > SAME_CTRL_C_S:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self.signum = signum

    def agreed(self) -> int | None:
        """The signal every rank stops for (the highest any rank noted), or ``None``; a collective."""
        signum = dist.agree_max(self.signum or 0)
        return signum or None
