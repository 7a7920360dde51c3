"""docs/architecture.md's layout names every folder of the package.

A newcomer reads the layout first; a folder it leaves out is one they cannot find.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "architecture.md"


def package_folders() -> set[str]:
    """Every folder under workbench/ that holds Python modules, relative to workbench/."""
    package = REPO / "workbench"
    return {
        str(folder.relative_to(package))
        for folder in package.rglob("*")
        if folder.is_dir() and "__pycache__" not in folder.parts and any(folder.glob("*.py"))
    }


def documented_folders(page: str) -> set[str]:
    """The folders the page's layout block names: a `name/` entry nested under the entry
    above it by indentation, or a `parent/child/` path written out in a description."""
    block = page.split("## The layout", 1)[1].split("```", 2)[1]
    folders: set[str] = set()
    parents: list[tuple[int, str]] = []
    for line in block.splitlines():
        entry = re.match(r"^( *)([\w-]+)/\s", line + " ")
        if entry and line.startswith("  "):
            indent, name = len(entry.group(1)), entry.group(2)
            parents = [(i, p) for i, p in parents if i < indent]
            path = "/".join([p for _, p in parents] + [name])
            folders.add(path)
            parents.append((indent, name))
        folders.update(re.findall(r"\b([\w-]+(?:/[\w-]+)+)/", line))
    return folders


def test_the_architecture_layout_names_every_folder_of_the_package():
    missing = package_folders() - documented_folders(PAGE.read_text(encoding="utf-8"))
    assert not missing, f"docs/architecture.md's layout leaves out: {sorted(missing)}"


def test_the_architecture_layout_names_every_module_at_the_package_root():
    block = PAGE.read_text(encoding="utf-8").split("## The layout", 1)[1].split("```", 2)[1]
    modules = {p.name for p in (REPO / "workbench").glob("*.py") if p.name != "__init__.py"}
    missing = sorted(m for m in modules if not re.search(rf"(?<![\w/]){re.escape(m)}", block))
    assert not missing, f"docs/architecture.md's layout leaves out: {missing}"


def test_the_check_sees_a_folder_left_out():
    page = PAGE.read_text(encoding="utf-8")
    without = "\n".join(line for line in page.splitlines() if "    parallel/" not in line)
    assert "trainer/parallel" not in documented_folders(without)
    assert "trainer/parallel" in documented_folders(page)


def test_no_module_or_page_cites_a_file_outside_the_repository():
    """A reader of a clone has only the clone: a citation must name a source they can find
    (a project, a paper, a file of this repository), not a path beside the checkout."""
    # Pieced together so that this line does not cite what it looks for.
    outside = re.compile("|".join(re.escape(p) for p in ("../" + "shared/", "/work/" + "shared/")))
    citing = [
        f"{path.relative_to(REPO)}:{number}"
        for folder in ("workbench", "docs", "scripts", "tests")
        for path in sorted((REPO / folder).rglob("*"))
        if path.suffix in {".py", ".md", ".sh", ".toml"} and "__pycache__" not in path.parts
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if outside.search(line)
    ]
    assert not citing, f"cites a file outside the repository: {citing}"


def test_every_package_docstring_names_what_is_in_it():
    """A package's docstring is its table of contents: each module and sub-package by name
    (the package root, `workbench/__init__.py`, is the architecture page's job)."""
    import ast

    unnamed = {}
    for init in sorted((REPO / "workbench").rglob("__init__.py")):
        package = init.parent
        if package == REPO / "workbench":
            continue
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        parts = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
        parts |= {d.name for d in package.iterdir() if (d / "__init__.py").exists()}
        missing = sorted(n for n in parts if not re.search(rf"(?<!\w){re.escape(n)}(?!\w)", doc))
        if missing:
            unnamed[str(package.relative_to(REPO))] = missing
    assert not unnamed, f"package docstrings that leave out modules: {unnamed}"
