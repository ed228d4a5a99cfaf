#!/usr/bin/env python3
"""onebit_adam_report.py OUT_DIR FREEZE_STEP RUN...: what bench/onebit_adam.sh measured.

Reads each run's metrics.jsonl (OUT_DIR/RUN/metrics.jsonl); prints the final validation loss and its ratio to the
first run's, and the data-parallel bytes rank 0 sent per step before and after the freeze; writes
OUT_DIR/curves.svg with every run's training and validation loss (standard library only)."""
import json
import sys


def read(path):
    train, valid, dp_bytes = [], [], {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            it = r.get("iteration")
            if "lm loss" in r:
                train.append((it, r["lm loss"]))
                sent = r.get("bytes_per_step", {})
                if isinstance(sent, dict) and "dp" in sent:
                    dp_bytes[it] = sent["dp"]
            if "validation lm loss" in r:
                valid.append((it, r["validation lm loss"]))
    return train, valid, dp_bytes


def svg(curves, freeze, path):
    w, h, pad = 900, 520, 60
    xs = [x for c in curves.values() for series in c for x, _ in series]
    ys = [y for c in curves.values() for series in c for _, y in series]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), min(max(ys), min(ys) + 3.0)  # the first steps' loss would flatten the rest
    sx = lambda x: pad + (x - x0) / max(1, x1 - x0) * (w - 2 * pad)
    sy = lambda y: h - pad - (min(y, y1) - y0) / max(1e-9, y1 - y0) * (h - 2 * pad)
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>',
           f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>',
           f'<text x="{w / 2}" y="{h - 15}" text-anchor="middle">iteration</text>',
           f'<text x="15" y="{h / 2}" transform="rotate(-90 15 {h / 2})" text-anchor="middle">loss (nats/byte)</text>']
    for i in range(6):
        y = y0 + (y1 - y0) * i / 5
        out.append(f'<text x="{pad - 5}" y="{sy(y) + 4}" text-anchor="end">{y:.2f}</text>')
        x = x0 + (x1 - x0) * i / 5
        out.append(f'<text x="{sx(x)}" y="{h - pad + 16}" text-anchor="middle">{x:.0f}</text>')
    if x0 <= freeze <= x1:
        out.append(f'<line x1="{sx(freeze)}" y1="{pad}" x2="{sx(freeze)}" y2="{h - pad}" stroke="gray" '
                   f'stroke-dasharray="4 4"/>')
        out.append(f'<text x="{sx(freeze) + 4}" y="{pad + 12}" fill="gray">freeze_step {freeze}</text>')
    for k, (name, (train, valid)) in enumerate(curves.items()):
        c = colours[k % len(colours)]
        pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in train)
        out.append(f'<polyline fill="none" stroke="{c}" stroke-opacity="0.45" points="{pts}"/>')
        pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in valid)
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2.5" points="{pts}"/>')
        out.append(f'<text x="{w - pad - 190}" y="{pad + 18 * k}" fill="{c}">{name} (thin: train, thick: valid)</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    out, freeze, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    curves, base = {}, None
    for name in names:
        train, valid, dp_bytes = read(f"{out}/{name}/metrics.jsonl")
        curves[name] = (train, valid)
        final = valid[-1][1]
        base = base or final
        before = [b for it, b in dp_bytes.items() if it <= freeze]
        after = [b for it, b in dp_bytes.items() if it > freeze + 1]
        print(f"{name:14s} final validation loss {final:.4f} ({final / base:.4f} of {names[0]}'s) | "
              f"dp bytes/step (rank 0) warm-up {before[-1] if before else 'n/a'}, "
              f"after {after[-1] if after else 'n/a'}")
    svg(curves, freeze, f"{out}/curves.svg")
    print(f"curves: {out}/curves.svg")


if __name__ == "__main__":
    main()
