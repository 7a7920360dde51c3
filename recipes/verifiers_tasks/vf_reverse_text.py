"""`verifiers:vf_reverse_text`: the built-in `reverse_text` task written as a verifiers (v1)
taskset, for recipes/verifiers_reverse_text.toml and `workbench bench eval`'s side-by-side.

Imported by the verifiers venv's python only (the recipe's env_args.path names this
folder). The user message is the text itself (the built-in tiny model is trained without a
system prompt); the reward is the similarity ratio of the reply to the exact reversal, in
[0, 1], as `reverse_text` scores it. `seed` picks the texts, so an eval taskset with another
seed holds out different ones.
"""

import difflib
import random
import string

import verifiers.v1 as vf


class ReverseData(vf.TaskData):
    answer: str


class ReverseTask(vf.Task[ReverseData]):
    @vf.reward(weight=1.0)
    async def similarity(self, trace: vf.Trace) -> float:
        reply = trace.last_reply.strip()
        return difflib.SequenceMatcher(None, reply, self.data.answer).ratio()


class ReverseTextConfig(vf.TasksetConfig):
    num_tasks: int = 1000
    min_length: int = 8
    max_length: int = 14
    seed: int = 0


class ReverseTextTaskset(vf.Taskset[ReverseTask, ReverseTextConfig]):
    def load(self):
        rng = random.Random(self.config.seed)
        for _ in range(self.config.num_tasks):
            length = rng.randint(self.config.min_length, self.config.max_length)
            text = "".join(rng.choice(string.ascii_lowercase) for _ in range(length))
            yield ReverseTask(ReverseData(prompt=text, answer=text[::-1]), self.config.task)


__all__ = ["ReverseTextTaskset"]
