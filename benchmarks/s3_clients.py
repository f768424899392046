"""S3 clients side by side, reading shard-sized objects from a real S3 API server on loopback.

    pip install "moto[server]" boto3 s3fs obstore      # beside the template's .venv, or in it
    .venv/bin/python benchmarks/s3_clients.py [--shards 16] [--mb 32] [--rounds 5] [--out benchmarks/results]

Starts moto's S3 server (``python -m moto.server``, a real HTTP server) on a free loopback port in a
process group of its own, writes ``--shards`` objects of ``--mb`` MB (random bytes: a shard's size, not
its content, is what a client moves), then in each round, the clients in an order that alternates from
round to round, each in a process of its own (a client's import and first connection are part of what a
loader worker pays under spawn):

- the import of the client's module and its first GET (a spawned loader worker pays both once);
- every object read whole in sequence, as one worker streams its shards (MB/s), in 1 MiB reads;
- the same over 4 threads at once (MB/s), as shards fetched ahead are;
- a small object's GET, 50 times (ms each): the per-request cost, what a listing or an index pays.

The clients: boto3 (``get_object``'s streaming body), s3fs (fsspec's file with its defaults: ranged
GETs of 5 MB, read ahead) and
obstore (Rust's object_store: ``obstore.get(...).stream()``). Each reads the endpoint from
``AWS_ENDPOINT_URL`` and its credentials from the standard AWS variables. Writes ``OUT/s3_clients.md``
(medians of the rounds) and ``OUT/s3_clients.json`` (every run).
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
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUCKET = "bench"
CLIENTS = ("boto3", "s3fs", "obstore")
THREADS = 4
SMALL_GETS = 50
CHUNK = 1 << 20

PROBE = r"""
import json, os, sys, time
from concurrent.futures import ThreadPoolExecutor

started = time.perf_counter()
client, bucket, keys = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
chunk, threads, small_gets = map(int, sys.argv[4:7])
endpoint = os.environ["AWS_ENDPOINT_URL"]

if client == "boto3":
    import boto3

    s3 = boto3.client("s3")

    def read(key):
        body = s3.get_object(Bucket=bucket, Key=key)["Body"]
        n = 0
        while data := body.read(chunk):
            n += len(data)
        return n

elif client == "s3fs":
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=endpoint)

    def read(key):
        n = 0
        with fs.open(f"{bucket}/{key}", "rb") as f:  # its defaults: read ahead in 5 MB ranges
            while data := f.read(chunk):
                n += len(data)
        return n

else:
    import obstore
    from obstore.store import S3Store

    region = os.environ["AWS_DEFAULT_REGION"]
    store = S3Store(bucket, endpoint=endpoint, region=region, client_options={"allow_http": True})

    def read(key):
        return sum(len(data) for data in obstore.get(store, key).stream(min_chunk_size=chunk))

read("small")
first = time.perf_counter() - started
t = time.perf_counter()
sequential = sum(read(k) for k in keys)
sequential_s = time.perf_counter() - t
with ThreadPoolExecutor(threads) as pool:
    t = time.perf_counter()
    together = sum(pool.map(read, keys))
    together_s = time.perf_counter() - t
small = []
for _ in range(small_gets):
    t = time.perf_counter()
    read("small")
    small.append(time.perf_counter() - t)
small.sort()
print(json.dumps({
    "import_and_first_get_s": first,
    "sequential_mb_s": sequential / sequential_s / 1e6,
    "threads_mb_s": together / together_s / 1e6,
    "small_get_ms": small[len(small) // 2] * 1e3,
}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return server
        if server.poll() is not None:
            raise SystemExit(f"moto's server exited ({server.returncode}): pip install 'moto[server]'")
        time.sleep(0.2)
    os.killpg(server.pid, signal.SIGKILL)
    raise SystemExit("moto's server did not listen within 30 s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--mb", type=int, default=32)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", type=Path, default=HERE / "results")
    args = p.parse_args()

    port = free_port()
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    os.environ.update(env)
    server = start_server(port)
    try:
        import boto3

        s3 = boto3.client("s3")
        s3.create_bucket(Bucket=BUCKET)
        keys = [f"train/shard-{i:06d}.tar" for i in range(args.shards)]
        for key in keys:
            s3.put_object(Bucket=BUCKET, Key=key, Body=os.urandom(args.mb << 20))
        s3.put_object(Bucket=BUCKET, Key="small", Body=b"{}" * 64)

        runs: list[dict] = []
        for r in range(args.rounds):
            order = CLIENTS if r % 2 == 0 else CLIENTS[::-1]
            for client in order:
                argv = [sys.executable, "-c", PROBE, client, BUCKET, ",".join(keys)]
                argv += [str(CHUNK), str(THREADS), str(SMALL_GETS)]
                done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, check=False)
                if done.returncode != 0:
                    raise SystemExit(f"{client} failed:\n{done.stderr[-3000:]}")
                runs.append({"round": r, "client": client, **json.loads(done.stdout.splitlines()[-1])})
                print(runs[-1], flush=True)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()

    write(args, runs)


def write(args: argparse.Namespace, runs: list[dict]) -> None:
    import boto3
    import obstore
    import s3fs

    versions = f"boto3 {boto3.__version__}, s3fs {s3fs.__version__}, obstore {obstore.__version__}"
    keys = ("import_and_first_get_s", "sequential_mb_s", "threads_mb_s", "small_get_ms")
    rows = []
    for client in CLIENTS:
        mine = [run for run in runs if run["client"] == client]
        rows.append([client, *(statistics.median(run[k] for run in mine) for k in keys)])
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [
        "# S3 clients against moto's S3 server on loopback (benchmarks/s3_clients.py)",
        "",
        f"Measured {when} on {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; {versions};",
        f"{args.shards} objects of {args.mb} MB; medians of {args.rounds} rounds, each client in a process of its own.",
        "",
        f"| client | import + first GET (s) | one stream (MB/s) | {THREADS} threads (MB/s) | small GET (ms) |",
        "| --- | ---: | ---: | ---: | ---: |",
        *(f"| {c} | {a:.2f} | {b:.0f} | {t:.0f} | {s:.1f} |" for c, a, b, t, s in rows),
        "",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "s3_clients.md").write_text("\n".join(lines), encoding="utf-8")
    (args.out / "s3_clients.json").write_text(json.dumps(runs, indent=1), encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
