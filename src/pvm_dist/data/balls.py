"""``synthetic:balls``: coloured balls bouncing over a slowly panning textured background.

Every stream is its own scene, drawn from ``(seed, stream)``: a smooth random texture twice the frame's
size, of which a window pans (bouncing between the texture's edges), one **green** ball (BGR 0, 200, 0: the
tracked target) and ``n_distractors`` balls of other colours. Motion is closed-form: each coordinate moves
linearly and is reflected at the walls (a triangle wave), so any step is drawn directly (random access, no
state) and a resumed run sees exactly the same frames. Ball centres are rounded to whole pixels and balls
are drawn without antialiasing, the green one last (never occluded), so its label is exact: the box is
``(cx − r, cy − r, 2r, 2r)`` in the PVM convention (the mask covers x…x+w and y…y+h inclusive, which is
exactly the drawn disc's extent). The texture has every channel ≥ 40, so no background pixel equals the
target colour. Balls stay wholly inside the frame; the target is never absent.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pvm_dist.data.convert import box_masks, check_shape

TARGET_COLOR = (0, 200, 0)  # BGR green
DISTRACTOR_COLORS = [(0, 0, 220), (220, 40, 0), (0, 215, 235), (200, 0, 200), (245, 245, 245), (0, 120, 255),
                     (120, 60, 0), (30, 30, 30)]  # red, blue, yellow, magenta, white, orange, navy, black


def _reflect(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """``x`` folded into [lo, hi] as a point bouncing between two walls."""
    span = np.maximum(hi - lo, 0)
    period = np.where(span > 0, 2 * span, 1)
    y = np.mod(x - lo, period)
    return lo + np.where(y <= span, y, period - y) * (span > 0)


class BallSource:
    """Moving balls with the green one's bounding box as the label (see the module docstring)."""

    kind = "synthetic"

    def __init__(self, image_shape: tuple[int, int, int], n_seq: int, seed: int, n_distractors: int = 3) -> None:
        import cv2

        self.name, self.shape, self.n_seq, self.seed = "synthetic:balls", check_shape(image_shape), n_seq, seed
        self.n_distractors = n_distractors
        h, w, _ = self.shape
        d = min(h, w)
        nb = 1 + n_distractors
        rmin = max(1, round(0.05 * d))
        rmax = max(rmin, round(0.12 * d))
        self.textures, radii, p0, vel, pan0, panv, colors = [], [], [], [], [], [], []
        for i in range(n_seq):
            rng = np.random.default_rng([seed, i, 0xBA11])
            big = (2 * h, 2 * w)
            tex = cv2.resize(rng.uniform(70, 190, (5, 5, 3)), (big[1], big[0]), interpolation=cv2.INTER_CUBIC)
            tex += cv2.resize(rng.uniform(-30, 30, (14, 14, 3)), (big[1], big[0]), interpolation=cv2.INTER_CUBIC)
            tex += rng.uniform(-12, 12, (*big, 3))
            self.textures.append(np.clip(tex, 40, 230).astype(np.uint8))
            r = rng.integers(rmin, rmax + 1, nb)
            radii.append(r)
            p0.append(rng.uniform(0, 1, (nb, 2)) * [w, h])
            speed = rng.uniform(0.3, 1.2, nb) * d / 60.0
            angle = rng.uniform(0, 2 * np.pi, nb)
            vel.append(np.stack([speed * np.cos(angle), speed * np.sin(angle)], axis=1))
            pan0.append(rng.uniform(0, 1, 2) * [w, h])
            panv.append(rng.uniform(0.05, 0.25, 2) * rng.choice([-1, 1], 2) * d / 60.0)
            order = rng.permutation(len(DISTRACTOR_COLORS))
            colors.append([TARGET_COLOR] + [DISTRACTOR_COLORS[order[k % len(order)]] for k in range(n_distractors)])
        self.radii = np.array(radii, np.int64)  # [n_seq, nb]
        self._p0, self._vel = np.array(p0), np.array(vel)  # [n_seq, nb, 2] (x, y)
        self._lo = self.radii[..., None].astype(float)
        self._hi = np.stack([w - 1 - self.radii, h - 1 - self.radii], axis=-1).astype(float)
        self._pan0, self._panv = np.array(pan0), np.array(panv)  # [n_seq, 2]
        self._pan_hi = np.array([w, h], float)
        self.colors = colors

    def centres(self, step: int) -> np.ndarray:
        """int [n_seq, nb, 2] ball centres (x, y) at ``step``; ball 0 is the green target."""
        pos = _reflect(self._p0 + self._vel * float(step), self._lo, self._hi)
        return np.floor(pos + 0.5).astype(np.int64)

    def _pan(self, step: int) -> np.ndarray:
        return np.floor(_reflect(self._pan0 + self._panv * float(step), 0.0, self._pan_hi) + 0.5).astype(np.int64)

    def frames(self, step: int) -> np.ndarray:
        import cv2

        h, w, c = self.shape
        out = np.empty((self.n_seq, h, w, 3), np.uint8)
        centres, pans = self.centres(step).tolist(), self._pan(step).tolist()
        radii = self.radii.tolist()
        for i in range(self.n_seq):
            ox, oy = pans[i]
            img = out[i]
            img[...] = self.textures[i][oy : oy + h, ox : ox + w]
            cols, rs, cs = self.colors[i], radii[i], centres[i]
            for k in range(len(rs) - 1, -1, -1):  # distractors first, the green target last (on top)
                cv2.circle(img, (cs[k][0], cs[k][1]), rs[k], cols[k], -1, cv2.LINE_8)
        if c == 1:
            return np.stack([cv2.cvtColor(f, cv2.COLOR_BGR2GRAY)[:, :, None] for f in out])
        return out

    def boxes(self, step: int) -> np.ndarray:
        """int32 [n_seq, 4] box (x, y, w, h) of the green ball."""
        cx, r = self.centres(step)[:, 0], self.radii[:, 0]
        return np.stack([cx[:, 0] - r, cx[:, 1] - r, 2 * r, 2 * r], axis=1).astype(np.int32)

    def labels(self, step: int) -> np.ndarray:
        return box_masks(self.boxes(step), self.shape)

    def cuts(self, step: int) -> np.ndarray:
        """True for every stream at step 0 only: the scenes run on without breaks."""
        return np.full(self.n_seq, step == 0)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "files": [], "frames": None, "labelled": True,
                "n_seq": self.n_seq, "image_shape": list(self.shape), "seed": self.seed,
                "balls": 1 + self.n_distractors, "target": "green ball (BGR 0,200,0)"}
