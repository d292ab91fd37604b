"""The tree speaks of the product: no tracker numbers in code, docstrings, comments or tests.
And the tests stay easy to extend: no test module imports another test module. And the
package stays readable: no function of ``cni_dra`` over 80 lines, no module over 500
lines unless :data:`LARGE_MODULES` says why.

A reader of the code cannot open a tracker entry named by its number; what it refers to
belongs in the text itself (or in the commit that made the change). Shared test helpers
live in ``tests/builders.py``, ``netns_tests/bed.py``, ``netns_tests/runner.py`` and the
conftest files, so that a test module can be read, moved or deleted on its own.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("cni_dra", "tests", "netns_tests", "scripts", "bench", "docs")
SUFFIXES = {".py", ".c", ".h", ".go", ".sh", ".in", ".md", ".yaml", ".yml", ".toml", ""}
# the word, then a number: parenthesised, with "#", capitalised, plural
TRACKER_REF = re.compile(r"\b" + "issue" + r"s?\s*#?\d+", re.IGNORECASE)


def _files() -> list[Path]:
    found = [REPO / "README.md"]
    for top in SCANNED:
        for path in (REPO / top).rglob("*"):
            if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts:
                found.append(path)
    return found


def test_no_tracker_numbers_in_the_tree() -> None:
    hits = []
    for path in _files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if TRACKER_REF.search(line):
                hits.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert hits == []


TEST_TREES = ("tests", "netns_tests")


def _imported_modules(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """(line, dotted module name) of every import in ``tree``, top level or nested;
    relative imports resolved against ``package``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    [*package.split(".")[: len(package.split(".")) - node.level + 1], base]
                ).strip(".")
            found.append((node.lineno, base))
            # ``from pkg import test_x`` imports a module too
            found += [
                (node.lineno, f"{base}.{alias.name}")
                for alias in node.names
                if alias.name.startswith("test_")
            ]
    return found


def test_no_test_module_imports_another_test_module() -> None:
    hits = []
    for top in TEST_TREES:
        for path in sorted((REPO / top).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            package = ".".join(path.relative_to(REPO).parent.parts)
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for line, module in _imported_modules(tree, package):
                if module.rsplit(".", 1)[-1].startswith("test_"):
                    hits.append(f"{path.relative_to(REPO)}:{line}: imports {module}")
    assert hits == []


def test_the_import_check_sees_every_form() -> None:
    src = "import tests.test_a\nfrom netns_tests.test_b import x\nfrom netns_tests import test_c\nfrom .test_d import y\n"
    mods = [m for _, m in _imported_modules(ast.parse(src), "netns_tests")]
    assert [m for m in mods if m.rsplit(".", 1)[-1].startswith("test_")] == [
        "tests.test_a",
        "netns_tests.test_b",
        "netns_tests.test_c",
        "netns_tests.test_d",
    ]


PACKAGE = REPO / "cni_dra"
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 500
# Module (relative to the repository) -> why it may be longer than MAX_MODULE_LINES.
LARGE_MODULES: dict[str, str] = {
    "cni_dra/netlink/shaping.py": "one job, traffic control on a pod interface: applying a spec (egress tbf; "
    "ingress qdisc, u32 redirect, ifb device and its tbf), removing it, reading it back, telling cni-dra's ifb "
    "devices from others, finding those left without their link and probing the kernel for every piece share "
    "the kernel's object model; split, each part would import the others' internals (the pure bucket model is "
    "cni_dra/netlink/tbf.py)",
}


def _package_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_no_function_of_the_package_is_longer_than_a_screen() -> None:
    hits = []
    for path in _package_modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    hits.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.name} has {lines} lines")
    assert hits == []


def test_no_module_of_the_package_is_large_without_a_reason() -> None:
    sizes = {
        str(p.relative_to(REPO)): len(p.read_text(encoding="utf-8").splitlines()) for p in _package_modules()
    }
    large = {path: n for path, n in sizes.items() if n > MAX_MODULE_LINES and path not in LARGE_MODULES}
    assert large == {}
    assert all(sizes.get(path, 0) > MAX_MODULE_LINES for path in LARGE_MODULES)  # no stale reason


def test_no_two_modules_of_the_package_share_a_file_name() -> None:
    """A file name says one job: ``status.py`` is the STATUS verb and nothing else."""
    by_name: dict[str, list[str]] = {}
    for path in _package_modules():
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert {name: paths for name, paths in by_name.items() if len(paths) > 1} == {}


def test_the_verbs_package_holds_the_five_verbs() -> None:
    """cni_dra/verbs is what a runtime can ask for; what an attachment goes through on the
    way (placement, intents, release, recovery, profile, shaping plan) is cni_dra/attach."""
    names = sorted(p.name for p in (PACKAGE / "verbs").glob("*.py"))
    assert names == ["__init__.py", "add.py", "check.py", "delete.py", "gc.py", "status.py"]
