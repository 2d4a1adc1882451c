"""The recovery report: records of paired arms in; recovery.csv, report.md, index.html, figures out.

`write_report(paths, out)` is what `python -m fp8eval.report PATH...` and the end of a
`python -m fp8eval` run call. Importing this module is cheap (stdlib only); pandas, numpy and
matplotlib load when a report is written.
"""

from fp8eval.report.write import write_report

__all__ = ["write_report"]
