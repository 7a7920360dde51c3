"""mkdocs hooks of the documentation site (`mkdocs.yml`: `hooks`).

The TUI's pictures are the SVG snapshots its tests keep current
(`tests/tui/__snapshots__/`); the site serves them under `assets/tui/` rather than a copy
that would go stale.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = ROOT / "tests" / "tui" / "__snapshots__" / "test_snapshots"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for snapshot in sorted(SNAPSHOTS.glob("*.svg")):
        uri = f"assets/tui/{snapshot.name.removeprefix('test_')}"
        files.append(File.generated(config, uri, abs_src_path=str(snapshot)))
    return files
