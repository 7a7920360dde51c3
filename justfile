# Developer tasks. `just --list` shows them.

# Install into ./.venv (CPU build of vLLM here, CUDA vLLM where nvidia-smi works).
install:
    bash scripts/install.sh

# The whole test suite (what CI runs).
test *ARGS:
    .venv/bin/pytest {{ARGS}}

# Lint and format check.
lint:
    .venv/bin/ruff check .
    .venv/bin/ruff format --check .

# Format the code.
fmt:
    .venv/bin/ruff format .
    .venv/bin/ruff check --fix .

# Serve the documentation site at http://127.0.0.1:8000 (rebuilds on every change).
docs:
    .venv/bin/mkdocs serve

# Rewrite the generated reference pages (recipe keys, commands) from the code.
docs-reference:
    .venv/bin/python scripts/recipe_reference.py
    .venv/bin/python scripts/cli_reference.py
    .venv/bin/python scripts/figures_page.py

# Every benchmark but faults (`workbench bench faults` runs alone); results as JSON under
# benchmarks/results/.
bench:
    .venv/bin/workbench bench all

# Start the reverse_text recipe.
up:
    .venv/bin/workbench up recipes/reverse_text.toml
