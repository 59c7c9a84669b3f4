"""scripts/code_size.py's reading of nvcc cubins: each kernel entry's .text section, in bytes."""
import re
import runpy
from pathlib import Path

import pytest

from kdtree import kernels

ROOT = Path(__file__).resolve().parent.parent
CODE_SIZE = runpy.run_path(str(ROOT / "scripts" / "code_size.py"))


@pytest.mark.parametrize("family", ["probes", "verify_attention_pair"])
def test_every_entry_has_its_text_section(family, tmp_path, monkeypatch):
    """The sections found are exactly the family's extern "C" __global__ kernels (no helper, none
    missing), each a whole number of 16-byte sm_90 instructions, together within the file."""
    monkeypatch.setenv("KDTREE_CACHE", str(tmp_path))
    data = kernels.nvcc_compile(family, arch="sm_90a").read_bytes()
    sizes = CODE_SIZE["text_sections"](data)
    src = kernels.read_source(family)
    entries = set(re.findall(r'extern "C" __global__ void(?: __launch_bounds__\([^)]*\))?\s+(\w+)\s*\(', src))
    assert entries and set(sizes) == entries
    assert all(s > 0 and s % 16 == 0 for s in sizes.values())
    assert sum(sizes.values()) < len(data)


def test_not_an_elf_file_is_refused():
    with pytest.raises(ValueError, match="ELF64"):
        CODE_SIZE["text_sections"](b"\x7fELF\x01\x01" + bytes(64))


def test_a_define_without_a_value_is_refused(capsys):
    with pytest.raises(SystemExit):
        CODE_SIZE["main"](["-D", "ATT_TRACE", "verify_attention_pair"])
    assert "expected NAME=VALUE" in capsys.readouterr().err
