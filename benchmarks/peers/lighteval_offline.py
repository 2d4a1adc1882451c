"""`lighteval ...` with one network fetch answered offline; run it with the lighteval environment's python:
    python benchmarks/peers/lighteval_offline.py custom dummy ...   (same arguments as the `lighteval` CLI)

Every lighteval 0.13.0 command builds its task registry by importing all shipped task modules, and
lighteval/tasks/tasks/tiny_benchmarks.py then downloads tinyBenchmarks.pkl from GitHub at import time. With
no network that raises and the run dies before any task is looked at. Its download() skips the file when
the answer is not 200, so here that one URL gets a 503 without leaving the machine; nothing else changes
(the tinyBenchmarks tasks are not run). Set HF_HUB_OFFLINE=1 / HF_DATASETS_OFFLINE=1 for the hub.
"""

import sys

import requests

_get = requests.get


def _get_offline(url, *args, **kwargs):
    if "tinyBenchmarks.pkl" in str(url):
        resp = requests.Response()
        resp.status_code, resp.url, resp.reason = 503, str(url), "offline (benchmarks/peers/lighteval_offline.py)"
        return resp
    return _get(url, *args, **kwargs)


requests.get = _get_offline

if __name__ == "__main__":
    from lighteval.__main__ import app

    sys.argv[0] = "lighteval"
    sys.exit(app())
