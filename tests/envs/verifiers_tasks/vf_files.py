"""A verifiers (v1) taskset for the tests whose episodes use their runtime: each task's
setup runs a program in the episode's folder that writes two files there, and its reward
reads them back (1 when both are as written). Imported by the verifiers venv's python only.
"""

import verifiers.v1 as vf


class FileData(vf.TaskData):
    answer: str


class FileTask(vf.Task[FileData]):
    async def setup(self, trace, runtime):
        result = await runtime.run(["sh", "-c", "pwd > where; echo written > note"], {})
        assert result.exit_code == 0, result.stderr

    @vf.reward(weight=1.0)
    async def note(self, trace: vf.Trace, runtime) -> float:
        text = (await runtime.read("note")).decode().strip()
        where = (await runtime.read("where")).decode().strip()
        return float(text == "written" and "runtimes/subprocess" in where)


class FilesConfig(vf.TasksetConfig):
    num_tasks: int = 6


class FilesTaskset(vf.Taskset[FileTask, FilesConfig]):
    def load(self):
        for i in range(self.config.num_tasks):
            text = f"abc{i}"
            yield FileTask(FileData(prompt=text, answer=text[::-1]), self.config.task)


__all__ = ["FilesTaskset"]
