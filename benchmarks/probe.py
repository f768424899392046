"""One measurement of the loader benchmark, run in its own process; prints one JSON line.

    PYTHONPATH=<rendered project>/src python benchmarks/probe.py '{"kind": "loader", ...}'

``loaders.py`` starts one of these per row and round. Kinds:

    loader       the rendered project's train loader (``build_dataset`` + ``build_loader``)
    train        the rendered project's ``train`` for one epoch (its CLI, in this process): the epoch's
                 samples/s after its first batch, timed alike for any version of the template, beside
                 the ``samples_per_s`` its metrics.jsonl reports
    epochs       that loader's first and second epoch, each timed in full, with an empty shard cache
                 (``data.cache_dir``, a new folder in the working directory) at the start
    imagefolder  torchvision ``ImageFolder`` + DataLoader with the same crop and flip
    webdataset   a plain ``webdataset.WebDataset`` pipeline with the same crop and flip
    limit        one process's per-sample work on the project's source, no DataLoader; with
                 ``processes`` N, that work in N processes at once, timed over the same window
    decode       one 3000 x 2250 JPEG to a 224 crop: full decode (OpenCV), or the task's reduced-scale one
    crop_quality the workers' crop against torchvision's: PSNR against Lanczos-3, and its cost
    handoff      stacking a batch of crops as a loader worker does (into new shared memory), into a block
                 of the batch pool (data/batch_pool.py), and into ordinary memory

A loader is timed like the training loop minus the model: after ``WARMUP`` batches (the workers
have started), samples over wall time until ``seconds`` have passed, across epoch ends. Over the
same window the probe reads the whole machine's busy CPU time (/proc/stat) and its own process
tree's, so the report can say how much other jobs took. The ``epochs`` kind instead times whole
epochs, each from its first batch request to its last batch: the first epoch includes the
workers' start (persistent workers: they start with the first epoch's iterator, in every row alike).

No deprecated decoder of torchvision.io is used: the peers decode with torchcodec, the full decode is
OpenCV's (as the rendered task's is since it left torchvision's).
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

import cv2
import numpy as np
import psutil
import torch
from PIL import Image
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F_v2

WARMUP = 3  # batches (or 20 samples for single-process kinds) before the clock starts
MIN_BATCHES = 8


def augment(size: int) -> v2.Transform:
    """The rendered image task's train transform: random-resized crop and horizontal flip."""
    return v2.Compose([v2.RandomResizedCrop(size, scale=(0.35, 1.0), antialias=True), v2.RandomHorizontalFlip()])


def busy_cpu_s() -> float:
    """Seconds every CPU of the machine has spent busy since boot (/proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def tree_cpu_s(extra_pids=()) -> float:
    """CPU seconds of this process, its descendants (alive, or waited for) and ``extra_pids``."""
    total = 0.0
    procs = [psutil.Process()]
    procs += procs[0].children(recursive=True)
    procs += [psutil.Process(pid) for pid in extra_pids if psutil.pid_exists(pid)]
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            continue
    return total


def loader_workers() -> list[psutil.Process]:
    """This process's DataLoader workers: the rendered loaders' are the children of their forkserver,
    a child of this process."""
    out = []
    for child in psutil.Process().children():
        try:
            out += child.children() if "forkserver" in " ".join(child.cmdline()) else []
        except psutil.Error:
            continue
    return out


def role_cpu_s() -> dict:
    """CPU seconds by role: this process (the training process, all its threads), the loader workers'
    main threads (reading, cropping, collating) and their other threads (pickling a batch onto the queue)."""
    me = psutil.Process()
    out = {"training": sum(me.cpu_times()[:2]), "worker": 0.0, "worker_threads": 0.0}
    for worker in loader_workers():
        try:
            threads = worker.threads()
        except psutil.Error:
            continue
        for t in threads:
            out["worker" if t.id == worker.pid else "worker_threads"] += t.user_time + t.system_time
    return out


def worker_memory() -> list[dict]:
    """Each DataLoader worker's memory in MB (smaps_rollup): Anonymous, Pss and Rss."""
    out = []
    for worker in loader_workers():
        fields = {}
        with open(f"/proc/{worker.pid}/smaps_rollup") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in ("Rss", "Pss", "Anonymous"):
                    fields[name.lower()] = int(rest.split()[0]) / 1024
        out.append({"pid": worker.pid, **fields})
    return out


def time_loader(batches: Callable[[int], Iterator[int]], spec: dict, epoch: int = 0) -> dict:
    """Samples/s of ``batches(epoch)`` (batch sizes) after the warm-up, across epochs from ``epoch``."""
    seen, samples, start, first = 0, 0, None, None
    begin = time.perf_counter()
    while True:
        before = seen
        for n in batches(epoch):
            now = time.perf_counter()
            first = first if first is not None else now - begin
            seen += 1
            if start is None:
                if seen == WARMUP:
                    start, busy0, own0 = now, busy_cpu_s(), tree_cpu_s(spec.get("extra_pids", ()))
                    roles0 = role_cpu_s() if spec.get("split") else None
                continue
            samples += n
            elapsed = now - start
            if elapsed >= spec["seconds"] and seen - WARMUP >= MIN_BATCHES:
                busy, own = busy_cpu_s() - busy0, tree_cpu_s(spec.get("extra_pids", ())) - own0
                split = {}
                if roles0 is not None:  # microseconds of CPU a sample, by role
                    split = {"cpu_us": {k: 1e6 * (v - roles0[k]) / samples for k, v in role_cpu_s().items()}}
                return {
                    **split,
                    "samples_per_s": samples / elapsed,
                    "seconds": elapsed,
                    "samples": samples,
                    "first_batch_s": first,
                    "epochs": epoch + 1,
                    "busy_cores": busy / elapsed,
                    "own_cores": own / elapsed,
                }
        if seen == before:  # else this would wait forever (e.g. fewer samples a worker than a batch)
            raise RuntimeError(f"epoch {epoch} gave no batch")
        epoch += 1


def epoch_memory(batches: Callable[[int], Iterator[int]]) -> dict:
    """The workers' memory (:func:`worker_memory`) at the first batch of the first epoch and at its end.

    The first epoch: memory that grows as a worker reads would show at once.
    """
    it = batches(0)
    samples = next(it)  # the workers have started (and loaded a batch or two ahead)
    before = worker_memory()
    samples += sum(it)
    return {"before": before, "after": worker_memory(), "samples": samples}


def time_samples(step: Callable[[], object], spec: dict) -> dict:
    """Samples/s of ``step()`` called in a loop in this process, after 20 warm-up calls (and, with
    ``barrier``, once every process of the barrier has warmed up)."""
    for _ in range(20):
        step()
    if spec.get("barrier"):
        wait_for_all(spec["barrier"], spec["parties"])
    start, busy0, own0, n = time.perf_counter(), busy_cpu_s(), tree_cpu_s(), 0
    while (elapsed := time.perf_counter() - start) < spec["seconds"] or n < 50:
        step()
        n += 1
    busy, own = busy_cpu_s() - busy0, tree_cpu_s() - own0
    return {
        "samples_per_s": n / elapsed,
        "seconds": elapsed,
        "samples": n,
        "busy_cores": busy / elapsed,
        "own_cores": own / elapsed,
    }


def wait_for_all(folder: str, parties: int, timeout: float = 120.0) -> None:
    """A barrier between processes: each leaves a file in ``folder``, then waits for ``parties`` of them."""
    open(os.path.join(folder, str(os.getpid())), "w").close()  # noqa: SIM115 (an empty file)
    deadline = time.monotonic() + timeout
    while len(os.listdir(folder)) < parties:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{parties - len(os.listdir(folder))} of {parties} processes never got ready")
        time.sleep(0.001)


def limit_together(spec: dict) -> dict:
    """The limit's work in ``spec["processes"]`` processes at once (the machine's ceiling for it, which
    the cores' shared caches and memory may put below one process's x the cores): each starts timing
    once all have warmed up. ``samples_per_s`` and ``own_cores`` are each process's (their mean)."""
    n = spec["processes"]
    with tempfile.TemporaryDirectory() as barrier:
        one = json.dumps({**spec, "processes": 1, "barrier": barrier, "parties": n})
        children = [
            subprocess.Popen([sys.executable, __file__, one], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(n)
        ]
        try:
            outs = [child.communicate(timeout=240) for child in children]
        finally:  # none outlives this probe (one that failed leaves the others at the barrier)
            for child in children:
                child.kill()
    failed = [(c.returncode, err) for c, (_, err) in zip(children, outs) if c.returncode]
    if failed:
        raise RuntimeError(f"a process of {n} failed ({failed[0][0]}): {failed[0][1].strip()[-300:]}")
    each = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    return {
        "samples_per_s": sum(r["samples_per_s"] for r in each) / n,
        "each": [r["samples_per_s"] for r in each],
        "seconds": max(r["seconds"] for r in each),
        "samples": sum(r["samples"] for r in each),
        "busy_cores": max(r["busy_cores"] for r in each),  # the machine's, over about the same window
        "own_cores": sum(r["own_cores"] for r in each) / n,
        "processes": n,
    }


def loader_settings(spec: dict) -> list[str]:
    return [
        f"loader.num_workers={spec['workers']}",
        "loader.prefetch_factor=2",
        "loader.persistent_workers=true",
        f"loader.batch_size={spec['batch_size']}",
        "loader.pin_memory=false",
        "loader.tuned=''",
    ]


def torchvision_crop() -> None:
    """The rendered task's train transform as it was before crops.RandomResizedCropFlip: torchvision's pair."""
    from bench_project.task import Task

    def train_transform(self, size: int) -> v2.Transform:
        crop = v2.RandomResizedCrop(size, scale=self.crop_scale, ratio=self.crop_ratio, antialias=True)
        return v2.Compose([crop, v2.RandomHorizontalFlip()])

    Task.train_transform = train_transform  # the task's transform is built here, and pickled to the workers


def probe_loader(spec: dict) -> dict:
    """The rendered loader's samples/s (``build_loader`` with its default settings for the rest: those of
    the project's version, e.g. the baseline's batch pool, on by default there)."""
    from bench_project.config import load_config
    from bench_project.data import build_dataset, build_loader, set_epoch

    if spec.get("torchvision_crop"):
        torchvision_crop()
    cfg = load_config(None, [*spec["overrides"], *loader_settings(spec)])
    dataset = build_dataset(cfg, "train")
    loader = build_loader(dataset, cfg, "train")

    def batches(epoch: int) -> Iterator[int]:
        set_epoch(loader, epoch)
        for batch in loader:
            if batch.get("bad"):  # a benchmark of failing samples would be meaningless
                raise RuntimeError(f"{len(batch['bad'])} bad samples in a batch, e.g. {batch['bad'][0]}")
            yield len(batch["key"])

    memory = epoch_memory(batches) if spec.get("memory") else None
    result = time_loader(batches, spec, epoch=1 if memory else 0)
    return {**result, "source": type(dataset).__name__, **({"memory": memory} if memory else {})}


def folder_mb(path: str) -> float:
    """MB of the files under ``path`` (a shard cache: downloads in progress at their full size)."""
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(path) for n in names) / 1e6


def probe_epochs(spec: dict) -> dict:
    """The rendered loader (as :func:`probe_loader` builds it) over ``spec["epochs"]`` whole epochs (default 2),
    each timed from its first batch request (``iter``; the first one starts the persistent workers) to its
    last batch. ``data.cache_dir`` is a new, empty folder, removed at the end: a bucket's first epoch
    downloads its shards (the dataset's set-up, untimed, reads the first one through the cache to prepare
    the task), a second reads them from local disk. ``samples_per_s`` is the first epoch's."""
    from bench_project.config import load_config
    from bench_project.data import build_dataset, build_loader, set_epoch

    extra_pids = spec.get("extra_pids", ())
    cache = tempfile.mkdtemp(prefix="shard-cache-", dir=os.getcwd())
    try:
        start = time.perf_counter()
        cfg = load_config(None, [*spec["overrides"], f"data.cache_dir={cache}", *loader_settings(spec)])
        dataset = build_dataset(cfg, "train")
        loader = build_loader(dataset, cfg, "train")
        setup_s, setup_cache_mb = time.perf_counter() - start, folder_mb(cache)
        epochs = []
        for epoch in range(spec.get("epochs", 2)):
            set_epoch(loader, epoch)
            samples, first, first_samples = 0, None, 0
            start, busy0, own0 = time.perf_counter(), busy_cpu_s(), tree_cpu_s(extra_pids)
            for batch in loader:
                if batch.get("bad"):  # a benchmark of failing samples would be meaningless
                    raise RuntimeError(f"{len(batch['bad'])} bad samples in a batch, e.g. {batch['bad'][0]}")
                samples += len(batch["key"])
                if first is None:
                    first, first_samples = time.perf_counter() - start, samples
            elapsed = time.perf_counter() - start
            busy, own = busy_cpu_s() - busy0, tree_cpu_s(extra_pids) - own0
            if not samples:
                raise RuntimeError(f"epoch {epoch} gave no samples")
            epochs.append(
                {
                    "samples_per_s": samples / elapsed,
                    "seconds": elapsed,
                    "samples": samples,
                    "first_batch_s": first,
                    "after_first_samples_per_s": (samples - first_samples) / (elapsed - first)
                    if elapsed > first
                    else 0,
                    "busy_cores": busy / elapsed,
                    "own_cores": own / elapsed,
                    "cache_mb": folder_mb(cache),
                }
            )
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return {
        **{k: epochs[0][k] for k in ("samples_per_s", "seconds", "samples", "first_batch_s")},
        "busy_cores": epochs[0]["busy_cores"],  # over the first epoch, as samples_per_s
        "own_cores": epochs[0]["own_cores"],
        "epoch_samples_per_s": [e["samples_per_s"] for e in epochs],
        "epoch_s": [e["seconds"] for e in epochs],
        "epoch_samples": [e["samples"] for e in epochs],
        "epoch_first_batch_s": [e["first_batch_s"] for e in epochs],
        "epoch_after_first_samples_per_s": [e["after_first_samples_per_s"] for e in epochs],
        "epoch_busy_cores": [e["busy_cores"] for e in epochs],
        "epoch_own_cores": [e["own_cores"] for e in epochs],
        "epoch_cache_mb": [e["cache_mb"] for e in epochs],
        "setup_s": setup_s,
        "setup_cache_mb": setup_cache_mb,
        "source": type(dataset).__name__,
    }


def probe_train(spec: dict) -> dict:
    """The rendered project's ``train`` (its command line's ``main``, in this process) for one epoch of at most
    ``max_batches`` batches (``train.max_batches``, which also bounds validation where the version has it),
    ``loader_settings`` for the loader, into a new run folder in the working directory, removed at the end.

    The project's ``train_one_epoch`` is wrapped to time it, and its loader's first batch, the same way
    whatever the template's version: ``samples_per_s`` is the epoch's samples after the first batch over
    the seconds after it (the first waits for the workers to start), ``whole_epoch_samples_per_s`` all
    of them over the epoch. ``reported_samples_per_s`` is what metrics.jsonl says, each version's own
    measure: since the batch pool became opt-in it leaves the first batch out, as above; before, it
    counted the whole epoch."""
    import bench_project.train as train_module
    from bench_project.__main__ import main as cli

    run_dir = tempfile.mkdtemp(prefix="train-run-", dir=os.getcwd())
    epochs, inner = [], train_module.train_one_epoch

    def timed(run, loader, *args, **kwargs):
        cls, original, first = type(loader), type(loader).__iter__, []

        def first_timed(self):
            batches = original(self)
            if self is not loader:
                return batches

            def gen():
                try:
                    batch = next(batches)
                except StopIteration:
                    return
                first.append((time.perf_counter() - start, len(batch["key"]) if batch else 0))
                yield batch
                yield from batches

            return gen()

        cls.__iter__ = first_timed
        start, busy0, own0 = time.perf_counter(), busy_cpu_s(), tree_cpu_s()
        try:
            stats = inner(run, loader, *args, **kwargs)
        finally:
            cls.__iter__ = original
        elapsed = time.perf_counter() - start
        busy, own = busy_cpu_s() - busy0, tree_cpu_s() - own0
        first_s, first_n = first[0] if first else (0.0, 0)
        epochs.append(
            {
                "samples": stats["samples"],
                "seconds": elapsed,
                "first_batch_s": first_s,
                "first_batch_samples": first_n,
                "busy_cores": busy / elapsed,
                "own_cores": own / elapsed,
            }
        )
        return stats

    train_module.train_one_epoch = timed
    argv = [*spec["overrides"], *loader_settings(spec), f"train.run_dir={run_dir}", "train.epochs=1"]
    argv += [f"train.max_batches={spec['max_batches']}"] if spec.get("max_batches") else []
    try:
        status = cli(["train", *argv])
        if status:
            raise RuntimeError(f"train exited with {status}")
        with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
            metrics = json.loads(f.read().splitlines()[-1])
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    if len(epochs) != 1 or not epochs[0]["samples"]:
        raise RuntimeError(f"expected one epoch with samples, timed {epochs}")
    e = epochs[0]
    if e["samples"] <= e["first_batch_samples"]:
        raise RuntimeError("the epoch had one batch: nothing after it to time (more photos, or a smaller batch)")
    after = (e["samples"] - e["first_batch_samples"]) / max(e["seconds"] - e["first_batch_s"], 1e-9)
    return {
        "samples_per_s": after,
        "whole_epoch_samples_per_s": e["samples"] / e["seconds"],
        "reported_samples_per_s": metrics["samples_per_s"],
        **e,
        "metrics": metrics,
    }


def probe_imagefolder(spec: dict) -> dict:
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    if spec["decoder"] == "tensor":  # torchcodec (libjpeg-turbo) on the file, v2 on uint8 tensors
        from torchcodec.decoders import decode_image

        def load(path: str) -> torch.Tensor:
            return decode_image(path, mode="RGB")

        transform = augment(spec["size"])
    else:  # ImageFolder's own PIL loader, v2 on the PIL image, then to a uint8 tensor
        load, transform = None, v2.Compose([augment(spec["size"]), v2.PILToTensor()])
    extra = {"loader": load} if load else {}
    dataset = ImageFolder(os.path.join(spec["root"], "train"), transform=transform, **extra)
    loader = DataLoader(
        dataset,
        batch_size=spec["batch_size"],
        shuffle=True,
        num_workers=spec["workers"],
        prefetch_factor=2,
        persistent_workers=True,
        drop_last=True,
    )

    def batches(epoch: int) -> Iterator[int]:
        for images, _ in loader:
            yield len(images)

    return time_loader(batches, spec)


def probe_webdataset(spec: dict) -> dict:
    import glob

    import webdataset as wds
    from torchcodec.decoders import decode_image

    urls = sorted(glob.glob(os.path.join(spec["root"], "train", "*.tar")))
    crop = augment(spec["size"])

    def decode(sample: dict) -> tuple[torch.Tensor, int]:  # torchcodec on the sample's bytes, v2 on uint8 tensors
        data = sample.get("jpg") or sample.get("png") or sample.get("jpeg")
        return crop(decode_image(data, mode="RGB")), int(sample["cls"])

    dataset = (
        wds.WebDataset(urls, shardshuffle=len(urls), nodesplitter=wds.split_by_node, empty_check=False)
        .shuffle(1000)
        .map(decode)
        .batched(spec["batch_size"], partial=False)
    )
    loader = wds.WebLoader(
        dataset, batch_size=None, num_workers=spec["workers"], prefetch_factor=2, persistent_workers=True
    )

    def batches(epoch: int) -> Iterator[int]:
        for _, labels in loader:
            yield len(labels)

    return time_loader(batches, spec)


def probe_limit(spec: dict) -> dict:
    """One process's per-sample work on the project's train source (as one loader worker does it); with
    ``processes`` N > 1, in N processes at once (:func:`limit_together`)."""
    if spec.get("processes", 1) > 1:
        return limit_together(spec)
    from bench_project.config import load_config
    from bench_project.data import build_dataset

    torch.set_num_threads(1)  # as in a DataLoader worker
    if spec.get("torchvision_crop"):
        torchvision_crop()
    cfg = load_config(None, [*spec["overrides"], *loader_settings(spec)])
    dataset = build_dataset(cfg, "train")
    # Read as the one worker of a loader reads: the source seeds each sample's generators there, where the
    # training process also saves and restores its own around a sample (NumPy's alone, about 100 us).
    from torch.utils.data._utils import worker

    worker._worker_info = worker.WorkerInfo(id=0, num_workers=1, seed=0, dataset=dataset)
    if isinstance(dataset, torch.utils.data.IterableDataset):
        state = {"it": iter(dataset), "epoch": 0}

        def step():
            for _ in range(2):
                try:
                    return next(state["it"])
                except StopIteration:
                    state["epoch"] += 1
                    dataset.set_epoch(state["epoch"])
                    state["it"] = iter(dataset)
            raise RuntimeError("the source yields no samples")
    else:
        order = torch.randperm(len(dataset)).tolist()
        position = iter(range(10**12))

        def step():
            return dataset[order[next(position) % len(order)]]

    def checked():
        sample = step()
        if "bad" in sample:
            raise RuntimeError(f"bad sample {sample['key']}: {sample['bad']}")

    return time_samples(checked, spec)


def probe_decode(spec: dict) -> dict:
    """A 3000 x 2250 JPEG to a 224 crop: a full decode, or the rendered task's reduced-scale one.

    ``mode`` "full": OpenCV's ``cv2.imdecode`` at full size (what the rendered task's decode runs for a
    JPEG it does not reduce, less its header read) then the train transform; "task": the task's train
    path (its decode at the train ``min_side``, then the same transform: ``Task.__call__``'s work, of
    whichever version of the template is on PYTHONPATH), or with ``min_side`` given,
    ``Task.decode(data, min_side)`` then the transform.
    """
    from bench_project.config import load_config
    from bench_project.task import Task

    torch.set_num_threads(1)
    files = [open(p, "rb").read() for p in spec["files"]]  # noqa: SIM115 (read at once)
    task = Task(load_config(None, [f"data.image_size={spec['size']}"]).data, "train")
    if spec["mode"] == "full":

        def decode(data: bytes) -> torch.Tensor:
            return torch.from_numpy(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR_RGB)).permute(2, 0, 1)
    else:
        min_side = spec.get("min_side") or task.min_side

        def decode(data: bytes) -> torch.Tensor:
            return task.decode(data, min_side)

    position = iter(range(10**12))
    result = time_samples(lambda: task.transform(decode(files[next(position) % len(files)])), spec)
    sizes = [Image.open(io.BytesIO(f)).size for f in files]
    bits_per_pixel = 8 * sum(map(len, files)) / sum(w * h for w, h in sizes)
    return {**result, "decoded": list(decode(files[0]).shape), "bits_per_pixel": bits_per_pixel}


def lanczos(n_in: int, n_out: int) -> np.ndarray:
    """``(n_out, n_in)`` float64 weights of a Lanczos-3 resize (antialiased: the kernel widens as it shrinks)."""
    scale = n_in / n_out
    width = max(scale, 1.0)
    weights = np.zeros((n_out, n_in))
    for i in range(n_out):
        centre = (i + 0.5) * scale
        j = np.arange(max(int(centre - 3 * width + 0.5), 0), min(int(centre + 3 * width + 0.5), n_in))
        x = (j - centre + 0.5) / width
        w = np.where(np.abs(x) < 3, np.sinc(x) * np.sinc(x / 3), 0.0)
        weights[i, j] = w / w.sum()
    return weights


def psnr(out: np.ndarray, reference: np.ndarray) -> float:
    return 10 * math.log10(255.0**2 / max(np.mean((out.astype(np.float64) - reference) ** 2), 1e-12))


def probe_crop_quality(spec: dict) -> dict:
    """The train crop's quality and cost: crops.RandomResizedCropFlip's resize against torchvision's antialiased
    one, each box the same, PSNR against a float64 Lanczos-3 resize of that box, on photos stored as the cache
    stores them (shorter side 8/7 of the crop) and decoded as the folder loader decodes them (task.min_side)."""
    from bench_project.config import load_config
    from bench_project.crops import MAX_SHRINK, RandomResizedCropFlip, default_min_side
    from bench_project.task import Task

    torch.set_num_threads(1)
    size = spec["size"]
    task = Task(load_config(None, [f"data.image_size={size}"]).data, "train")
    ours = RandomResizedCropFlip(size, task.crop_scale, task.crop_ratio)
    files = [open(p, "rb").read() for p in spec["files"]]  # noqa: SIM115 (read at once)
    generator = torch.Generator().manual_seed(0)
    out = {}
    for name, side in (("cache", default_min_side(size)), ("folder decode", task.min_side)):
        deltas, psnrs, crops = [], {"ours": [], "torchvision": []}, []
        for data in files:
            hwc = task.decode_for_cache(data, side)  # the shorter side at ``side``, HWC, as the cache stores it
            for _ in range(spec["boxes"]):
                torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=generator)))
                crops.append((hwc, *ours.box(*hwc.shape[:2])[:4]))
        for hwc, top, left, h, w in crops:
            chw = hwc.permute(2, 0, 1)
            crop = hwc[top : top + h, left : left + w].numpy().astype(np.float64)
            rows = (lanczos(h, size) @ crop.reshape(h, w * 3)).reshape(size, w, 3)  # BLAS: separable
            reference = (rows.transpose(0, 2, 1) @ lanczos(w, size).T).transpose(0, 2, 1)
            a = ours.resize(chw, top, left, h, w, False)
            b = F_v2.resized_crop(chw, top, left, h, w, [size, size], antialias=True)
            p = {k: psnr(x.permute(1, 2, 0).numpy(), reference) for k, x in (("ours", a), ("torchvision", b))}
            for k, v in p.items():
                psnrs[k].append(v)
            deltas.append(p["ours"] - p["torchvision"])
        # timed apart from the reference (whose BLAS threads would still be spinning), passes alternating
        crop_fns = {
            "ours": lambda c: ours.resize(c[0].permute(2, 0, 1), *c[1:], False),
            "torchvision": lambda c: F_v2.resized_crop(c[0].permute(2, 0, 1), *c[1:], [size, size], antialias=True),
        }
        passes = {k: [] for k in crop_fns}
        for _ in range(3):
            for k, fn in crop_fns.items():
                start = time.perf_counter()
                for c in crops:
                    fn(c)
                passes[k].append((time.perf_counter() - start) / len(crops))
        out[name] = {
            "stored_side": side,
            "crops": len(deltas),
            "psnr_ours": float(np.mean(psnrs["ours"])),
            "psnr_torchvision": float(np.mean(psnrs["torchvision"])),
            "delta_db": float(np.mean(deltas)),
            "delta_db_worst": float(np.min(deltas)),
            "us_ours": 1e6 * float(np.median(passes["ours"])),
            "us_torchvision": 1e6 * float(np.median(passes["torchvision"])),
            "resized_by_opencv": sum(max(c[3], c[4]) <= MAX_SHRINK * size for c in crops) / len(crops),
        }
    return {"samples_per_s": 0.0, "quality": out}


def probe_handoff(spec: dict) -> dict:
    """The cost of a worker's hand-off of a batch: ``default_collate`` of ``batch`` crops (HWC uint8, as the
    workers' crop gives them) into a new shared-memory block, as it runs in a loader worker (the batch is
    sent to the training process as that block), against stacking into a block of the batch pool
    (data/batch_pool.py, ``loader.batch_pool=true``: ``Pool.stack``, a block the training process is done
    with, written before) and ``torch.stack`` into ordinary memory."""
    from bench_project.data.batch_pool import Pool
    from torch.utils.data._utils.collate import collate_tensor_fn

    torch.set_num_threads(1)  # as in a DataLoader worker
    n, size = spec["batch_size"], spec["size"]
    crops = [torch.randint(0, 256, (size, size, 3), dtype=torch.uint8) for _ in range(n)]
    numel = n * size * size * 3

    def shared_block_alone() -> torch.Tensor:  # the new block, its pages not yet touched
        return crops[0].new(crops[0]._typed_storage()._new_shared(numel, device="cpu"))

    def shared() -> torch.Tensor:  # what default_collate does in a worker (torch/utils/data/_utils/collate.py)
        return torch.stack(crops, out=shared_block_alone().resize_(n, size, size, 3))

    pool = Pool(1, "bench")  # a worker's pool of one block, as Pooled sets it up around each collate
    pool.original = collate_tensor_fn

    def reused() -> torch.Tensor:  # a worker's stack into its pool (batch_pool.Pool.stack)
        pool.handed = []
        out = pool.stack(crops)
        if not pool.handed:
            raise RuntimeError("the batch pool gave no block (no room in /dev/shm?)")
        for i, _ in pool.handed:  # what the training process does once it is done with the batch
            pool.free[i] = 0
        pool.handed = None
        return out

    ways = {
        "shared": shared,
        "shared_block_alone": shared_block_alone,
        "shared_reused": reused,
        "heap": lambda: torch.stack(crops),
    }
    passes: dict[str, list[float]] = {k: [] for k in ways}
    for _ in range(5):  # alternating passes, 40 batches each; the best pass of each
        for k, fn in ways.items():
            fn()
            start = time.perf_counter()
            for _ in range(40):
                fn()
            passes[k].append((time.perf_counter() - start) / 40)
    ms = {k: 1e3 * min(v) for k, v in passes.items()}
    return {
        "samples_per_s": 0.0,
        "handoff": {"batch": n, "size": size, "ms": ms, "us_a_sample": 1e3 * ms["shared"] / n, "pool": "batch_pool"},
    }


def main() -> None:
    spec = json.loads(sys.argv[1])
    kinds = {
        "loader": probe_loader,
        "train": probe_train,
        "epochs": probe_epochs,
        "imagefolder": probe_imagefolder,
        "webdataset": probe_webdataset,
        "limit": probe_limit,
        "decode": probe_decode,
        "crop_quality": probe_crop_quality,
        "handoff": probe_handoff,
    }
    print(json.dumps(kinds[spec["kind"]](spec)), flush=True)
    for child in psutil.Process().children(recursive=True):  # the loaders' workers: no slow teardown
        child.kill()
    os._exit(0)


if __name__ == "__main__":
    main()
