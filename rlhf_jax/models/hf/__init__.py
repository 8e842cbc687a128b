"""rlhf_jax.models.hf: the Hugging Face side of the decoder: checkpoints in and out.

- `checkpoint`: load and save `config.json` + safetensors, a tensor at a time;
- `config`: HF `config.json` ↔ `DecoderConfig`, one family at a time (`gemma`: Gemma 2
  and 3's keys);
- `tensors`: the table of our parameters ↔ HF tensor names and layouts;
- `metadata`: what a checkpoint holds besides our tensors, kept so an export writes it back;
- `peft`: PEFT LoRA adapter files for our LoRA adapters;
- `policy_dir`: a policy directory (checkpoint, tokenizer, prompt format);
- `checks`: the one-line checks of a checkpoint directory before any work.

Reading and writing tensors needs the `hf` extra (safetensors). `rlhf_jax.models` re-exports
the names most callers use (`load_hf_checkpoint`, `save_hf_checkpoint`, `save_policy`,
`config_from_hf`, ...).
"""
