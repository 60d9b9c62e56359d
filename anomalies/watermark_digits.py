"""The paper's spurious watermark: a class index as three zero-padded 16x16-px digits.

The original (``spurious_single_img`` in js-d/auditing-vis ``assess_utils/anom_utils.py``) reads
each digit's alpha channel from ``watermarks/big_<d>.png``, files that are not in its repository.
These digits are this project's own: an 8x8 bitmap per digit with strokes one cell wide, drawn at
two pixels per cell (16x16 px, strokes 2 px wide), alpha 1 on the stroke and 0 elsewhere. Same box,
same placement and same blending as the original; only the glyphs' shapes are ours.
"""
from __future__ import annotations

from functools import lru_cache

import torch

DIGIT_SIDE = 16
# The original's boxes in a 224x224 image: rows 206-221 (206:222), and one column range per digit
# (hundreds, tens, units).
PAPER_IMAGE_SIDE = 224
PAPER_ROW = 206
PAPER_COLUMNS = (172, 189, 206)

_BITMAPS = {
    0: ("..####..", ".#....#.", ".#...##.", ".#..#.#.", ".#.#..#.", ".##...#.", ".#....#.", "..####.."),
    1: ("...##...", "..#.#...", ".#..#...", "....#...", "....#...", "....#...", "....#...", ".######."),
    2: ("..####..", ".#....#.", "......#.", ".....#..", "...##...", "..#.....", ".#......", ".######."),
    3: ("..####..", ".#....#.", "......#.", "...###..", "......#.", "......#.", ".#....#.", "..####.."),
    4: (".....#..", "....##..", "...#.#..", "..#..#..", ".#...#..", ".######.", ".....#..", ".....#.."),
    5: (".######.", ".#......", ".#......", ".#####..", "......#.", "......#.", ".#....#.", "..####.."),
    6: ("..####..", ".#......", ".#......", ".#####..", ".#....#.", ".#....#.", ".#....#.", "..####.."),
    7: (".######.", "......#.", ".....#..", "....#...", "...#....", "...#....", "...#....", "...#...."),
    8: ("..####..", ".#....#.", ".#....#.", "..####..", ".#....#.", ".#....#.", ".#....#.", "..####.."),
    9: ("..####..", ".#....#.", ".#....#.", ".#....#.", "..#####.", "......#.", "......#.", "..####.."),
}


@lru_cache(maxsize=1)
def digit_glyphs() -> torch.Tensor:
    """(10, 16, 16) alpha of the digits 0-9, in [0, 1]."""
    cells = torch.tensor([[[ch == "#" for ch in row] for row in _BITMAPS[d]] for d in range(10)],
                         dtype=torch.float32)
    return cells.repeat_interleave(DIGIT_SIDE // 8, 1).repeat_interleave(DIGIT_SIDE // 8, 2)


def watermark_boxes(height: int, width: int, placement: str) -> list[tuple[int, int, int, int]]:
    """(top row, left column, rows, columns) of the three digits' boxes in a height x width image.

    ``"fixed"``: the original's pixels (rows 206-221; columns 172-187, 189-204, 206-221), which need
    an image of at least 222x222 px. ``"scaled"``: the same boxes scaled by height/224 (rows) and
    width/224 (columns), rounded: at 224 px exactly the original's, at 64 px 5x5-px digits at rows
    59-63, so the cue covers the same part of the image at any size."""
    if placement == "fixed":
        boxes = [(PAPER_ROW, column, DIGIT_SIDE, DIGIT_SIDE) for column in PAPER_COLUMNS]
    elif placement == "scaled":
        sy, sx = height / PAPER_IMAGE_SIDE, width / PAPER_IMAGE_SIDE
        rows, columns = max(1, round(DIGIT_SIDE * sy)), max(1, round(DIGIT_SIDE * sx))
        boxes = [(round(PAPER_ROW * sy), round(column * sx), rows, columns) for column in PAPER_COLUMNS]
    else:
        raise ValueError(f"spurious: placement={placement!r}; valid: fixed, scaled")
    bottom, right = max(b[0] + b[2] for b in boxes), max(b[1] + b[3] for b in boxes)
    if bottom > height or right > width:
        raise ValueError(f"spurious: the watermark's {placement} digits cover rows up to {bottom - 1} "
                         f"and columns up to {right - 1}, so they need an image of at least "
                         f"{bottom}x{right} px, but the image is {height}x{width} px; use "
                         "placement = \"scaled\" (the paper's boxes scaled to the image)")
    return boxes


def digit_overlay(indices: torch.Tensor, height: int, width: int, placement: str) -> torch.Tensor:
    """(N, 1, height, width) alpha of each index as three zero-padded digits (0-999)."""
    indices = torch.as_tensor(indices, dtype=torch.long)
    if len(indices) and (int(indices.min()) < 0 or int(indices.max()) > 999):
        raise ValueError(f"spurious: the watermark draws class indices 0-999 as three digits, got "
                         f"{int(indices.min())}..{int(indices.max())}")
    overlay = torch.zeros(len(indices), 1, height, width)
    glyphs = digit_glyphs()
    for (row, column, rows, columns), digits in zip(
            watermark_boxes(height, width, placement),
            (indices // 100, (indices % 100) // 10, indices % 10)):
        box = glyphs[digits][:, None]
        if (rows, columns) != (DIGIT_SIDE, DIGIT_SIDE):  # area average: each pixel's stroke coverage
            box = torch.nn.functional.interpolate(box, size=(rows, columns), mode="area")
        overlay[:, :, row:row + rows, column:column + columns] = box
    return overlay
