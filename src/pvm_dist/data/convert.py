"""Shared frame and label conversions (``pvm-algorithm.md`` §5).

Frames: decoded to uint8 BGR, resized to the model's D×D with bicubic interpolation (``cv2.INTER_CUBIC``,
uint8, saturating), the aspect ratio not kept; a one-channel model gets the resized frame converted to grey.
Labels: boxes ``x, y, w, h`` in original pixels are scaled as the original does, ``int(x · (D/W0))`` etc.;
the mask is a filled rectangle from (row y, col x) to (row y+h, col x+w), both ends inclusive, clipped to
the frame; a box with x < 0 means the target is absent (boxes then hold -1, the mask is all zero).
"""

from __future__ import annotations

import numpy as np

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".jpe", ".png", ".bmp", ".dib", ".tif", ".tiff", ".webp",
                              ".ppm", ".pgm", ".pbm", ".pnm", ".pxm", ".jp2", ".sr", ".ras", ".pfm", ".hdr",
                              ".pic", ".exr", ".avif"})
ABSENT = (-1, -1, -1, -1)


def check_shape(image_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """``(H, W, C)`` as ints, C being 1 (grey) or 3 (BGR)."""
    h, w, c = (int(v) for v in image_shape)
    if h < 1 or w < 1 or c not in (1, 3):
        raise ValueError(f"image shape must be (H, W, 1 or 3) with H, W >= 1, got {tuple(image_shape)}")
    return h, w, c


def fit_frame(img: np.ndarray, image_shape: tuple[int, int, int]) -> np.ndarray:
    """A decoded uint8 BGR (or grey) image resized bicubically to ``image_shape`` [H, W, C]."""
    import cv2

    h, w, c = image_shape
    if img.ndim == 2:
        img = cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
    elif img.shape[2] == 4:
        img = cv2.cvtColor(img, cv2.COLOR_BGRA2BGR)
    if img.shape[0] != h or img.shape[1] != w:
        img = cv2.resize(img, dsize=(w, h), interpolation=cv2.INTER_CUBIC)
    if c == 1:
        return cv2.cvtColor(img, cv2.COLOR_BGR2GRAY)[:, :, None]
    return np.ascontiguousarray(img)


def scale_boxes(raw: np.ndarray, original_hw: tuple[int, int], image_shape: tuple[int, int, int]) -> np.ndarray:
    """Boxes [N, 4] in original pixels -> int32 [N, 4] in model pixels, -1 rows where x < 0 (absent).

    As the original: ``int(v * (D / W0))`` (the factor is computed first, then the product truncated).
    """
    h0, w0 = original_hw
    fw, fh = image_shape[1] / float(w0), image_shape[0] / float(h0)
    out = np.full((len(raw), 4), -1, np.int32)
    for i, (x, y, w, h) in enumerate(raw):
        if x >= 0:
            out[i] = (int(x * fw), int(y * fh), int(w * fw), int(h * fh))
    return out


def box_masks(boxes: np.ndarray, image_shape: tuple[int, int, int]) -> np.ndarray:
    """float32 [..., H, W] masks of boxes [..., 4]: 1.0 inside each box (both ends inclusive, clipped), 0
    elsewhere or if absent. One outer product of row and column indicators per box, no loop over boxes."""
    h, w = image_shape[0], image_shape[1]
    b = np.asarray(boxes, dtype=np.int64)
    x, y, bw, bh = (b[..., i, None] for i in range(4))
    present = x >= 0
    rows = (present & (np.arange(h) >= y) & (np.arange(h) <= y + bh)).astype(np.float32)
    cols = (present & (np.arange(w) >= x) & (np.arange(w) <= x + bw)).astype(np.float32)
    return rows[..., :, None] * cols[..., None, :]
