"""The built model is servable: vLLM's OpenAI server (the CPU build here) loads
`builtin:tiny-reverse` and a LoRA adapter trained by `workbench sft --lora`, and its greedy
chat completions equal transformers' greedy generation token for token.

A real server: about two minutes (build ~40 s, server start ~60-80 s), hence `slow`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from peft import PeftModel

from workbench.envs import get_environment
from workbench.models import resolve_model
from workbench.system.ports import free_port
from workbench.trainer.sft.train import SFTConfig, SFTLoraConfig, load_model, train_sft

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vllm is not installed (pip install -e '.[cpu]' or '.[gpu]')",
    ),
]

SERVED_NAME = "tiny-reverse"
ADAPTER_NAME = "reverse-lora"
STARTUP_TIMEOUT_S = 600


class Server:
    def __init__(self, process: subprocess.Popen, base_url: str, log: Path) -> None:
        self.process = process
        self.base_url = base_url
        self.log = log

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def post(self, path: str, body: dict) -> dict:
        request = urllib.request.Request(
            self.base_url + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.load(response)

    def chat(self, model: str, text: str, **options) -> dict:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": text}],
            "temperature": 0.0,
            "max_tokens": 40,
            **options,
        }
        return self.post("/v1/chat/completions", body)["choices"][0]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """The real builtin model (built in a private cache) and a LoRA adapter trained on it."""
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WORKBENCH_CACHE_DIR", str(cache))
        model_dir = resolve_model("builtin:tiny-reverse", show_progress=False)
    adapter_dir = tmp_path_factory.mktemp("lora") / "adapter"
    train_sft(
        SFTConfig(
            model=str(model_dir),
            output_dir=adapter_dir,
            env="reverse_text",
            steps=10,
            batch_size=32,
            lr=3e-3,
            lora=SFTLoraConfig(rank=8, alpha=16),
            threads=1,
        ),
        show_progress=False,
    )
    yield model_dir, adapter_dir


@pytest.fixture(scope="module")
def server(artifacts: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory):
    model_dir, adapter_dir = artifacts
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--served-model-name",
        SERVED_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "256",
        "--dtype",
        "float32",
        "--enable-lora",
        "--max-lora-rank",
        "8",
        "--max-loras",
        "2",
        "--lora-modules",
        f"{ADAPTER_NAME}={adapter_dir}",
        # On the CPU backend this is the share of the NUMA node's memory vLLM reserves; the
        # default (0.9) fails when other processes hold some of it, and a 1M-parameter model
        # needs little.
        "--gpu-memory-utilization",
        "0.3",
    ]
    with open(log, "wb") as log_file:
        process = subprocess.Popen(
            command, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
        )
    served = Server(process, f"http://127.0.0.1:{port}", log)
    try:
        _wait_until_healthy(served)
        yield served
    finally:
        _stop(process)


def _wait_until_healthy(server: Server) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            pytest.fail(
                f"vLLM exited with code {server.process.returncode} while starting:\n"
                + server.log_tail()
            )
        try:
            with urllib.request.urlopen(server.base_url + "/health", timeout=5) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(2)
    pytest.fail(f"vLLM not healthy after {STARTUP_TIMEOUT_S} s:\n" + server.log_tail())


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to the server's process group (API server and engine), SIGKILL if it lingers."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def _hf_greedy(model, tokenizer, text: str) -> str:
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        output = model.generate(
            **inputs,
            do_sample=False,
            max_new_tokens=40,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    return tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def _texts() -> list[str]:
    """Held-out texts of the warm-up lengths (mostly right) and the RL lengths (often not)."""
    short = get_environment("reverse_text", min_length=3, max_length=8)
    long = get_environment("reverse_text")
    return [p.question for p in [*short.sample_prompts(4, split="eval"), *long.sample_prompts(6)]]


def test_vllm_greedy_chat_completions_equal_transformers_greedy_generation(
    server: Server, artifacts: tuple[Path, Path]
):
    model_dir, _ = artifacts
    tokenizer, model = load_model(model_dir)
    model.eval()
    texts = _texts()
    served = [server.chat(SERVED_NAME, text) for text in texts]
    assert [choice["finish_reason"] for choice in served] == ["stop"] * len(texts)
    assert [c["message"]["content"] for c in served] == [
        _hf_greedy(model, tokenizer, t) for t in texts
    ]
    # The short texts are the warm-up's: the model reverses them.
    assert served[0]["message"]["content"] == texts[0][::-1]


def test_vllm_returns_token_logprobs_for_chat_completions(server: Server):
    choice = server.chat(SERVED_NAME, "abcdef", logprobs=True)
    tokens = choice["logprobs"]["content"]
    assert "".join(t["token"] for t in tokens).startswith(choice["message"]["content"])
    assert all(t["logprob"] <= 0.0 for t in tokens)


def test_vllm_serves_an_sft_lora_adapter_like_peft(server: Server, artifacts: tuple[Path, Path]):
    model_dir, adapter_dir = artifacts
    tokenizer, base = load_model(model_dir)
    adapted = PeftModel.from_pretrained(base, adapter_dir).eval()
    texts = _texts()
    served = [server.chat(ADAPTER_NAME, text)["message"]["content"] for text in texts]
    assert served == [_hf_greedy(adapted, tokenizer, t) for t in texts]
