"""A picture of a PBT population's history: each member's metric against step, and every exploit drawn as
a jump from the donor's curve to the member that copied it, labelled with the values it went on with.

Built from the sweep journal alone (each trial's first report of each step and the ``exploit`` events), so
a resumed sweep draws the whole history, not only what its last driver saw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pvm_dist.sweep.journal import SweepState
from pvm_dist.tracking.figures import pyplot, save_figure


def population_history(state: SweepState, metric: str, path: Path) -> Path | None:
    """Write the population picture to ``path`` (PNG); None when no member reported ``metric``."""
    curves = {}
    for trial_id, ts in sorted(state.trials.items()):
        points = sorted((step, m[metric]) for step, (_, m) in ts.logged.items() if m.get(metric) is not None)
        if points:
            curves[trial_id] = points
    if not curves:
        return None
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
    colours: dict[str, Any] = {}
    for trial_id, points in curves.items():
        (line,) = ax.plot([s for s, _ in points], [v for _, v in points], label=trial_id, linewidth=1.2)
        colours[trial_id] = line.get_color()
    for ev in state.exploits:
        donor, member, step = ev["donor"], ev["trial"], int(ev["step"])
        at = _value_at(curves.get(donor, []), step)
        before = _value_at(curves.get(member, []), int(ev.get("at_step", step)))
        if at is None or before is None:
            continue
        ax.annotate("", xy=(step, at), xytext=(int(ev.get("at_step", step)), before),
                    arrowprops={"arrowstyle": "->", "color": colours.get(member, "black"), "linestyle": "--"})
        values = ", ".join(f"{k}={_short(v)}" for k, v in (ev.get("values") or {}).items())
        ax.annotate(f"{member} ← {donor}\n{values}", xy=(step, at), fontsize=6, xytext=(4, 4),
                    textcoords="offset points", color=colours.get(member, "black"))
    if metric.startswith("ratio"):
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle=":", label="baseline (ratio 1)")
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.set_title(f"PBT population: {metric}; arrows: a member copies a donor ({len(state.exploits)} exploits)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, path)


def _value_at(points: list[tuple[int, float]], step: int) -> float | None:
    """The metric reported at ``step``, else the last one reported before it."""
    earlier = [v for s, v in points if s <= step]
    return earlier[-1] if earlier else None


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
