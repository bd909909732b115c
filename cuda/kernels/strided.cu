// strided.cu: the elementwise core over strided views (unary, binary and
// where by op code, strided copies), mirroring tensor/cpu_elementwise.go.
