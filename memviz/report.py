"""One offline HTML report per plan: the JupyterLab views themselves, so the file opens from disk with
no network and shows what the MIME renderer shows (Memory with the step inspector and time axis,
Packing, the CD-graph, chunk regions).

The page inlines `memviz/static/report.js` (labextension/src/standalone.ts bundled with plotly.js and
wasm Graphviz by labextension/build-report.mjs during the package build) and the plan document as
JSON.  Names from the model are untrusted: the JSON is embedded with `<` and `>` escaped so no string
can close its script element, and the views put names in the page only as text.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from memviz.planfile import write_text_safely

#: The bundled views, built with the package (git-ignored: a source checkout has it once built).
BUNDLE = Path(__file__).with_name("static") / "report.js"


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
    return json.dumps(obj, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e")


def render_html(doc: dict[str, Any]) -> str:
    """The report page of plan document `doc`; raises `ReportBundleMissing` before writing anything."""
    script = bundle_script()
    title = html.escape(f"memviz report: {doc['model']['name']}")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="color-scheme" content="light dark">
<meta name="viewport" content="width=device-width, initial-scale=1"><title>{title}</title></head>
<body><div id="memviz-report"></div>
<script type="application/json" id="memviz-plan">{embed_json(doc)}</script>
<script>{script}</script>
<script>memvizReport.renderReportFrom("memviz-report", "memviz-plan");</script>
</body></html>
"""


def write_report(plan_or_doc: Any, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write the offline HTML report; an existing file is kept unless `overwrite=True`."""
    doc = plan_or_doc if isinstance(plan_or_doc, dict) else plan_or_doc.to_dict()
    return write_text_safely(Path(path), render_html(doc), overwrite=overwrite)
