"""Pictures of a PVM at work: the input, the predicted frame, where prediction fails, the hidden maps.

This is the original's display (pvm-algorithm.md §6) as files: :func:`picture_grid` draws one BGR
picture of a step, :class:`Animation` writes input | prediction side by side as a GIF or MP4.

Alignment: outputs are produced at step s from the frames up to s. The first half of each layer-0
unit's outputs (``ahead=2``) is the prediction of the frame of step **s+2**, the second half
(``ahead=1``) of step s+1. So to compare a prediction with what it predicts, keep it two steps and
pair it with the frame that arrives then::

    pending = collections.deque(maxlen=2)
    for s in range(n_steps):
        frames = source.frames(s)
        if len(pending) == 2:                          # made at step s-2, predicts frame s
            animation.add(frames[0], pending[0])
        engine.step(frames)
        pending.append(predicted_frame(topology, engine.prediction()[0]))
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import cv2
import numpy as np

from pvm_dist.model.topology import Topology

#: Default height in pixels of every panel of a picture, and smallest side of an animation frame.
PANEL = 160
#: BGR colours: separators between hidden tiles, panel titles, label box, background.
SEPARATOR = (96, 48, 0)
TITLE_BG, TITLE_FG = (40, 40, 40), (255, 255, 255)
BOX = (0, 255, 0)
BACKGROUND = (24, 24, 24)
_FONT, _SCALE, _TITLE_H, _GAP = cv2.FONT_HERSHEY_SIMPLEX, 0.45, 20, 8


def decompress(v: float | np.ndarray) -> float | np.ndarray:
    """Undo the compression 0.8·x + 0.1 of the network's units: (v − 0.1)/0.8, clipped to [0, 1]."""
    out = np.clip((np.asarray(v, np.float32) - np.float32(0.1)) / np.float32(0.8), 0.0, 1.0)
    return float(out) if out.ndim == 0 else out


def predicted_frame(topology: Topology, outputs_row: np.ndarray, ahead: int = 2) -> np.ndarray:
    """The frame predicted ``ahead`` (2 or 1) steps after the step that produced ``outputs_row``.

    ``outputs_row`` is one sequence's outputs [ΣM] (``engine.prediction()[i]``). Each layer-0 unit
    puts its prediction of its own b×b×C patch back where the frame patch came from; the result is
    uint8 [D, D, C], ``round(255·decompress(y))``.
    """
    if ahead not in (1, 2):
        raise ValueError(f"ahead must be 1 or 2 (steps), got {ahead!r}")
    outputs_row = np.asarray(outputs_row)
    if outputs_row.shape != (topology.y_total,):
        raise ValueError(f"outputs_row has shape {outputs_row.shape}, expected ({topology.y_total},) for one sequence")
    unit = np.searchsorted(topology.x_off, topology.frame_dst, side="right") - 1
    offset = topology.frame_dst - topology.x_off[unit]  # position in the unit's new signal
    if ahead == 1:
        offset = offset + topology.signal[unit]
    image = np.empty(int(np.prod(topology.spec.image_shape)), np.uint8)
    image[topology.frame_src] = _to_uint8(decompress(outputs_row[topology.y_off[unit] + offset]))
    return image.reshape(topology.spec.image_shape)


def error_map(frame_uint8: np.ndarray, predicted_uint8: np.ndarray) -> np.ndarray:
    """|frame − prediction| per pixel (mean over channels) as a heat map, BGR uint8 [D, D, 3].

    The scale is absolute (0 → black, 255 → pale yellow; cv2 INFERNO), so pictures compare.
    """
    frame, predicted = _check_uint8(frame_uint8, "frame"), _check_uint8(predicted_uint8, "predicted")
    if frame.shape != predicted.shape:
        raise ValueError(f"frame {frame.shape} and prediction {predicted.shape} differ in shape")
    diff = np.abs(frame.astype(np.int16) - predicted.astype(np.int16))
    diff = diff.mean(axis=-1) if diff.ndim == 3 else diff
    return cv2.applyColorMap(np.rint(diff).astype(np.uint8), cv2.COLORMAP_INFERNO)


def hidden_tiles(topology: Topology, hidden_row: np.ndarray) -> list[np.ndarray]:
    """Every layer's hidden activations as a BGR uint8 picture, one per layer.

    Unit (r, c)'s H = h×h activations become an h×h grey tile (row-major, ``min(255, round(255·h))``
    as the original) at tile position (r, c) of the layer's S×S grid; tiles are separated by one
    pixel of :data:`SEPARATOR` colour, so a layer is S·h + S − 1 pixels wide.
    """
    H = topology.hidden
    h = math.isqrt(H)
    hidden_row = np.asarray(hidden_row)
    if hidden_row.shape != (topology.n_units * H,):
        raise ValueError(f"hidden_row has shape {hidden_row.shape}, expected ({topology.n_units * H},)")
    grey = np.minimum(255, np.rint(255 * hidden_row.astype(np.float64))).astype(np.uint8).reshape(-1, h, h)
    pictures = []
    for layer, S in enumerate(topology.spec.layer_shapes):
        side = S * h + S - 1
        picture = np.empty((side, side, 3), np.uint8)
        picture[:] = SEPARATOR
        first = int(topology.layer_offsets[layer])
        for k in range(S * S):
            r, c = divmod(k, S)
            picture[r * (h + 1) : r * (h + 1) + h, c * (h + 1) : c * (h + 1) + h] = grey[first + k, :, :, None]
        pictures.append(picture)
    return pictures


def picture_grid(
    frame: np.ndarray,
    predicted: np.ndarray,
    topology: Topology,
    hidden_row: np.ndarray,
    heatmap: np.ndarray | None = None,
    label_box: Sequence[int] | None = None,
    caption: Mapping[str, object] | None = None,
    panel: int = PANEL,
) -> np.ndarray:
    """One BGR picture of a step: input, prediction, error, optional readout, then each layer's hidden tiles.

    ``frame`` and ``predicted`` are uint8 [D, D, C] of the same step (see the module's alignment
    note). ``heatmap`` is a readout heatmap, float [D, D] in [0, 1], shown over the input;
    ``label_box`` is (x, y, w, h) in frame pixels, ends inclusive, as in the data's label files
    (negative: no target), drawn on the input and readout panels. ``caption`` items are written
    as ``key: value`` under the panels. Every panel is scaled (nearest neighbour) to ``panel``
    pixels high, under a title.
    """
    frame, predicted = _check_uint8(frame, "frame"), _check_uint8(predicted, "predicted")
    D = frame.shape[0]
    mae = float(np.abs(frame.astype(np.int16) - predicted.astype(np.int16)).mean())
    top = [("input", _with_box(_scale(_bgr(frame), panel), label_box, panel / D)),
           ("prediction", _scale(_bgr(predicted), panel)),
           (f"error, mean {mae:.1f}/255", _scale(error_map(frame, predicted), panel))]
    if heatmap is not None:
        heat = np.asarray(heatmap, np.float64)
        if heat.shape != frame.shape[:2]:
            raise ValueError(f"heatmap has shape {heat.shape}, expected {frame.shape[:2]}")
        colours = cv2.applyColorMap(_to_uint8(np.clip(heat, 0.0, 1.0)), cv2.COLORMAP_JET)
        overlay = cv2.addWeighted(_bgr(frame), 0.5, colours, 0.5, 0.0)
        top.append(("readout", _with_box(_scale(overlay, panel), label_box, panel / D)))
    layers = [(f"layer {k} ({S}x{S})", _scale(tiles, panel))
              for k, (S, tiles) in enumerate(zip(topology.spec.layer_shapes, hidden_tiles(topology, hidden_row)))]
    rows = [_row(top), _row(layers)]
    width = max(r.shape[1] for r in rows) + 2 * _GAP
    text = [drawable(f"{key}: {_fmt(value)}") for key, value in (caption or {}).items()]
    lines = _wrap(text, width - 2 * _GAP)
    canvas = np.empty((sum(r.shape[0] + _GAP for r in rows) + _GAP + 18 * len(lines), width, 3), np.uint8)
    canvas[:] = BACKGROUND
    y = _GAP
    for r in rows:
        canvas[y : y + r.shape[0], _GAP : _GAP + r.shape[1]] = r
        y += r.shape[0] + _GAP
    for line in lines:
        cv2.putText(canvas, line, (_GAP, y + 12), _FONT, _SCALE, TITLE_FG, 1, cv2.LINE_AA)
        y += 18
    return canvas


class Animation:
    """Collects (input, prediction) frame pairs and writes them side by side as a GIF or MP4.

    Pair each prediction with the frame it predicts (module docstring). At most ``max_frames``
    pairs are kept, evenly spaced: every stride-th pair added, the stride doubling (every other
    kept pair dropped) whenever more would be held, so a long run keeps between max_frames/2 and
    max_frames pairs in bounded memory. Frames are scaled up by a whole factor to at least
    ``min_side`` pixels.
    """

    def __init__(self, fps: float = 10.0, max_frames: int = 300, min_side: int = PANEL) -> None:
        if max_frames < 1:
            raise ValueError(f"max_frames must be at least 1, got {max_frames}")
        self.fps, self.max_frames, self.min_side = fps, max_frames, min_side
        self._pairs: list[tuple[np.ndarray, np.ndarray]] = []
        self._stride, self._added = 1, 0

    def add(self, frame: np.ndarray, predicted: np.ndarray) -> None:
        """Add the input frame and the prediction of it (both uint8 [D, D, C])."""
        frame, predicted = _check_uint8(frame, "frame"), _check_uint8(predicted, "predicted")
        if frame.shape != predicted.shape:
            raise ValueError(f"frame {frame.shape} and prediction {predicted.shape} differ in shape")
        if self._added % self._stride == 0:
            self._pairs.append((frame.copy(), predicted.copy()))
            if len(self._pairs) > self.max_frames:
                self._pairs, self._stride = self._pairs[::2], 2 * self._stride
        self._added += 1

    def __len__(self) -> int:
        """Frames :meth:`save` writes."""
        return len(self._pairs)

    def save(self, path: str | Path) -> Path:
        """Write ``.gif`` (needs Pillow) or ``.mp4`` (OpenCV, 'mp4v'); returns the path."""
        path = Path(path)
        if not self._pairs:
            raise ValueError("no frames added to the animation")
        images = [self._compose(frame, predicted) for frame, predicted in self._pairs]
        suffix = path.suffix.lower()
        if suffix == ".gif":
            try:
                from PIL import Image
            except ImportError as err:
                raise RuntimeError("writing a GIF needs Pillow (pip install Pillow); or save as .mp4") from err
            rgb = [Image.fromarray(cv2.cvtColor(im, cv2.COLOR_BGR2RGB)) for im in images]
            rgb[0].save(path, save_all=True, append_images=rgb[1:], duration=round(1000 / self.fps), loop=0)
        elif suffix == ".mp4":
            try:  # OpenCV crashes on a path that is not valid UTF-8
                str(path).encode("utf-8")
            except UnicodeEncodeError:
                raise OSError(f"cannot write {ascii(str(path))}: OpenCV needs a file name that is valid UTF-8") from None
            height, width = images[0].shape[:2]
            writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), self.fps, (width, height))
            if not writer.isOpened():
                raise RuntimeError(f"OpenCV could not open an mp4v video writer for {path}")
            for im in images:
                writer.write(im)
            writer.release()
        else:
            raise ValueError(f"unsupported animation format {path.suffix!r}: use .gif or .mp4")
        return path

    def _compose(self, frame: np.ndarray, predicted: np.ndarray) -> np.ndarray:
        """Titled input and prediction side by side, scaled by a whole factor, sides even (codecs want them)."""
        k = max(1, -(-self.min_side // frame.shape[0]))
        side = frame.shape[0] * k + frame.shape[0] * k % 2
        panels = []
        for title, image in (("input", frame), ("prediction", predicted)):
            square = np.empty((side, side, 3), np.uint8)
            square[:] = BACKGROUND
            square[: image.shape[0] * k, : image.shape[1] * k] = cv2.resize(
                _bgr(image), None, fx=k, fy=k, interpolation=cv2.INTER_NEAREST)
            panels.append((title, square))
        return _row(panels)


# --- helpers --------------------------------------------------------------------------------------
def _to_uint8(unit: np.ndarray) -> np.ndarray:
    """[0, 1] floats → uint8, rounded to nearest (a diverged model's NaN shows black, ±Inf white/black)."""
    unit = np.nan_to_num(np.asarray(unit, np.float64), nan=0.0, posinf=1.0, neginf=0.0)
    return np.rint(255 * unit).astype(np.uint8)


#: Longest caption item drawn; OpenCV's Hershey fonts draw printable ASCII only.
_MAX_TEXT = 120


def drawable(text: str) -> str:
    """``text`` as OpenCV can draw it: printable ASCII ('?' for anything else, lone surrogates included:
    OpenCV's text functions crash on strings that are not valid UTF-8), at most ``_MAX_TEXT`` characters."""
    out = "".join(c if " " <= c <= "~" else "?" for c in text)
    return out if len(out) <= _MAX_TEXT else out[: _MAX_TEXT - 3] + "..."


def write_image(path: str | Path, image: np.ndarray) -> Path:
    """Write ``image`` (BGR uint8) to ``path`` by its suffix; OSError naming the file if it is not written."""
    path = Path(path)
    try:  # encoded here, written by Python: OpenCV crashes on a path that is not valid UTF-8
        ok, data = cv2.imencode(path.suffix or ".png", image)
    except cv2.error as exc:
        raise OSError(f"cannot write picture {ascii(str(path))}: {' '.join(str(exc).split())}") from None
    if not ok:
        raise OSError(f"cannot write picture {ascii(str(path))}: OpenCV cannot encode {path.suffix!r}")
    try:
        path.write_bytes(data.tobytes())
    except OSError as exc:
        raise OSError(f"cannot write picture {ascii(str(path))}: {exc.strerror or exc}") from None
    return path


def _check_uint8(image: np.ndarray, name: str) -> np.ndarray:
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.ndim not in (2, 3):
        raise TypeError(f"{name} must be a uint8 image [D, D] or [D, D, C], got {image.dtype} {image.shape}")
    return image


def _bgr(image: np.ndarray) -> np.ndarray:
    """A 3-channel BGR view for display: grey is repeated, a 4th (depth) channel is dropped."""
    if image.ndim == 2 or image.shape[2] == 1:
        return cv2.cvtColor(image.reshape(image.shape[:2]), cv2.COLOR_GRAY2BGR)
    return np.ascontiguousarray(image[:, :, :3])


def _scale(image: np.ndarray, height: int) -> np.ndarray:
    """Nearest-neighbour resize to ``height`` pixels high, keeping the aspect ratio."""
    width = max(1, round(image.shape[1] * height / image.shape[0]))
    return cv2.resize(image, (width, height), interpolation=cv2.INTER_NEAREST)


def _with_box(panel: np.ndarray, box: Sequence[int] | None, scale: float) -> np.ndarray:
    """Draw the label box (x, y, w, h), ends inclusive, in frame pixels scaled by ``scale``."""
    if box is None or min(box) < 0:
        return panel
    x, y, w, h = box
    top_left = (int(x * scale), int(y * scale))
    bottom_right = (int((x + w + 1) * scale) - 1, int((y + h + 1) * scale) - 1)
    return cv2.rectangle(panel.copy(), top_left, bottom_right, BOX, 2)


def _titled(title: str, image: np.ndarray) -> np.ndarray:
    out = np.empty((_TITLE_H + image.shape[0], image.shape[1], 3), np.uint8)
    out[:_TITLE_H] = TITLE_BG
    out[_TITLE_H:] = image
    cv2.putText(out, drawable(title), (4, _TITLE_H - 6), _FONT, _SCALE, TITLE_FG, 1, cv2.LINE_AA)
    return out


def _row(panels: list[tuple[str, np.ndarray]]) -> np.ndarray:
    """Titled panels left to right, _GAP pixels apart."""
    titled = [_titled(title, image) for title, image in panels]
    height = max(t.shape[0] for t in titled)
    out = np.empty((height, sum(t.shape[1] for t in titled) + _GAP * (len(titled) - 1), 3), np.uint8)
    out[:] = BACKGROUND
    x = 0
    for t in titled:
        out[: t.shape[0], x : x + t.shape[1]] = t
        x += t.shape[1] + _GAP
    return out


def _fmt(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _wrap(items: list[str], width: int) -> list[str]:
    """Join caption items with spaces into lines no wider than ``width`` pixels (one item may exceed it)."""
    lines: list[str] = []
    for item in items:
        joined = f"{lines[-1]}   {item}" if lines else item
        if lines and cv2.getTextSize(joined, _FONT, _SCALE, 1)[0][0] <= width:
            lines[-1] = joined
        else:
            lines.append(item)
    return lines
