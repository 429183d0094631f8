"""What a run trained on, as MLflow records a dataset: a name, where it came from, and a digest of its content.

A synthetic source is its generator: the digest covers the generator's name, the frame shape, the number
of sequences and the seed, which together decide every frame. File data is its bytes: the digest is a
SHA-256 over each file's relative name and content (a folder's files in name order), so a changed clip
gets a new digest and a renamed copy of the same bytes under the same name keeps it. Files that are not
on this machine (a sweep driver whose workers hold the data) are digested by their names alone, and the
profile says so. Hashes are kept per (path, size, mtime) for the life of the process.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from pvm_dist.data.errors import DataError
from pvm_dist.data.loader import _expand, data_entries
from pvm_dist.data.synthetic import SOURCES

DIGEST_CHARS = 16  # MLflow keeps up to 36; 64 bits name a data set well enough
_CHUNK = 1 << 20
_FILE_HASHES: dict[tuple[str, int, int], str] = {}


def _file_hash(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _FILE_HASHES:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        _FILE_HASHES[key] = h.hexdigest()
    return _FILE_HASHES[key]


def _files(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]


def dataset_input(data: str, image_shape: tuple[int, ...], n_seq: int, seed: int,
                  data_path: str | os.PathLike | None = None, context: str = "training") -> dict[str, str]:
    """The MLflow dataset (name, digest, source_type, source, profile as JSON) and the ``context`` it was
    used in (``training``, or ``evaluation`` for held-out data) for the data string ``data``."""
    data = data.strip()
    if data in SOURCES:
        generator = {"generator": data, "image_shape": list(image_shape), "n_seq": n_seq, "seed": seed}
        digest = hashlib.sha256(json.dumps(generator, sort_keys=True).encode()).hexdigest()
        return {"name": data, "digest": digest[:DIGEST_CHARS], "source_type": "code", "source": json.dumps(generator),
                "profile": json.dumps({"kind": "synthetic", "frames": "generated from the seed"}), "context": context}
    h = hashlib.sha256()
    files, total, hashed = 0, 0, True
    uris = []
    dp = None if data_path is None else os.fspath(data_path)
    for entry in data_entries(data):
        try:
            roots = _expand(entry, dp)
        except DataError:  # not on this machine: named, not hashed
            roots, hashed = [], False
            h.update(f"entry:{entry}\n".encode())
        for root in roots:
            uris.append(root.resolve().as_uri())
            for f in _files(root):
                rel = f.relative_to(root).as_posix() if root.is_dir() else f.name
                h.update(f"{rel}\n{_file_hash(f)}\n".encode())
                files, total = files + 1, total + f.stat().st_size
    source = {"uri": uris[0] if len(uris) == 1 else uris, "data": data, **({"data_path": dp} if dp else {})}
    profile = {"kind": "files", "files": files, "bytes": total} if hashed else \
        {"kind": "files", "note": "not all files are on this machine: digest of their names only"}
    return {"name": Path(data_entries(data)[0]).name + ("" if len(data_entries(data)) == 1 else " (+more)"),
            "digest": h.hexdigest()[:DIGEST_CHARS], "source_type": "local", "source": json.dumps(source),
            "profile": json.dumps(profile), "context": context}
