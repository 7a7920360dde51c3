"""`builtin:tiny-reverse`: a ~0.87M-parameter Llama that half-knows how to reverse text
(and `builtin:tiny-reverse-chat`, the same warmed up on conversations).

Its weights ship with the package (`workbench/models/weights/tiny-reverse/`), so every machine
trains on the same model bit for bit; first use copies them into the cache and checks their
sha256 (`workbench.models.shipped`). They were made by this module's build, which
`workbench model build --from-scratch -o DIR` runs to reproduce them:
1. a Llama config (hidden 128, 4 layers, 4 heads of 32, MLP 384, character vocabulary of 77
   tokens) initialised from a fixed seed, with the character tokenizer and chat template of
   `workbench.models.char_tokenizer`;
2. warmed up with `workbench.trainer.sft.train.train_sft` (full fine-tuning, the same code path as
   `workbench sft`) on `reverse_text` prompts of 3 to 8 letters;
3. measured: greedy reward on held-out prompts of the warm-up lengths and of `reverse_text`'s
   default (RL) lengths, written to `build.json` next to the weights.

The warm-up is short on purpose (150 steps of 128, AdamW 3e-3): the shipped model's greedy
reward on 200 held-out prompts is 0.98 on 3-8 letters but 0.48 on the 8-14 letters RL trains
on by default, so RL has signal (clearly above 0) and room to climb (clearly below 1). A build
from scratch gives other bits on another processor (its kernels round differently), and a
model that learns differently: that is why the weights ship rather than being built on first
use. A spec other than the default (tests build smaller models) is still built from scratch.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console

from workbench.models import char_tokenizer, shipped
from workbench.models.builtin import ModelResolutionError, StepCallback, ignore_steps
from workbench.models.shipped import BUILD_INFO_FILE, read_build_info

# torch, transformers and the training code are imported by the functions that build: a
# model already in the cache is found from its spec's hash alone, and each process that
# resolves it (vLLM's launcher before every start, among them) would otherwise spend 5-11 s
# of a 2-core machine importing them.
if TYPE_CHECKING:
    from transformers import LlamaConfig

# Bump when the build changes in a way `TinyReverseSpec` does not capture (new training code,
# a different initialisation): the cache hash changes and the next use rebuilds.
# 2: reverse_text's training stream no longer holds the prompts held out for evaluation.
# 3: the default spec's weights ship with the package (a cache built on this machine from
#    the same spec holds other bits, so it must not be reused).
BUILD_FORMAT_VERSION = 3
# One intra-op thread: measured on 2 cores, a step of this model takes the same time on 1
# thread as on 2 when the cores are idle and a fifth of the time when other processes load
# them (2 threads spend it synchronising).
BUILD_THREADS = 1
# Warm-up updates between two progress reports: 15 reports for the default 150 updates.
PROGRESS_EVERY = 10


class TinyReverseSpec(BaseModel):
    """Everything that determines the built model's files."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seed: int = 0
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 4
    num_heads: int = 4
    max_position_embeddings: int = 1024
    warmup_steps: int = Field(150, ge=1, description="SFT steps")
    batch_size: int = 128
    lr: float = 3e-3
    # The same builder warms up on another built-in environment (a counting model on
    # letter_count, say); its greedy reward is measured on that environment too.
    warmup_env: str = Field("reverse_text", description="the built-in environment warmed up on")
    warmup_env_args: dict[str, Any] = Field(
        default_factory=lambda: {"min_length": 3, "max_length": 8}
    )
    eval_prompts: int = Field(200, ge=0, description="held-out prompts measured after the build")


class TinyReverse:
    """The `BuiltinModel` behind `builtin:tiny-reverse` and its conversational twin
    `builtin:tiny-reverse-chat`: one build, two default specs, each with shipped weights."""

    def __init__(self, name: str, spec: TinyReverseSpec) -> None:
        self.name = name
        self.shipped_dir = shipped.shipped_dir(name)
        self._default_spec = spec

    def default_spec(self) -> TinyReverseSpec:
        return self._default_spec

    def version_hash(self, spec: TinyReverseSpec) -> str:
        identity: dict[str, Any] = {
            "format": BUILD_FORMAT_VERSION,
            "spec": spec.model_dump(mode="json"),
            "tokens": [*char_tokenizer.SPECIAL_TOKENS, *char_tokenizer.SUPPORTED_CHARACTERS],
            "chat_template": char_tokenizer.CHAT_TEMPLATE,
        }
        # Weights shipped anew (from another machine, say) get a cache directory of their own.
        if self.ships(spec):
            identity["shipped_sha256"] = shipped_build_info(self.shipped_dir)["sha256"]
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8"))
        return digest.hexdigest()[:12]

    def model_config(self, spec: TinyReverseSpec) -> LlamaConfig:
        return llama_config(spec)

    def ships(self, spec: TinyReverseSpec) -> bool:
        """Whether the package holds the weights `spec` builds (the default spec's)."""
        info = shipped_build_info(self.shipped_dir)
        return info is not None and TinyReverseSpec.model_validate(info["spec"]) == spec

    def describe_build(self, spec: TinyReverseSpec) -> str:
        if self.ships(spec):
            return f"copying the shipped weights of builtin:{self.name} (first use)"
        return f"building builtin:{self.name} (first use, about a minute)"

    def build(
        self,
        target: Path,
        spec: TinyReverseSpec,
        *,
        show_progress: bool,
        console: Console,
        on_step: StepCallback = ignore_steps,
    ) -> None:
        if not self.ships(spec):
            self.build_from_scratch(
                target, spec, show_progress=show_progress, console=console, on_step=on_step
            )
            return
        on_step(1, 1, f"copying the shipped weights from {self.shipped_dir}")
        try:
            shipped.copy_verified(self.shipped_dir, target)
        except shipped.ShippedWeightsError as err:
            raise ModelResolutionError(
                f"the shipped weights of builtin:{self.name} are damaged ({err}); "
                "reinstall workbench (pip install -e .) to restore them"
            ) from None

    def build_from_scratch(
        self,
        target: Path,
        spec: TinyReverseSpec,
        *,
        show_progress: bool,
        console: Console,
        on_step: StepCallback = ignore_steps,
    ) -> None:
        """Train the model `spec` describes into `target`: what made the shipped weights,
        on the machine `build.json`'s `made_with` names."""
        # Steps: initial weights, warm-up, then (unless no prompts are asked for) measuring.
        steps = 3 if spec.eval_prompts else 2

        def warmed_up(record: dict[str, Any]) -> None:
            if "loss" in record:
                what = f"warm-up update {record['step']} of {spec.warmup_steps}"
                on_step(2, steps, f"{what} (loss {record['loss']:.3f})")

        # The seeded initial weights go to a scratch directory next to the target (so a killed
        # build's scratch is found and removed by the next one); the warmed-up model goes to
        # `target`, which the caller renames into the cache once this returns.
        from workbench.trainer.sft.train import SFTConfig, train_sft

        scratch = Path(tempfile.mkdtemp(prefix=f"{target.name}.init.", dir=target.parent))
        try:
            on_step(1, steps, f"initial weights from seed {spec.seed}")
            write_initial_model(scratch, spec)
            on_step(2, steps, f"warm-up update 0 of {spec.warmup_steps}")
            result = train_sft(
                SFTConfig(
                    model=str(scratch),
                    output_dir=target,
                    env=spec.warmup_env,
                    env_args=spec.warmup_env_args,
                    steps=spec.warmup_steps,
                    batch_size=spec.batch_size,
                    lr=spec.lr,
                    seed=spec.seed,
                    log_every=min(PROGRESS_EVERY, spec.warmup_steps),
                    threads=BUILD_THREADS,
                ),
                show_progress=show_progress,
                console=console,
                description=f"warming up builtin:{self.name}",
                on_log=warmed_up,
                atomic=False,
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if spec.eval_prompts:
            on_step(3, steps, f"greedy reward on 2 x {spec.eval_prompts} held-out prompts")
        info = {
            "name": self.name,
            "spec": spec.model_dump(mode="json"),
            "params": result.total_params,
            "warmup_seconds": round(result.seconds, 1),
            "warmup_final_loss": result.losses[-1],
            "greedy_reward": measure_rewards(target, spec) if spec.eval_prompts else {},
        }
        (target / BUILD_INFO_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")


def llama_config(spec: TinyReverseSpec) -> LlamaConfig:
    from transformers import LlamaConfig

    special_id = char_tokenizer.SPECIAL_TOKENS.index  # special tokens take the first ids
    return LlamaConfig(
        vocab_size=char_tokenizer.vocab_size(),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=special_id(char_tokenizer.BOS_TOKEN),
        eos_token_id=special_id(char_tokenizer.EOS_TOKEN),
        pad_token_id=special_id(char_tokenizer.PAD_TOKEN),
        dtype="float32",
    )


def write_initial_model(directory: Path, spec: TinyReverseSpec) -> None:
    """The seeded, untrained model with its tokenizer and generation config."""
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    from workbench.trainer.sft.train import hf_progress_bars_disabled

    tokenizer = char_tokenizer.build_char_tokenizer(spec.max_position_embeddings)
    config = llama_config(spec)
    assert tokenizer.bos_token_id == config.bos_token_id
    assert tokenizer.eos_token_id == config.eos_token_id
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )
    with hf_progress_bars_disabled():
        model.save_pretrained(directory, safe_serialization=True)
    char_tokenizer.save_char_tokenizer(tokenizer, directory)


def measure_rewards(model_dir: Path, spec: TinyReverseSpec) -> dict[str, float]:
    """Greedy reward of the warm-up environment on held-out prompts: the warm-up lengths and
    the environment's default (RL) lengths."""
    from workbench.envs import get_environment
    from workbench.trainer.row_threads import torch_threads
    from workbench.trainer.sft.train import evaluate_greedy, load_model

    tokenizer, model = load_model(model_dir)
    model.eval()
    distributions = {
        "warmup": get_environment(spec.warmup_env, **spec.warmup_env_args),
        "rl": get_environment(spec.warmup_env),
    }
    rewards = {}
    with torch_threads(BUILD_THREADS):
        for label, env in distributions.items():
            lengths = f"{env.args.min_length}-{env.args.max_length}"
            result = evaluate_greedy(model, tokenizer, env, n=spec.eval_prompts, seed=spec.seed)
            rewards[f"{label} ({lengths} letters)"] = round(result.mean_reward, 4)
    return rewards


@functools.cache
def shipped_build_info(directory: Path) -> dict[str, Any] | None:
    """The shipped weights' `build.json` (None where the package holds none)."""
    return read_build_info(directory)


TINY_REVERSE = TinyReverse("tiny-reverse", TinyReverseSpec())
# Warmed up with up to two earlier turns, already answered, before the text to reverse: it
# answers in a conversation, which multi-turn episodes (`reverse_chain`) need. Otherwise the
# same model; its greedy reward on one-turn prompts is lower for the same 150 updates.
TINY_REVERSE_CHAT = TinyReverse(
    "tiny-reverse-chat",
    TinyReverseSpec(warmup_env_args={"min_length": 3, "max_length": 8, "max_history": 2}),
)
