"""A character-level Hugging Face fast tokenizer with a chat template, built in code.

One token per character: lowercase letters, digits, space, newline and ASCII punctuation.
Any other character (uppercase, accents, emoji) becomes `<unk>`, which decodes to nothing
when special tokens are skipped. Special tokens: `<pad>`, `<bos>`, `<eos>`, `<unk>` and one
marker per chat role. The chat template renders

    <bos><|system|>...<eos><|user|>...<eos><|assistant|>...<eos>

`<eos>` ends every turn, so a generation stops at the end of the assistant's turn with no
extra stop string. The tokenizer adds no special tokens by itself (the template writes
`<bos>`), so vLLM, which tokenizes the rendered chat without adding special tokens, and
`apply_chat_template(..., tokenize=True)` produce the same ids.

Saved as `tokenizer.json` + `tokenizer_config.json` (chat template inside, class
`PreTrainedTokenizerFast`), which both transformers 4.x and 5.x and vLLM load.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<pad>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
UNK_TOKEN = "<unk>"
ROLES = ("system", "user", "assistant")
ROLE_TOKENS = tuple(f"<|{role}|>" for role in ROLES)
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN, *ROLE_TOKENS)

SUPPORTED_CHARACTERS = string.ascii_lowercase + string.digits + " \n" + string.punctuation
"""Every character with its own token, in id order after the special tokens."""

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unsupported chat role: ' + message['role']) }}"
    "{% endif %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + eos_token }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def build_char_tokenizer(model_max_length: int = 1024) -> PreTrainedTokenizerFast:
    """The character tokenizer, ready to `save_char_tokenizer`; ids are fixed by construction."""
    # Imported here: the constants above are what a cached model's identity needs
    # (`workbench.trainer.sft.tiny_reverse`), and transformers takes seconds to import.
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate((*SPECIAL_TOKENS, *SUPPORTED_CHARACTERS))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    # `[\s\S]` matches any single character, newline included, so every character is its own
    # word and WordLevel maps it to one id (or <unk>).
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    # Fuse joins tokens with nothing between them (WordLevel's default would insert spaces).
    backend.decoder = decoders.Fuse()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
        padding_side="right",
    )


def save_char_tokenizer(tokenizer: PreTrainedTokenizerFast, directory: Path) -> None:
    """Write `tokenizer.json` and `tokenizer_config.json`, chat template included.

    transformers 5 would put the template in a separate `chat_template.jinja` and name its own
    backend class; older loaders (transformers 4.x, hence vLLM on a machine with an older
    stack) read the template from `tokenizer_config.json` and know `PreTrainedTokenizerFast`.
    """
    tokenizer.save_pretrained(directory, save_jinja_files=False)
    config_path = Path(directory) / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["chat_template"] = CHAT_TEMPLATE
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def vocab_size() -> int:
    return len(SPECIAL_TOKENS) + len(SUPPORTED_CHARACTERS)
