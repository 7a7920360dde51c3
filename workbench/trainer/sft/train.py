"""Supervised fine-tuning of one model on (prompt, completion) chat pairs: `workbench sft`.

Full fine-tuning, or LoRA through peft. The data is an environment's prompt stream (its
reference answers are the completions) or a JSONL file. The loss is the mean cross-entropy
over completion tokens only: the prompt (system, user, the assistant marker) is context, not
a target. AdamW, optional linear warm-up then a constant or cosine learning rate, gradient
clipping. The result is saved in Hugging Face format (a full model, or a peft adapter for
LoRA) and written atomically: a killed run leaves no half-written output directory.

The built-in tiny model's warm-up (`workbench.trainer.sft.tiny_reverse`) runs through this same
`train_sft`, so what `workbench sft` does is what the default model went through.

Read top to bottom: config, data, encoding, the loop (`train_sft`), greedy evaluation, saving.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, model_validator
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from workbench.config import LORA_TARGET_MODULES, LoraConfig, StrictModel
from workbench.envs import Environment, Prompt, get_environment
from workbench.envs.verifiers_env import PREFIX as VERIFIERS_PREFIX
from workbench.files import layout
from workbench.trainer.row_threads import torch_threads

Message = dict[str, str]
IGNORE_INDEX = -100
DEFAULT_LORA_TARGETS = LORA_TARGET_MODULES
SUMMARY_FILE = "sft_summary.json"
# Files that make up a tokenizer; copied as they are so the output keeps the source's exact
# tokenizer (format and chat template), rather than whatever this transformers would write.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)


# ------------------------------------------------------------------------- config


class SFTLoraConfig(LoraConfig):
    target_modules: list[str] = Field(
        default_factory=lambda: list(DEFAULT_LORA_TARGETS),
        description="names of the linear layers that get an adapter",
    )
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter's input")


class SFTConfig(StrictModel):
    """Everything one `workbench sft` run needs. Exactly one of `env` and `data`."""

    model: str = Field(description="builtin:tiny-reverse, a local model directory or a hub id")
    output_dir: Path = Field(description="where the model (or LoRA adapter) is saved")
    env: str | None = Field(None, description="train on this environment's prompts")
    env_args: dict[str, Any] = Field(
        default_factory=dict, description="the environment's arguments, as a run's `env_args`"
    )
    data: Path | None = Field(None, description="JSONL: {prompt, completion} or {messages}")
    steps: int = Field(200, ge=1, description="optimizer steps")
    batch_size: int = Field(64, ge=1, description="examples per step")
    lr: float = Field(1e-3, gt=0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    warmup_steps: int = Field(0, ge=0, description="linear warm-up from 0 to lr")
    schedule: Literal["constant", "cosine"] = Field(
        "constant", description="after warm-up: stay at lr, or decay to min_lr_ratio * lr"
    )
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="cosine floor, as a fraction of lr")
    max_grad_norm: float = Field(1.0, gt=0, description="gradients are clipped to this norm")
    max_length: int = Field(512, ge=8, description="longer examples are an error")
    seed: int = Field(0, description="seeds the data order and initialisation")
    lora: SFTLoraConfig | None = Field(None, description="None: full fine-tuning")
    eval_prompts: int = Field(0, ge=0, description="greedy reward on this many held-out prompts")
    eval_every: int = Field(0, ge=0, description="also evaluate every N steps (0: only at end)")
    eval_max_new_tokens: int = Field(64, ge=1, description="greedy completion length in evals")
    log_every: int = Field(10, ge=1, description="one progress line every N steps")
    threads: int | None = Field(
        None,
        ge=1,
        description="torch intra-op threads (None: torch's default). A model this small "
        "trains fastest on 1: more threads spend their time synchronising, and far more so "
        "when other processes compete for the cores.",
    )

    @model_validator(mode="after")
    def _one_data_source(self) -> SFTConfig:
        if (self.env is None) == (self.data is None):
            raise ValueError("give exactly one data source: an environment (env) or a JSONL file")
        if self.eval_prompts and self.env is None:
            raise ValueError("eval_prompts needs an environment to score completions (env)")
        if self.env is not None and self.env.startswith(VERIFIERS_PREFIX):
            raise ValueError(
                f"{self.env}: a verifiers environment scores whole episodes in its own process "
                "and has no reference answers to learn; export its tasks to a JSONL file "
                "(data) instead"
            )
        return self


# ------------------------------------------------------------------------- data


@dataclass(frozen=True)
class SFTExample:
    """A chat prompt and the assistant completion to learn."""

    messages: list[Message]
    completion: str


def environment_examples(env: Environment, seed: int) -> Iterator[SFTExample]:
    """The environment's training stream, its reference answers as completions."""
    for prompt in env.dataset(seed=seed, split="train").iter_from(0):
        yield SFTExample(prompt.messages, prompt.answer)


def read_jsonl_examples(path: Path) -> list[SFTExample]:
    """Lines of `{"prompt": str | messages, "completion": str}` or `{"messages": [...]}` whose
    last message is the assistant's; blank lines are skipped."""
    examples = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise ValueError(f"{path}: cannot read SFT data ({err})") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            examples.append(_example_from_json(json.loads(line)))
        except (json.JSONDecodeError, ValueError, TypeError, KeyError) as err:
            raise ValueError(
                f"{path}, line {number}: {err}; expected "
                '{"prompt": "...", "completion": "..."} or {"messages": [..., '
                '{"role": "assistant", "content": "..."}]}'
            ) from None
    if not examples:
        raise ValueError(f"{path}: no examples")
    return examples


def _example_from_json(record: dict[str, Any]) -> SFTExample:
    if "messages" in record:
        messages = list(record["messages"])
        if not messages or messages[-1].get("role") != "assistant":
            raise ValueError("the last message must be the assistant's")
        return SFTExample([dict(m) for m in messages[:-1]], str(messages[-1]["content"]))
    prompt = record["prompt"]
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    return SFTExample([dict(m) for m in prompt], str(record["completion"]))


def cycle_shuffled(examples: list[SFTExample], seed: int) -> Iterator[SFTExample]:
    """Endless epochs over `examples`, each in a new seeded order."""
    rng = random.Random(seed)
    while True:
        order = list(range(len(examples)))
        rng.shuffle(order)
        for i in order:
            yield examples[i]


# ------------------------------------------------------------------------- encoding


@dataclass(frozen=True)
class EncodedExample:
    input_ids: list[int]
    prompt_length: int
    """Tokens before the completion: these get no loss."""


def encode_example(
    tokenizer: PreTrainedTokenizerBase, example: SFTExample, max_length: int
) -> EncodedExample:
    """Token ids of the whole conversation, and where the completion starts.

    The full conversation is rendered by the chat template, so whatever the template writes
    after the assistant's content (an end-of-turn token, a newline) is learnt too. If the
    rendered prompt is not a prefix of the rendered conversation (templates that rewrite
    earlier turns), fall back to prompt + completion + eos.
    """
    prompt_text = tokenizer.apply_chat_template(
        example.messages, add_generation_prompt=True, tokenize=False
    )
    full_text = tokenizer.apply_chat_template(
        [*example.messages, {"role": "assistant", "content": example.completion}],
        tokenize=False,
    )
    prompt_ids = tokenizer.encode(prompt_text, add_special_tokens=False)
    full_ids = tokenizer.encode(full_text, add_special_tokens=False)
    if full_ids[: len(prompt_ids)] != prompt_ids or len(full_ids) == len(prompt_ids):
        completion_ids = tokenizer.encode(example.completion, add_special_tokens=False)
        full_ids = prompt_ids + completion_ids + [tokenizer.eos_token_id]
    if len(full_ids) > max_length:
        raise ValueError(
            f"an example has {len(full_ids)} tokens, more than max_length={max_length}; "
            "raise max_length or shorten the data"
        )
    return EncodedExample(full_ids, len(prompt_ids))


def collate(batch: list[EncodedExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded `input_ids`, `attention_mask`, and `labels` that are IGNORE_INDEX
    everywhere except on completion tokens."""
    width = max(len(e.input_ids) for e in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE_INDEX, dtype=torch.long)
    for row, example in enumerate(batch):
        ids = torch.tensor(example.input_ids, dtype=torch.long)
        input_ids[row, : len(ids)] = ids
        attention_mask[row, : len(ids)] = 1
        labels[row, example.prompt_length : len(ids)] = ids[example.prompt_length :]
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def completion_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the completion tokens of the batch."""
    shifted_logits = logits[:, :-1].reshape(-1, logits.size(-1)).float()
    shifted_labels = labels[:, 1:].reshape(-1)
    return torch.nn.functional.cross_entropy(
        shifted_logits, shifted_labels, ignore_index=IGNORE_INDEX
    )


# ------------------------------------------------------------------------- the loop


@dataclass
class SFTResult:
    output_dir: Path
    losses: list[float]
    """Loss of every step, in order."""
    eval_rewards: dict[int, float] = field(default_factory=dict)
    """Step -> mean greedy reward on held-out prompts."""
    seconds: float = 0.0
    trainable_params: int = 0
    total_params: int = 0

    @property
    def final_reward(self) -> float | None:
        return self.eval_rewards[max(self.eval_rewards)] if self.eval_rewards else None

    def to_json(self) -> dict[str, Any]:
        return {
            "output_dir": str(self.output_dir),
            "steps": len(self.losses),
            "first_loss": self.losses[0] if self.losses else None,
            "final_loss": self.losses[-1] if self.losses else None,
            "losses": self.losses,
            "eval_rewards": {str(k): v for k, v in self.eval_rewards.items()},
            "seconds": round(self.seconds, 2),
            "trainable_params": self.trainable_params,
            "total_params": self.total_params,
        }


def train_sft(
    config: SFTConfig,
    *,
    show_progress: bool = True,
    console: Console | None = None,
    description: str = "sft",
    on_log: Callable[[dict[str, Any]], None] | None = None,
    atomic: bool = True,
) -> SFTResult:
    """Train as `config` says and save to `config.output_dir`; returns losses and rewards.

    `on_log` receives `{"step", "loss", "lr"}` every `log_every` steps and
    `{"step", "eval_reward"}` after each evaluation. With `atomic=False` the files are written
    straight into `output_dir`, for a caller that is itself building a staged directory.
    """
    _check_output_dir(config.output_dir)
    with torch_threads(config.threads):
        return _train(config, show_progress, console, description, on_log, atomic)


def _train(
    config: SFTConfig,
    show_progress: bool,
    console: Console | None,
    description: str,
    on_log: Callable[[dict[str, Any]], None] | None,
    atomic: bool,
) -> SFTResult:
    started = time.perf_counter()
    torch.manual_seed(config.seed)  # LoRA initialisation; the data has its own seeded streams
    model_path, tokenizer, model = _model_to_train(config)
    env, examples = _training_examples(config)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _lr_multiplier(config))
    result = SFTResult(
        output_dir=config.output_dir,
        losses=[],
        trainable_params=sum(p.numel() for p in trainable),
        total_params=sum(p.numel() for p in model.parameters()),
    )

    def evaluate(step: int) -> None:
        reward = _eval_reward(model, tokenizer, env, config)
        result.eval_rewards[step] = reward
        if on_log:
            on_log({"step": step, "eval_reward": reward})

    with _progress(show_progress, console) as progress:
        task = progress.add_task(description, total=config.steps, loss=float("nan"))
        for step in range(1, config.steps + 1):
            loss = _sft_step(model, tokenizer, examples, optimizer, trainable, config)
            scheduler.step()
            result.losses.append(loss)
            progress.update(task, advance=1, loss=loss)
            if on_log and (step % config.log_every == 0 or step == config.steps):
                on_log({"step": step, "loss": loss, "lr": scheduler.get_last_lr()[0]})
            if config.eval_prompts and config.eval_every and step % config.eval_every == 0:
                evaluate(step)

    if config.eval_prompts and config.steps not in result.eval_rewards:
        evaluate(config.steps)
    result.seconds = time.perf_counter() - started
    _save_output(model, tokenizer, model_path, config, result, atomic)
    return result


def _model_to_train(config: SFTConfig) -> tuple[Path, PreTrainedTokenizerBase, torch.nn.Module]:
    """The base model loaded, wrapped with LoRA if asked, in training mode. `config.model` is
    a local directory: `run_sft` resolves a recipe's kind of name (`builtin:`, a hub id)
    first, and the builtin models' build trains a directory it wrote."""
    model_path = Path(config.model)
    tokenizer, model = load_model(model_path)
    if config.lora is not None:
        model = _wrap_with_lora(model, config.lora)
    model.train()
    return model_path, tokenizer, model


def _training_examples(config: SFTConfig) -> tuple[Environment | None, Iterator[SFTExample]]:
    """The environment (if the data comes from one) and the endless, seeded example stream."""
    env = get_environment(config.env, **config.env_args) if config.env else None
    examples = (
        environment_examples(env, config.seed)
        if env is not None
        else cycle_shuffled(read_jsonl_examples(config.data), config.seed)
    )
    return env, examples


def _sft_step(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    examples: Iterator[SFTExample],
    optimizer: torch.optim.Optimizer,
    trainable: list[torch.nn.Parameter],
    config: SFTConfig,
) -> float:
    """One optimizer step on the next batch of examples; its loss."""
    batch = collate(
        [
            encode_example(tokenizer, next(examples), config.max_length)
            for _ in range(config.batch_size)
        ],
        tokenizer.pad_token_id,
    )
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    loss = completion_loss(logits, batch["labels"])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trainable, config.max_grad_norm)
    optimizer.step()
    return loss.item()


def _eval_reward(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    env: Environment | None,
    config: SFTConfig,
) -> float:
    """Greedy reward on the environment's held-out prompts, the model back in training mode."""
    assert env is not None
    model.eval()
    reward = evaluate_greedy(
        model,
        tokenizer,
        env,
        n=config.eval_prompts,
        seed=config.seed,
        max_new_tokens=config.eval_max_new_tokens,
    ).mean_reward
    model.train()
    return reward


def _save_output(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    model_path: Path,
    config: SFTConfig,
    result: SFTResult,
    atomic: bool,
) -> None:
    with hf_progress_bars_disabled():
        if atomic:
            with layout.staged_directory(config.output_dir) as staging:
                _save(model, tokenizer, model_path, config, result, staging)
        else:
            config.output_dir.mkdir(parents=True, exist_ok=True)
            _save(model, tokenizer, model_path, config, result, config.output_dir)


def load_model(model_path: Path | str) -> tuple[PreTrainedTokenizerBase, torch.nn.Module]:
    """Tokenizer and float32 causal LM from a directory or hub id (a pad token guaranteed)."""
    with hf_progress_bars_disabled():
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, model


@contextlib.contextmanager
def hf_progress_bars_disabled() -> Iterator[None]:
    """Silence transformers' per-file progress bars (loading a 1M-parameter model needs none),
    restoring the previous setting afterwards."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _wrap_with_lora(model: torch.nn.Module, lora: SFTLoraConfig) -> torch.nn.Module:
    # Imported here: peft takes seconds to import and full fine-tuning does not need it.
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    peft_config = PeftLoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, peft_config)


def _lr_multiplier(config: SFTConfig) -> Callable[[int], float]:
    """Linear warm-up to `lr`, then constant or cosine down to `min_lr_ratio * lr`."""

    def multiplier(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        if config.schedule == "constant":
            return 1.0
        decay_steps = max(1, config.steps - config.warmup_steps)
        progress = min(1.0, (step - config.warmup_steps) / decay_steps)
        cosine = 0.5 * (1 + math.cos(math.pi * progress))
        return config.min_lr_ratio + (1 - config.min_lr_ratio) * cosine

    return multiplier


def _progress(show: bool, console: Console | None) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("loss {task.fields[loss]:.4f}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console or Console(stderr=True),
        disable=not show,
        transient=False,
    )


# ------------------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class GreedyEval:
    mean_reward: float
    prompts: list[Prompt]
    completions: list[str]
    rewards: list[float]


@torch.no_grad()
def evaluate_greedy(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    env: Environment,
    *,
    n: int,
    seed: int = 0,
    split: str = "eval",
    max_new_tokens: int = 64,
    batch_size: int = 256,
) -> GreedyEval:
    """Mean reward of greedy completions of `n` held-out prompts (the env's `split` stream).

    Prompts are batched by token length, so no batch needs padding and every completion is
    exactly what generating that prompt alone gives (and what vLLM's greedy decoding gives).
    """
    prompts = env.sample_prompts(n, seed=seed, split=split)
    encoded = [
        tokenizer.apply_chat_template(p.messages, add_generation_prompt=True, tokenize=False)
        for p in prompts
    ]
    token_ids = [tokenizer.encode(text, add_special_tokens=False) for text in encoded]
    by_length: dict[int, list[int]] = {}
    for i, ids in enumerate(token_ids):
        by_length.setdefault(len(ids), []).append(i)

    completions = [""] * n
    for length, members in by_length.items():
        for start in range(0, len(members), batch_size):
            chunk = members[start : start + batch_size]
            input_ids = torch.tensor([token_ids[i] for i in chunk], dtype=torch.long)
            output = model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
            for i, row in zip(chunk, output[:, length:], strict=True):
                completions[i] = tokenizer.decode(row, skip_special_tokens=True)
    rewards = [env.reward(p, c) for p, c in zip(prompts, completions, strict=True)]
    return GreedyEval(sum(rewards) / max(1, n), prompts, completions, rewards)


# ------------------------------------------------------------------------- saving


def _check_output_dir(output_dir: Path) -> None:
    """Refuse to replace a directory that is not a model: it may hold anything."""
    if not output_dir.exists():
        return
    if not output_dir.is_dir():
        raise ValueError(f"{output_dir} exists and is not a directory; choose another output dir")
    is_model = any(
        (output_dir / name).exists()
        for name in ("config.json", "adapter_config.json", SUMMARY_FILE)
    )
    if any(output_dir.iterdir()) and not is_model:
        raise ValueError(
            f"{output_dir} is not empty and holds no model; choose a new output dir "
            "(an existing model directory is replaced)"
        )


def _save(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    source: Path,
    config: SFTConfig,
    result: SFTResult,
    directory: Path,
) -> None:
    """Write the model (or the peft adapter), its tokenizer and a summary into `directory`."""
    model.save_pretrained(directory, safe_serialization=True)
    if config.lora is None:
        _copy_tokenizer(tokenizer, source, directory)
    summary = {"config": config.model_dump(mode="json"), "result": result.to_json()}
    (directory / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")


def _copy_tokenizer(tokenizer: PreTrainedTokenizerBase, source: Path, target: Path) -> None:
    if Path(source).is_dir():
        copied = False
        for name in _TOKENIZER_FILES:
            if (Path(source) / name).is_file():
                shutil.copy2(Path(source) / name, target / name)
                copied = True
        if copied:
            return
    tokenizer.save_pretrained(target)
