"""Writes a reasoning-gym dataset in TRL's layouts: prompts for RL (a chat-list prompt,
the reference answer and the generator's entry as columns) and conversations for SFT.

  python scripts/byo/reasoning_gym_data.py --out=/tmp/rg --dataset=basic_arithmetic

Needs `pip install reasoning-gym` (not a dependency of rlhf_jax: this is a user's data).
"""

import argparse
import json
import os

import reasoning_gym

PROMPT = "Answer with the number only. "


def rows(name: str, size: int, seed: int, options: dict):
  """(prompt record, SFT conversation) per generated problem."""
  for entry in reasoning_gym.create_dataset(name, size=size, seed=seed, **options):
    turns = [{"role": "user", "content": PROMPT + entry["question"]}]
    prompt = {"prompt": turns, "answer": entry["answer"], "rg_dataset": name,
              "rg_entry": json.dumps(entry, default=str)}
    yield prompt, {"messages": turns + [{"role": "assistant", "content": entry["answer"]}]}


def write(path: str, records) -> None:
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--out", required=True)
  parser.add_argument("--dataset", default="basic_arithmetic")
  parser.add_argument("--train", type=int, default=4000)
  parser.add_argument("--eval", type=int, default=128)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  options = ({"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
             if args.dataset == "basic_arithmetic" else {})
  os.makedirs(args.out, exist_ok=True)
  train = list(rows(args.dataset, args.train, args.seed, options))
  held_out = list(rows(args.dataset, args.eval, args.seed + 1, options))
  write(os.path.join(args.out, "sft.jsonl"), [c for _, c in train])
  write(os.path.join(args.out, "train.jsonl"), [p for p, _ in train])
  write(os.path.join(args.out, "eval.jsonl"), [p for p, _ in held_out])
  print(json.dumps({"out": args.out, "train": len(train), "eval": len(held_out)}))


if __name__ == "__main__":
  main()
