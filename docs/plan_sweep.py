#!/usr/bin/python3
"""The planner's sweep drawn as memory against time (chapter 17).

  /usr/bin/python3 docs/plan_sweep.py LOOM_PLAN [--svg FILE] -- [loom_plan options shared by every grid]

Runs loom_plan once per grid of GRIDS (every grid has the same 1024 ranks and
the same global batch: dp x micro-batches = 1536 sequences), reads from its
report the fullest rank's memory (the largest "total" of the memory table),
the step time and what binds, and prints one row per grid and a text picture:
memory across, step time down, the device's capacity as a line of |. With
--svg FILE it also draws the picture as an SVG (the site shows it). Every
number is loom_plan's; this script only reads and places them.
"""
import re
import subprocess
import sys

# (tp, pp, dp, micro-batches): 1024 ranks, dp x m = 1536
GRIDS = [(8, 8, 16, 96), (8, 16, 8, 192), (4, 16, 16, 96), (16, 8, 8, 192), (8, 4, 32, 48), (2, 32, 16, 96),
         (8, 2, 64, 24)]
GIB = {"GiB": 1.0, "MiB": 1 / 1024.0, "TiB": 1024.0}
SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


def plan(loom_plan, tp, pp, dp, m, shared):
    args = [loom_plan, "--tp", str(tp), "--pp", str(pp), "--dp", str(dp), "--microbatches", str(m)] + shared
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    totals = [float(v) * GIB[u] for v, u in re.findall(r"^ +\d+  .* ([\d.]+) (GiB|MiB|TiB)(?:  > capacity!)?$", out, re.M)]
    step = re.search(r"^step time: ([\d.]+) (s|ms|us)", out, re.M)
    binds = re.search(r"^binds: (.*)$", out, re.M).group(1)
    capacity = float(re.search(r", (\d+) GiB, memory", out).group(1))
    return max(totals), float(step.group(1)) * SECONDS[step.group(2)], binds, capacity


def svg(rows, capacity, path):
    w, h, pad = 560, 320, 50
    xmax = max(max(r[1] for r in rows), capacity) * 1.1
    ymin, ymax = 0, max(r[2] for r in rows) * 1.1
    x = lambda v: pad + (w - 2 * pad) * v / xmax  # noqa: E731
    y = lambda v: h - pad - (h - 2 * pad) * (v - ymin) / (ymax - ymin)  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
             f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>',
             f'<line x1="{x(capacity):.1f}" y1="{pad}" x2="{x(capacity):.1f}" y2="{h - pad}" stroke="red" '
             f'stroke-dasharray="4 3"/>',
             f'<text x="{x(capacity) + 4:.1f}" y="{pad + 10}" fill="red">{capacity:.0f} GiB a device</text>',
             f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">memory of the fullest rank (GiB)</text>',
             f'<text x="14" y="{h / 2}" transform="rotate(-90 14 {h / 2})" text-anchor="middle">step time (s)</text>']
    for gib in range(0, int(xmax) + 1, 50):
        parts.append(f'<text x="{x(gib):.1f}" y="{h - pad + 14}" text-anchor="middle">{gib}</text>')
    for s in range(0, int(ymax) + 1, 10):
        parts.append(f'<text x="{pad - 6}" y="{y(s) + 4:.1f}" text-anchor="end">{s}</text>')
    for name, mem, step, binds in rows:
        fill = "red" if mem > capacity else "steelblue"
        parts.append(f'<circle cx="{x(mem):.1f}" cy="{y(step):.1f}" r="4" fill="{fill}"/>')
        parts.append(f'<text x="{x(mem) + 6:.1f}" y="{y(step) - 5:.1f}">{name}</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def main():
    if len(sys.argv) < 3 or "--" not in sys.argv:
        sys.exit(__doc__)
    cut = sys.argv.index("--")
    loom_plan, opts, shared = sys.argv[1], sys.argv[2:cut], sys.argv[cut + 1:]
    rows, capacity = [], 0
    for tp, pp, dp, m in GRIDS:
        mem, step, binds, capacity = plan(loom_plan, tp, pp, dp, m, shared)
        rows.append((f"tp {tp} pp {pp} dp {dp}", mem, step, binds))
    print(f"{'grid':<20} {'memory GiB':>10} {'step s':>8}  binds")
    for name, mem, step, binds in rows:
        print(f"{name:<20} {mem:>10.2f} {step:>8.2f}  {binds}")
    # the picture: memory across (0 .. the largest), step time down (rows of 5 s)
    width, top = 60, max(max(r[1] for r in rows), capacity)
    col = lambda v: min(width - 1, int(v / top * (width - 1)))  # noqa: E731
    print(f"\nstep s | memory of the fullest rank, 0 .. {top:.0f} GiB; | = {capacity:.0f} GiB a device")
    for band in range(int(min(r[2] for r in rows)) // 5 * 5, int(max(r[2] for r in rows)) + 5, 5):
        line = [" "] * width
        line[col(capacity)] = "|"
        for k, (_, mem, step, _) in enumerate(rows):
            if band <= step < band + 5:
                line[col(mem)] = chr(ord("a") + k)
        print(f"{band:>6} | {''.join(line).rstrip()}")
    print("  " + ", ".join(f"{chr(ord('a') + k)} = {r[0]}" for k, r in enumerate(rows)))
    if "--svg" in opts:
        svg(rows, capacity, opts[opts.index("--svg") + 1])


if __name__ == "__main__":
    main()
