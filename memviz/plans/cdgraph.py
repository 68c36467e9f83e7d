"""The CD-graph of a plan as Graphviz DOT text, colored by each node's fate in the planned schedule.

Compute nodes are boxes, data nodes ellipses, edges run producer -> data -> consumer (Rockmate
Sec. 3.1's computation/data graph).  A compute that runs more than once is *recomputed*; a data node
produced more than once was *freed early* (dropped after a use and regenerated later); a node that runs
once and stays until its last use is *kept*.  Parameters, inputs, gradients and optimizer state are
styled by kind: a remat plan cannot change them.

Runs of identical consecutive blocks (the classes of `solvers.chain`, Rockmate Appendix A.5) collapse
to one node "block x N" in a second, collapsed DOT.  Every DOT node carries an `id` attribute
(`c12` compute, `d34` data, `b3` collapsed run starting at block 3) that Graphviz copies onto the SVG
`<g>` element, so the browser maps a click back to the IR id.

The JupyterLab and report Graph view no longer draws this DOT: it builds its own, by module, from the
plan's graph (labextension/src/graph_tree.ts, issue 18 item 2).  This one is the report's "DOT source"
and the plan document's "cdgraph" field, for any Graphviz viewer.

All names come from the user's model or from an untrusted plan file: every string is escaped for a
DOT quoted string and for the HTML that Graphviz writes.  No `dot` binary is needed here.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Sequence
from typing import Any

from solvers.chain import decompose
from solvers.ir import DataKind, Graph
from solvers.schedule import Step, steps_from_json

#: fate -> (fill color, legend text).  Shared with the frontend legend through `legend()`.
FATES: dict[str, tuple[str, str]] = {
    "kept": ("#c6e2ff", "computed once, kept until last use"),
    "recomputed": ("#ffb74d", "computed more than once"),
    "freed_early": ("#ef9a9a", "freed, later recomputed"),
    "unused": ("#eeeeee", "not run by the plan"),
    "parameter": ("#c8e6c9", "parameter / buffer"),
    "input": ("#fff59d", "input"),
    "gradient": ("#d1c4e9", "gradient"),
    "optimizer_state": ("#b2dfdb", "optimizer state"),
    "runtime": ("#d7ccc8", "device runtime (cuBLAS workspaces)"),
    "output": ("#ffffff", "output"),
}

_KIND_FATE = {
    DataKind.PARAMETER: "parameter",
    DataKind.BUFFER: "parameter",
    DataKind.INPUT: "input",
    DataKind.GRADIENT: "gradient",
    DataKind.PARAMETER_GRADIENT: "gradient",
    DataKind.OPTIMIZER_STATE: "optimizer_state",
    DataKind.RUNTIME: "runtime",
}

def legend() -> list[dict[str, str]]:
    """Legend rows (fate, color, text) in display order."""
    return [{"fate": f, "color": c, "text": t} for f, (c, t) in FATES.items()]


def dot_escape(text: str) -> str:
    """Escape `text` for a DOT double-quoted string whose content Graphviz writes into SVG/HTML.

    Backslashes are doubled (Graphviz would read `\\N`, `\\l` ... as escapes), quotes escaped, and
    `& < >` turned into entities so a name can never open a tag or an entity in the output."""
    s = html.escape(str(text), quote=False)
    s = s.replace("\\", "\\\\").replace('"', '\\"')
    return s.replace("\r", "").replace("\n", "\\n")  # a DOT line break, never a raw newline


def compute_fates(graph: Graph, schedule: Sequence[Step]) -> dict[int, str]:
    """compute id -> "kept" | "recomputed" | "unused" from how often the schedule runs it."""
    runs = Counter(s.node for s in schedule if s.op == "compute")
    return {c.id: "unused" if runs[c.id] == 0 else "recomputed" if runs[c.id] > 1 else "kept"
            for c in graph.computes}


def data_fates(graph: Graph, schedule: Sequence[Step]) -> dict[int, str]:
    """data id -> fate: its kind for fixed-size kinds, else kept / freed_early / unused."""
    runs = Counter(s.node for s in schedule if s.op == "compute")
    out: dict[int, str] = {}
    for d in graph.datas:
        if d.kind in _KIND_FATE:
            out[d.id] = _KIND_FATE[d.kind]
        elif d.producer is None:
            out[d.id] = "input"
        elif runs[d.producer] == 0:
            out[d.id] = "unused"
        elif runs[d.producer] > 1:
            # produced again later: the plan freed it between uses
            out[d.id] = "freed_early"
        else:
            out[d.id] = "output" if d.id in graph.outputs else "kept"
    return out


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _node(nid: str, label: str, tooltip: str, shape: str, fate: str, extra: str = "") -> str:
    color = FATES[fate][0]
    return (f'  "{nid}" [id="{nid}", class="{fate}", shape={shape}, style="filled{extra}", '
            f'fillcolor="{color}", label="{dot_escape(label)}", tooltip="{dot_escape(tooltip)}"];')


def _header(name: str) -> list[str]:
    return [f'digraph "{dot_escape(name)}" {{',
            '  graph [rankdir=TB, nodesep=0.15, ranksep=0.25];',
            '  node [fontname="Helvetica", fontsize=10, height=0.3];',
            '  edge [color="#888888", arrowsize=0.6];']


def to_dot(graph: Graph, schedule: Sequence[Step], *, name: str = "cdgraph") -> str:
    """Expanded DOT: every compute and data node, colored by its fate in `schedule`."""
    cf, df = compute_fates(graph, schedule), data_fates(graph, schedule)
    runs = Counter(s.node for s in schedule if s.op == "compute")
    lines = _header(name)
    for c in graph.computes:
        times = f" (x{runs[c.id]})" if runs[c.id] > 1 else ""
        tip = f"{c.name}: {c.op} [{c.phase.value}]{times} {c.module} {c.source}".strip()
        lines.append(_node(f"c{c.id}", f"{c.name}{times}", tip, "box", cf[c.id], ",rounded"))
    for d in graph.datas:
        tip = f"{d.name}: {d.kind.value} {_fmt_bytes(d.bytes)} {tuple(d.shape)} {d.dtype}"
        lines.append(_node(f"d{d.id}", f"{d.name}\n{_fmt_bytes(d.bytes)}", tip, "ellipse", df[d.id]))
    for c in graph.computes:
        lines.extend(f'  "d{i}" -> "c{c.id}";' for i in c.inputs)
        lines.extend(f'  "c{c.id}" -> "d{o}";' for o in c.outputs)
    lines.append("}")
    return "\n".join(lines)


def repeats(classes: Sequence[int]) -> list[tuple[int, int, int]]:
    """Repeats of identical block groups as (first block index, period, count), count >= 2.

    A transformer layer often cuts into several chain blocks (attention, MLP), so a repeat is a
    period of p consecutive classes seen N times in a row; at each position the repeat covering the
    most blocks wins."""
    runs: list[tuple[int, int, int]] = []
    i = 0
    while i < len(classes):
        best = (1, 1)  # (period, count)
        for p in range(1, (len(classes) - i) // 2 + 1):
            k = 1
            while list(classes[i + k * p:i + (k + 1) * p]) == list(classes[i:i + p]):
                k += 1
            if k >= 2 and p * k > best[0] * best[1]:
                best = (p, k)
        if best[1] >= 2:
            runs.append((i, *best))
        i += best[0] * best[1]
    return runs


def to_collapsed_dot(graph: Graph, schedule: Sequence[Step], *, name: str = "cdgraph") -> str | None:
    """Collapsed DOT: each repeat of N >= 2 identical block groups becomes one node "block x N"
    (id `b<first>`); data used only inside a repeat (its activations, its parameters) is absorbed.
    None when the graph has no repeats."""
    try:
        blocks = decompose(graph).blocks
    except ValueError:
        return None
    runs = repeats([b.klass for b in blocks])
    if not runs:
        return None
    owner: dict[str, str] = {}
    members: dict[str, list[int]] = {}
    labels: dict[str, str] = {}
    for first, period, count in runs:
        rid = f"b{first}"
        cs = [c for b in blocks[first:first + period * count] for c in (*b.forward, *b.backward)]
        members[rid] = cs
        labels[rid] = f"block x {count} ({period} chain blocks, {len(cs)} computes)"
        for c in cs:
            owner[f"c{c}"] = rid
    for d in graph.datas:
        users = {owner.get(f"c{c}") for c in graph.consumers(d.id)}
        if d.producer is not None:
            users.add(owner.get(f"c{d.producer}"))
        if len(users) == 1 and None not in users and d.id not in graph.outputs:
            owner[f"d{d.id}"] = users.pop()  # type: ignore[assignment]
    cf, df = compute_fates(graph, schedule), data_fates(graph, schedule)
    lines = _header(name)
    for rid, cs in members.items():
        fate = "recomputed" if any(cf[c] == "recomputed" for c in cs) else "kept"
        nrec = sum(cf[c] == "recomputed" for c in cs)
        lines.append(_node(rid, labels[rid], f"{labels[rid]}; {nrec} recomputed", "box3d", fate))
    for c in graph.computes:
        if f"c{c.id}" not in owner:
            lines.append(_node(f"c{c.id}", c.name, f"{c.name}: {c.op} [{c.phase.value}]", "box",
                               cf[c.id], ",rounded"))
    for d in graph.datas:
        if f"d{d.id}" not in owner:
            lines.append(_node(f"d{d.id}", f"{d.name}\n{_fmt_bytes(d.bytes)}",
                               f"{d.name}: {d.kind.value} {_fmt_bytes(d.bytes)}", "ellipse", df[d.id]))
    seen: set[tuple[str, str]] = set()
    for c in graph.computes:
        pairs = [(f"d{i}", f"c{c.id}") for i in c.inputs] + [(f"c{c.id}", f"d{o}") for o in c.outputs]
        for a, b in pairs:
            e = (owner.get(a, a), owner.get(b, b))
            if e[0] != e[1] and e not in seen:
                seen.add(e)
                lines.append(f'  "{e[0]}" -> "{e[1]}";')
    lines.append("}")
    return "\n".join(lines)


def _graph_schedule(plan: Any) -> tuple[Graph, tuple[Step, ...], str]:
    if isinstance(plan, dict):
        if "graph" not in plan or "planned" not in plan:
            raise ValueError("cdgraph needs a plan document with 'graph' and 'planned' (Plan.to_dict())")
        return (Graph.from_dict(plan["graph"]), steps_from_json(plan["planned"]["schedule"]),
                str(plan.get("model", {}).get("name", "cdgraph")))
    if hasattr(plan, "graph") and hasattr(plan, "schedule"):
        return plan.graph, tuple(plan.schedule), str(getattr(plan, "model", {}).get("name", "cdgraph"))
    raise TypeError(f"cdgraph expects a memviz Plan or a plan dict, got {type(plan).__name__}")


def cdgraph_dict(plan: Any) -> dict[str, Any]:
    """The plan document's "cdgraph" entry: {"dot", "collapsed_dot", "nodes"} for a Plan or plan dict."""
    graph, schedule, name = _graph_schedule(plan)
    return {"dot": to_dot(graph, schedule, name=name),
            "collapsed_dot": to_collapsed_dot(graph, schedule, name=name),
            "nodes": len(graph.computes) + len(graph.datas)}


def report_html(plan: Any) -> str:
    """An HTML fragment for the offline report: legend, fate counts, the recomputed computes and the
    DOT source (to paste into any Graphviz viewer).  The report does not render the graph itself."""
    graph, schedule, name = _graph_schedule(plan)
    cf, df = compute_fates(graph, schedule), data_fates(graph, schedule)
    runs = Counter(s.node for s in schedule if s.op == "compute")
    counts = Counter(cf.values()) + Counter(df.values())
    rows = "".join(f'<tr><td><span style="background:{FATES[f][0]}">&nbsp;&nbsp;&nbsp;</span> '
                   f"{html.escape(FATES[f][1])}</td><td>{counts[f]}</td></tr>" for f in FATES if counts[f])
    rec = "".join(f"<li>{html.escape(graph.computes[c].name)} x{runs[c]}</li>"
                  for c in sorted(cf) if cf[c] == "recomputed")
    dot = html.escape(to_collapsed_dot(graph, schedule, name=name) or to_dot(graph, schedule, name=name))
    return (f'<section class="memviz-cdgraph"><h2>CD-graph</h2><table>{rows}</table>'
            f"<h3>Recomputed operations</h3><ul>{rec or '<li>none</li>'}</ul>"
            f"<details><summary>Graphviz DOT source</summary><pre>{dot}</pre></details></section>")
