package tensor

import "testing"

// maskAttention is layoutAttention with the dropout's kept bits kept for
// the backward pass (AttentionMaskBackend): it records the masks its
// passes are handed and computes the attention without dropout (the
// plumbing is what is checked here, not the values).
type maskAttention struct {
	layoutAttention
	words    int
	fwd, bwd []Buffer
}

func (a *maskAttention) AttentionMaskWords(AttentionShape) int { return a.words }

func (a *maskAttention) AttentionForward(out, lse, q, k, v Buffer, sh AttentionShape, drop AttentionDropout) {
	a.fwd = append(a.fwd, drop.Mask)
	a.layoutAttention.AttentionForward(out, lse, q, k, v, sh, AttentionDropout{Keep: 1, Scale: 1})
}

func (a *maskAttention) AttentionBackward(dq, dk, dv, q, k, v, out, lse, dout Buffer, sh AttentionShape, drop AttentionDropout) {
	a.bwd = append(a.bwd, drop.Mask)
	a.layoutAttention.AttentionBackward(dq, dk, dv, q, k, v, out, lse, dout, sh, AttentionDropout{Keep: 1, Scale: 1})
}

// TestAttentionMaskPlumbing: a backend that keeps the dropout's bits gets
// a mask of the words it asks for in the forward pass, and the same one in
// the backward pass, exactly when a backward pass will run and there is
// dropout: for q, k and v that require gradients and for a packed input
// that does (its q, k and v are views that do not), and not without
// gradients or without dropout.
func TestAttentionMaskPlumbing(t *testing.T) {
	const b, tt, h, d = 2, 5, 3, 4
	for _, c := range []struct {
		name   string
		packed bool
		grad   bool
		p      float32
		mask   bool
	}{
		{"q, k, v with gradients", false, true, 0.2, true},
		{"q, k, v without gradients", false, false, 0.2, false},
		{"q, k, v without dropout", false, true, 0, false},
		{"packed with gradients", true, true, 0.2, true},
		{"packed without gradients", true, false, 0.2, false},
		{"packed without dropout", true, true, 0, false},
	} {
		a := &maskAttention{words: 37}
		var y *Tensor
		if c.packed {
			x := Full(a, nil, 0.5, b, tt, 3, h, d).SetRequiresGrad(c.grad)
			y = ScaledDotProductAttentionPacked(x, true, 0, c.p, NewGenerator(1))
		} else {
			var qkv []*Tensor
			for range 3 {
				qkv = append(qkv, Full(a, nil, 0.5, b, h, tt, d).SetRequiresGrad(c.grad))
			}
			y = ScaledDotProductAttentionDropout(qkv[0], qkv[1], qkv[2], true, 0, c.p, NewGenerator(1))
		}
		if c.grad {
			Sum(y).Backward()
		}
		if len(a.fwd) != 1 {
			t.Fatalf("%s: %d forward calls, want 1", c.name, len(a.fwd))
		}
		if got := !a.fwd[0].Empty(); got != c.mask {
			t.Errorf("%s: forward handed a mask: %v, want %v", c.name, got, c.mask)
		}
		if c.mask && (a.fwd[0].Len != a.words || a.fwd[0].DType != Int32) {
			t.Errorf("%s: mask of %d %v, want %d Int32 words", c.name, a.fwd[0].Len, a.fwd[0].DType, a.words)
		}
		if c.grad {
			if len(a.bwd) != 1 || a.bwd[0] != a.fwd[0] {
				t.Errorf("%s: backward handed %v, want the forward's %v", c.name, a.bwd, a.fwd[0])
			}
		}
	}
}
