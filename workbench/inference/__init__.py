"""Inference: vLLM's OpenAI-compatible server with runtime LoRA loading.

- `server`: the vLLM command line, started by `python -m workbench.inference` (`__main__`);
  where it listens goes to `supervisor/endpoint.json` (`workbench.files.endpoint`);
- `readiness`: waiting for the server's health endpoint;
- `client`: `InferenceClient`, the orchestrators' chat, completion, tokenize and adapter
  loading requests, and `AdapterVersions`, each run's adapter versions loaded under names of
  their own (no same-name reload);
- `cpu_lora`: vLLM's multi-LoRA product on the CPU as two matrix products per adapter, and
  `vllm_plugin`, which vLLM loads in each of its processes and which installs it in a server
  workbench starts; `seeded_sampling`, seeded sampling kept when a prefill is split;
  `eager_ranks`, the sampled tokens' ranks counted without a kernel compiled at startup;
  `token_id_logprobs`, log-probs without token strings for the requests that ask so;
  `engine_fork`, on a small CPU machine the engine core forked from the API server rather
  than spawned;
- `engine_version`: the vLLM release those patches were tested against, checked at start;
- `engine_errors`: what killed vLLM's engine, read from the server's log.
"""
