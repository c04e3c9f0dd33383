"""No two modules of sluice import each other, directly or round a circle.

A circle means neither side can be read, tested or moved without the other; the layer contract
(`lint-imports`) only sees arrows between packages, so this pins the arrows between files. A
`TYPE_CHECKING` import counts: it is still an arrow a reader has to follow (docs/STYLE.md)."""

from __future__ import annotations

import grimp


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of `graph`, iteratively (a recursion per module would not be bounded
    by anything but the package's size)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            if successors:
                successor = successors.pop()
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, sorted(graph[successor])))
                elif successor in on_stack:
                    low[node] = min(low[node], index[successor])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def test_strongly_connected_finds_a_circle_and_leaves_a_chain() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    components = strongly_connected(graph)
    assert ["a", "b", "c"] in components
    assert all(len(c) == 1 for c in components if c != ["a", "b", "c"])


def test_no_module_of_sluice_imports_itself_round_a_circle() -> None:
    built = grimp.build_graph("sluice", exclude_type_checking_imports=False)
    modules = set(built.modules)
    graph = {m: set(built.find_modules_directly_imported_by(m)) & modules for m in modules}
    circles = [c for c in strongly_connected(graph) if len(c) > 1]
    report = "\n".join(f"{len(c)} modules: {', '.join(c)}" for c in circles)
    assert not circles, f"import circles:\n{report}"
