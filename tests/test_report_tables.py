"""The tables of a rendered run read as a person reads them: every column header of every page
is a label with its unit (:data:`kdtree.bench.display.COLUMNS`), never a raw column name of
the tidy tables (``agree_ar``, ``first_divergence``, ``tokens_per_s``)."""
from __future__ import annotations

import re
from html.parser import HTMLParser

import pandas as pd

from kdtree.bench.display import COLUMNS, display_table
from workbook_run import cpu_run


class _Headers(HTMLParser):
    """The text of every ``<th>`` of a page."""

    def __init__(self):
        super().__init__()
        self.headers, self._th = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "th":
            self._th = ""

    def handle_data(self, data):
        if self._th is not None:
            self._th += data

    def handle_endtag(self, tag):
        if tag == "th" and self._th is not None:
            self.headers.append(self._th.strip())
            self._th = None


def headers(page) -> list[str]:
    p = _Headers()
    p.feed(page.read_text())
    return p.headers


# Raw names of the tidy tables that must never reach a header as they are.
RAW = re.compile(r"^(agree_ar|first_divergence|reference_rounds|self_consistent|tokens_per_s|median_us|p20_us|"
                 r"p80_us|cuda_graph|lossless)$")


def test_engine_page_headers_are_labels_with_units():
    _, reports = cpu_run()
    page = next((reports / "ci" / "03_ddtree_step").glob("*.html"))
    heads = headers(page)
    assert "tokens equal to greedy (%)" in heads and "first token index parting from greedy (-1: none)" in heads
    assert not [h for h in heads if RAW.match(h)], heads


def test_every_rendered_page_has_no_raw_column_name():
    _, reports = cpu_run()
    raw = {str(p.relative_to(reports)): [h for h in headers(p) if RAW.match(h)]
           for p in (reports / "ci").rglob("*.html")}
    assert not {p: h for p, h in raw.items() if h}


def test_throughput_columns_format_with_their_units():
    d = display_table(pd.DataFrame({"agree_ar": [0.875], "first_divergence": [12], "lossless": [False],
                                    "tokens_per_s": [3719.4]}))
    assert list(d.columns) == [COLUMNS[c][0] for c in ("agree_ar", "first_divergence", "lossless", "tokens_per_s")]
    assert d.iloc[0].tolist() == ["87.5%", "12", "False", "3,719"]
