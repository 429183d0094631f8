"""Pictures and animations (pvm_dist.io.pictures) of a tiny engine trained a few steps."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from conftest import random_frames

from pvm_dist import build_engine, load_spec
from pvm_dist.io.pictures import (
    BOX,
    SEPARATOR,
    Animation,
    decompress,
    error_map,
    hidden_tiles,
    picture_grid,
    predicted_frame,
)


@pytest.fixture(scope="module")
def trained():
    """A tiny reference engine after 6 steps: (topology, frames, outputs row, hidden row)."""
    spec = load_spec("tiny")
    engine = build_engine(spec, backend="reference", n_seq=1)
    frames = random_frames(spec, 6)
    for f in frames:
        engine.step(f)
    return engine.topo, frames[:, 0], engine.prediction()[0], engine.hidden()[0]


def _contains(haystack: np.ndarray, needle: np.ndarray) -> bool:
    """Whether ``needle`` appears exactly somewhere in ``haystack`` (best template match, then compared)."""
    scores = cv2.matchTemplate(haystack.astype(np.float32), needle.astype(np.float32), cv2.TM_SQDIFF)
    x, y = cv2.minMaxLoc(scores)[2]
    return np.array_equal(haystack[y : y + needle.shape[0], x : x + needle.shape[1]], needle)


def test_decompress_inverts_compression_and_clips():
    assert decompress(0.1) == 0.0 and decompress(0.9) == pytest.approx(1.0) and decompress(0.5) == pytest.approx(0.5)
    assert decompress(0.0) == 0.0 and decompress(1.0) == 1.0
    np.testing.assert_allclose(decompress(np.array([0.1, 0.3, 0.95])), [0.0, 0.25, 1.0], atol=1e-6)


def test_predicted_frame_puts_each_unit_output_at_its_patch(trained):
    topo, _, outputs, _ = trained
    spec, b, C = topo.spec, topo.spec.block, topo.spec.channels
    for ahead, half in ((2, 0), (1, 1)):
        image = predicted_frame(topo, outputs, ahead=ahead)
        assert image.shape == spec.image_shape and image.dtype == np.uint8
        for u in (0, 5, int(topo.layer_offsets[1]) - 1):  # L0(0,0), L0(1,1), the last layer-0 unit
            P, r, c = int(topo.signal[u]), int(topo.row[u]), int(topo.col[u])
            for i, j, ch in ((0, 0, 0), (1, 2, 1), (b - 1, b - 1, C - 1)):
                y = outputs[topo.y_off[u] + half * P + (i * b + j) * C + ch]
                assert image[r * b + i, c * b + j, ch] == round(255 * decompress(y))


def test_predicted_frame_is_the_inverse_of_the_frame_patch_mapping(trained):
    topo, frames, _, _ = trained
    frame, b = frames[0], topo.spec.block
    outputs = np.zeros(topo.y_total, np.float32)
    for u in range(int(topo.layer_offsets[1])):  # outputs = the compressed frame patch, (row, col, channel) order
        r, c, P = int(topo.row[u]), int(topo.col[u]), int(topo.signal[u])
        patch = frame[r * b : (r + 1) * b, c * b : (c + 1) * b].reshape(-1)
        outputs[topo.y_off[u] : topo.y_off[u] + P] = 0.8 * patch / 255.0 + 0.1
    np.testing.assert_array_equal(predicted_frame(topo, outputs), frame)
    with pytest.raises(ValueError, match="ahead"):
        predicted_frame(topo, outputs, ahead=3)
    with pytest.raises(ValueError, match="shape"):
        predicted_frame(topo, outputs[:-1])


def test_error_map_is_dark_where_right_and_hot_where_wrong(trained):
    frame = trained[1][0]
    predicted = frame.copy()
    predicted[:2, :3] = np.where(frame[:2, :3] < 128, 255, 0)  # wrong by at least 128 in every channel
    heat = error_map(frame, predicted)
    assert heat.shape == (*frame.shape[:2], 3) and heat.dtype == np.uint8
    brightness = heat.astype(int).sum(axis=-1)
    assert brightness[2:].max() < 30 and brightness[:, 3:].max() < 30  # exact prediction: black
    assert brightness[:2, :3].min() > 250  # badly wrong: bright


def test_hidden_tiles_place_each_unit_on_its_layer_grid(trained):
    topo, _, _, hidden = trained
    H, h = topo.hidden, 3
    tiles = hidden_tiles(topo, hidden)
    assert [t.shape for t in tiles] == [(S * h + S - 1, S * h + S - 1, 3) for S in topo.spec.layer_shapes]
    for u in (0, 7, int(topo.layer_offsets[1]) + 2, topo.n_units - 1):
        layer, r, c = int(topo.layer[u]), int(topo.row[u]), int(topo.col[u])
        tile = tiles[layer][r * (h + 1) : r * (h + 1) + h, c * (h + 1) : c * (h + 1) + h]
        want = np.minimum(255, np.rint(255 * hidden[u * H : (u + 1) * H].astype(np.float64))).reshape(h, h)
        for ch in range(3):
            np.testing.assert_array_equal(tile[:, :, ch], want)
    assert (tiles[0][h] == SEPARATOR).all() and (tiles[0][:, h] == SEPARATOR).all()


def test_picture_grid_contains_every_panel(trained):
    topo, frames, outputs, hidden = trained
    frame, predicted = frames[-1], predicted_frame(topo, outputs)
    caption = {"step": 6, "spec": "tiny", "backend": "reference", "error": 0.01234}
    grid = picture_grid(frame, predicted, topo, hidden, caption=caption)
    assert grid.dtype == np.uint8 and grid.ndim == 3 and grid.shape[2] == 3
    n_layers = topo.spec.n_layers
    assert grid.shape[0] > 2 * 160 + 2 * 20 and grid.shape[1] >= max(3, n_layers) * 160

    def up(image):
        return cv2.resize(image, (160, 160), interpolation=cv2.INTER_NEAREST)

    panels = [up(frame), up(predicted), up(error_map(frame, predicted))] + [up(t) for t in hidden_tiles(topo, hidden)]
    for panel in panels:
        assert panel.std() > 0  # non-empty: a constant panel would match anywhere
        assert _contains(grid, panel)
    with_extras = picture_grid(frame, predicted, topo, hidden, heatmap=np.linspace(0, 1, 144).reshape(12, 12),
                               label_box=(2, 3, 4, 5), caption=caption)
    assert with_extras.shape[1] == grid.shape[1] + 160 + 8  # one more panel in the top row
    assert (with_extras == BOX).all(axis=-1).sum() > 4 * 50  # box drawn on input and readout panels
    assert not (grid == BOX).all(axis=-1).any()


def _gray_pair(level: int) -> tuple[np.ndarray, np.ndarray]:
    frame = np.full((12, 12, 3), level, np.uint8)
    return frame, 255 - frame


def test_animation_subsamples_evenly_within_max_frames(tmp_path):
    anim = Animation(max_frames=10)
    for k in range(10):
        anim.add(*_gray_pair(2 * k))
    assert len(anim) == 10  # up to max_frames: every pair
    for k in range(10, 95):
        anim.add(*_gray_pair(2 * k))
    assert 5 <= len(anim) <= 10
    pil = pytest.importorskip("PIL.Image")
    with pil.open(anim.save(tmp_path / "a.gif")) as gif:
        levels = []
        for i in range(gif.n_frames):
            gif.seek(i)
            levels.append(int(np.asarray(gif.convert("RGB"))[-10, 10, 0]))
    assert len(levels) == len(anim) and levels[0] == 0 and levels[-1] >= 2 * 70  # spans the run
    assert len(set(np.diff(levels))) == 1  # evenly spaced


def test_animation_writes_gif_and_mp4(tmp_path):
    anim = Animation(fps=5, max_frames=8)
    for k in range(8):
        anim.add(*_gray_pair(10 * k))
    mp4 = anim.save(tmp_path / "a.mp4")
    cap = cv2.VideoCapture(str(mp4))
    count, ok, first = 0, True, None
    while ok:
        ok, image = cap.read()
        if ok:
            first = image if first is None else first
            count += 1
    cap.release()
    assert count == 8
    assert first.shape == (20 + 168, 2 * 168 + 8, 3)  # 12 px scaled 14× under a title, side by side
    assert abs(int(first[-10, 10, 0]) - 0) < 16 and abs(int(first[-10, -10, 0]) - 255) < 16  # input | prediction
    with pytest.raises(ValueError, match="gif or .mp4"):
        anim.save(tmp_path / "a.avi")
    pil = pytest.importorskip("PIL.Image")
    with pil.open(anim.save(tmp_path / "a.gif")) as gif:
        assert gif.n_frames == 8
        gif.seek(7)
        last = np.asarray(gif.convert("RGB"))
    assert last.shape == first.shape and abs(int(last[-10, 10, 0]) - 70) <= 2  # the last frame added (level 70)
