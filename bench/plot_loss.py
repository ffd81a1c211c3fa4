#!/usr/bin/python3
"""Turn a train_gpt --log file (JSON lines) into a loss-curve PNG.

Usage: /usr/bin/python3 bench/plot_loss.py out/log.jsonl out/loss.png

Uses Debian's python3-matplotlib (apt-get install python3-matplotlib), which
loads in Debian's own interpreter, /usr/bin/python3.
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    log_path, png_path = sys.argv[1], sys.argv[2]
    steps, losses, val_steps, val_losses = [], [], [], []
    with open(log_path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{log_path}:{n}: not a JSON line ({e})")
            steps.append(row["step"])
            losses.append(row["loss"])
            if "val_loss" in row:
                val_steps.append(row["step"])
                val_losses.append(row["val_loss"])
    if not steps:
        sys.exit(f"{log_path}: no steps logged")
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, losses, label="train loss", linewidth=1)
    if val_steps:
        ax.plot(val_steps, val_losses, "o-", label="val loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/char)")
    ax.set_title(log_path)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    print(f"wrote {png_path}")


if __name__ == "__main__":
    main()
