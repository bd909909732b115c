// reduce_axis.cu: reductions and softmax over the middle axis of
// [outer, n, inner], mirroring tensor/cpu_reduce.go.
