"""Procedural tasks for the demo model: seeded images with short, checkable answers.

Every sample is a function of (split seed, index) alone, so a training run can resume at any index
and the held-out split (another seed) never meets the training one. Image sides are multiples of 32
(one merged visual token per 32x32 pixels), so Qwen3-VL's smart_resize leaves them unchanged.

A sample is a dict: task, content (OpenAI-style parts: {"type": "text", "text"} or
{"type": "image", "index": i}), images (PIL RGB), answer (the one accepted string).
"""
from __future__ import annotations

import math
import os
import random

from PIL import Image, ImageDraw, ImageFilter, ImageFont

FONT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fonts")
FONT_FILES = ["DejaVuSans.ttf", "DejaVuSerif.ttf", "DejaVuSansMono.ttf", "DejaVuSerif-Bold.ttf"]

TASKS = ["reading", "tables", "charts", "scenes", "multi", "text"]

WORDS = """apple river stone cloud green house paper light north south table chair water bread
horse music plant sugar lemon tiger ocean silver garden window forest bridge candle mirror
rabbit pepper orange violet summer winter spring autumn market street castle island planet
rocket pencil basket button carpet doctor engine finger flower guitar hammer jacket kettle
ladder magnet needle pillow rubber saddle tunnel velvet wallet yellow zebra anchor barrel
cactus dragon falcon ginger harbor iron jungle kitten lizard meadow nickel olive parrot quartz
salmon thunder copper desert ember feather glacier honey igloo jasmine koala lantern maple
nectar oyster pebble quill raven shadow tulip umbrella valley walnut yarn blue red gold black
white pink brown gray sun moon star tree lake road city farm door book ship coin bell drum
fish bird frog bear wolf lion goat duck cake milk rice salt corn bean leaf seed rain snow wind
fire sand rock hill cave wave king queen baker miller tailor farmer""".split()

ITEMS = """coffee tea bread milk eggs rice soap juice apples pasta cheese butter honey beans
salt sugar flour soup tuna jam""".split()

COLORS = {"red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (240, 210, 30),
          "purple": (150, 60, 190), "orange": (245, 140, 20)}
SHAPES = ["circle", "square", "triangle"]
ORDINAL = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth"]

_font_cache: dict[tuple[str, int], ImageFont.FreeTypeFont] = {}


def font(name: str, size: int) -> ImageFont.FreeTypeFont:
    key = (name, size)
    if key not in _font_cache:
        _font_cache[key] = ImageFont.truetype(os.path.join(FONT_DIR, name), size)
    return _font_cache[key]


def r32(x: float) -> int:
    """Rounds a side up to a multiple of 32 (one merged visual token)."""
    return max(32, int(math.ceil(x / 32.0)) * 32)


def light_bg(rng: random.Random) -> tuple[int, int, int]:
    base = rng.randint(225, 255)
    return (base - rng.randint(0, 15), base - rng.randint(0, 15), base - rng.randint(0, 20))


def dark_ink(rng: random.Random) -> tuple[int, int, int]:
    v = rng.randint(0, 60)
    return (v + rng.randint(0, 30), v + rng.randint(0, 20), v + rng.randint(0, 40))


def add_noise(img: Image.Image, rng: random.Random, amount: int) -> Image.Image:
    """Adds mild pixel noise (seeded) so backgrounds are not flat."""
    if amount <= 0:
        return img
    # A seeded crop of a fixed noise tile (Image.effect_noise is not seeded).
    w, h = img.size
    tile = _noise_tile(rng.randint(0, 7))
    x, y = rng.randint(0, tile.size[0] - w), rng.randint(0, tile.size[1] - h)
    return Image.blend(img, tile.crop((x, y, x + w, y + h)), 0.06 + amount / 400.0)


_noise_tiles: dict[int, Image.Image] = {}


def _noise_tile(k: int) -> Image.Image:
    if k not in _noise_tiles:
        r = random.Random(1000 + k)
        side = 640
        data = bytes(r.getrandbits(8) for _ in range(side * side))
        g = Image.frombytes("L", (side, side), data).filter(ImageFilter.GaussianBlur(0.6 + 0.3 * (k % 3)))
        _noise_tiles[k] = Image.merge("RGB", (g, g, g))
    return _noise_tiles[k]


def number(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.5:
        return str(rng.randint(10, 999))
    if kind < 0.8:
        return str(rng.randint(1000, 9999))
    return f"{rng.randint(1, 99)}.{rng.randint(0, 99):02d}"


def text_line(rng: random.Random) -> str:
    n = rng.choice([1, 2, 2, 3])
    toks = []
    for _ in range(n):
        toks.append(number(rng) if rng.random() < 0.25 else rng.choice(WORDS))
    return " ".join(toks)


def txt(s: str) -> dict:
    return {"type": "text", "text": s}


def img_part(i: int) -> dict:
    return {"type": "image", "index": i}


# ---------------------------------------------------------------------------------------------------
# 1. reading: documents, receipts, signs


def reading(rng: random.Random) -> dict:
    layout = rng.choice(["document", "document", "receipt", "sign"])
    fname = rng.choice(FONT_FILES)
    if layout == "receipt":
        return _receipt(rng, fname)
    size = rng.randint(18, 26) if layout == "document" else rng.randint(24, 36)
    f = font(fname, size)
    nlines = rng.randint(2, 6) if layout == "document" else rng.randint(1, 3)
    lines = [text_line(rng) for _ in range(nlines)]
    widths = [f.getbbox(s)[2] for s in lines]
    pad = rng.randint(8, 24)
    gap = int(size * rng.uniform(1.3, 1.8))
    W = r32(max(widths) + 2 * pad + rng.randint(0, 64))
    H = r32(nlines * gap + 2 * pad + rng.randint(0, 48))
    if layout == "sign":
        bg = rng.choice([(30, 90, 40), (20, 50, 140), (160, 30, 30), (240, 200, 40), (245, 245, 245)])
        ink = (255, 255, 255) if sum(bg) < 400 else (15, 15, 15)
    else:
        bg, ink = light_bg(rng), dark_ink(rng)
    im = Image.new("RGB", (W, H), bg)
    d = ImageDraw.Draw(im)
    y0 = (H - nlines * gap) // 2
    for i, s in enumerate(lines):
        x = pad if layout == "document" else (W - widths[i]) // 2
        d.text((x, y0 + i * gap), s, font=f, fill=ink)
    if layout == "sign":
        d.rectangle([3, 3, W - 4, H - 4], outline=ink, width=2)
    im = add_noise(im, rng, rng.randint(0, 20))
    k = rng.randrange(nlines)
    if nlines == 1:
        q = rng.choice(["What is written on the sign?", "What does the sign say?", "What is written in the image?"])
    else:
        q = rng.choice([f"What is written on line {k + 1}?", f"What does line {k + 1} say?",
                        f"Read line {k + 1}."])
    return {"task": "reading", "content": [img_part(0), txt(q)], "images": [im], "answer": lines[k]}


def _receipt(rng: random.Random, fname: str) -> dict:
    size = rng.randint(16, 22)
    f = font(fname, size)
    n = rng.randint(2, 5)
    names = rng.sample(ITEMS, n)
    prices = [f"{rng.randint(1, 40)}.{rng.randint(0, 99):02d}" for _ in names]
    cents = sum(int(p.replace(".", "")) for p in prices)
    total = f"{cents // 100}.{cents % 100:02d}"
    rows = list(zip(names, prices)) + [("TOTAL", total)]
    pad = rng.randint(8, 16)
    gap = int(size * 1.5)
    colw = max(f.getbbox(a)[2] for a, _ in rows) + 24 + max(f.getbbox(b)[2] for _, b in rows)
    W = r32(colw + 2 * pad + rng.randint(0, 32))
    H = r32((len(rows) + 2) * gap + 2 * pad)
    bg, ink = light_bg(rng), dark_ink(rng)
    im = Image.new("RGB", (W, H), bg)
    d = ImageDraw.Draw(im)
    shop = rng.choice(WORDS).upper()
    d.text(((W - f.getbbox(shop)[2]) // 2, pad), shop, font=f, fill=ink)
    for i, (a, b) in enumerate(rows):
        y = pad + (i + 1) * gap + (gap // 2 if a == "TOTAL" else 0)
        if a == "TOTAL":
            d.line([pad, y - 4, W - pad, y - 4], fill=ink, width=1)
        d.text((pad, y), a, font=f, fill=ink)
        d.text((W - pad - f.getbbox(b)[2], y), b, font=f, fill=ink)
    im = add_noise(im, rng, rng.randint(0, 15))
    if rng.random() < 0.5:
        q, a = rng.choice(["What is the total?", "What is the total on the receipt?"]), total
    else:
        j = rng.randrange(n)
        q, a = f"What is the price of {names[j]}?", prices[j]
    return {"task": "reading", "content": [img_part(0), txt(q)], "images": [im], "answer": a}


# ---------------------------------------------------------------------------------------------------
# 2. tables


def tables(rng: random.Random) -> dict:
    R, C = rng.randint(2, 4), rng.randint(2, 4)
    size = rng.randint(15, 20)
    f = font(rng.choice(FONT_FILES), size)
    cells = [[(rng.choice(WORDS) if rng.random() < 0.6 else str(rng.randint(1, 999))) for _ in range(C)]
             for _ in range(R)]
    cw = max(f.getbbox(c)[2] for row in cells for c in row) + rng.randint(12, 24)
    ch = int(size * rng.uniform(1.7, 2.2))
    pad = rng.randint(6, 16)
    W, H = r32(C * cw + 2 * pad), r32(R * ch + 2 * pad)
    bg, ink = light_bg(rng), dark_ink(rng)
    im = Image.new("RGB", (W, H), bg)
    d = ImageDraw.Draw(im)
    x0, y0 = (W - C * cw) // 2, (H - R * ch) // 2
    shade = rng.random() < 0.5
    for r in range(R):
        if shade and r % 2 == 1:
            d.rectangle([x0, y0 + r * ch, x0 + C * cw, y0 + (r + 1) * ch], fill=tuple(max(0, v - 25) for v in bg))
        for c in range(C):
            d.text((x0 + c * cw + 8, y0 + r * ch + (ch - size) // 2 - 1), cells[r][c], font=f, fill=ink)
    for r in range(R + 1):
        d.line([x0, y0 + r * ch, x0 + C * cw, y0 + r * ch], fill=ink, width=1)
    for c in range(C + 1):
        d.line([x0 + c * cw, y0, x0 + c * cw, y0 + R * ch], fill=ink, width=1)
    im = add_noise(im, rng, rng.randint(0, 12))
    r, c = rng.randrange(R), rng.randrange(C)
    q = rng.choice([f"What is in row {r + 1}, column {c + 1}?", f"What is the entry in row {r + 1}, column {c + 1}?"])
    return {"task": "tables", "content": [img_part(0), txt(q)], "images": [im], "answer": cells[r][c]}


# ---------------------------------------------------------------------------------------------------
# 3. charts


def charts(rng: random.Random) -> dict:
    n = rng.randint(3, 6)
    labels = rng.sample(WORDS, n)
    values = rng.sample(range(5, 100), n)
    size = rng.randint(12, 16)
    f = font(rng.choice(FONT_FILES), size)
    slot = max(max(f.getbbox(s)[2] for s in labels) + 10, 44)
    W = r32(n * slot + 40)
    H = r32(rng.randint(180, 260))
    im = Image.new("RGB", (W, H), light_bg(rng))
    d = ImageDraw.Draw(im)
    ink = dark_ink(rng)
    top, bottom = 12 + size + 6, H - (size + 14)
    x0 = (W - n * slot) // 2
    d.line([x0 - 4, bottom, x0 + n * slot, bottom], fill=ink, width=1)
    line = rng.random() < 0.3
    color = rng.choice(list(COLORS.values()))
    pts = []
    for i, (lab, v) in enumerate(zip(labels, values)):
        cx = x0 + i * slot + slot // 2
        y = bottom - int((bottom - top) * v / 100.0)
        if line:
            pts.append((cx, y))
        else:
            bw = rng.randint(slot // 3, slot - 12)
            d.rectangle([cx - bw // 2, y, cx + bw // 2, bottom - 1], fill=color)
        vs = str(v)
        d.text((cx - f.getbbox(vs)[2] // 2, y - size - 4), vs, font=f, fill=ink)
        d.text((cx - f.getbbox(lab)[2] // 2, bottom + 4), lab, font=f, fill=ink)
    if line:
        d.line(pts, fill=color, width=2)
        for p in pts:
            d.ellipse([p[0] - 3, p[1] - 3, p[0] + 3, p[1] + 3], fill=color)
    im = add_noise(im, rng, rng.randint(0, 10))
    roll = rng.random()
    if roll < 0.6:
        j = rng.randrange(n)
        q, a = f"What is the value for {labels[j]}?", str(values[j])
    elif roll < 0.8:
        q, a = "Which label has the highest value?", labels[values.index(max(values))]
    else:
        q, a = "Which label has the lowest value?", labels[values.index(min(values))]
    return {"task": "charts", "content": [img_part(0), txt(q)], "images": [im], "answer": a}


# ---------------------------------------------------------------------------------------------------
# 4. scenes: textured, photo-like backgrounds with shapes


def scene_background(rng: random.Random, W: int, H: int) -> Image.Image:
    g = rng.randint(70, 200)  # muted: the targets' saturated colours stay distinct from it
    a = [min(255, max(0, g + rng.randint(-35, 35))) for _ in range(3)]
    b = [min(255, max(0, v + rng.randint(-70, 70))) for v in a]
    grad = Image.linear_gradient("L").resize((W, H))
    if rng.random() < 0.5:
        grad = grad.rotate(90, expand=False).resize((W, H))
    im = Image.composite(Image.new("RGB", (W, H), tuple(a)), Image.new("RGB", (W, H), tuple(b)), grad)
    d = ImageDraw.Draw(im)
    for _ in range(rng.randint(0, 6)):  # soft blobs and stripes, never saturated like the targets
        c = tuple(min(255, max(0, v + rng.randint(-40, 40))) for v in a)
        x, y = rng.randint(0, W), rng.randint(0, H)
        r = rng.randint(10, 60)
        if rng.random() < 0.5:
            d.ellipse([x - r, y - r // 2, x + r, y + r // 2], fill=c)
        else:
            d.line([x, y, x + rng.randint(-80, 80), y + rng.randint(-80, 80)], fill=c, width=rng.randint(2, 8))
    im = im.filter(ImageFilter.GaussianBlur(rng.uniform(0.5, 2.5)))
    return add_noise(im, rng, rng.randint(5, 30))


def draw_shape(d: ImageDraw.ImageDraw, shape: str, cx: int, cy: int, r: int, color, outline) -> None:
    if shape == "circle":
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=color, outline=outline)
    elif shape == "square":
        d.rectangle([cx - r, cy - r, cx + r, cy + r], fill=color, outline=outline)
    else:
        d.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=color, outline=outline)


def place(rng: random.Random, W: int, H: int, radii: list[int]) -> list[tuple[int, int]] | None:
    pts: list[tuple[int, int, int]] = []
    for r in radii:
        for _ in range(60):
            x, y = rng.randint(r + 2, W - r - 3), rng.randint(r + 2, H - r - 3)
            if all((x - px) ** 2 + (y - py) ** 2 > (r + pr + 4) ** 2 for px, py, pr in pts):
                pts.append((x, y, r))
                break
        else:
            return None
    return [(x, y) for x, y, _ in pts]


def scene(rng: random.Random, W: int, H: int, objects: list[tuple[str, str]], rmin: int, rmax: int) -> Image.Image:
    while True:
        radii = [rng.randint(rmin, rmax) for _ in objects]
        pts = place(rng, W, H, radii)
        if pts is not None:
            break
    im = scene_background(rng, W, H)
    d = ImageDraw.Draw(im)
    outline = (20, 20, 20) if rng.random() < 0.5 else None
    for (color, shape), (x, y), r in zip(objects, pts, radii):
        draw_shape(d, shape, x, y, r, COLORS[color], outline)
    return im


def scenes(rng: random.Random) -> dict:
    W, H = r32(rng.randint(128, 320)), r32(rng.randint(128, 288))
    color, shape = rng.choice(list(COLORS)), rng.choice(SHAPES)
    k = rng.randint(0, 6)
    others = [(c, s) for c in COLORS for s in SHAPES if (c, s) != (color, shape)]
    n_other = rng.randint(0, max(0, min(8, (W * H) // 3500) - k))
    objs = [(color, shape)] * k + [rng.choice(others) for _ in range(n_other)]
    rng.shuffle(objs)
    im = scene(rng, W, H, objs, 9, 16)
    q = f"How many {color} {shape}s are there?" if rng.random() < 0.5 else f"How many {color} {shape}s are in the image?"
    return {"task": "scenes", "content": [img_part(0), txt(q)], "images": [im], "answer": str(k)}


# ---------------------------------------------------------------------------------------------------
# 5. several images in one request


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def multi(rng: random.Random) -> dict:
    n = rng.randint(2, 8)
    side = rng.choice([64, 96, 96, 128])
    combos = [(c, s) for c in COLORS for s in SHAPES]
    content, images = [], []
    if rng.random() < 0.5:  # which image shows X: exactly one image has it
        target = rng.choice(combos)
        j = rng.randrange(n)
        for i in range(n):
            obj = target if i == j else rng.choice([c for c in combos if c != target])
            images.append(scene(rng, side, side, [obj], side // 5, side // 3))
        q = f"Which image shows {article(target[0])} {target[0]} {target[1]}? Answer with its number."
        a = str(j + 1)
    else:  # how many images have X
        target = rng.choice(combos)
        k = rng.randint(0, n)
        has = set(rng.sample(range(n), k))
        for i in range(n):
            obj = target if i in has else rng.choice([c for c in combos if c != target])
            images.append(scene(rng, side, side, [obj], side // 5, side // 3))
        q, a = f"How many images show {article(target[0])} {target[0]} {target[1]}?", str(k)
    for i in range(n):
        content += [txt(f"Image {i + 1}:"), img_part(i)]
    content.append(txt(q))
    return {"task": "multi", "content": content, "images": images, "answer": a}


# ---------------------------------------------------------------------------------------------------
# 6. short text-only instructions

DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]


def text_only(rng: random.Random) -> dict:
    kind = rng.randrange(7)
    if kind == 0:
        a, b = rng.randint(0, 50), rng.randint(0, 49)
        q, ans = f"What is {a} plus {b}?", str(a + b)
    elif kind == 1:
        ws = rng.sample(WORDS, rng.randint(2, 4))
        q, ans = f"Repeat after me: {' '.join(ws)}", " ".join(ws)
    elif kind == 2:
        ws = rng.sample(WORDS, rng.randint(2, 4))
        q, ans = f"Reverse the words: {' '.join(ws)}", " ".join(reversed(ws))
    elif kind == 3:
        i = rng.randrange(7)
        q, ans = f"What day comes after {DAYS[i]}?", DAYS[(i + 1) % 7]
    elif kind == 4:
        a = rng.randint(1, 15)
        b = a + rng.randint(2, 5)
        q, ans = f"Count from {a} to {b}.", " ".join(str(x) for x in range(a, b + 1))
    elif kind == 5:
        q, ans = rng.choice([("Hello!", "Hello! How can I help you?"), ("Hi", "Hello! How can I help you?"),
                             ("Who are you?", "I am a small demo model for zest."),
                             ("What can you do?", "I can read text, tables and charts, and count shapes in images.")])
    else:
        w = rng.choice(WORDS)
        q, ans = f"How many letters are in the word {w}?", str(len(w))
    return {"task": "text", "content": [txt(q)], "images": [], "answer": ans}


GENERATORS = {"reading": reading, "tables": tables, "charts": charts, "scenes": scenes, "multi": multi,
              "text": text_only}
# Training mix: reading and tables need the most practice.
TRAIN_WEIGHTS = {"reading": 0.27, "tables": 0.2, "charts": 0.18, "scenes": 0.14, "multi": 0.15, "text": 0.06}


def sample(seed: int, index: int, task: str | None = None) -> dict:
    """The index-th sample of the stream with this seed (task drawn from the mix unless given)."""
    rng = random.Random(seed * 1_000_003 + index)
    if task is None:
        x, acc = rng.random(), 0.0
        for t, w in TRAIN_WEIGHTS.items():
            acc += w
            if x < acc:
                task = t
                break
        else:
            task = "text"
    return GENERATORS[task](rng)


def all_text() -> list[str]:
    """Text the tokenizer is trained on: the questions, answers and vocabularies of every task."""
    out = [" ".join(WORDS), " ".join(ITEMS), " ".join(COLORS), " ".join(SHAPES), " ".join(DAYS),
           " ".join(w.upper() for w in WORDS), "system user assistant", "You are a helpful assistant."]
    for i in range(3000):
        s = sample(7, i)
        out.append(" ".join(p["text"] for p in s["content"] if p["type"] == "text"))
        out.append(s["answer"])
    return out
