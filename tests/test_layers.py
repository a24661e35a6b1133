"""Imports flow one way: every import inside mlcomm matches the layer table in docs/design.

The table names packages and modules (its entries); a module belongs to the entry that is its
longest prefix. Imports go down or stay in a layer, the bottom layer's entries import nothing
of mlcomm but themselves, the top application layer's entries import none of each other, and
no import cycle closes, between entries of a layer or between modules."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"mlcomm": ROOT / "mlcomm", "mlcomm.kernels": ROOT / "kernels"}


def layers() -> dict:
    """``{module prefix: level}`` from the table between the layers markers of the design page."""
    text = (ROOT / "docs" / "design.rst").read_text()
    table = text.split(".. layers-start", 1)[1].split(".. layers-end", 1)[0]
    out = {}
    for line in table.splitlines():
        m = re.match(r"\s+(\d+)\s+(mlcomm.*)$", line)
        if m:
            for name in m.group(2).split():
                out[name] = int(m.group(1))
    return out


def entry(module: str, table: dict) -> str:
    """The table entry ``module`` belongs to: its longest prefix in the table."""
    parts = module.split(".")
    if module == "mlcomm":
        return module
    for k in range(len(parts), 1, -1):  # the root's layer is the root's alone
        name = ".".join(parts[:k])
        if name in table:
            return name
    raise AssertionError(f"{module} is in no layer of docs/design.rst")


def level(module: str, table: dict) -> int:
    """The level of ``module``: its entry's."""
    return table[entry(module, table)]


def graph() -> dict:
    """``{module: {(imported module, path, line), ...}}`` over the whole package."""
    out = {}
    for module, is_package, path in modules():
        out[module] = {(target, path.relative_to(ROOT), line)
                       for target, line in imports(module, is_package, path) if target != module}
    return out


def cycles(edges: dict) -> list:
    """The strongly connected components of more than one node of ``{node: {node, ...}}``."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def modules():
    """Yield ``(module name, is package, path)`` for every source file of the package."""
    for package, base in PACKAGES.items():
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            yield ".".join([package, *parts]), path.name == "__init__.py", path


def imports(module, is_package, path):
    """Every mlcomm module ``path`` imports, lazily inside functions too."""
    tree = ast.parse(path.read_text())
    here = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "mlcomm":
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "mlcomm":
                continue
            for alias in node.names:  # ``from pkg import sub`` imports the submodule pkg.sub
                sub = f"{target}.{alias.name}"
                yield (sub if _is_module(sub) else target), node.lineno


def _is_module(name: str) -> bool:
    parts = name.split(".")
    if parts[:2] == ["mlcomm", "kernels"]:
        base, parts = PACKAGES["mlcomm.kernels"], parts[2:]
    else:
        base, parts = PACKAGES["mlcomm"], parts[1:]
    path = base.joinpath(*parts) if parts else base
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def test_every_module_has_a_layer_and_imports_go_down():
    table = layers()
    assert table, "docs/design.rst has no layer table"
    upward = []
    for module, is_package, path in modules():
        mine = level(module, table)
        for target, line in imports(module, is_package, path):
            theirs = level(target, table)
            if theirs > mine:
                upward.append(f"{path.relative_to(ROOT)}:{line}: {module} (layer {mine}) "
                              f"imports {target} (layer {theirs})")
    assert not upward, "imports that go up:\n" + "\n".join(upward)


def test_the_bottom_layer_imports_nothing_of_mlcomm():
    table = layers()
    bottom = min(table.values())
    found = [f"{path}:{line}: {module} imports {target}"
             for module, targets in graph().items() if level(module, table) == bottom
             for target, path, line in targets if entry(target, table) != entry(module, table)]
    assert not found, "imports out of the bottom layer:\n" + "\n".join(found)


def test_no_application_imports_another():
    table = layers()
    apps = max(v for k, v in table.items() if table[k] < table["mlcomm"])
    found = [f"{path}:{line}: {module} imports {target}"
             for module, targets in graph().items() if level(module, table) == apps
             for target, path, line in targets
             if level(target, table) == apps and entry(target, table) != entry(module, table)]
    assert not found, "applications that import one another:\n" + "\n".join(found)


def test_no_import_cycles():
    """Between modules anywhere, and between the entries of one layer."""
    table = layers()
    edges = {m: {t for t, _, _ in targets} for m, targets in graph().items()}
    assert not cycles(edges), f"modules that import one another: {cycles(edges)}"
    between = {}
    for module, targets in edges.items():
        for target in targets:
            a, b = entry(module, table), entry(target, table)
            if a != b and table[a] == table[b]:
                between.setdefault(a, set()).add(b)
    assert not cycles(between), f"entries of one layer that import one another: {cycles(between)}"


def test_the_cycle_finder_sees_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_nothing_inside_imports_the_package_root():
    found = []
    for module, is_package, path in modules():
        if module == "mlcomm":
            continue
        for target, line in imports(module, is_package, path):
            if target == "mlcomm":
                found.append(f"{path.relative_to(ROOT)}:{line}")
    assert not found, "imports of the package root: " + ", ".join(found)


def test_the_import_checker_sees_an_upward_import(tmp_path):
    """The checker itself: a lazy relative import from a low layer to a high one is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from ..api import allreduce\n    from mlcomm import api, x\n")
    found = list(imports("mlcomm.transport.bad", False, bad))
    assert found == [("mlcomm.api", 2), ("mlcomm.api", 3), ("mlcomm", 3)]
    assert level("mlcomm.api", layers()) > level("mlcomm.transport.bad", layers())


#: the house's size rule: no module over this many lines, no function over this many
MODULE_LINES, FUNCTION_LINES = 500, 100


def too_large(path) -> list:
    """What in ``path`` breaks the size rule, in words."""
    text, name = path.read_text(), path.relative_to(ROOT) if ROOT in path.parents else path
    found = [f"{name}: {len(text.splitlines())} lines"] \
        if len(text.splitlines()) > MODULE_LINES else []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            if length > FUNCTION_LINES:
                found.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    return found


def test_no_module_over_500_lines_nor_function_over_100():
    found = [f for _, _, path in modules() for f in too_large(path)]
    assert not found, "split these into parts of one job each: " + "; ".join(found)


def test_the_size_rule_sees_a_long_module_and_function(tmp_path):
    long = tmp_path / "long.py"
    long.write_text("def f():\n" + "    x = 1\n" * 100 + "\n" * 400 + "y = 2\n")
    assert [f.split(": ", 1)[1] for f in too_large(long)] == ["502 lines", "101 lines"]
