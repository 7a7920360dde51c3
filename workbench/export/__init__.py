"""`workbench export`: a run's best or latest adapter as a directory peft and vLLM load
without workbench, with a model card.

`selection` finds the adapters a run keeps and picks one, `card` writes its README.md,
`writer` stages the export and moves it into place whole.
"""

from workbench.export.selection import ExportError
from workbench.export.writer import Exported, export_adapter

__all__ = ["ExportError", "Exported", "export_adapter"]
