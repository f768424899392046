"""Every loader side by side, alternating, on photos of realistic size, before and after; writes a table and a chart.

    .venv/bin/python benchmarks/loaders.py [--images 2400] [--rounds 3] [--baseline 8b1aa5e] [--only GROUPS]

Renders an image project per source (folder, shards, stream/sqlite) from this checkout
(uncommitted changes included, as copier does for a dirty local template), and the default folder
image project (num_gpus 0) also from a baseline commit (``--baseline REF``, default 8b1aa5e, the
commit before the batch pool became opt-in and OpenCV took the decode; ``--baseline ""``: none),
from ``git archive REF``; then on the same data measures, at 224 px crops from 400-600 px JPEG
photos (photos.py):

    the rendered folder loader (its batch pool off, the default, and on) and the baseline's, the
    rendered cache loader (``pack --to cache``, ``data.cache=``) with its batch pool off (the
    default) and on (``loader.batch_pool=true``) and
    the baseline's cache loader (its own cache, packed by its own code; its pool on, its default),
    the rendered folder and cache loaders also with torchvision's crop in place of the task's (as
    before crops.RandomResizedCropFlip), the rendered shards loader on local shards and over
    loopback HTTP (``python -m http.server``), torchvision ``ImageFolder`` + DataLoader with the
    same crop and flip (torchcodec's decoder, or PIL's), a plain ``webdataset.WebDataset`` pipeline
    (torchcodec's decoder), and the limit of each rendered source (and of the baseline's folder and
    cache): one process's per-sample work (read, decode, crop, flip) x usable cores; for the
    cache, also that work in a process per core at once (the machine's own ceiling for it);

at 64 px on each project's own ``sample-data``: folder, stream/sqlite, shards, plain WebDataset;
a full decode (OpenCV) against the task's reduced-scale decoding of 3000 x 2250 JPEGs to a 224 crop,
the rendered task's and the baseline's; the workers' crop against torchvision's on the same boxes
(PSNR against a Lanczos-3 resize, 100 photos); a worker's hand-off of a batch into new shared
memory, into the batch pool's block (data/batch_pool.py) and into ordinary memory; the rendered
and the baseline's ``train`` for one epoch (group ``train``: at most ``--train-batches`` batches)
from the folder and the cache; and the 224 px shards over two whole epochs each (group ``epochs``),
read locally and from moto's S3 server on loopback (``python -m moto.server``, bucket ``bench``)
with the node's shard cache and without (``data.cache_limit=0``), each run from an empty
``data.cache_dir``: the first epoch downloads, the second reads the cache. Every loader has
the same num_workers, prefetch_factor 2, persistent workers and batch size. Each measurement is
its own process (probe.py); a round runs every row once, the rounds start at a different row,
and the report gives each row's median and each ratio's median over the rounds' side-by-side
pairs, so other jobs on the machine slow all rows alike. Each run also reads its processes'
CPU time against the whole machine's (the load of other jobs), and the folder and cache loaders'
runs their workers' memory over their first epoch. Writes ``OUT/loaders.md`` (tables, goals,
machine), ``OUT/loaders.png`` and ``OUT/loaders.json`` (every run).

``--only epochs`` (groups, comma-separated: 224, limit, 64, decode, quality, handoff, train, epochs)
runs those groups' rows alone, preparing only what they read, and writes ``OUT/loaders-<groups>.md``
and ``.json`` (no chart), leaving ``loaders.md``, ``.json`` and ``.png`` as they are.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import chart  # noqa: E402 (beside this script)
import photos  # noqa: E402
import report  # noqa: E402
import results  # noqa: E402

REPO = HERE.parent
PACKAGE = "bench_project"
SOURCES = ("folder", "shards", "stream", "parquet")
BEFORE = "folder-before"  # the projects' key of the folder project rendered from the baseline commit
BASELINE = results.BASELINE  # the commit before the batch pool became opt-in and OpenCV took the decode
GROUPS = ("224", "limit", "64", "decode", "quality", "handoff", "train", "epochs")
# What prepare writes for each group's rows: rendered projects (by source; BEFORE: the baseline's) and data.
LOADERS_224 = {"folder", BEFORE, "shards", "parquet", "photos", "shards224", "parquet224", "cache224"}
LOADERS_224 |= {"cache224-before"}
NEEDS = {
    "224": LOADERS_224,
    "limit": LOADERS_224,
    "64": {"folder", "shards", "stream", "parquet", "small"},
    "decode": {"folder", BEFORE, "large"},
    "quality": {"folder", "photos"},
    "handoff": {"folder"},
    "train": {"folder", BEFORE, "photos", "cache224", "cache224-before"},
    "epochs": {"shards", "parquet", "photos", "shards224", "parquet224"},
}
BUCKET = "bench"
S3_ROOT = f"s3://{BUCKET}/shards224"  # the 224 px shards (data["shards224"]) uploaded to moto's server
S3_PARQUET = f"s3://{BUCKET}/parquet224"  # and the 224 px Parquet files (data["parquet224"])
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@dataclass
class Row:
    """One line of the report: what runs (``spec`` for probe.py) and, per round, what it measured."""

    name: str
    group: str  # "224", "64": loaders at that size; "limit": their limits; "decode", "quality", "handoff", "epochs"
    spec: dict
    project: str | None = None  # the rendered project on PYTHONPATH (None: plain torchvision/webdataset)
    pending: str = ""  # why it cannot run yet (reported, not run)
    runs: list = field(default_factory=list)  # a result dict per round, or None where it failed
    errors: list = field(default_factory=list)
    env: dict = field(default_factory=dict)  # more environment for its probe (credentials for moto's S3 server)


def answers(source: str) -> dict:
    out = {"project_name": "bench project", "data_source": source, "data_format": "image"}
    return out | ({"stream_backend": "sqlite"} if source == "stream" else {})


def render(dest: Path, source: str) -> Path:
    from copier import run_copy
    from copier.errors import DirtyLocalWarning

    # vcs_ref HEAD of a dirty local checkout: copier commits the working tree in its clone first
    # (and warns that it did: that is the point here).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DirtyLocalWarning)
        run_copy(str(REPO), str(dest), data=answers(source), defaults=True, vcs_ref="HEAD", quiet=True, skip_tasks=True)
    return dest


def baseline_commit(ref: str) -> str:
    """The full hash of the commit ``ref`` names in this repository; SystemExit naming it if none."""
    out = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if out.returncode or not out.stdout.strip():
        raise SystemExit(f"--baseline {ref}: no such commit in {REPO} (--baseline '' measures without one)")
    return out.stdout.strip()


def render_baseline(dest: Path, commit: str) -> Path:
    """The default folder image project (num_gpus 0) as the template was at ``commit``: copier from that
    commit's tree (``git archive``, into a temporary folder removed afterwards; the repository's own
    worktrees and branches are left as they are)."""
    from copier import run_copy

    with tempfile.TemporaryDirectory(prefix="torchfeed-baseline-") as tree:
        archive = subprocess.Popen(["git", "-C", str(REPO), "archive", commit], stdout=subprocess.PIPE)
        untar = subprocess.run(["tar", "-x", "-C", tree], stdin=archive.stdout, capture_output=True, text=True)
        archive.stdout.close()
        if archive.wait() or untar.returncode:
            raise RuntimeError(f"git archive {commit} | tar -x failed: {untar.stderr.strip()[-300:]}")
        run_copy(tree, str(dest), data=answers("folder"), defaults=True, quiet=True, skip_tasks=True)
    return dest


def project_env(project: Path | None) -> dict:
    return {**os.environ, "PYTHONPATH": str(project / "src") if project else "", "PYTHONWARNINGS": "ignore"}


def command(project: Path, argv: list[str], cwd: Path) -> str:
    """Run ``python -m bench_project ARGV`` of ``project``; returns "" or why it failed (its last lines)."""
    out = subprocess.run(
        [sys.executable, "-m", PACKAGE, *argv], cwd=cwd, env=project_env(project), capture_output=True, text=True
    )
    if out.returncode == 0:
        return ""
    lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
    return " / ".join(lines[-2:])[-300:] or f"exit status {out.returncode}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(directory: Path) -> tuple[subprocess.Popen, int]:
    """``python -m http.server`` on loopback over ``directory``; returns it and its port once it answers."""
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(directory)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(100):
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("HEAD", "/")
            conn.getresponse()
            conn.close()
            return server, port
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise SystemExit(f"the loopback HTTP server on port {port} did not answer")


def start_s3(trees: dict[str, Path]) -> tuple[subprocess.Popen, str]:
    """moto's S3 server on loopback, in a process group of its own, with bucket ``bench`` holding every file
    under each of ``trees`` at its URL (``S3_ROOT``: the shards, train/, val/ and their ``_index.json``;
    ``S3_PARQUET``: the Parquet files); returns it and its URL once it answers."""
    import boto3

    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            if server.poll() is not None:
                raise RuntimeError(f"moto's server exited ({server.returncode}): pip install 'moto[server]'")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                conn.request("GET", "/")
                conn.getresponse().read()
                conn.close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"moto's server on port {port} did not answer within 30 s")
        keys = {k.lower(): v for k, v in S3_ENV.items()}
        client = boto3.session.Session(region_name=keys.pop("aws_default_region")).client(
            "s3", endpoint_url=url, **keys
        )
        client.create_bucket(Bucket=BUCKET)
        for root, tree in trees.items():
            prefix = root.removeprefix(f"s3://{BUCKET}/")
            files = sorted(f for f in tree.rglob("*") if f.is_file())
            for f in files:
                client.upload_file(str(f), BUCKET, f"{prefix}/{f.relative_to(tree).as_posix()}")
            if not files:
                raise RuntimeError(f"nothing under {tree}")
    except BaseException:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        raise
    return server, url


def task_lacks(project: Path, method: str) -> bool:
    """Whether the rendered image task has no method ``method`` (a part another change brings): in task.py, or
    in sample_format.py, the format class it subclasses (since v0.3.0)."""
    files = [project / "src" / PACKAGE / name for name in ("task.py", "sample_format.py")]
    text = "".join(f.read_text(encoding="utf-8") for f in files if f.is_file())
    return not re.search(rf"\n    def {method}\(", text)


def prepare(work: Path, args: argparse.Namespace, groups: tuple[str, ...] = GROUPS) -> tuple[dict, dict]:
    """Render the projects and write the data the rows of ``groups`` read; returns the projects and the
    data's paths (also of what was not needed, unwritten).

    ``data["failed"]`` maps the path of what could not be written to why: the rows reading it
    are reported as pending.
    """
    need = set().union(*(NEEDS[g] for g in groups))
    if not args.baseline:
        need -= {BEFORE, "cache224-before"}
    t0 = time.perf_counter()
    sources = [s for s in SOURCES if s in need]
    projects = {s: render(work / f"project-{s}", s) for s in sources}
    data: dict = {"photos": work / "photos", "shards224": work / "www" / "shards224", "cache224": work / "cache224"}
    data["parquet224"] = work / "parquet224"
    # the baseline's files under a folder of their own: no path of it starts with one of the current rows'
    data["cache224-before"] = work / "baseline" / "cache224"
    data["failed"] = failed = {}
    data["unrendered"] = {}  # project key -> why it could not be rendered (its rows are pending)
    if BEFORE in need:
        try:
            projects[BEFORE] = render_baseline(work / "baseline" / "project-folder", args.baseline_commit)
            sources.append(f"folder at {args.baseline}")
        except Exception as e:  # its rows are pending, the others run
            data["unrendered"][BEFORE] = f"rendering the baseline {args.baseline} fails: {type(e).__name__}: {e}"[:400]
    print(f"rendered {', '.join(sources)} in {time.perf_counter() - t0:.0f} s", flush=True)
    data["photo_mb"] = None
    if "photos" in need:
        size = photos.write_photos(data["photos"], args.images, max(photos.CLASSES, args.images // 10))
        data["photo_mb"] = size / 1e6
        print(f"wrote {args.images} train photos ({size / 1e6:.0f} MB with val) in {time.perf_counter() - t0:.0f} s")
    argv = ["pack", "--to", "shards", "--src", str(data["photos"]), "--out", str(data["shards224"])]
    argv += ["--max-samples", str(max(1, -(-args.images // args.shards))), "data.image_size=224"]
    if "shards224" in need and (why := command(projects["shards"], argv, work)):
        failed[str(data["shards224"])] = f"`pack --to shards` fails: {why}"
    argv = ["pack", "--to", "parquet", "--src", str(data["photos"]), "--out", str(data["parquet224"])]
    argv += ["--rows-per-group", str(args.parquet_group_rows), "data.image_size=224"]
    if "parquet224" in need and (why := command(projects["parquet"], argv, work)):
        failed[str(data["parquet224"])] = f"`pack --to parquet` fails: {why}"
    for key, project in (("cache224", "folder"), ("cache224-before", BEFORE)):  # each project packs its own
        if key not in need or project not in projects:
            continue
        lacking = [m for m in ("decode_for_cache", "from_cache") if task_lacks(projects[project], m)]
        argv = ["pack", "--to", "cache", "--out", str(data[key]), f"data.root={data['photos']}"]
        if lacking:
            failed[str(data[key])] = f"the image task has no {' or '.join('Task.' + m for m in lacking)} yet"
        elif why := command(projects[project], [*argv, "data.image_size=224"], work):
            failed[str(data[key])] = f"`pack --to cache` fails: {why}"
        elif key == "cache224":
            data["cache_mb"] = sum(f.stat().st_size for f in (data["cache224"] / "train").iterdir()) / 1e6
    if need & {"shards224", "cache224"}:
        packed = " and ".join(k for k, v in (("shards", "shards224"), ("the cache", "cache224")) if v in need)
        print(f"packed {packed} in {time.perf_counter() - t0:.0f} s", flush=True)
    for source in SOURCES:  # each project's own sample-data: the same images
        out = data[f"small_{source}"] = work / ("small.sqlite" if source == "stream" else f"small-{source}")
        argv = ["sample-data", "--per-class", str(args.small_per_class), "--out", str(out), "data.image_size=64"]
        if "small" in need and (why := command(projects[source], argv, work)):
            failed[str(out)] = f"`sample-data` of the {source} project fails: {why}"
    data["large"] = [str(p) for p in photos.write_large(work / "large", args.large)] if "large" in need else []
    data["quality"] = [str(p) for p in sorted(Path(data["photos"], "train").glob("*/*.jpg"))[: args.quality_photos]]
    print(f"data ready in {time.perf_counter() - t0:.0f} s", flush=True)
    return projects, data


def build_rows(data: dict, args: argparse.Namespace, server: tuple, s3: tuple) -> list[Row]:
    """The report's rows, in the order a round runs them (each round starts one further on).

    ``server``: the loopback HTTP server and its port; ``s3``: moto's S3 server and its URL (either
    ``(None, None)`` when no row of the run reads from it). The baseline's rows (project ``BEFORE``) are
    left out with ``--baseline ''``; their names are results.py's (``results.before``).
    """
    common = {"workers": args.workers, "batch_size": args.batch_size, "seconds": args.seconds}
    cores = len(os.sched_getaffinity(0))
    photo_root, shards_root = str(data["photos"]), str(data["shards224"])
    folder = [f"data.root={photo_root}", "data.image_size=224"]
    cache = [*folder, f"data.cache={data['cache224']}"]
    pool = [*cache, "loader.batch_pool=true"]
    cache_before = [*folder, f"data.cache={data['cache224-before']}"]  # the baseline's pool: on, its default
    shards = [f"data.root={shards_root}", "data.image_size=224"]
    parquet = [f"data.root={data['parquet224']}", "data.image_size=224"]
    remote = [f"data.root=http://127.0.0.1:{server[1]}/shards224", "data.image_size=224"]
    bucket = [f"data.root={S3_ROOT}", f"data.s3_endpoint={s3[1]}", "data.image_size=224"]
    moto = {"extra_pids": [s3[0].pid] if s3[0] else [], "needs": shards_root}
    parquet_bucket = [f"data.root={S3_PARQUET}", f"data.s3_endpoint={s3[1]}", "data.image_size=224"]
    parquet_moto = {**moto, "needs": str(data["parquet224"])}
    ref = args.baseline

    def before(what: str) -> str:
        return results.before(what, ref)

    def small(source: str) -> list[str]:
        return [f"data.root={data['small_' + source]}", "data.image_size=64"]

    def loader(name, group, project, overrides, **extra) -> Row:
        return Row(name, group, {"kind": "loader", "overrides": overrides, **common, **extra}, project)

    def limit(name, project, overrides, **extra) -> Row:
        return Row(name, "limit", {"kind": "limit", "overrides": overrides, **common, **extra}, project)

    def plain(name, kind, root, size, **extra) -> Row:
        return Row(name, "224" if size == 224 else "64", {"kind": kind, "root": root, "size": size, **common, **extra})

    def decode(name, mode, project="folder", **extra) -> Row:
        spec = {"kind": "decode", "mode": mode, "files": data["large"], "size": 224, "seconds": args.seconds}
        return Row(name, "decode", {**spec, **extra}, project)

    def train(name, project, overrides) -> Row:
        spec = {"kind": "train", "overrides": overrides, **common, "max_batches": args.train_batches}
        return Row(name, "train", spec, project)

    rows = [
        loader(results.FOLDER, "224", "folder", folder, memory=True, split=True),
        loader(results.FOLDER_POOL, "224", "folder", [*folder, "loader.batch_pool=true"], split=True),
        loader(before("folder"), "224", BEFORE, folder, memory=True, split=True),
        loader(results.CACHE, "224", "folder", cache, memory=True, split=True),
        loader(results.CACHE_POOL, "224", "folder", pool, memory=True, split=True),
        loader(before("cache"), "224", BEFORE, cache_before, memory=True, split=True),
        loader("cache, torchvision's crop (before)", "224", "folder", cache, torchvision_crop=True),
        loader("folder, torchvision's crop (before)", "224", "folder", folder, torchvision_crop=True),
        loader("shards, local (rendered)", "224", "shards", shards),
        loader(
            "shards, loopback HTTP (rendered)",
            "224",
            "shards",
            remote,
            extra_pids=[server[0].pid] if server[0] else [],
            needs=shards_root,
        ),
        plain("ImageFolder: torchcodec decode_image, v2 on tensors", "imagefolder", photo_root, 224, decoder="tensor"),
        plain("ImageFolder: PIL loader, v2 on PIL", "imagefolder", photo_root, 224, decoder="pil"),
        loader("parquet, local (rendered)", "224", "parquet", parquet),
        plain("plain webdataset.WebDataset (torchcodec decode_image)", "webdataset", shards_root, 224),
        limit("folder limit", "folder", folder),
        limit("folder limit (before)", BEFORE, folder),
        limit("cache limit", "folder", cache),
        limit("cache limit (before)", BEFORE, cache_before),
        limit(results.TOGETHER, "folder", cache, processes=cores),
        limit("cache limit, torchvision's crop (before)", "folder", cache, torchvision_crop=True),
        limit("shards limit", "shards", shards),
        limit("parquet limit", "parquet", parquet),
        loader("folder (rendered)", "64", "folder", small("folder")),
        loader("stream/sqlite (rendered)", "64", "stream", small("stream")),
        loader("shards (rendered)", "64", "shards", small("shards")),
        loader("parquet (rendered)", "64", "parquet", small("parquet")),
        plain("plain webdataset.WebDataset (torchcodec decode_image)", "webdataset", str(data["small_shards"]), 64),
        decode(results.FULL_DECODE, "full"),
        decode(results.TASK_DECODE, "task"),
        decode(before(results.TASK_DECODE_STEM), "task", BEFORE),
        decode(results.EIGHTH_DECODE, "task", min_side=256),
        Row(
            "the workers' crop: RandomResizedCropFlip against torchvision's",
            "quality",
            {"kind": "crop_quality", "files": data["quality"], "size": 224, "boxes": args.quality_boxes, "once": True},
            "folder",
        ),
        Row(
            "a worker's hand-off: a batch of 224 px crops into shared memory",
            "handoff",
            {"kind": "handoff", "batch_size": args.batch_size, "size": 224, "once": True},
            "folder",
        ),
        train(results.TRAIN_FOLDER, "folder", folder),
        train(before("train, folder"), BEFORE, folder),
        train(results.TRAIN_CACHE, "folder", cache),
        train(results.TRAIN_CACHE_POOL, "folder", pool),
        train(before("train, cache"), BEFORE, cache_before),
    ]

    def epochs(name: str, source: str, overrides: list[str], server: dict | None = None) -> Row:
        """Two whole epochs of ``source`` (``server``: from moto's S3 server, its pid and data)."""
        spec = {"kind": "epochs", "overrides": overrides, **common, **(server or {})}
        return Row(name, "epochs", spec, source, env=S3_ENV if server else {})

    rows += [
        epochs("shards, local (rendered)", "shards", shards),
        epochs("shards, S3 on loopback (rendered)", "shards", bucket, moto),
        epochs(
            "shards, S3 on loopback, no cache (data.cache_limit=0)", "shards", [*bucket, "data.cache_limit=0"], moto
        ),
        epochs("parquet, local (rendered)", "parquet", parquet),
        epochs(
            "parquet, S3 on loopback (rendered: whole files into the cache)", "parquet", parquet_bucket, parquet_moto
        ),
        epochs(
            "parquet, S3 on loopback, ranged reads (data.cache_limit=0)",
            "parquet",
            [*parquet_bucket, "data.cache_limit=0"],
            parquet_moto,
        ),
    ]
    if not ref:  # --baseline '': no rows of the baseline
        rows = [r for r in rows if r.project != BEFORE]
    batches = args.images // args.batch_size  # the train split's batches an epoch (drop_last)
    for row in rows:
        spec = json.dumps(row.spec)
        if row.group == "train" and (batches < 2 or args.train_batches == 1):
            row.pending = f"one batch an epoch ({args.images} photos, batch {args.batch_size}, --train-batches "
            row.pending += f"{args.train_batches}): the rate after the first batch needs 2 or more"
            continue
        row.pending = data["unrendered"].get(row.project, "")
        row.pending = row.pending or next(
            (why for path, why in data["failed"].items() if json.dumps(path)[1:-1] in spec), ""
        )
    return rows


def run_probe(row: Row, projects: dict, work: Path) -> dict:
    """One measurement of ``row`` in its own process; raises RuntimeError with its error output."""
    project = projects[row.project] if row.project else None
    out = subprocess.run(
        [sys.executable, str(HERE / "probe.py"), json.dumps(row.spec)],
        cwd=work,
        env={**project_env(project), **row.env},
        capture_output=True,
        text=True,
        timeout=900 if row.spec["kind"] == "train" else 300,  # a train epoch steps a model on the CPU
        start_new_session=True,
    )
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        tail = [line for line in out.stderr.strip().splitlines() if line.strip()][-3:]
        raise RuntimeError(" / ".join(tail)[-400:] or f"exit status {out.returncode}")
    return json.loads(lines[-1])


def measure(rows: list[Row], projects: dict, work: Path, rounds: int) -> None:
    """Run every row once per round, each round starting one row further on."""
    active = [r for r in rows if not r.pending]
    for k in range(rounds if active else 0):
        t0 = time.perf_counter()
        for row in active[k % len(active) :] + active[: k % len(active)]:
            if row.spec.get("once") and any(row.runs):  # a measurement that does not drift with the load
                continue
            try:
                result = run_probe(row, projects, work)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                row.errors.append(str(e))
                result = None
            while len(row.runs) < k:
                row.runs.append(None)
            row.runs.append(result)
            speed = f"{result['samples_per_s']:.0f} samples/s" if result else f"failed: {row.errors[-1][:200]}"
            if result and "epoch_samples_per_s" in result:
                speed = " then ".join(f"{x:.0f}" for x in result["epoch_samples_per_s"]) + " samples/s by epoch"
            if result and "reported_samples_per_s" in result:
                speed += f" after the first batch ({result['reported_samples_per_s']:.0f} in metrics.jsonl)"
            print(f"  round {k + 1}: {row.group:>6} {row.name}: {speed}", flush=True)
        print(f"round {k + 1} of {rounds} in {time.perf_counter() - t0:.0f} s", flush=True)
    for row in active:  # a row failing every round is pending, with its error
        if not any(row.runs):
            row.pending = f"fails: {row.errors[-1]}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=2400, help="train photos, 400-600 px (val: a tenth)")
    p.add_argument("--out", default=str(HERE / "results"), help="where loaders.md, .png and .json go")
    p.add_argument("--rounds", type=int, default=3, help="runs of every row; medians are reported")
    p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per run (after the warm-up)")
    p.add_argument("--workers", type=int, default=2, help="num_workers of every loader")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--shards", type=int, default=16, help="train shards the photos are packed into")
    p.add_argument("--parquet-group-rows", type=int, default=100, help="rows a Parquet row group (the Hub's, images)")
    p.add_argument("--small-per-class", type=int, default=500, help="64 px sample-data per class (4 classes)")
    p.add_argument("--large", type=int, default=6, help="3000 x 2250 JPEGs for the decode rows")
    p.add_argument("--quality-photos", type=int, default=100, help="photos the crop's quality is measured on")
    p.add_argument("--quality-boxes", type=int, default=10, help="crop boxes per photo and stored size")
    p.add_argument(
        "--train-batches", type=int, default=10, help="train.max_batches of the train rows' one epoch (0: all of it)"
    )
    p.add_argument(
        "--baseline",
        default=BASELINE,
        metavar="REF",
        help=f"the commit the 'before' rows render the folder project from (default: {BASELINE}; '': none)",
    )
    p.add_argument("--work", default=None, help="keep the projects and data here (default: a temporary folder)")
    p.add_argument(
        "--only",
        default=None,
        metavar="GROUP[,GROUP]",
        help=f"run only these groups' rows ({', '.join(GROUPS)}); writes loaders-<groups>.md and .json",
    )
    args = p.parse_args()
    groups = tuple(g.strip() for g in args.only.split(",") if g.strip()) if args.only else GROUPS
    unknown = [g for g in groups if g not in GROUPS]
    if unknown or not groups:
        raise SystemExit(f"--only {args.only}: the groups are {', '.join(GROUPS)}")
    args.baseline = args.baseline.strip()
    args.baseline_commit = baseline_commit(args.baseline) if args.baseline else None
    start = time.perf_counter()
    work = Path(args.work or tempfile.mkdtemp(prefix="torchfeed-bench-"))
    if args.work and work.exists() and any(work.iterdir()):
        raise SystemExit(f"--work {work} is not empty (expected a new or empty folder)")
    work.mkdir(parents=True, exist_ok=True)
    server, s3 = (None, None), (None, None)
    try:
        template = results.template_state(REPO)  # what prepare renders (edits made later are not measured)
        projects, data = prepare(work, args, groups)
        if "224" in groups:
            server = serve(work / "www")
        if "epochs" in groups and {str(data["shards224"]), str(data["parquet224"])} - set(data["failed"]):
            t0 = time.perf_counter()
            try:
                trees = {S3_ROOT: data["shards224"], S3_PARQUET: data["parquet224"]}
                s3 = start_s3({url: tree for url, tree in trees.items() if str(tree) not in data["failed"]})
                print(f"moto's S3 server at {s3[1]} holds the data ({time.perf_counter() - t0:.0f} s)", flush=True)
            except Exception as e:  # its rows are pending, the others run
                for url in (S3_ROOT, S3_PARQUET):
                    data["failed"][url] = f"moto's S3 server: {type(e).__name__}: {e}"[:400]
        rows = [r for r in build_rows(data, args, server, s3) if r.group in groups]
        measure(rows, projects, work, args.rounds)
    finally:
        if server[0] is not None:
            server[0].kill()
        if s3[0] is not None:
            os.killpg(s3[0].pid, signal.SIGKILL)
            s3[0].wait()
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "work", "only")}
    if args.only:
        settings["only"] = list(groups)
    settings |= {"photo_mb": data["photo_mb"], "cache_mb": data.get("cache_mb"), "run_s": time.perf_counter() - start}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = results.collect(rows, settings, REPO, template)
    every_run = json.dumps(result, indent=1).replace(str(work), "$WORK")  # the temporary folder's name is noise
    name = "loaders-" + "-".join(groups) if args.only else "loaders"
    (out / f"{name}.json").write_text(every_run + "\n", encoding="utf-8")
    (out / f"{name}.md").write_text(report.markdown(result), encoding="utf-8")
    if args.only:
        print(f"wrote {out}/{name}.md and {name}.json in {settings['run_s'] / 60:.1f} min")
        return
    chart.draw(result, out / "loaders.png")
    print(f"wrote {out}/loaders.md, loaders.png and loaders.json in {settings['run_s'] / 60:.1f} min")


if __name__ == "__main__":
    main()
