"""The character tokenizer: one token per supported character, unknown characters become
<unk>, and the chat template renders conversations the way vLLM and SFT both see them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from workbench.models.char_tokenizer import (
    CHAT_TEMPLATE,
    SUPPORTED_CHARACTERS,
    build_char_tokenizer,
    save_char_tokenizer,
    vocab_size,
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    """The tokenizer as a model directory ships it: saved, then loaded by AutoTokenizer."""
    directory = tmp_path_factory.mktemp("tokenizer")
    save_char_tokenizer(build_char_tokenizer(), directory)
    return AutoTokenizer.from_pretrained(directory)


def test_every_supported_character_is_one_token_and_round_trips(tokenizer):
    ids = tokenizer.encode(SUPPORTED_CHARACTERS, add_special_tokens=False)
    assert len(ids) == len(SUPPORTED_CHARACTERS)
    assert len(set(ids)) == len(ids)
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == SUPPORTED_CHARACTERS
    for char in SUPPORTED_CHARACTERS:
        assert tokenizer.decode(tokenizer.encode(char, add_special_tokens=False)) == char


def test_spaces_and_newlines_survive_a_round_trip(tokenizer):
    text = "  two  spaces\nand a newline "
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_an_unknown_character_becomes_unk_and_is_dropped_when_skipping_specials(tokenizer):
    ids = tokenizer.encode("aÄb€", add_special_tokens=False)
    assert ids[1] == ids[3] == tokenizer.unk_token_id
    assert len(ids) == 4
    assert tokenizer.decode(ids, skip_special_tokens=True) == "ab"
    assert tokenizer.decode(ids) == "a<unk>b<unk>"


def test_encoding_adds_no_special_tokens_by_itself(tokenizer):
    """The chat template writes <bos>; an automatic one would double it in vLLM."""
    assert tokenizer.encode("abc") == tokenizer.encode("abc", add_special_tokens=False)


def test_the_chat_template_renders_a_conversation_and_the_generation_prompt(tokenizer):
    conversation = [
        {"role": "system", "content": "be brief."},
        {"role": "user", "content": "abc"},
        {"role": "assistant", "content": "cba"},
    ]
    assert (
        tokenizer.apply_chat_template(conversation, tokenize=False)
        == "<bos><|system|>be brief.<eos><|user|>abc<eos><|assistant|>cba<eos>"
    )
    prompt = tokenizer.apply_chat_template(
        conversation[1:2], add_generation_prompt=True, tokenize=False
    )
    assert prompt == "<bos><|user|>abc<eos><|assistant|>"
    ids = tokenizer.apply_chat_template(conversation[1:2], add_generation_prompt=True)
    ids = ids["input_ids"] if not isinstance(ids, list) else ids
    assert ids == tokenizer.encode(prompt, add_special_tokens=False)
    assert ids[0] == tokenizer.bos_token_id
    assert len(ids) == 1 + 1 + 3 + 1 + 1  # bos, <|user|>, a b c, eos, <|assistant|>


def test_an_unsupported_chat_role_is_an_error(tokenizer):
    with pytest.raises(Exception, match="unsupported chat role: tool"):
        tokenizer.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_the_saved_files_carry_the_template_and_special_tokens(tmp_path: Path):
    save_char_tokenizer(build_char_tokenizer(), tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHAT_TEMPLATE
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert (config["bos_token"], config["eos_token"], config["pad_token"]) == (
        "<bos>",
        "<eos>",
        "<pad>",
    )
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert len(loaded) == vocab_size()
    assert loaded.pad_token_id != loaded.eos_token_id
