"""Inference: vLLM's OpenAI-compatible server with runtime LoRA loading.

`server` builds the command line and starts it (`python -m workbench.inference`),
`readiness` waits for its health endpoint, `endpoint` is where clients find it, and
`adapters` loads each run's adapter versions without vLLM's same-name reload pitfalls.
"""
