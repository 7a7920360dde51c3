"""Resolving a recipe's base model to a loadable path, and the builtin models' weights.

    resolve_model("builtin:tiny-reverse")  # -> ~/.cache/workbench/models/tiny-reverse-<hash>
    resolve_model("/path/to/model")        # -> unchanged

The builders (`workbench.trainer.sft.tiny_reverse`, which trains with the SFT trainer) are
imported only when a builtin model is asked for.

`resolve` turns `[model] base` into a path; `shipped` verifies and copies the weights that
ship in `weights/`; `build_progress` tells how far a build has come; `char_tokenizer` is
the builtin models' tokenizer; `hub` whether a hub id loads here; `adapters` reads a peft
adapter a run starts from (`lora.init_from`); `builtin` is what a builtin model's builder
provides (`BuiltinModel`) and the error a build raises.
"""

from workbench.models.builtin import ModelResolutionError
from workbench.models.resolve import (
    BUILTIN_PREFIX,
    builtin_model_dir,
    builtin_names,
    is_builtin,
    loadable_base,
    models_cache_dir,
    resolve_model,
)
from workbench.system.cache import CACHE_DIR_ENV, cache_dir

__all__ = [
    "BUILTIN_PREFIX",
    "CACHE_DIR_ENV",
    "ModelResolutionError",
    "builtin_model_dir",
    "builtin_names",
    "cache_dir",
    "is_builtin",
    "loadable_base",
    "models_cache_dir",
    "resolve_model",
]
