"""mkdocs hooks of the documentation site (`mkdocs.yml`: `hooks`).

The site's pictures are files the project already keeps, served as they are rather than
copies that would go stale: the TUI's SVG snapshots, which its tests keep current
(`tests/tui/__snapshots__/`), under `assets/tui/`, and the benchmarks' plots
(`benchmarks/results/*.png`) under `assets/results/`.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = ROOT / "tests" / "tui" / "__snapshots__" / "test_snapshots"
RESULTS = ROOT / "benchmarks" / "results"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    for snapshot in sorted(SNAPSHOTS.glob("*.svg")):
        uri = f"assets/tui/{snapshot.name.removeprefix('test_')}"
        files.append(File.generated(config, uri, abs_src_path=str(snapshot)))
    for plot in sorted(RESULTS.glob("*.png")):
        files.append(File.generated(config, f"assets/results/{plot.name}", abs_src_path=str(plot)))
    return files
