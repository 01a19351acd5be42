"""PNG plots of a fit (`specwatch calibrate --report DIR`): measured vs predicted latency
against arrival rate per workload and draft length, and the relative residuals.

matplotlib is imported inside each function (Agg backend), so importing this module costs
nothing when no report is asked for.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specwatch import model
from specwatch.calibrate.leastsq import k_key, workload_labels
from specwatch.calibrate.reportfmt import k_label
from specwatch.calibrate.results import SystemFit

__all__ = ["plot_fit", "plot_residuals"]


def _curve(
    fit: SystemFit, k: float, e: float, p: float, g: float, lam: np.ndarray, workload: str
) -> np.ndarray:
    if fit.coefficients is not None:
        return model.latency(fit.coefficients, lam, k, e, p, g, max_utilization=1.0).latency
    for c in fit.configurations:
        if c.k == k and c.workload == workload:
            return model.latency_from_costs(c.c1, c.c2, lam)
    return np.full_like(lam, np.nan)


def plot_fit(fit: SystemFit, path: Path) -> None:
    """Measured (markers) and predicted (lines) mean latency against arrival rate, per k, one
    panel per workload; excluded points as grey crosses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    excluded = [e.point for e in fit.excluded]
    all_labels = workload_labels([*fit.points, *excluded])
    labels = all_labels[: len(fit.points)]
    excluded_labels = all_labels[len(fit.points) :]
    workloads = sorted(set(labels))
    ks = sorted({k_key(p) for p in fit.points})
    cmap = plt.get_cmap("viridis", max(len(ks), 2))
    colour = {k: cmap(i) for i, k in enumerate(ks)}
    fig, axes = plt.subplots(
        1, len(workloads), figsize=(6.2 * len(workloads), 4.6), squeeze=False, sharey=True
    )
    for ax, workload in zip(axes[0], workloads, strict=True):
        pts = [p for p, w in zip(fit.points, labels, strict=True) if w == workload]
        for k in ks:
            group = [p for p in pts if k_key(p) == k]
            if not group:
                continue
            lam = np.array([p.arrival_rate for p in group])
            lat = np.array([p.latency_s for p in group])
            name = "no SD" if k == 0 else f"k={k_label(k)}"
            ax.scatter(lam, lat, color=colour[k], s=22, label=name, zorder=3)
            e = float(np.mean([p.acceptance_length for p in group]))
            pm = float(np.mean([p.prompt_tokens or 0.0 for p in group]))
            gm = float(np.mean([p.generation_tokens or 0.0 for p in group]))
            grid = np.linspace(0.0, lam.max() * 1.05, 120)
            ax.plot(grid, _curve(fit, k, e, pm, gm, grid, workload), color=colour[k], lw=1.2)
        ex_w = [p for p, w in zip(excluded, excluded_labels, strict=True) if w == workload]
        if ex_w and pts:
            # Far-saturated points (10x the latency) would squash the fitted range flat.
            top = 2.0 * max(p.latency_s for p in pts)
            shown = [p for p in ex_w if p.latency_s <= top]
            if shown:
                ax.scatter(
                    [p.arrival_rate for p in shown],
                    [p.latency_s for p in shown],
                    marker="x",
                    color="0.55",
                    s=22,
                    label="excluded",
                    zorder=2,
                )
        ax.set_title(workload)
        ax.set_xlabel("arrival rate λ (req/s)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("mean end-to-end latency (s)")
    axes[0][-1].legend(fontsize=8, loc="upper left", ncol=2)
    how = "model" if fit.coefficients is not None else "per-configuration (C1, C2) fit"
    fig.suptitle(
        f"{fit.system}: measured (points) vs {how} (lines), R² {fit.r2:.3f}, MAPE {fit.mape:.1%}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_residuals(fit: SystemFit, path: Path) -> None:
    """Relative residual (predicted − measured)/measured against arrival rate, per k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = fit.residuals() * 100
    ks = sorted({k_key(p) for p in fit.points})
    cmap = plt.get_cmap("viridis", max(len(ks), 2))
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for i, k in enumerate(ks):
        idx = [j for j, p in enumerate(fit.points) if k_key(p) == k]
        ax.scatter(
            [fit.points[j].arrival_rate for j in idx],
            res[idx],
            color=cmap(i),
            s=18,
            label="no SD" if k == 0 else f"k={k_label(k)}",
        )
    ax.axhline(0, color="black", lw=0.8)
    ax.axhspan(-5, 5, color="tab:green", alpha=0.08, label="±5%")
    ax.set_xlabel("arrival rate λ (req/s)")
    ax.set_ylabel("(predicted − measured) / measured (%)")
    ax.set_title(f"{fit.system}: residuals (MAPE {fit.mape:.1%})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=4)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
