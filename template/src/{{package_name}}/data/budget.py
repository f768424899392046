# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""Counting the samples that could not be read, in the process that owns the run."""

from __future__ import annotations

import logging

from ..errors import UserError

log = logging.getLogger(__name__)


class BadSampleBudgetExceeded(UserError, RuntimeError):
    """More distinct samples failed than ``data.bad_sample_budget`` allows."""


class BadSampleBudget:
    """Log each unreadable sample once and stop the run when there are too many.

    Args:
        budget (int): how many distinct bad samples are tolerated (``data.bad_sample_budget``).

    >>> b = BadSampleBudget(1)
    >>> b.update([("train/cat/0001", "truncated")])
    >>> b.count
    1
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.bad: dict[str, str] = {}

    @property
    def count(self) -> int:
        return len(self.bad)

    def update(self, bad: list[tuple[str, str]]) -> None:
        for key, reason in bad:
            if key in self.bad:
                continue  # the same file fails again next epoch: counted once
            self.bad[key] = reason
            log.warning("skipped bad sample %s: %s", key, reason)
        if len(self.bad) > self.budget:
            listing = "\n".join(f"  {k}: {r}" for k, r in self.bad.items())
            raise BadSampleBudgetExceeded(
                f"{len(self.bad)} bad samples exceed data.bad_sample_budget={self.budget}; "
                f"fix or remove them, or raise the budget:\n{listing}"
            )
