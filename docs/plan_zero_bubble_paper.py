#!/usr/bin/python3
"""loom_plan's zero-bubble gains beside the paper's measured ones (chapter 18).

  /usr/bin/python3 docs/plan_zero_bubble_paper.py LOOM_PLAN

Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024; arXiv 2401.10241)
trained GPT-3-like models on A100s (8 a node, RoCE across nodes) and reported
samples per GPU per second for each schedule. For each of their settings this
runs loom_plan with the same model, micro-batch size, micro-batch count and
stages, once per schedule, reads its tokens/s, and prints its gain over 1F1B
beside the paper's measured gain and beside the gain the paper's own bubble
rates imply (its Tables 5 and 8: each schedule replayed with the F, B, W and
transfer times it profiled). Every loom number is loom_plan's; the paper's
numbers are typed in below from its tables.

ZB-1p (the paper's automatically searched schedule under 1F1B's memory) is
compared with loom's ZB-H1: the paper's Table 5 gives the two the same bubble
rate in every one of these settings.
"""
import re
import subprocess
import sys

# Table 3: layers, heads, width; sequence 1024, GPT-2's vocabulary.
MODELS = {"1.5B": (22, 24, 2304), "6.2B": (30, 32, 4096), "14.6B": (46, 40, 5120), "28.3B": (62, 48, 6144)}

# Table 4 (1F1B against ZB-1p): model, stages, micro-batch size, micro-batches,
# samples/GPU/s of 1F1B and ZB-1p, and Table 5's bubble rates of 1F1B and ZB-H1.
TABLE4 = [
    ("1.5B", 8, 6, 24, 11.8, 12.9, 0.2431, 0.1585),
    ("1.5B", 8, 6, 32, 12.5, 13.4, 0.1985, 0.1242),
    ("1.5B", 8, 6, 64, 13.6, 14.2, 0.1240, 0.0674),
    ("6.2B", 8, 3, 24, 3.50, 3.88, 0.2347, 0.1323),
    ("6.2B", 8, 3, 32, 3.70, 4.00, 0.1898, 0.1045),
    ("6.2B", 8, 3, 64, 4.03, 4.20, 0.1091, 0.0554),
    ("14.6B", 16, 1, 48, 1.40, 1.61, 0.2552, 0.1397),
    ("14.6B", 16, 1, 64, 1.49, 1.67, 0.2082, 0.1088),
    ("14.6B", 16, 1, 128, 1.64, 1.76, 0.1251, 0.0576),
    ("28.3B", 32, 1, 96, 0.76, 0.87, 0.2646, 0.1421),
    ("28.3B", 32, 1, 128, 0.80, 0.90, 0.2168, 0.1106),
    ("28.3B", 32, 1, 256, 0.88, 0.96, 0.1352, 0.0594),
]

# arXiv version's Table 6 (1F1B against ZB-V, one more layout of the same
# models: 2p - 2 layers, so each chunk of the V holds one block and the
# embedding and the head a chunk each): samples/GPU/s of 1F1B and ZB-V, and
# its Table 8's bubble rates of 1F1B and ZB-V.
TABLE6 = [
    ("6.2B", 16, 6, 48, 3.38, 4.15, 0.2668, 0.0697),
    ("6.2B", 16, 6, 64, 3.57, 4.21, 0.2206, 0.0533),
    ("6.2B", 16, 6, 128, 3.91, 4.35, 0.1390, 0.0274),
    ("14.6B", 24, 2, 72, 1.52, 1.85, 0.2699, 0.0638),
    ("14.6B", 24, 2, 96, 1.61, 1.88, 0.2229, 0.0483),
    ("14.6B", 24, 2, 192, 1.76, 1.93, 0.1403, 0.0250),
    ("28.3B", 32, 2, 96, 0.82, 1.01, 0.2676, 0.0593),
    ("28.3B", 32, 2, 128, 0.87, 1.02, 0.2204, 0.0451),
    ("28.3B", 32, 2, 256, 0.95, 1.06, 0.1362, 0.0236),
]


def tokens_per_second(loom_plan, model, pp, b, m, schedule, free_links=False):
    layers, heads, width = MODELS[model]
    args = [loom_plan, "--machine", "a100", "--layers", str(layers), "--embd", str(width), "--heads", str(heads),
            "--block", "1024", "--vocab", "50257", "--batch", str(b), "--microbatches", str(m), "--pp", str(pp),
            "--dtype", "bf16", "--partition", "balanced", "--schedule", schedule]
    if schedule in ("zb-v", "dualpipev"):
        args += ["--virtual-stages", "2"]
    if free_links:  # transfers that cost nothing: what the planner's gain is without its exposed p2p
        args += ["--link-gbs", "10000", "--latency-us", "0"]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    return float(re.search(r"^  ([\d.e+]+) tokens/s", out, re.M).group(1))


def rows(loom_plan, table, schedule, name):
    print(f"{'model':>6} {'p':>3} {'b':>2} {'m':>4}  paper 1F1B -> {name:<6} gain  "
          f"paper's bubbles imply  loom_plan gain  loom_plan - paper  links free")
    gaps = []
    for model, pp, b, m, base, zb, bubble_base, bubble_zb in table:
        measured = zb / base
        implied = (1 - bubble_zb) / (1 - bubble_base)
        gain = [tokens_per_second(loom_plan, model, pp, b, m, schedule, free) /
                tokens_per_second(loom_plan, model, pp, b, m, "1f1b", free) for free in (False, True)]
        gaps.append(gain[0] - measured)
        print(f"{model:>6} {pp:>3} {b:>2} {m:>4}  {base:>10.2f} -> {zb:<6.2f} {measured:.3f}  {implied:>20.3f}  "
              f"{gain[0]:>14.3f}  {gain[0] - measured:>+17.3f}  {gain[1]:>10.3f}")
    print(f"loom_plan - paper over these rows: {min(gaps):+.3f} to {max(gaps):+.3f}, "
          f"mean {sum(gaps) / len(gaps):+.3f}")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print("ZB-H1 (loom) against the paper's ZB-1p, gain over 1F1B (samples/GPU/s: the paper's Table 4)")
    rows(sys.argv[1], TABLE4, "zb-h1", "ZB-1p")
    print()
    print("ZB-V, gain over 1F1B (samples/GPU/s: the paper's Table 6)")
    rows(sys.argv[1], TABLE6, "zb-v", "ZB-V")


if __name__ == "__main__":
    main()
