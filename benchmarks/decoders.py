"""CPU image decoders for the loader workers, side by side in one process: speed, output, corner cases.

    .venv/bin/python benchmarks/decoders.py [--photos 300] [--large 6] [--png 300] [--rounds 7] [--out DIR]

What ``ImageFormat.decode`` (sample_format.py) could run instead of torchvision's deprecated
``decode_image``, each to a uint8 RGB CHW tensor (a CHW view of HWC pixels where the library gives
HWC: no copy), each with the header read it needs for ``data.max_pixels`` and the scale:

* ``torchvision.io.decode_image`` (deprecated since torchvision 0.29): full size only;
* the template's ``decode`` today: PIL's header and ``Image.draft`` (libjpeg's DCT scaling to 1/2, 1/4
  or 1/8) where a JPEG can be reduced, torchvision's ``decode_image`` otherwise;
* PIL alone: ``Image.open`` + ``draft`` + ``convert("RGB")`` + ``pil_to_tensor``;
* OpenCV: PIL's header, then ``cv2.imdecode`` with ``IMREAD_COLOR_RGB`` or ``IMREAD_REDUCED_COLOR_2/4/8``
  (reduced flags only for a JPEG: on a PNG OpenCV decodes it whole and resizes);
* simplejpeg (JPEG only): ``decode_jpeg_header``, then ``decode_jpeg(min_height=, min_width=)`` (TurboJPEG's
  scaling factors n/8), with ``min_factor=2`` (only a 2x or larger reduction, like PIL's draft) and 1 (any n/8);
* torchcodec: PIL's header, then ``torchcodec.decoders.decode_image`` (full size only: no scaled decode).

Sets: (a) photos as photos.py writes them (400-600 px, quality 90) decoded for the train target (shorter
side >= 438, a 224 crop's) and the eval one (>= 256); (b) 3000 x 2250 JPEGs (photos.write_large) to
the smallest scale keeping the shorter side >= 438 and >= 256; (c) PNGs of 64 and 500 px. In each round
the decoders take turns, 3 images at a time (NOTE [ Interleaved timing ]), after a warm-up; the table gives
the median over rounds of the CPU microseconds per image, and of the wall clock's. PSNR compares each
output with PIL's full decode (resized with Lanczos to the output's size where the output is reduced) and
with PIL's own output (the same path's reference: "identical" where every pixel matches). torch and
OpenCV run one thread. The corner cases (grayscale and CMYK JPEG, EXIF orientation, truncated JPEG,
16-bit, palette and RGBA PNG, an animated GIF named .png, garbage bytes) call each library's plain
full-size API.
Writes OUT/decoders.md and OUT/decoders.json.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import io
import json
import math
import os
import platform
import re
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import torch
from PIL import Image, ImageOps, features

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import photos  # noqa: E402 (beside this script)

warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torchvision\.io")
warnings.filterwarnings("ignore", message=".*deprecated since torchvision 0.29.*")

try:
    import simplejpeg
except ImportError:  # reported as missing, not measured
    simplejpeg = None
try:
    import torchcodec.decoders as tc_decoders
except ImportError:
    tc_decoders = None

JPEG_START = b"\xff\xd8\xff"
TRAIN_SIDE, EVAL_SIDE = 438, 256  # a 224 crop's train decode target (crop_scale 0.35, ratio 3/4) and eval's
CV2_REDUCED = {1: cv2.IMREAD_COLOR_RGB, 2: 16 | cv2.IMREAD_COLOR_RGB, 4: 32 | cv2.IMREAD_COLOR_RGB}
CV2_REDUCED[8] = 64 | cv2.IMREAD_COLOR_RGB  # IMREAD_REDUCED_COLOR_n is 16/32/64 | IMREAD_COLOR (BGR)
CHUNK = 3  # images a decoder decodes before the next one takes its turn (NOTE [ Interleaved timing ])

Decoder = Callable[[bytes, "int | None"], torch.Tensor]


# -- the decoders -----------------------------------------------------------------------------------


def _reduction(width: int, height: int, min_side: int | None) -> int:
    """PIL's draft rule: the largest of 8, 4, 2 that keeps both sides >= min_side (1: none)."""
    if min_side is None:
        return 1
    scale = min(width // min_side, height // min_side)
    return next((f for f in (8, 4, 2) if scale >= f), 1)


def _hwc(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(array).permute(2, 0, 1)


def dec_torchvision(data: bytes, min_side: int | None) -> torch.Tensor:
    from torchvision.io import ImageReadMode, decode_image

    with Image.open(io.BytesIO(data)) as image:  # the header: data.max_pixels
        image.size  # noqa: B018
    out = decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
    return out[0] if out.ndim == 4 else out


def dec_template(data: bytes, min_side: int | None) -> torch.Tensor:
    """sample_format.ImageFormat.decode as it is (less its errors)."""
    from torchvision.io import ImageReadMode, decode_image
    from torchvision.transforms.v2 import functional as F_v2

    image = Image.open(io.BytesIO(data))
    with image:
        width, height = image.size
        if min_side is not None:
            image.draft("RGB", (min_side, min_side))
            if image.size != (width, height):
                return F_v2.pil_to_tensor(image.convert("RGB"))
    out = decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB)
    out = out[0] if out.ndim == 4 else out
    return F_v2.to_dtype(out, torch.uint8, scale=True) if out.dtype != torch.uint8 else out


def dec_pil(data: bytes, min_side: int | None) -> torch.Tensor:
    from torchvision.transforms.v2 import functional as F_v2

    with Image.open(io.BytesIO(data)) as image:
        if min_side is not None:
            image.draft("RGB", (min_side, min_side))  # a JPEG's DCT scaling; others ignore it
        return F_v2.pil_to_tensor(image if image.mode == "RGB" else image.convert("RGB"))


def dec_cv2(data: bytes, min_side: int | None) -> torch.Tensor:
    with Image.open(io.BytesIO(data)) as image:  # the header: data.max_pixels and the scale
        width, height = image.size
    factor = _reduction(width, height, min_side) if data[:3] == JPEG_START else 1
    out = cv2.imdecode(np.frombuffer(data, np.uint8), CV2_REDUCED[factor])
    if out is None:
        raise ValueError("cv2.imdecode returned None")
    return _hwc(out)


def _simplejpeg(min_factor: float) -> Decoder:
    def decode(data: bytes, min_side: int | None) -> torch.Tensor:
        simplejpeg.decode_jpeg_header(data)  # the header: data.max_pixels
        side = min_side or 0
        return _hwc(simplejpeg.decode_jpeg(data, "RGB", min_height=side, min_width=side, min_factor=min_factor))

    return decode


def dec_torchcodec(data: bytes, min_side: int | None) -> torch.Tensor:
    with Image.open(io.BytesIO(data)) as image:  # the header: data.max_pixels (torchcodec has no header read)
        image.size  # noqa: B018
    out = tc_decoders.decode_image(data)  # mode="RGB", output_dtype=torch.uint8 (16-bit PNGs scaled)
    return out[0] if out.ndim == 4 else out


def decoders() -> dict[str, tuple[Decoder, bool]]:
    """name -> (decode(data, min_side), decodes PNG)."""
    found: dict[str, tuple[Decoder, bool]] = {
        "torchvision decode_image (deprecated)": (dec_torchvision, True),
        "template today (PIL draft / torchvision)": (dec_template, True),
        "PIL draft + pil_to_tensor": (dec_pil, True),
        "cv2.imdecode (IMREAD_REDUCED_COLOR_n)": (dec_cv2, True),
    }
    if simplejpeg is not None:
        found["simplejpeg, min_factor=2"] = (_simplejpeg(2), False)
        found["simplejpeg, min_factor=1 (any n/8)"] = (_simplejpeg(1), False)
    if tc_decoders is not None:
        found["torchcodec decode_image"] = (dec_torchcodec, True)
    return found


# -- the sets ----------------------------------------------------------------------------------------


def make_sets(work: Path, n_photos: int, n_large: int, n_png: int) -> dict[str, list[bytes]]:
    photos.write_photos(work / "photos", n_photos, 0, workers=2)
    jpegs = sorted((work / "photos" / "train").rglob("*.jpg"))
    large = photos.write_large(work / "large", n_large)
    sets = {"photos": [p.read_bytes() for p in jpegs], "large": [p.read_bytes() for p in large]}
    noise = photos._noise(7)
    for side in (64, 500):
        rng = np.random.default_rng([7, side])
        sets[f"png{side}"] = [_encode(photos.photo(rng, side, side, noise), "PNG") for _ in range(n_png)]
    return sets


def _encode(array: np.ndarray, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, fmt, **kw)
    return buf.getvalue()


# -- timing and quality ------------------------------------------------------------------------------


def time_set(found: dict, names: list[str], datas: list[bytes], min_side: int | None, rounds: int) -> dict:
    """Microseconds per image, one value per round, of the process's CPU time and of the wall clock.

    # NOTE [ Interleaved timing ]
    # A round passes over the set in chunks of CHUNK images; each chunk is decoded by every decoder in
    # turn, their order rotating from chunk to chunk, so a load that comes and goes on the machine falls
    # on all of them alike. The CPU time (time.process_time, every thread of the process) leaves out the
    # time the process waits for a core, which the wall clock counts: on a busy machine, read the CPU time.
    """
    cpu: dict[str, list[float]] = {name: [] for name in names}
    wall: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # warm-up: libraries loaded, caches and allocator primed
        for data in datas[:5]:
            found[name][0](data, min_side)
    chunks = [datas[i : i + CHUNK] for i in range(0, len(datas), CHUNK)]
    for r in range(rounds):
        cpu_ns, wall_ns = dict.fromkeys(names, 0), dict.fromkeys(names, 0)
        for c, chunk in enumerate(chunks):
            shift = (r + c) % len(names)
            for name in names[shift:] + names[:shift]:
                decode = found[name][0]
                wall_0, cpu_0 = time.perf_counter_ns(), time.process_time_ns()
                for data in chunk:
                    decode(data, min_side)
                cpu_ns[name] += time.process_time_ns() - cpu_0
                wall_ns[name] += time.perf_counter_ns() - wall_0
        for name in names:
            cpu[name].append(cpu_ns[name] / len(datas) / 1e3)
            wall[name].append(wall_ns[name] / len(datas) / 1e3)
    return {"cpu": cpu, "wall": wall}


def _psnr(sq_err: float, count: int) -> float | None:
    """None: identical."""
    return None if sq_err == 0 else 10 * math.log10(255**2 / (sq_err / count))


def _pil_full(data: bytes) -> Image.Image:
    with Image.open(io.BytesIO(data)) as image:
        return image.convert("RGB")


def quality(found: dict, names: list[str], datas: list[bytes], min_side: int | None) -> dict:
    """Per decoder: the decoded sizes (as scales of the source's shorter side) and the PSNR of its outputs
    against PIL's full decode (Lanczos-resized to each output's size where reduced) and PIL's own output."""
    fulls = [_pil_full(d) for d in datas]
    pil_own = [dec_pil(d, min_side) for d in datas]
    result = {}
    for name in names:
        scales, sizes = Counter(), Counter()
        err_full = err_pil = count = 0.0
        pil_same = True
        for data, full, own in zip(datas, fulls, pil_own):
            out = found[name][0](data, min_side)
            h, w = out.shape[-2:]
            sizes[f"{w} x {h}"] += 1
            scales[_scale_name(min(h, w) / min(full.size))] += 1
            ref = full if full.size == (w, h) else full.resize((w, h), Image.Resampling.LANCZOS)
            hwc = out.permute(1, 2, 0).numpy().astype(np.int32)
            err_full += float(((hwc - np.asarray(ref, dtype=np.int32)) ** 2).sum())
            count += hwc.size
            if tuple(own.shape) == tuple(out.shape):
                err_pil += float(((out.to(torch.int32) - own.to(torch.int32)) ** 2).sum())
            else:
                pil_same = False
        result[name] = {
            "decoded": dict(sizes) if len(sizes) <= 3 else {"various": sum(sizes.values())},
            "scales": dict(scales),
            "psnr_vs_pil_full_db": _round(_psnr(err_full, count)),
            "psnr_vs_pil_same_path_db": _round(_psnr(err_pil, count)) if pil_same else "other size",
        }
    return result


def _scale_name(ratio: float) -> str:
    eighths = round(ratio * 8)
    return "1/1" if eighths >= 8 else {4: "1/2", 2: "1/4", 1: "1/8"}.get(eighths, f"{eighths}/8")


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def header_costs(sets: dict[str, list[bytes]], rounds: int) -> dict:
    """Microseconds per image of the header reads alone (data.max_pixels and the scale need one)."""

    def pil_header(data: bytes) -> None:
        with Image.open(io.BytesIO(data)) as image:
            image.size  # noqa: B018

    readers = {"PIL Image.open(...).size": pil_header}
    if simplejpeg is not None:
        readers["simplejpeg.decode_jpeg_header"] = simplejpeg.decode_jpeg_header
    out = {}
    for set_name in ("photos", "large", "png500"):
        for name, read in readers.items():
            if "simplejpeg" in name and set_name.startswith("png"):
                continue
            times = []
            for _ in range(rounds):
                start = time.perf_counter_ns()
                for data in sets[set_name]:
                    read(data)
                times.append((time.perf_counter_ns() - start) / len(sets[set_name]) / 1e3)
            out[f"{name} | {set_name}"] = round(statistics.median(times), 1)
    return out


# -- corner cases ------------------------------------------------------------------------------------


def corner_files() -> dict[str, tuple[bytes, np.ndarray | None, str]]:
    """name -> (bytes, the RGB pixels a decoder should give or None, what it is)."""
    rng = np.random.default_rng(3)
    base = photos.photo(rng, 400, 300, photos._noise(3))  # 400 wide, 300 high
    jpeg = _encode(base, "JPEG", quality=90)
    ref_jpeg = np.asarray(_pil_full(jpeg))
    files: dict[str, tuple[bytes, np.ndarray | None, str]] = {}
    gray = np.asarray(Image.fromarray(base).convert("L"))
    files["grayscale JPEG"] = (_encode(gray, "JPEG", quality=90), np.repeat(gray[..., None], 3, 2), "1 channel")
    cmyk = io.BytesIO()
    Image.fromarray(base).convert("CMYK").save(cmyk, "JPEG", quality=90)
    files["CMYK JPEG"] = (cmyk.getvalue(), base, "Adobe CMYK, as PIL writes it; truth: the RGB source")
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate 90 clockwise to display
    oriented = io.BytesIO()
    Image.fromarray(base).save(oriented, "JPEG", quality=90, exif=exif)
    upright = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(oriented.getvalue()))).convert("RGB"))
    files["EXIF orientation 6"] = (oriented.getvalue(), upright, "stored 400 x 300; truth: displayed 300 x 400")
    files["truncated JPEG (first 60%)"] = (jpeg[: len(jpeg) * 6 // 10], ref_jpeg, "truth: the whole file's decode")
    files["JPEG without its EOI marker"] = (jpeg[:-2], ref_jpeg, "the last 2 bytes (FF D9) cut")
    deep = (base.astype(np.uint16) * 257 + rng.integers(0, 257, base.shape)).astype(np.uint16)
    deep_ref = np.round(deep / 257).astype(np.uint8)
    files["16-bit RGB PNG"] = (cv2.imencode(".png", deep[..., ::-1])[1].tobytes(), deep_ref, "truth: round(v / 257)")
    files["16-bit grayscale PNG"] = (
        cv2.imencode(".png", deep[..., 1])[1].tobytes(),
        np.repeat(deep_ref[..., 1:2], 3, 2),
        "truth: round(v / 257)",
    )
    palette = Image.fromarray(base).convert("P", palette=Image.Palette.ADAPTIVE)
    files["palette PNG"] = (_encode_image(palette, "PNG"), np.asarray(palette.convert("RGB")), "256 colours")
    alpha = rng.integers(0, 256, base.shape[:2], dtype=np.uint8)
    files["RGBA PNG"] = (_encode(np.dstack([base, alpha]), "PNG"), base, "random alpha; truth: alpha dropped")
    frames = [Image.fromarray(np.roll(base, 80 * i, axis=1)) for i in range(3)]
    gif = io.BytesIO()
    frames[0].save(gif, "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    first = np.asarray(Image.open(io.BytesIO(gif.getvalue())).convert("RGB"))
    files["animated GIF named .png"] = (gif.getvalue(), first, "3 frames; truth: the first")
    files["garbage bytes"] = (b"this is not an image " * 20, None, "no magic number")
    junk = bytes(rng.integers(0, 256, 2000, dtype=np.uint8))
    files["JPEG magic + garbage"] = (JPEG_START + b"\xe0" + junk, None, "starts FF D8 FF E0")
    return files


def _encode_image(image: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt)
    return buf.getvalue()


def corner_apis() -> dict[str, Callable[[bytes], object]]:
    """Each library's plain full-size call, as a project would make it."""
    from torchvision.io import ImageReadMode, decode_image

    def pil(data: bytes):
        with Image.open(io.BytesIO(data)) as image:
            return np.asarray(image.convert("RGB"))

    apis: dict[str, Callable[[bytes], object]] = {
        "PIL open().convert('RGB')": pil,
        "cv2.imdecode(IMREAD_COLOR_RGB)": lambda d: cv2.imdecode(np.frombuffer(d, np.uint8), cv2.IMREAD_COLOR_RGB),
        "torchvision decode_image(RGB)": lambda d: decode_image(
            torch.frombuffer(bytearray(d), dtype=torch.uint8), mode=ImageReadMode.RGB
        ),
    }
    if simplejpeg is not None:
        apis["simplejpeg.decode_jpeg('RGB')"] = lambda d: simplejpeg.decode_jpeg(d, "RGB")
    if tc_decoders is not None:
        apis["torchcodec decode_image()"] = lambda d: tc_decoders.decode_image(d)
    return apis


def corners() -> dict:
    files = corner_files()
    apis = corner_apis()
    table = {}
    for case, (data, truth, what) in files.items():
        row = {"what": what}
        for api, call in apis.items():
            row[api] = _outcome(call, data, truth)
        table[case] = row
    # cv2's flags that matter: orientation applied by default (reduced flags too), ignored on request
    data, truth, _ = files["EXIF orientation 6"]
    flags = cv2.IMREAD_REDUCED_COLOR_2
    extra = {
        "cv2 IMREAD_REDUCED_COLOR_2, EXIF 6": _shape(cv2.imdecode(np.frombuffer(data, np.uint8), flags)),
        "cv2 IMREAD_COLOR_RGB + IMREAD_IGNORE_ORIENTATION, EXIF 6": _shape(
            cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR_RGB | cv2.IMREAD_IGNORE_ORIENTATION)
        ),
        "cv2 IMREAD_UNCHANGED, 16-bit RGB PNG": _shape(
            cv2.imdecode(np.frombuffer(files["16-bit RGB PNG"][0], np.uint8), cv2.IMREAD_UNCHANGED)
        ),
    }
    data = files["truncated JPEG (first 60%)"][0]
    if simplejpeg is not None:
        extra["simplejpeg strict=False, truncated"] = _outcome(
            lambda d: simplejpeg.decode_jpeg(d, "RGB", strict=False), data, files["truncated JPEG (first 60%)"][1]
        )
    from PIL import ImageFile

    ImageFile.LOAD_TRUNCATED_IMAGES = True
    try:
        extra["PIL LOAD_TRUNCATED_IMAGES=True, truncated"] = _outcome(
            apis["PIL open().convert('RGB')"], data, files["truncated JPEG (first 60%)"][1]
        )
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = False
    if tc_decoders is not None:
        gif = files["animated GIF named .png"][0]
        extra["torchcodec decode_png on the GIF"] = _outcome(lambda d: tc_decoders.decode_png(d), gif, None)
        extra["torchcodec decode_jpeg(device='cuda') without CUDA"] = _outcome(
            lambda d: tc_decoders.decode_jpeg(d, device="cuda"), files["grayscale JPEG"][0], None
        )
    return {"cases": table, "extra": extra}


def _shape(x) -> str:
    return "None" if x is None else f"{tuple(x.shape)} {x.dtype}"


def _outcome(call: Callable[[bytes], object], data: bytes, truth: np.ndarray | None) -> str:
    """What a call gives: its error, or the shape, dtype and PSNR against the truth."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = call(data)
    except Exception as e:
        message = re.sub(r"\s+", " ", str(e)).strip()
        message = re.sub(r"^\w+, /\S+:\d+, ", "", message)  # torch's C++ location prefix
        message = re.sub(r"<[^<>]* at 0x[0-9a-f]+>", "<...>", message)  # an object's address: noise
        module = type(e).__module__
        name = type(e).__name__ if module == "builtins" else f"{module.split('.')[0]}.{type(e).__name__}"
        return f"{name}: {message[:80]}"
    if out is None:
        return "returns None (no exception)"
    array = out.numpy() if isinstance(out, torch.Tensor) else np.asarray(out)
    notes = []
    if isinstance(out, torch.Tensor):  # CHW or NCHW
        if array.ndim == 4:
            notes.append(f"{array.shape[0]} frames, NCHW")
            array = array[0]
        array = array.transpose(1, 2, 0)
    shape = "x".join(map(str, array.shape))
    if array.dtype != np.uint8:
        notes.append(str(array.dtype))
        array = np.round(array.astype(np.float64) / 257).astype(np.uint8)
    if truth is None:
        return ", ".join([f"decodes {shape}", *notes])
    if array.shape != truth.shape:
        flipped = array.shape == truth.shape[1::-1] + truth.shape[2:]
        notes.append("not rotated" if flipped else "other shape")
        return ", ".join([shape, *notes])
    err = float(((array.astype(np.int32) - truth.astype(np.int32)) ** 2).sum())
    psnr = _psnr(err, array.size)
    return ", ".join([shape, *notes, "identical" if psnr is None else f"{psnr:.1f} dB"])


# -- the environment ---------------------------------------------------------------------------------


def _turbo_in(folder: Path, pattern: str) -> str:
    """The libjpeg-turbo version compiled into the shared libraries matching pattern, if any."""
    for lib in sorted(folder.glob(pattern)):
        found = re.search(rb"libjpeg-turbo version ([0-9.]+)", lib.read_bytes())
        if found:
            return found.group(1).decode()
    return "none found"


def environment() -> dict:
    site = Path(cv2.__file__).resolve().parent.parent
    versions = {}
    for dist in ("torch", "torchvision", "pillow", "opencv-python-headless", "simplejpeg", "torchcodec", "numpy"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = "not installed"
    cv2_jpeg = re.search(r"JPEG:\s+(.+)", cv2.getBuildInformation())
    turbo = {
        "pillow": features.version_feature("libjpeg_turbo") or "no (IJG libjpeg)",
        "opencv-python-headless": cv2_jpeg.group(1).strip() if cv2_jpeg else "?",
        "simplejpeg": _turbo_in(site / "simplejpeg", "_jpeg*.so"),
        "torchcodec": _turbo_in(site / "torchcodec.libs", "libjpeg*.so*"),
        "torchvision": _turbo_in(site / "torchvision.libs", "libjpeg*.so*"),
    }
    with open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "usable_cores": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "versions": versions,
        "libjpeg_turbo": turbo,
        "torch_threads": torch.get_num_threads(),
        "cv2_threads": cv2.getNumThreads(),
    }


# -- the report --------------------------------------------------------------------------------------

SETS = (  # (set, min_side, heading)
    ("photos", TRAIN_SIDE, "400-600 px photos (quality 90), train target: shorter side >= 438"),
    ("photos", EVAL_SIDE, "400-600 px photos (quality 90), eval target: shorter side >= 256"),
    ("large", TRAIN_SIDE, "3000 x 2250 JPEGs (quality 90), shorter side >= 438"),
    ("large", EVAL_SIDE, "3000 x 2250 JPEGs (quality 90), shorter side >= 256"),
    ("png64", TRAIN_SIDE, "64 px PNGs (train call: no reduction for a PNG)"),
    ("png500", TRAIN_SIDE, "500 px PNGs (train call: no reduction for a PNG)"),
)


CALLS = [
    "The calls (s: the shorter side wanted):",
    "",
    '* PIL: `Image.open(io.BytesIO(data))` (the header only), `image.draft("RGB", (s, s))` (a JPEG: libjpeg\'s',
    '  DCT scaling to 1/2, 1/4 or 1/8 keeping both sides >= s; any other format: nothing), `image.convert("RGB")`,',
    "  `pil_to_tensor`. (`Image.reduce(n)` box-filters a full decode: it saves no decoding.)",
    "* OpenCV: `cv2.imdecode(np.frombuffer(data, np.uint8), flags)` -> HWC ndarray, or None on any failure (no",
    "  exception); flags `cv2.IMREAD_COLOR_RGB` (OpenCV 4.11+) or `16`/`32`/`64 | cv2.IMREAD_COLOR_RGB` (the scales",
    "  of `IMREAD_REDUCED_COLOR_2/4/8`, which are BGR); on a non-JPEG the reduced flags decode whole and resize.",
    "  It applies EXIF orientation unless `cv2.IMREAD_IGNORE_ORIENTATION`; it has no header-only read.",
    "* simplejpeg (JPEG only): `simplejpeg.decode_jpeg_header(data)` -> (height, width, colorspace, subsampling);",
    '  `simplejpeg.decode_jpeg(data, "RGB", min_height=s, min_width=s, min_factor=2)` -> HWC ndarray at a',
    "  TurboJPEG scale n/8 (sizes rounded up); ValueError on any failure (`strict=True`, the default).",
    '* torchcodec: `torchcodec.decoders.decode_image(data, mode="RGB", output_dtype=torch.uint8)` (bytes, a uint8',
    "  tensor or a path) -> CHW view of HWC pixels (NCHW for an animated GIF or WebP); `decode_jpeg(list, device=",
    '  "cuda")` decodes a batch in one nvJPEG call. No scaled decode, no header read; EXIF orientation applied.',
    "",
]


def markdown(result: dict) -> str:
    env = result["environment"]
    v, turbo = env["versions"], env["libjpeg_turbo"]
    lines = [
        "# CPU image decoders for the loader workers (benchmarks/decoders.py)",
        "",
        f"Measured {env['date']} on {env['cpu']} ({env['usable_cores']} usable cores), Python {env['python']},",
        f"one process, torch threads {env['torch_threads']}, OpenCV threads {env['cv2_threads']}; "
        f"{result['settings']['rounds']} rounds, the decoders taking turns {CHUNK} images at a time.",
        "",
        "| package | version | libjpeg-turbo in its wheel |",
        "| --- | --- | --- |",
    ]
    for dist in ("pillow", "opencv-python-headless", "simplejpeg", "torchcodec", "torchvision"):
        lines.append(f"| {dist} | {v.get(dist)} | {turbo.get(dist)} |")
    lines += [f"| torch | {v['torch']} | |", f"| numpy | {v['numpy']} | |", ""]
    lines += CALLS
    lines += [
        "Each row: a decode to uint8 RGB CHW, its header read included (PIL's `Image.open` for all but",
        "simplejpeg, which reads its own). *CPU us/image*: the process's CPU time, the median over rounds (the",
        "wall clock also counts waits for a core when other work shares the machine). *range*: the fastest and",
        "slowest round's CPU time. *x template*: the template's CPU time over the row's. *vs PIL full*: PSNR",
        "against PIL's full decode, Lanczos-resized to the output's size where the output is reduced.",
        "*vs PIL same path*: against `PIL draft + pil_to_tensor` on the same call (identical = every pixel).",
        "",
    ]
    for timing in result["timings"].values():
        lines += [f"## {timing['heading']}", "", f"{timing['images']} images, {timing['mb']} MB.", ""]
        lines += [
            "| decoder | CPU us/image | range | wall us/image | x template | decoded to | vs PIL full (dB) "
            "| vs PIL same path (dB) |",
            "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
        ]
        base = timing["rows"].get("template today (PIL draft / torchvision)", {}).get("median_us")
        for name, row in timing["rows"].items():
            if "skipped" in row:
                lines.append(f"| {name} | – | | | | {row['skipped']} | | |")
                continue
            q = row["quality"]
            ratio = f"{base / row['median_us']:.2f}x" if base else ""
            decoded = ", ".join(f"{k} ({n})" if len(q["decoded"]) > 1 else k for k, n in q["decoded"].items())
            if "various" in q["decoded"]:
                decoded = "scales " + ", ".join(f"{s}: {n}" for s, n in sorted(q["scales"].items()))
            lines.append(
                f"| {name} | {row['median_us']:.0f} | {row['min_us']:.0f}–{row['max_us']:.0f} "
                f"| {row['wall_median_us']:.0f} | {ratio} | {decoded} "
                f"| {_db(q['psnr_vs_pil_full_db'])} | {_db(q['psnr_vs_pil_same_path_db'])} |"
            )
        lines.append("")
    lines += ["## Header reads alone", "", "| reader | set | us/image |", "| --- | --- | ---: |"]
    for key, us in result["headers"].items():
        reader, set_name = key.split(" | ")
        lines.append(f"| {reader} | {set_name} | {us} |")
    lines += ["", "## Corner cases (each library's plain full-size call)", ""]
    lines += [
        "PSNR against the truth each case names (a JPEG's truth is its source, so 35-50 dB is a good decode).",
        "",
    ]
    apis = [k for k in next(iter(result["corners"]["cases"].values())) if k != "what"]
    lines += ["| case | " + " | ".join(apis) + " |", "| --- |" + " --- |" * len(apis)]
    for case, row in result["corners"]["cases"].items():
        cells = (row[a].replace("|", "/") for a in apis)
        lines.append(f"| {case} ({row['what']}) | " + " | ".join(cells) + " |")
    lines += ["", "| other call | outcome |", "| --- | --- |"]
    lines += [f"| {k} | {v.replace('|', '/')} |" for k, v in result["corners"]["extra"].items()]
    return "\n".join(lines) + "\n"


def _db(x) -> str:
    return "identical" if x is None else str(x)


# -- main --------------------------------------------------------------------------------------------


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--photos", type=int, default=300, help="400-600 px JPEG photos (photos.py)")
    p.add_argument("--large", type=int, default=6, help="3000 x 2250 JPEGs (photos.write_large)")
    p.add_argument("--png", type=int, default=300, help="PNGs of each size (64 and 500 px)")
    p.add_argument("--rounds", type=int, default=7, help="timed passes over each set; medians are reported")
    p.add_argument("--out", default=str(HERE / "results"), help="where decoders.md and decoders.json go")
    p.add_argument("--work", default=None, help="write the images here (default: a temporary folder)")
    args = p.parse_args()

    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    found = decoders()
    with tempfile.TemporaryDirectory(prefix="decoders-") as tmp:
        work = Path(args.work or tmp)
        print(f"writing images to {work}", flush=True)
        sets = make_sets(work, args.photos, args.large, args.png)
    timings = {}
    for set_name, min_side, heading in SETS:
        datas = sets[set_name]
        names = [n for n, (_, png) in found.items() if png or not set_name.startswith("png")]
        print(f"timing {heading}", flush=True)
        us = time_set(found, names, datas, min_side, args.rounds)
        q = quality(found, names, datas, min_side)
        rows = {}
        for name in found:
            if name not in names:
                rows[name] = {"skipped": "no PNG support (JPEG only)"}
                continue
            cpu, wall = us["cpu"][name], us["wall"][name]
            rows[name] = {
                "median_us": round(statistics.median(cpu), 1),
                "min_us": round(min(cpu), 1),
                "max_us": round(max(cpu), 1),
                "wall_median_us": round(statistics.median(wall), 1),
                "rounds_cpu_us": [round(x, 1) for x in cpu],
                "rounds_wall_us": [round(x, 1) for x in wall],
                "quality": q[name],
            }
        mb = round(sum(map(len, datas)) / 1e6, 1)
        timings[f"{set_name} >= {min_side}"] = {"heading": heading, "images": len(datas), "mb": mb, "rows": rows}
    print("header reads and corner cases", flush=True)
    result = {
        "environment": environment(),
        "settings": {
            **{k: v for k, v in vars(args).items() if k not in ("out", "work")},
            "train_side": TRAIN_SIDE,
            "eval_side": EVAL_SIDE,
            "chunk": CHUNK,
        },
        "timings": timings,
        "headers": header_costs(sets, args.rounds),
        "corners": corners(),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "decoders.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    (out / "decoders.md").write_text(markdown(result), encoding="utf-8")
    print(f"wrote {out / 'decoders.md'} and {out / 'decoders.json'}")


if __name__ == "__main__":
    main()
