"""Next-token log-probs straight from the last hidden states, a chunk of tokens at a time
(and from logits, `compute_logprobs`, for a model whose head cannot be chunked).

The RL loss needs one number per token, log p(token | earlier tokens), but going through
the model's logits materialises a [T, vocab] tensor (5 GB in float32 for a 8k-token row
and Qwen's 151,936-token vocabulary), then its gradient, then a temperature-scaled copy.
Here the LM head and the log-softmax run `chunk_tokens` rows at a time in both passes: the
forward keeps one logsumexp per token, the backward recomputes each chunk's logits, so at
most one chunk of vocabulary-wide values exists at any moment.

Each token has its own sampling temperature (runs sample at different temperatures and
vLLM reports log-probs of the temperature-scaled distribution), applied inside the chunk.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from workbench.trainer.transfer import to_device

# Config attributes with which a model's logits are not `lm_head(hidden)`; such models keep
# the full-logits path (`logprob_chunk_tokens = 0`).
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
# Fewest rows the head multiplies when only some tokens are needed (see below).
MIN_HEAD_ROWS = 16


def chunkable_lm_head(model: nn.Module) -> nn.Linear | None:
    """The model's output linear if its logits are exactly `lm_head(hidden)`, else None."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, nn.Linear):
        return None
    config = getattr(model, "config", None)
    for name in _LOGIT_TRANSFORMS:
        value = getattr(config, name, None)
        if value not in (None, 1, 1.0):
            return None
    return head


def chunked_token_logprobs(
    hidden: torch.Tensor,
    head: nn.Linear,
    input_ids: torch.Tensor,
    temperatures: torch.Tensor,
    chunk_tokens: int = 1024,
    needed: torch.Tensor | None = None,
) -> torch.Tensor:
    """log p(input_ids[t] | tokens before t) in float32, aligned with `input_ids` [T].

    `hidden` [T, H] are the decoder's last hidden states for `input_ids`; `temperatures` [T]
    is each token's sampling temperature. Position 0 (and, in a packed row, the first token
    of each sample, predicted from the previous sample) gets a value that must stay out of
    the loss mask, as with `compute_logprobs` below, which this equals.

    `needed` [T] (bool, on the host): the tokens whose log-prob is read, the loss mask. Only
    their predictions go through the head, the others get 0 (where fewer than
    `MIN_HEAD_ROWS` are needed, the first others make up the number and get their
    log-probs). The RL loss reads completion tokens only, and prompts (and, in multi-turn
    episodes, environment messages) are often most of a row: their vocabulary-wide
    products were half or more of the head's work.
    """
    _check_inputs(hidden, input_ids, temperatures, chunk_tokens, needed)
    # Position t predicts token t + 1; the last position predicts nothing we have.
    inverse_temperature = 1.0 / to_device(temperatures[:-1].float(), hidden.device)
    if needed is None:
        predicted = _ChunkedLMHeadLogprobs.apply(
            hidden[:-1], head.weight, head.bias, input_ids[1:], inverse_temperature, chunk_tokens
        )
        return torch.cat([predicted.new_zeros(1), predicted])
    on_host = _head_positions(needed)
    positions = to_device(on_host, hidden.device)
    predicted = _ChunkedLMHeadLogprobs.apply(
        hidden.index_select(0, positions),
        head.weight,
        head.bias,
        input_ids[1:].index_select(0, positions),
        inverse_temperature.index_select(0, positions),
        chunk_tokens,
    )
    return predicted.new_zeros(input_ids.shape[0]).index_copy(0, positions + 1, predicted)


def _check_inputs(
    hidden: torch.Tensor,
    input_ids: torch.Tensor,
    temperatures: torch.Tensor,
    chunk_tokens: int,
    needed: torch.Tensor | None,
) -> None:
    if hidden.ndim != 2 or input_ids.shape != hidden.shape[:1]:
        raise ValueError(
            f"hidden [T, H] and input_ids [T] must agree, got {tuple(hidden.shape)} and "
            f"{tuple(input_ids.shape)}"
        )
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be at least 1, got {chunk_tokens}")
    if bool((temperatures <= 0).any()):
        raise ValueError("temperatures must be positive")
    if needed is not None and needed.shape != input_ids.shape:
        raise ValueError(f"needed must be [T] like input_ids, got {tuple(needed.shape)}")


def _head_positions(needed: torch.Tensor) -> torch.Tensor:
    """On the host, sorted: the positions whose predictions go through the head, those
    that predict a needed token and, where fewer than `MIN_HEAD_ROWS`, the first others."""
    # Found on the host: a nonzero on the GPU would wait for it.
    predicts_needed = needed[1:].cpu()
    on_host = torch.nonzero(predicts_needed).flatten()
    if on_host.numel() < MIN_HEAD_ROWS:
        # Padded with other positions: torch's CPU products of a few rows round differently
        # from the same rows among more (on one thread, widths 128 to 1024: up to 12 rows),
        # and a token's log-prob must not depend on how many needed tokens share its row
        # (runs packed together or alone train the same).
        others = torch.nonzero(~predicts_needed).flatten()[: MIN_HEAD_ROWS - on_host.numel()]
        on_host = torch.cat([on_host, others]).sort().values
    return on_host


class _ChunkedLMHeadLogprobs(torch.autograd.Function):
    """log_softmax(hidden W^T + b, scaled by 1/T per row)[target], chunk by chunk."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, inverse_temperature, chunk_tokens):  # type: ignore[override]
        rows = hidden.shape[0]
        out = torch.empty(rows, dtype=torch.float32, device=hidden.device)
        logsumexp = torch.empty_like(out)
        for start in range(0, rows, chunk_tokens):
            chunk = slice(start, start + chunk_tokens)
            scaled = _scaled_logits(hidden[chunk], weight, bias, inverse_temperature[chunk])
            logsumexp[chunk] = torch.logsumexp(scaled, dim=-1)
            picked = scaled.gather(-1, targets[chunk, None]).squeeze(-1)
            out[chunk] = picked - logsumexp[chunk]
        ctx.save_for_backward(hidden, weight, bias, targets, inverse_temperature, logsumexp)
        ctx.chunk_tokens = chunk_tokens
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        hidden, weight, bias, targets, inverse_temperature, logsumexp = ctx.saved_tensors
        needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if needs_hidden else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if needs_weight else None
        grad_bias = (
            torch.zeros_like(bias, dtype=torch.float32) if needs_bias and bias is not None else None
        )
        for start in range(0, hidden.shape[0], ctx.chunk_tokens):
            chunk = slice(start, start + ctx.chunk_tokens)
            scaled = _scaled_logits(hidden[chunk], weight, bias, inverse_temperature[chunk])
            # d/dz of log_softmax(z)[y] is onehot(y) - softmax(z); z = logits / T.
            grad_scaled = torch.exp(scaled - logsumexp[chunk, None]).mul_(-grad_out[chunk, None])
            grad_scaled.scatter_add_(-1, targets[chunk, None], grad_out[chunk, None].float())
            grad_logits = grad_scaled.mul_(inverse_temperature[chunk, None])
            del scaled, grad_scaled
            if grad_hidden is not None:
                grad_hidden[chunk] = (grad_logits.to(weight.dtype) @ weight).to(hidden.dtype)
            if grad_weight is not None:
                grad_weight += grad_logits.t() @ hidden[chunk].float()
            if grad_bias is not None:
                grad_bias += grad_logits.sum(0)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        if grad_bias is not None:
            grad_bias = grad_bias.to(bias.dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None


def _scaled_logits(hidden, weight, bias, inverse_temperature) -> torch.Tensor:
    """float32 [rows, vocab]: the chunk's logits, as the model computes them, over T."""
    return F.linear(hidden, weight, bias).float().mul_(inverse_temperature[:, None])


def compute_logprobs(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = 1024,
) -> torch.Tensor:
    """log p(input_ids[t] | tokens before t) in float32, aligned with `input_ids`.

    `logits` [B, T, V] (or [T, V]) are the model's outputs for `input_ids` [B, T] (or [T]);
    the value at position 0 (no prediction for it) is 0, as is, in a packed row, the value
    at the first token of each sample (it is predicted from the previous sample); keep
    those out of the loss mask (they are prompt tokens). Computed `chunk_size` positions
    at a time, forward and backward, so at most one chunk of float32 vocabulary-wide
    values exists besides the logits and their gradient.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    squeeze = logits.ndim == 2
    if squeeze:
        logits, input_ids = logits.unsqueeze(0), input_ids.unsqueeze(0)
    batch, seq_len, vocab = logits.shape
    if tuple(input_ids.shape) != (batch, seq_len):
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} do not match logits {tuple(logits.shape)}"
        )
    # Position t predicts token t + 1; the last position predicts nothing we have, so its
    # target is a dummy 0 and its result is shifted out below.
    targets = torch.cat([input_ids[:, 1:], input_ids.new_zeros(batch, 1)], dim=1)
    next_token_logprobs = _SelectedLogSoftmax.apply(
        logits.reshape(batch * seq_len, vocab), targets.reshape(-1), temperature, chunk_size
    ).view(batch, seq_len)
    result = torch.cat(
        [next_token_logprobs.new_zeros(batch, 1), next_token_logprobs[:, :-1]], dim=1
    )
    return result.squeeze(0) if squeeze else result


class _SelectedLogSoftmax(torch.autograd.Function):
    """log_softmax(logits / T)[target] per row, chunked; backward recomputes the softmax.

    Saves only the logits (alive anyway as the model's output) and one logsumexp per row,
    instead of autograd's float32 copy of the whole [rows, vocab] log-softmax.
    """

    @staticmethod
    def forward(ctx, logits, targets, temperature, chunk_size):  # type: ignore[override]
        out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        logsumexp = torch.empty_like(out)
        for start in range(0, logits.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            scaled = logits[rows].float() / temperature
            logsumexp[rows] = torch.logsumexp(scaled, dim=-1)
            out[rows] = scaled.gather(-1, targets[rows, None]).squeeze(-1) - logsumexp[rows]
        ctx.save_for_backward(logits, targets, logsumexp)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        logits, targets, logsumexp = ctx.saved_tensors
        grad_logits = torch.empty_like(logits)
        for start in range(0, logits.shape[0], ctx.chunk_size):
            rows = slice(start, start + ctx.chunk_size)
            grad = grad_out[rows, None].float()
            probs = torch.exp(logits[rows].float() / ctx.temperature - logsumexp[rows, None])
            chunk_grad = -probs * grad
            chunk_grad.scatter_add_(-1, targets[rows, None], grad)
            grad_logits[rows] = (chunk_grad / ctx.temperature).to(grad_logits.dtype)
        return grad_logits, None, None, None
