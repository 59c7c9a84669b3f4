"""A rendered report, opened as a user would: headless Chromium (Debian's ``chromium``) loads
the pages from disk; every figure must have drawn, the page may make no network request, and
every link of every page (of the run, of a comparison and of the lists of runs) must lead to a
file that exists and, for an in-page anchor, to an element that has that id. Control pages (one
that fetches from the network, one without plotly.js, one with dead links) show the checks bite."""
from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from workbook_run import cpu_run

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install -y chromium)")

# Keep the browser's own background traffic (updates, time sync) out of the net log.
QUIET = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-default-apps"]


def open_page(page: Path, tmp: Path) -> tuple[str, list[str]]:
    """Load ``page`` in headless Chromium; returns (DOM after scripts ran, URLs the page requested).

    Every request goes to a dead proxy, so nothing leaves the machine; the net log still records
    what the page asked for. Requests of the browser itself (initiator "not an origin") are left out.
    """
    log = tmp / f"{page.stem}-net.json"
    dom = subprocess.run([CHROMIUM, *QUIET, f"--log-net-log={log}", "--net-log-capture-mode=Everything",
                          "--proxy-server=127.0.0.1:9", "--virtual-time-budget=15000", "--dump-dom",
                          page.resolve().as_uri()], capture_output=True, text=True, timeout=120).stdout
    net = json.loads(log.read_text())
    start = net["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    urls = [e["params"]["url"] for e in net["events"] if e["type"] == start and "url" in e.get("params", {})
            and e["params"].get("initiator") != "not an origin"]
    return dom, urls


@functools.cache
def rendered_dom(page: Path) -> str:
    """The DOM of ``page`` after its scripts ran (cached: the link checks open pages repeatedly)."""
    return subprocess.run([CHROMIUM, *QUIET, "--proxy-server=127.0.0.1:9", "--virtual-time-budget=15000",
                           "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True, timeout=120).stdout


class _Refs(HTMLParser):
    """The links (a/link href, script/img/iframe src) and the ids and anchor names of a page."""

    def __init__(self):
        super().__init__()
        self.links, self.ids = [], set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.ids |= {a[k] for k in ("id", "name") if a.get(k)}
        for k in ("href", "src"):
            if a.get(k) and (tag, k) in {("a", "href"), ("link", "href"), ("script", "src"), ("img", "src"),
                                         ("iframe", "src")}:
                self.links.append(a[k])


def refs(page: Path) -> _Refs:
    r = _Refs()
    r.feed(rendered_dom(page))
    return r


def dead_links(start: list[Path], root: Path) -> dict[str, list[str]]:
    """Follow every link from the ``start`` pages and from each page under ``root`` they lead to;
    returns {page: [dead links]}: a link that leaves the machine, a file that does not exist, a
    path outside ``root``, or an anchor that names no element of its page."""
    dead, todo, seen = {}, list(start), set()
    root = root.resolve()
    while todo:
        page = todo.pop().resolve()
        if page in seen:
            continue
        seen.add(page)
        for link in refs(page).links:
            u = urlsplit(link)
            bad = None
            if u.scheme not in ("", "file"):
                bad = "not a local file"
            else:
                target = page if not u.path else (Path(unquote(u.path)) if u.scheme == "file"
                                                  else page.parent / unquote(u.path)).resolve()
                if not target.is_relative_to(root):
                    bad = "outside the reports folder"
                elif not target.is_file():
                    bad = "no such file"
                elif target.suffix == ".html":
                    if u.fragment and u.fragment not in refs(target).ids:
                        bad = f"no element with id {u.fragment!r}"
                    todo.append(target)
            if bad:
                dead.setdefault(str(page.relative_to(root)), []).append(f"{link} ({bad})")
    return dead


def figures(dom: str) -> tuple[int, int]:
    """(figure divs that kdtree emitted, of those, how many plotly drew into)."""
    tags = re.findall(r'<div[^>]*\bid="kdtree-[0-9a-f]+"[^>]*>', dom)
    return len(tags), sum("js-plotly-plot" in t for t in tags)


def test_every_report_page_draws_its_plots_offline(tmp_path):
    _, reports = cpu_run()
    pages = sorted((reports / "ci").rglob("*.html"))
    total = 0
    for page in pages:
        dom, urls = open_page(page, tmp_path)
        n, drawn = figures(dom)
        assert drawn == n, f"{page.name}: {n - drawn} of {n} plots blank"
        assert "main-svg" in dom or n == 0
        assert not [u for u in urls if not u.startswith("file:")], f"{page.name} requested {urls}"
        total += n
    assert total >= 5      # ceilings, tree build, verify latency, bandwidth, roofline, summary roofline


def test_the_checks_catch_blank_plots_and_network_requests(tmp_path):
    _, reports = cpu_run()
    index = reports / "ci" / "index.html"
    html = index.read_text()
    blank = index.with_name("control-blank.html")
    blank.write_text(html.replace('src="../plotly.min.js"', 'src="../missing.js"'))
    remote = index.with_name("control-remote.html")
    remote.write_text(html.replace("</head>", '<script src="https://cdn.example.invalid/x.js"></script></head>'))
    try:
        n, drawn = figures(open_page(blank, tmp_path)[0])
        assert n >= 1 and drawn == 0
        assert any("cdn.example.invalid" in u for u in open_page(remote, tmp_path)[1])
    finally:
        blank.unlink()
        remote.unlink()


def test_headline_charts_export_as_pngs(tmp_path):
    from kdtree.bench.figures import export_pngs

    run_dir, _ = cpu_run()
    pngs = export_pngs(run_dir, tmp_path / "figures", width=900, height=500)
    assert {p.stem for p in pngs} == {"roofline", "tree_build", "verify_latency"}
    for p in pngs:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(data[16:20], "big") == 900
        assert len(data) > 20_000, f"{p.name} looks blank"


def test_every_link_of_every_page_leads_somewhere():
    from kdtree.bench.report import compare_runs

    run_dir, reports = cpu_run()
    compare = compare_runs(run_dir, run_dir, reports)
    pages = [reports / "local.html", reports / "index.html", compare, *sorted((reports / "ci").rglob("*.html"))]
    assert dead_links(pages, reports) == {}
    nav = refs(reports / "ci" / "02_verify_attention" / next(
        p.name for p in (reports / "ci" / "02_verify_attention").glob("*.html"))).links
    assert "../index.html" in nav and "../../local.html" in nav          # run summary, all runs
    assert "ci/index.html" in refs(reports / "local.html").links
    assert "../ci/index.html" in refs(compare).links


def test_the_link_check_catches_dead_links(tmp_path):
    _, reports = cpu_run()
    control = reports / "control-links.html"
    control.write_text('<html><body><a id="here" href="#here">ok</a><a href="#nowhere">anchor</a>'
                       '<a href="ci/nope.html">file</a><a href="../outside.html">up</a>'
                       '<a href="https://example.invalid/">web</a><a href="ci/index.html">fine</a></body></html>')
    try:
        dead = dead_links([control], reports)["control-links.html"]
        assert len(dead) == 4 and {d.split(" (")[1] for d in dead} == {
            "no element with id 'nowhere')", "no such file)", "outside the reports folder)", "not a local file)"}
    finally:
        control.unlink()
