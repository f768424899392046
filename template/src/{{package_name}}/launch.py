# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""Start training on several processes with torchrun.

    python -m <package> launch -- train                          # --nproc-per-node from the answers
    python -m <package> launch --nproc-per-node 2 -- train train.epochs=5
    python -m <package> launch --nnodes 2 --node-rank 0 --rdzv-endpoint node0:29500 -- train

On one node this is ``torchrun --standalone``; with ``--nnodes > 1`` it uses a c10d rendezvous
at ``--rdzv-endpoint`` (see ``scripts/slurm.sbatch`` when the project has more than one node).

Before torchrun starts, the command's config and data are checked as ``train`` would check them:
a mistake (a bad key, a missing data folder) is one ``error:`` line and exit code 2, on each
node, instead of a crash that torchrun would restart ``--max-restarts`` times. torchrun gets a
store of its own for each rendezvous round (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``), so a
group restarted after a rank died meets again on every node (dist.py's NOTE). A signal that stops
the ranks ends launch with 128 + its number, as it ends train.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

import torch

from . import dist, project
from .errors import UserError

COMMANDS = ("train", "bench")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=f"python -m {project.PACKAGE} launch",
        usage=f"python -m {project.PACKAGE} launch [torchrun options] -- train [section.key=value ...]",
        description="Run a command on several processes with torchrun.",
    )
    default_nproc = project.NUM_GPUS if project.NUM_GPUS > 0 else 1
    p.add_argument(
        "--nproc-per-node",
        type=int,
        default=default_nproc,
        help=f"processes on this node (default: {default_nproc}, from the answers)",
    )
    p.add_argument("--nnodes", type=int, default=project.NUM_NODES, help="nodes in the job (default: %(default)s)")
    p.add_argument("--node-rank", type=int, default=None, help="this node's rank (multi-node)")
    p.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of the rendezvous (multi-node)")
    p.add_argument("--rdzv-id", default=os.environ.get("SLURM_JOB_ID", project.PACKAGE), help="job id for rendezvous")
    p.add_argument("--max-restarts", type=int, default=0, help="restarts of the worker group after a failure")
    return p


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """``[options] -- command [args]`` -> (options, command + args).

    >>> split_argv(["--nproc-per-node", "2", "--", "train", "train.epochs=1"])
    (['--nproc-per-node', '2'], ['train', 'train.epochs=1'])
    """
    if "--" not in argv:
        return argv, ["train"]
    i = argv.index("--")
    return argv[:i], argv[i + 1 :] or ["train"]


def torchrun_command(args: argparse.Namespace, command: list[str]) -> list[str]:
    """The torchrun command line (``python -m torch.distributed.run`` of this interpreter)."""
    if command[0] not in COMMANDS:
        raise UserError(f"launch runs one of {', '.join(COMMANDS)} (got {command[0]!r}); e.g. launch -- train")
    if args.nproc_per_node < 1 or args.nnodes < 1:
        raise UserError(f"--nproc-per-node ({args.nproc_per_node}) and --nnodes ({args.nnodes}) must be >= 1")
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if args.nnodes == 1 and args.rdzv_endpoint is None:
        cmd.append("--standalone")
    else:
        if args.rdzv_endpoint is None:
            raise UserError(
                f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT (the first node); "
                "for a run on this machine alone pass --nnodes 1"
            )
        cmd += [
            "--nnodes",
            str(args.nnodes),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            args.rdzv_endpoint,
            "--rdzv-id",
            str(args.rdzv_id),
        ]
        if args.node_rank is not None:
            cmd += ["--node-rank", str(args.node_rank)]
        node = args.node_rank if args.node_rank is not None else os.environ.get("SLURM_NODEID")
        if node is not None:
            # The first node's launch hosts the rendezvous store, the others only dial it: left to
            # torchrun, every launch on a host that answers to the endpoint's address tries to host it.
            cmd += ["--rdzv-conf", f"is_host={'true' if str(node) == '0' else 'false'}"]
    cmd += ["--nproc-per-node", str(args.nproc_per_node), "--max-restarts", str(args.max_restarts)]
    return cmd + ["-m", project.PACKAGE, *command]


def check(command: list[str], world_size: int, command_parser, processes: int = 1) -> None:
    """What ``train`` or ``bench`` would refuse at its start: the config, the data of both splits,
    a training loader for ``world_size`` processes (without its workers), and the loaders' use of
    /dev/shm by the ``processes`` of this node (bench's: its cheapest setting with workers).

    ``command_parser(command)`` is the command line's parser (``__main__.parser``, handed down: this module
    never imports the one above it).
    """
    from .config import load_config
    from .data import build_dataset, build_loader
    from .data.settings import LoaderSettings, loader_settings, plan_shm

    args = command_parser(command).parse_args(command)
    cfg = load_config(args.config, args.overrides)
    dist.backend_for(cfg.dist.backend, dist.pick_device(project.NUM_GPUS))
    train, val = (build_dataset(cfg, split, rank=0, world_size=world_size) for split in ("train", "val"))
    build_loader(train, cfg, "train", LoaderSettings(num_workers=0), rank=0, world_size=world_size)
    if command[0] == "bench":  # its cheapest setting with workers
        least = {"train": LoaderSettings(num_workers=1, prefetch_factor=2)}
        plan_shm({"train": train}, least, cfg.loader.batch_size, processes)
    else:
        loader_settings(cfg, {"train": train, "val": val}, processes=processes)


def main(argv: list[str], command_parser) -> int:
    """``launch [torchrun options] -- <command>``; ``command_parser(command)`` parses it (``__main__.parser``)."""
    options, command = split_argv(argv)
    args = parser().parse_args(options)
    try:
        if project.NUM_GPUS > 0 and torch.cuda.is_available():
            # before any process starts: a rank without a GPU would fail with "invalid device ordinal"
            dist.check_gpus(args.nproc_per_node, torch.cuda.device_count())
        cmd = torchrun_command(args, command)
        check(command, args.nnodes * args.nproc_per_node, command_parser, args.nproc_per_node)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a path that cannot be used
        if not e.filename:
            raise
        print(f"error: {e.strerror}: {e.filename}", file=sys.stderr)
        return 2
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # a store per rendezvous round (see above)
    print("+ " + " ".join(cmd), flush=True)
    return torchrun(cmd[3:])


def torchrun(args: list[str]) -> int:
    """Run torchrun in this process (its entry point, ``torch.distributed.run.main``); its exit status.

    # NOTE [ torchrun runs in launch's process ]
    # A SIGTERM from a scheduler or a Ctrl-C reaches torchrun itself, which passes it to every rank
    # it started and waits for them: they stop after a step with a checkpoint (stopping.py). A parent
    # that only waited would die of the SIGTERM and leave torchrun and the ranks running. torchrun
    # then raises the signal as an exception, a traceback of its own internals: launch exits with
    # 128 + the signal instead, as train does, and a failed rank's summary is said without one.
    """
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(args)
    except SignalException as e:
        print(f"{project.PACKAGE} launch: stopped by {signal.Signals(e.sigval).name}", file=sys.stderr)
        return 128 + e.sigval
    except ChildFailedError as e:
        print(e, file=sys.stderr)
        return 1
    return 0
