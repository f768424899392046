"""Reading Parquet row groups from a real S3 API server on loopback, three ways side by side.

    .venv/bin/python benchmarks/parquet_ranges.py [--rows 2400] [--rounds 3] [--out benchmarks/results]

Renders a Parquet image project from this checkout (uncommitted changes included), writes two
Parquet files of ``--rows`` rows in all (85 kB of random bytes a row, a 224 px JPEG's size; row
groups of 100, as ``pack --to parquet`` writes images), uploads them to moto's S3 server
(``python -m moto.server``, in a process group of its own), reads their footers once, then in each
round, in an order that alternates from round to round, reads every row group's two columns:

- ``RangedFile``: the project's data/s3.py (boto3's client, ranged GETs, pyarrow's ``pre_buffer``),
  what a worker does with ``data.cache_limit=0``;
- ``pyarrow S3FileSystem``: pyarrow's own S3 client (the AWS C++ SDK) on the same file and footer;
- ``whole file``: boto3's ``download_file`` to local disk, then the row groups from it, what a worker
  does through the node's cache (its first epoch).

Writes ``OUT/parquet_ranges.md`` (medians of the rounds) and ``OUT/parquet_ranges.json`` (every run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import loaders  # noqa: E402 (beside this script: render)

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
ROW_BYTES, GROUP_ROWS, BUCKET = 85_000, 100, "bench"


def write_files(folder: Path, rows: int) -> list[Path]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng, paths = np.random.default_rng(0), []
    for n in range(2):
        count = rows // 2
        image = pa.array([rng.bytes(ROW_BYTES) for _ in range(count)], pa.binary())
        table = pa.table({"image": image, "label": pa.array(rng.integers(0, 10, count))})
        paths.append(folder / f"train-{n:05d}-of-00002.parquet")
        pq.write_table(table, paths[-1], row_group_size=GROUP_ROWS)
    return paths


def start_moto() -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    os.killpg(server.pid, signal.SIGKILL)
    raise RuntimeError("moto's S3 server did not start (pip install 'moto[server]')")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2400, help="rows in all, in two files")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=HERE / "results")
    args = p.parse_args()
    os.environ.update(CREDENTIALS)
    work = Path(tempfile.mkdtemp(prefix="parquet-ranges-"))
    project = loaders.render(work / "project", "parquet")
    sys.path.insert(0, str(project / "src"))
    import boto3
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq
    from bench_project.data import s3

    paths = write_files(work, args.rows)
    mb = sum(p.stat().st_size for p in paths) / 1e6
    server, url = start_moto()
    try:
        client = boto3.client("s3", endpoint_url=url)
        client.create_bucket(Bucket=BUCKET)
        for path in paths:
            client.upload_file(str(path), BUCKET, f"d/{path.name}")

        class Options:  # the source's settings that data/s3.py reads
            s3_endpoint, s3_max_attempts = url, 3

        listed = sorted(s3.list_objects(f"s3://{BUCKET}/d/", Options).items())
        objects = [(f"s3://{BUCKET}/d/{name}", size, etag) for name, (size, etag) in listed]
        footers = [pq.read_metadata(s3.RangedFile(u, size, etag, Options)) for u, size, etag in objects]
        keys = {"access_key": "testing", "secret_key": "testing", "region": "us-east-1"}
        fs = pafs.S3FileSystem(endpoint_override=url, scheme="http", **keys)

        def read_all(open_file) -> None:
            for (u, size, etag), meta in zip(objects, footers):
                with open_file(u, size, etag) as source:
                    f = pq.ParquetFile(source, metadata=meta, pre_buffer=True)
                    for g in range(meta.num_row_groups):
                        f.read_row_group(g, columns=["image", "label"])

        def whole(u, size, etag):
            bucket, key = s3.split_url(u)
            local = work / Path(key).name
            s3.client(Options).download_file(bucket, key, str(local))
            return open(local, "rb")  # noqa: SIM115 (read_all closes it)

        ways = {
            "RangedFile (data/s3.py, boto3)": lambda u, size, etag: s3.RangedFile(u, size, etag, Options),
            "pyarrow S3FileSystem": lambda u, size, etag: fs.open_input_file(u.removeprefix("s3://")),
            "whole file (boto3), then local": whole,
        }
        runs = []
        for r in range(args.rounds):
            names = list(ways)
            for name in names[r % len(names) :] + names[: r % len(names)]:
                start = time.perf_counter()
                read_all(ways[name])
                runs.append({"round": r, "way": name, "seconds": time.perf_counter() - start, "mb": mb})
                print(f"round {r + 1}: {name}: {mb / runs[-1]['seconds']:.0f} MB/s", flush=True)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    write(args, runs, mb, list(ways))


def write(args: argparse.Namespace, runs: list[dict], mb: float, ways: list[str]) -> None:
    import pyarrow

    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    base = statistics.median(r["seconds"] for r in runs if r["way"] == ways[-1])
    lines = [
        "# Parquet row groups from S3 on loopback: ranged reads, pyarrow's S3, a whole file",
        "",
        f"Measured {when} on {platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} usable "
        f"cores; pyarrow {pyarrow.__version__}. {mb:.0f} MB in 2 files, row groups of {GROUP_ROWS} rows of "
        f"{ROW_BYTES // 1000} kB, both columns of every row group read once a round; footers read beforehand. "
        f"Medians of {args.rounds} rounds (`benchmarks/parquet_ranges.py`).",
        "",
        "| way | MB/s | seconds | x whole file |",
        "| --- | ---: | ---: | ---: |",
    ]
    for way in ways:
        seconds = statistics.median(r["seconds"] for r in runs if r["way"] == way)
        lines.append(f"| {way} | {mb / seconds:.0f} | {seconds:.2f} | {base / seconds:.2f}x |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "parquet_ranges.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (args.out / "parquet_ranges.json").write_text(json.dumps(runs, indent=1), encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
