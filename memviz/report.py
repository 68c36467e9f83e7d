"""One offline HTML report per plan: plotly.js is inlined, so the file opens from disk with no network.

Figures are built as plain plotly JSON from the plan document alone (the same document the
JupyterLab renderer draws).  Names from the model are untrusted: they are HTML-escaped before they
reach hover text, and the JSON is embedded with `<` escaped so no string can close the script tag.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

from memviz.budget import format_bytes
from memviz.planfile import write_text_safely
from solvers import CATEGORIES

COLORS = {
    "parameters": "#4c78a8",
    "buffers": "#72b7b2",
    "inputs": "#b279a2",
    "optimizer_state": "#9d755d",
    "parameter_gradients": "#f58518",
    "gradients": "#e45756",
    "activations": "#54a24b",
    "outputs": "#eeca3b",
    "workspace": "#bab0ac",
    "fragmentation": "#ff9da6",
}


def step_labels(doc: dict[str, Any], run: str) -> list[str]:
    """Hover text per step: what runs (op, module path, source line) or what is freed; escaped."""
    graph = doc[run].get("graph") or doc["graph"]  # an autochunk baseline runs on its own graph
    computes, datas = graph["computes"], graph["datas"]
    labels = []
    for i, (op, node) in enumerate(doc[run]["schedule"]):
        if op == "compute":
            c = computes[node]
            text = html.escape(f"step {i}: {c['name']} [{c['op']}, {c['phase']}]")
            where = " ".join(x for x in (c.get("module", ""), c.get("source", "")) if x)
            labels.append(text + (f"<br>{html.escape(where)}" if where else ""))
        else:
            labels.append(html.escape(f"step {i}: free {datas[node]['name']}"))
    return labels


def fragmentation_series(doc: dict[str, Any]) -> list[int] | None:
    """Bytes the simulated caching allocator reserves beyond the planned live bytes, per planned step
    (the memory chart's fragmentation layer); None without a per-step allocator series for this
    schedule.  The extension's `fragmentationSeries` (transforms.ts) draws the same layer."""
    reserved = ((doc.get("packing") or {}).get("allocator") or {}).get("reserved")
    live = doc["planned"]["timeline"]["step_bytes"]
    if not reserved or len(reserved) != len(live):
        return None
    return [max(r - v, 0) for r, v in zip(reserved, live, strict=True)]


def memory_figure(doc: dict[str, Any]) -> dict[str, Any]:
    tl, base = doc["planned"]["timeline"], doc["baseline"]["timeline"]
    labels = step_labels(doc, "planned")
    x = list(range(len(tl["step_bytes"])))
    traces: list[dict[str, Any]] = []
    for cat in CATEGORIES:
        ys = tl["by_category"].get(cat)
        if not ys or not any(ys):
            continue
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "stackgroup": "plan",
                "name": cat.replace("_", " "),
                "x": x,
                "y": [v / 2**20 for v in ys],
                "line": {"width": 0.5, "color": COLORS[cat]},
                "text": labels,
                "hovertemplate": "%{text}<br>" + cat + ": %{y:.2f} MiB<extra></extra>",
            }
        )
    fragmentation = fragmentation_series(doc)
    if fragmentation:
        traces.append(
            {
                "type": "scatter",
                "mode": "lines",
                "stackgroup": "plan",
                "name": "fragmentation (allocator)",
                "x": x,
                "y": [v / 2**20 for v in fragmentation],
                "line": {"width": 0.5, "color": COLORS["fragmentation"]},
                "text": labels,
                "hovertemplate": "%{text}<br>fragmentation: %{y:.2f} MiB<extra></extra>",
            }
        )
    base_labels = step_labels(doc, "baseline")
    traces.append(
        {
            "type": "scatter",
            "mode": "lines",
            "name": "baseline (eager) total",
            "x": list(range(len(base["step_bytes"]))),
            "y": [v / 2**20 for v in base["step_bytes"]],
            "line": {"color": "#444", "dash": "dot", "width": 1.5},
            "text": base_labels,
            "hovertemplate": "%{text}<br>baseline total: %{y:.2f} MiB<extra></extra>",
        }
    )
    if tl["peak_step"] >= 0:
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": "plan peak",
                "x": [tl["peak_step"]],
                "y": [tl["peak_bytes"] / 2**20],
                "marker": {"size": 11, "symbol": "x", "color": "#d62728"},
                "text": [labels[tl["peak_step"]]],
                "hovertemplate": "PEAK %{y:.2f} MiB<br>%{text}<extra></extra>",
            }
        )
    shapes = []
    if doc.get("budget_bytes"):
        shapes.append(
            {
                "type": "line",
                "xref": "paper",
                "x0": 0,
                "x1": 1,
                "y0": doc["budget_bytes"] / 2**20,
                "y1": doc["budget_bytes"] / 2**20,
                "line": {"color": "#d62728", "dash": "dash"},
            }
        )
    return {
        "data": traces,
        "layout": {
            "title": {"text": "Memory over time (planned, stacked by kind; baseline dotted)"},
            "xaxis": {"title": {"text": "schedule step"}},
            "yaxis": {"title": {"text": "MiB"}},
            "shapes": shapes,
            "hovermode": "closest",
            "height": 460,
        },
    }


def packing_figure(doc: dict[str, Any]) -> dict[str, Any] | None:
    packing = doc.get("packing")
    if not packing:
        return None
    datas = doc["graph"]["datas"]
    traces = []
    panels = [("planned packing", packing["buffers"], "x", "y")]
    if packing.get("allocator", {}).get("blocks"):
        panels.append(("PyTorch caching allocator (simulated)", packing["allocator"]["blocks"], "x2", "y2"))
    for name, blocks, xa, ya in panels:
        xs: list[float | None] = []
        ys: list[float | None] = []
        texts: list[str | None] = []
        for b in blocks:
            x0, x1 = b["start"], b["end"]
            y0, y1 = b["offset"] / 2**20, (b["offset"] + b["size"]) / 2**20
            xs += [x0, x1, x1, x0, x0, None]
            ys += [y0, y0, y1, y1, y0, None]
            label = html.escape(f"{datas[b['data']]['name']} ({format_bytes(b['size'])}) steps {x0}-{x1}")
            texts += [label] * 5 + [None]
        traces.append(
            {
                # SVG path: plotly's WebGL fill triangulates every polygon on the CPU (15.6 s for two
                # panels of 10k rectangles in headless Chromium), SVG paths of the same take 3.1 s.
                "type": "scatter",
                "mode": "lines",
                "fill": "toself",
                "name": name,
                "x": xs,
                "y": ys,
                "xaxis": xa,
                "yaxis": ya,
                "text": texts,
                "hovertemplate": "%{text}<extra></extra>",
                "line": {"width": 0.5},
            }
        )
    frag = packing["fragmentation"]
    title = f"Address packing: planned fragmentation {frag:.1%}"
    if "allocator" in packing:
        title += f", PyTorch allocator {packing['allocator'].get('fragmentation', 0):.1%}"
    layout: dict[str, Any] = {
        "title": {"text": title},
        "height": 420,
        "showlegend": True,
        "xaxis": {"domain": [0, 0.48], "title": {"text": "step"}},
        "yaxis": {"title": {"text": "address (MiB)"}},
    }
    if len(panels) == 2:
        layout["xaxis2"] = {"domain": [0.52, 1], "title": {"text": "step"}}
        layout["yaxis2"] = {"anchor": "x2", "matches": "y"}
    return {"data": traces, "layout": layout}


def frontier_figure(doc: dict[str, Any]) -> dict[str, Any] | None:
    rows = doc.get("frontier") or []
    if not rows:
        return None
    return {
        "data": [
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": "frontier",
                "x": [r["budget_bytes"] / 2**20 for r in rows],
                "y": [r["time_overhead"] for r in rows],
                "text": [html.escape(f"{r['strategy']}: peak {format_bytes(r['peak_bytes'])}") for r in rows],
                "hovertemplate": "budget %{x:.1f} MiB<br>time x%{y:.3f}<br>%{text}<extra></extra>",
            }
        ],
        "layout": {
            "title": {"text": "Budget frontier"},
            "height": 320,
            "xaxis": {"title": {"text": "budget (MiB)"}},
            "yaxis": {"title": {"text": "time overhead (x)"}},
        },
    }


def summary_rows(doc: dict[str, Any]) -> list[tuple[str, str]]:
    tl, base, stats = doc["planned"]["timeline"], doc["baseline"]["timeline"], doc["solver_stats"]
    overhead = tl["total_time"] / base["total_time"] if base["total_time"] else 1.0
    rows = [
        ("model", f"{doc['model']['name']} ({doc['model']['mode']})"),
        ("device", doc["device"]["name"] + (" (estimated)" if doc["device"]["estimated"] else " (measured)")),
        (
            "strategy",
            f"{doc['strategy']} — {stats['status']}"
            + (f", gap {stats['gap']:.1%}" if stats.get("gap") is not None else "")
            + f", solved in {stats['seconds']:.2f} s",
        ),
        ("budget", format_bytes(doc["budget_bytes"]) if doc["budget_bytes"] else "none"),
        ("baseline peak", format_bytes(base["peak_bytes"])),
        ("planned peak", format_bytes(tl["peak_bytes"])),
        ("time overhead", f"x{overhead:.3f}"),
        ("compute nodes / data nodes", f"{len(doc['graph']['computes'])} / {len(doc['graph']['datas'])}"),
    ]
    peak_step = tl["peak_step"]
    if peak_step >= 0:
        split = ", ".join(
            f"{k.replace('_', ' ')} {format_bytes(v[peak_step])}"
            for k, v in tl["by_category"].items()
            if v[peak_step]
        )
        rows.append(("at the planned peak", split))
    return rows


def _embed(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":")).replace("<", "\\u003c").replace(">", "\\u003e")


def render_html(doc: dict[str, Any]) -> str:
    import plotly.offline

    figures = [f for f in (memory_figure(doc), packing_figure(doc), frontier_figure(doc)) if f is not None]
    table = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in summary_rows(doc)
    )
    chunks = "".join(
        f"<tr><td>{html.escape(str(c.get('start')))}</td><td>{html.escape(str(c.get('end')))}</td>"
        f"<td>{html.escape(str(c.get('chunks')))}</td></tr>"
        for c in doc.get("chunks", [])
    )
    chunk_table = (
        f"<h2>Chunk regions</h2><table><tr><th>start</th><th>end</th><th>chunks</th></tr>{chunks}</table>"
        if chunks
        else ""
    )
    divs = "".join(f'<div id="fig{i}" class="fig"></div>' for i in range(len(figures)))
    calls = "".join(
        f"Plotly.newPlot('fig{i}', figs[{i}].data, figs[{i}].layout, {{responsive: true}});"
        for i in range(len(figures))
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>memviz report: {html.escape(doc["model"]["name"])}</title>
<style>body{{font-family:system-ui,sans-serif;margin:1.5em;color:#222}}table{{border-collapse:collapse}}
th,td{{text-align:left;padding:.2em .8em;border-bottom:1px solid #ddd}}.fig{{margin:1em 0}}</style>
<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script></head>
<body><h1>memviz report</h1><table id="summary">{table}</table>
{chunk_table}
{divs}
<script type="text/javascript">const figs = {_embed(figures)};{calls}</script>
</body></html>
"""


def write_report(plan_or_doc: Any, path: str | Path, *, overwrite: bool = False) -> Path:
    """Write the offline HTML report; an existing file is kept unless `overwrite=True`."""
    doc = plan_or_doc if isinstance(plan_or_doc, dict) else plan_or_doc.to_dict()
    return write_text_safely(Path(path), render_html(doc), overwrite=overwrite)
