"""Import graph of server/, router/, heads/ and kernels/: circles, upward imports, heads/ size.

Every `import` and `from ... import` is counted, wherever it sits: at module top, inside a
function, or under `if TYPE_CHECKING:`. An import moved into a function to dodge a circle is
still a circle, so it counts the same.

Reports, in a fixed order so two runs (before/after a change) can be diffed:
- the number of modules and subpackages at the top of heads/ (target: at most 5 modules);
- module-level circles (strongly connected components of the module graph);
- room-level circles, where a room is a subpackage (`heads.vocab`, `server.gateway`) and a
  module at a package's top (`heads.manifest`, `server.cli`) is a room of its own;
- package-level arrows that break the project's direction (server -> router, heads;
  heads -> kernels; router -> kernels; kernels -> nothing of ours);
- upward imports inside server/, against SERVER_LAYERS below.

Usage: python scripts/import_graph.py [--root DIR] [--check]
With --check it exits 1 when any target is broken.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from pathlib import Path

PACKAGES = ("server", "router", "heads", "kernels")

# What each top-level package may import besides itself.
PACKAGE_DEPS: dict[str, frozenset[str]] = {
    "server": frozenset({"router", "heads", "kernels"}),
    "heads": frozenset({"kernels"}),
    "router": frozenset({"kernels"}),
    "kernels": frozenset(),
}

# server/'s rooms from the top down. A room may import only rooms on a lower layer, or its
# own layer's other rooms where they share a line below. Reading order:
# - cli dispatches to commands;
# - commands (and bench, which commands drive) start things: bootstrap, serving;
# - serving runs uvicorn around bootstrap's app; bootstrap wires api, gateway, backends, ops;
# - api is the HTTP edge: routes call the gateway;
# - gateway plans and runs a request on a backend;
# - backends talk to engines; ops holds the shared services both use (metrics, stores,
#   auth, logging) and imports neither;
# - settings, model_source and errors are leaves that every layer reads.
SERVER_LAYERS: tuple[tuple[str, ...], ...] = (
    ("server.cli",),
    ("server.commands",),
    ("server.bench",),
    ("server.serving",),
    ("server.bootstrap",),
    ("server.api",),
    ("server.gateway",),
    ("server.backends",),
    ("server.ops",),
    ("server.model_source", "server.schemas", "server.settings"),
    ("server.errors",),
)
HEADS_TOP_MAX = 5


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under the four packages."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of `name` that is one of our modules."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Our modules that `module` imports, anywhere in its file."""
    is_pkg = path.name == "__init__.py"
    package = module if is_pkg else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from a import b` names module a.b when that exists, else a name in a.
            names = [f"{base}.{alias.name}" for alias in node.names] or [base]
        for name in names:
            target = _resolve(name, modules)
            if target is not None and target != module:
                found.add(target)
    return found


def build_graph(root: Path) -> dict[str, set[str]]:
    modules = module_files(root)
    return {m: imports_of(m, p, modules) for m, p in modules.items()}


def room_of(module: str, modules: dict[str, set[str]]) -> str:
    """`heads.vocab.tokenizer` -> `heads.vocab`; `heads.manifest` -> `heads.manifest`."""
    parts = module.split(".")
    if len(parts) <= 2:
        return module
    return ".".join(parts[:2])


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return sorted(out)


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = defaultdict(set)
    for module, targets in graph.items():
        source = room_of(module, graph)
        rooms[source]
        for target in targets:
            dest = room_of(target, graph)
            if dest != source:
                rooms[source].add(dest)
    return dict(rooms)


def server_layer(module: str) -> int | None:
    for depth, layer in enumerate(SERVER_LAYERS):
        for room in layer:
            if module == room or module.startswith(room + "."):
                return depth
    return None


def upward_server_imports(graph: dict[str, set[str]]) -> tuple[list[str], list[str]]:
    """(arrows from a lower server layer to a higher one, server rooms missing from layers)."""
    upward: list[str] = []
    unlayered: set[str] = set()
    for module, targets in sorted(graph.items()):
        if not module.startswith("server"):
            continue
        source = server_layer(module)
        if source is None:
            if module != "server":
                unlayered.add(room_of(module, graph))
            continue
        for target in sorted(targets):
            dest = server_layer(target)
            if dest is not None and dest < source:
                upward.append(f"{module} -> {target}")
    return upward, sorted(unlayered)


def package_violations(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, targets in sorted(graph.items()):
        source = module.split(".")[0]
        for target in sorted(targets):
            dest = target.split(".")[0]
            if dest != source and dest not in PACKAGE_DEPS[source]:
                out.append(f"{module} -> {target}")
    return out


def heads_top(root: Path) -> tuple[list[str], list[str]]:
    """(top-level modules of heads/ other than __init__, its subpackages)."""
    heads = root / "heads"
    mods = sorted(p.stem for p in heads.glob("*.py") if p.name != "__init__.py")
    pkgs = sorted(p.name for p in heads.iterdir() if (p / "__init__.py").is_file())
    return mods, pkgs


def report(root: Path) -> tuple[list[str], bool]:
    """The printed lines, and whether every target holds."""
    graph = build_graph(root)
    rooms = room_graph(graph)
    mod_circles = circles(graph)
    room_circles = circles(rooms)
    upward, unlayered = upward_server_imports(graph)
    packages = package_violations(graph)
    top_mods, top_pkgs = heads_top(root)
    heads_modules = [m for m in graph if m.startswith("heads")]
    heads_rooms = [r for r in rooms if r.startswith("heads.")]
    heads_arrows = sum(
        len([t for t in ts if t.startswith("heads")])
        for m, ts in graph.items()
        if m.startswith("heads")
    )
    heads_room_arrows = sum(
        len([t for t in ts if t.startswith("heads.")])
        for r, ts in rooms.items()
        if r.startswith("heads.")
    )
    lines = [
        f"modules: {len(graph)}  arrows: {sum(len(t) for t in graph.values())}",
        f"heads/: {len(heads_modules)} modules, {heads_arrows} arrows between them; "
        f"{len(heads_rooms)} rooms, {heads_room_arrows} arrows between rooms",
        f"heads/ top level: {len(top_mods)} modules (max {HEADS_TOP_MAX}), "
        f"{len(top_pkgs)} subpackages",
        f"  modules: {' '.join(top_mods)}",
        f"  subpackages: {' '.join(top_pkgs)}",
        f"module circles: {len(mod_circles)}",
        *(f"  {' <-> '.join(c)}" for c in mod_circles),
        f"room circles: {len(room_circles)}",
        *(f"  {' <-> '.join(c)}" for c in room_circles),
        f"package direction breaks: {len(packages)}",
        *(f"  {arrow}" for arrow in packages),
        "server layers (top down): " + " > ".join("|".join(layer) for layer in SERVER_LAYERS),
        f"server upward imports: {len(upward)}",
        *(f"  {arrow}" for arrow in upward),
        f"server rooms outside the layers: {len(unlayered)}",
        *(f"  {room}" for room in unlayered),
    ]
    ok = (
        len(top_mods) <= HEADS_TOP_MAX
        and not mod_circles
        and not room_circles
        and not packages
        and not upward
        and not unlayered
    )
    lines.append("targets: " + ("MET" if ok else "MISSED"))
    return lines, ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = parser.parse_args(argv)
    lines, ok = report(args.root)
    sys.stdout.write("\n".join(lines) + "\n")
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    raise SystemExit(main())
