"""Procedural tasks for the demo model: seeded images with short, checkable answers.

Every sample is a function of (split seed, index) alone, so a training run can resume at any index
and the held-out split (another seed) never meets the training one. Image sides are multiples of 32
(one merged visual token per 32x32 pixels), so Qwen3-VL's smart_resize leaves them unchanged.

A sample is a dict: task, content (OpenAI-style parts: {"type": "text", "text"} or
{"type": "image", "index": i}), images (PIL RGB), answer (the one accepted string), and marks (per image,
the boxes of what was drawn: training's auxiliary targets).
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


# Text is set in character cells of 16 x 32 pixels on the patch grid: one glyph per patch column and
# one text line per row of merged visual tokens (32 pixels), so a merged token holds two characters of
# one line. Fonts differ in shape and size inside the cell (the size ranges keep the widest glyph
# within its cell). Everything drawn is recorded as a mark (centre x, centre y, kind, class) for the
# training-only auxiliary heads: kind "c" a character, kind "s" a shape.
CELL_W, LINE_H = 16, 32
FONT_SIZES = {"DejaVuSans.ttf": (13, 16), "DejaVuSerif.ttf": (13, 15), "DejaVuSansMono.ttf": (15, 22),
              "DejaVuSerif-Bold.ttf": (12, 13)}
CHARSET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.|"
CHAR_ID = {c: i + 1 for i, c in enumerate(CHARSET)}  # 0: no character
SHAPE_CLASSES = [f"{c} {s}" for c in COLORS for s in SHAPES]
SHAPE_ID = {m: i + 1 for i, m in enumerate(SHAPE_CLASSES)}  # 0: no shape
SHORT_WORDS = [w for w in WORDS if len(w) <= 6]
MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
LABEL_WORDS = ITEMS + MONTHS  # chart labels: at most six letters
# Word marks: every drawn word of this vocabulary marks the tokens it covers with its id, and a value
# drawn for a key (a price for its item, a bar's value for its label) marks its tokens with the key's
# id, so the tower learns to carry "which word is here" and "whose value is this" to the language model.
WORD_LIST = sorted(set(WORDS + ITEMS + MONTHS + ["TOTAL"]))
WORD_ID = {w: i + 1 for i, w in enumerate(WORD_LIST)}  # 0: none


def cell_font(rng: random.Random) -> ImageFont.FreeTypeFont:
    name = rng.choice(FONT_FILES)
    lo, hi = FONT_SIZES[name]
    return font(name, rng.randint(lo, hi))


def draw_cells(d: ImageDraw.ImageDraw, marks: list, x: int, y: int, s: str, f, fill, dy: int = 0,
               key: str | None = None) -> None:
    """Draws s with its i-th character centred in the cell at (x + 16 i, y), a 16 x 32 box; x and y are
    multiples of 16 and 32. dy shifts the glyphs vertically by a few pixels. key: the word this string
    is the value of (its tokens get the key's word mark)."""
    _, top, _, bottom = f.getbbox("Hgjy")
    gy = y + (LINE_H - (bottom - top)) // 2 - top + dy
    kid = WORD_ID.get(key, 0) if key else 0
    pos = 0
    for w in s.split(" "):
        wid = WORD_ID.get(w, 0)
        for i, ch in enumerate(w):
            x0 = x + CELL_W * (pos + i)
            l, _, r, _ = f.getbbox(ch)
            d.text((x0 + (CELL_W - (r - l)) / 2 - l, gy), ch, font=f, fill=fill)
            if ch in CHAR_ID:
                marks.append((x0 + CELL_W / 2, y + LINE_H / 2, "c", CHAR_ID[ch], wid, kid))
        pos += len(w) + 1


def reading_lines(rng: random.Random) -> tuple[str, list[str], dict]:
    """The lines of a document or sign (1-3 words and numbers each)."""
    layout = rng.choice(["document", "document", "sign"])
    n = rng.randint(2, 5) if layout == "document" else rng.randint(1, 3)
    return layout, [text_line(rng) for _ in range(n)], {}


def render_lines(rng: random.Random, layout: str, lines: list[str]) -> tuple[Image.Image, list]:
    f = cell_font(rng)
    n = len(lines)
    cols = max(len(s) for s in lines)
    mx = rng.randint(1, 2) * CELL_W
    pitch = LINE_H if layout == "document" or rng.random() < 0.5 else 2 * LINE_H
    my = rng.randint(0, 1) * LINE_H
    W = r32(cols * CELL_W + 2 * mx + rng.randint(0, 2) * 32)
    H = r32(n * pitch + 2 * my + rng.randint(0, 1) * 32)
    if layout == "sign":
        bg = rng.choice([(30, 90, 40), (20, 50, 140), (160, 30, 30), (240, 200, 40), (245, 245, 245)])
        ink = (255, 255, 255) if sum(bg) < 400 else (15, 15, 15)
    else:
        bg, ink = light_bg(rng), dark_ink(rng)
    im = Image.new("RGB", (W, H), bg)
    d = ImageDraw.Draw(im)
    marks: list = []
    y0 = ((H - n * pitch) // 2) // LINE_H * LINE_H
    dy = rng.randint(-2, 2)
    for i, s in enumerate(lines):
        x = mx if layout == "document" else ((W - len(s) * CELL_W) // 2) // CELL_W * CELL_W
        draw_cells(d, marks, x, y0 + i * pitch + (pitch - LINE_H) // 2 // LINE_H * LINE_H, s, f, ink, dy)
    if layout == "sign":
        d.rectangle([2, 2, W - 3, H - 3], outline=ink, width=2)
    return add_noise(im, rng, rng.randint(0, 20)), marks


# ---------------------------------------------------------------------------------------------------
# 1. reading: documents, receipts, signs


def reading(rng: random.Random, read_all: bool = False) -> dict:
    if rng.random() < 0.4:
        return _receipt(rng, read_all)
    layout, lines, _ = reading_lines(rng)
    im, marks = render_lines(rng, layout, lines)
    n = len(lines)
    k = rng.randrange(n)
    if read_all:
        q, a = rng.choice(["Read all the text in the image.", "Transcribe the image."]), "\n".join(lines)
    elif n == 1:
        q = rng.choice(["What is written on the sign?", "What does the sign say?", "What is written in the image?"])
        a = lines[0]
    else:
        q = rng.choice([f"What is written on line {k + 1}?", f"What does line {k + 1} say?", f"Read line {k + 1}."])
        a = lines[k]
    return {"task": "reading", "content": [img_part(0), txt(q)], "images": [im], "answer": a, "marks": [marks]}


def _receipt(rng: random.Random, read_all: bool) -> dict:
    f = cell_font(rng)
    n = rng.randint(2, 4)
    names = rng.sample(ITEMS, n)
    prices = [f"{rng.randint(1, 40)}.{rng.randint(0, 99):02d}" for _ in names]
    cents = sum(int(p.replace(".", "")) for p in prices)
    total = f"{cents // 100}.{cents % 100:02d}"
    rows = list(zip(names, prices)) + [("TOTAL", total)]
    shop = rng.choice(SHORT_WORDS).upper()
    width = max(len(a) for a, _ in rows) + 2 + max(len(b) for _, b in rows)
    width = max(width, len(shop))
    mx = CELL_W * rng.randint(1, 2)
    W = r32(width * CELL_W + 2 * mx)
    H = (len(rows) + 2 + rng.randint(0, 1)) * LINE_H
    bg, ink = light_bg(rng), dark_ink(rng)
    im = Image.new("RGB", (W, H), bg)
    d = ImageDraw.Draw(im)
    marks: list = []
    dy = rng.randint(-2, 2)
    draw_cells(d, marks, ((W - len(shop) * CELL_W) // 2) // CELL_W * CELL_W, 0, shop, f, ink, dy)
    right = (W - mx) // CELL_W * CELL_W
    lines = [shop]
    for i, (a, b) in enumerate(rows):
        y = (i + 1 + (a == "TOTAL")) * LINE_H
        if a == "TOTAL":
            d.line([mx, y - 2, W - mx, y - 2], fill=ink, width=1)
        draw_cells(d, marks, mx, y, a, f, ink, dy)
        draw_cells(d, marks, right - len(b) * CELL_W, y, b, f, ink, dy, key=a)
        lines.append(f"{a} {b}")
    im = add_noise(im, rng, rng.randint(0, 15))
    if read_all:
        q, a = rng.choice(["Read all the text in the image.", "Transcribe the image."]), "\n".join(lines)
    elif rng.random() < 0.5:
        q, a = rng.choice(["What is the total?", "What is the total on the receipt?"]), total
    else:
        j = rng.randrange(n)
        q, a = f"What is the price of {names[j]}?", prices[j]
    return {"task": "reading", "content": [img_part(0), txt(q)], "images": [im], "answer": a, "marks": [marks]}


# ---------------------------------------------------------------------------------------------------
# 2. tables


def tables(rng: random.Random, read_all: bool = False) -> dict:
    R, C = rng.randint(2, 4), rng.randint(2, 4)
    f = cell_font(rng)
    cells = [[(rng.choice(SHORT_WORDS) if rng.random() < 0.6 else str(rng.randint(1, 999))) for _ in range(C)]
             for _ in range(R)]
    cw = [(max(len(cells[r][c]) for r in range(R)) + 2) * CELL_W for c in range(C)]
    x0, y0 = rng.randint(0, 1) * 32, rng.randint(0, 1) * 32
    W = r32(x0 + sum(cw) + rng.randint(0, 1) * 32)
    H = y0 + R * LINE_H + rng.randint(0, 1) * 32
    H = r32(max(H, y0 + R * LINE_H + 1))
    bg, ink = light_bg(rng), dark_ink(rng)
    im = Image.new("RGB", (W, H), bg)
    d = ImageDraw.Draw(im)
    marks: list = []
    shade = rng.random() < 0.5
    dy = rng.randint(-2, 2)
    xs = [x0 + sum(cw[:c]) for c in range(C + 1)]
    for r in range(R):
        if shade and r % 2 == 1:
            d.rectangle([x0, y0 + r * LINE_H, xs[-1], y0 + (r + 1) * LINE_H], fill=tuple(max(0, v - 25) for v in bg))
        for c in range(C):
            draw_cells(d, marks, xs[c] + CELL_W, y0 + r * LINE_H, cells[r][c], f, ink, dy)
    for r in range(R + 1):
        d.line([x0, min(H - 1, y0 + r * LINE_H), xs[-1], min(H - 1, y0 + r * LINE_H)], fill=ink, width=1)
    for c in range(C + 1):
        d.line([min(W - 1, xs[c]), y0, min(W - 1, xs[c]), y0 + R * LINE_H], fill=ink, width=1)
    im = add_noise(im, rng, rng.randint(0, 12))
    r, c = rng.randrange(R), rng.randrange(C)
    if read_all:
        q, a = "Read the table.", "\n".join(" | ".join(row) for row in cells)
    else:
        q = rng.choice([f"What is in row {r + 1}, column {c + 1}?",
                        f"What is the entry in row {r + 1}, column {c + 1}?"])
        a = cells[r][c]
    return {"task": "tables", "content": [img_part(0), txt(q)], "images": [im], "answer": a, "marks": [marks]}


# ---------------------------------------------------------------------------------------------------
# 3. charts


def charts(rng: random.Random, read_all: bool = False) -> dict:
    n = rng.randint(3, 5)
    labels = rng.sample(LABEL_WORDS, n)
    values = rng.sample(range(10, 100), n)
    f = cell_font(rng)
    ink = dark_ink(rng)
    color = rng.choice(list(COLORS.values()))
    marks: list = []
    dy = rng.randint(-2, 2)
    kind = rng.choices(["hbar", "bar", "line"], [0.5, 0.35, 0.15])[0]
    if kind == "hbar":  # one row a label: label, bar, value at the bar's end
        span = rng.choice([192, 256])  # the bar length of a value of 100
        W = r32(7 * CELL_W + span + 4 + 3 * CELL_W) + rng.randint(0, 1) * 32
        H = (n + rng.randint(0, 2)) * LINE_H
        im = Image.new("RGB", (W, H), light_bg(rng))
        d = ImageDraw.Draw(im)
        y0 = (H - n * LINE_H) // 2 // LINE_H * LINE_H
        x0 = 7 * CELL_W
        d.line([x0 - 2, y0, x0 - 2, y0 + n * LINE_H], fill=ink, width=1)
        bh = rng.choice([12, 16, 20])
        for i, (lab, v) in enumerate(zip(labels, values)):
            y = y0 + i * LINE_H
            draw_cells(d, marks, x0 - (len(lab) + 1) * CELL_W, y, lab, f, ink, dy)
            end = x0 + int(span * v / 100.0)
            d.rectangle([x0, y + (LINE_H - bh) // 2, end, y + (LINE_H + bh) // 2], fill=color)
            draw_cells(d, marks, (end + 4 + CELL_W - 1) // CELL_W * CELL_W, y, str(v), f, ink, dy, key=lab)
    else:
        slot = 112  # seven cells: a label of up to six letters, centred
        W = r32(n * slot + 32)
        H = rng.randint(6, 8) * LINE_H
        im = Image.new("RGB", (W, H), light_bg(rng))
        d = ImageDraw.Draw(im)
        bottom = H - LINE_H  # the labels' row
        top = 2 * LINE_H  # a value of 100 reaches here; its label sits in the row above
        x0 = 16
        d.line([x0, bottom, x0 + n * slot, bottom], fill=ink, width=1)
        pts = []
        for i, (lab, v) in enumerate(zip(labels, values)):
            sx = x0 + i * slot
            cx = sx + slot // 2
            y = bottom - int((bottom - top) * v / 100.0)
            if kind == "line":
                pts.append((cx, y))
            else:
                bw = rng.choice([32, 48, 64])
                d.rectangle([cx - bw // 2, y, cx + bw // 2, bottom - 1], fill=color)
            vs = str(v)
            vrow = (y - 4) // LINE_H - 1  # the token row above the one holding the bar's top
            draw_cells(d, marks, cx - len(vs) * CELL_W // 2, vrow * LINE_H, vs, f, ink, dy, key=lab)
            draw_cells(d, marks, sx + (slot // CELL_W - len(lab)) // 2 * CELL_W, bottom, lab, f, ink, dy)
        if kind == "line":
            d.line(pts, fill=color, width=2)
            for p in pts:
                d.ellipse([p[0] - 3, p[1] - 3, p[0] + 3, p[1] + 3], fill=color)
    im = add_noise(im, rng, rng.randint(0, 10))
    roll = rng.random()
    if read_all:
        q, a = "List the values.", "\n".join(f"{lab} {v}" for lab, v in zip(labels, values))
    elif roll < 0.6:
        j = rng.randrange(n)
        q, a = f"What is the value for {labels[j]}?", str(values[j])
    elif roll < 0.8:
        q, a = "Which label has the highest value?", labels[values.index(max(values))]
    else:
        q, a = "Which label has the lowest value?", labels[values.index(min(values))]
    return {"task": "charts", "content": [img_part(0), txt(q)], "images": [im], "answer": a, "marks": [marks]}


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
    """Draws a filled circle, square or triangle of half-size r centred at (cx, cy)."""
    if shape == "circle":
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=color, outline=outline)
    elif shape == "square":
        d.rectangle([cx - r, cy - r, cx + r, cy + r], fill=color, outline=outline)
    else:
        d.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=color, outline=outline)


def grid_places(rng: random.Random, W: int, H: int, n: int) -> list[tuple[int, int]]:
    """n distinct merged-token cells of a W x H image, as jittered cell centres (one object a token)."""
    cells = rng.sample(range((W // 32) * (H // 32)), n)
    return [((c % (W // 32)) * 32 + 16 + rng.randint(-3, 3), (c // (W // 32)) * 32 + 16 + rng.randint(-3, 3))
            for c in cells]


def scene(rng: random.Random, W: int, H: int, objects: list[tuple[str, str]], pts: list[tuple[int, int]],
          rmin: int, rmax: int, marks: list) -> Image.Image:
    im = scene_background(rng, W, H)
    d = ImageDraw.Draw(im)
    outline = (20, 20, 20) if rng.random() < 0.5 else None
    for (color, shape), (x, y) in zip(objects, pts):
        draw_shape(d, shape, x, y, rng.randint(rmin, rmax), COLORS[color], outline)
        marks.append((x, y, "s", SHAPE_ID[f"{color} {shape}"], 0, 0))
    return im


def scenes(rng: random.Random) -> dict:
    W, H = r32(rng.randint(128, 320)), r32(rng.randint(128, 288))
    color, shape = rng.choice(list(COLORS)), rng.choice(SHAPES)
    k = rng.randint(0, 6)
    others = [(c, s) for c in COLORS for s in SHAPES if (c, s) != (color, shape)]
    n_other = rng.randint(0, max(0, min(8, (W * H) // 3500) - k))
    objs = [(color, shape)] * k + [rng.choice(others) for _ in range(n_other)]
    rng.shuffle(objs)
    marks: list = []
    im = scene(rng, W, H, objs, grid_places(rng, W, H, len(objs)), 9, 13, marks)
    q = f"How many {color} {shape}s are there?" if rng.random() < 0.5 else f"How many {color} {shape}s are in the image?"
    return {"task": "scenes", "content": [img_part(0), txt(q)], "images": [im], "answer": str(k), "marks": [marks]}


# ---------------------------------------------------------------------------------------------------
# 5. several images in one request


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def one_shape(rng: random.Random, side: int, obj: tuple[str, str], marks: list) -> Image.Image:
    c = side // 2 + rng.randint(-side // 8, side // 8)
    return scene(rng, side, side, [obj], [(c, side // 2 + rng.randint(-side // 8, side // 8))], side // 5,
                 side // 3, marks)


def multi(rng: random.Random) -> dict:
    n = rng.randint(2, 8)
    side = rng.choice([64, 96, 96, 128])
    combos = [(c, s) for c in COLORS for s in SHAPES]
    content, images, marks = [], [], []
    roll = rng.random()
    if roll < 0.25:  # a document among photos: what VisionZip's request-global budget is for
        n = rng.randint(2, 4)
        d = rng.randrange(n)
        lines = [text_line(rng) for _ in range(rng.randint(1, 3))]
        for i in range(n):
            marks.append([])
            if i == d:
                im, marks[-1] = render_lines(rng, "document", lines)
            else:
                W, H = r32(rng.randint(96, 224)), r32(rng.randint(96, 224))
                objs = [rng.choice(combos) for _ in range(rng.randint(1, 4))]
                im = scene(rng, W, H, objs, grid_places(rng, W, H, len(objs)), 9, 13, marks[-1])
            images.append(im)
        k = rng.randrange(len(lines))
        q = (f"What is written on line {k + 1} of the document?" if len(lines) > 1
             else "What is written in the document?")
        a = lines[k]
    elif roll < 0.6:  # which image shows X: exactly one image has it
        target = rng.choice(combos)
        j = rng.randrange(n)
        for i in range(n):
            obj = target if i == j else rng.choice([c for c in combos if c != target])
            marks.append([])
            images.append(one_shape(rng, side, obj, marks[-1]))
        q = f"Which image shows {article(target[0])} {target[0]} {target[1]}? Answer with its number."
        a = str(j + 1)
    else:  # how many images have X
        target = rng.choice(combos)
        k = rng.randint(0, n)
        has = set(rng.sample(range(n), k))
        for i in range(n):
            obj = target if i in has else rng.choice([c for c in combos if c != target])
            marks.append([])
            images.append(one_shape(rng, side, obj, marks[-1]))
        q, a = f"How many images show {article(target[0])} {target[0]} {target[1]}?", str(k)
    for i in range(n):
        content += [txt(f"Image {i + 1}:"), img_part(i)]
    content.append(txt(q))
    return {"task": "multi", "content": content, "images": images, "answer": a, "marks": marks}


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
    return {"task": "text", "content": [txt(q)], "images": [], "answer": ans, "marks": []}


GENERATORS = {"reading": reading, "tables": tables, "charts": charts, "scenes": scenes, "multi": multi,
              "text": text_only,
              # training only: read out everything (dense, ordered targets for the reading skills)
              "reading_all": lambda rng: reading(rng, True), "tables_all": lambda rng: tables(rng, True),
              "charts_all": lambda rng: charts(rng, True)}
# Training mix (reading and tables are learnt first; charts, scenes and several images take longer).
TRAIN_WEIGHTS = {"reading": 0.14, "tables": 0.08, "charts": 0.16, "scenes": 0.16, "multi": 0.18, "text": 0.1,
                 "reading_all": 0.08, "tables_all": 0.04, "charts_all": 0.06}


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
    s = GENERATORS[task](rng)
    s["task"] = task  # the training-only read-everything variants keep their own name in the logs
    return s


def all_text() -> list[str]:
    """Text the tokenizer is trained on: the questions, answers and vocabularies of every task."""
    out = [" ".join(WORDS), " ".join(ITEMS), " ".join(MONTHS), " ".join(COLORS), " ".join(SHAPES), " ".join(DAYS),
           " ".join(w.upper() for w in WORDS), "system user assistant", "You are a helpful assistant."]
    for i in range(3000):
        s = sample(7, i)
        out.append(" ".join(p["text"] for p in s["content"] if p["type"] == "text"))
        out.append(s["answer"])
    return out
