package tensor

import "fmt"

// Fused on the CPU: the reference. Every element runs the program's nodes
// in order with the same scalar functions as Unary and Binary (unary32,
// binary32), so a fused expression gives the bits of its composed
// operations.
func (*cpuBackend) Fused(p *FusedProgram, dst []Buffer, in []View, shape []int) {
	if len(in) != len(p.Inputs) || len(dst) != len(p.Outputs) {
		panic(fmt.Sprintf("tensor: cpu: Fused: %d views and %d outputs for a program of %d inputs and %d outputs", len(in), len(dst), len(p.Inputs), len(p.Outputs)))
	}
	srcs := make([][]float32, len(in))
	for i, v := range in {
		srcs[i] = mem32(v.Buf)
	}
	outs := make([][]float32, len(dst))
	for j, d := range dst {
		denseOut("Fused", d, shape)
		outs[j] = f32(d)
	}
	vals := make([]float32, len(p.Nodes))
	k := 0
	stridedWalk("Fused", shape, in, func(o []int) {
		for i, nd := range p.Nodes {
			switch nd.Kind {
			case FusedInput:
				vals[i] = srcs[nd.Input][o[nd.Input]]
			case FusedConst:
				vals[i] = nd.Value
			case FusedUnary:
				vals[i] = unary32(nd.Unary, vals[nd.Args[0]], 0, 0)
			case FusedBinary:
				vals[i] = binary32(nd.Binary, vals[nd.Args[0]], vals[nd.Args[1]])
			}
		}
		for j, o := range p.Outputs {
			outs[j][k] = vals[o]
		}
		k++
	})
}
