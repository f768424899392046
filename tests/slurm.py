"""A real Slurm for the tests: one host, two nodes, from Debian's ``slurm-wlm`` and ``munge``.

    with SlurmCluster.start(tmp_path) as cluster:
        job = cluster.sbatch(project / "scripts" / "slurm.sbatch", cwd=project, env=env)
        cluster.wait(job, {"COMPLETED"}, timeout=300)

It writes a ``slurm.conf`` of its own in a temporary folder (free ports, its own state and spool
folders), starts a ``munged`` of its own (its own socket, ``AuthInfo=socket=...``: a system
``munged`` that another program starts or stops does not matter), then ``slurmctld`` and two
``slurmd`` (``-N node1`` and ``-N node2``) on this host, and waits until both nodes are idle.
Closing it stops the processes it started, and those alone (by the process groups it gave
them). Every client command gets ``SLURM_CONF``.

What it needs (root, the packages) is checked by :func:`unavailable`; ``.ci/run`` installs the
packages (``apt-get install -y slurm-wlm munge``), and a test run that sets
``TORCHFEED_REQUIRE_SLURM=1`` fails instead of skipping when Slurm cannot run.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

COMMANDS = ("slurmctld", "slurmd", "slurmstepd", "sbatch", "scontrol", "squeue", "scancel", "munged", "munge")
REQUIRE = os.environ.get("TORCHFEED_REQUIRE_SLURM") == "1"  # CI: skipping is a failure

CONF = """\
ClusterName=torchfeed
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: how long a requeued job waits before it may start again (default 120 s)
AuthInfo=socket={munge_socket},cred_expire=20
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool-%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
# A requeued job becomes eligible after cred_expire; the main scheduler's pass every sched_interval
# (default 60 s) or backfill's every bf_interval (default 30 s) then starts it
SchedulerParameters=sched_interval=2,bf_interval=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=30
MinJobAge=600
NodeName=node1 NodeHostname={host} NodeAddr=127.0.0.1 Port={port1} CPUs={cpus} State=UNKNOWN
NodeName=node2 NodeHostname={host} NodeAddr=127.0.0.1 Port={port2} CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes=node1,node2 Default=YES MaxTime=INFINITE State=UP
"""


def unavailable() -> str | None:
    """Why a real Slurm cannot run here (``None``: it can)."""
    if os.geteuid() != 0:
        return "a real Slurm needs root here (slurmd starts the jobs)"
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing): apt-get install -y slurm-wlm munge"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "there is no munge user (the munge package makes one)"
    if not Path("/etc/munge/munge.key").is_file():
        return "/etc/munge/munge.key is missing (the munge package makes one)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class SlurmCluster:
    """A running one-host, two-node Slurm (see the module's docstring)."""

    root: Path
    env: dict[str, str]
    procs: list[subprocess.Popen] = field(default_factory=list)
    munge_dir: Path | None = None  # its munged's socket, pid and seed files (a folder the munge user owns)

    @classmethod
    def start(cls, root: Path, timeout: float = 60) -> SlurmCluster:
        root.mkdir(parents=True, exist_ok=True)
        for sub in ("state", "spool-node1", "spool-node2"):
            (root / sub).mkdir(exist_ok=True)
        host = socket.gethostname()
        ports = {"ctld_port": _free_port(), "port1": _free_port(), "port2": _free_port()}
        conf = root / "slurm.conf"
        munge_dir = Path(tempfile.mkdtemp(prefix="torchfeed-munge-"))  # munge may not enter pytest's 0700 folders
        env = {**os.environ, "SLURM_CONF": str(conf)}
        cluster = cls(root, env, munge_dir=munge_dir)
        conf.write_text(
            CONF.format(host=host, root=root, cpus=os.cpu_count() or 1, munge_socket=cluster.munge_socket, **ports),
            encoding="utf-8",
        )
        try:
            cluster._start_munge()
            cluster._spawn(["slurmctld", "-D", "-c", "-f", str(conf)], "slurmctld")
            for node in ("node1", "node2"):
                cluster._spawn(["slurmd", "-D", "-N", node, "-f", str(conf)], f"slurmd-{node}")
            cluster._wait_idle(timeout)
        except BaseException:
            cluster.close()
            raise
        return cluster

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    def _munge_answers(self) -> bool:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            encoded = subprocess.run(["munge", "-n", "-S", str(self.munge_socket)], capture_output=True, timeout=10)
            return encoded.returncode == 0
        return False

    def _start_munge(self) -> None:
        """A foreground munged as the munge user, in its own process group, on this cluster's socket."""
        user = pwd.getpwnam("munge")
        self.munge_dir.chmod(0o755)
        os.chown(self.munge_dir, user.pw_uid, user.pw_gid)
        files = [f"--pid-file={self.munge_dir / 'munged.pid'}", f"--seed-file={self.munge_dir / 'munged.seed'}"]
        command = ["runuser", "-u", "munge", "--", "munged", "-F", f"--socket={self.munge_socket}", *files]
        self._spawn(command, "munged")
        deadline = time.monotonic() + 15
        while not self._munge_answers():
            if self.procs[-1].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged does not answer `munge -n`:\n{self.logs()}")
            time.sleep(0.1)

    def _spawn(self, cmd: list[str], name: str) -> None:
        with open(self.root / f"{name}.out", "wb") as out:
            self.procs.append(
                subprocess.Popen(cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            )

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            dead = [p.args[0] for p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{dead} ended at start:\n{self.logs()}")
            result = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], check=False)
            last = result.stdout
            states = dict(line.split() for line in last.splitlines() if line.strip())
            if states and all(s == "idle" for s in states.values()) and len(states) == 2:
                return
            time.sleep(0.3)
        raise RuntimeError(f"the nodes are not idle after {timeout} s (sinfo: {last!r}):\n{self.logs()}")

    def logs(self, lines: int = 40) -> str:
        out = []
        for log in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")):
            text = log.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {log.name}\n" + "\n".join(text))
        return "\n".join(out)

    # --- clients ------------------------------------------------------------------------------

    def run(self, cmd: list[str], check: bool = True, timeout: float = 60, **kwargs) -> subprocess.CompletedProcess:
        result = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout, **kwargs)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}): {result.stderr or result.stdout}")
        return result

    def sbatch(self, script: Path, *args: str, cwd: Path, env: dict[str, str] | None = None, options=()) -> int:
        """Submit ``script`` from ``cwd`` with ``env`` (sbatch passes it on); returns the job id."""
        full_env = {**self.env, **(env or {})}
        result = subprocess.run(
            ["sbatch", "--parsable", *options, str(script), *args],
            cwd=cwd,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if result.returncode != 0:
            raise RuntimeError(f"sbatch failed ({result.returncode}): {result.stderr}")
        return int(result.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job``'s fields of ``job_id`` (JobState, ExitCode, Restarts, ...)."""
        text = self.run(["scontrol", "-o", "show", "job", str(job_id)]).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def wait(self, job_id: int, states: set[str], timeout: float) -> dict[str, str]:
        """Wait until the job is in one of ``states``; returns its fields."""
        deadline = time.monotonic() + timeout
        fields: dict[str, str] = {}
        while time.monotonic() < deadline:
            fields = self.job(job_id)
            if fields.get("JobState") in states:
                return fields
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} not in {sorted(states)} after {timeout} s: {fields}\n{self.logs()}")

    def scancel(self, job_id: int, *options: str) -> None:
        self.run(["scancel", *options, str(job_id)])

    def steps_pids(self, job_id: int) -> list[int]:
        """Pids of the job's processes on this host (its nodes are all here), from ``scontrol listpids``."""
        result = self.run(["scontrol", "listpids", str(job_id)], check=False)
        return [int(line.split()[0]) for line in result.stdout.splitlines()[1:] if line.split()[0].isdigit()]

    # --- teardown -----------------------------------------------------------------------------

    def close(self) -> None:
        if any(p.poll() is None for p in self.procs):  # this cluster's jobs end first (their steps are slurmd's)
            with contextlib.suppress(Exception):
                jobs = self.run(["squeue", "-h", "-o", "%i"], check=False, timeout=10).stdout.split()
                if jobs:
                    self.run(["scancel", "--signal=KILL", "--full", *jobs], check=False, timeout=10)
                deadline = time.monotonic() + 40
                while jobs and time.monotonic() < deadline:
                    time.sleep(0.5)
                    jobs = self.run(["squeue", "-h", "-o", "%i"], check=False, timeout=10).stdout.split()
        for proc in reversed(self.procs):  # the slurmds, then slurmctld, then munged
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        if self.munge_dir is not None:
            shutil.rmtree(self.munge_dir, ignore_errors=True)

    def __enter__(self) -> SlurmCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
