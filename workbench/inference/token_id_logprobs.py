"""Log-probs without token strings, for the requests that ask for them so.

Every request workbench sends asks for the sampled tokens' log-probs; the trainer needs the
numbers only, and the tokens come back as ids (`return_token_ids`). vLLM's API server
nonetheless decodes each of those tokens on its own (`convert_ids_list_to_tokens`), and the
chat endpoint answers each as a string and a list of its UTF-8 bytes. In a 16-run
experiment on the 2-core machine the API server used 50 of the experiment's 262
CPU-seconds, and its log-prob processing about a fifth of its samples (py-spy, 2026-11-28);
alone, 64 requests of 8 completions of 12 tokens cost it 0.57 CPU-seconds with log-probs
and 0.26 without, and the answers were 4 times the bytes (691 KB against 173 KB) for the
orchestrators to parse.

A request that `with_logprobs_as_ids` marked (an entry in its `vllm_xargs`, and
`return_tokens_as_token_ids`) gets its log-probs with no token decoded: `install()` gives
its log-prob processor no tokenizer, so each token is named `token_id:N` and its `bytes`
are null. The completion's text is detokenized as before (environments score it). Any
other request is answered as vLLM answers it. The plugin installs the patch on the CPU
platform, beside its others; a server without it (vLLM's GPU build here) answers these
requests too, naming the tokens by id but still decoding them for their bytes.
"""

from __future__ import annotations

from typing import Any

XARG = "workbench_logprobs"
AS_IDS = "ids"


def with_logprobs_as_ids(body: dict[str, Any]) -> dict[str, Any]:
    """A chat or completion request's `body` marked for log-probs without token strings
    (any `vllm_xargs` it had are kept)."""
    return {
        **body,
        "return_tokens_as_token_ids": True,
        "vllm_xargs": {**(body.get("vllm_xargs") or {}), XARG: AS_IDS},
    }


def wants_ids_only(request: Any) -> bool:
    """Whether an engine request asked for log-probs as token ids only."""
    params = request.sampling_params
    return params is not None and (params.extra_args or {}).get(XARG) == AS_IDS


def install() -> None:
    from vllm.v1.engine.logprobs import LogprobsProcessor

    vllms = LogprobsProcessor.from_new_request.__func__
    if getattr(vllms, "wraps_vllms", False):
        return

    def from_new_request(cls, tokenizer, request):
        return vllms(cls, tokenizer=None if wants_ids_only(request) else tokenizer, request=request)

    from_new_request.wraps_vllms = True
    LogprobsProcessor.from_new_request = classmethod(from_new_request)
