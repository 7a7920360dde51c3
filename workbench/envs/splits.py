"""Which split a task belongs to: a fixed part of every environment's task space is held out.

A task is held out for evaluation when a hash of its key (by default its question, what the
model is shown) falls in one of `HELD_OUT_BUCKETS` buckets. The "eval" stream draws only
held-out tasks and the "train" stream never does, so the two are disjoint by construction:
an eval prompt can never turn up in training, for any seed, however long a run trains. Two
independently seeded streams would not promise that: over a small task space (short texts,
short words) they meet within a few thousand prompts.

The hash is blake2b, not `hash()`, so membership is the same in every process and Python run.
"""

from __future__ import annotations

import hashlib

TRAIN = "train"
EVAL = "eval"
SPLITS = (TRAIN, EVAL)
# One task in 16 is held out: the training stream loses little of the task space, and an
# eval prompt costs about 16 cheap draws.
HELD_OUT_BUCKETS = 16
# Draws of one prompt before concluding that its split of the task space is empty.
MAX_DRAWS = 10_000


def is_held_out(task_key: str) -> bool:
    digest = hashlib.blake2b(task_key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % HELD_OUT_BUCKETS == 0


def split_of(task_key: str) -> str:
    """The only split whose stream may contain the task with this key."""
    return EVAL if is_held_out(task_key) else TRAIN


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; the splits are {', '.join(SPLITS)}")
