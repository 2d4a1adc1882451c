#!/usr/bin/env bash
# The test command (README, CI): install if needed, then run the whole suite, slow end-to-end tests
# included. Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not slow"` for the fast ones.
set -euo pipefail
cd "$(dirname "$0")/.."
# .ci/run installs first and sets FP8EVAL_TEST_INSTALLED=1 before it calls this twice.
if [[ "${FP8EVAL_TEST_INSTALLED:-0}" != 1 ]]; then
  bash scripts/install.sh
fi
# The linter first (pyflakes, import order, pycodestyle errors; config in pyproject.toml): seconds.
.venv/bin/ruff check fp8eval tests benchmarks scripts
exec .venv/bin/python -m pytest -q -ra --durations=15 "$@"
