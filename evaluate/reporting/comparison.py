"""The report's section "Method against method" (``counteraudit report --method A --against B``):
the tables ``scoring/pair_tables.py`` makes, each with its caption, and where a part could not be
computed, the sentence that says why."""
from __future__ import annotations

from html import escape

from counteraudit.evaluate.reporting.html import html_table, versus_class
from counteraudit.evaluate.scoring import pair_tables as part
from counteraudit.evaluate.scoring.pair_tables import Comparison, significant_lines

SECTION_ID = "comparison"
TITLE = "Method against method"


def comparison_entries(comparison: Comparison | None) -> list[tuple[str, str]]:
    """The section's entry in the report's contents, where it has one."""
    return [] if comparison is None else [(SECTION_ID, TITLE)]


def comparison_section(comparison: Comparison | None) -> str:
    """The section, or "" without --against."""
    if comparison is None:
        return ""
    pairs = "; ".join(f"{method} vs {against}" for method, against in comparison.pairs)
    parts = [f'<section id="{SECTION_ID}"><h2>{TITLE}</h2>',
             f"<p>Each pair on the same images and models ({escape(comparison.distance_name)}): "
             f"{escape(pairs)}.</p>"]
    for table, caption, cell_class in [
            (part.MCNEMAR, part.MCNEMAR_CAPTION, None),
            (part.DETECTION_COUNTS, part.COUNTS_CAPTION, None),
            (part.DETECTION, part.DETECTION_CAPTION, versus_class),
            (part.LOCALIZATION, part.LOCALIZATION_CAPTION, versus_class),
            (part.FAMILIES, comparison.family_caption, None)]:
        frame = comparison.get(table)
        if frame is not None:
            parts.append(html_table(frame, caption=caption, cell_class=cell_class))
        if table in comparison.notes:
            parts.append(f'<p class="note">{escape(comparison.notes[table])}</p>')
    differences = comparison.get(part.FAMILIES)
    if differences is not None:
        items = "".join(f"<li>{escape(line)}</li>" for line in significant_lines(differences))
        parts.append(f"<p><b>Significant after Holm:</b></p><ul>{items}</ul>")
    return "\n".join(parts) + "</section>"
