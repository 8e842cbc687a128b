"""rlhf_jax.models.attention: the attention kernels of the decoder and the choice between them.

- `xla`: grouped-query attention with a hand-written backward (training and scoring
  forwards), which hands a fused kernel the layout when one is asked for;
- `cudnn`: cuDNN's fused flash attention (training and scoring forwards on NVIDIA GPUs);
- `pallas_flash`: the Pallas/Triton flash-attention kernel (same role, any GPU);
- `cached`: attention over a KV cache as stored (prefill and decode steps);
- `pallas_decode`: the ragged one-query decode kernel in Pallas;
- `choice`: which kernel "auto" means on the backend a program is traced for.
"""
