#!/usr/bin/env python3
"""Offline analysis of one replayed decode step's per-CTA records (bench_decode_timeline --timeline B with
ZEST_TIMELINE_RAW=PATH; bench/gpu/timeline_raw.sh writes $OUT/tl-b<B>.txt).

For every small-M GEMM launch (rows_pre) it reports, over the layers, when its CTAs became resident (phase 0) and
when their weight tile landed (phase 1), relative to the launch's release (its first CTA past the PDL wait), split by
how many CTAs of the previous launch shared the CTA's SM: a CTA that cannot fit beside them becomes resident only as
they leave, and its tile streams late.

usage: bench/timeline_raw.py tl-b1.txt [label-prefix (default rows_pre)]
"""
import collections
import statistics
import sys


def load(path):
    labels, order, recs = {}, [], collections.defaultdict(list)
    with open(path) as f:
        for line in f:
            p = line.split()
            if p[0] == "L":
                labels[int(p[2])] = " ".join(p[3:])
                order.append(int(p[2]))
            elif p[0] == "R":
                sm, grid, tag, cta, t0, t1 = map(int, p[1:])
                recs[grid].append((sm, tag, cta, t0, t1))
    return labels, order, recs


def per_cta(recs, grid):
    """CTA -> {sm, release, p0.. (us after the launch's release)}."""
    rel = min(r[4] for r in recs[grid] if r[1] == 0)
    out = collections.defaultdict(dict)
    for sm, tag, cta, t0, t1 in recs[grid]:
        d = out[cta]
        d["sm"] = sm
        if tag == 0:
            d["release"] = (t1 - rel) / 1e3
        else:
            d["p%d" % (tag - 1)] = (t0 - rel) / 1e3
    return out


def main():
    path = sys.argv[1]
    prefix = sys.argv[2] if len(sys.argv) > 2 else "rows_pre"
    labels, order, recs = load(path)
    groups = collections.defaultdict(list)  # (label, CTAs, previous launch's CTAs on the SM) -> [(p0, p1)]
    for i, grid in enumerate(order):
        if i == 0 or not labels[grid].startswith(prefix):
            continue
        ctas = per_cta(recs, grid)
        prev = collections.Counter(d["sm"] for d in per_cta(recs, order[i - 1]).values())
        for d in ctas.values():
            if "p0" in d and "p1" in d:
                groups[(labels[grid], len(ctas), prev.get(d["sm"], 0))].append((d["p0"], d["p1"]))
    print("| launch | CTAs | previous launch's CTAs on the SM | CTA records | resident (median / max) | tile landed "
          "(median / max) |")
    print("|---|---|---|---|---|---|")
    for (label, n, shared), v in sorted(groups.items()):
        p0 = [x[0] for x in v]
        p1 = [x[1] for x in v]
        print(f"| {label} | {n} | {shared} | {len(v)} | {statistics.median(p0):.2f} / {max(p0):.2f} | "
              f"{statistics.median(p1):.2f} / {max(p1):.2f} |")


if __name__ == "__main__":
    main()
