"""What the two vLLM engines (`engine=vllm` offline, `engine=server`) share, by concern.

- `args`: engine args -> `vllm serve` flags (real EngineArgs names), which Python runs vLLM, log dir;
- `kvcheck`: what the arm asked of the cache vs what the engine reports it runs; FP8 on a CPU vLLM;
- `logscan`: start-up warnings worth keeping, the attention backend, a crash's root cause and its fix;
- `child`: vLLM child processes, always stopped (atexit, SIGTERM, parent death);
- `stats`: vLLM's prefill counters.
"""
