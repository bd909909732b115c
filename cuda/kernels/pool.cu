// pool.cu: average and adaptive pooling with padding and ceil mode.
