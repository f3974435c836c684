#!/usr/bin/env python3
"""Offline analysis of one replayed decode step's per-CTA records (bench_decode_timeline --timeline B with
ZEST_TIMELINE_RAW=PATH; bench/gpu/timeline_raw.sh writes $OUT/tl-b<B>.txt).

For every small-M GEMM launch (rows_pre) it reports, over the layers, when its CTAs became resident (phase 0) and
when their weight tile landed (phase 1), relative to the launch's release (its first CTA past the PDL wait), split by
how many CTAs of the previous launch shared the CTA's SM: a CTA that cannot fit beside them becomes resident only as
they leave, and its tile streams late.

With --phases LABEL it prints instead, for the launches whose label starts with LABEL, each phase stamp's minimum /
median / maximum over the CTAs (us after the launch's release; the median of each over the launches) and the time
to the next launch's release, and when the CTAs' PDL waits returned.

With --landing LABEL CTAS it prints, for the launches of CTAS CTAs, phase 1 grouped by when the CTA became resident
(e.g. whether the qkv GEMM's tiles land late even for CTAs that were resident early).

With --neighbours LABEL it prints each CTA's phase-2 stamp grouped by whether the next launch's first CTA entered
the CTA's SM before it, and the per-launch maximum.

With --sms LABEL it prints, for the launches whose label starts with LABEL, per SM and launch (grouped by how many of
the launch's CTAs the SM held): when its first CTA became resident, how long the CTAs' prologues took (first
instruction to reaching the PDL wait), when the waits returned, when its last CTA stamped its last phase, and when the
next launch's first CTA entered that SM after it (the handoff); us after the launch's release, min / median / 90th
percentile / max over the (SM, launch) pairs.

usage: bench/timeline_raw.py tl-b1.txt [label-prefix (default rows_pre)]
       bench/timeline_raw.py tl-b8.txt --phases moe_experts_stream
       bench/timeline_raw.py tl-b1.txt --sms moe_one_gate_up
       bench/timeline_raw.py tl-b1.txt --neighbours decode_attention_fused
       bench/timeline_raw.py tl-b1.txt --landing rows_pre 320
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
            d["reach"] = (t0 - rel) / 1e3
            d["release"] = (t1 - rel) / 1e3
        else:
            d["p%d" % (tag - 1)] = (t0 - rel) / 1e3
    return out


def phases(path, prefix):
    labels, order, recs = load(path)
    stats = collections.defaultdict(list)  # phase -> [(min, median, max) per launch]
    spans = []
    for i, grid in enumerate(order):
        if not labels[grid].startswith(prefix) or i + 1 >= len(order):
            continue
        ctas = per_cta(recs, grid)
        rel = min(r[4] for r in recs[grid] if r[1] == 0)
        nxt = min(r[4] for r in recs[order[i + 1]] if r[1] == 0)
        spans.append((nxt - rel) / 1e3)
        for k in range(8):
            v = [d["p%d" % k] for d in ctas.values() if "p%d" % k in d]
            if v:
                stats[k].append((min(v), statistics.median(v), max(v)))
        v = [d["release"] for d in ctas.values() if "release" in d]
        if v:
            stats["wait"].append((min(v), statistics.median(v), max(v)))
    print(f"{prefix}: {len(spans)} launches; next launch released {statistics.median(spans):.2f} us after the release")
    print("| phase | min over CTAs | median | max |")
    print("|---|---|---|---|")
    for k, v in sorted(stats.items(), key=lambda kv: -1 if kv[0] == "wait" else kv[0]):
        med = [statistics.median(x[j] for x in v) for j in range(3)]
        name = "wait returned" if k == "wait" else f"p{k}"
        print(f"| {name} | {med[0]:.2f} | {med[1]:.2f} | {med[2]:.2f} |")


def spread(v):
    v = sorted(v)
    return f"{v[0]:.2f} / {statistics.median(v):.2f} / {v[min(len(v) - 1, int(len(v) * 0.9))]:.2f} / {v[-1]:.2f}"


def sms(path, prefix):
    labels, order, recs = load(path)
    rows = collections.defaultdict(lambda: collections.defaultdict(list))  # CTAs on the SM -> quantity -> values
    for i, grid in enumerate(order):
        if not labels[grid].startswith(prefix) or i + 1 >= len(order):
            continue
        rel = min(r[4] for r in recs[grid] if r[1] == 0)
        ctas = per_cta(recs, grid)
        nxt = per_cta(recs, order[i + 1])
        nrel = min(r[4] for r in recs[order[i + 1]] if r[1] == 0)
        shift = (nrel - rel) / 1e3  # the next launch's times, relative to this launch's release
        by_sm = collections.defaultdict(list)
        for d in ctas.values():
            by_sm[d["sm"]].append(d)
        next_entry = collections.defaultdict(list)
        for d in nxt.values():
            if "p0" in d:
                next_entry[d["sm"]].append(d["p0"] + shift)
        for sm, ds in by_sm.items():
            q = rows[len(ds)]
            last = [max(v for k, v in d.items() if k.startswith("p")) for d in ds if any(k.startswith("p") for k in d)]
            if any("p0" in d for d in ds):
                q["first resident"].append(min(d["p0"] for d in ds if "p0" in d))
            q["prologue"] += [d["reach"] - d["p0"] for d in ds if "reach" in d and "p0" in d]
            q["wait returned"] += [d["release"] for d in ds if "release" in d]
            if last:
                q["last CTA's last stamp"].append(max(last))
                if next_entry.get(sm):
                    q["next launch enters after it"].append(min(next_entry[sm]) - max(last))
    print(f"{prefix}: per SM and launch, us after the launch's release (min / median / p90 / max)")
    print("| CTAs on the SM | quantity | values | min / median / p90 / max |")
    print("|---|---|---|---|")
    for n, q in sorted(rows.items()):
        for name, v in q.items():
            if v:
                print(f"| {n} | {name} | {len(v)} | {spread(v)} |")


def neighbours(path, prefix, phase=2):
    """For the launches whose label starts with prefix: each CTA's phase `phase` (us after the launch's release),
    grouped by when the next launch's first CTA entered the CTA's SM (before that phase or not), and the per-launch
    maximum (what a cluster barrier or the next launch waits for)."""
    labels, order, recs = load(path)
    groups = collections.defaultdict(list)
    maxima = []
    key = "p%d" % phase
    for i, grid in enumerate(order):
        if not labels[grid].startswith(prefix) or i + 1 >= len(order):
            continue
        rel = min(r[4] for r in recs[grid] if r[1] == 0)
        nrel = min(r[4] for r in recs[order[i + 1]] if r[1] == 0)
        shift = (nrel - rel) / 1e3
        entry = {}
        for d in per_cta(recs, order[i + 1]).values():
            if "p0" in d:
                entry[d["sm"]] = min(entry.get(d["sm"], 1e9), d["p0"] + shift)
        vals = []
        for d in per_cta(recs, grid).values():
            if key not in d:
                continue
            t = entry.get(d["sm"])
            name = "no CTA of the next launch" if t is None else (
                "next launch entered before it" if t < d[key] else "next launch entered after it")
            groups[name].append(d[key])
            vals.append(d[key])
        if vals:
            maxima.append(max(vals))
    print(f"{prefix}: {key} (us after the release) by the next launch's entry on the CTA's SM (min / median / p90 / max)")
    print("| group | CTA records | values |")
    print("|---|---|---|")
    for name, v in sorted(groups.items()):
        print(f"| {name} | {len(v)} | {spread(v)} |")
    if maxima:
        print(f"| per-launch maximum | {len(maxima)} | {spread(maxima)} |")


def landing(path, prefix, ctas):
    """For the launches whose label starts with prefix and that have `ctas` CTAs: each CTA's phase 1 (for the small-M
    GEMM: its weight tile landed, no earlier than its PDL wait plus its first loads) grouped by when the CTA became
    resident (phase 0, whole us relative to the launch's release), and when its wait returned."""
    labels, order, recs = load(path)
    bins = collections.defaultdict(list)
    for grid in order:
        if not labels[grid].startswith(prefix):
            continue
        c = per_cta(recs, grid)
        if len(c) != ctas:
            continue
        for d in c.values():
            if "p0" in d and "p1" in d:
                bins[round(d["p0"])].append((d["p1"], d.get("release", float("nan"))))
    print(f"{prefix} ({ctas} CTAs): phase 1 by residency (us relative to the release; min / median / p90 / max)")
    print("| resident at | CTA records | phase 1 | wait returned (median) |")
    print("|---|---|---|---|")
    for b in sorted(bins):
        v = bins[b]
        print(f"| {b:+d} | {len(v)} | {spread([x[0] for x in v])} | {statistics.median(x[1] for x in v):.2f} |")


def main():
    path = sys.argv[1]
    if len(sys.argv) > 4 and sys.argv[2] == "--landing":
        landing(path, sys.argv[3], int(sys.argv[4]))
        return
    if len(sys.argv) > 3 and sys.argv[2] == "--neighbours":
        neighbours(path, sys.argv[3])
        return
    if len(sys.argv) > 3 and sys.argv[2] == "--phases":
        phases(path, sys.argv[3])
        return
    if len(sys.argv) > 3 and sys.argv[2] == "--sms":
        sms(path, sys.argv[3])
        return
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
