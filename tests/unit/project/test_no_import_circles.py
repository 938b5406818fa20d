"""No circles: no Python module of warmpath imports itself through others (imports under
TYPE_CHECKING count: they tie the modules together for a reader as much as any), and the native
kernel's headers each include what they use, the packed layout (layout.h) first, none reaching back
to one that includes it."""

import re
from pathlib import Path

CPU = Path(__file__).resolve().parents[3] / "warmpath" / "kernels" / "cpu"


def includes() -> dict[str, list[str]]:
    return {
        f.name: re.findall(r'^#include "([^"]+)"', f.read_text(), re.M)
        for f in sorted(CPU.glob("*.[ch]"))
    }


def test_no_header_includes_itself_through_others():
    graph = includes()
    assert all(h in graph for deps in graph.values() for h in deps)

    def reach(start: str) -> set[str]:
        seen, todo = set(), list(graph[start])
        while todo:
            h = todo.pop()
            if h not in seen:
                seen.add(h)
                todo += graph[h]
        return seen

    assert [h for h in graph if h in reach(h)] == []


def test_every_matrix_kernel_header_includes_the_layout_first():
    graph = includes()
    for h in ("tiles.h", "portable.h", "matmul.h"):
        assert graph[h][0] == "layout.h", h
    for h in ("kquants.h", "panels.h", "amx.h"):
        assert graph[h][0] == "tiles.h", h


def test_no_python_module_imports_itself_through_others():
    import grimp

    graph = grimp.build_graph("warmpath", exclude_type_checking_imports=False)
    circles = []
    for module in sorted(graph.modules):
        for dep in sorted(graph.find_modules_directly_imported_by(module)):
            back = graph.find_shortest_chain(importer=dep, imported=module)
            if back:
                circles.append(" -> ".join((module, *back)))
    assert circles == []
