# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""``pack --to cache``: read the source once and write the decoded-sample cache (layout: cache.py).

    python -m <package> pack --to cache --out data/cache   # reads data.root once

One pack writes a cache at a time: it holds ``DIR/.pack.lock`` (the operating system's lock,
gone with the process, even on kill -9), and a second pack into the same folder stops at once,
naming the first one's pid. ``cache.json`` names its writer and lists the files the cache
consists of: ``--force`` removes those and nothing else, and a folder whose ``cache.json`` this
project did not write is refused, ``--force`` or not. A disk that fills up is one error naming
the file and what was kept: the same pack, run again once there is space, continues.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import signal
import time
from collections import deque
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset
from tqdm import tqdm

from .. import dist
from ..errors import DataError, DiskFull, UserError, held_alone, is_disk_full
from ..task import Task
from .cache import FORMAT, LOCK, META, PEEK, SPLITS, WRITTEN_BY, NotACache, read_meta
from .loader import worker_context
from .source import Source, bad_reason

log = logging.getLogger(__name__)

PARTS = ("samples.bin", "index.part", "keys.part")  # a split's files while it is packed
DONE = ("samples.bin", "index.npy", "keys.npy")  # a packed split's files
CHUNK = 32  # samples a packing process decodes per task
SAVE_EVERY_S = 2.0  # how often the progress of a pack is made durable
FILES = [META, PEEK, LOCK] + [f"{s}/{n}" for s in SPLITS for n in (*PARTS, "progress.json", *DONE[1:])]


def pack_cache(
    cfg,
    source_class: type[Source],
    out: str,
    settings: dict,
    force: bool = False,
    progress: bool = True,
    workers: int | None = None,
) -> dict:
    """Read every split of the source once and write the cache at ``out``; returns ``cache.json``.

    Args:
        cfg (Config): the project's config (``data.root`` is read; ``loader.start_method`` starts
            the decoding processes).
        source_class: the project's source.
        out (str): the cache folder (created; a folder holding anything but a cache is refused).
        settings (dict): what shaped the stored samples (for images ``min_side``).
        force (bool): replace a cache made from other data or settings.
        workers (int, optional): decoding processes; default: the usable CPUs.

    # NOTE [ An interrupted pack resumes ]
    # Samples are appended to each split's files in the source's record order; every few
    # seconds the files are flushed to disk and ``progress.json`` records how far they are
    # good and the source's cursor there. A pack started again with the same source and
    # settings cuts the files back to that point and continues from the cursor.
    """
    os.makedirs(out, exist_ok=True)
    busy = f"another pack is writing the cache at {out}"
    with held_alone(os.path.join(out, LOCK), busy, "wait for it to end, or pass another --out"):
        sources = {s: source_class(cfg.data, s, Task(cfg.data, s), seed=cfg.train.seed) for s in SPLITS}
        identity = {split: source.identity() for split, source in sources.items()}
        try:
            meta = _start(out, sources["train"], identity, settings, force)
            context = worker_context(cfg.loader.start_method)
            for split, source in sources.items():
                if not meta["splits"][split].get("done"):
                    processes = workers or dist.usable_cpus()
                    meta["splits"][split] = _pack_split(out, split, source, meta, processes, context, progress)
                    _write_json(os.path.join(out, META), meta)
        except OSError as e:
            if not is_disk_full(e):
                raise
            raise DiskFull(_full(e, out)) from None
        again = {split: source.identity() for split, source in sources.items()}
    if again != identity:
        raise DataError(f"{cfg.data.root} changed while it was packed; pack again with --force")
    return meta


def _full(e: OSError, out: str) -> str:
    """The error line of a write that found the disk (or the file-size limit) full."""
    why = "the file-size limit (ulimit -f) was reached" if e.errno == errno.EFBIG else "no space was left on the device"
    kept = []
    for split in SPLITS:
        try:
            with open(os.path.join(out, split, "progress.json"), encoding="utf-8") as f:
                kept.append(f"{json.load(f)['samples']} {split} samples")
        except (OSError, ValueError, KeyError):
            continue
    kept_text = f"it keeps the {' and '.join(kept)} packed before" if kept else "nothing was packed yet"
    return (
        f"{why} writing {e.filename or out}: the cache at {out} is unfinished, {kept_text}; free some space and run "
        "the same pack again: it continues from there"
    )


def _start(out: str, train: Source, identity: dict, settings: dict, force: bool) -> dict:
    """``cache.json`` of a new cache, or of the unfinished one at ``out`` made from the same data."""
    fresh = {
        "format": FORMAT,
        "written_by": WRITTEN_BY,
        "files": FILES,
        "settings": settings,
        "classes": train.classes,
        "root": train.cfg.root,  # what data.root said: a run whose data differs is told to set it
        "splits": {split: {"identity": identity[split]} for split in SPLITS},
    }
    path = os.path.join(out, META)
    if os.path.isfile(path):
        try:
            meta = read_meta(out)
        except NotACache:
            raise UserError(
                f"{out} holds files that are not a cache of this project (its {META} was not written by pack): "
                "choose an empty or new folder for --out"
            ) from None
        except DataError:  # this project's, of another layout version: only what its pack writes goes
            meta = {"files": FILES}
        splits = meta.get("splits", {})
        same = meta.get("settings") == settings and all(
            splits.get(s, {}).get("identity") == identity[s] for s in SPLITS
        )
        if same:
            return meta
        if not force:
            raise UserError(f"{out} holds a cache made from other data or settings; pass --force to replace it")
        _remove_cache(out, meta["files"])
    elif set(os.listdir(out)) - {LOCK}:
        raise UserError(f"{out} holds files that are not a cache; choose an empty or new folder for --out")
    peek = train.peek(16)
    with open(os.path.join(out, PEEK), "wb") as f:
        _write(f, b"".join(peek))
    fresh["peek"] = [len(p) for p in peek]
    _write_json(path, fresh)
    return fresh


def _remove_cache(out: str, files: list[str]) -> None:
    """Remove the files a cache consists of, as its cache.json lists them (nothing else in ``out``)."""
    for name in files:
        if name == LOCK or os.path.isabs(name) or ".." in name.split("/"):
            continue  # the lock is held; a name outside the folder is none of the cache's
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(out, name))


def _pack_split(out: str, split: str, source: Source, meta: dict, workers: int, context, progress: bool) -> dict:
    folder = os.path.join(out, split)
    os.makedirs(folder, exist_ok=True)
    state_path = os.path.join(folder, "progress.json")
    state = {"samples": 0, "sizes": [0, 0, 0], "cursor": None, "bad": 0, "bad_examples": []}
    state |= {"dtype": None, "ndim": None}
    if os.path.isfile(state_path):
        with open(state_path, encoding="utf-8") as f:
            state = json.load(f)
        log.info("%s: resuming after %d samples", folder, state["samples"])
    files = []
    try:
        for name, size in zip(PARTS, state["sizes"]):
            f = open(os.path.join(folder, name), "ab")  # noqa: SIM115 (closed below)
            files.append(f)
            f.truncate(size)  # what was written after the last progress record is written again
            f.seek(size)
        start = state["cursor"]
        records = source.records(tuple(start) if isinstance(start, list) else start)
        total = _total(source)
        bar = tqdm(desc=f"pack {split}", unit="sample", initial=state["samples"], total=total, disable=not progress)
        saved = time.monotonic()
        try:
            for rows, decoded in _decode(records, source, meta["settings"], workers, context):
                for (key, label, _, cursor), item in zip(rows, decoded):
                    if isinstance(item, str):
                        state["bad"] += 1
                        if len(state["bad_examples"]) < 5:
                            state["bad_examples"].append(f"{key}: {item}")
                    else:
                        _append(files, state, key, label, item)
                    state["cursor"] = cursor
                bar.update(len(rows))
                if time.monotonic() - saved >= SAVE_EVERY_S:
                    _save_progress(files, state, state_path)
                    saved = time.monotonic()
            _save_progress(files, state, state_path)
        finally:
            bar.close()
    finally:
        for f in files:
            with contextlib.suppress(OSError):  # a full disk fails the flush again: reported once, above
                f.close()
    if not state["samples"]:
        raise DataError(f"no {split} sample of {source.cfg.root} could be decoded: {state['bad_examples'][:3]}")
    _finish(folder, state)
    return {k: v for k, v in state.items() if k not in ("sizes", "cursor")} | {
        "identity": meta["splits"][split]["identity"],
        "done": True,
    }


def _total(source: Source) -> int | None:
    if isinstance(source, Dataset) and hasattr(source, "__len__"):
        return len(source)
    counts = getattr(source, "worker_counts", lambda *a: None)(1, 0)
    return counts[0][0] if counts else None


def _index_dtype(ndim: int) -> np.dtype:
    return np.dtype([("offset", "<i8"), ("shape", "<i8", (ndim,)), ("label", "<i8")])


def _append(files, state: dict, key: str, label: int, array: np.ndarray) -> None:
    samples, index, keys = files
    if state["dtype"] is None:
        state["dtype"], state["ndim"] = array.dtype.str, array.ndim
    if array.dtype.str != state["dtype"] or array.ndim != state["ndim"]:
        raise DataError(f"sample {key} decodes to {array.dtype} {array.shape}; the cache holds {state['dtype']}")
    record = np.zeros(1, _index_dtype(state["ndim"]))
    record["offset"], record["shape"], record["label"] = state["sizes"][0], array.shape, label
    for f, data in zip(files, (array.tobytes(), record.tobytes(), (json.dumps(key) + "\n").encode())):
        _write(f, data)
    state["sizes"] = [f.tell() for f in files]
    state["samples"] += 1


def _write(f, data: bytes) -> None:
    try:
        f.write(data)
    except OSError as e:  # name the file: a full disk's error does not
        raise OSError(e.errno, e.strerror, f.name) from None


def _save_progress(files, state: dict, path: str) -> None:
    for f in files:
        try:
            f.flush()
            os.fsync(f.fileno())
        except OSError as e:
            raise OSError(e.errno, e.strerror, f.name) from None
    _write_json(path, state)


def _finish(folder: str, state: dict) -> None:
    index = np.fromfile(os.path.join(folder, "index.part"), dtype=_index_dtype(state["ndim"]))
    with open(os.path.join(folder, "keys.part"), encoding="utf-8") as f:
        keys = [json.loads(line).encode("utf-8", "surrogateescape") for line in f]
    for name, array in (("index.npy", index), ("keys.npy", np.array(keys, dtype=bytes))):
        path = os.path.join(folder, name)
        try:
            np.save(path, array)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.remove(path)
            raise OSError(e.errno, e.strerror, path) from None
    for name in ("progress.json", "index.part", "keys.part"):  # killed in between: the split starts over
        os.remove(os.path.join(folder, name))


def _write_json(path: str, value: dict) -> None:
    tmp = path + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(value, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise OSError(e.errno, e.strerror, path) from None
    os.replace(tmp, path)


# --- decoding in parallel ----------------------------------------------------------------------

_task: Task | None = None  # the packing process's task (set by _init)


def _init(cfg_data, examples: list[bytes], num_classes: int) -> None:
    global _task
    # Pool.terminate() (the end of its `with`) stops these processes with SIGTERM; forked from a
    # forkserver that started with it blocked (see worker_context), they would never end.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    _task = Task(cfg_data, "val")
    _task.prepare(examples, where=cfg_data.root, num_classes=num_classes)  # what every sample then meets
    torch.set_num_threads(1)


def _decode_chunk(chunk: list[tuple], num_classes: int, settings: dict) -> list[np.ndarray | str]:
    """Each row -> its decoded sample as the cache stores it, or the reason it is bad."""
    out = []
    for _, label, data, _ in chunk:
        try:
            if isinstance(data, Exception):
                raise data
            if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < num_classes:
                raise ValueError(f"label {label!r} is not a class id (expected an int in [0, {num_classes}))")
            out.append(_task.decode_for_cache(data, **settings).contiguous().numpy())
        except Exception as e:
            out.append(bad_reason(e))
    return out


def _decode(records: Iterator[tuple], source: Source, settings: dict, workers: int, context) -> Iterator[tuple]:
    """``(rows, decoded)`` chunks in record order, decoded by ``workers`` processes of ``context``.

    At most two chunks per process are in flight, so a large source is never held in memory.
    """
    chunks, examples = _chunks(records), source.peek(16)
    if workers <= 1:
        _init(source.cfg, examples, source.num_classes)
        for rows in chunks:
            yield rows, _decode_chunk(rows, source.num_classes, settings)
        return
    with context.Pool(workers, initializer=_init, initargs=(source.cfg, examples, source.num_classes)) as pool:
        pending: deque = deque()
        for rows in chunks:
            sent = [(key, label, data, None) for key, label, data, _ in rows]  # cursors stay here
            pending.append((rows, pool.apply_async(_decode_chunk, (sent, source.num_classes, settings))))
            if len(pending) >= 2 * workers:
                rows, result = pending.popleft()
                yield rows, result.get()
        while pending:
            rows, result = pending.popleft()
            yield rows, result.get()


def _chunks(records: Iterator[tuple]) -> Iterator[list]:
    chunk = []
    for row in records:
        chunk.append(row)
        if len(chunk) == CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
