"""Records reference data for zest's image decoding and Qwen3-VL preprocessing tests.

Run from the repository root with the reference environment:
    /opt/refenv/bin/python tools/make_vision_refs.py

Writes tests/vision/data/:
  decode.json             per bundled image and per synthetic conversion case: size and two weighted checksums of
                          the RGB bytes (see checksum()) as torchvision.io.decode_image(mode=RGB) returns them (the path
                          transformers 5.17 takes for a path/URL/base64 image with the torchvision
                          backend), plus whether PIL's convert("RGB") agrees.
  conv_*.png/jpg/webp     small synthetic images covering gray, 1-bit, palette+tRNS, gray+alpha, RGBA,
                          16-bit, grayscale and CMYK JPEG, WebP.
  smart_resize.json       smart_resize(h, w, factor 32, min, max) from transformers on many sizes.
  resize_src.png, resize.json, resize_out.npy
                          a random 23x31 RGB image and torchvision's uint8 antialiased bicubic resize
                          of it to many sizes (outputs concatenated, HWC, int32).
  pp_<name>.npy, pp_<name>_grid.npy, preprocess.json
                          pixel_values [n, 1536] f32 and image_grid_thw [1, 3] i64 from transformers'
                          Qwen2VLImageProcessor with Qwen3-VL settings on bundled images.
"""

import json
import math
import os
import random
import struct
import sys
import zlib

import numpy as np
import torch
import torchvision
from PIL import Image
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms.v2 import functional as tvF

import transformers
from transformers.models.auto import image_processing_auto
from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor, smart_resize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "vision", "data")
IMAGES = os.path.join(ROOT, "assets", "images")


def checksum(arr: np.ndarray) -> list[int]:
    """Two position-weighted sums of the bytes (mod 2^64): any single changed byte changes both."""
    b = arr.astype(np.uint64).ravel()
    i = np.arange(b.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        s1 = np.sum(b * (i % np.uint64(65521) + np.uint64(1)), dtype=np.uint64)
        s2 = np.sum(b * b * (i % np.uint64(251) + np.uint64(1)), dtype=np.uint64)
    return [str(int(s1)), str(int(s2))]


def tv_rgb(path: str) -> np.ndarray:
    """HWC uint8 as transformers' load_image_as_tensor produces it (decode_image, mode=RGB)."""
    t = decode_image(path, mode=ImageReadMode.RGB)
    if t.dtype == torch.uint16:
        # 16-bit PNGs come back as uint16; zest keeps the high byte (PIL does the same for RGB;16).
        t = (t.to(torch.int32) >> 8).to(torch.uint8)
    return t.permute(1, 2, 0).contiguous().numpy()


def pil_rgb(path: str) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def write_png(path: str, width: int, height: int, bit_depth: int, color_type: int, rows: list[bytes]) -> None:
    """Minimal PNG writer (for 16-bit RGB, which PIL cannot write)."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + r for r in rows)
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, color_type, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def make_conversion_cases(rng: np.random.Generator) -> list[str]:
    w, h = 17, 13
    names = []

    def save(img: Image.Image, name: str, **kw) -> None:
        img.save(os.path.join(OUT, name), **kw)
        names.append(name)

    rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    gray = rng.integers(0, 256, (h, w), dtype=np.uint8)
    alpha = rng.integers(0, 256, (h, w), dtype=np.uint8)
    save(Image.fromarray(gray, "L"), "conv_gray8.png")
    save(Image.fromarray(gray > 127).convert("1"), "conv_gray1.png")
    save(Image.fromarray(np.dstack([rgb, alpha]), "RGBA"), "conv_rgba.png")
    save(Image.fromarray(np.dstack([gray, alpha]), "LA"), "conv_la.png")
    pal = Image.fromarray(rgb, "RGB").quantize(colors=16)
    save(pal, "conv_palette_trns.png", transparency=3)
    # 16-bit gray and RGB with values spanning the full range (high byte and low byte both random).
    g16 = rng.integers(0, 65536, (h, w), dtype=np.uint16)
    write_png(os.path.join(OUT, "conv_gray16.png"), w, h, 16, 0, [g16[y].astype(">u2").tobytes() for y in range(h)])
    names.append("conv_gray16.png")
    c16 = rng.integers(0, 65536, (h, w, 3), dtype=np.uint16)
    write_png(os.path.join(OUT, "conv_rgb16.png"), w, h, 16, 2, [c16[y].astype(">u2").tobytes() for y in range(h)])
    names.append("conv_rgb16.png")
    smooth = np.clip(np.add.outer(np.arange(h) * 9, np.arange(w) * 7), 0, 255).astype(np.uint8)
    save(Image.fromarray(smooth, "L"), "conv_gray.jpg", quality=90)
    cmyk = np.dstack([smooth, 255 - smooth, smooth // 2, np.full_like(smooth, 40)])
    save(Image.fromarray(cmyk, "CMYK"), "conv_cmyk.jpg", quality=90)
    save(Image.fromarray(rgb, "RGB"), "conv_rgb.webp", lossless=True)
    save(Image.fromarray(np.dstack([rgb, alpha]), "RGBA"), "conv_rgba.webp", lossless=True)
    return names


def decode_refs(conv_names: list[str]) -> dict:
    out = {"reference": f"torchvision {torchvision.__version__} decode_image(mode=RGB)", "images": {}}
    files = [os.path.join(IMAGES, n) for n in sorted(os.listdir(IMAGES))]
    files += [os.path.join(OUT, n) for n in conv_names]
    for path in files:
        tv = tv_rgb(path)
        pil = pil_rgb(path)
        key = os.path.relpath(path, ROOT)
        entry = {
            "width": int(tv.shape[1]),
            "height": int(tv.shape[0]),
            "checksum": checksum(tv),
            "pil_agrees": bool(pil.shape == tv.shape and np.array_equal(pil, tv)),
        }
        if tv.size <= 17 * 13 * 3:
            entry["rgb"] = tv.ravel().tolist()
        out["images"][key] = entry
        print(f"decode {key}: {entry['width']}x{entry['height']} pil_agrees={entry['pil_agrees']}")
    return out


def smart_resize_refs(rng: random.Random) -> dict:
    cases = []
    budgets = [(65536, 16777216), (56 * 56, 28 * 28 * 1280), (9216, 9216 * 4), (4096, 4096), (1, 10 ** 9)]
    sizes = [(1, 1), (16, 16), (32, 32), (48, 80), (80, 48), (224, 224), (768, 1024), (1080, 1920), (4000, 6000),
             (3024, 4032), (1, 200), (200, 1), (3, 599), (10000, 50), (2640, 1920), (510, 2293)]
    for _ in range(150):
        sizes.append((rng.randint(1, 8000), rng.randint(1, 8000)))
    for h, w in sizes:
        if max(h, w) / min(h, w) > 200:
            continue
        for mn, mx in budgets:
            rh, rw = smart_resize(h, w, factor=32, min_pixels=mn, max_pixels=mx)
            cases.append([h, w, mn, mx, rh, rw])
    return {"factor": 32, "cases": cases, "columns": ["h", "w", "min_pixels", "max_pixels", "out_h", "out_w"]}


def resize_refs(rng: np.random.Generator) -> dict:
    src = rng.integers(0, 256, (23, 31, 3), dtype=np.uint8)
    Image.fromarray(src, "RGB").save(os.path.join(OUT, "resize_src.png"))
    chw = torch.from_numpy(src).permute(2, 0, 1).contiguous()
    sizes = [(23, 31), (23, 16), (12, 31), (5, 7), (2, 3), (1, 4), (64, 96), (47, 13), (32, 32), (22, 30), (24, 32),
             (8, 61), (70, 9), (11, 15), (46, 62)]
    outs = []
    for h, w in sizes:
        r = tvF.resize(chw, [h, w], interpolation=tvF.InterpolationMode.BICUBIC, antialias=True)
        outs.append(r.permute(1, 2, 0).contiguous().numpy().astype(np.int32).ravel())
    np.save(os.path.join(OUT, "resize_out.npy"), np.concatenate(outs))
    # Output size 1x1 is left out: torch 2.15's AVX uint8 antialias kernel fails an internal assert on it.
    return {"sizes": sizes, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def preprocess_refs() -> dict:
    cls = image_processing_auto.IMAGE_PROCESSOR_MAPPING_NAMES.get("qwen3_vl")
    meta = {"transformers": transformers.__version__, "torch": torch.__version__,
            "torchvision": torchvision.__version__, "auto_image_processor_qwen3_vl": cls, "cases": []}
    crops = {}
    photo = Image.open(os.path.join(IMAGES, "photo_birds.jpg")).convert("RGB")
    crops["crop_up.png"] = photo.crop((700, 400, 740, 430))      # 40x30 -> upscaled by min_pixels
    crops["crop_mild.png"] = photo.crop((600, 300, 750, 410))    # 150x110 -> 160x96 (mild resize)
    for name, img in crops.items():
        img.save(os.path.join(OUT, name))
    cases = [
        ("doc", "assets/images/doc_qwen25_report_p1.jpg", 4096, 9216),
        ("chart", "assets/images/chart_bar_qwen3_downloads.png", 4096, 9216),
        ("photo", "assets/images/photo_birds.jpg", 4096, 9216),
        ("rgba_diagram", "assets/images/diagram_visionzip.png", 4096, 9216),
        ("tall_screenshot", "assets/images/screenshot_mobile_zh.jpg", 4096, 9216),
        ("crop_up", "tests/vision/data/crop_up.png", 9216, 16384),
        ("crop_mild", "tests/vision/data/crop_mild.png", 4096, 65536),
    ]
    for name, rel, mn, mx in cases:
        proc = Qwen2VLImageProcessor(patch_size=16, temporal_patch_size=2, merge_size=2,
                                     image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
                                     size={"shortest_edge": mn, "longest_edge": mx})
        out = proc(images=[os.path.join(ROOT, rel)], return_tensors="pt")
        pv = out["pixel_values"].numpy().astype(np.float32)
        grid = out["image_grid_thw"].numpy().astype(np.int64)
        np.save(os.path.join(OUT, f"pp_{name}.npy"), pv)
        np.save(os.path.join(OUT, f"pp_{name}_grid.npy"), grid)
        meta["cases"].append({"name": name, "path": rel, "min_pixels": mn, "max_pixels": mx,
                              "grid": grid[0].tolist(), "rows": int(pv.shape[0])})
        print(f"preprocess {name}: grid {grid[0].tolist()} pixel_values {tuple(pv.shape)}")
    return meta


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    torch.set_num_threads(1)
    np_rng = np.random.default_rng(20240611)
    conv = make_conversion_cases(np_rng)
    with open(os.path.join(OUT, "decode.json"), "w") as f:
        json.dump(decode_refs(conv), f, indent=1)
    with open(os.path.join(OUT, "smart_resize.json"), "w") as f:
        json.dump(smart_resize_refs(random.Random(7)), f)
    with open(os.path.join(OUT, "resize.json"), "w") as f:
        json.dump(resize_refs(np_rng), f)
    with open(os.path.join(OUT, "preprocess.json"), "w") as f:
        json.dump(preprocess_refs(), f, indent=1)
    total = sum(os.path.getsize(os.path.join(OUT, n)) for n in os.listdir(OUT))
    print(f"wrote {OUT} ({total / 1e6:.2f} MB)")
    if total > 3e6:
        sys.exit("reference data exceeds 3 MB")


if __name__ == "__main__":
    main()
