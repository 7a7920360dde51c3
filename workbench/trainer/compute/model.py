"""How the frozen model computes a packed row: attention, recomputation, compilation, log-probs.

`prepare_model` applies the trainer's compute settings to a plain Hugging Face model, as
functions over it (torchtitan's way): the attention path for packed rows, activation
checkpointing of every decoder layer, and optionally `torch.compile` of each layer. It
returns the `ComputePlan` that `packed_row_logprobs` follows for every row: decoder forward
with the row's sample boundaries, then the LM head and log-softmax in token chunks
(`lm_head.py`), so neither a T x T mask nor T x vocab logits exist on the hot path.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from workbench.config import TrainerSection
from workbench.trainer.compute.attention import (
    BUCKET_MIN_FILL,
    EAGER_UNDER_COMPILE,
    AttentionPath,
    PackedSequences,
    use_packed_attention,
)
from workbench.trainer.compute.attention_choice import AttentionRuntime, resolve_attention
from workbench.trainer.compute.lm_head import (
    chunkable_lm_head,
    chunked_token_logprobs,
    compute_logprobs,
)
from workbench.trainer.lora.layer import LoRARouting, find_lora_routing
from workbench.trainer.transfer import to_device

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ComputePlan:
    """The resolved compute settings of one trainer (what "auto" turned into)."""

    attention: AttentionPath
    logprob_chunk_tokens: int  # 0: the model's full [T, vocab] logits
    activation_checkpointing: bool
    compiled: bool

    def describe(self) -> str:
        chunk = (
            f"LM head in chunks of {self.logprob_chunk_tokens} tokens"
            if self.logprob_chunk_tokens
            else "full logits"
        )
        return (
            f"attention {self.attention}, {chunk}, activation checkpointing "
            f"{'on' if self.activation_checkpointing else 'off'}, "
            f"{'compiled' if self.compiled else 'eager'} layers"
        )


def prepare_model(
    model: nn.Module, section: TrainerSection, device: torch.device | str
) -> ComputePlan:
    """Apply `section`'s attention, checkpointing and compile settings to `model` in place.

    Call after the LoRA layers are in place (compilation must see them).
    """
    device = torch.device(device)
    attention = resolve_attention(section.attention, AttentionRuntime.of_model(model, device))
    use_packed_attention(model, attention)
    chunk = section.logprob_chunk_tokens
    if chunk and chunkable_lm_head(model) is None:
        logger.warning(
            "this model's logits are not a plain linear head; computing full logits instead"
        )
        chunk = 0
    checkpointing = resolve_activation_checkpointing(section.activation_checkpointing, device)
    # Compiled around its checkpoint, a layer's recomputation is part of the compiled
    # backward only while dynamo traces the layer whole. At any graph break in its body (an
    # attention run eagerly by design, `attention.EAGER_UNDER_COMPILE`, or anything dynamo
    # does not trace) dynamo runs the checkpoint eagerly, without the routing that its
    # recomputation needs in autograd's device thread: every compiled, checkpointed update
    # of Qwen3-0.6B with varlen attention failed so on an H100 (torch 2.11). So with
    # checkpointing each layer is compiled inside its checkpoint, which stays eager and
    # routes every recomputation (`_checkpointed`).
    compile_inside = section.compile and (checkpointing or attention in EAGER_UNDER_COMPILE)
    if compile_inside:
        compile_decoder_layers(model, inside_checkpoint=True)
    if checkpointing:
        apply_activation_checkpointing(model)
    if section.compile and not compile_inside:
        compile_decoder_layers(model)
    plan = ComputePlan(attention, chunk, checkpointing, section.compile)
    logger.info("trainer compute: %s", plan.describe())
    return plan


def resolve_activation_checkpointing(setting: bool | str, device: torch.device) -> bool:
    """ "auto" is on for CUDA, where memory bounds the tokens per update, and off on the CPU,
    where RAM is plentiful next to compute and recomputing a layer costs a third more time."""
    if setting == "auto":
        return device.type == "cuda"
    return bool(setting)


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(
            f"{type(model).__name__} has no decoder layer list (model.get_decoder().layers); "
            "activation checkpointing and compile need one"
        )
    return layers


def apply_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each decoder layer's activations in backward instead of keeping them.

    Wraps the layer's forward (not the module), so parameter names and the LoRA modules
    registered with the run manager stay as they are. Non-reentrant checkpointing, which
    needs the recomputation to save the same tensors as the forward: the multi-LoRA layers
    route it as they routed the forward, whichever thread autograd recomputes in (on CUDA
    a device thread of autograd's own, whose routing the training loop never set).
    """
    routing = find_lora_routing(model)
    for layer in decoder_layers(model):
        layer.forward = functools.partial(_checkpointed, layer.forward, routing)


def _checkpointed(forward, routing: LoRARouting | None, *args, **kwargs):
    if routing is None or torch.compiler.is_compiling():
        # Traced whole (a caller compiling the layer around its checkpoint; `prepare_model`
        # compiles inside it), the recomputation is part of the compiled backward graph and
        # reads no routing from Python; dynamo takes no `context_fn` but its own.
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    def contexts():
        # Called by `checkpoint` as the forward starts, in the forward's thread.
        return contextlib.nullcontext(), routing.routed_as(routing.snapshot())

    return checkpoint(forward, *args, use_reentrant=False, context_fn=contexts, **kwargs)


def compile_decoder_layers(model: nn.Module, *, inside_checkpoint: bool = False) -> None:
    """`torch.compile` each decoder layer (per block, as torchtitan does): one compiled graph
    reused by every layer of the same shape; never needed for correctness.

    By default the whole module call, checkpoint included (applied before). With
    `inside_checkpoint`, only the layer's forward as it is now (apply checkpointing after):
    a checkpoint then runs eagerly around the compiled forward, for the attention paths
    that break the layer's graph (`attention.EAGER_UNDER_COMPILE`).
    """
    # The frozen embedding's output does not require grad, every later layer's input does:
    # dynamo guards on it, and compiled each layer twice over. Made to require grad (Hugging
    # Face's `enable_input_require_grads`), every layer takes the same graph; the cost is
    # the first layer's input gradient, computed in backward and dropped (a few of that
    # layer's matmuls, a fraction of a percent of a model's backward).
    model.get_input_embeddings().register_forward_hook(_output_requires_grad)
    for layer in decoder_layers(model):
        # Dynamic from the first row: every row has a length of its own, and a first graph
        # specialised to one was only ever compiled again.
        if inside_checkpoint:
            layer.forward = torch.compile(layer.forward, dynamic=True)
        else:
            layer.compile(dynamic=True)


def _output_requires_grad(module: nn.Module, inputs, output: torch.Tensor) -> None:
    if torch.is_grad_enabled() and not output.requires_grad:
        output.requires_grad_(True)


@dataclass(frozen=True)
class HostRow:
    """A row's position ids and per-token temperatures, kept on the host.

    Handed to `RowLogprobs` in this holder rather than as tensor arguments: an FSDP2 root
    moves its forward's tensor arguments (and those inside tuples, lists and dicts) to the
    GPU, and these are read on the host, which on a GPU would wait for the queued work.
    """

    position_ids: torch.Tensor
    temperatures: torch.Tensor
    # The tokens whose log-prob the loss reads (its loss mask); None: every token.
    needed: torch.Tensor | None = None
    # Each sample's attention computed at its own length, never padded beside longer ones:
    # its results then round as alone (a Tinker pack, `rl/tinker_packing.py`).
    exact_lengths: bool = False


class RowLogprobs(nn.Module):
    """The model as the trainer's step calls it: one packed row in, per-token log-probs out.

    A module rather than only a function so that, with the base sharded (`sharding.py`), it
    is FSDP2's root: the root gathers the weights no decoder layer owns (embeddings, final
    norm, LM head) in its forward hook, and the chunked LM head reads the head's weight
    outside the model's own forward, where no hook of the model would run.
    """

    def __init__(self, model: nn.Module, plan: ComputePlan) -> None:
        super().__init__()
        self.model = model
        self.plan = plan

    def forward(self, input_ids: torch.Tensor, host: HostRow) -> torch.Tensor:
        return packed_row_logprobs(
            self.model,
            self.plan,
            input_ids,
            host.position_ids,
            host.temperatures,
            host.needed,
            exact_lengths=host.exact_lengths,
        )


def packed_row_logprobs(
    model: nn.Module,
    plan: ComputePlan,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    temperatures: torch.Tensor,
    needed: torch.Tensor | None = None,
    *,
    exact_lengths: bool = False,
) -> torch.Tensor:
    """Per-token log-probs [T] (float32) of one packed row; `temperatures` [T] per token.

    Pass `temperatures` on the CPU: they are checked there, so a GPU row costs no host sync.
    With the LM head in chunks and `needed` given (host bool [T], the loss mask), only the
    needed tokens' log-probs are sure to be computed (see `chunked_token_logprobs`).

    Every sample attends only to itself, so each gets the log-probs it would get alone.
    The caller routes the row's tokens to their adapters first (`set_lora_num_tokens`).
    """
    packed = PackedSequences.from_position_ids(
        position_ids, input_ids.device, bucket_min_fill=1.0 if exact_lengths else BUCKET_MIN_FILL
    )
    packed.build_for(plan.attention)
    inputs = {
        "input_ids": input_ids[None],
        "position_ids": to_device(position_ids, input_ids.device)[None],
        "use_cache": False,
        "packed_sequences": packed,
    }
    if plan.logprob_chunk_tokens:
        hidden = model.get_decoder()(**inputs).last_hidden_state[0]
        return chunked_token_logprobs(
            hidden,
            model.get_output_embeddings(),
            input_ids,
            temperatures,
            plan.logprob_chunk_tokens,
            needed,
        )
    logits = model(**inputs).logits[0]
    if bool((temperatures != 1).any()):
        logits = logits / temperatures.to(device=logits.device, dtype=logits.dtype)[:, None]
    return compute_logprobs(logits, input_ids)
