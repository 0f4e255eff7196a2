"""The rule of the house (issue 22): imports only go down the wings of ``proxy/``.

From the top down; a module may import its own wing and any wing below it:

    edge         __main__.py app.py serve/   the process and the ASGI app: they alone
                                             import routes/ and serve/
    simulator    simulator/                  the test double ``__main__`` serves
    routes       routes/                     one module per API or endpoint family
    pipeline     pipeline.py                 the steps of a compacting request
    services     services.py                 Services and the composition root
    compaction   compaction/
    upstream     upstream/                   only upstream/client.py and shortcuts/ import
                                             aiohttp
    shortcuts    shortcuts/                  framework internals for speed, each gated
                                             (below every wing that takes one)
    store        store/
    observe      observe/
    core         core/                       pure: core/, config, errors, types, the
                                             stdlib's pure modules, PURE_LIBRARIES
    config       config/ config_file.py redact.py tenants.py pricing.py
    base         errors.py types.py

Every import counts, wherever it stands (a function's lazy import and a
``TYPE_CHECKING`` one are dependencies too); the cycle and chain checks read only
what runs when a module is imported. Links that break the rule today are listed in
``ALLOWED`` with the reason: the list may shrink, not grow (issue 22 items 3 and 5
cut them), and an entry leaves it once its link is gone.
"""

from __future__ import annotations

import ast
import gc
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "proxy"
WINGS = (
    "edge",
    "simulator",
    "routes",
    "pipeline",
    "services",
    "compaction",
    "upstream",
    "shortcuts",
    "store",
    "observe",
    "core",
    "config",
    "base",
)
_TOP = {
    "__main__": "edge",
    "app": "edge",
    "serve": "edge",
    "pipeline": "pipeline",
    "services": "services",
    "config": "config",
    "config_file": "config",
    "tenants": "config",
    "redact": "config",
    "pricing": "config",
    "errors": "base",
    "types": "base",
    "": "base",  # proxy/__init__.py
}
# Upward links today, importer -> imported (module names below proxy.): each one a
# reason. May shrink, not grow; issue 22 items 3-5 cut the nine there were.
ALLOWED: dict[tuple[str, str], str] = {}
# Core may use these libraries (pure computation) besides the standard library.
PURE_LIBRARIES = frozenset({"orjson", "xxhash", "cachetools", "tiktoken", "Stemmer"})
# Standard modules that are I/O, clock, processes or the event loop: not for core.
IMPURE_STDLIB = frozenset(
    {"asyncio", "datetime", "os", "select", "selectors", "signal", "socket", "ssl"}
    | {"subprocess", "multiprocessing", "time", "urllib.request", "http"}
)
# Core modules that import one of those anyway, each with what it does with it.
CORE_EXCEPTIONS = {
    ("core.values", "time"): "time.sleep(0) hands the GIL to the event loop; reads no clock",
    ("core.encodings", "os"): "clears TIKTOKEN_CACHE_DIR while a tokenizer file loads",
}
# The longest chain of module-level imports (modules in it) may shrink, not grow: lower
# it when it does. Issue 22 aims at 11. Today: app -> routes.chat -> pipeline -> services
# -> compaction.compact -> .fold -> .summarize -> upstream.client -> config -> config_file
# -> errors.
CHAIN_CEILING = 11


def wing(module: str) -> str:
    head = module.split(".", 1)[0]
    return _TOP.get(head, head)


@cache
def modules() -> dict[str, Path]:
    """Module names below ``proxy.`` ("core.trim", "store" for a package) and files."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(tree: ast.Module, module_level: bool) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements: all of them, or those that run when the module is imported."""
    if not module_level:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                yield node
        return
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and not _type_checking(node):
            pending += node.body + node.orelse
        elif isinstance(node, ast.Try):
            pending += node.body + node.orelse + node.finalbody
            pending += [s for h in node.handlers for s in h.body]


def _absolute(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = ["proxy", *module.split(".")] if module else ["proxy"]
    if modules()[module].name != "__init__.py":
        package.pop()
    package = package[: len(package) - node.level + 1]
    return ".".join(package + ([node.module] if node.module else []))


def _parsed(source: str) -> ast.Module:
    """``ast.parse``, robust to a CPython 3.11.7 fault: in some runs of several test files
    (2 of 4 here, then none in 2; the parse alone never), it raised "SystemError: AST
    constructor recursion depth mismatch". The collector is off during the parse (a
    finalizer run inside it is the likeliest trigger) and a SystemError is retried once."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        try:
            return ast.parse(source)
        except SystemError:
            return ast.parse(source)
    finally:
        if enabled:
            gc.enable()


@cache
def imports(module: str, module_level: bool = False) -> frozenset[str]:
    """What ``module`` imports: proxy modules by name below ``proxy.``, anything else by
    its full dotted name."""
    tree = _parsed(modules()[module].read_text())
    names: set[str] = set()
    for node in _statements(tree, module_level):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = _absolute(module, node)
            targets = [f"{base}.{alias.name}" for alias in node.names]
            targets = [t if t.removeprefix("proxy.") in modules() else base for t in targets]
        for target in targets:
            if target == "proxy" or target.startswith("proxy."):
                inner = target.removeprefix("proxy").removeprefix(".")
                if inner != module:
                    names.add(inner)
            else:
                names.add(target)
    return frozenset(names)


def internal(module: str, module_level: bool = False) -> set[str]:
    return {name for name in imports(module, module_level) if name in modules()}


def links() -> set[tuple[str, str]]:
    return {(a, b) for a in modules() for b in internal(a)}


def upward(a: str, b: str) -> bool:
    return wing(a) != wing(b) and WINGS.index(wing(b)) <= WINGS.index(wing(a))


def test_every_module_has_a_wing() -> None:
    assert {name for name in modules() if wing(name) not in WINGS} == set()


def test_imports_only_go_down() -> None:
    broken = {(a, b) for a, b in links() if upward(a, b)}
    assert sorted(broken - ALLOWED.keys()) == []


def test_only_the_edge_imports_routes_and_serve() -> None:
    for_edge = {"routes", "serve"}
    reached = {
        (a, b)
        for a, b in links()
        if b.split(".")[0] in for_edge and wing(a) != "edge" and a.split(".")[0] != b.split(".")[0]
    }
    assert sorted(reached - ALLOWED.keys()) == []


def test_core_imports_only_core_config_errors_types_and_pure_libraries() -> None:
    impure = set()
    for name in (m for m in modules() if wing(m) == "core"):
        for target in imports(name):
            top = target.split(".")[0]
            if target in modules():
                ok = wing(target) in ("core", "config", "base") or (name, target) in ALLOWED
            elif top in sys.stdlib_module_names:
                ok = top not in IMPURE_STDLIB and target not in IMPURE_STDLIB
                ok = ok or (name, top) in CORE_EXCEPTIONS
            else:
                ok = top in PURE_LIBRARIES
            if not ok:
                impure.add((name, target))
    assert sorted(impure) == []


def test_only_the_upstream_client_and_its_shortcut_import_aiohttp() -> None:
    users = {name for name in modules() for t in imports(name) if t.split(".")[0] == "aiohttp"}
    assert users == {"upstream.client", "shortcuts.aiohttp_request"}


# What reaches into a framework's internals, each module under shortcuts/ (issue 38).
_INTERNALS = ("uvicorn.protocols", "starlette._utils", "aiohttp.payload", "aiohttp.helpers")


def test_framework_internals_are_imported_under_shortcuts_only() -> None:
    """Besides serve/limits.py, whose bounds are a feature on uvicorn's protocol, not a
    shortcut (it takes its request side from shortcuts/uvicorn_cycle.py)."""
    users = {
        name
        for name in modules()
        for target in imports(name)
        if target.startswith(_INTERNALS) and not name.startswith("simulator")
    }
    outside = {name for name in users if wing(name) != "shortcuts"}
    assert outside == {"serve.limits", "upstream.client"}


def test_every_allowed_link_still_exists() -> None:
    """A link cut leaves ALLOWED (and CORE_EXCEPTIONS), so the rule holds for it again."""
    assert {link for link in ALLOWED if link in links() and upward(*link)} == set(ALLOWED)
    used = {(name, t.split(".")[0]) for name in modules() for t in imports(name)}
    assert set(CORE_EXCEPTIONS) <= used


def _graph() -> dict[str, set[str]]:
    return {name: internal(name, module_level=True) for name in modules()}


def test_no_module_level_import_cycle() -> None:
    graph, state, cycles = _graph(), dict[str, int](), []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


# Import cycles inside a wing counting every import (a lazy or a TYPE_CHECKING one too: a
# reader follows those as well), each group of modules tied in one. Issue 38 asks for none,
# and there are none: a new one fails the test below.
TIED: set[frozenset[str]] = set()


def tied_groups() -> set[frozenset[str]]:
    """Each group of two or more modules of one wing that import each other, through
    every import (Tarjan's strongly connected components, iteratively)."""
    graph = {m: sorted(t for t in internal(m) if wing(t) == wing(m)) for m in modules()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: set[frozenset[str]] = set()
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
            if i < len(graph[node]):
                work.append((node, i + 1))
                nxt = graph[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                group = set()
                while True:
                    member = stack.pop()
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.add(frozenset(group))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return groups


def test_no_new_import_cycle_inside_a_wing_type_only_ones_included() -> None:
    groups = tied_groups()
    assert sorted(map(sorted, groups - TIED)) == []
    assert sorted(map(sorted, TIED - groups)) == [], "untied: take them out of TIED"


def longest_chain() -> list[str]:
    """The longest path of module-level imports (a cycle's back link is not followed)."""
    graph, best = _graph(), dict[str, list[str]]()

    def chain(node: str) -> list[str]:
        if node not in best:
            best[node] = []  # on the path: a cycle back to it ends there
            below = [chain(nxt) for nxt in sorted(graph[node])]
            best[node] = [node, *max(below, key=len, default=[])]
        return best[node]

    return max((chain(name) for name in sorted(graph)), key=len)


def test_the_longest_import_chain_stays_within_its_ceiling() -> None:
    found = longest_chain()
    assert len(found) <= CHAIN_CEILING, " -> ".join(found)
    assert len(found) == CHAIN_CEILING, f"lower CHAIN_CEILING to {len(found)}"
