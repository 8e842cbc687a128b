"""On-policy distillation on arith: a small student distils a larger warm-started teacher
(configs/distill.py; docs/distillation.md). Per seed:

  1. the teacher: the arith SFT warm start (training/stages.py) of a larger decoder on
     flawless worked solutions (sft.carry_slip 0);
  2. the student: the warm start of a smaller decoder on the careless teacher's solutions
     (sft.carry_slip 0.6, the demo's) with fewer SFT steps;
  3. held-out greedy accuracy of both, then `--steps` steps of the distill preset (the
     loop unchanged: `training.loop.Trainer`), the student's accuracy before and after.

Prints one JSON line per seed and a last one with the means. Sizes are shrunk to what two
shared CPU cores do in ~25 minutes for three seeds (the flags below): level-1 problems only
(responses of <= 45 tokens, 48 new tokens), a 96-wide 3-layer teacher with 400 SFT steps of
32 shared by the seeds (--shared-teacher), a 48-wide 2-layer student with 150, 30
distillation steps of 16 prompts x 4 samples, 128 held-out problems (the demo's warm start
is a 128-wide, 3-layer decoder with 450 SFT steps of 64, evaluated on 256 problems of
levels 1-2).

  python benchmarks/distill_arith.py --seeds=0,1,2 --shared-teacher --workdir=/tmp/distill
  python benchmarks/distill_arith.py --tiny   (CI: one seed, 1-layer models, 2 SFT and 2
                                               distillation steps, 8 held-out problems)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import shutil
import statistics
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def preset(name: str):
  """configs/<name>.py:arith."""
  spec = importlib.util.spec_from_file_location(name, ROOT / "configs" / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config("arith")


def shared_fields(c, args, seed: int):
  """The fields every stage of one seed shares: data, lengths, sampler, evaluation."""
  c.seed = seed
  c.data.num_eval = args.num_eval
  levels = tuple(int(x) for x in args.levels.split(","))
  c.data.levels, c.data.level_weights = levels, (1.0,) * len(levels)
  c.sft.levels, c.sft.level_weights = levels, (1.0,) * len(levels)
  c.rollout.max_new_tokens = args.max_new_tokens
  c.sampler.cache_length = c.data.prompt_length + args.max_new_tokens
  c.sampler.warmup = False
  c.train.eval_samples = 0  # greedy held-out accuracy only
  c.train.checkpoint_every = 10**6  # the exported policy at the end is enough
  c.compile_cache = args.compile_cache
  return c


def model_fields(c, size: str, *, sft_steps: int, sft_batch: int, carry_slip: float):
  """`size` is 'width x layers x heads', e.g. '128x3x4'."""
  hidden, layers, heads = (int(x) for x in size.split("x"))
  c.model.hidden_size, c.model.num_layers, c.model.num_heads = hidden, layers, heads
  c.sft.steps, c.sft.batch_size, c.sft.carry_slip = sft_steps, sft_batch, carry_slip
  return c


def warm_start(c, directory: str) -> float:
  """Trains the arith warm start into `directory` unless it exists; returns seconds."""
  from rlhf_jax.training import stages
  start = time.perf_counter()
  c.model.checkpoint = directory
  stages.ensure_arith_warm_start(c, os.path.dirname(directory), log=lambda line: None)
  return time.perf_counter() - start


def held_out_accuracy(c, workdir: str) -> float:
  """Greedy held-out accuracy of `model.checkpoint` (the Trainer's evaluation)."""
  from rlhf_jax.training import loop
  trainer = loop.Trainer(c, workdir, log=lambda line: None)
  try:
    return trainer.evaluate()["eval_accuracy"]
  finally:
    trainer.close()


def one_seed(args, seed: int) -> dict:
  """Teacher and student warm starts, the teacher's accuracy, then the distillation."""
  root = os.path.join(args.workdir, f"seed{seed}")
  student_dir = os.path.join(root, "student")
  # --shared_teacher: one teacher (warm-started with the first seed) for every seed.
  teacher_seed = args.seeds_list[0] if args.shared_teacher else seed
  teacher_dir = os.path.join(args.workdir, f"seed{teacher_seed}", "teacher")
  teacher = model_fields(shared_fields(preset("grpo"), args, teacher_seed), args.teacher,
                         sft_steps=args.teacher_sft_steps, sft_batch=args.teacher_sft_batch,
                         carry_slip=0.0)
  teacher.algorithm.kl.placement = "none"  # evaluated only: no reference copy
  seconds = {"teacher_sft": warm_start(teacher, teacher_dir)}
  teacher.seed = seed  # evaluated on this seed's held-out problems
  student = model_fields(shared_fields(preset("distill"), args, seed), args.student,
                         sft_steps=args.student_sft_steps, sft_batch=args.student_sft_batch,
                         carry_slip=0.6)
  seconds["student_sft"] = warm_start(student, student_dir)
  start = time.perf_counter()
  teacher_accuracy = held_out_accuracy(teacher, os.path.join(root, "teacher_eval"))
  shutil.rmtree(os.path.join(root, "teacher_eval"), ignore_errors=True)
  seconds["teacher_eval"] = time.perf_counter() - start
  student.algorithm.distill.teacher = teacher_dir
  student.algorithm.distill.task_coef = args.task_coef
  student.optimizer.learning_rate = args.learning_rate
  student.rollout.prompts_per_step, student.rollout.group_size = args.prompts, args.group_size
  student.train.steps = student.train.eval_every = args.steps
  from rlhf_jax.training import loop
  run_dir = os.path.join(root, "distill")
  shutil.rmtree(run_dir, ignore_errors=True)  # a finished run would resume at its end
  summary = loop.Trainer(student, run_dir, log=lambda line: None).run()
  seconds["distill"] = summary["seconds"]
  return {"seed": seed, "teacher_accuracy": teacher_accuracy,
          "student_accuracy_before": summary["eval_accuracy_start"],
          "student_accuracy_after": summary["eval_accuracy_end"],
          "seconds": {k: round(v, 1) for k, v in seconds.items()}}


def parse_args():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--workdir", default="/tmp/distill_arith")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--teacher", default="96x3x4", help="width x layers x heads")
  p.add_argument("--student", default="48x2x4", help="width x layers x heads")
  p.add_argument("--teacher-sft-steps", type=int, default=400)
  p.add_argument("--student-sft-steps", type=int, default=150)
  p.add_argument("--teacher-sft-batch", type=int, default=32)
  p.add_argument("--student-sft-batch", type=int, default=32)
  p.add_argument("--shared-teacher", action="store_true",
                 help="warm-start one teacher (the first seed's) for every seed")
  p.add_argument("--steps", type=int, default=30, help="distillation steps")
  p.add_argument("--prompts", type=int, default=16, help="prompts per step")
  p.add_argument("--group-size", type=int, default=4, help="samples per prompt")
  p.add_argument("--learning-rate", type=float, default=5e-4)
  p.add_argument("--task-coef", type=float, default=0.0)
  p.add_argument("--levels", default="1", help="arith levels of SFT, training and eval")
  p.add_argument("--max-new-tokens", type=int, default=48)
  p.add_argument("--num-eval", type=int, default=128, help="held-out problems")
  p.add_argument("--compile-cache", default="~/.cache/rlhf_jax/xla")
  p.add_argument("--tiny", action="store_true", help="the same stages at toy sizes (CI)")
  args = p.parse_args()
  if args.tiny:
    args.seeds, args.teacher, args.student = "0", "32x1x2", "16x1x2"
    args.teacher_sft_steps = args.student_sft_steps = 2
    args.teacher_sft_batch = args.student_sft_batch = 8
    args.steps, args.prompts, args.group_size, args.num_eval = 2, 2, 2, 8
  return args


def main() -> None:
  args = parse_args()
  args.seeds_list = [int(s) for s in args.seeds.split(",")]
  from rlhf_jax.runtime import quiet_library_logs
  quiet_library_logs()
  rows = []
  for seed in args.seeds_list:
    rows.append(one_seed(args, seed))
    print(json.dumps(rows[-1]), flush=True)
  mean = lambda key: round(statistics.mean(r[key] for r in rows), 4)
  print(json.dumps({"event": "summary", "seeds": [r["seed"] for r in rows],
                    "teacher": args.teacher, "student": args.student, "steps": args.steps,
                    **{f"mean_{k}": mean(k) for k in ("teacher_accuracy",
                                                      "student_accuracy_before",
                                                      "student_accuracy_after")}}),
        flush=True)


if __name__ == "__main__":
  main()
