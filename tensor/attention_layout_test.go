package tensor

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// layoutAttention is the CPU with a float64 AttentionBackend that reads and
// writes every tensor through AttentionShape's layouts (no dropout), and
// checks each buffer holds its layout's extent: it pins down what the
// fused path hands a backend for strided views.
type layoutAttention struct {
	cpuBackend
	calls, copies int
}

func (a *layoutAttention) CopyStrided(dst, src Buffer, shape, strides []int) {
	a.copies++
	a.cpuBackend.CopyStrided(dst, src, shape, strides)
}

func (a *layoutAttention) CopyView(dst, src View, shape []int, accumulate bool) {
	a.copies++
	a.cpuBackend.CopyView(dst, src, shape, accumulate)
}

func (*layoutAttention) AttentionSupported(d, dv int) bool { return d == dv }

// at is the element of row r, column c of head h of a tensor laid out as l.
func at(sh AttentionShape, l AttentionLayout, rows, h, r, c int) int {
	l = l.Resolve(sh, rows)
	in := sh.InnerHeads()
	return h/in*l.Group + h%in*l.Head + r*l.Row + c
}

func checkExtent(name string, b Buffer, sh AttentionShape, l AttentionLayout, rows int) []float32 {
	if n := l.Extent(sh, rows); b.Len < n {
		panic(fmt.Sprintf("%s has %d elements, its layout %+v needs %d", name, b.Len, l, n))
	}
	return f32(b)
}

func (a *layoutAttention) AttentionForward(out, lse, q, k, v Buffer, sh AttentionShape, drop AttentionDropout) {
	a.calls++
	if drop.Keep != 1 || sh.Heads%sh.InnerHeads() != 0 {
		panic("layoutAttention: no dropout, whole groups")
	}
	O, L := checkExtent("out", out, sh, sh.O, sh.T), f32(lse)
	Q, K, V := checkExtent("q", q, sh, sh.Q, sh.T), checkExtent("k", k, sh, sh.K, sh.S), checkExtent("v", v, sh, sh.V, sh.S)
	p := make([]float64, sh.S)
	for h := range sh.Heads {
		for i := range sh.T {
			mx, z := math.Inf(-1), 0.0
			for j := range sh.S {
				s := 0.0
				for c := range sh.D {
					s += float64(Q[at(sh, sh.Q, sh.T, h, i, c)]) * float64(K[at(sh, sh.K, sh.S, h, j, c)])
				}
				p[j] = s * float64(sh.Scale)
				if sh.Causal && j > i {
					p[j] = math.Inf(-1)
				}
				mx = math.Max(mx, p[j])
			}
			for j := range sh.S {
				p[j] = math.Exp(p[j] - mx)
				z += p[j]
			}
			for c := range sh.D {
				o := 0.0
				for j := range sh.S {
					o += p[j] / z * float64(V[at(sh, sh.V, sh.S, h, j, c)])
				}
				O[at(sh, sh.O, sh.T, h, i, c)] = float32(o)
			}
			L[h*sh.T+i] = float32(mx + math.Log(z))
		}
	}
}

func (a *layoutAttention) AttentionBackward(dq, dk, dv, q, k, v, out, lse, dout Buffer, sh AttentionShape, drop AttentionDropout) {
	a.calls++
	Q, K, V := checkExtent("q", q, sh, sh.Q, sh.T), checkExtent("k", k, sh, sh.K, sh.S), checkExtent("v", v, sh, sh.V, sh.S)
	O, G, L := checkExtent("out", out, sh, sh.O, sh.T), checkExtent("dout", dout, sh, sh.DO, sh.T), f32(lse)
	DQ, DK, DV := checkExtent("dq", dq, sh, sh.DQ, sh.T), checkExtent("dk", dk, sh, sh.DK, sh.S), checkExtent("dv", dv, sh, sh.DV, sh.S)
	for h := range sh.Heads {
		for j := range sh.S {
			for c := range sh.D {
				DK[at(sh, sh.DK, sh.S, h, j, c)], DV[at(sh, sh.DV, sh.S, h, j, c)] = 0, 0
			}
		}
	}
	for h := range sh.Heads {
		for i := range sh.T {
			delta := 0.0
			for c := range sh.D {
				delta += float64(G[at(sh, sh.DO, sh.T, h, i, c)]) * float64(O[at(sh, sh.O, sh.T, h, i, c)])
			}
			dqi := make([]float64, sh.D)
			for j := range sh.S {
				if sh.Causal && j > i {
					continue
				}
				s, dp := 0.0, 0.0
				for c := range sh.D {
					s += float64(Q[at(sh, sh.Q, sh.T, h, i, c)]) * float64(K[at(sh, sh.K, sh.S, h, j, c)])
					dp += float64(G[at(sh, sh.DO, sh.T, h, i, c)]) * float64(V[at(sh, sh.V, sh.S, h, j, c)])
				}
				p := math.Exp(s*float64(sh.Scale) - float64(L[h*sh.T+i]))
				ds := p * (dp - delta) * float64(sh.Scale)
				for c := range sh.D {
					dqi[c] += ds * float64(K[at(sh, sh.K, sh.S, h, j, c)])
					DK[at(sh, sh.DK, sh.S, h, j, c)] += float32(ds * float64(Q[at(sh, sh.Q, sh.T, h, i, c)]))
					DV[at(sh, sh.DV, sh.S, h, j, c)] += float32(p * float64(G[at(sh, sh.DO, sh.T, h, i, c)]))
				}
			}
			for c := range sh.D {
				DQ[at(sh, sh.DQ, sh.T, h, i, c)] = float32(dqi[c])
			}
		}
	}
}

func (*layoutAttention) AttentionTakeState(saved, state Buffer, blocks uint64) {
	panic("layoutAttention: no dropout")
}

// TestAttentionLayouts: permuted views and the packed projection reach an
// AttentionBackend in place (their strides as layouts, no copies), and
// its results through those layouts are the CPU's composed attention, its
// gradients included (within float32 rounding: 1e-5 of the largest). The
// forward passes copy nothing; the packed attention's backward pass
// neither (its one gradient is the projection's).
func TestAttentionLayouts(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	rnd := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	const b, tt, h, d = 2, 7, 3, 4
	for _, c := range []struct {
		name   string
		shapes [][]int
		f      func(x []*Tensor) *Tensor
		copies int // strided copies in the backward pass
	}{
		{"permuted views", [][]int{{b, tt, h, d}, {b, tt, h, d}, {b, tt, h, d}}, func(x []*Tensor) *Tensor {
			return ScaledDotProductAttention(x[0].Permute(0, 2, 1, 3), x[1].Permute(0, 2, 1, 3), x[2].Permute(0, 2, 1, 3), true, 0)
		}, 3}, // the views' own backward passes
		{"narrowed heads", [][]int{{h, 2 * tt, d}, {h, tt, 2 * d}, {h, tt, d}}, func(x []*Tensor) *Tensor {
			return ScaledDotProductAttention(x[0].Narrow(1, 3, tt), x[1].Narrow(2, 4, d), x[2], false, 0.5)
		}, 2},
		{"packed", [][]int{{b, tt, 3, h, d}}, func(x []*Tensor) *Tensor {
			return ScaledDotProductAttentionPacked(x[0], true, 0, 0, nil)
		}, 0},
		{"packed of a strided projection", [][]int{{b, 2 * tt, 3, h, d}}, func(x []*Tensor) *Tensor {
			return ScaledDotProductAttentionPacked(x[0].Narrow(1, 1, tt), false, 0, 0, nil)
		}, 1}, // the Narrow's
	} {
		data := make([][]float32, len(c.shapes))
		for i, s := range c.shapes {
			data[i] = rnd(numel(s))
		}
		var w []float32
		la := &layoutAttention{}
		run := func(be Backend) ([]float32, [][]float32) {
			var xs []*Tensor
			for i, s := range c.shapes {
				xs = append(xs, FromFloat32(be, nil, data[i], s...).SetRequiresGrad(true))
			}
			y := c.f(xs)
			if be == la && la.copies != 0 {
				t.Errorf("%s: %d strided copies forward, want none", c.name, la.copies)
			}
			la.copies = 0
			if w == nil {
				w = rnd(y.Len())
			}
			Sum(Mul(y, FromFloat32(be, nil, w, y.Shape()...))).Backward()
			if be == la && la.copies != c.copies {
				t.Errorf("%s: %d strided copies backward, want %d", c.name, la.copies, c.copies)
			}
			var gs [][]float32
			for _, x := range xs {
				gs = append(gs, x.Grad().Float32s())
			}
			return y.Float32s(), gs
		}
		got, gotG := run(la)
		want, wantG := run(CPU)
		if la.calls != 2 {
			t.Errorf("%s: %d fused calls, want 2 (forward, backward)", c.name, la.calls)
		}
		near := func(what string, got, want []float32) {
			m := 0.0
			for _, v := range want {
				m = math.Max(m, math.Abs(float64(v)))
			}
			for i := range want {
				if math.Abs(float64(got[i]-want[i])) > 1e-5*m {
					t.Errorf("%s: %s[%d] = %g, the composed attention's %g", c.name, what, i, got[i], want[i])
					return
				}
			}
		}
		near("output", got, want)
		for i := range wantG {
			near(fmt.Sprintf("gradient %d", i), gotG[i], wantG[i])
		}
	}
}
