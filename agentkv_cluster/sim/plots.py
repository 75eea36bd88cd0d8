"""PNG plots of the paper's Figures 5, 6 and 7 (matplotlib, Agg backend).

matplotlib is imported inside the functions so that importing the simulator
stays cheap and headless machines never need a display.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from agentkv_cluster.sim.metrics import PolicyMetrics

Points = Sequence[tuple[float, Mapping[str, PolicyMetrics]]]

_STYLE = {"lru": "o-", "ttl": "s-", "semantic": "^-", "agentkv": "D-", "arc": "v--"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _policy_lines(points: Points, metric: str, title: str, ylabel: str, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    x = [v for v, _ in points]
    for name in points[0][1]:
        ax.plot(x, [getattr(res[name], metric) for _, res in points],
                _STYLE.get(name, "-"), label=name, markersize=4)
    ax.set_xlabel("HBM budget (fraction of working set)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def budget_figures(points: Points, out_dir: Path) -> list[Path]:
    """Fig. 5 (byte hit rate) and Fig. 6 (restore delay P95) against the HBM budget."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        _policy_lines(points, "byte_hit_pct", "Fig. 5: byte hit rate vs HBM budget",
                      "byte hit rate (%)", out_dir / "fig5_byte_hit_vs_budget.png"),
        _policy_lines(points, "p95_ms", "Fig. 6: restore delay P95 vs HBM budget",
                      "P95 restore delay (ms)", out_dir / "fig6_p95_vs_budget.png"),
    ]


def noise_figure(points: Points, out_dir: Path, policy: str = "agentkv") -> list[Path]:
    """Fig. 7: AgentKV P95 and risk proxy against the prediction log-error sigma."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=120)
    x = [v for v, _ in points]
    ax.plot(x, [res[policy].p95_ms for _, res in points], "D-", color="tab:blue",
            label=f"{policy} P95 (ms)")
    ax.set_xlabel("prediction noise (log-error sigma)")
    ax.set_ylabel("P95 restore delay (ms)", color="tab:blue")
    ax.set_ylim(bottom=0)
    ax2 = ax.twinx()
    ax2.plot(x, [res[policy].risk_pct for _, res in points], "o--", color="tab:red",
             label="risk proxy (%)")
    ax2.set_ylabel("risk proxy (%)", color="tab:red")
    ax2.set_ylim(bottom=0)
    ax.set_title("Fig. 7: prediction noise vs AgentKV tail delay and risk")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out_dir / "fig7_noise.png"
    fig.savefig(path)
    plt.close(fig)
    return [path]


def sweep_figures(axis: str, values: Sequence[float], results: Sequence[object],
                  out_dir: Path) -> tuple[list[Path], str | None]:
    """The figures of a sweep along ``axis`` (one ``runner.Comparison`` per value) and a
    note on what they leave out, or None."""
    points = [(v, r.policies) for v, r in zip(values, results)]  # type: ignore[attr-defined]
    names = list(points[0][1]) if points else []
    if axis == "budget":
        return budget_figures(points, out_dir), None
    if "agentkv" not in names:  # both other figures plot AgentKV
        return [], f"no {axis} figure: it plots agentkv, which --policies leaves out"
    if axis == "noise":
        return noise_figure(points, out_dir), None
    alone = all(n == "agentkv" for n in names)
    return signal_figure(values, results, out_dir), (
        "the signal figure draws agentkv alone: --policies names no baseline to compare "
        "it with" if alone else None)


def signal_figure(values: Sequence[float], results: Sequence[object],
                  out_dir: Path) -> list[Path]:
    """AgentKV vs the strongest baseline (P95 and transfer) against the share of
    end-of-life signals lost; AgentKV alone when no baseline ran. ``results``: one
    ``runner.Comparison`` per value."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10.0, 4.0), dpi=120)
    x = [v * 100 for v in values]
    for ax, metric, label in ((axes[0], "p95_ms", "P95 restore delay (ms)"),
                              (axes[1], "transfer_mb_per_batch", "transfer (MB/batch)")):
        mine = [getattr(r.policies["agentkv"], metric) for r in results]  # type: ignore[attr-defined]
        best = [r.strongest(metric) for r in results]  # type: ignore[attr-defined]
        ax.plot(x, mine, _STYLE["agentkv"], label="agentkv", markersize=4)
        if all(b is not None for b in best):  # None: no baseline ran
            ax.plot(x, [b[1] for b in best], "s--", label="strongest baseline",
                    markersize=4)
            for xi, b in zip(x, best):
                ax.annotate(b[0], (xi, b[1]), fontsize=6, textcoords="offset points",
                            xytext=(0, 5), ha="center")
        ax.set_xlabel("end-of-life signals lost (%)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("AgentKV vs the strongest baseline against signal quality"
                 if all(r.strongest("p95_ms") is not None  # type: ignore[attr-defined]
                        for r in results) else "AgentKV against signal quality")
    fig.tight_layout()
    path = out_dir / "fig_signal_quality.png"
    fig.savefig(path)
    plt.close(fig)
    return [path]
