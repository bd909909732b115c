// norm.cu: batch and layer normalisation, forward and backward.
