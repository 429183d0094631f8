"""The original PVM data zips (``pvm-algorithm.md`` §5), e.g. ``green_ball_long.pkl.zip``.

Layout: ``<name>/img/NNNN.jpg`` frames plus ``<name>/groundtruth_rect.K.txt`` label files. Only JPEG
members and text members are ever read: nothing in an archive is unpickled (the ``.pkl`` in the names is
historical; the zips hold no pickles, and any other member is ignored).

- Frames are the ``.jpg``/``.jpeg`` members inside a folder named ``img``. As the original, the frame
  number is the first 4 characters of the file name, and the numbers must be exactly 0…N−1 (an error
  otherwise: the original would fail or silently misalign labels).
- Labels: as the original, the text member that comes **last in the archive listing** is the label file
  (one target per file; the others are ignored). One line per frame, ``x, y, w, h`` in original pixels
  (commas, tabs or spaces separate the values; the original took commas only), or ``-1, -1, -1, -1`` when
  the target is absent (any x < 0 counts as absent). Lines past the N-th are ignored; fewer than N is an
  error. An archive without a text member is unlabelled.
- Boxes are scaled with the size (H0, W0) of frame 0, ``int(x · (D/W0))`` etc., as the original.
- Frames are decoded lazily, a chunk at a time; a corrupt JPEG is an error naming the archive and member
  when its chunk is first read.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path, PurePosixPath

import numpy as np

from pvm_dist.data.convert import fit_frame, scale_boxes
from pvm_dist.data.errors import data_error
from pvm_dist.data.images import parallel_map
from pvm_dist.data.limits import check_member_size, check_pixels
from pvm_dist.data.streams import Clip

_SEP = re.compile(r"[,\s]+")


def _open_zip(path: Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path, "r")
    except zipfile.BadZipFile as exc:
        empty = path.is_file() and path.stat().st_size == 0
        raise data_error(path, "empty file" if empty else f"not a valid zip archive ({exc})") from None
    except (OSError, EOFError) as exc:
        raise data_error(path, f"cannot read zip archive ({getattr(exc, 'strerror', None) or exc})") from None


def parse_labels(text: str, n_frames: int, where: str) -> np.ndarray:
    """int64 [n_frames, 4] raw boxes from a ``groundtruth_rect*.txt`` body."""
    lines = text.splitlines()
    if len(lines) < n_frames:
        raise data_error(where, f"label file has {len(lines)} lines for {n_frames} frames")
    out = np.empty((n_frames, 4), np.int64)
    for i, line in enumerate(lines[:n_frames]):
        fields = [f for f in _SEP.split(line.strip()) if f]
        try:
            if len(fields) != 4:
                raise ValueError
            out[i] = [int(float(f)) for f in fields]
        except (ValueError, OverflowError):
            raise data_error(where, f"line {i + 1} is not 'x, y, w, h': {line.strip()[:60]!r}") from None
    return out


class PvmZipClip(Clip):
    kind = "pvm_zip"

    def __init__(self, path: Path, image_shape: tuple[int, int, int]) -> None:
        self.path, self.shape = str(path), image_shape
        self._zip: zipfile.ZipFile | None = _open_zip(path)
        try:
            infos = self._zip.infolist()
        except Exception as exc:  # noqa: BLE001 — any failure to list is a corrupt archive
            raise data_error(path, f"cannot list zip archive ({exc})") from None
        frames: dict[int, str] = {}
        label_member: str | None = None
        other_jpgs = 0
        for info in infos:
            if info.is_dir():
                continue
            p = PurePosixPath(info.filename.replace("\\", "/"))
            suffix = p.suffix.lower()
            if suffix in (".jpg", ".jpeg"):
                if p.parent.name != "img":
                    other_jpgs += 1
                    continue
                try:
                    nr = int(p.name[:4])
                except ValueError:
                    raise data_error(path, f"frame {info.filename!r}: the first 4 characters of its name are "
                                           f"not a frame number") from None
                if nr in frames:
                    raise data_error(path, f"frame number {nr} appears twice ({frames[nr]!r}, {info.filename!r})")
                frames[nr] = info.filename
            elif suffix == ".txt":
                label_member = info.filename  # the last one in the listing wins, as in the original
        if not frames:
            extra = f" ({other_jpgs} .jpg members elsewhere)" if other_jpgs else ""
            raise data_error(path, f"no <name>/img/NNNN.jpg frames in the archive{extra}")
        missing = sorted(set(range(len(frames))) - set(frames))
        if missing:
            raise data_error(path, f"frame numbers must run 0..{len(frames) - 1}; missing {missing[:5]}")
        self.members = [frames[i] for i in range(len(frames))]
        self.n_frames = len(self.members)
        self.label_member = label_member
        first = self._decode_raw(0)
        self.source_size = first.shape[:2]
        if label_member is not None:
            check_member_size(self._zip.getinfo(label_member).file_size, f"{path}:{label_member}")
            try:
                text = self._zip.read(label_member).decode("utf-8", errors="replace")
            except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
                raise data_error(path, f"member {label_member!r} cannot be read ({exc})") from None
            raw = parse_labels(text, self.n_frames, f"{path}:{label_member}")
            self.boxes = scale_boxes(raw, self.source_size, image_shape)

    def _archive(self) -> zipfile.ZipFile:
        if self._zip is None:
            self._zip = _open_zip(Path(self.path))
        return self._zip

    def _read(self, i: int) -> bytes:
        member = self.members[i]
        check_member_size(self._archive().getinfo(member).file_size, f"{self.path}:{member}")
        try:
            return self._archive().read(member)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError, KeyError) as exc:
            raise data_error(self.path, f"member {member!r} cannot be read ({exc})") from None

    def _decode_bytes(self, i: int, buf: bytes) -> np.ndarray:
        import cv2

        check_pixels(buf, f"{self.path}:{self.members[i]}")
        img = cv2.imdecode(np.frombuffer(buf, np.uint8), cv2.IMREAD_COLOR) if buf else None
        if img is None:
            raise data_error(self.path, f"member {self.members[i]!r} is not a decodable JPEG")
        return img

    def _decode_raw(self, i: int) -> np.ndarray:
        return self._decode_bytes(i, self._read(i))

    def decode(self, start: int, stop: int) -> np.ndarray:
        blobs = [(i, self._read(i)) for i in range(start, stop)]  # zipfile reads stay on this thread
        return np.stack(parallel_map(lambda ib: fit_frame(self._decode_bytes(*ib), self.shape), blobs))

    def close(self) -> None:
        if self._zip is not None:
            self._zip.close()
            self._zip = None

    def describe(self) -> dict:
        return {**super().describe(), "label_file": self.label_member, "source_size": list(self.source_size)}
