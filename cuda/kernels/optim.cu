// optim.cu: the optimisers' fused updates (Adam, AdamW) and gradient-norm
// clipping, reading per-step scalars from device memory.
