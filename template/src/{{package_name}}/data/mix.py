# torchfeed's file: `copier update` replaces it. Your model is model.py; your augmentations, loss and
# metric are task.py; your settings configs/default.yaml (README.md: "Which files are yours").
"""Several data sets in one run, mixed by weight: ``data.mix`` (README.md: "Mixing data sets").

    data:
      mix:
        - {root: data/photos, weight: 0.8}
        - {root: data/renders, weight: 0.2, cycle: true}
      epoch_samples: 0    # training samples per epoch over all ranks; 0: as mix_until says
      mix_until: last     # the epoch ends when the last entry has been read whole (or the first)

Each entry is read by its own source (``data.source``, or the entry's ``source``), with the run's
task: the sample format is the same for all. Their class names are merged by name (sorted); each
entry's labels are mapped onto the merged ids, and ``train`` writes the map to
``<run_dir>/classes.json``. A sample's key is ``<entry>/<its key in the entry>``.

# NOTE [ An epoch of a mix is a list drawn once, the same in every process ]
# At each epoch the mix draws, from (train.seed, epoch) alone, which entry each of the epoch's
# samples comes from (by weight), and each entry's order for each pass over it (a new one for each
# pass: no sample repeats before the entry has been read whole). That list is a map-style dataset
# of the epoch's length: its sampler (MixSampler) deals it over the ranks (equal steps on every
# rank), the workers read any item of it, and a checkpoint's sampler position resumes it exactly.
# The same settings draw the same list in every process, on every run; no worker or rank keeps
# a position of its own. A sample read again in a later pass gets other random augmentations.
# (DistributedSampler would not do: its length is fixed when it is built, and each epoch's draw
# has a length of its own.)
# A stream among the entries cannot be read at a random place: the mix is then drawn by each
# worker instead (data/mix_stream.py, in the projects that read streams).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import unicodedata
from collections import Counter
from collections.abc import Iterator
from pathlib import PurePath

import numpy as np
from torch.utils.data import Dataset, IterableDataset, Sampler

from .. import dist
from ..errors import DataError, UserError
from ..task import Task
from .source import Source

log = logging.getLogger(__name__)

UNTIL = ("first", "last")
CHUNK = 1 << 16  # entries drawn at a time


@dataclasses.dataclass
class Entry:
    """One opened entry of the mix."""

    name: str
    root: str
    source: Source
    weight: float
    cycle: bool
    labels: np.ndarray  # its class ids -> the merged ids


def entry_names(mix) -> list[str]:
    """Each entry's name: its ``name``, else the last part of its root; two alike are a mistake."""
    names = []
    for i, spec in enumerate(mix):
        name = spec.name or PurePath(str(spec.root).rstrip("/")).name or f"entry{i}"
        if "/" in name:
            raise UserError(f"data.mix[{i}].name={name!r}: a name holds no '/' (it begins each sample's key)")
        if name in names:
            raise UserError(
                f"data.mix[{i}] and data.mix[{names.index(name)}] are both named {name!r}: give each a name "
                "of its own (data.mix[i].name), which metrics and sample keys use"
            )
        names.append(name)
    return names


def open_mix(cfg, split: str, task=None, *, rank: int | None = None, world_size: int | None = None) -> MixSource:
    """The mix of ``data.mix`` for ``split``: each entry opened with its source, classes merged, formats checked."""
    from . import source_class

    if rank is None or world_size is None:
        rank, world_size = dist.get_rank(), dist.get_world_size()
    if cfg.data.cache:
        raise UserError("data.cache and data.mix together: a cache holds one source; set data.cache= to read the mix")
    task = task if task is not None else Task(cfg.data, split)
    entries = []
    for i, (name, spec) in enumerate(zip(entry_names(cfg.data.mix), cfg.data.mix, strict=True)):
        what = f"data.mix entry {name!r} (data.mix[{i}], root {spec.root})"
        cls = source_class(spec.source or cfg.data.source)
        if issubclass(cls, IterableDataset) and not hasattr(cls, "rows"):
            raise UserError(
                f"{what}: {cls.__name__} is an IterableDataset that gives no rows(): a mix reads map-style sources "
                "(__len__ and __getitem__) and the streams whose rows() a mix can draw from (data/mix_stream.py)"
            )
        keys = {"root": spec.root, "source": spec.source or cfg.data.source, "mix": []}
        if hasattr(cfg.data, "num_classes"):
            keys["num_classes"] = 0  # each entry's own classes; data.num_classes checks the merged ones
        try:
            opened = cls(
                dataclasses.replace(cfg.data, **keys),
                split,
                task,
                seed=cfg.train.seed,
                rank=rank,
                world_size=world_size,
            )
        except UserError as e:
            raise DataError(f"{what}: {e}") from None
        if not isinstance(opened, IterableDataset) and len(opened) == 0:
            raise DataError(f"{what} holds no {split} samples: fill it, or remove it from data.mix")
        entries.append(Entry(name, spec.root, opened, float(spec.weight), spec.cycle, np.zeros(0, np.int64)))
    classes = merge_classes(entries)
    wanted = getattr(cfg.data, "num_classes", 0)
    if wanted and wanted != len(classes):
        raise DataError(
            f"data.num_classes={wanted} but the entries of data.mix have {len(classes)} classes by name "
            "(set data.num_classes=0 to use them)"
        )
    shapes = {}
    for e in reversed(entries):  # each entry's first samples decode with the task; the first entry's set it last
        task.prepare(e.source.peek(16), where=f"data.mix entry {e.name!r} ({e.root})", num_classes=len(classes))
        shapes[e.name] = tuple(task.sample_shape)
    if len(set(shapes.values())) > 1:
        listing = ", ".join(f"{e.name}: {shapes[e.name]}" for e in entries)
        raise DataError(
            f"the entries of data.mix decode to samples of different shapes ({listing}): one format for all"
        )
    batch = cfg.loader.batch_size if cfg.loader.drop_last else 1
    if any(isinstance(e.source, IterableDataset) for e in entries):  # a stream among them: the mix streams too
        from .mix_stream import MixStream

        args = (cfg.data, split, task, entries, classes, batch)
        return MixStream(*args, seed=cfg.train.seed, rank=rank, world_size=world_size)
    multiple = world_size * batch
    return MixSource(
        cfg.data, split, task, entries, classes, multiple, seed=cfg.train.seed, rank=rank, world_size=world_size
    )


def read_once(cfg):
    """``cfg`` with each entry of its mix read once an epoch (none cycling, until the last runs out): what
    ``bench``'s checks read, where a sample read twice is a fault, not a cycle."""
    once = [dataclasses.replace(e, cycle=False) for e in cfg.data.mix]
    data = dataclasses.replace(cfg.data, mix=once, epoch_samples=0, mix_until="last")
    return dataclasses.replace(cfg, data=data)


def merge_classes(entries: list[Entry]) -> list[str]:
    """The classes of all entries by name, sorted; each entry's ``labels`` map set. Two names alike but for case,
    outer spaces or Unicode form are a mistake: one class or two, the user says which."""
    seen: dict[str, tuple[str, str]] = {}
    for e in entries:
        for name in e.source.classes:
            alike = unicodedata.normalize("NFC", str(name)).casefold().strip()
            first = seen.setdefault(alike, (str(name), e.name))
            if first[0] != str(name):
                raise DataError(
                    f"data.mix: class {str(name)!r} of entry {e.name!r} and class {first[0]!r} of entry {first[1]!r} "
                    "differ only in case, leading or trailing spaces or Unicode form: rename one, to the same name "
                    "(one class) or another (two classes)"
                )
    classes = sorted({name for name, _ in seen.values()})
    ids = {name: i for i, name in enumerate(classes)}
    for e in entries:
        e.labels = np.array([ids[str(name)] for name in e.source.classes], dtype=np.int64)
    return classes


def draw(
    sizes: list[int], weights: list[float], cycles: list[bool], until: str, total: int, rng, multiple: int = 1
) -> np.ndarray:
    """The entry each of one epoch's samples comes from, in order.

    Entries are drawn by weight (among those still taking part) until ``total`` samples, or with
    ``total=0`` until the first entry has been read whole (``until="first"``) or every entry has
    (``"last"``), and then on to a ``multiple`` of samples (whole batches on every rank: none left
    out, while an entry takes part). An entry read whole starts again (``cycle``) or stops taking part.

    >>> rng = np.random.default_rng(0)
    >>> drawn = draw([4, 100], [0.5, 0.5], [False, False], "last", 0, rng)
    >>> np.bincount(drawn).tolist()
    [4, 100]
    """
    k = len(sizes)
    w, n = np.asarray(weights, dtype=np.float64), np.asarray(sizes, dtype=np.int64)
    counts, live = np.zeros(k, dtype=np.int64), (w > 0) & (n > 0)
    unread = live.copy()  # not yet read whole this epoch
    parts, drawn, limit = [], 0, total or None
    while live.any() and (limit is None or drawn < limit):
        p = np.where(live, w, 0.0)
        chunk = rng.choice(k, size=CHUNK if limit is None else min(CHUNK, limit - drawn), p=p / p.sum())
        # the first draw that reads an entry whole: it may end the epoch or the entry's part in it
        reach = np.flatnonzero(unread & live & (counts + np.bincount(chunk, minlength=k) >= n))
        ends = [(int(np.flatnonzero(chunk == i)[n[i] - counts[i] - 1]), int(i)) for i in reach]
        at, whole = min(ends) if ends else (len(chunk) - 1, None)
        parts.append(chunk[: at + 1])
        counts += np.bincount(chunk[: at + 1], minlength=k)
        drawn += at + 1
        if whole is None:
            continue
        unread[whole] = False
        if not cycles[whole]:
            live[whole] = False
        if limit is None and (until == "first" or not unread.any()):
            limit = drawn + (-drawn) % multiple
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def seeds(*parts: int) -> list[int]:
    """NumPy's seed entropy from ``parts``: non-negative, as it requires (``train.seed`` may be negative)."""
    return [p % 2**64 for p in parts]


def derived_seed(*parts) -> int:
    """A 64-bit seed from ``parts`` (as text)."""
    text = "\0".join(map(str, parts)).encode("utf-8", "surrogateescape")
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


class Mixed:
    """What a mix is whether its entries are map-style (:class:`MixSource`) or streams (mix_stream.py): its
    entries, merged classes, asked shares, and a sample of an entry as the mix gives it."""

    entries: list[Entry]
    classes: list[str]
    seed: int

    @classmethod
    def open(cls, cfg, split: str, task=None, *, rank: int | None = None, world_size: int | None = None):
        """The mix of ``cfg.data.mix`` (:func:`open_mix`), as ``Source.open`` opens a source."""
        return open_mix(cfg, split, task, rank=rank, world_size=world_size)

    def mix_entries(self, cfg, entries: list[Entry], classes: list[str]) -> None:
        self.entries, self.classes = entries, classes
        self.until, self.epoch_samples = cfg.mix_until, cfg.epoch_samples

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        for e in self.entries:
            e.source.set_epoch(epoch)

    def from_entry(self, i: int, turn: int, read) -> dict:
        """``read()``'s sample of entry ``i`` in its pass ``turn`` (the pass seeds its augmentations), its key
        ``<entry>/<key>`` and its target the merged class id."""
        entry, seed = self.entries[i], self.entries[i].source.seed
        entry.source.seed = derived_seed(self.seed, entry.name, turn)  # this process's copy, for this sample only:
        try:  # a stream orders itself by its seed too, which must not change with what was decoded before
            sample = dict(read())
        finally:
            entry.source.seed = seed
        sample["key"] = f"{entry.name}/{sample['key']}"
        if "target" in sample:
            sample["target"] = int(entry.labels[sample["target"]])
        return sample

    def shares(self) -> dict[str, float]:
        """The share of the training samples each entry was asked for (its weight over all weights)."""
        total = sum(e.weight for e in self.entries)
        return {e.name: e.weight / total for e in self.entries}

    def class_map(self) -> dict:
        """The merged classes and each entry's id map (``train`` writes it to ``<run_dir>/classes.json``)."""
        return {
            "classes": self.classes,
            "entries": {
                e.name: {"root": e.root, "ids": dict(zip(map(str, e.source.classes), e.labels.tolist(), strict=True))}
                for e in self.entries
            },
        }

    def peek(self, n: int) -> list[bytes]:
        return self.entries[0].source.peek(n)

    def fingerprint(self) -> dict:
        return {
            "mix": [
                {"name": e.name, "weight": e.weight, "cycle": e.cycle, **e.source.fingerprint()} for e in self.entries
            ],
            "until": self.until,
            "epoch_samples": self.epoch_samples,
        }


class MixSource(Mixed, Source, Dataset):
    """The map-style entries of ``data.mix`` as one map-style source (see the NOTE above); :func:`open_mix`
    builds it. Training reads an epoch's drawn list; validation every entry's samples once, one after another.
    """

    def __init__(self, cfg, split, task, entries: list[Entry], classes: list[str], multiple=1, **kwargs) -> None:
        super().__init__(cfg, split, task, **kwargs)
        self.mix_entries(cfg, entries, classes)
        self.multiple = multiple  # an epoch's samples, rounded up to whole batches on every rank
        self._plan: tuple[int, np.ndarray, np.ndarray] | None = None  # (epoch, entry of each item, its draw)
        self._orders: dict[tuple[int, int, int], np.ndarray] = {}  # (epoch, entry, pass) -> that pass's order

    def __getstate__(self) -> dict:  # what a process draws it draws again: nothing drawn travels to workers
        return {**super().__getstate__(), "_plan": None, "_orders": {}}

    def plan(self) -> tuple[np.ndarray, np.ndarray]:
        """This epoch's items: the entry of each, and which of that entry's draws it is (0, 1, ...)."""
        epoch = self.epoch
        if self._plan is None or self._plan[0] != epoch:
            sizes = [len(e.source) for e in self.entries]
            if self.split == "train":
                rng = np.random.default_rng(seeds(self.seed, epoch, 0x6D6978))
                weights, cycles = [e.weight for e in self.entries], [e.cycle for e in self.entries]
                which = draw(sizes, weights, cycles, self.until, self.epoch_samples, rng, self.multiple)
            else:
                which = np.repeat(np.arange(len(sizes)), sizes)
            which = which.astype(np.int16)  # 6 bytes a sample of the epoch, in each process (drawn in each)
            nth = np.zeros(len(which), dtype=np.int32 if len(which) < 2**31 else np.int64)
            for i in range(len(self.entries)):
                mask = which == i
                nth[mask] = np.arange(np.count_nonzero(mask))
            self._plan, self._orders = (epoch, which, nth), {}
        return self._plan[1], self._plan[2]

    def __len__(self) -> int:
        return len(self.plan()[0])

    def locate(self, index: int) -> tuple[int, int, int]:
        """Item ``index`` of this epoch: ``(entry, pass over it, index in the entry)``."""
        which, nth = self.plan()
        i, k = int(which[index]), int(nth[index])
        if self.split != "train":
            return i, 0, k
        size = len(self.entries[i].source)
        turn = k // size
        return i, turn, int(self.order(i, turn)[k % size])

    def order(self, i: int, turn: int) -> np.ndarray:
        """Entry ``i``'s order in its pass ``turn`` of this epoch (kept until the epoch ends: about 4 bytes a
        sample of the epoch, as the entries' samples come interleaved)."""
        key = (self.epoch, i, turn)
        if key not in self._orders:
            size = len(self.entries[i].source)
            self._orders[key] = entry_order(self.seed, self.epoch, i, turn, size)
        return self._orders[key]

    def __getitem__(self, index: int) -> dict:
        i, turn, inner = self.locate(index)
        return self.from_entry(i, turn, lambda: self.entries[i].source[inner])

    def train_sampler(self, rank: int, world_size: int) -> MixSampler:
        return MixSampler(self, rank, world_size)


def entry_order(seed: int, epoch: int, i: int, turn: int, size: int) -> np.ndarray:
    """The order of a map-style entry's samples in one pass over it: new for each (seed, epoch, entry, pass)."""
    order = np.random.default_rng(seeds(seed, epoch, i, turn)).permutation(size)
    return order.astype(np.int32) if size < 2**31 else order


class MixSampler(Sampler[int]):
    """Rank ``r`` of ``w`` takes items ``r, r + w, ...`` of the epoch's drawn list (drawn in random order already),
    the same number on every rank: the last ``len % w`` items of an epoch are left out.

    Its position in an epoch is the number of items it gave, which StatefulDataLoader keeps and skips again.
    """

    def __init__(self, mix: MixSource, rank: int, world_size: int) -> None:
        self.mix, self.rank, self.world_size = mix, rank, world_size

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, len(self) * self.world_size, self.world_size))

    def __len__(self) -> int:
        return len(self.mix) // self.world_size


def entry_counts(keys: list[str], names: list[str]) -> list[int]:
    """How many of ``keys`` each entry named in ``names`` gave (a mix's keys begin with the entry's name).

    >>> entry_counts(["a/train/x", "b/train/y", "a/train/z"], ["a", "b"])
    [2, 1]
    """
    counted = Counter(key.partition("/")[0] for key in keys)
    return [counted.get(name, 0) for name in names]


def entry_metrics(dataset, counts: dict[str, int]) -> dict:
    """An epoch's metrics of a mix: each entry's samples, their shares, and the shares its weights asked for
    (none without a mix: ``counts`` empty)."""
    if not counts:
        return {}
    total = max(sum(counts.values()), 1)
    return {
        "entry_samples": counts,
        "entry_share": {name: round(n / total, 4) for name, n in counts.items()},
        "entry_share_asked": {name: round(share, 4) for name, share in dataset.shares().items()},
    }
