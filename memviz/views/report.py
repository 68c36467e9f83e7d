"""One offline HTML report per plan: the JupyterLab views themselves, so the file opens from disk with
no network and shows what the MIME renderer shows (Memory with the step inspector and time axis,
Packing, the CD-graph, chunk regions).

The page inlines `memviz/static/report.js` (labextension/src/standalone.ts bundled with plotly.js and
wasm Graphviz by labextension/build-report.mjs during the package build) and the plan document as
JSON.  Names from the model are untrusted: the JSON is embedded with `<` and `>` escaped so no string
can close its script element, and the views put names in the page only as text.
"""

from __future__ import annotations

import csv
import html
import io
import json
import sys
import urllib.parse
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from memviz.budget import format_bytes
from memviz.plans.planfile import check_values, validate_document, write_text_safely

#: The bundled views, built with the package (git-ignored: a source checkout has it once built).
BUNDLE = Path(__file__).parents[1] / "static" / "report.js"


class ReportBundleMissing(FileNotFoundError):
    """The report's script was never built (a source checkout without `pip install -e .`)."""


def require_bundle() -> Path:
    """The built views' script; raises `ReportBundleMissing` saying how to build it."""
    if not BUNDLE.is_file():
        raise ReportBundleMissing(
            f"the offline report's views are not built ({BUNDLE} is missing): run `pip install -e .` "
            "(or `jlpm install && jlpm build`) in the memviz checkout, then write the report again"
        )
    return BUNDLE


def bundle_script() -> str:
    """The views' script, safe inside a `<script>` element."""
    script = require_bundle().read_text(encoding="utf-8")
    # Only JS strings or regexes can hold `</script`; `<\/` reads the same there and ends no element.
    return script.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")


def embed_json(obj: Any) -> str:
    """JSON for a `<script type="application/json">` element: no string in it can end the element."""
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False)  # standard JSON only, as save writes
    return text.replace("<", "\\u003c").replace(">", "\\u003e")


def trusted_document(plan_or_doc: Any) -> dict[str, Any]:
    """The document a report shows: a Plan's own, or a plan dict (perhaps read from an untrusted file)
    validated, with its CD-graph DOT rebuilt from the validated graph -- DOT text from a document is
    never shown, since DOT attributes (URL=, href=, image=) become links and images in the SVG."""
    if not isinstance(plan_or_doc, dict):
        doc = plan_or_doc.to_dict()  # to_dict builds the DOT from the graph (cdgraph_dict)
        check_values(doc, "plan")  # a name with a NUL or a lone surrogate cannot be written as UTF-8
        return doc
    from memviz.plans.cdgraph import cdgraph_dict

    doc = validate_document(plan_or_doc, "plan document")
    return {**doc, "cdgraph": cdgraph_dict(doc)}


def timeline_csv(doc: dict[str, Any]) -> str:
    """The planned (and eager) memory per schedule step as CSV: step, op, bytes per category, total."""
    graph = doc["graph"]["computes"]
    rows = []
    for run in ("planned", "baseline"):
        timeline, schedule = doc[run]["timeline"], doc[run]["schedule"]
        cats = sorted(timeline["by_category"])
        for i, (step, total) in enumerate(zip(schedule, timeline["step_bytes"], strict=True)):
            kind, node = step
            op = graph[node]["name"] if kind == "compute" else f"free d{node}"
            rows.append([run, str(i), op, *(str(timeline["by_category"][c][i]) for c in cats), str(total)])
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["run", "step", "op", *sorted(doc["planned"]["timeline"]["by_category"]), "total_bytes"])
    writer.writerows(rows)
    return out.getvalue()


def _header_html(doc: dict[str, Any], header: dict[str, str], notice: str | None) -> str:
    """What the report describes and how it was made (every value escaped: model names, commands and
    paths are untrusted), a notice such as "minimum-budget plan", and the timeline as a CSV download."""
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in header.items())
    warn = (f'<p class="memviz-report-notice" role="alert"><strong>{html.escape(notice)}</strong></p>'
            if notice else "")
    csv_href = "data:text/csv;charset=utf-8," + urllib.parse.quote(timeline_csv(doc))
    link = f'<a download="memviz-timeline.csv" href="{html.escape(csv_href)}">timeline as CSV</a>'
    return f'<header class="memviz-report-header">{warn}<table>{rows}</table><p>{link}</p></header>'



def report_header(doc: dict[str, Any], command: str | None = None) -> dict[str, str]:
    """The header rows: command, date, budget, device, memviz and torch versions."""
    import memviz

    budget = doc.get("budget_bytes")
    rows = {"command": command or "", "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "model": f"{doc['model']['name']} ({doc['model']['mode']})",
            "budget": format_bytes(budget) if budget else "none (eager order)",
            "strategy": str(doc.get("strategy", "")),
            "device": doc["device"]["name"] + (" (estimated)" if doc["device"].get("estimated") else ""),
            "memviz": memviz.__version__, "torch": _torch_version()}
    return {k: v for k, v in rows.items() if v}


def _torch_version() -> str:
    torch = sys.modules.get("torch")
    return getattr(torch, "__version__", "") if torch is not None else ""


def render_html(doc: dict[str, Any], *, command: str | None = None, notice: str | None = None) -> str:
    """The report page of plan document `doc` (a Plan's `to_dict()` or `trusted_document`); raises
    `ReportBundleMissing` before writing anything.  A header says what it describes and how it was made
    (`command`), and carries `notice` when given."""
    script = bundle_script()
    title = html.escape(f"memviz report: {doc['model']['name']}")
    head = _header_html(doc, report_header(doc, command), notice)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="color-scheme" content="light dark">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>{title}</title></head>
<body>{head}<div id="memviz-report"></div>
<script type="application/json" id="memviz-plan">{embed_json(doc)}</script>
<script>{script}</script>
<script>memvizReport.renderReportFrom("memviz-report", "memviz-plan");</script>
</body></html>
"""


def write_report(plan_or_doc: Any, path: str | Path, *, overwrite: bool = False, command: str | None = None,
                 notice: str | None = None) -> Path:
    """Write the offline HTML report; an existing file is kept unless `overwrite=True`."""
    doc = trusted_document(plan_or_doc)
    page = render_html(doc, command=command, notice=notice)
    return write_text_safely(Path(path), page, overwrite=overwrite)
