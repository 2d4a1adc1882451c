#!/usr/bin/env bash
# The test command (README, CI): install if needed, then run the whole suite, slow end-to-end tests
# included. Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for the fast ones.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
# The linter first (pyflakes, import order, pycodestyle errors; config in pyproject.toml): seconds.
.venv/bin/ruff check fp8eval tests benchmarks scripts
exec .venv/bin/python -m pytest -q -ra --durations=15 "$@"
