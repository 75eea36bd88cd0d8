"""A synthetic Mooncake trace of any size, for the memory figures of docs/simulator.md.

Each conversation has ``TURNS`` requests; its first holds ``FIRST_BLOCKS`` blocks
of its own and every later turn extends the whole previous context by one block,
so a conversation has ``FIRST_BLOCKS + TURNS - 1`` distinct blocks (200,000
conversations: 1M requests and 1.4M blocks). Conversations start ``START_MS``
apart and their turns follow one another 20 to 80 s apart (seeded), so many are
live at once. Run as a script::

    python -m tests.support.mooncake_scale OUT.jsonl CONVERSATIONS
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

TURNS = 5
FIRST_BLOCKS = 3
START_MS = 50


def mooncake_rows(conversations: int, seed: int = 0) -> list[dict]:
    """The requests of ``conversations`` conversations, in time order."""
    rng = random.Random(seed)
    rows: list[tuple[int, int, list[int]]] = []
    per = FIRST_BLOCKS + TURNS - 1
    for c in range(conversations):
        ts = c * START_MS
        for turn in range(TURNS):
            blocks = list(range(c * per, c * per + FIRST_BLOCKS + turn))
            rows.append((ts, c, blocks))
            ts += rng.randrange(20_000, 80_000)
    rows.sort(key=lambda r: (r[0], r[1]))
    return [{"timestamp": ts, "input_length": 512 * len(b) - 100, "output_length": 200,
             "hash_ids": b} for ts, _, b in rows]


def write_mooncake(path: Path, conversations: int, seed: int = 0) -> int:
    """Write the trace to ``path``; returns the number of requests."""
    rows = mooncake_rows(conversations, seed)
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    return len(rows)


if __name__ == "__main__":
    n = write_mooncake(Path(sys.argv[1]), int(sys.argv[2]))
    print(f"wrote {n} requests to {sys.argv[1]}")
