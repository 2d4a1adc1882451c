"""`python -m fp8eval.pareto`: every KV format x skip list x calibration on one Pareto frontier (KV bytes per token
vs divergence, optionally task recovery and ITL slope), the smallest configuration meeting a target, and the
`vllm serve` line for it."""
