"""A picture of ``bench_store.py``'s targets: every checked ratio of one or more runs against
its target (one row per target, one dot per run; red where it fails).

    python benchmarks/store_plot.py RUN.json [RUN.json ...] --png OUT.png

(``bench_store.py --json RUN.json`` writes a run; ``bench_store.py --png OUT`` plots its own.)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def plot(runs: list[list[dict]], out: Path, title: str = "bench_store: ratio vs target") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys: list[tuple[str, str]] = []
    for run in runs:
        for row in run:
            key = (row["group"], row["case"].strip())
            if row["target"] is not None and row["unit"] == "ratio" and key not in keys:
                keys.append(key)
    fig, ax = plt.subplots(figsize=(9, 0.38 * len(keys) + 1.4))
    for y, key in enumerate(keys):
        target = None
        for i, run in enumerate(runs):
            for row in run:
                if (row["group"], row["case"].strip()) == key and row["checked"] is not None:
                    target = row["target"]
                    ok = row["checked"] >= target
                    ax.plot(row["checked"], y + (i - (len(runs) - 1) / 2) * 0.08, "o",
                            color="tab:green" if ok else "tab:red", ms=5)
        if target is not None:
            ax.plot([target, target], [y - 0.4, y + 0.4], color="black", lw=1.5)
    ax.set_yticks(range(len(keys)), [f"{g}: {c}" for g, c in keys], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ratio (higher is better); black bar: target")
    ax.set_title(f"{title} ({len(runs)} run{'s' if len(runs) > 1 else ''})", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="bench_store.py --json files")
    parser.add_argument("--png", type=Path, required=True)
    args = parser.parse_args()
    plot([json.loads(p.read_text()) for p in args.runs], args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
