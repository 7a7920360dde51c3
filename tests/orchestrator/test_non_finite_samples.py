"""A policy whose numbers overflow: vLLM samples but cannot send its answer (a log-prob that
is inf or nan, which JSON cannot carry; seen with lr 3e-2 on the built-in model, the
e2e alerts test's run_hot). The same seeds fail the same way again, so the orchestrator
evicts its run as diverged, once, instead of crashing into its restart budget. A real
orchestrator process against the scripted stand-in of vLLM's server, which answers as vLLM
does (400, "Out of range float values are not JSON compliant")."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import make_run
from tests.orchestrator.scripted import ScriptedChat, scripted_server
from workbench.files import layout, run_control
from workbench.inference.client import NonFiniteSamples
from workbench.orchestrator.__main__ import EXIT_EVICTED


class OverflowingPolicy(ScriptedChat):
    """Samples of the base model come back; the sampled request of step 1 cannot."""

    def chat(self, messages, *, model, n, sampling, seed):
        if len(self.requests) >= 2:  # step 0 is two prompts
            self.requests.append({"model": model})
            raise NonFiniteSamples("scripted overflow")
        return super().chat(messages, model=model, n=n, sampling=sampling, seed=seed)


def test_samples_vllm_cannot_send_evict_the_run_as_diverged_naming_the_version(experiment):
    run = make_run(
        experiment, "run_a",
        "max_steps = 4\nasync_level = 4\nbatch_size = 8\nrollouts_per_prompt = 4\n"
        "eval = { interval = 0 }\n",
    )  # fmt: skip
    log_path = layout.orchestrator_log_path(run)
    log_path.parent.mkdir(parents=True)
    with scripted_server(experiment, OverflowingPolicy()), open(log_path, "w") as log:
        code = subprocess.run(
            [sys.executable, "-m", "workbench.orchestrator", "--run-dir", str(run)],
            stdout=log, stderr=subprocess.STDOUT, timeout=120,
        ).returncode  # fmt: skip
    output = log_path.read_text()
    assert code == EXIT_EVICTED, output
    eviction = run_control.read_eviction(run)
    assert eviction is not None and eviction.evicted_by == "orchestrator", output
    assert run_control.is_divergence(eviction.reason), eviction.reason
    assert "policy version 0 hold non-finite log-probs" in eviction.reason
    assert "workbench runs fork run_a@STEP" in eviction.reason
    assert "Traceback" not in output
    assert layout.rollout_dir(run, 0).exists() and not layout.rollout_dir(run, 1).exists()
