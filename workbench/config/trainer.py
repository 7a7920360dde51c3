"""The recipe's `[trainer]` section, and the config the supervisor hands the trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator

from workbench.config.base import LORA_TARGET_MODULES, LoraConfig, ModelSection, StrictModel
from workbench.config.loading import read_toml, validate_model

# An idle trainer sleeps this long at most between looks for runs and batches.
MAX_POLL_INTERVAL_S = 60.0


# The trainer's attention paths that run rows whose samples share prompts (`share_prompts`;
# `workbench.trainer.compute.attention.packed_attention` refuses such rows on the others).
PROMPT_SHARING_ATTENTION = ("per_sample", "dense")


class TrainerSection(StrictModel):
    max_concurrent_runs: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        4,
        description="adapter slots; extra runs wait for a free slot. `auto`: one per run of "
        "the recipe, at most as many as the memory of the trainer's device, vLLM's device "
        "and the host holds (each slot's adapter, gradients and AdamW state, its "
        "orchestrator, vLLM's LoRA buffers); `up --dry-run` prints the arithmetic, and a "
        "number that does not fit is refused before launch",
    )
    lora: LoraConfig = Field(
        default_factory=LoraConfig,
        description="rank and alpha of every adapter slot; a run may ask for a smaller rank",
    )
    target_modules: list[str] = Field(
        default_factory=lambda: list(LORA_TARGET_MODULES),
        min_length=1,
        description="the linear layers that get adapters, by the last part of their name; "
        "each must name linear layers of the base model (the default: those of it that it "
        "names)",
    )
    gpus: list[int] = Field(
        default_factory=list,
        description="CUDA device ids for the trainer's ranks; empty: those inference leaves "
        "(shared when too few); ignored on a machine without GPUs",
    )
    nproc_per_node: int = Field(1, ge=1, description="trainer ranks (data parallel) per node")
    base_sharding: Literal["auto", "sharded", "replicated"] = Field(
        "auto",
        description="how the frozen base lies over the trainer's ranks: `sharded` splits "
        "each decoder layer, the embeddings and the LM head over them with FSDP2 (each rank "
        "holds 1/ranks of the base and gathers a layer as it runs), `replicated` keeps a "
        "whole copy on every rank; `auto`: sharded with more than one rank. Adapters are "
        "replicated either way",
    )
    nnodes: int = Field(
        1,
        ge=1,
        description="machines the trainer's ranks span: the one `workbench up` runs on (node "
        "0) and nnodes - 1 more, each started with `workbench join EXPERIMENT --node-rank K` "
        "and running nproc_per_node ranks; the experiment directory must be on a filesystem "
        "they share, at the same path",
    )
    rendezvous_interface: str | None = Field(
        None,
        min_length=1,
        description="network interface of node 0 (e.g. eth0) whose IPv4 address its "
        "rendezvous store listens on and gloo's and nccl's sockets bind, so other nodes can "
        "join; none: the loopback interface (127.0.0.1) only, where all nodes are this "
        "machine",
    )
    rendezvous_port: int = Field(
        0,
        ge=0,
        le=65535,
        validate_default=True,
        description="port of node 0's rendezvous store; 0 picks a free one, with one node "
        "only: the other nodes must know it",
    )
    seq_len: int = Field(512, ge=16, description="tokens per packed micro-batch row")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32",
        description="the frozen base model's precision; LoRA adapters and their AdamW state "
        "stay float32 whatever it is (as peft keeps them), and the LoRA matmuls run in it",
    )
    poll_interval_s: float = Field(
        0.2,
        gt=0,
        le=MAX_POLL_INTERVAL_S,
        description="how often an idle trainer looks for runs and batches, in seconds; at "
        f"most {MAX_POLL_INTERVAL_S:g}, since a new run or batch waits up to that long",
    )
    attention: Literal["auto", "per_sample", "varlen", "flash", "flex", "dense"] = Field(
        "auto",
        description="how packed rows attend, each sample to its own earlier tokens only: "
        "`per_sample` runs causal attention per sample; on CUDA `auto` takes `varlen` (torch "
        ">= 2.10, bfloat16 or float16), else `flash` (the flash-attn package, bfloat16 or "
        "float16), else `flex` (heads of at least 16), else `per_sample`; elsewhere "
        "`per_sample`. A named path that cannot run here is refused with the reason. `dense` "
        "is the quadratic T x T mask, for comparison only",
    )
    logprob_chunk_tokens: int = Field(
        1024,
        ge=0,
        description="LM head and log-softmax run this many tokens at a time (forward and "
        "backward), each run's temperature applied inside; 0 materialises the full "
        "[tokens, vocabulary] logits",
    )
    activation_checkpointing: bool | Literal["auto"] = Field(
        "auto",
        description="recompute decoder layers in backward instead of keeping their "
        "activations; `auto`: on CUDA, where memory bounds an update, off on the CPU",
    )
    share_prompts: bool | Literal["auto"] = Field(
        "auto",
        description="pack the completions of one prompt behind one copy of it: each after the "
        "first attends to the first's prompt tokens instead of repeating them (all but the "
        "last, which predicts its first token), so the prompt goes through the model once "
        "per group. The same log-probs and gradients, to float rounding. Needs attention "
        "`per_sample` or `dense`; `auto`: on where the attention path resolves to one of "
        "those (the CPU's), else off",
    )
    compile: bool = Field(
        False,
        description="torch.compile each decoder layer (optional, never needed; with "
        "activation checkpointing each layer is compiled inside its checkpoint)",
    )
    row_threads: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        "auto",
        description="on the CPU, how many packed rows of an update compute at once, each on "
        "a thread of its own (a small model's products split badly over threads; rows do "
        "not); `auto`: as many as the trainer has torch threads. Gradients are the same, "
        "bit for bit, as one row after another; each row in flight holds its activations. "
        "One row at a time on a GPU, with compiled layers and with the base sharded",
    )

    @field_validator("rendezvous_port")
    @classmethod
    def _several_nodes_meet_at_a_fixed_port(cls, port: int, info: ValidationInfo) -> int:
        nnodes = info.data.get("nnodes", 1)
        if port == 0 and nnodes > 1:
            raise ValueError(
                f"nnodes = {nnodes} needs a fixed port that the other nodes can reach (0 picks "
                "one at random); set it, e.g. 29400"
            )
        return port

    @field_validator("share_prompts")
    @classmethod
    def _shared_prompts_need_an_attention_that_runs_them(
        cls, share: bool | str, info: ValidationInfo
    ) -> bool | str:
        attention = info.data.get("attention", "auto")
        if share is True and attention not in ("auto", *PROMPT_SHARING_ATTENTION):
            raise ValueError(
                f"share_prompts = true needs attention {' or '.join(PROMPT_SHARING_ATTENTION)}, "
                f'not {attention!r}; set share_prompts = "auto" or false'
            )
        return share

    def shares_prompts(self, attention: str) -> bool:
        """Whether rows share prompts once `attention` is resolved (`auto` -> a path)."""
        if self.share_prompts == "auto":
            return attention in PROMPT_SHARING_ATTENTION
        if self.share_prompts and attention not in PROMPT_SHARING_ATTENTION:
            raise ValueError(
                "trainer.share_prompts = true needs attention "
                f"{' or '.join(PROMPT_SHARING_ATTENTION)}, and "
                f'attention = "auto" resolved to {attention!r} here; set share_prompts = '
                '"auto" or false, or name the attention'
            )
        return bool(self.share_prompts)

    def shards_base(self, ranks: int) -> bool:
        """Whether `ranks` trainer ranks shard the base (`auto`: with more than one)."""
        if self.base_sharding == "auto":
            return ranks > 1
        return self.base_sharding == "sharded"


class TrainerConfig(StrictModel):
    """What `torchrun -m workbench.trainer.rl.trainer --config` reads (written by the supervisor)."""

    output_dir: Path = Field(description="the experiment directory, where the runs are")
    model: ModelSection = Field(description="the base model")
    trainer: TrainerSection = Field(
        default_factory=TrainerSection, description="the recipe's [trainer]"
    )


def load_trainer_config(path: Path) -> TrainerConfig:
    document, text = read_toml(path)
    return validate_model(TrainerConfig, document.unwrap(), path, text)
