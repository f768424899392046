# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""Command line: ``python -m <package> <command> [--config PATH] [section.key=value ...]``.

python -m <package> config                 # every key: its value in this run and what it means
python -m <package> sample-data            # a small synthetic dataset in data.root
python -m <package> bench                  # loader benchmark -> configs/tuned.yaml
python -m <package> train train.epochs=5   # one process
python -m <package> launch --nproc-per-node 2 -- train   # torchrun, 2 processes

A mistake a user can fix (a bad key, a missing file, an unreadable checkpoint) prints one
``error:`` line and exits with 2; ``--debug`` shows its traceback too. A run stopped by a signal
(SIGTERM, SIGUSR1, Ctrl-C) writes its checkpoint and exits with 128 + the signal (143, 138, 130).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

try:  # torch loads here, a second or more: a Ctrl-C meanwhile exits as one at any later point does
    from . import dist, project
    from .errors import Stalled, UserError, is_disk_full
    from .stopping import Stopped
except KeyboardInterrupt:
    print("interrupted", file=sys.stderr)
    sys.exit(130)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="YAML config (default: configs/default.yaml)")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="e.g. train.epochs=5")


def parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser of ``argv``. Of the commands the data source brings, the one ``argv`` runs gets its arguments
    (its module imported now); the others are named: ``--help``, and a mistake in the config, need no data code."""
    from .data import command, commands

    first = __doc__.splitlines()[0].replace("<package>", project.PACKAGE)  # the usage line, with this package
    p = argparse.ArgumentParser(prog=f"python -m {project.PACKAGE}", description=first)
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in commands().items():  # what this project's data source brings: sample-data, pack
        s = sub.add_parser(name, help=text)
        if name in argv[:1]:
            command(name).add_arguments(s)
        _common(s)
    b = sub.add_parser("bench", help="benchmark the loader and write configs/tuned.yaml")
    b.add_argument("--quick", action="store_true", help="a few seconds (what `train` runs when needed)")
    b.add_argument("--budget-s", type=float, default=60.0, help="time budget of the sweep (default: 60)")
    b.add_argument(
        "--paths",
        action="store_true",
        help="time each place the format can crop and decode a sample (where it has several), also without a GPU",
    )
    _common(b)
    c = sub.add_parser("config", help="print every config key: its value in this run and what it means")
    c.add_argument("--markdown", action="store_true", help="as a Markdown table (default: commented YAML)")
    _common(c)
    t = sub.add_parser("train", help="train (runs `bench --quick` first when tuned settings are stale)")
    _common(t)
    sub.add_parser("launch", help="run a command with torchrun: launch [torchrun options] -- train ...", add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(
        level=logging.INFO if dist.is_main_process() else logging.WARNING,
        format=f"[rank {dist.get_rank()}] %(levelname)s %(name)s: %(message)s",
    )
    if argv and argv[0] == "launch":
        from .launch import main as launch_main

        return launch_main(argv[1:], parser)
    try:
        args = parser(argv).parse_args(argv)
        return run(args) or 0
    except UserError as e:
        if "--debug" in argv:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a path the user gave cannot be used (permissions, a file where a folder goes, ...)
        if "--debug" in argv or not (e.filename or is_disk_full(e)):
            raise
        if is_disk_full(e):
            where = e.filename or "a file (the disk is full, or `ulimit -f` was reached)"
            print(f"error: {e.strerror}: {where}; free some space and run again", file=sys.stderr)
        else:
            print(f"error: {e.strerror}: {e.filename}", file=sys.stderr)
        return 2
    except Stalled as e:  # not a bug here: the message names what stopped answering
        if "--debug" in argv:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Stopped as e:  # asked to stop, and stopped cleanly
        print(f"{project.PACKAGE}: {e}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:  # a second Ctrl-C, or one outside training
        print(f"{project.PACKAGE}: interrupted", file=sys.stderr)
        return 130


def run(args: argparse.Namespace) -> int | None:
    from .config import load_config
    from .data import command, commands

    cfg = load_config(args.config, args.overrides)  # every key checked before any work
    if args.command in commands():
        if cfg.data.mix and getattr(args, "to", None) == "cache":  # it would read data.root, not the mix
            raise UserError("pack --to cache reads one data set, data.root, and a mix is not cached: set data.mix=")
        return command(args.command).run(cfg, args)
    if args.command == "config":
        from .config import as_markdown, as_yaml

        print(as_markdown(cfg) if args.markdown else as_yaml(cfg), end="")
    if args.command == "bench":
        from .bench import bench_command
        from .report import summary, table

        # under `launch -- bench` the ranks meet to compare what each measured (bench.py: ranks)
        dist.setup(cfg.dist.backend, cfg.dist.timeout_s, dist.pick_device(project.NUM_GPUS))
        try:
            report = bench_command(cfg, quick=args.quick, budget_s=args.budget_s, time_paths=args.paths)
        finally:
            dist.teardown()
        if dist.is_main_process():
            print(table(report))
            print(summary(report))
            print(f"saved to {cfg.loader.tuned or '(nowhere: loader.tuned is empty)'}")
    elif args.command == "train":
        from .train import main as train

        train(cfg)
    return None


if __name__ == "__main__":
    sys.exit(main())
