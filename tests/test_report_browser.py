"""A rendered report, opened as a user would: headless Chromium (Debian's ``chromium``) loads
the pages from disk; every figure must have drawn, and the page may make no network request.
A control page that fetches from the network, and one without plotly.js, show the checks bite."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

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
    assert {p.stem for p in pngs} == {"roofline", "tree_build"}        # no GPU rows: no eager/graph chart
    for p in pngs:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(data[16:20], "big") == 900
        assert len(data) > 20_000, f"{p.name} looks blank"
