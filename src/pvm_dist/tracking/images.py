"""Pictures as an MLflow image series: the files ``MlflowClient.log_image(run_id, image, key=..., step=...)``
writes, made here so that they travel through the tracker's durable, non-blocking queue like every other
artifact. The run page's Images view then shows each key with a step slider (MLflow reads the step from
the file name and shows the small WebP preview in its grid)."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

from typing import Any

import cv2
import numpy as np

ARTIFACT_PATH = "images"  # where MLflow looks for a run's image series
LOGGED_IMAGES_TAG = "mlflow.loggedImages"  # the tag that makes the UI look there
PREVIEW_SIDE = 256  # the preview's longer side in pixels, as MLflow's own


def image_series_files(png: Path, key: str, step: int, folder: Path) -> list[Path]:
    """The full-size PNG and its WebP preview for ``key`` at ``step``, named as MLflow names them, in ``folder``.

    The names come from the picture itself (its time and a hash of its bytes, where MLflow puts a log time and a
    random id), so logging the same picture again writes the same artifacts: a run finished after a kill logs its
    last picture again without a second entry at that step, whether or not the killed process delivered it."""
    folder.mkdir(parents=True, exist_ok=True)
    data = png.read_bytes()
    stamp = png.stat().st_mtime_ns // 1_000_000
    ident = uuid.UUID(bytes=hashlib.sha256(data).digest()[:16])
    base = f"{key.replace('/', '~')}+step+{step}+timestamp+{stamp}+{ident}"
    full = folder / f"{base}.png"
    full.write_bytes(data)
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)  # the bytes already read
    h, w = image.shape[:2]
    scale = PREVIEW_SIDE / max(h, w)
    preview = folder / f"{base}+compressed.webp"
    cv2.imwrite(str(preview), cv2.resize(image, (max(1, round(w * scale)), max(1, round(h * scale))),
                                         interpolation=cv2.INTER_AREA))
    return [full, preview]


def log_image_series(tracker: Any, png: Path, step: int, folder: Path, key: str = "prediction") -> None:
    """Log ``png`` as step ``step`` of the run's ``key`` image series (files staged in ``folder``)."""
    for path in image_series_files(png, key, step, folder):
        tracker.log_artifact(path, ARTIFACT_PATH)
    tracker.set_tags({LOGGED_IMAGES_TAG: "true"})
