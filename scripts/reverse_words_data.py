"""Write recipes/data/reverse_words.jsonl: the data file the `dataset` recipe trains on.

Rows of random lowercase texts of 8 to 10 letters and their reversals (the task the built-in
tiny model knows), seeded, so running this again writes the same file:

    python scripts/reverse_words_data.py
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

ROWS = 1200
OUT = Path(__file__).resolve().parent.parent / "recipes" / "data" / "reverse_words.jsonl"


def main() -> None:
    rng = random.Random("reverse_words")
    texts: dict[str, None] = {}  # insertion-ordered set: no text twice
    while len(texts) < ROWS:
        length = rng.randint(8, 10)
        texts["".join(rng.choice(string.ascii_lowercase) for _ in range(length))] = None
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w", encoding="utf-8") as out:
        for text in texts:
            out.write(json.dumps({"text": text, "reversed": text[::-1]}) + "\n")
    print(f"wrote {ROWS} rows to {OUT}")


if __name__ == "__main__":
    main()
