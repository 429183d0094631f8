"""Size limits on what data files expand to, checked before decompressing or decoding.

A 3 MB zip member can declare (and inflate to) gigabytes, and a small PNG of one colour can declare
20000×20000 pixels, which OpenCV allocates before it reads a row. Members are refused by their declared
uncompressed size (``zipfile`` never returns more than that), images by the width and height in their
header (PNG, JPEG, GIF, BMP, WebP; other formats keep OpenCV's own cap of 2^30 pixels).
"""

from __future__ import annotations

import struct

from pvm_dist.data.errors import DataError

MAX_MEMBER_BYTES = 256 << 20  # one frame or one label file of a data zip
MAX_PIXELS = 1 << 26  # 67 Mpx (8192×8192): far above any frame a PVM model reads
_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


def check_member_size(declared: int, where: str) -> None:
    """Refuse a zip member whose uncompressed size is over :data:`MAX_MEMBER_BYTES`."""
    if declared > MAX_MEMBER_BYTES:
        raise DataError(f"{where}: expands to {declared:,} bytes; members of at most {MAX_MEMBER_BYTES:,} bytes are read")


def _jpeg_size(buf: bytes) -> tuple[int, int] | None:
    i = 2
    while i + 9 <= len(buf):
        if buf[i] != 0xFF:
            return None
        marker = buf[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in _JPEG_SOF:
            h, w = struct.unpack(">HH", buf[i + 5 : i + 9])
            return w, h
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # no length field
            i += 2
            continue
        (length,) = struct.unpack(">H", buf[i + 2 : i + 4])
        i += 2 + length
    return None


def image_size(buf: bytes) -> tuple[int, int] | None:
    """(width, height) from an image header, or None for a format (or a header) not recognised."""
    if buf[:8] == b"\x89PNG\r\n\x1a\n" and len(buf) >= 24:
        return struct.unpack(">II", buf[16:24])
    if buf[:2] == b"\xff\xd8":
        return _jpeg_size(buf)
    if buf[:4] in (b"GIF8",) and len(buf) >= 10:
        return struct.unpack("<HH", buf[6:10])
    if buf[:2] == b"BM" and len(buf) >= 26:
        w, h = struct.unpack("<ii", buf[18:26])
        return abs(w), abs(h)
    if buf[:4] == b"RIFF" and buf[8:12] == b"WEBP" and buf[12:16] == b"VP8X" and len(buf) >= 30:
        w = int.from_bytes(buf[24:27], "little") + 1
        h = int.from_bytes(buf[27:30], "little") + 1
        return w, h
    return None


def check_pixels(buf: bytes, where: str) -> None:
    """Refuse an image whose header declares more than :data:`MAX_PIXELS` pixels."""
    size = image_size(buf)
    if size is not None and size[0] * size[1] > MAX_PIXELS:
        raise DataError(f"{where}: image is {size[0]:,}×{size[1]:,} pixels; at most {MAX_PIXELS:,} pixels are decoded")
