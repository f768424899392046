"""One measurement of the loader benchmark, run in its own process; prints one JSON line.

    PYTHONPATH=<rendered project>/src python benchmarks/probe.py '{"kind": "loader", ...}'

``loaders.py`` starts one of these per row and round. Kinds:

    loader       the rendered project's train loader (``build_dataset`` + ``build_loader``)
    imagefolder  torchvision ``ImageFolder`` + DataLoader with the same crop and flip
    webdataset   a plain ``webdataset.WebDataset`` pipeline with the same crop and flip
    limit        one process's per-sample work on the project's source, no DataLoader
    decode       one 3000 x 2250 JPEG to a 224 crop: full decode, or the reduced-scale one

A loader is timed like the training loop minus the model: after ``WARMUP`` batches (the workers
have started), samples over wall time until ``seconds`` have passed, across epoch ends. Over the
same window the probe reads the whole machine's busy CPU time (/proc/stat) and its own process
tree's, so the report can say how much other jobs took.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from collections.abc import Callable, Iterator

import psutil
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms import v2

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


def worker_memory() -> list[dict]:
    """Each DataLoader worker's memory in MB (smaps_rollup): Anonymous, Pss and Rss.

    The rendered loaders' workers are the children of their forkserver, a child of this process.
    """
    out = []
    for child in psutil.Process().children():
        try:
            workers = child.children() if "forkserver" in " ".join(child.cmdline()) else []
        except psutil.Error:
            continue
        for worker in workers:
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
        for n in batches(epoch):
            now = time.perf_counter()
            first = first if first is not None else now - begin
            seen += 1
            if start is None:
                if seen == WARMUP:
                    start, busy0, own0 = now, busy_cpu_s(), tree_cpu_s(spec.get("extra_pids", ()))
                continue
            samples += n
            elapsed = now - start
            if elapsed >= spec["seconds"] and seen - WARMUP >= MIN_BATCHES:
                busy, own = busy_cpu_s() - busy0, tree_cpu_s(spec.get("extra_pids", ())) - own0
                return {
                    "samples_per_s": samples / elapsed,
                    "seconds": elapsed,
                    "samples": samples,
                    "first_batch_s": first,
                    "epochs": epoch + 1,
                    "busy_cores": busy / elapsed,
                    "own_cores": own / elapsed,
                }
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
    """Samples/s of ``step()`` called in a loop in this process, after 20 warm-up calls."""
    for _ in range(20):
        step()
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


def loader_settings(spec: dict) -> list[str]:
    return [
        f"loader.num_workers={spec['workers']}",
        "loader.prefetch_factor=2",
        "loader.persistent_workers=true",
        f"loader.batch_size={spec['batch_size']}",
        "loader.pin_memory=false",
        "loader.tuned=''",
    ]


def probe_loader(spec: dict) -> dict:
    from bench_project.config import load_config
    from bench_project.data import build_dataset, build_loader, set_epoch

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


def probe_imagefolder(spec: dict) -> dict:
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    if spec["decoder"] == "tensor":  # torchvision.io (libjpeg-turbo) on the file's bytes, v2 on uint8 tensors

        def load(path: str) -> torch.Tensor:
            with open(path, "rb") as f:
                data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
            return decode_image(data, mode=ImageReadMode.RGB)

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

    urls = sorted(glob.glob(os.path.join(spec["root"], "train", "*.tar")))
    crop = augment(spec["size"])

    def decode(sample: dict) -> tuple[torch.Tensor, int]:
        data = sample.get("jpg") or sample.get("png") or sample.get("jpeg")
        image = decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
        return crop(image), int(sample["cls"])

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
    """One process's per-sample work on the project's train source (as one loader worker does it)."""
    from bench_project.config import load_config
    from bench_project.data import build_dataset

    torch.set_num_threads(1)  # as in a DataLoader worker
    cfg = load_config(None, [*spec["overrides"], *loader_settings(spec)])
    dataset = build_dataset(cfg, "train")
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

    ``mode`` "full": ``decode_image`` then the train transform; "task": the task's train path,
    ``Task.__call__`` (its decode at the train ``min_side``, then the same transform), or with
    ``min_side`` given, ``Task.decode(data, min_side)`` then the transform.
    """
    from bench_project.config import load_config
    from bench_project.task import Task

    torch.set_num_threads(1)
    files = [open(p, "rb").read() for p in spec["files"]]  # noqa: SIM115 (read at once)
    task = Task(load_config(None, [f"data.image_size={spec['size']}"]).data, "train")
    if spec["mode"] == "full":

        def decode(data: bytes) -> torch.Tensor:
            return decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
    else:
        min_side = spec.get("min_side") or task.min_side

        def decode(data: bytes) -> torch.Tensor:
            return task.decode(data, min_side)

    position = iter(range(10**12))
    result = time_samples(lambda: task.transform(decode(files[next(position) % len(files)])), spec)
    sizes = [Image.open(io.BytesIO(f)).size for f in files]
    bits_per_pixel = 8 * sum(map(len, files)) / sum(w * h for w, h in sizes)
    return {**result, "decoded": list(decode(files[0]).shape), "bits_per_pixel": bits_per_pixel}


def main() -> None:
    spec = json.loads(sys.argv[1])
    kinds = {
        "loader": probe_loader,
        "imagefolder": probe_imagefolder,
        "webdataset": probe_webdataset,
        "limit": probe_limit,
        "decode": probe_decode,
    }
    print(json.dumps(kinds[spec["kind"]](spec)), flush=True)
    for child in psutil.Process().children(recursive=True):  # the loaders' workers: no slow teardown
        child.kill()
    os._exit(0)


if __name__ == "__main__":
    main()
