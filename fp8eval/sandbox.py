"""Public path named in earlier READMEs: `fp8eval.sandbox.run_tests` (the sandbox lives in scoring/sandbox/)."""

from fp8eval.scoring.sandbox import run_tests, run_tests_detailed

__all__ = ["run_tests", "run_tests_detailed"]
