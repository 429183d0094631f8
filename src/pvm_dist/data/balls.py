"""``synthetic:balls``: coloured balls bouncing over a slowly panning textured background.

Every stream is its own scene, drawn from ``(seed, stream)``: a smooth random texture twice the frame's
size, of which a window pans (bouncing between the texture's edges), one **green** ball (BGR 0, 200, 0: the
tracked target) and ``n_distractors`` balls of other colours. Motion is closed-form: each coordinate moves
linearly (float64) and is reflected at the walls (a triangle wave), so any step is drawn directly (random
access, no state) and a resumed run sees exactly the same frames: they are a pure function of
``(seed, stream, step)``. Ball centres and pan offsets are rounded to whole pixels (:meth:`BallSource.layout`)
and each ball is the integer disc {(x, y): (x − cx)² + (y − cy)² ≤ r²}, without antialiasing, drawn over the
texture window distractors first and the green one last (never occluded). So its label is exact: the box
is ``(cx − r, cy − r, 2r, 2r)`` in the PVM convention (the mask covers x…x+w and y…y+h inclusive, which is
exactly the disc's extent). The texture has every channel ≥ 40, so no background pixel equals the target
colour. Balls stay wholly inside the frame; the target is never absent. Grey sources (C = 1) draw the same
scene with OpenCV's BGR→grey conversion applied to the texture and the colours.

The host renderer (:meth:`BallSource.frames_block`) draws a block of steps with a few numpy operations per
ball over all its frames; :meth:`BallSource.frames_block_device` draws the identical block on the GPU.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from pvm_dist.data.convert import box_masks, check_shape
from pvm_dist.data.source import Lookahead, block_out, check_block

TARGET_COLOR = (0, 200, 0)  # BGR green
DISTRACTOR_COLORS = [(0, 0, 220), (220, 40, 0), (0, 215, 235), (200, 0, 200), (245, 245, 245), (0, 120, 255),
                     (120, 60, 0), (30, 30, 30)]  # red, blue, yellow, magenta, white, orange, navy, black
PASS_BYTES = 1 << 22  # frames drawn per pass of the host renderer: bounds its temporaries to a few MB


class _Walls:
    """Two walls lo ≤ hi (arrays, broadcast) that points bounce between; the per-call part is :meth:`fold`."""

    def __init__(self, lo: np.ndarray, hi: np.ndarray) -> None:
        self.lo, self.span = lo, np.maximum(hi - lo, 0)
        self.period, self.moves = np.where(self.span > 0, 2 * self.span, 1), self.span > 0

    def fold(self, x: np.ndarray) -> np.ndarray:
        """``x`` folded into [lo, hi] as a point bouncing between the walls (a triangle wave)."""
        y = np.mod(x - self.lo, self.period)
        return self.lo + np.where(y <= self.span, y, self.period - y) * self.moves


def _runs(a: np.ndarray, width: int) -> np.ndarray:
    """Every run of ``width`` consecutive pixels of the C-contiguous uint8 [..., C] array ``a`` as one item.

    A 1-D view (items overlap): item j is pixels j … j+width−1 of ``a`` flattened to pixels, so one fancy
    index reads or writes whole image rows (much cheaper than indexing pixel by pixel).
    """
    c = a.shape[-1]
    return np.ndarray((a.size // c - width + 1,), np.dtype((np.void, width * c)), buffer=a, strides=(c,))


_KERNEL = r"""
extern "C" __global__ void draw_balls(const unsigned char* tex, const unsigned char* palette, const int* radii,
                                      const int* centres, const int* pans, unsigned char* out, int n_seq,
                                      int nb, int h, int w, int c, int th, int tw, long long total) {
    // One thread per output pixel p of out [k, n_seq, h, w, c] (grid-stride). Frame m = step * n_seq + stream.
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < total;
         p += (long long)gridDim.x * blockDim.x) {
        const int x = (int)(p % w);
        const long long q = p / w;
        const int y = (int)(q % h);
        const long long m = q / h;
        const int i = (int)(m % n_seq);
        const int* cen = centres + m * nb * 2;
        const unsigned char* src = 0;
        for (int b = 0; b < nb; ++b) {  // ball 0 is drawn last on the host, so the first disc that holds p wins
            const int dx = x - cen[2 * b], dy = y - cen[2 * b + 1], r = radii[i * nb + b];
            if (dx * dx + dy * dy <= r * r) {
                src = palette + ((long long)i * nb + b) * c;
                break;
            }
        }
        if (!src) src = tex + (((long long)i * th + pans[2 * m + 1] + y) * tw + pans[2 * m] + x) * c;
        unsigned char* dst = out + p * c;
        for (int ch = 0; ch < c; ++ch) dst[ch] = src[ch];
    }
}
"""


def _cupy():
    """The cupy module, imported on first use: only the device renderer needs it."""
    try:
        import cupy
    except ImportError as e:
        raise ImportError("BallSource.frames_block_device needs CuPy (pip install 'pvm-dist[gpu]'); "
                          "frames_block draws the same frames on the host") from e
    return cupy


@functools.cache
def _kernel():
    """The compiled-on-first-launch CUDA kernel that draws a block (see ``_KERNEL``)."""
    return _cupy().RawKernel(_KERNEL, "draw_balls")


class BallSource:
    """Moving balls with the green one's bounding box as the label (see the module docstring)."""

    kind = "synthetic"
    device_renderable = True
    period: int | None = None

    def __init__(self, image_shape: tuple[int, int, int], n_seq: int, seed: int, n_distractors: int = 3) -> None:
        import cv2

        self.name, self.shape, self.n_seq, self.seed = "synthetic:balls", check_shape(image_shape), n_seq, seed
        self.n_distractors = n_distractors
        h, w, c = self.shape
        d = min(h, w)
        nb = 1 + n_distractors
        rmin = max(1, round(0.05 * d))
        self.rmax = max(rmin, round(0.12 * d))
        textures, radii, p0, vel, pan0, panv, colors = [], [], [], [], [], [], []
        for i in range(n_seq):
            rng = np.random.default_rng([seed, i, 0xBA11])
            big = (2 * h, 2 * w)
            tex = cv2.resize(rng.uniform(70, 190, (5, 5, 3)), (big[1], big[0]), interpolation=cv2.INTER_CUBIC)
            tex += cv2.resize(rng.uniform(-30, 30, (14, 14, 3)), (big[1], big[0]), interpolation=cv2.INTER_CUBIC)
            tex += rng.uniform(-12, 12, (*big, 3))
            textures.append(np.clip(tex, 40, 230).astype(np.uint8))
            r = rng.integers(rmin, self.rmax + 1, nb)
            radii.append(r)
            p0.append(rng.uniform(0, 1, (nb, 2)) * [w, h])
            speed = rng.uniform(0.3, 1.2, nb) * d / 60.0
            angle = rng.uniform(0, 2 * np.pi, nb)
            vel.append(np.stack([speed * np.cos(angle), speed * np.sin(angle)], axis=1))
            pan0.append(rng.uniform(0, 1, 2) * [w, h])
            panv.append(rng.uniform(0.05, 0.25, 2) * rng.choice([-1, 1], 2) * d / 60.0)
            order = rng.permutation(len(DISTRACTOR_COLORS))
            colors.append([TARGET_COLOR] + [DISTRACTOR_COLORS[order[k % len(order)]] for k in range(n_distractors)])
        self.textures = np.stack(textures)  # uint8 [n_seq, 2H, 2W, 3]
        self.palette = np.array(colors, np.uint8)  # [n_seq, nb, 3] BGR; ball 0 is the target
        if c == 1:  # grey: convert the texture and the colours, which is converting every drawn pixel
            grey = cv2.cvtColor(self.textures.reshape(-1, 2 * w, 3), cv2.COLOR_BGR2GRAY)
            self.textures = grey.reshape(n_seq, 2 * h, 2 * w, 1)
            self.palette = cv2.cvtColor(self.palette, cv2.COLOR_BGR2GRAY).reshape(n_seq, nb, 1)
        self.radii = np.array(radii, np.int64)  # [n_seq, nb]
        self.colors = colors
        # motion of the balls and, as one more row, of the texture window: [n_seq, nb + 1, 2] (x, y)
        self._p0 = np.concatenate([np.array(p0), np.array(pan0)[:, None]], axis=1)
        self._vel = np.concatenate([np.array(vel), np.array(panv)[:, None]], axis=1)
        lo = np.concatenate([self.radii, np.zeros((n_seq, 1), np.int64)], axis=1)[..., None].astype(float)
        hi = np.concatenate([np.stack([w - 1 - self.radii, h - 1 - self.radii], axis=-1),
                             np.broadcast_to([[[w, h]]], (n_seq, 1, 2))], axis=1).astype(float)
        self._walls = _Walls(lo, hi)
        # what the host renderer reuses every call (see _draw)
        self._win = (min(2 * self.rmax + 1, h), min(2 * self.rmax + 1, w))
        self._corner_max = np.array([w - self._win[1], h - self._win[0]], np.int32)
        self._rows, self._row_item = np.arange(h), np.dtype((np.void, w * c))
        self._jy = np.arange(self._win[0], dtype=np.int32)
        self._jx = np.repeat(np.arange(self._win[1], dtype=np.int32), c)  # window column of each byte of a row
        self._texture_runs = _runs(self.textures, w)
        self._r2 = np.ascontiguousarray((self.radii**2).astype(np.int32).T)  # [nb, n_seq]
        self._colour = np.tile(self.palette.transpose(1, 0, 2), self._win[0] * self._win[1])  # [nb, n_seq, sy·sx·C]
        self._device: dict[int, tuple[Any, Any, Any]] = {}  # GPU id -> its copies of textures, palette, radii
        self._ahead = Lookahead(self.frames_block, (n_seq, h, w, c))
        self._last_layout: tuple[tuple[int, int] | None, np.ndarray | None] = (None, None)

    def layout(self, step: int, k: int = 1) -> tuple[np.ndarray, np.ndarray]:
        """The geometry of steps ``step … step+k−1``, which both renderers draw.

        Returns read-only int64 ball centres [k, n_seq, nb, 2] (x, y; ball 0 is the green target) and texture
        window offsets [k, n_seq, 2] (x, y): float64 motion reflected at the walls, rounded to whole pixels.
        The last block's geometry is kept, so drawing a block and labelling it compute it once.
        """
        if self._last_layout[0] != (step, k):
            t = (step + np.arange(k)).astype(np.float64)
            pos = np.floor(self._walls.fold(self._p0 + self._vel * t[:, None, None, None]) + 0.5).astype(np.int64)
            pos.setflags(write=False)
            self._last_layout = ((step, k), pos)
        pos = self._last_layout[1]
        return pos[:, :, :-1], pos[:, :, -1]

    def centres(self, step: int) -> np.ndarray:
        """int [n_seq, nb, 2] ball centres (x, y) at ``step``; ball 0 is the green target."""
        return self.layout(step)[0][0]

    def frames_block(self, step: int, k: int, out: np.ndarray | None = None) -> np.ndarray:
        """uint8 [k, n_seq, H, W, C] frames of steps ``step … step+k−1``, drawn on the host."""
        check_block(step, k)
        h, w, c = self.shape
        out = block_out(out, (k, self.n_seq, h, w, c))
        centres, pans = self.layout(step, k)
        flat, m_all = out.reshape(-1, h, w, c), k * self.n_seq
        per = max(1, PASS_BYTES // (h * w * c))
        centres, pans = centres.reshape(m_all, -1, 2), pans.reshape(m_all, 2)
        for m0 in range(0, m_all, per):
            m1 = min(m0 + per, m_all)
            self._draw(flat[m0:m1], np.arange(m0, m1) % self.n_seq, centres[m0:m1], pans[m0:m1])
        return out

    def _draw(self, out: np.ndarray, seq: np.ndarray, centres: np.ndarray, pans: np.ndarray) -> None:
        """Draw M frames of streams ``seq`` [M] into the C-contiguous uint8 ``out`` [M, H, W, C].

        Frame m is its stream's texture seen through the window at ``pans[m]`` (x, y), then the discs at
        ``centres[m]`` [nb, 2], the last ball first, so ball 0 is on top. Each disc is blended into its
        (2·rmax+1)² window (shifted inside the frame at the walls, clipped where the frame is smaller),
        whose rows are read and written whole.
        """
        m, h, w, c = out.shape
        th, tw = self.textures.shape[1:3]
        centres, pans = centres.astype(np.int32), pans.astype(np.int32)  # small ints: int32 arithmetic is faster
        src = ((seq * th + pans[:, 1])[:, None] + self._rows) * tw + pans[:, 0, None]
        out.reshape(m, h, w * c).view(self._row_item)[..., 0] = self._texture_runs[src]
        sx, jy = self._win[1], self._jy
        centres = centres.transpose(1, 0, 2)  # [nb, m, 2]: ball-major, so each ball's arrays are contiguous
        corner = np.minimum(np.maximum(centres - self.rmax, 0), self._corner_max)  # window (x, y) in the frame
        dx, dy = (corner - centres).transpose(2, 0, 1)  # [nb, m] each
        at = ((np.arange(m, dtype=np.int32) * h + corner[..., 1])[..., None] + jy) * w + corner[..., 0, None]
        room = self._r2[:, seq, None] - (dy[..., None] + jy) ** 2  # [nb, m, sy]: r² − dy² per window row
        inside = ((dx[..., None] + self._jx) ** 2)[:, :, None, :] <= room[..., None]  # [nb, m, sy, sx·c] per byte
        windows = _runs(out, sx)  # item at[b, f, j]: row j of ball b's window in frame f
        # distractors first, the green target (ball 0) last
        for at_b, inside_b, colour_b in zip(at[::-1], inside.reshape(len(at), m, -1)[::-1], self._colour[::-1, seq]):
            win = windows[at_b]
            np.copyto(win.view(np.uint8), colour_b, where=inside_b)
            windows[at_b] = win

    def frames(self, step: int) -> np.ndarray:
        """uint8 [n_seq, H, W, C] frames of ``step`` (drawn a few steps at a time: see :class:`Lookahead`)."""
        return self._ahead.frames(step)

    def frames_block_device(self, step: int, k: int) -> Any:
        """The block of :meth:`frames_block`, bit for bit, drawn on the current GPU as a CuPy uint8 array.

        The textures go to the GPU once (kept per device); each call uploads only :meth:`layout`'s
        centres and offsets, computed on the host, and runs one thread per output pixel.
        """
        cp = _cupy()
        check_block(step, k)
        h, w, c = self.shape
        dev = cp.cuda.Device().id
        if dev not in self._device:
            self._device[dev] = (cp.asarray(self.textures), cp.asarray(self.palette),
                                 cp.asarray(self.radii.astype(np.int32)))
        textures, palette, radii = self._device[dev]
        centres, pans = self.layout(step, k)
        out = cp.empty((k, self.n_seq, h, w, c), cp.uint8)
        total = out.size // c
        _kernel()((min(-(-total // 256), 1 << 20),), (256,),
                  (textures, palette, radii, cp.asarray(centres.astype(np.int32)), cp.asarray(pans.astype(np.int32)),
                   out, np.int32(self.n_seq), np.int32(self.radii.shape[1]), np.int32(h), np.int32(w), np.int32(c),
                   np.int32(2 * h), np.int32(2 * w), np.int64(total)))
        return out

    def boxes_block(self, step: int, k: int) -> np.ndarray:
        """int32 [k, n_seq, 4] box (x, y, w, h) of the green ball at steps ``step … step+k−1``."""
        check_block(step, k)
        cx, r = self.layout(step, k)[0][:, :, 0], self.radii[:, 0]
        side = np.broadcast_to(2 * r, (k, self.n_seq))
        return np.stack([cx[..., 0] - r, cx[..., 1] - r, side, side], axis=-1).astype(np.int32)

    def boxes(self, step: int) -> np.ndarray:
        """int32 [n_seq, 4] box (x, y, w, h) of the green ball."""
        return self.boxes_block(step, 1)[0]

    def labels_block(self, step: int, k: int) -> np.ndarray:
        """float32 [k, n_seq, H, W] masks of the green ball's boxes."""
        return box_masks(self.boxes_block(step, k), self.shape)

    def labels(self, step: int) -> np.ndarray:
        return self.labels_block(step, 1)[0]

    def cuts(self, step: int) -> np.ndarray:
        """True for every stream at step 0 only: the scenes run on without breaks."""
        return np.full(self.n_seq, step == 0)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "files": [], "frames": None, "labelled": True,
                "n_seq": self.n_seq, "image_shape": list(self.shape), "seed": self.seed,
                "balls": 1 + self.n_distractors, "target": "green ball (BGR 0,200,0)"}
