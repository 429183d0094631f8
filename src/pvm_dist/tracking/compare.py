"""``pvm-dist compare``: an MLflow experiment's runs side by side.

Shows the parameters that differ between runs (the ones a reader needs), each run's final metrics
and speed, sorted by a chosen metric; can draw the learning curves of the best runs.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

#: Metrics where a larger value is better; every other metric sorts ascending (errors, ratios).
HIGHER_IS_BETTER_HINTS = ("iou", "hit", "per_s", "fps")
DEFAULT_METRIC = "ratio_two_step"
SPEED_METRIC = "frames_per_s"


@dataclasses.dataclass
class RunRow:
    run_id: str
    name: str
    status: str
    params: dict[str, str]
    metrics: dict[str, float]
    start_time: int | None


class CompareError(ValueError):
    """The experiment or metric asked for does not exist (a user error)."""


def higher_is_better(metric: str) -> bool:
    return any(hint in metric for hint in HIGHER_IS_BETTER_HINTS)


def _client(uri: str) -> Any:
    import mlflow

    return mlflow.MlflowClient(tracking_uri=uri)


def load_runs(uri: str, experiment: str, include_nested: bool = True) -> list[RunRow]:
    """Every run of ``experiment`` (name) in the store at ``uri``."""
    client = _client(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = sorted(e.name for e in client.search_experiments())
        raise CompareError(f"no experiment named {experiment!r} at {uri} (experiments: {', '.join(names) or 'none'})")
    runs = client.search_runs([exp.experiment_id], max_results=5000)
    rows = []
    for run in runs:
        tags = run.data.tags
        if not include_nested and "mlflow.parentRunId" in tags:
            continue
        if tags.get("pvm_dist.role") == "sweep":  # a sweep's parent run: its trials are the rows
            continue
        rows.append(RunRow(run.info.run_id, run.info.run_name or run.info.run_id[:8], run.info.status,
                           dict(run.data.params), dict(run.data.metrics), run.info.start_time))
    return rows


#: Param prefixes that repeat one value under several names (a sweep trial logs ``varied.lr``,
#: ``spec.lr`` and ``overrides.lr``); the first of them found is the one shown.
ALIAS_PREFIXES = ("varied.", "spec.", "overrides.")


def differing_params(rows: list[RunRow]) -> list[str]:
    """Parameters whose values are not the same in every run (a missing value counts as different),
    each shown once: of ``varied.X``, ``spec.X`` and ``overrides.X`` with equal values, only the first."""
    keys = sorted({k for r in rows for k in r.params})
    varying = [k for k in keys if len({r.params.get(k) for r in rows}) > 1]
    def prefix(key: str) -> int:  # index in ALIAS_PREFIXES, -1 for other keys
        return next((i for i, p in enumerate(ALIAS_PREFIXES) if key.startswith(p)), -1)

    shown: set[tuple[str, tuple]] = set()
    out = []
    for k in sorted(varying, key=prefix):
        i = prefix(k)
        if i >= 0:
            alias = (k[len(ALIAS_PREFIXES[i]):], tuple(r.params.get(k) for r in rows))
            if alias in shown:
                continue
            shown.add(alias)
        out.append(k)
    return sorted(out)


def sort_rows(rows: list[RunRow], metric: str, descending: bool | None = None) -> list[RunRow]:
    """Runs with the metric first, best first; runs without it last, newest first."""
    desc = higher_is_better(metric) if descending is None else descending
    have = [r for r in rows if metric in r.metrics and math.isfinite(r.metrics[metric])]
    lack = sorted((r for r in rows if r not in have), key=lambda r: -(r.start_time or 0))
    return sorted(have, key=lambda r: r.metrics[metric], reverse=desc) + lack


def comparison(uri: str, experiment: str, metric: str = DEFAULT_METRIC, descending: bool | None = None) -> dict[str, Any]:
    """Everything ``pvm-dist compare`` shows, as JSON-able data."""
    rows = load_runs(uri, experiment)
    if rows and not any(metric in r.metrics for r in rows):
        known = sorted({m for r in rows for m in r.metrics})
        raise CompareError(f"no run of {experiment!r} has metric {metric!r} (metrics: {', '.join(known) or 'none'})")
    varying = differing_params(rows)
    ordered = sort_rows(rows, metric, descending)
    return {
        "experiment": experiment,
        "metric": metric,
        "descending": higher_is_better(metric) if descending is None else descending,
        "differing_params": varying,
        "runs": [
            {"run_id": r.run_id, "name": r.name, "status": r.status, "params": {k: r.params.get(k) for k in varying},
             "metric": r.metrics.get(metric), "frames_per_s": r.metrics.get(SPEED_METRIC), "metrics": r.metrics}
            for r in ordered
        ],
    }


def plot_curves(uri: str, run_ids: list[str], names: list[str], metric: str, path: Path) -> Path:
    """Learning curves (metric against step) of the given runs, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    client = _client(uri)
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for run_id, name in zip(run_ids, names):
        history = sorted(client.get_metric_history(run_id, metric), key=lambda m: m.step)
        if history:
            ax.plot([m.step for m in history], [m.value for m in history], label=name)
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric} of the top {len(run_ids)} runs")
    ax.grid(alpha=0.3)
    if run_ids:
        ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
