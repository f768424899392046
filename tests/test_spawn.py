"""The folder image project's fast suite with every loader worker started by spawn (macOS, Windows).

Its own render and so its own unit of work (conftest.work_unit): the longest single run of the
template's CI, it runs on one xdist worker while the other takes the rest, instead of after the
same project's slow suite on one worker (test_render.test_rendered_project_tests_pass runs those,
with the forkserver, as it does every other image project's fast suite).
"""

from __future__ import annotations

import os
import re
import sys

import pytest
from conftest import project_env, render, run, tail

# Spawn starts each loader worker as a new interpreter that imports torch, torchvision and the project
# again (about 3 s of CPU each here, where the forkserver forks a process that has them): the suite
# takes about 3x its forkserver time, 13-14 minutes alone on 2 cores, more beside the other xdist worker.
SPAWN_SUITE_TIMEOUT_S = int(os.environ.get("TORCHFEED_SPAWN_SUITE_TIMEOUT_S", "2100"))


@pytest.mark.slow
@pytest.mark.timeout(SPAWN_SUITE_TIMEOUT_S + 120)
def test_rendered_fast_suite_passes_under_spawn(tmp_path) -> None:
    """The folder image project's fast suite, its `common` tests included, with every worker started by
    spawn: `<PACKAGE>_START_METHOD=spawn`, which `loader.start_method=auto` reads."""
    dst = tmp_path / "project"
    worker = render(dst, project_name="Feed spawn", data_source="folder", data_format="image", batch_size=16)
    package = worker.answers.combined["package_name"]
    env = {**project_env(dst), f"{package.upper()}_START_METHOD": "spawn"}
    result = run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not slow", "--durations=15"],
        dst,
        env=env,
        timeout=SPAWN_SUITE_TIMEOUT_S,
    )
    assert result.returncode == 0, (
        f"the fast suite failed under spawn (exit {result.returncode}):\n{tail(result.stdout)}"
    )
    assert re.search(r"\b\d+ passed\b", result.stdout), f"no test passed:\n{tail(result.stdout)}"
