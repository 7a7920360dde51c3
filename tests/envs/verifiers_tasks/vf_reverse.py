"""A verifiers (v1) taskset for the tests: reverse a lowercase text, as the built-in tiny
model does. Imported by the verifiers venv's python only (env_args.path names this folder).

`split = "train"` and `split = "test"` draw their texts from different seeds and lengths,
so a test can tell which split a prompt came from (test texts are 7 or 8 letters long,
train texts 3 to 6).
"""

import difflib
import random

import verifiers.v1 as vf


class ReverseData(vf.TaskData):
    answer: str


class ReverseTask(vf.Task[ReverseData]):
    @vf.reward(weight=1.0)
    async def similarity(self, trace: vf.Trace) -> float:
        return difflib.SequenceMatcher(None, trace.last_reply, self.data.answer).ratio()

    @vf.reward(weight=0.5)
    async def exact(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)


class ReverseConfig(vf.TasksetConfig):
    num_tasks: int = 40
    split: str = "train"


class ReverseTaskset(vf.Taskset[ReverseTask, ReverseConfig]):
    def load(self):
        test = self.config.split == "test"
        rng = random.Random(1000 if test else 0)
        for _ in range(self.config.num_tasks):
            length = rng.randint(7, 8) if test else rng.randint(3, 6)
            text = "".join(rng.choice("abcdefghij") for _ in range(length))
            yield ReverseTask(ReverseData(prompt=text, answer=text[::-1]), self.config.task)


__all__ = ["ReverseTaskset"]
