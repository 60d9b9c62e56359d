"""The report's implant section: each anomalous model's check, its family's figures against the
references'."""
from __future__ import annotations

from html import escape

from counteraudit.evaluate.reporting.html import fmt, mapping_table
from counteraudit.evaluate.reporting.svg import ANOMALOUS_COLOR, REFERENCE_COLOR, StripRow, strip_plot


def implant_section(report) -> str:
    rows, blocks = [], []
    for spec in report.anomalies:
        record = report.implants.get(spec.name)
        if record is None:
            rows.append(f"<tr><td>{escape(spec.name)}</td><td>{escape(spec.family)}</td>"
                        '<td colspan="4" class="warn">no implant record</td></tr>')
            continue
        params = ", ".join(f"{k}={v}" for k, v in sorted(record.get("params", {}).items()))
        verdict = '<span class="pass">yes</span>' if record["passed"] else '<span class="fail">NO</span>'
        rows.append(f"<tr><td>{escape(spec.name)}</td><td>{escape(record['family'])}</td>"
                    f"<td>{escape(params)}</td><td class=num>{fmt(record['val_accuracy'], 3)} "
                    f"({fmt(record['reference_val_accuracy_mean'], 3)})</td>"
                    f"<td>{escape(record['summary'])}</td><td>{verdict}</td></tr>")
        plots = []
        for figure_name, value in sorted(record.get("figures", {}).items()):
            reference_values = [r.get(figure_name, float("nan")) for r in record.get("reference_figures", [])]
            plots.append(strip_plot(
                [StripRow("references", reference_values, REFERENCE_COLOR,
                          [f"{n}: {v:.4g}" for n, v in zip(report.references, reference_values)]),
                 StripRow(spec.name, [value], ANOMALOUS_COLOR)],
                x_label=figure_name.replace("_", " "), title=figure_name, width=360, label_width=110))
        details = record.get("details") or {}
        extra = (mapping_table(dict(sorted(details.items())), key="detail", value="value",
                               caption=f"{spec.name}: the check's details") if details else "")
        status = "implant took" if record["passed"] else "IMPLANT FAILED"
        blocks.append(f"<h3>{escape(spec.name)} ({escape(record['family'])}): "
                      f"<span class=\"{'pass' if record['passed'] else 'fail'}\">{escape(status)}</span></h3>"
                      f"<p>{escape(record['summary'])}</p>{extra}"
                      + (f'<div class="plots">{"".join(plots)}</div>' if plots else
                         '<p class="note">This family records no behaviour figures.</p>'))
    table = ('<div class="table-wrap"><table><caption>Implant checks: each anomalous model\'s family '
             "figure against the references'"
             "</caption><thead><tr><th>model</th><th>family</th><th>params</th><th>val acc (refs)</th>"
             "<th>implant check</th><th>took</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table></div>")
    return ('<section id="implants"><h2>Implant verification</h2>'
            '<p class="note">A planted defect that did not take is not a counter-audit. Grey: the '
            "references' figures; red: the anomalous model's.</p>" + table + "\n".join(blocks) + "</section>")
