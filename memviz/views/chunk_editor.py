"""`memviz.ChunkEditor`: the chunk-region editor (issue 8 item 5) over `memviz.plans.chunking.ChunkPlan`.

Python owns every estimate: the view shows the inference activation curve (AutoChunk Sec. 3.1's
estimate, `solvers.autochunk.estimate_memory`) with the regions shaded, and sends back the regions the
user edited (`regions_json`).  The kernel validates them with `ChunkPlan.with_chunks` (the dimension
flow of AutoChunk Sec. 3.2) and replies with the new document or an error naming the op that breaks
the flow; the last valid plan stays displayed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import traitlets

from memviz.plans.chunking import ChunkPlan, plan_chunks
from memviz.views.widget import MemvizWidget, refuse_clobber
from solvers import autochunk as ac


def editor_document(p: ChunkPlan) -> dict[str, Any]:
    """The view's data: per-node curve (op name, bytes), regions with their estimates, and totals."""
    est = ac.estimate_memory(p.graph, tuple(p.regions))
    base = ac.estimate_memory(p.graph)
    ops = {n.name: n.op for n in p.graph.nodes}
    index = {name: i for i, (name, _) in enumerate(base.curve)}
    regions = [
        {
            "start": c["start"],
            "end": c["end"],
            "x0": index.get(c["start"], 0),
            "x1": index.get(c["end"], 0),
            "chunks": c["chunks"],
            "extent": c["extent"],
            "outputs": c["outputs"],
            "dims": c["dims"],
            "memory_bytes": c["memory_bytes"],
            "slowdown": c["slowdown"],
        }
        for c in p.chunks
    ]
    return {
        "nodes": [{"name": n, "op": ops[n]} for n, _ in base.curve],
        "baseline": [b for _, b in base.curve],
        "chunked": [b for _, b in est.curve],
        "regions": regions,
        "estimate": {
            "budget_bytes": p.budget_bytes,
            "requested_bytes": p.budget_bytes,
            "baseline_peak_bytes": p.baseline_peak_bytes,
            "achieved_bytes": p.peak_bytes,
            "met": p.met,
            "slowdown": p.slowdown,
        },
    }


#: nodes either side of a new single-node region searched for the legal chunk flow with the lowest peak
NEW_REGION_WINDOW = 8


def _has_dims(region: dict[str, Any]) -> bool:
    return bool(region.get("outputs") or region.get("dims"))


def check_chunk_count(region: dict[str, Any]) -> None:
    """A region's chunk count as the user typed it: an integer of at least 2 (the upper bound, the
    region's extent, is `ChunkPlan.with_chunks`'s check)."""
    chunks = region.get("chunks")
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 2:
        raise ValueError(
            f"chunks={chunks!r} for region {region.get('start')}..{region.get('end')}: give an integer of at "
            "least 2 (1 chunk runs the region unchunked with its copies: remove the region instead)"
        )


def _plan_of(source: Any, args: tuple | None, budget: Any) -> ChunkPlan:
    if isinstance(source, ChunkPlan):
        return source
    model = getattr(source, "model", None) if hasattr(source, "graph") else source
    if args is None and hasattr(source, "graph"):
        args = getattr(source, "args", None)
    if model is None or args is None:
        raise TypeError(
            "ChunkEditor(model, args): pass an nn.Module and its example inputs, a ChunkPlan from "
            "memviz.plans.chunking.plan_chunks, or an inference profile that kept its model and args"
        )
    return plan_chunks(model, tuple(args), budget)


class ChunkEditor(MemvizWidget):
    """Chunk-region editor: `ChunkEditor(model, args, budget=0.5)` or `ChunkEditor(chunk_plan)`.

    Every edit of `regions_json` (from the view, or assigned here) is re-estimated with
    `ChunkPlan.with_chunks`; an illegal edit sets `error` and keeps the last valid plan.  Export writes
    the chunked module's source next to the notebook, never overwriting without `export_overwrite`."""

    _model_name = traitlets.Unicode("ChunkEditorModel").tag(sync=True)
    _view_name = traitlets.Unicode("ChunkEditorView").tag(sync=True)

    doc_json = traitlets.Unicode("").tag(sync=True)
    regions_json = traitlets.Unicode("[]").tag(sync=True)
    error = traitlets.Unicode("").tag(sync=True)
    export_path = traitlets.Unicode("memviz_export/model_chunked.py").tag(sync=True)
    export_overwrite = traitlets.Bool(False).tag(sync=True)
    export_request = traitlets.Int(0).tag(sync=True)
    export_result = traitlets.Unicode("").tag(sync=True)

    def __init__(self, source: Any, args: tuple | None = None, *, budget: Any = 0.5, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.plan = _plan_of(source, args, budget)
        self._show(self.plan)

    def _show(self, p: ChunkPlan) -> None:
        self.plan = p
        doc = editor_document(p)
        self.doc_json = json.dumps(doc, separators=(",", ":"), allow_nan=False)
        # Echo the accepted regions so the view's edit state restarts from what the kernel holds.
        self.regions_json = json.dumps(
            [{k: r[k] for k in ("start", "end", "chunks", "outputs")} for r in doc["regions"]]
        )

    def edit(self, regions: list[dict[str, Any]]) -> ChunkPlan:
        """Apply user-edited regions (dicts with start, end, chunks, outputs/dims); raises ValueError
        naming the op that breaks the dimension flow when a region is illegal, or the chunk count that
        is not an integer from 2 to the region's extent (0 is never read as 1: 1 chunk is the region
        unchunked, with its copies added: remove the region instead).  A region given without
        `outputs`/`dims` is a new one: the kernel picks its chunk dims (`new_region`)."""
        chunked = [self._retarget(r) if _has_dims(r) else self.new_region(r) for r in regions]
        for r in chunked:
            check_chunk_count(r)
        p = self.plan.with_chunks(chunked)
        self.error = ""
        self._show(p)
        return p

    def new_region(self, region: dict[str, Any]) -> dict[str, Any]:
        """A region the user added over [start, end]: of the legal chunk flows over that span, or, for
        a single node (the view's Add puts one at the chunked curve's peak), of those around it within
        `NEW_REGION_WINDOW` nodes (AutoChunk Sec. 3.3's window, Algorithm 1), the one whose estimate
        with `chunks` chunks is lowest."""
        g, taken = self.plan.graph, self.plan.regions
        start, end = region.get("start"), region.get("end")
        if start not in g.index or end not in g.index:  # type: ignore[attr-defined]
            raise ValueError(f"new chunk region: no node named {start!r} or {end!r}")
        flows = (
            ac.candidates_around(g, start, taken, NEW_REGION_WINDOW) if start == end
            else ac.candidate_flows(g, start, end)
        )
        chunks = region.get("chunks", 2)
        options = []
        for f in flows:
            if isinstance(chunks, int) and 1 <= chunks <= f.extent:
                r = ac.ChunkRegion(f, chunks)
                options.append((ac.estimate_memory(g, (*taken, r)).peak_bytes, len(f.hoisted), f))
        if not options:
            raise ValueError(
                f"new chunk region {start!r}..{end!r}: no legal chunk flow there (within {NEW_REGION_WINDOW} "
                f"nodes of a single node, outside the other regions) takes {chunks!r} chunks"
            )
        best = min(options, key=lambda o: o[:2])[2]
        return {"start": best.start, "end": best.end, "chunks": chunks, "outputs": dict(best.outputs)}

    def _retarget(self, region: dict[str, Any]) -> dict[str, Any]:
        """A moved end edge changes the region's outputs: give the new outputs the dim the user chose for
        the old ones (one dim per region in the view), so the flow check runs on the new span."""
        outputs = region.get("outputs")
        g = self.plan.graph
        if not outputs or len(set(outputs.values())) != 1 or not all(
            region.get(k) in g.index for k in ("start", "end")  # type: ignore[attr-defined]
        ):
            return region
        new = ac.region_outputs(g, ac.region_nodes(g, region["start"], region["end"]))
        if set(new) == set(outputs):
            return region
        dim = next(iter(outputs.values()))
        return {**region, "outputs": {o: dim for o in new}}

    def _accepted(self) -> list[dict[str, Any]]:
        return [{k: c[k] for k in ("start", "end", "chunks", "outputs")} for c in self.plan.chunks]

    @traitlets.observe("regions_json")
    def _on_regions(self, change: dict[str, Any]) -> None:
        try:
            regions = json.loads(change["new"])
            if not isinstance(regions, list) or not all(isinstance(r, dict) for r in regions):
                raise ValueError("regions must be a JSON list of {start, end, chunks, outputs}")
            if regions != self._accepted():
                self.edit(regions)
            else:
                self.error = ""
        except (ValueError, KeyError, TypeError) as exc:
            # The rejected regions go back to the accepted ones, so the view's inputs show what the
            # plan holds (and the same edit sent again is a change the kernel hears); then the error.
            self.regions_json = json.dumps(self._accepted())
            self.error = str(exc)

    def refusal(self) -> str:
        """Why this plan must not be exported ('' when it may): no regions, an estimated peak not
        below the unchunked one or over the budget, or a region that does not lower the peak the
        chunked module measures (`ChunkPlan.checked`)."""
        p = self.plan
        if not p.regions:
            return "no chunk regions: the unchunked model is the plan; add a region to export"
        if p.peak_bytes >= p.baseline_peak_bytes:
            return (f"export refused: the estimated peak {p.peak_bytes} bytes is not below the unchunked "
                    f"{p.baseline_peak_bytes} bytes")
        if not p.met:
            return (f"export refused: the estimated peak {p.peak_bytes} bytes is over the budget "
                    f"{p.budget_bytes} bytes")
        measured = p.checked() if p.gm is not None else p
        if measured.refused:
            spans = ", ".join(f"{c['start']}..{c['end']}" for c in measured.refused)
            return (f"export refused: region(s) {spans} do not lower the measured activation peak "
                    f"({measured.measured_baseline_bytes} bytes unchunked)")
        return ""

    @traitlets.observe("export_request")
    def _on_export(self, change: dict[str, Any]) -> None:
        self.export_result = json.dumps(self.export(self.export_path, overwrite=self.export_overwrite))

    def export(self, path: str | Path, *, overwrite: bool = False) -> dict[str, Any]:
        """Write the chunked module's readable source (`GraphModule.code`) and the chunk plan JSON."""
        target = Path(path)
        plan_path = target.with_suffix(".chunks.json")
        refusal = refuse_clobber((target, plan_path), overwrite)
        if refusal:
            return refusal
        worse = self.refusal()
        if worse:
            return {"ok": False, "message": worse}
        try:
            code = self.plan.module().code
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(
                "# Chunked forward written by memviz.ChunkEditor (torch.fx GraphModule.code).\n" + code
            )
            plan_path.write_text(json.dumps(self.plan.to_dict(), indent=1))
        except Exception as exc:  # shown to the user in the view, not swallowed
            return {"ok": False, "message": f"{type(exc).__name__}: {exc}"}
        return {"ok": True, "paths": [str(target), str(plan_path)]}
