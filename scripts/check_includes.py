#!/usr/bin/python3
"""Fails on a cycle in the include graph of src/.

A unit is a header and its source (zone.h and zone.cc are the unit "zone";
governor_budget.cc is a unit of its own that uses "governor"). An edge is
an #include "src/x.h" from one unit to another. A cycle means two units
that cannot be understood, built or tested one without the other; each one
seen so far came from a single misplaced name. Prints every cycle found,
smallest first, and exits 1 if there is one.

    scripts/check_includes.py [ROOT]    (ROOT: the checkout, by default
                                         this script's parent's parent)
"""

import pathlib
import re
import sys

INCLUDE = re.compile(r'^#include "src/([A-Za-z0-9_]+)\.h"', re.M)


def include_graph(src):
    """{unit: {unit it includes}} over src/*.h and src/*.cc."""
    graph = {}
    for path in sorted(src.glob("*.h")) + sorted(src.glob("*.cc")):
        unit = path.stem
        graph.setdefault(unit, set())
        for used in INCLUDE.findall(path.read_text()):
            if used != unit:
                graph[unit].add(used)
                graph.setdefault(used, set())
    return graph


def strongly_connected(graph):
    """The strongly connected components of more than one unit (Tarjan's
    algorithm, iterative: no recursion limit to meet)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            unit, edges = work[-1]
            advanced = False
            for used in edges:
                if used not in index:
                    index[used] = low[used] = counter
                    counter += 1
                    stack.append(used)
                    on_stack.add(used)
                    work.append((used, iter(sorted(graph[used]))))
                    advanced = True
                    break
                if used in on_stack:
                    low[unit] = min(low[unit], index[used])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[unit])
            if low[unit] == index[unit]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == unit:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found, key=lambda c: (len(c), c))


def cycle_path(graph, component):
    """One cycle through the component's first unit, as a -> b -> ... -> a."""
    members = set(component)
    start = component[0]
    paths = {start: [start]}
    queue = [start]
    while queue:
        unit = queue.pop(0)
        for used in sorted(graph[unit]):
            if used == start:
                return paths[unit] + [start]
            if used in members and used not in paths:
                paths[used] = paths[unit] + [used]
                queue.append(used)
    return component


def main(argv):
    root = pathlib.Path(argv[1]) if len(argv) > 1 else \
        pathlib.Path(__file__).resolve().parent.parent
    graph = include_graph(root / "src")
    cycles = strongly_connected(graph)
    for component in cycles:
        print("include cycle in src/: %s" % " -> ".join(cycle_path(graph, component)))
    if cycles:
        return 1
    print("src/: %d units, %d includes between them, no cycle"
          % (len(graph), sum(len(v) for v in graph.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
