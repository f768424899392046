"""Command line: ``python -m <package> <command> [--config PATH] [section.key=value ...]``.

python -m <package> sample-data            # a small synthetic dataset in data.root
python -m <package> bench                  # loader benchmark -> configs/tuned.yaml
python -m <package> train train.epochs=5   # one process
python -m <package> launch --nproc-per-node 2 -- train   # torchrun, 2 processes
"""

from __future__ import annotations

import argparse
import logging
import sys

from . import dist, project
from .config import ConfigError, load_config


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="YAML config (default: configs/default.yaml)")
    p.add_argument("overrides", nargs="*", metavar="section.key=value", help="e.g. train.epochs=5")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m {project.PACKAGE}", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sample-data", help="write a small learnable synthetic dataset to data.root")
    s.add_argument("--out", default=None, help=f"where to write (default: {sample_data_path('data.root')})")
    s.add_argument("--per-class", type=int, default=96, help="train samples per class (default: %(default)s)")
    if project.STREAM_BACKEND == "http":
        s.add_argument("--serve", action="store_true", help="then serve it over HTTP at data.root (loopback)")
    _common(s)
    if project.DATA_SOURCE == "shards":
        k = sub.add_parser("pack", help="convert a folder dataset into tar shards at data.root")
        k.add_argument("--to", choices=["shards"], required=True, help="what to write")
        k.add_argument("--src", required=True, help="the folder dataset: SRC/{train,val}/<class>/<file>")
        k.add_argument("--out", default=None, help="where the shards go (default: data.root)")
        k.add_argument("--max-size-mb", type=float, default=256, help="shard size (default: %(default)s MB)")
        k.add_argument("--max-samples", type=int, default=0, help="samples per shard (default: no limit)")
        k.add_argument("--force", action="store_true", help="replace existing shards")
        _common(k)
    b = sub.add_parser("bench", help="benchmark the loader and write configs/tuned.yaml")
    b.add_argument("--quick", action="store_true", help="a few seconds (what `train` runs when needed)")
    b.add_argument("--budget-s", type=float, default=60.0, help="time budget of the sweep (default: 60)")
    _common(b)
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

        return launch_main(argv[1:])
    args = parser().parse_args(argv)
    try:
        return run(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)  # every key checked before any work
    from .data import BadSampleBudgetExceeded, build_dataset

    try:
        if args.command == "sample-data":
            sample_data(cfg, args)
        elif args.command == "pack":
            from .data.formats import build_format
            from .data.pack import pack_shards

            fmt = build_format(project.DATA_FORMAT, cfg.data.image_size)
            out = args.out or cfg.data.root
            written = pack_shards(args.src, out, fmt, args.max_size_mb, args.max_samples, args.force)
            for split, counts in written.items():
                print(f"{split}: {sum(counts.values())} samples in {len(counts)} shards under {out}/{split}")
        elif args.command == "bench":
            from .bench import run_bench
            from .report import summary, table

            report = run_bench(cfg, build_dataset(cfg, "train"), quick=args.quick, budget_s=args.budget_s)
            print(table(report))
            print(summary(report))
            print(f"saved to {cfg.loader.tuned or '(nowhere: loader.tuned is empty)'}")
        elif args.command == "train":
            from .train import train

            train(cfg)
    except (FileNotFoundError, FileExistsError, BadSampleBudgetExceeded) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def sample_data_path(root: str) -> str:
    """Where sample-data writes: data.root, except for http (the database behind the server)."""
    return "data/sample.sqlite" if project.STREAM_BACKEND == "http" else root


def sample_data(cfg, args: argparse.Namespace) -> None:
    from .data import sample

    out = args.out or sample_data_path(cfg.data.root)
    per_class = {"train": args.per_class, "val": max(1, args.per_class // 4)}
    kwargs = {"image_size": cfg.data.image_size, "seed": cfg.train.seed}
    if project.DATA_SOURCE == "stream":
        n = sample.write_sqlite(out, project.DATA_FORMAT, per_class, **kwargs)
    elif project.DATA_SOURCE == "shards":  # write the folder layout, then pack it: 8 train shards
        import tempfile

        from .data.formats import build_format
        from .data.pack import pack_shards

        with tempfile.TemporaryDirectory() as folder:
            n = sample.write_folder(folder, project.DATA_FORMAT, per_class, **kwargs)
            fmt = build_format(project.DATA_FORMAT, cfg.data.image_size)
            per_shard = max(1, -(-args.per_class * len(sample.CLASSES) // 8))
            pack_shards(folder, out, fmt, max_samples=per_shard, force=True, progress=False)
    else:
        n = sample.write_folder(out, project.DATA_FORMAT, per_class, **kwargs)
    print(f"wrote {n} {project.DATA_FORMAT} samples to {out}")
    if getattr(args, "serve", False):
        from .data.serve import serve

        serve(out, cfg.data.root)


if __name__ == "__main__":
    sys.exit(main())
