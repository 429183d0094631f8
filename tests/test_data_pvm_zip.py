"""The original PVM data zips: frames, labels (scaling, inclusive masks, last label file wins), lists,
named sets, and broken archives."""

from __future__ import annotations

import zipfile
from pathlib import Path

import cv2
import numpy as np
import pytest

from pvm_dist.data import DataError, make_source

D = 30
SHAPE = (D, D, 3)
W0, H0 = 80, 64


def jpeg(i: int) -> bytes:
    img = np.zeros((H0, W0, 3), np.uint8)
    img[:] = (40 + 3 * i, 90, 200 - 4 * i)
    cv2.circle(img, (10 + 2 * i, 20 + i), 6, (0, 200, 0), -1)
    ok, buf = cv2.imencode(".jpg", img)
    assert ok
    return buf.tobytes()


BOXES = [[4 + 2 * i, 14 + i, 12, 12] for i in range(12)]
BOXES[5] = [-1, -1, -1, -1]
BOXES[7] = [75, 60, 20, 20]  # runs past the frame's edge: the mask is clipped


def make_zip(path: Path, n: int = 12, name: str = "clip", labels: list | None = None, extra=None) -> Path:
    labels = BOXES[:n] if labels is None else labels
    with zipfile.ZipFile(path, "w") as z:
        if labels is not False:
            z.writestr(f"{name}/groundtruth_rect.0.txt", "0, 0, 1, 1\n" * n)  # comes first: ignored
        for i in range(n):
            z.writestr(f"{name}/img/{i:04d}.jpg", jpeg(i))
        z.writestr(f"{name}/data.pkl", b"\x80\x04 never unpickled")
        if labels is not False:
            z.writestr(f"{name}/groundtruth_rect.1.txt", "".join(", ".join(map(str, b)) + "\n" for b in labels))
        for member, data in (extra or {}).items():
            z.writestr(member, data)
    return path


def expected_box(b):
    if b[0] < 0:
        return [-1, -1, -1, -1]
    fw, fh = D / float(W0), D / float(H0)
    return [int(b[0] * fw), int(b[1] * fh), int(b[2] * fw), int(b[3] * fh)]


def test_zip_frames_boxes_and_masks(tmp_path):
    path = make_zip(tmp_path / "clip.pkl.zip")
    src = make_source(str(path), SHAPE, 1, seed=0)
    assert len(src) == 12
    for t in range(12):
        ref = cv2.resize(cv2.imdecode(np.frombuffer(jpeg(t), np.uint8), cv2.IMREAD_COLOR), (D, D),
                         interpolation=cv2.INTER_CUBIC)
        assert np.array_equal(src.frames(t)[0], ref)
        box = src.boxes(t)[0].tolist()
        assert box == expected_box(BOXES[t])  # from the last .txt in the listing, scaled int(x·D/W0)
        want = np.zeros((D, D), np.float32)
        if box[0] >= 0:
            cv2.rectangle(want, tuple(box[:2]), (box[0] + box[2], box[1] + box[3]), 1.0, -1)  # as the original
        mask = src.labels(t)
        assert mask.shape == (1, D, D) and mask.dtype == np.float32 and np.array_equal(mask[0], want)
    assert src.labels(5).sum() == 0 and src.boxes(5).tolist() == [[-1, -1, -1, -1]]
    x, y, w, h = src.boxes(0)[0]
    assert src.labels(0)[0].sum() == (w + 1) * (h + 1)  # both ends inclusive
    d = src.describe()
    assert d["kind"] == "pvm_zip" and d["labelled"] and d["frames"] == 12 and d["files"] == [str(path)]
    assert src.clips[0].label_member == "clip/groundtruth_rect.1.txt"


def test_zip_list_streams_start_in_distinct_files(tmp_path):
    a = make_zip(tmp_path / "a.zip", n=12)
    b = make_zip(tmp_path / "b.zip", n=7, name="other", labels=False)  # unlabelled file in a labelled list
    src = make_source(f"{a}, {b}", SHAPE, 2, seed=0)
    assert src.describe()["frames_per_file"] == [12, 7] and src.describe()["stream_starts"] == [0, 12]
    assert np.array_equal(src.frames(0)[1], src.frames(12)[0])
    assert src.boxes(0)[1].tolist() == [-1, -1, -1, -1] and src.labels(0)[1].sum() == 0
    cuts = np.array([src.cuts(t) for t in range(40)])
    assert np.flatnonzero(cuts[:, 0]).tolist() == [0, 12, 19, 31, 38]  # file boundary, wrap, boundary, ...
    assert np.flatnonzero(cuts[:, 1]).tolist() == [0, 7, 19, 26, 38]


def test_named_set_from_a_data_folder(tmp_path):
    make_zip(tmp_path / "stop40.pkl.zip", n=5)
    src = make_source("short_training", SHAPE, 1, seed=0, data_path=str(tmp_path) + "/")
    assert src.describe()["files"] == [str(tmp_path / "stop40.pkl.zip")] and len(src) == 5
    with pytest.raises(DataError, match="short_training: .*--data-path"):
        make_source("short_training", SHAPE, 1, 0)
    with pytest.raises(DataError, match=r"green_ball_long\.pkl\.zip: no such file"):
        make_source("green_ball_training", SHAPE, 1, 0, data_path=tmp_path)
    with pytest.raises(DataError, match="camvid_full: .*not supported"):
        make_source("camvid_full", SHAPE, 1, 0, data_path=tmp_path)
    with pytest.raises(DataError, match="face_additional: .*empty"):
        make_source("face_additional", SHAPE, 1, 0, data_path=tmp_path)
    # relative file names are looked up in the data folder too
    assert len(make_source("stop40.pkl.zip", SHAPE, 1, 0, data_path=tmp_path)) == 5


def test_original_set_lists():
    from pvm_dist.data.sets import SETS

    sizes = {k: len(v) for k, v in SETS.items()}
    assert sizes["green_ball_training"] == 5 and sizes["green_ball_testing"] == 16
    assert sizes["green_ball_ex_testing"] == 13 and sizes["green_ball_additional"] == 3
    assert sizes["face_training"] == 10 and sizes["face_testing"] == 16 and sizes["face_ex_testing"] == 9
    assert sizes["stop_sign_training"] == 20 and sizes["stop_sign_testing"] == 19
    assert sizes["stop_sign_ex_testing"] == 11 and sizes["non_spec_training"] == 24
    assert SETS["green_ball_fast_testing"] == ["green_ball_test.pkl.zip"]
    assert sizes["stop_sign_full_testing"] == 30


def test_broken_zips_name_the_file(tmp_path):
    cases = {}
    p = tmp_path / "corrupt.zip"
    p.write_bytes(b"PK\x03\x04" + b"\x00garbage" * 50)
    cases[p] = "not a valid zip archive"
    p = tmp_path / "truncated.zip"
    p.write_bytes(make_zip(tmp_path / "whole.zip").read_bytes()[:300])
    cases[p] = "not a valid zip archive"
    p = tmp_path / "empty.zip"
    p.write_bytes(b"")
    cases[p] = "empty file"
    p = tmp_path / "noimg.zip"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("clip/frames/0000.jpg", jpeg(0))
        z.writestr("clip/groundtruth_rect.0.txt", "1,1,1,1\n")
    cases[p] = r"no <name>/img/NNNN\.jpg frames in the archive \(1 \.jpg members elsewhere\)"
    p = tmp_path / "gap.zip"
    with zipfile.ZipFile(p, "w") as z:
        for i in (0, 1, 3):
            z.writestr(f"clip/img/{i:04d}.jpg", jpeg(i))
    cases[p] = r"missing \[2\]"
    cases[make_zip(tmp_path / "short.zip", labels=BOXES[:10])] = "label file has 10 lines for 12 frames"
    cases[make_zip(tmp_path / "badline.zip", n=2, labels=[[1, 2, 3, 4], ["a", "b", "c", "d"]])] = "line 2 is not"
    p = tmp_path / "x.pkl"
    p.write_bytes(b"\x80\x04.")
    cases[p] = "never loaded"
    for path, problem in cases.items():
        with pytest.raises(DataError, match=f"{path.name}.*{problem}") as err:
            make_source(str(path), SHAPE, 1, 0)
        assert "\n" not in str(err.value)


def test_corrupt_jpeg_member_is_named_when_read(tmp_path):
    path = make_zip(tmp_path / "badjpg.zip", extra=None)
    data = {i: jpeg(i) for i in range(12)}
    data[3] = b"\xff\xd8\xff not really a jpeg"
    with zipfile.ZipFile(path, "w") as z:
        for i, blob in data.items():
            z.writestr(f"clip/img/{i:04d}.jpg", blob)
    src = make_source(str(path), SHAPE, 1, 0)  # only frame 0 is decoded when opening
    with pytest.raises(DataError, match=r"badjpg\.zip: member 'clip/img/0003\.jpg' is not a decodable JPEG"):
        src.frames(0)


def test_zip_blocks_equal_the_steps(tmp_path):
    a = make_zip(tmp_path / "a.zip", n=12)
    b = make_zip(tmp_path / "b.zip", n=7, name="other", labels=False)
    src = make_source(f"{a},{b}", SHAPE, 3, seed=0, cache_bytes=2 * 32 * D * D * 3)  # evicts within a block
    assert src.device_renderable is False
    for step, k in [(0, 1), (0, 45), (17, 9), (1000, 3)]:  # 45 > 19 frames: every stream wraps inside the block
        frames, labels, boxes = src.frames_block(step, k), src.labels_block(step, k), src.boxes_block(step, k)
        assert frames.shape == (k, 3, *SHAPE) and labels.shape == (k, 3, D, D) and boxes.shape == (k, 3, 4)
        assert frames.dtype == np.uint8 and labels.dtype == np.float32 and boxes.dtype == np.int32
        for i in range(k):
            assert np.array_equal(frames[i], src.frames(step + i))
            assert np.array_equal(labels[i], src.labels(step + i)) and np.array_equal(boxes[i], src.boxes(step + i))
    unlabelled = make_source(str(b), SHAPE, 2, seed=0)
    assert unlabelled.labels_block(0, 4) is None and unlabelled.boxes_block(0, 4) is None
