"""The README's pictures of MLflow's UI, taken with headless Chromium against ``mlflow ui`` over a real store.

    mlflow ui --backend-store-uri sqlite:///mlflow.db --host 127.0.0.1 --port 5077 &
    python dev/mlflow_ui/screenshots.py --url http://127.0.0.1:5077 --experiment quickstart --out docs

It opens the experiment as a person would: the model-training view, the assistant panel closed, the sweep's
parent run expanded to its trials, and the metric and varied-parameter columns picked; then the best
trial's page (its overview with the dataset and the reproducing command, its metric charts, its image
series with the step slider, and its artifacts with the animation). Look at every picture it writes.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from pathlib import Path

from cdp import Browser

COLUMNS = ("ratio_two_step", "ratio_background_two_step", "frames_per_s", "varied.momentum")


def api(url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(f"{url}/ajax-api/2.0/mlflow/{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def visible_text(text: str, tag: str = "*") -> str:
    """A JavaScript expression: the innermost visible element whose text is ``text``."""
    return (f"Array.from(document.querySelectorAll('{tag}')).reverse().find(e => e.offsetParent && "
            f"(e.innerText || '').trim() === {json.dumps(text)})")


def by_component(suffix: str) -> str:
    return f"document.querySelector('[data-component-id$={json.dumps(suffix)}]')"


KEY_CODES = {"Escape": 27, "End": 35, "Enter": 13}


def key(b: Browser, name: str) -> None:
    """Press and release a key in the focused element."""
    for kind in ("keyDown", "keyUp"):
        b.send("Input.dispatchKeyEvent", {"type": kind, "key": name, "code": name, "windowsVirtualKeyCode": KEY_CODES[name]})
    time.sleep(0.5)


def move_slider(b: Browser) -> None:
    """Drag the first slider's thumb along its track, as a mouse would: MLflow's image slider starts at step 0,
    where nothing was logged, and shows a picture once it is moved (it lands on a logged step)."""
    x0, y, x1 = b.eval("(() => { const t = document.querySelector('[role=slider]'); const r = t.getBoundingClientRect();"
                       " const track = t.closest('[data-orientation]').parentElement.getBoundingClientRect();"
                       " return [r.x + r.width / 2, r.y + r.height / 2, track.right + 40]; })()")
    b.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x0, "y": y})
    b.send("Input.dispatchMouseEvent", {"type": "mousePressed", "x": x0, "y": y, "button": "left", "clickCount": 1})
    for i in range(1, 11):
        b.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x0 + (x1 - x0) * i / 10, "y": y, "button": "left",
                                            "buttons": 1})
    b.send("Input.dispatchMouseEvent", {"type": "mouseReleased", "x": x1, "y": y, "button": "left", "clickCount": 1})


def settle(b: Browser, seconds: float = 2.0) -> None:
    """Wait, then close whatever menu is open."""
    time.sleep(seconds)
    key(b, "Escape")


def type_into(b: Browser, selector: str, text: str) -> None:
    """Replace the text of the input ``selector`` finds, as typed."""
    b.click(f"document.querySelector({json.dumps(selector)})")
    b.eval(f"document.querySelector({json.dumps(selector)}).select()")
    b.send("Input.insertText", {"text": text})
    time.sleep(1)


def loaded(b: Browser, timeout: float = 90.0) -> None:
    """Wait until no chart shows its loading spinner."""
    time.sleep(2)
    b.wait_for("!document.querySelector('[class*=spin], [data-testid*=spinner], [aria-busy=true]')", timeout)
    time.sleep(2)


def open_runs(b: Browser, url: str, exp_id: str) -> None:
    """The experiment's runs in MLflow's model-training navigation (not GenAI), the assistant panel closed
    (the browser keeps both for the pages opened after)."""
    b.goto(f"{url}/#/experiments/{exp_id}/runs")
    b.wait_for("document.body.innerText.includes('Run Name')", 120)
    time.sleep(2)
    b.click(visible_text("Model training", "div"))
    b.click(by_component("mlflow.assistant.chat_panel.close"))
    b.wait_for("document.body.innerText.includes('Run Name')", 120)
    time.sleep(2)


def runs_view(b: Browser, out: Path) -> None:
    b.click(by_component("runnamecellrenderer.tsx_46"))  # the parent run's expander
    b.click(by_component("experimentviewrunscolumnselector.tsx_315"))
    time.sleep(1)
    for name in (*COLUMNS, "Models"):  # the metric and parameter columns on, MLflow's empty Models column off
        if not b.click(visible_text(name, "label") + " || " + visible_text(name)):
            raise SystemExit(f"no column {name!r} in the column picker")
    settle(b)
    b.screenshot(out / "mlflow-sweep-runs.png")


def trial_views(b: Browser, url: str, exp_id: str, run_id: str, out: Path) -> None:
    base = f"{url}/#/experiments/{exp_id}/runs/{run_id}"
    b.goto(base)
    b.wait_for("document.body.innerText.includes('pvm_dist.command')", 120)
    settle(b)
    b.screenshot(out / "mlflow-trial-run.png")
    b.click(visible_text("Model metrics"))
    b.wait_for("document.body.innerText.includes('background_one_step_px')", 120)
    type_into(b, "input[placeholder='Search metric charts']", "two_step_px")  # the model beside both baselines
    loaded(b)
    b.screenshot(out / "mlflow-trial-charts.png")
    type_into(b, "input[placeholder='Search metric charts']", "prediction")  # the image series
    time.sleep(2)
    move_slider(b)
    key(b, "End")  # the thumb has focus now
    b.wait_for("Array.from(document.querySelectorAll('img')).some(e => e.src.includes('get-artifact') && e.complete)", 60)
    # MLflow lists the run's params above the picture, which pushes it below the card's edge: bring it into view.
    b.eval("document.querySelector('img[src*=get-artifact]').scrollIntoView({block: 'end'})")
    time.sleep(2)
    b.screenshot(out / "mlflow-trial-images.png")
    b.click(visible_text("Artifacts"))
    time.sleep(3)
    b.click(visible_text("prediction.gif"))
    settle(b, 4)
    b.screenshot(out / "mlflow-trial-artifacts.png")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:5077")
    ap.add_argument("--experiment", default="quickstart")
    ap.add_argument("--out", type=Path, default=Path("docs"))
    ap.add_argument("--only", choices=("runs", "trial"), default=None)
    args = ap.parse_args()
    exps = api(args.url, "experiments/search", {"max_results": 1000})["experiments"]
    exp_id = next(e["experiment_id"] for e in exps if e["name"] == args.experiment)
    runs = api(args.url, "runs/search", {"experiment_ids": [exp_id], "max_results": 1000,
                                         "filter": "tags.mlflow.parentRunId != ''",
                                         "order_by": ["metrics.ratio_two_step ASC"]}).get("runs", [])
    best = runs[0]["info"]["run_id"]
    b = Browser()
    try:
        open_runs(b, args.url, exp_id)
        if args.only in (None, "runs"):
            runs_view(b, args.out)
        if args.only in (None, "trial"):
            trial_views(b, args.url, exp_id, best, args.out)
    finally:
        b.close()


if __name__ == "__main__":
    main()
