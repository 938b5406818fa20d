"""import-linter contract types of this project's own (pyproject.toml, `contract_types`; run by
`lint-imports`)."""

from __future__ import annotations

import ast
import importlib.util

import grimp
from importlinter import Contract, ContractCheck, fields, output


class NoPrivateNamesContract(Contract):
    """The source modules reach no other object's private parts: no `x._name` where x is not `self`,
    `cls` or `super()`, and no `from m import _name` from another package. `allowed_names`: such
    names that are another library's interface (e.g. ctypes' `_fields_`). Why: the private modules
    contract sees imports only; a state owner's fields are read and changed through attributes."""

    type_name = "no_private_names"

    source_modules = fields.ListField(subfield=fields.ModuleExpressionField())
    allowed_names = fields.ListField(subfield=fields.StringField(), required=False)

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        allowed = set(self.allowed_names or [])  # type: ignore
        found: list[str] = []
        for expression in self.source_modules:  # type: ignore
            root = expression.expression
            for module in sorted({root, *graph.find_descendants(root)}):
                found += [
                    f"{module}:{line}: {text}" for line, text in _private_reaches(module)
                    if text not in allowed
                ]
        return ContractCheck(kept=not found, warnings=None, metadata={"found": found})

    def render_broken_contract(self, check: ContractCheck) -> None:
        output.print_error("Private names reached from outside their owner:", bold=False)
        output.new_line()
        for where in check.metadata["found"]:
            output.print_error(f"- {where}", bold=False)
            output.new_line()


def _private_reaches(module: str) -> list[tuple[int, str]]:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return []
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    package = module.rpartition(".")[0] if not spec.submodule_search_locations else module
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and not _own(node.value):
            out.append((node.lineno, node.attr))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            theirs = node.module != package and not node.module.startswith(package + ".")
            out += [(node.lineno, a.name) for a in node.names if theirs and _private(a.name)]
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own(value: ast.expr) -> bool:
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return isinstance(value, ast.Call) and isinstance(value.func,
                                                      ast.Name) and value.func.id == "super"
