"""Write the held-out generations as chat messages, for a teacher-forced ``capture``.

``train_drafter.py`` generates SmolLM2-135M-Instruct's own greedy responses to the 60
held-out prompts (topics never seen in training) into ``WORK/generated.jsonl``. This
writes them as ``{"messages": [user, assistant]}`` lines: ``eagle3conv capture`` (or
``capture_states``) then re-runs the target over prompt + response in one forward per
batch, no generation, and masks the loss to the response. tests/data/smollm2-heldout.jsonl
was made with::

    .venv/bin/python bench/smollm2/train_drafter.py --device cpu --eval-only --work /tmp/smollm2
    .venv/bin/python bench/smollm2/heldout_messages.py /tmp/smollm2/generated.jsonl tests/data/smollm2-heldout.jsonl
"""

from __future__ import annotations

import json
import sys


def main(src: str, dst: str) -> None:
    rows = [json.loads(line) for line in open(src, encoding="utf-8") if line.strip()]
    held = sorted((r for r in rows if r["split"] == "heldout" and r.get("sample", 0) == 0), key=lambda r: r["id"])
    with open(dst, "w", encoding="utf-8") as f:
        for r in held:
            f.write(json.dumps({"messages": [{"role": "user", "content": r["prompt"]},
                                             {"role": "assistant", "content": r["response"]}]},
                               ensure_ascii=False) + "\n")
    print(f"{dst}: {len(held)} held-out conversations")


if __name__ == "__main__":
    main(*sys.argv[1:3])
