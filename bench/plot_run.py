#!/usr/bin/python3
"""Turn a train_gpt --log file (JSON lines) into one PNG of the run:
loss (train, and val where evaluated), throughput (tokens/s) and memory
(this process's allocator: live bytes after each step, peak so far), each
against the step.

Usage: /usr/bin/python3 bench/plot_run.py out/log.jsonl out/run.png

Uses Debian's python3-matplotlib (apt-get install python3-matplotlib), which
loads in Debian's own interpreter, /usr/bin/python3. Logs written before the
memory fields existed plot without the memory panel.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt


def read_log(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not a JSON line ({e})")
    if not rows:
        sys.exit(f"{path}: no steps logged")
    return rows


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    log_path, png_path = sys.argv[1], sys.argv[2]
    rows = read_log(log_path)
    steps = [r["step"] + 1 for r in rows]  # logged from 0; plotted as steps done
    val = [(r["step"] + 1, r["val_loss"]) for r in rows if r.get("val_loss") is not None]
    has_memory = all("live_mib" in r for r in rows)
    panels = 3 if has_memory else 2
    fig, axes = plt.subplots(panels, 1, figsize=(7, 2.6 * panels), sharex=True)

    ax = axes[0]
    ax.plot(steps, [r["loss"] for r in rows], label="train loss", linewidth=1)
    if val:
        ax.plot([s for s, _ in val], [v for _, v in val], "o-", label="val loss")
    ax.set_ylabel("cross-entropy\n(nats/char)")
    ax.set_title(log_path)
    ax.legend()

    ax = axes[1]
    ax.plot(steps, [r["tokens_per_s"] for r in rows], linewidth=1, color="tab:green")
    ax.set_ylabel("tokens/s")

    if has_memory:
        ax = axes[2]
        ax.plot(steps, [r["live_mib"] for r in rows], label="live after the step", linewidth=1)
        ax.plot(steps, [r["peak_mib"] for r in rows], label="peak so far", linewidth=1)
        ax.set_ylabel("MiB (rank 0)")
        # From 0: a flat line a few KiB above or below its start is not a leak or a drop.
        ax.set_ylim(bottom=0, top=1.1 * max(max(r["peak_mib"] for r in rows), 1e-9))
        ax.legend()
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    print(f"wrote {png_path}")


if __name__ == "__main__":
    main()
