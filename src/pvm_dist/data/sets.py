"""The original's named data sets (``pvm-algorithm.md`` §5): set name -> file names of its PVM data.

The file lists are those of the original repository (``piekniewski/PVM_cuda``, ``pvmcuda_pkg/datasets.py``).
A set is read from a data folder (``--data green_ball_training --data-path PVM_data/``); the folder is
joined as a path (the original concatenated strings, so it needed a trailing ``/``; here either works).
The CamVid and Carla sets name zips of another layout (PNG frames under ``video/`` or ``view/`` with
segmentation labels), which this package does not read: naming one is a clear error.
"""

from __future__ import annotations

import os
from pathlib import Path

from pvm_dist.data.errors import DataError


def _z(*names: str) -> list[str]:
    return [f"{n}.pkl.zip" for n in names]


def _numbered(prefix: str, numbers) -> list[str]:
    return _z(*(f"{prefix}{n:02d}" for n in numbers))


SETS: dict[str, list[str]] = {
    "face_training": _z("face01", "face03", "no_target", "face16", "face17", "face18", "face19", "no_target_01",
                        "face20", "face21"),
    "face_testing": _numbered("face", [2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 22, 23, 24]),
    "face_ex_testing": _numbered("face", range(25, 34)),
    "face_additional": [],
    "green_ball_training": _z("green_ball_long", "green_ball_on_grass", "green_ball_test_14", "green_ball_test_15",
                              "green_ball_test_16"),
    "green_ball_testing": _z("green_ball_test") + _numbered("green_ball_test_", range(1, 14))
    + _z("green_ball_01_small", "green_ball_bc_office"),
    "green_ball_ex_testing": _numbered("green_ball_test_", range(17, 30)),
    "green_ball_additional": _z("blue_ball_on_grass_daytime", "blue_ball_at_home_02", "blue_ball_at_home_01"),
    "stop_sign_training": _numbered("stop", [1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 32, 34, 36,
                                             38, 40]),
    "stop_sign_testing": _numbered("stop", [2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 33, 35, 37,
                                            39]),
    "stop_sign_additional": [],
    "stop_sign_ex_testing": _numbered("stop", range(41, 52)),
    "short_training": _z("stop40"),
    "short_testing": _z("stop41"),
    "short_additional": [],
    "non_spec_training": _z("no_target", "no_target_01", "green_ball_long", "stop01", "green_ball_on_grass",
                            "stop03", "face01", "stop05", "face03", "stop07", "face16", "stop09", "face17",
                            "stop11", "face18", "stop13", "green_ball_test_14", "stop15", "green_ball_test_15",
                            "stop17", "green_ball_test_16", "stop19", "stop21", "stop23"),
    "non_spec_testing": _z("stop41"),
    "non_spec_additional": [],
}
for _kind in ("stop_sign", "green_ball", "face"):
    SETS[f"{_kind}_full_testing"] = SETS[f"{_kind}_testing"] + SETS[f"{_kind}_ex_testing"]
    SETS[f"{_kind}_fast_testing"] = SETS[f"{_kind}_testing"][:1]

_CAMVID = ("0001TP", "0006R0", "0016E5", "Seq05VD")
UNSUPPORTED_SETS: dict[str, list[str]] = {
    "camvid_full": [f"{n}.zip" for n in _CAMVID],
    "camvid_small": ["0001TP_small.zip"],
    "camvid_1st": ["0001TP.zip"],
    "camvid_05x_training": [f"{n}_05x_training.zip" for n in _CAMVID],
    "camvid_05x_testing": [f"{n}_05x_testing.zip" for n in _CAMVID],
    "carla_training": [f"calra_001_{i:03d}.zip" for i in range(46)],  # sic: "calra" in the original
    "carla_testing": [f"calra_006_{i:03d}_test.zip" for i in range(9)],
    "carla_testing_single": ["calra_006_008_test.zip"],
    "carla_testing_single0": ["calra_006_006_test.zip"],
}


def is_set_name(name: str) -> bool:
    return name in SETS or name in UNSUPPORTED_SETS


def set_files(name: str, data_path: str | os.PathLike | None) -> list[Path]:
    """The files of set ``name`` under ``data_path``; a DataError if the set cannot be read here."""
    if name in UNSUPPORTED_SETS:
        raise DataError(f"{name}: a CamVid/Carla set (PNG frames under video/ or view/ with segmentation labels); "
                        f"that layout is not supported, only the PVM zips (<name>/img/NNNN.jpg)")
    files = SETS[name]
    if not files:
        raise DataError(f"{name}: this set is empty in the original's list")
    if data_path is None:
        raise DataError(f"{name}: a named set of the original PVM data; give the folder holding its "
                        f"{len(files)} zip(s) as data_path (--data-path)")
    return [Path(data_path).expanduser() / f for f in files]
