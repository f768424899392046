"""The install a user is told to run works: a fresh venv, the printed commands, in order.

`copier copy` prints the next steps; the test takes them from copier's own output and runs
each one as printed in a new virtual environment (torch and torchvision are installed into
it first, pinned as in requirements-dev.txt, so that the resolver takes them from this
machine instead of fetching another build). Only `train` gets `train.epochs=1`, and the
commands run in the background (`&`) are stopped at the end.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run, tail

PINNED = [  # torch and torchvision as this machine has them (torchcodec is the [gpu] extra's, not a default's)
    line
    for line in (REPO / "requirements-dev.txt").read_text().splitlines()
    if line.startswith("torch") and not line.startswith("torchcodec")
]


def venv_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYTEST_", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    return env


def printed_steps(output: str) -> list[str]:
    """The commands copier printed after "Next:" (one per indented line)."""
    after = output.split("Next:", 1)[1]
    return [line.strip() for line in after.splitlines() if line.startswith("  ") and line.strip()]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_printed_install_and_commands_work_in_a_fresh_venv(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        env = venv_env(venv)
        pins = " ".join(shlex.quote(p) for p in PINNED)
        # --no-compile: the commands below compile what they import (22 s less here than pip compiling all of it)
        pip = "pip install --quiet --disable-pip-version-check --no-compile"
        torch = run(["bash", "-c", f"{pip} {pins}"], tmp_path, env=env, timeout=900)
        assert torch.returncode == 0, tail(torch.stdout)

        dest = tmp_path / "my-project"
        copier = [sys.executable, "-m", "copier", "copy", "--trust", "--defaults", "--vcs-ref", "HEAD"]
        copied = subprocess.run([*copier, str(REPO), str(dest)], capture_output=True, text=True, check=False)
        output = copied.stdout + copied.stderr
        assert copied.returncode == 0, output
        steps = printed_steps(output)
        assert steps[0] == f"cd {dest}" and steps[1].startswith("pip install"), steps
        assert output.count("Next:") == 1, f"the next steps are printed more than once:\n{output}"
        assert steps[1] in (dest / "README.md").read_text(), "the README gives another install command"

        background = []
        for step in steps[1:]:
            command = step + (" train.epochs=1" if step.endswith(" train") else "")
            if command.endswith("&"):  # a server the next commands use
                background.append(
                    subprocess.Popen(["bash", "-c", command[:-1]], cwd=dest, env=env, start_new_session=True)
                )
                continue
            result = run(["bash", "-c", command], dest, env=env, timeout=600)
            assert result.returncode == 0, f"`{command}` failed in a fresh venv:\n{tail(result.stdout)}"
        for proc in background:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        metrics = (dest / "runs" / "default" / "metrics.jsonl").read_text()
        assert re.search(r'"epoch": 0\b', metrics), metrics
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # several GB: not kept among pytest's temporary folders
