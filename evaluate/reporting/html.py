"""The report's HTML pieces: the page's script and style, tables, embedded PNG images, numbers."""
from __future__ import annotations

import base64
import io
import math
import re
from html import escape
from typing import Any, Callable, Collection, Mapping

import numpy as np
import pandas as pd
from PIL import Image

from counteraudit.evaluate.reporting.tables import format_cell
from counteraudit.evaluate.scoring.localization import PAPER_SUCCESS_AUROC, localization_call

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
    // plot text that sticks out of its <svg> is clipped: count it
    var clipped = [], texts = document.querySelectorAll("svg text");
    for (var t = 0; t < texts.length; t++) {  // on screen, rotated text included
      var box = texts[t].getBoundingClientRect(), frame = texts[t].ownerSVGElement.getBoundingClientRect();
      if (box.left < frame.left - 0.5 || box.right > frame.right + 0.5 || box.top < frame.top - 0.5
          || box.bottom > frame.bottom + 0.5) { clipped.push(texts[t].textContent); }
    }
    document.body.setAttribute("data-clipped-labels", String(clipped.length));
    if (clipped.length) { document.body.setAttribute("data-clipped-texts", clipped.join(" | ")); }
    // where the summary sits on the first screen, and whether anything is wider than the window
    var summary = document.getElementById("summary");
    if (summary) {
      var rect = summary.getBoundingClientRect();
      document.body.setAttribute("data-summary-top", String(Math.round(rect.top + window.scrollY)));
      document.body.setAttribute("data-summary-overflow", String(summary.scrollWidth > summary.clientWidth + 1));
    }
    document.body.setAttribute("data-viewport", window.innerWidth + "x" + window.innerHeight);
    document.body.setAttribute("data-page-overflow",
                               String(document.documentElement.scrollWidth > window.innerWidth + 1));
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
/* verdict colours (VERDICTS names each): what the data supports, never pass or fail; red is
   kept for a run's own failures (.warn, .fail). Green: a statistical verdict that it sees the
   defect; hatched green: the paper's rule only; amber: partly or above chance only; blue: missed
   with power, below chance or worse than the outputs; grey: cannot be told apart */
.v-detected, .v-localized, .v-adds { background: #cdeccd; }
.v-paper-rule { background: repeating-linear-gradient(135deg, #c9e6c9 0 4px, #f4faf4 4px 8px); }
.v-partial, .v-above-chance { background: #fbecc8; }
.v-not-detected, .v-below-chance, .v-less { background: #d9e5f5; }
.v-inconclusive, .v-within-chance, .v-same { background: #ececec; color: #444; }
.v-implant-failed { color: #888; }
.legend span { padding: 1px 6px; margin: 0 6px 3px 0; border: 1px solid #ddd; display: inline-block; }
.table-wrap { max-width: 100%; overflow-x: auto; }
svg { max-width: 100%; height: auto; }
.table-wrap > table { margin: 0.3em 0; }
#summary { background: #f7f9fb; border: 1px solid #dde3ea; padding: 0.2em 1em 0.6em; }
#summary h2 { margin-top: 0.4em; } #summary h3 { margin: 0.8em 0 0.2em; } #summary li { margin: 0.15em 0; }
#summary ul { padding-left: 1.3em; }
@media (max-width: 600px) {
  body { margin: 0.6em auto; padding: 0 0.6em; } nav ul { columns: 1; }
  h1 { font-size: 1.3em; } #summary { padding: 0.1em 0.6em 0.5em; }
}
"""


CellClass = Callable[[Any], "str | None"]
# a cell's row (column -> value), its column and its value -> a CSS class for it, or None
CellClassAt = Callable[[Mapping[str, Any], str, Any], "str | None"]


def html_table(frame: pd.DataFrame, *, float_format: str = "{:.3f}", caption: str | None = None,
               cell_class: CellClass | None = None,
               class_columns: Collection[str] | None = None,
               cell_class_at: CellClassAt | None = None) -> str:
    """A pandas frame (flat columns, index ignored) as an HTML table; numbers right-aligned;
    wrapped so that a table wider than a phone's screen scrolls on its own.
    ``cell_class``: a cell's value -> a CSS class for it (or None), e.g. ``verdict_class``;
    ``cell_class_at``: the same from the cell's row and column too (``auroc_class``: each
    model's own chance band); ``class_columns``: only these columns' cells get one (default:
    every column)."""
    numeric = [pd.api.types.is_numeric_dtype(frame[c]) and not pd.api.types.is_bool_dtype(frame[c])
               for c in frame.columns]
    classed = [class_columns is None or c in class_columns for c in frame.columns]
    head = "".join(f"<th>{escape(str(c))}</th>" for c in frame.columns)
    body = []
    for row in frame.itertuples(index=False):
        values = dict(zip(frame.columns, row))
        classify = [(lambda v, c=column: cell_class_at(values, c, v)) if cell_class_at and use
                    else cell_class if use else None
                    for column, use in zip(frame.columns, classed)]
        cells = "".join(f'<td{_classes(v, num, how)}>'
                        f"{escape(format_cell(v, float_format))}</td>"
                        for v, num, how in zip(row, numeric, classify))
        body.append(f"<tr>{cells}</tr>")
    cap = f"<caption>{escape(caption)}</caption>" if caption else ""
    return (f'<div class="table-wrap"><table>{cap}<thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>")


def mapping_table(mapping: Mapping[str, Any], *, key: str, value: str,
                  caption: str | None = None) -> str:
    """A dict as a two-column table (key, value), in the dict's order; nested dicts each become
    a table of their own after it, captioned with their key."""
    flat = {k: v for k, v in mapping.items() if not isinstance(v, Mapping)}
    nested = [mapping_table(v, key=key, value=value, caption=str(k))
              for k, v in mapping.items() if isinstance(v, Mapping)]
    own = (html_table(pd.DataFrame({key: [str(k) for k in flat], value: list(flat.values())}),
                      caption=caption) if flat else "")
    return own + "".join(nested)


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


def _finite_number(value: Any) -> bool:
    return (isinstance(value, (int, float, np.number)) and not isinstance(value, (bool, np.bool_))
            and math.isfinite(float(value)))


def fraction_class(value: Any) -> str | None:
    """Table 1's cells (the fraction of a family's models the paper's rule flags): every model
    (v-paper-rule, not the colour of a statistical verdict), some (v-partial) or none (no
    colour: the rule claims nothing, a miss included, without the power a verdict states)."""
    if not _finite_number(value):
        return None
    return "v-paper-rule" if value >= 1 else None if value <= 0 else "v-partial"


def margin_class(value: Any) -> str | None:
    """A detection margin (Abar over the highest reference's): above 1 is flagged by the paper's
    rule (v-paper-rule); a margin under 1 gets no colour. Also as the tables print it
    (``margin_text``: the digits that show its side of 1, or the verdict beside)."""
    if isinstance(value, str):
        verdict = re.search(r"\((not )?detected\)$", value)
        if verdict:
            return None if verdict.group(1) else "v-paper-rule"
        try:
            value = float(value)
        except ValueError:  # "n/a"
            return None
    return "v-paper-rule" if _finite_number(value) and value > 1 else None


def call_class(call: str | None) -> str | None:
    """The CSS class of a reading (a verdict or a ``localization_call``): "within chance" ->
    v-within-chance."""
    return None if call is None else "v-" + call.replace(" ", "-")


def auroc_class(target: float, bands: pd.DataFrame) -> CellClassAt:
    """Table 2's cells (a "method" column, one column per model) read against each cell's own
    chance band (``localization_call``): ``bands`` holds method (as Table 2's rows name it),
    model, chance_low and chance_high (``localization.table2_bands``)."""
    limits = {(str(m), str(model)): (low, high) for m, model, low, high in zip(
        bands["method"], bands["model"], bands["chance_low"], bands["chance_high"])}

    def classify(row: Mapping[str, Any], column: str, value: Any) -> str | None:
        band = limits.get((str(row.get("method")), str(column)))
        if band is None or not _finite_number(value):
            return None
        return call_class(localization_call(float(value), *band, target=target))
    return classify


def versus_class(value: Any) -> str | None:
    """A cell of the comparison with the outputs-only control ("+0.05 [-0.02, 0.11] same")."""
    if not isinstance(value, str):
        return None
    word = value.rsplit(" ", 1)[-1]
    return f"v-{word}" if word in ("adds", "same", "less") else None


# Every verdict colour and what it means, for the legends (the style sheet's v-* classes)
VERDICTS = {
    "v-detected": "detected (a statistical verdict: null p-value)",
    "v-paper-rule": "detected by the paper's rule only, not a statistical verdict",
    "v-partial": "some of the family's models (the paper's rule)",
    "v-not-detected": "not detected (missed with power)",
    "v-inconclusive": "inconclusive (undecidable at this scale)",
    "v-localized": f"localized (AUROC \u2265 {PAPER_SUCCESS_AUROC:g} and above its chance band)",
    "v-above-chance": f"above its chance band, under {PAPER_SUCCESS_AUROC:g}",
    "v-within-chance": "within its chance band",
    "v-below-chance": "below its chance band",
}


def legend(*entries: tuple[str, str] | str) -> str:
    """A line of colour swatches: (CSS class, what it means), or a class of ``VERDICTS``."""
    pairs = [(entry, VERDICTS[entry]) if isinstance(entry, str) else entry for entry in entries]
    return ('<p class="note legend">'
            + "".join(f'<span class="{name}">{escape(text)}</span>' for name, text in pairs)
            + "</p>")


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
