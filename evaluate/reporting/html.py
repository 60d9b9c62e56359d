"""The report's HTML pieces: the page's script and style, tables, embedded PNG images, numbers."""
from __future__ import annotations

import base64
import io
import math
from html import escape
from typing import Any, Callable

import numpy as np
import pandas as pd
from PIL import Image

from counteraudit.evaluate.reporting.tables import format_cell

# ---------------------------------------------------------------- the page's script and style
# Installed first in <head>: counts script errors and console.error calls from the start, and on
# load records on <body> whether every image decoded, so a headless browser's DOM dump shows it.
SCRIPT = """
(function () {
  var errors = [];
  window.addEventListener("error", function (event) {
    errors.push(String(event.message || "error"));
  });
  window.addEventListener("unhandledrejection", function (event) {
    errors.push("unhandled rejection: " + String(event.reason));
  });
  var consoleError = console.error;
  console.error = function () {
    errors.push(Array.prototype.join.call(arguments, " "));
    return consoleError.apply(console, arguments);
  };
  window.addEventListener("load", function () {
    var images = document.images, loaded = 0, broken = [];
    for (var i = 0; i < images.length; i++) {
      if (images[i].complete && images[i].naturalWidth > 0) { loaded++; }
      else { broken.push(images[i].alt); images[i].classList.add("broken"); }
    }
    document.body.setAttribute("data-images-loaded", loaded + "/" + images.length);
    document.body.setAttribute("data-errors", String(errors.length));
    if (broken.length) { document.body.setAttribute("data-broken-images", broken.join(" | ")); }
    if (errors.length) { document.body.setAttribute("data-error-messages", errors.join(" | ")); }
  });
})();
"""

STYLE = """
body { font-family: sans-serif; font-size: 14px; margin: 1.5em auto; max-width: 1250px; color: #222;
       padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { border-bottom: 2px solid #ccc; margin-top: 2em; } h3 { margin-top: 1.4em; }
table { border-collapse: collapse; margin: 0.6em 0; }
th, td { border: 1px solid #ddd; padding: 3px 7px; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
caption { caption-side: top; text-align: left; font-weight: bold; padding: 4px 0; }
.note { color: #555; max-width: 60em; } .warn { color: #b00; font-weight: bold; }
.pass { color: #070; font-weight: bold; } .fail { color: #b00; font-weight: bold; }
figure { display: inline-block; margin: 2px 4px; text-align: center; vertical-align: top; }
figcaption { font-size: 11px; color: #333; max-width: 130px; overflow-wrap: anywhere; }
img.viz { image-rendering: pixelated; border: 1px solid #ccc; background: #fff; }
img.broken { outline: 3px solid red; }
table.examples td, table.examples th { text-align: center; }
.plots { display: flex; flex-wrap: wrap; gap: 10px 24px; align-items: flex-start; }
details { margin: 0.4em 0; } summary { cursor: pointer; color: #035; }
nav ul { columns: 2; }
td.v-detected { background: #d5efd5; } td.v-not-detected { background: #f6d2d2; }
td.v-inconclusive { background: #ececec; color: #444; } td.v-implant-failed { color: #888; }
"""


def html_table(frame: pd.DataFrame, *, float_format: str = "{:.3f}", caption: str | None = None,
               cell_class: Callable[[Any], str | None] | None = None) -> str:
    """A pandas frame (flat columns, index ignored) as an HTML table; numbers right-aligned.
    ``cell_class``: a cell's value -> a CSS class for it (or None), e.g. ``verdict_class``."""
    numeric = [pd.api.types.is_numeric_dtype(frame[c]) and not pd.api.types.is_bool_dtype(frame[c])
               for c in frame.columns]
    head = "".join(f"<th>{escape(str(c))}</th>" for c in frame.columns)
    body = []
    for row in frame.itertuples(index=False):
        cells = "".join(f'<td{_classes(v, num, cell_class)}>{escape(format_cell(v, float_format))}</td>'
                        for v, num in zip(row, numeric))
        body.append(f"<tr>{cells}</tr>")
    cap = f"<caption>{escape(caption)}</caption>" if caption else ""
    return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _classes(value: Any, numeric: bool, cell_class) -> str:
    names = [*(["num"] if numeric else []), *([cell_class(value)] if cell_class else [])]
    names = [name for name in names if name]
    return f' class="{" ".join(names)}"' if names else ""


def verdict_class(value: Any) -> str | None:
    """The CSS class of a cell that holds or ends with a verdict ("... not detected (paper
    0.20)" included): v-detected, v-not-detected, v-inconclusive or v-implant-failed."""
    if not isinstance(value, str):
        return None
    text = value.split(" (paper")[0]
    for verdict in ("not detected", "implant failed", "inconclusive", "detected"):
        if text.endswith(verdict):
            return "v-" + verdict.replace(" ", "-")
    return None


def png_data_uri(image: np.ndarray, max_side: int) -> tuple[str, int, int]:
    """A uint8 (H, W, 3) image as a PNG data URI (downscaled to ``max_side``), with its size."""
    picture = Image.fromarray(np.ascontiguousarray(image.astype(np.uint8)))
    if max(picture.size) > max_side:
        scale = max_side / max(picture.size)
        picture = picture.resize((max(1, round(picture.width * scale)), max(1, round(picture.height * scale))),
                                 Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG", optimize=True)
    return ("data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii"),
            picture.width, picture.height)


def fmt(value: Any, digits: int = 2) -> str:
    try:
        value = float(value)
    except (TypeError, ValueError):
        return "n/a"
    return f"{value:.{digits}f}" if math.isfinite(value) else "n/a"


def is_detected(value: Any) -> bool:
    """The ``detected`` column holds booleans for anomalous models and NaN for references."""
    return isinstance(value, (bool, np.bool_)) and bool(value)


def median_image(scores: pd.Series) -> int | None:
    """The image (index of ``scores``) with the lower-median finite score; ties by image index."""
    finite = scores[np.isfinite(scores.to_numpy(dtype=float))]
    if finite.empty:
        return int(scores.index.min()) if len(scores) else None
    ordered = sorted(zip(finite.to_numpy(dtype=float), finite.index.astype(int)))
    return int(ordered[(len(ordered) - 1) // 2][1])
