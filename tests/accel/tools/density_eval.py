"""Synthetic evaluation of the per-image density measures used by VisionZip's global budget.

No real vision-tower attention is available where this runs, so the LLM-token scores are drawn
from stand-in distributions: log-normal column sums with spread sigma (0.25 ~ flat, text-like
attention; 1.5 ~ peaky, photo-like), optionally with attention sinks (1% of the tokens holding
40% of the mass). For each measure it prints mean and standard deviation over 200 draws per
image size, so one can see (1) whether it separates flat from peaky images, (2) whether it
depends on the image size M, (3) how much sinks move it; then the keep counts that the global
mode gives a mixed request for several gamma values. Run: /opt/refenv/bin/python density_eval.py
"""
import numpy as np


def effective_share(s):
    p = s / s.sum()
    p = p[p > 0]
    return max(np.exp(-(p * np.log(p)).sum()) / len(s), 1.0 / len(s))


def tail_share(s):
    m = len(s)
    top = (m + 9) // 10
    if top >= m:
        return 1.0
    top_mass = np.sort(s)[::-1][:top].sum() / s.sum()
    return max((1.0 - top_mass) / (1.0 - top / m), 1.0 / m)


def draw(rng, m, sigma, sinks):
    s = rng.lognormal(0.0, sigma, m)
    if sinks:
        n_sink = max(1, m // 100)
        idx = rng.choice(m, n_sink, replace=False)
        rest = np.delete(np.arange(m), idx)
        s[idx] = 0.4 / 0.6 * s[rest].sum() / n_sink  # sinks hold 40% of the total mass
    return s * (4.0 * m / s.sum())  # column sums of 4 patches per token: mean 4


def main():
    rng = np.random.default_rng(0)
    measures = {"effective_share": effective_share, "tail_share": tail_share}
    print(f"{'measure':16} {'sigma':>5} {'sinks':>5} " + " ".join(f"{'M=' + str(m):>13}" for m in (64, 256, 1024)))
    for name, fn in measures.items():
        for sigma in (0.25, 0.8, 1.5):
            for sinks in (False, True):
                cells = []
                for m in (64, 256, 1024):
                    v = np.array([fn(draw(rng, m, sigma, sinks)) for _ in range(200)])
                    cells.append(f"{v.mean():.3f}+-{v.std():.3f}")
                print(f"{name:16} {sigma:5.2f} {str(sinks):>5} " + " ".join(f"{c:>13}" for c in cells))


def allocate(images, rate, gamma, min_tokens=16):
    """Global-mode keep counts (same rule as vision_keep_counts, tail_share weighting)."""
    total = sum(len(s) for s in images)
    budget = int(np.floor(total * (1.0 - rate) + 1e-9))
    floors = [min(len(s), min_tokens) for s in images]
    dens = np.array([tail_share(s) for s in images])
    weight = (dens / dens.mean()) ** gamma
    keys = []
    for i, s in enumerate(images):
        order = np.argsort(-s, kind="stable")
        for r in order[floors[i]:]:
            keys.append((-(s[r] * len(s) / s.sum() * weight[i]), i, r))
    keys.sort()
    counts = list(floors)
    for _, i, _ in keys[: max(0, budget - sum(floors))]:
        counts[i] += 1
    return counts


def allocation_table():
    rng = np.random.default_rng(1)
    flat = draw(rng, 256, 0.25, False)
    flat_sinks = draw(rng, 256, 0.25, True)
    peaky = draw(rng, 256, 1.5, False)
    print("\nkept tokens of [flat, flat+sinks, peaky] (256 each, min_tokens 16)")
    for rate in (0.3, 0.5, 0.7):
        row = [f"rate {rate}: uniform {[int(np.floor(256 * (1 - rate) + 1e-9))] * 3}"]
        for gamma in (0.0, 0.5, 1.0):
            row.append(f"gamma {gamma}: {allocate([flat, flat_sinks, peaky], rate, gamma)}")
        print("  " + "  ".join(row))


if __name__ == "__main__":
    main()
    allocation_table()
