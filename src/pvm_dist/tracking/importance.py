"""``pvm-dist compare --importance``: which of the varied parameters decide a sweep's result.

The finished runs of a comparison become the completed trials of an in-memory Optuna study (each
varied parameter a categorical choice, or a float range where a search drew many distinct values) and
Optuna's PED-ANOVA evaluator scores how strongly each parameter's values differ between the best
quarter of the runs and all of them. PED-ANOVA is built into Optuna with nothing else to install
(Optuna's fANOVA and mean-decrease-impurity evaluators need scikit-learn). Runs stopped early, failed
or killed are left out: their metric is from another step. With fewer than :data:`MIN_TRIALS` finished
runs nothing is computed and the result says how many are needed.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

#: Finished runs needed before importances are computed: the best quarter is then at least two runs.
MIN_TRIALS = 8
#: The "good" runs PED-ANOVA contrasts with all of them: the best quarter.
TARGET_QUANTILE = 0.25
#: A numeric parameter with more distinct values than this is a range (a random or adaptive search);
#: with fewer it is a grid's choice.
MAX_CHOICES = 6


def _number(value: str) -> float | None:
    try:
        out = float(value)
    except ValueError:
        return None
    return out if math.isfinite(out) else None


def _distribution(values: list[str]) -> Any:
    """The Optuna distribution a parameter's logged values came from, as near as they tell."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    distinct = sorted(set(values))
    numbers = [_number(v) for v in distinct]
    if len(distinct) > MAX_CHOICES and all(n is not None for n in numbers):
        low, high = min(numbers), max(numbers)  # type: ignore[type-var]
        return FloatDistribution(low, high, log=low > 0 and high / low >= 10)
    return CategoricalDistribution(distinct)


def _value(dist: Any, value: str) -> Any:
    from optuna.distributions import FloatDistribution

    return float(value) if isinstance(dist, FloatDistribution) else value


def importances(runs: list[dict[str, Any]], columns: dict[str, str], descending: bool) -> dict[str, Any]:
    """Importances of the varied parameters (``columns``: param → short name) over the finished ``runs``
    of :func:`pvm_dist.tracking.compare.comparison`, each with its value in the best run; or, with too
    few finished runs, how many there are and how many are needed."""
    finished = [r for r in runs if r["ended"] == "finished" and r["metric"] is not None and math.isfinite(r["metric"])]
    out: dict[str, Any] = {"method": "PED-ANOVA (Optuna)", "target_quantile": TARGET_QUANTILE,
                           "finished": len(finished), "needed": MIN_TRIALS, "params": []}
    if len(finished) < MIN_TRIALS:
        return out
    import optuna
    from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances

    values = {k: [r["params"][k] for r in finished if r["params"].get(k) is not None] for k in columns}
    dists = {k: _distribution(v) for k, v in values.items() if len(set(v)) > 1}
    trials = [optuna.trial.create_trial(
        params={k: _value(d, r["params"][k]) for k, d in dists.items() if r["params"].get(k) is not None},
        distributions={k: d for k, d in dists.items() if r["params"].get(k) is not None},
        value=r["metric"]) for r in finished]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize" if descending else "minimize")
    study.add_trials(trials)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # experimental-feature and few-trials notices: the table says it
        raw = get_param_importances(study, evaluator=PedAnovaImportanceEvaluator(target_quantile=TARGET_QUANTILE),
                                    normalize=False) if dists else {}
    total = sum(raw.values())
    best = min(finished, key=lambda r: -r["metric"] if descending else r["metric"])
    for k in sorted(columns, key=lambda k: -raw.get(k, -1.0)):
        out["params"].append({"param": k, "name": columns[k],
                              "importance": (raw[k] / total if total > 0 else 0.0) if k in raw else None,
                              "best_value": best["params"].get(k), "values": len(set(values[k]))})
    return out
