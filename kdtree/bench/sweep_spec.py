"""Sweep files: read and check before anything runs.

A sweep file is YAML with duplicate keys refused, checked against :data:`SCHEMA` (JSON Schema:
unknown keys at the top level, inside an entry or inside its ``cpu:`` block, and wrong types
are errors that name the key and the file), then each entry's parameter names against its
notebook's own parameters cell (``papermill.inspect_notebook``): a name the notebook does not
declare is an error naming the key, the notebook and the closest declared name, and a value
whose type differs from the declared default's (a number for a list, say) is one too.
"""
from __future__ import annotations

import ast
import difflib
import re
from pathlib import Path

import yaml

NAME = r"^[A-Za-z0-9._-]+$"
RUN_PARAMETERS = ("results_path", "ceilings_path", "run_dir")     # set by the sweep for every point
_VALUES = {"type": "object"}
_GRID = {"type": "object", "additionalProperties": {"type": "array", "minItems": 1}}
SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["name", "notebooks"],
    "properties": {
        "name": {"type": "string", "pattern": NAME},
        "root": {"type": "string"},
        "notebooks": {"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False, "required": ["notebook"],
            "properties": {
                "notebook": {"type": "string", "minLength": 1},
                "label": {"type": "string", "pattern": NAME},
                "parameters": _VALUES, "grid": _GRID,
                "cpu": {"type": "object", "additionalProperties": False,
                        "properties": {"parameters": _VALUES, "grid": _GRID}}}}}}}
_JSON_TYPES = {"object": "a mapping", "array": "a list", "string": "a string"}


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a mapping with the same key twice."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _where(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "the file"


def _closest(word: str, known) -> str:
    near = difflib.get_close_matches(word, list(known), n=1, cutoff=0.5)
    return f" (did you mean {near[0]!r}?)" if near else ""


def _schema_error(path: Path, err) -> ValueError:
    where = _where(err.absolute_path)
    if err.validator == "additionalProperties":
        known = err.schema.get("properties", {})
        unknown = sorted(set(err.instance) - set(known))
        return ValueError(f"{path}: unknown key {unknown[0]!r} in {where}{_closest(unknown[0], known)}; "
                          f"known keys: {', '.join(known)}")
    if err.validator == "required":
        key = re.search(r"'(\w+)'", err.message).group(1)
        return ValueError(f"{path}: {where} needs {'a string ' if key == 'name' else 'a '}{key!r}")
    if err.validator == "pattern":
        return ValueError(f"{path}: {where} {err.instance!r} may use letters, digits, '.', '_' and '-' only")
    if err.validator == "minItems":
        return ValueError(f"{path}: {where} must be a non-empty list")
    if err.validator == "type":
        want = _JSON_TYPES.get(err.validator_value, err.validator_value)
        return ValueError(f"{path}: {where} must be {want}, got {type(err.instance).__name__} {err.instance!r}")
    return ValueError(f"{path}: {where}: {err.message}")


def read_yaml(path: Path) -> object:
    """The YAML document of ``path``; syntax errors and duplicate keys are ``ValueError``."""
    try:
        return yaml.load(path.read_text(), Loader=_UniqueKeyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ValueError(f"{path}: not a valid sweep file: {problem}{at}") from None


def _kind(value) -> str:
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    if isinstance(value, (int, float)):
        return "number"
    return {list: "list", tuple: "list", dict: "mapping", str: "string"}.get(type(value), type(value).__name__)


def check_parameters(path: Path, i: int, entry: dict, notebook: Path) -> None:
    """Check the parameter names (and value types) of ``entry`` against ``notebook``'s
    parameters cell; raises ``ValueError`` naming the key, the notebook and the closest name."""
    import papermill as pm

    declared = pm.inspect_notebook(str(notebook))
    if not declared:
        raise ValueError(f"{path}: notebooks[{i}]: {entry['notebook']} has no cell tagged 'parameters'")
    blocks = [("parameters", entry.get("parameters") or {}, False), ("grid", entry.get("grid") or {}, True)]
    cpu = entry.get("cpu") or {}
    blocks += [("cpu.parameters", cpu.get("parameters") or {}, False), ("cpu.grid", cpu.get("grid") or {}, True)]
    for where, block, is_grid in blocks:
        for key, value in block.items():
            at = f"{path}: notebooks[{i}].{where}.{key}"
            if key in RUN_PARAMETERS:
                raise ValueError(f"{at}: {key} is set by the sweep for every point; remove it")
            if key not in declared:
                raise ValueError(f"{at}: {entry['notebook']} has no parameter {key!r}"
                                 f"{_closest(key, [k for k in declared if k not in RUN_PARAMETERS])}")
            try:
                default = ast.literal_eval(declared[key]["default"])
            except (ValueError, SyntaxError):
                continue
            for v in (value if is_grid else [value]):
                if default is not None and _kind(v) != _kind(default):
                    raise ValueError(f"{at}: expected a {_kind(default)} like the notebook's default "
                                     f"{default!r}, got {v!r}")


def load_spec(path: str | Path) -> dict:
    """Read and check a sweep file (see the module docstring); returns the spec with ``root``
    resolved to a Path and ``path`` the file's absolute path.

    Raises
    ------
    ValueError
        Naming the file and the key, for anything the sweep could not run as written.
    """
    import jsonschema

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"sweep file {path} does not exist")
    spec = read_yaml(path)
    if not isinstance(spec, dict):
        raise ValueError(f"{path}: a sweep file is a mapping with a string 'name' and a list 'notebooks'")
    errors = sorted(jsonschema.Draft202012Validator(SCHEMA).iter_errors(spec),
                    key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    if errors:
        raise _schema_error(path, errors[0])
    root = (path.parent / spec.get("root", "..")).resolve()
    for i, e in enumerate(spec["notebooks"]):
        notebook = root / e["notebook"]
        if not notebook.is_file():
            raise ValueError(f"{path}: notebooks[{i}]: {notebook} does not exist")
        check_parameters(path, i, e, notebook)
    spec["root"] = root
    spec["path"] = path.resolve()
    return spec
