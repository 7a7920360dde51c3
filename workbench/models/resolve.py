"""Turning a recipe's `[model] base` into something `from_pretrained` and vLLM can load.

`builtin:NAME` is a model this project makes itself (no hub needed): written into the cache on
first use (its shipped weights copied, or built from a seed), then reused. Anything else (a
local directory, a hub id) passes through unchanged.
`base_model_problem`, `prompt_tokenizer`, `linear_layer_names` and `model_shapes` answer,
without building or downloading anything, whether a base can be loaded here, how vLLM will
tokenize its prompts, which layers LoRA can adapt and how large they are.

Cache: `$WORKBENCH_CACHE_DIR/models/` if that variable is set, else the platform's user cache
(`~/.cache/workbench/models/` on Linux). A built model lives in `NAME-<hash>/`, the hash
covering everything that determines its weights, so a changed recipe for the model gets a new
directory instead of a stale one. A build is staged under a temporary name and renamed into
place whole (a killed build leaves no half-written model; its leftovers are removed by the
next build), and a file lock makes a second process wait for the first one's build instead
of building too.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from filelock import FileLock, Timeout
from rich.console import Console

from workbench.files import layout
from workbench.models import hub
from workbench.models.builtin import (
    BuiltinModel,
    ModelResolutionError,
    StepCallback,
    ignore_steps,
)
from workbench.system.cache import cache_dir

BUILTIN_PREFIX = "builtin:"
BUILD_LOCK_TIMEOUT_S = 30 * 60


def _builders() -> ModuleType:
    """The builtin models' builders, imported when a builtin model is asked for and never to
    resolve a local path: they train with the SFT trainer (torch, transformers).

    The one import of `models/` from `trainer/`, an arrow back up: a builtin model is made
    by training, and training lives in the trainer; the trainer in turn loads models by the
    path this module resolves, without importing it."""
    from workbench.trainer.sft import tiny_reverse

    return tiny_reverse


# name -> the builders' attribute holding its `BuiltinModel`.
_BUILTINS = {"tiny-reverse": "TINY_REVERSE", "tiny-reverse-chat": "TINY_REVERSE_CHAT"}
# The builders' source, read (importing it takes torch) to key the cache of layer names.
_BUILDERS_SOURCE = Path(__file__).resolve().parents[1] / "trainer" / "sft" / "tiny_reverse.py"


def _char_tokenizer() -> Any:
    """The builtins' tokenizer, the one their build writes; apart from the builders so that
    knowing a prompt's length imports no builder (torch, training code)."""
    from workbench.models.char_tokenizer import build_char_tokenizer

    return build_char_tokenizer()


_BUILTIN_TOKENIZERS: dict[str, Callable[[], Any]] = {
    "tiny-reverse": _char_tokenizer,
    "tiny-reverse-chat": _char_tokenizer,
}


def models_cache_dir() -> Path:
    return cache_dir() / "models"


def builtin_names() -> list[str]:
    return sorted(_BUILTINS)


def is_builtin(base: str) -> bool:
    return base.startswith(BUILTIN_PREFIX)


def get_builtin(name: str) -> BuiltinModel:
    if name not in _BUILTINS:
        raise ModelResolutionError(_unknown_builtin(name))
    return getattr(_builders(), _BUILTINS[name])


def _unknown_builtin(name: str) -> str:
    known = ", ".join(BUILTIN_PREFIX + n for n in builtin_names())
    return f"unknown builtin model {BUILTIN_PREFIX + name!r}; available: {known}"


def base_model_problem(base: str) -> str | None:
    """None if `[model] base` can be loaded on this machine, else why not: an unknown
    builtin, a missing or non-model directory, a hub id neither cached nor downloadable.
    Builds nothing and downloads nothing."""
    if is_builtin(base):
        name = base.removeprefix(BUILTIN_PREFIX)
        return None if name in _BUILTINS else _unknown_builtin(name)
    local = Path(base).expanduser()
    if local.exists() or not hub.looks_like_hub_id(base):
        return local_model_problem(local)
    return hub.hub_model_problem(base)


def local_model_problem(path: Path) -> str | None:
    """None if `path` is a model directory (it has config.json), else what is wrong."""
    if not path.exists():
        return (
            f"{path} does not exist; point [model] base at a Hugging Face model directory, "
            "a hub id or builtin:tiny-reverse"
        )
    if not (path / "config.json").is_file():
        return (
            f"{path} is not a model directory (no config.json); point [model] base at a "
            "Hugging Face model directory or use builtin:tiny-reverse"
        )
    return None


@functools.cache
def prompt_tokenizer(base: str) -> Any | None:
    """The tokenizer vLLM renders `base`'s chat prompts with, from local files only: a
    builtin's (never built for this), a model directory's, a cached hub model's; None for a
    hub model that is not cached. Loading errors propagate."""
    if is_builtin(base):
        return _BUILTIN_TOKENIZERS[base.removeprefix(BUILTIN_PREFIX)]()
    from transformers import AutoTokenizer

    local = Path(base).expanduser()
    if local.is_dir():
        return AutoTokenizer.from_pretrained(local)
    if not hub.is_cached(base):
        return None
    return AutoTokenizer.from_pretrained(base, local_files_only=True)


@dataclass(frozen=True)
class ModelShapes:
    """What the base model's config says about its size, for sizing adapter slots:
    `linears` maps each linear layer name (the last part of its module path, as
    `[trainer] target_modules` names them) to the sum of in + out features over every layer
    of that name (a rank-r LoRA on them has r x that many parameters); `parameters` counts
    the whole model's."""

    linears: dict[str, int]
    parameters: int

    def adapter_parameters(self, rank: int, targets: list[str] | None = None) -> int:
        """A rank-`rank` LoRA adapter's parameters on `targets` (None: every linear layer
        but the LM head)."""
        names = targets if targets is not None else [n for n in self.linears if n != "lm_head"]
        return rank * sum(self.linears.get(name, 0) for name in names)


def linear_layer_names(base: str) -> list[str] | None:
    """The names of the base model's linear layers, by the last part of their module path (as
    `[trainer] target_modules` names them), from its config alone: the model is made on the
    meta device, so no weights are read or allocated. From local files only, as
    `prompt_tokenizer`; None for a hub model that is not cached. Raises RuntimeError when
    the look fails (`model_shapes`)."""
    shapes = model_shapes(base)
    return None if shapes is None else sorted(shapes.linears)


@functools.cache
def model_shapes(base: str) -> ModelShapes | None:
    """The base model's linear layer sizes and parameter count, from its config alone (see
    `linear_layer_names`); None for a hub model that is not cached. Asked once a process."""
    return _looked_up_shapes(base)


# The most a look at the base model's layers may take: torch and transformers are imported,
# the model made on the meta device (about 3 s on an idle 2-core machine, 30 s under load).
LAYERS_TIMEOUT_S = 120.0


def _looked_up_shapes(base: str) -> ModelShapes | None:
    """Done in a child process, given at most `LAYERS_TIMEOUT_S`: torch and transformers take
    some 400 MB that `workbench up`, which goes on following the experiment, should not keep.
    That child takes some 5 s of every `workbench up` on a 2-core machine, so the answer is
    kept in the cache (`linear_layers_cache_path`) for a builtin or a model directory, under
    the digest of what decides it. Raises RuntimeError when the child fails or runs out of
    time."""
    cached = linear_layers_cache_path(base)
    if cached is not None:
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            return _shapes_from_json(json.loads(cached.read_text()))
    root = str(Path(__file__).resolve().parents[2])  # this checkout's workbench, in the child
    path = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    try:
        result = subprocess.run(
            [sys.executable, "-m", "workbench.models.resolve", "linear-layers", base],
            capture_output=True,
            text=True,
            timeout=LAYERS_TIMEOUT_S,
            env={**os.environ, "PYTHONPATH": path},
        )
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"no answer in {LAYERS_TIMEOUT_S:g} s") from None
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        raise RuntimeError(lines[-1] if lines else f"exit status {result.returncode}")
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    if answer is None:
        return None
    if cached is not None:
        with contextlib.suppress(OSError):  # a cache that cannot be written costs time only
            cached.parent.mkdir(parents=True, exist_ok=True)
            layout.atomic_write_text(cached, json.dumps(answer))
    return _shapes_from_json(answer)


def _shapes_from_json(answer: dict[str, Any]) -> ModelShapes:
    linears = {str(name): int(size) for name, size in answer["linears"].items()}
    return ModelShapes(linears=linears, parameters=int(answer["parameters"]))


def linear_layers_cache_path(base: str) -> Path | None:
    """Where the look at `base`'s layers keeps its answer: named by the digest of what decides
    it, the model's config (a directory's config.json; for a builtin, the source of the
    module that makes its config, read rather than imported: importing it takes torch) and
    the installed transformers, which makes the model from it. None for a hub id (its files
    may change in the hub's cache) or a directory without a readable config.json."""
    try:
        if is_builtin(base):
            _BUILTINS[base.removeprefix(BUILTIN_PREFIX)]  # KeyError: not a builtin
            what = base.encode() + b"\0" + _BUILDERS_SOURCE.read_bytes()
        else:
            what = (Path(base).expanduser() / "config.json").read_bytes()
    except (KeyError, AttributeError, TypeError, OSError):
        return None
    digest = hashlib.sha256(what + b"\0" + importlib.metadata.version("transformers").encode())
    return cache_dir() / "model-shapes" / f"{digest.hexdigest()[:32]}.json"


def _model_shapes_here(base: str) -> dict[str, Any] | None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if is_builtin(base):
        builtin = get_builtin(base.removeprefix(BUILTIN_PREFIX))
        config = builtin.model_config(builtin.default_spec())
    elif (local := Path(base).expanduser()).is_dir():
        config = AutoConfig.from_pretrained(local)
    elif hub.is_cached(base):
        config = AutoConfig.from_pretrained(base, local_files_only=True)
    else:
        return None
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    linears: dict[str, int] = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            short = name.rsplit(".", 1)[-1]
            linears[short] = linears.get(short, 0) + module.in_features + module.out_features
    parameters = sum(param.numel() for param in model.parameters())
    return {"linears": dict(sorted(linears.items())), "parameters": parameters}


def builtin_model_dir(base: str, spec: Any = None) -> Path:
    """Where `builtin:NAME` is (or will be) cached, without building it."""
    builtin = get_builtin(base.removeprefix(BUILTIN_PREFIX))
    spec = spec if spec is not None else builtin.default_spec()
    return models_cache_dir() / f"{builtin.name}-{builtin.version_hash(spec)}"


def loadable_base(base: str) -> str:
    """What a file read outside workbench should name as the base model, so that
    `from_pretrained` and vLLM load it as they are: a builtin's cache directory (not built
    here), a local directory as an absolute path, a hub id unchanged."""
    if is_builtin(base):
        return str(builtin_model_dir(base))
    local = Path(base).expanduser()
    return str(local.resolve()) if local.is_dir() else base


def resolve_model(
    base: str,
    *,
    spec: Any = None,
    show_progress: bool = True,
    console: Console | None = None,
    on_step: StepCallback = ignore_steps,
) -> Path:
    """The directory (or hub id, as a Path) to load `base` from.

    `builtin:NAME` is written into the cache on first use (shipped weights copied in a moment,
    or built in seconds to minutes with a progress bar) and then reused; `spec` replaces the
    builtin's default spec (tests build a smaller model). A local path or a hub id is returned
    unchanged. `on_step` hears of each step of a build, and of
    waiting for another process's build (step 0 of 0).
    """
    if not is_builtin(base):
        return Path(base).expanduser()
    builtin = get_builtin(base.removeprefix(BUILTIN_PREFIX))
    spec = spec if spec is not None else builtin.default_spec()
    final = models_cache_dir() / f"{builtin.name}-{builtin.version_hash(spec)}"
    if layout.is_stable(final):
        return final
    console = console or Console(stderr=True)
    final.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(final.parent / f".{final.name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        console.print(
            f"waiting for another process to finish building {base} into {final}",
            highlight=False,
            soft_wrap=True,
        )
        on_step(0, 0, "waiting for another process's build")
        try:
            lock.acquire(timeout=BUILD_LOCK_TIMEOUT_S)
        except Timeout:
            raise ModelResolutionError(
                f"gave up after {BUILD_LOCK_TIMEOUT_S} s waiting for another process's build "
                f"of {base} (it holds {lock.lock_file}); stop that process or let it finish"
            ) from None
    try:
        if layout.is_stable(final):  # built by the process we waited for
            return final
        _remove_leftovers(final)
        console.print(
            f"{builtin.describe_build(spec)} into {final}",
            highlight=False,
            soft_wrap=True,
        )
        started = time.perf_counter()
        with layout.staged_directory(final) as staging:
            builtin.build(
                staging, spec, show_progress=show_progress, console=console, on_step=on_step
            )
        console.print(f"built {base} in {time.perf_counter() - started:.0f} s", highlight=False)
        return final
    finally:
        lock.release()


def _remove_leftovers(final: Path) -> None:
    """Staging directories of builds that were killed; only called while holding the lock."""
    for leftover in final.parent.glob(f".{final.name}.*"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
    if final.exists() and not layout.is_stable(final):
        shutil.rmtree(final, ignore_errors=True)


if __name__ == "__main__":  # `linear-layers BASE`: what `model_shapes` asks a child
    if sys.argv[1:2] == ["linear-layers"] and len(sys.argv) == 3:
        print(json.dumps(_model_shapes_here(sys.argv[2])))
    else:
        sys.exit(f"usage: python -m {__spec__.name} linear-layers BASE")
