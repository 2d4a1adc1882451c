"""`engine=server`: an OpenAI-compatible server, started here (managed) or already running (external).

- `engine.py`: `ServerEngine`, the Engine protocol over the pieces below,
- `client.py`: `Endpoint.send`, one request to one base URL with retries and checked answers,
- `answers.py`: what a usable answer is (`parse_answer`, `BadAnswer`, `WrongModel`),
- `preflight.py`: model, max_model_len and KV cache checks before any request,
- `managed.py`: the vLLM server process fp8eval starts itself.
"""

from fp8eval.engines.server.answers import BadAnswer, WrongModel, error_completion, parse_answer
from fp8eval.engines.server.client import (
                                           Endpoint,
                                           HTTPStatusError,
                                           Unreachable,
                                           final_answer,
                                           request_body,
                                           short_error,
)
from fp8eval.engines.server.engine import ServerEngine
from fp8eval.engines.server.managed import SERVER_MODULE, free_loopback_port
from fp8eval.engines.server.preflight import VOLATILE_CACHE_LABELS, cache_config_info_line, parse_cache_config_info

__all__ = ["BadAnswer", "WrongModel", "error_completion", "parse_answer", "Endpoint", "HTTPStatusError",
           "Unreachable", "final_answer", "request_body", "short_error",
           "ServerEngine", "SERVER_MODULE", "free_loopback_port", "VOLATILE_CACHE_LABELS",
           "cache_config_info_line", "parse_cache_config_info"]
