"""scripts/readme_tables.py on CPU: the README block comes from one run, names it, and leaves
everything outside the markers alone."""
from __future__ import annotations

import runpy

import pytest
from workbook_run import ROOT, cpu_run

TABLES = runpy.run_path(str(ROOT / "scripts" / "readme_tables.py"))


def test_block_replacement_touches_only_the_markers():
    replace = TABLES["replace_block"]
    text = f"intro\n{TABLES['BEGIN']}\nold | numbers\n{TABLES['END']}\noutro\n"
    assert replace(text, "new") == f"intro\n{TABLES['BEGIN']}\nnew\n{TABLES['END']}\noutro\n"
    for bad in ("no markers", f"{TABLES['END']}\n{TABLES['BEGIN']}", f"{TABLES['BEGIN']}{TABLES['BEGIN']}{TABLES['END']}"):
        with pytest.raises(ValueError, match="results:begin"):
            replace(bad, "x")


def test_readme_block_from_the_ci_run(tmp_path):
    run_dir, _ = cpu_run()
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n{TABLES['BEGIN']}\nstale\n{TABLES['END']}\n## after\n")
    assert TABLES["main"]([str(run_dir), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# title\n") and text.endswith("## after\n") and "stale" not in text
    assert "from the committed run `ci`" in text and "Ceilings measured in it" in text
    assert "| what | shape | time | against (same run) |" in text
    assert TABLES["main"]([str(run_dir), "--readme", str(readme), "--check"]) == 0
    readme.write_text(text.replace("Headline", "Old headline"))
    assert TABLES["main"]([str(run_dir), "--readme", str(readme), "--check"]) == 1
