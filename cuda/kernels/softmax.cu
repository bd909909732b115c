// softmax.cu: softmax and log-softmax over the middle axis of
// [outer, n, inner] and the class losses built on them, mirroring
// tensor/cpu_softmax.go.
