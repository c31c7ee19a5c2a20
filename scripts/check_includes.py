#!/usr/bin/python3
"""Fails on an include against the layer order, and on an include cycle.

src/ is in layers, one folder each, and each is a CMake library that links
only the layers below it (CMakeLists.txt, trafficrate_layer). An include
"src/L/x.h" from a file of layer K is allowed when L is K or below it:

    base < net < budget < config, shm < runtime < cluster

(config and shm do not use each other). tests/L/ mirrors src/L/ and may
include what layer L may; tools/ (the CLI) may include config and shm and
what they use; lib/ (the preload library) anything. tests/ outside a layer
folder (bench, fuzz, helpers) are not checked: they link what they measure.

A unit is a header and its source (src/shm/zone.h and zone.cc are the unit
"shm/zone"; src/runtime/governor_budget.cc is a unit of its own that uses
"runtime/governor"). A cycle means two units that cannot be understood,
built or tested one without the other; each one seen so far came from a
single misplaced name. Prints every breach and cycle found, and exits 1 if
there is one.

    scripts/check_includes.py [--graph] [ROOT]
        ROOT: the checkout, by default this script's parent's parent.
        --graph: also print the includes between layers (a line per
        layer: the layers it includes, with how many includes each).
"""

import pathlib
import re
import sys

INCLUDE = re.compile(r'^#include "src/([A-Za-z0-9_]+)/([A-Za-z0-9_]+)\.h"', re.M)
ANY_SRC_INCLUDE = re.compile(r'^#include "src/([^"]*)"', re.M)

# Each layer and the layers it may use (besides itself).
BELOW = {
    "base": set(),
    "net": {"base"},
    "budget": {"base", "net"},
    "config": {"base", "net", "budget"},
    "shm": {"base", "net", "budget"},
    "runtime": {"base", "net", "budget", "config", "shm"},
    "cluster": {"base", "net", "budget", "config", "shm", "runtime"},
}
# Folders outside src/ and the layers their files may include.
USERS = {
    "tools": {"base", "net", "budget", "config", "shm"},
    "lib": set(BELOW),
}


def source_files(folder):
    return sorted(folder.glob("*.h")) + sorted(folder.glob("*.cc"))


def check_layers(root):
    """Breaches of the layer order, as lines; and the include graph of src/
    as {unit: {unit it includes}}."""
    breaches, graph = [], {}
    src = root / "src"
    for path in source_files(src):
        breaches.append("%s: src/ holds layer folders only" % path.relative_to(root))
    for folder in sorted(p for p in src.iterdir() if p.is_dir()):
        if folder.name not in BELOW:
            breaches.append("src/%s/: not a layer (add it to BELOW and to "
                            "CMakeLists.txt)" % folder.name)
            continue
        for path in source_files(folder):
            unit = "%s/%s" % (folder.name, path.stem)
            graph.setdefault(unit, set())
            text = path.read_text()
            for included in ANY_SRC_INCLUDE.findall(text):
                if "/" not in included:
                    breaches.append("%s: #include \"src/%s\" names no layer"
                                    % (path.relative_to(root), included))
            for layer, name in INCLUDE.findall(text):
                if layer != folder.name and layer not in BELOW[folder.name]:
                    breaches.append("%s: includes src/%s/%s.h, but %s may use only %s"
                                    % (path.relative_to(root), layer, name, folder.name,
                                       ", ".join(sorted(BELOW[folder.name])) or "itself"))
                used = "%s/%s" % (layer, name)
                if used != unit:
                    graph[unit].add(used)
                    graph.setdefault(used, set())
    users = [(root / name, allowed) for name, allowed in USERS.items()]
    users += [(root / "tests" / layer, BELOW[layer] | {layer}) for layer in BELOW]
    users.append((root / "tests" / "tools", USERS["tools"]))
    for folder, allowed in users:
        if not folder.is_dir():
            continue
        for path in source_files(folder):
            for layer, name in INCLUDE.findall(path.read_text()):
                if layer not in allowed:
                    breaches.append("%s: includes src/%s/%s.h, above what %s/ links"
                                    % (path.relative_to(root), layer, name,
                                       folder.relative_to(root)))
    return breaches, graph


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


def layer_graph(graph):
    """{layer: {layer it includes: how many unit includes}}."""
    layers = {}
    for unit, used in graph.items():
        counts = layers.setdefault(unit.split("/")[0], {})
        for other in used:
            target = other.split("/")[0]
            if target != unit.split("/")[0]:
                counts[target] = counts.get(target, 0) + 1
    return layers


def main(argv):
    args = argv[1:]
    show_graph = "--graph" in args
    args = [a for a in args if a != "--graph"]
    root = pathlib.Path(args[0]) if args else \
        pathlib.Path(__file__).resolve().parent.parent
    breaches, graph = check_layers(root)
    if show_graph:
        layers = layer_graph(graph)
        for layer in BELOW:
            used = layers.get(layer, {})
            print("%-8s -> %s" % (layer, ", ".join(
                "%s (%d)" % (other, used[other])
                for other in BELOW if other in used) or "-"))
    for line in breaches:
        print(line)
    cycles = strongly_connected(graph)
    for component in cycles:
        print("include cycle in src/: %s" % " -> ".join(cycle_path(graph, component)))
    if breaches or cycles:
        return 1
    print("src/: %d layers, %d units, %d includes between them, none against "
          "the layer order, no cycle"
          % (len(BELOW), len(graph), sum(len(v) for v in graph.values())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
