"""Write recipes/data/chat.jsonl: a few hundred short conversations, made deterministically (no network).

    python recipes/data/make_chat.py            # rewrites chat.jsonl beside this script

Each row is ``{"messages": [{"role": ..., "content": ...}, ...]}`` (the OpenAI/TRL convention): a system
line on some, one or two user/assistant turns. The assistant's answers follow simple rules (arithmetic,
opposites, plurals, capitals), so a tiny model can learn them and the eval loss shows it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OPPOSITES = {"hot": "cold", "big": "small", "fast": "slow", "up": "down", "light": "dark", "open": "closed",
             "early": "late", "full": "empty", "hard": "soft", "old": "new", "wet": "dry", "high": "low"}
PLURALS = {"cat": "cats", "box": "boxes", "city": "cities", "child": "children", "mouse": "mice",
           "leaf": "leaves", "bus": "buses", "tooth": "teeth", "day": "days", "knife": "knives"}
CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Spain": "Madrid", "Egypt": "Cairo",
            "Canada": "Ottawa", "Kenya": "Nairobi", "Peru": "Lima", "Norway": "Oslo", "Chile": "Santiago"}
SYSTEM = "You are a concise assistant. Answer in one short sentence."


def turn(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(4)
    if kind == 0:
        a, b = rng.randrange(2, 50), rng.randrange(2, 50)
        return f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
    if kind == 1:
        word = rng.choice(sorted(OPPOSITES))
        return f"What is the opposite of {word}?", f"The opposite of {word} is {OPPOSITES[word]}."
    if kind == 2:
        word = rng.choice(sorted(PLURALS))
        return f"What is the plural of {word}?", f"The plural of {word} is {PLURALS[word]}."
    country = rng.choice(sorted(CAPITALS))
    return f"What is the capital of {country}?", f"The capital of {country} is {CAPITALS[country]}."


def conversations(count: int, seed: int = 13) -> list[dict[str, list[dict[str, str]]]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        messages = [{"role": "system", "content": SYSTEM}] if rng.random() < 0.5 else []
        for _ in range(rng.choice((1, 1, 2))):
            question, answer = turn(rng)
            messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        rows.append({"messages": messages})
    return rows


def main() -> None:
    out = Path(__file__).resolve().parent / "chat.jsonl"
    with open(out, "w", encoding="utf-8") as fh:
        for row in conversations(400):
            fh.write(json.dumps(row) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
