"""The rendered 2-node project under a real Slurm (tests/slurm.py): a job that completes with a rank
killed on either node, the warning before the time limit (USR1) and its requeue, scancel, a
mistake in the config. ``.ci/run`` installs Slurm; elsewhere these skip, saying why.

The kill -9 test repeats ``TORCHFEED_SLURM_KILL_TRIES`` times per node (1 in CI).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import project_env, render, run, tail
from slurm import REQUIRE, SlurmCluster, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
PACKAGE = "slurm_check"
TRIES = int(os.environ.get("TORCHFEED_SLURM_KILL_TRIES", "1"))
SMALL = ["loader.tuned=''", "loader.batch_size=4", "data.image_size=32"]  # 4 steps an epoch on 2 ranks (args after win)
# The signal tests: 8 steps an epoch, signalled after the checkpoint at step 2, so that the signal
# lands while the epoch trains (a signal as a loader starts its workers: the rendered project's
# test_loader.py::test_loader_workers_start_with_the_stop_signals_blocked).
MID_EPOCH = ["loader.batch_size=2", "train.checkpoint_every=2"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> SlurmCluster:
    why = unavailable()
    if why:
        if REQUIRE:
            pytest.fail(f"TORCHFEED_REQUIRE_SLURM=1, but {why}")
        pytest.skip(why)
    # One cluster at a time on this host: two would number their jobs alike, and the sbatch script
    # takes each job's rendezvous port from its id. (Under xdist this module is one unit of work,
    # tests/conftest.py: work_unit; the lock holds for any other way of running it.)
    with open(tmp_path_factory.getbasetemp().parent / "slurm-cluster.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with SlurmCluster.start(tmp_path_factory.mktemp("slurm")) as cluster:
            yield cluster


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A 2-node CPU project with its sample data, as a user has it after `copier copy` and `sample-data`."""
    path = tmp_path_factory.mktemp("slurm-project") / "project"
    render(path, project_name="Slurm Check", num_nodes=2, num_gpus=0)
    command = [sys.executable, "-m", PACKAGE, "sample-data", "--per-class", "8", "data.image_size=32"]
    made = run(command, path, env=project_env(path))
    assert made.returncode == 0, tail(made.stdout)
    return path


def submit(cluster: SlurmCluster, project: Path, *args: str) -> int:
    env = {**project_env(project), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return cluster.sbatch(project / "scripts" / "slurm.sbatch", *SMALL, *args, cwd=project, env=env)


def log_of(project: Path, job: int) -> str:
    path = project / f"slurm-{job}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def epochs(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(condition, timeout: float, what: str, log=lambda: "") -> float:
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, f"no {what} after {timeout} s:\n{tail(log())}"
        time.sleep(0.2)
    return time.monotonic() - start


def rank_on(job: int, node: str) -> psutil.Process | None:
    """The training process the job runs on ``node`` (its nodes are this host's processes)."""
    for p in psutil.process_iter(["cmdline"]):
        with contextlib.suppress(psutil.Error):
            env, cmd = p.environ(), " ".join(p.info["cmdline"] or [])
            ours = env.get("SLURM_JOB_ID") == str(job) and env.get("SLURMD_NODENAME") == node and "RANK" in env
            if ours and f"-m {PACKAGE} train" in cmd and "torch.distributed.run" not in cmd:
                return p
    return None


@pytest.mark.parametrize("node", ["node2", "node1"])
@pytest.mark.parametrize("attempt", range(TRIES))
def test_kill_9_of_a_rank_on_either_node_recovers_and_completes(cluster, project, tmp_path, node, attempt):
    run_dir = tmp_path / "run"
    job = submit(cluster, project, "train.epochs=6", "train.checkpoint_every=3", f"train.run_dir={run_dir}")
    log = lambda: log_of(project, job)  # noqa: E731
    wait_for(lambda: (run_dir / "checkpoint.pt").exists(), 180, "checkpoint", log)
    victim = rank_on(job, node)
    assert victim is not None, tail(log())
    victim.kill()
    recovered = wait_for(lambda: "resumed from" in log(), 180, "resume of the restarted group", log)
    state = cluster.wait(job, {"COMPLETED", "FAILED", "CANCELLED"}, 400)
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", (state, tail(log()))
    # each epoch exactly once, on both nodes (one torchrun each, which restarted its rank)
    assert [(m["epoch"], m["world_size"]) for m in epochs(run_dir)] == [(e, 2) for e in range(6)]
    assert log().count("torch.distributed.run --nnodes 2") == 2, tail(log())
    print(f"kill -9 on {node}, try {attempt + 1}: the group resumed {recovered:.1f} s after the kill")


def test_usr1_before_the_time_limit_checkpoints_requeues_and_completes(cluster, project, tmp_path):
    run_dir = tmp_path / "run"
    job = submit(cluster, project, "train.epochs=4", *MID_EPOCH, f"train.run_dir={run_dir}")
    log = lambda: log_of(project, job)  # noqa: E731
    wait_for(lambda: (run_dir / "checkpoint.pt").exists(), 180, "a checkpoint", log)
    cluster.scancel(job, "--batch", "--signal=USR1")  # what #SBATCH --signal=B:USR1@120 sends
    sent = time.time()
    took = wait_for(lambda: "stopped by SIGTERM after step" in log(), 60, "the stop", log)
    checkpoint = run_dir / "checkpoint.pt"
    assert checkpoint.stat().st_mtime >= sent
    stopped = {int(s) for s in re.findall(r"stopped by SIGTERM after step (\d+)", log())}
    wait_for(lambda: pending_again(cluster.job(job)), 120, "the requeue", log)  # held cred_expire (tests/slurm.py)
    state = cluster.wait(job, {"COMPLETED", "FAILED", "CANCELLED"}, 400)
    text = log()
    assert state["JobState"] == "COMPLETED" and state["Restarts"] == "1", (state, tail(text))
    assert "(start 1)" in text and "(start 2)" in text and "requeued" in text  # one log, both runs
    assert not re.search(r"^error:", text, re.MULTILINE), tail(text)  # resumed at once, not after a failed restart
    assert len(stopped) == 1 and re.search(rf"resumed from \S+ at epoch \d+, batch \d+, step {stopped.pop()}\b", text)
    lines = epochs(run_dir)
    assert [m["epoch"] for m in lines] == list(range(4)) and lines[-1]["step"] == 4 * lines[0]["step"]
    print(f"USR1: checkpoint {took:.1f} s after the signal; 0 steps lost, 0 repeated")


def pending_again(fields: dict[str, str]) -> bool:
    return fields.get("JobState") == "PENDING" and fields.get("Restarts") == "1"


def test_scancel_stops_training_with_a_checkpoint_within_killwait(cluster, project, tmp_path):
    run_dir = tmp_path / "run"
    job = submit(cluster, project, "train.epochs=1000", *MID_EPOCH, f"train.run_dir={run_dir}")
    log = lambda: log_of(project, job)  # noqa: E731
    wait_for(lambda: (run_dir / "checkpoint.pt").exists(), 180, "a checkpoint", log)
    cluster.scancel(job)  # SIGTERM to every step, SIGKILL after KillWait (30 s)
    sent = time.time()
    took = wait_for(lambda: "stopped by SIGTERM after step" in log(), 30, "the stop within KillWait", log)
    assert (run_dir / "checkpoint.pt").stat().st_mtime >= sent
    assert cluster.wait(job, {"CANCELLED", "COMPLETED", "FAILED"}, 120)["JobState"] == "CANCELLED"
    assert "leaked semaphore" not in log() and "Fatal Python error" not in log()
    print(f"scancel: checkpoint {took:.1f} s after the signal")


def test_a_mistake_is_one_line_on_each_node_and_not_retried(cluster, project, tmp_path):
    job = submit(cluster, project, "train.epochs=1", f"data.root={tmp_path / 'nowhere'}")
    state = cluster.wait(job, {"COMPLETED", "FAILED", "CANCELLED"}, 120)
    text = log_of(project, job)
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert state["JobState"] == "FAILED" and len(errors) == 2 and len(set(errors)) == 1, tail(text)
    assert f"{tmp_path / 'nowhere'}/train does not exist" in errors[0] and "torch.distributed.run" not in text
    print(f"a missing data folder on 2 nodes:\n{text}")
