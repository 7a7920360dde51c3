"""A multi-turn verifiers (v1) taskset for the tests: reverse a text, then a second one the
environment sends after the model's first reply. Imported by the verifiers venv's python
only (env_args.path names this folder).

The environment (`ReverseTwiceEnv`, exported beside the taskset, so verifiers pairs them)
plays the user: it opens with the task's prompt, and once the model has answered, sends the
second text as a user turn of the same conversation. Each reply is scored by its similarity
to its text's reversal; the reward is their mean, in [0, 1]. Texts are 3 to 6 letters (the
built-in tiny model reverses these well).
"""

import difflib
import random

import verifiers.v1 as vf


class TwiceData(vf.TaskData):
    answer: str
    second: str


class TwiceTask(vf.Task[TwiceData]):
    @vf.reward(weight=1.0)
    async def both_reversed(self, trace: vf.Trace) -> float:
        replies = [(m.content or "").strip() for m in trace.assistant_messages]
        wanted = [self.data.answer, self.data.second[::-1]]
        scores = [
            difflib.SequenceMatcher(None, reply, answer).ratio()
            for reply, answer in zip(replies, wanted, strict=False)
        ]
        return sum(scores) / len(wanted)


class TwiceConfig(vf.TasksetConfig):
    num_tasks: int = 40


class TwiceTaskset(vf.Taskset[TwiceTask, TwiceConfig]):
    def load(self):
        rng = random.Random(0)
        for _ in range(self.config.num_tasks):
            first, second = (
                "".join(rng.choice("abcdefghij") for _ in range(rng.randint(3, 6)))
                for _ in range(2)
            )
            data = TwiceData(prompt=first, answer=first[::-1], second=second)
            yield TwiceTask(data, self.config.task)


class TwiceEnvConfig(vf.EnvConfig):
    agent: vf.AgentConfig = vf.AgentConfig()


class ReverseTwiceEnv(vf.Env[TwiceEnvConfig]):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as chat:
            first = await chat.turn()  # the task's prompt opens the conversation
            if not first.terminated:
                await chat.turn(task.data.second)


__all__ = ["ReverseTwiceEnv", "TwiceTaskset"]
