"""The offline report: the bundled JupyterLab views inlined with the plan (no network), the plan embedded so
it round-trips and no name can leave its script element, no report without the built views.  That the
views draw from disk with the network blocked is ui-tests/tests/report.spec.ts."""

from __future__ import annotations

import csv
import io
import json
import re
from html.parser import HTMLParser

import pytest

import memviz
import memviz.views.report as report
from memviz.views.report import ReportBundleMissing, render_html, write_report
from solvers import GraphBuilder, Phase

HOSTILE = "<img src=x onerror=alert(1)>"
CLOSER = "</script><script>alert(2)</script>"


def hostile_graph():
    b = GraphBuilder(HOSTILE)
    w = b.data(HOSTILE, 1 << 20, "parameter")
    x = b.data("x", 1 << 18, "input")
    a = b.data(CLOSER, 1 << 21, "saved")
    loss = b.data("loss", 4, "output")
    gw = b.data("gw", 1 << 20, "parameter_gradient")
    b.compute(HOSTILE, [x, w], [a], time=1.0, module=CLOSER, source="evil.py:1")
    b.compute("loss", [a], [loss], time=0.1)
    b.compute("back", [a, loss, x], [gw], time=2.0, phase=Phase.BACKWARD)
    b.outputs = [loss, gw]
    return b.build()


class Page(HTMLParser):
    """The elements of a page as a browser's tokenizer sees them, with each script's text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.title = ""
        self._open: str | None = None
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._open = tag
        if tag == "script":
            self.scripts.append((dict(attrs), ""))

    def handle_endtag(self, tag: str) -> None:
        self._open = None

    def handle_data(self, data: str) -> None:
        if self._open == "script":
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)
        elif self._open == "title":
            self.title += data


@pytest.fixture(scope="module")
def doc() -> dict:
    return memviz.plan(hostile_graph(), frontier=False).to_dict()


@pytest.fixture(scope="module")
def page(doc: dict) -> Page:
    return Page(render_html(doc))


def test_report_is_the_bundled_views_with_nothing_fetched(page: Page, doc: dict) -> None:
    header = ["header", "table", *["tr", "th", "td"] * len(report.report_header(doc)), "p", "a"]
    assert [tag for tag, _ in page.tags] == ["html", "head", "meta", "meta", "meta", "title", "body", *header,
                                             "div", "script", "script", "script"]
    # every script is inline, no stylesheet, image or frame is linked: nothing to fetch (the one link is
    # the timeline CSV, carried in the page as a data: URL)
    assert all("src" not in attrs for _, attrs in page.tags)
    assert [attrs["href"][:5] for _, attrs in page.tags if "href" in attrs] == ["data:"]
    bundle = page.scripts[1][1]
    assert bundle == report.BUNDLE.read_text(encoding="utf-8").replace("</script", "<\\/script")
    # the JupyterLab views, plotly and Graphviz, not a second implementation
    for part in ("renderReportFrom", "jp-memviz-tabbar", "Collapse all", "Plotly"):
        assert part in bundle, part
    assert page.scripts[2][1] == 'memvizReport.renderReportFrom("memviz-report", "memviz-plan");'


def test_embedded_plan_round_trips(doc: dict, page: Page) -> None:
    attrs, text = page.scripts[0]
    assert attrs == {"type": "application/json", "id": "memviz-plan"}
    assert json.loads(text) == json.loads(json.dumps(doc))
    assert json.loads(text)["cdgraph"]["dot"], "the Graph tab's DOT travels with the plan"


def test_hostile_names_cannot_leave_the_plan_script(doc: dict, page: Page) -> None:
    text = render_html(doc)
    assert HOSTILE not in text and CLOSER not in text
    # the tokenizer found exactly the page's own elements (above): no name opened an img or a script
    assert not any(tag == "img" for tag, _ in page.tags)
    assert len(re.findall(r"</script", text, re.IGNORECASE)) == 3
    assert page.title == f"memviz report: {HOSTILE}"  # escaped in the source, shown as text


def test_bundle_text_that_would_close_the_script_is_escaped(tmp_path, monkeypatch, doc: dict) -> None:
    fake = tmp_path / "report.js"
    fake.write_text('var memvizReport = {s: "</script><b>x</b>", t: "</SCRIPT>"};')
    monkeypatch.setattr(report, "BUNDLE", fake)
    scripts = Page(render_html(doc)).scripts
    assert len(scripts) == 3
    assert scripts[1][1] == 'var memvizReport = {s: "<\\/script><b>x</b>", t: "<\\/SCRIPT>"};'


def test_missing_bundle_says_how_to_build_and_writes_nothing(tmp_path, monkeypatch, doc: dict) -> None:
    monkeypatch.setattr(report, "BUNDLE", tmp_path / "static" / "report.js")
    target = tmp_path / "r.html"
    with pytest.raises(ReportBundleMissing, match=r"pip install -e \."):
        write_report(doc, target)
    assert not target.exists()


def test_header_says_what_and_how_and_the_csv_holds_each_step(doc: dict) -> None:
    page = render_html(doc, command="memviz plan m.py:f --budget 50%", notice="minimum-budget plan")
    assert "memviz plan m.py:f --budget 50%" in page and 'role="alert"><strong>minimum-budget plan' in page
    rows = list(csv.reader(io.StringIO(report.timeline_csv(doc))))
    steps = len(doc["planned"]["schedule"]) + len(doc["baseline"]["schedule"])
    assert len(rows) == 1 + steps and rows[0][-1] == "total_bytes"
    last = rows[len(doc["planned"]["schedule"])]
    assert last[0] == "planned" and int(last[-1]) == doc["planned"]["timeline"]["step_bytes"][-1]


def test_write_report_never_clobbers(tmp_path, doc: dict) -> None:
    path = write_report(doc, tmp_path / "r.html")
    before = path.read_bytes()
    with pytest.raises(FileExistsError):
        write_report({**doc, "strategy": "other"}, path)
    assert path.read_bytes() == before
    write_report({**doc, "strategy": "other"}, path, overwrite=True)
    assert '"strategy":"other"' in path.read_text()
