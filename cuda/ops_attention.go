package cuda

import (
	"fmt"

	"github.com/ember-ml/ember/tensor"
)

// Tile sizes of kernels/attention.cu: the forward takes 64 queries per
// block of 256 threads, the two backward kernels 32 queries (dQ) or 32
// keys (dK, dV) per block of 128.
const (
	attnFwdRows, attnFwdThreads = 64, 256
	attnBwdRows, attnBwdThreads = 32, 128
)

// The tensor-core kernels of kernels/attention_bf16.cu, taken under
// autocast to bfloat16 (AttentionShape.BFloat16) for D = 64: every kernel
// a block of 128 threads per 64 rows (queries, or keys for dK and dV).
// Other heads under autocast keep the float32 kernels. Bfloat16 tiles (q,
// k and v already cast, and dO as the dQ kernel rounds it into a
// workspace for the dK/dV kernel) go to shared memory by cp.async into two
// buffers, the next tile's copies in flight while this one's products run;
// only tiles that reach past T, S or a warp's causal diagonal test each
// element's mask; and under dropout the forward kernel stores the bits it
// drew where the tensor package gives it a mask (AttentionMaskWords), for
// the backward kernels to read instead of drawing them again.
const attnBF16Rows, attnBF16Threads = 64, 128

// attnBF16 reports whether a call takes the bfloat16 tensor-core kernels
// (compiled for sm_80 and later only).
func (b *Backend) attnBF16(sh tensor.AttentionShape) bool {
	return sh.BFloat16 && sh.D == 64 && b.hasKernel(attnBF16Kernels[0][0])
}

// AttentionTakesBF16 implements tensor.AttentionBF16InputsBackend: the
// tensor-core kernels take q, k and v as bfloat16 (ember_attention_bf16h_*,
// which read what the float32 ones round as they load: the same bits).
func (b *Backend) AttentionTakesBF16(sh tensor.AttentionShape) bool {
	return b.attnBF16(sh) && b.hasKernel(attnBF16Kernels[1][0])
}

// attnBF16Kernels are the tensor-core kernels (forward, dQ, dK/dV) for
// float32 q, k and v, and for bfloat16 ones.
var attnBF16Kernels = [2][3]string{
	{"ember_attention_bf16_fwd_d64", "ember_attention_bf16_dq_d64", "ember_attention_bf16_dkv_d64"},
	{"ember_attention_bf16h_fwd_d64", "ember_attention_bf16h_dq_d64", "ember_attention_bf16h_dkv_d64"},
}

// attnInputs are the pointers of q, k and v and the tensor-core kernels for
// their element type: float32 ones, or bfloat16 ones where
// AttentionTakesBF16 allows.
func (b *Backend) attnInputs(op string, sh tensor.AttentionShape, q, k, v tensor.Buffer) (pq, pk, pv uintptr, kernels [3]string) {
	if q.DType != tensor.BFloat16 {
		return b.f32(op, q), b.f32(op, k), b.f32(op, v), attnBF16Kernels[0]
	}
	if !b.AttentionTakesBF16(sh) {
		panic(fmt.Sprintf("cuda: %s: bfloat16 q, k and v for heads of %d (bfloat16 %v): only the tensor-core kernels take them", op, sh.D, sh.BFloat16))
	}
	return b.ptr(op, q, tensor.BFloat16), b.ptr(op, k, tensor.BFloat16), b.ptr(op, v, tensor.BFloat16), attnBF16Kernels[1]
}

// AttentionMaskWords implements tensor.AttentionMaskBackend: the
// tensor-core kernels' forward pass stores the dropout's kept bits, a word
// a lane for each (head, query tile, key tile, warp) (attention_bf16.cu's
// ember_attb_mask_word: a bit a weight, 3 MiB for the GPT's [384, 256,
// 256]), and the dQ and dK/dV kernels read them instead of a Philox draw
// for every four weights each. The float32 kernels draw them again.
func (b *Backend) AttentionMaskWords(sh tensor.AttentionShape) int {
	if !b.attnBF16(sh) {
		return 0
	}
	return sh.Heads * attnBF16Tiles(sh.T) * attnBF16Tiles(sh.S) * attnBF16Threads
}

// attnBF16Tiles is the tiles of 64 rows that cover n.
func attnBF16Tiles(n int) int { return (n + attnBF16Rows - 1) / attnBF16Rows }

// attnMask is the mask argument of the tensor-core kernels: the words of
// drop.Mask, or 0 (no dropout, or none kept: the bits are drawn again).
func (b *Backend) attnMask(op string, sh tensor.AttentionShape, drop tensor.AttentionDropout) uintptr {
	if drop.Keep >= 1 || drop.Mask.Empty() {
		return 0
	}
	need(op, "dropout mask", drop.Mask, b.AttentionMaskWords(sh))
	return b.i32(op, drop.Mask)
}

// AttentionSupported reports the head dimensions of the fused kernels
// (tensor.AttentionBackend): D = Dv in {16, 32, 64}. Other heads take the
// composed attention.
func (b *Backend) AttentionSupported(d, dv int) bool {
	return d == dv && (d == 16 || d == 32 || d == 64)
}

// attnArgs checks a fused attention's buffers and returns the trailing
// kernel arguments shared by the three kernels (sizes, mask, scale,
// dropout, the inner heads). Each buffer must hold its layout's extent;
// the strides of a layout other than the dense one must be multiples of 4
// elements (the kernels' 16-byte loads and 8-byte stores).
func (b *Backend) attnArgs(op string, sh tensor.AttentionShape, drop tensor.AttentionDropout, bufs map[string]tensor.Buffer) []any {
	if sh.Heads < 1 || sh.T < 1 || sh.S < 1 || !b.AttentionSupported(sh.D, sh.D) || sh.Inner < 0 || sh.Heads%sh.InnerHeads() != 0 {
		panic(fmt.Sprintf("cuda: %s of %d heads (%d inner), T %d, S %d, D %d", op, sh.Heads, sh.Inner, sh.T, sh.S, sh.D))
	}
	if int64(sh.Heads)*int64((max(sh.T, sh.S)+attnBwdRows-1)/attnBwdRows) > 1<<31-1 {
		panic(fmt.Sprintf("cuda: %s of %d heads, T %d, S %d: too many blocks for one grid", op, sh.Heads, sh.T, sh.S))
	}
	if !(drop.Keep > 0 && drop.Keep <= 1) {
		panic(fmt.Sprintf("cuda: %s: dropout keep probability %v outside (0, 1]", op, drop.Keep))
	}
	for name, buf := range bufs {
		if name == "lse" {
			if buf.Len != sh.Heads*sh.T {
				panic(fmt.Sprintf("cuda: %s: lse has %d elements, want %d", op, buf.Len, sh.Heads*sh.T))
			}
			continue
		}
		l, rows := attnLayout(sh, name)
		if n := l.Extent(sh, rows); buf.Len < n {
			panic(fmt.Sprintf("cuda: %s: %s has %d elements, its layout %+v needs %d", op, name, buf.Len, l, n))
		}
		if r := l.Resolve(sh, rows); r != (tensor.AttentionLayout{}.Resolve(sh, rows)) && (r.Group%4 != 0 || r.Head%4 != 0 || r.Row%4 != 0 || buf.Off%4 != 0) {
			panic(fmt.Sprintf("cuda: %s: %s layout %+v at element %d: want strides and offset multiples of 4", op, name, r, buf.Off))
		}
	}
	var state uintptr
	if drop.Keep < 1 && !drop.State.Empty() {
		need(op, "dropout state", drop.State, 4)
		state = b.i32(op, drop.State)
	}
	return []any{int32(sh.Heads), int32(sh.T), int32(sh.S), flag(sh.Causal), sh.Scale, drop.Keep, drop.Scale,
		state, int64(drop.Seed), int64(drop.Offset), int32(sh.InnerHeads())}
}

// attnLayout is the layout of the named tensor of a call and its rows per
// head.
func attnLayout(sh tensor.AttentionShape, name string) (tensor.AttentionLayout, int) {
	switch name {
	case "q":
		return sh.Q, sh.T
	case "out":
		return sh.O, sh.T
	case "dout":
		return sh.DO, sh.T
	case "dq":
		return sh.DQ, sh.T
	case "k":
		return sh.K, sh.S
	case "v":
		return sh.V, sh.S
	case "dk":
		return sh.DK, sh.S
	case "dv":
		return sh.DV, sh.S
	}
	panic("cuda: attention tensor " + name)
}

// attnLayoutArgs are the (group, head, row) strides of the named tensors,
// in order: the kernels' trailing arguments.
func attnLayoutArgs(sh tensor.AttentionShape, names ...string) []any {
	var args []any
	for _, name := range names {
		l, rows := attnLayout(sh, name)
		l = l.Resolve(sh, rows)
		args = append(args, int64(l.Group), int64(l.Head), int64(l.Row))
	}
	return args
}

// AttentionForward runs ember_attention_fwd_dD (ember_attention_bf16_fwd_d64
// under autocast): a block per 64 queries of a head, the heaviest causal
// tiles first.
func (b *Backend) AttentionForward(out, lse, q, k, v tensor.Buffer, sh tensor.AttentionShape, drop tensor.AttentionDropout) {
	const op = "attention"
	tail := b.attnArgs(op, sh, drop, map[string]tensor.Buffer{"out": out, "lse": lse, "q": q, "k": k, "v": v})
	pq, pk, pv, kernels := b.attnInputs(op, sh, q, k, v)
	args := append([]any{b.f32(op, out), b.f32(op, lse), pq, pk, pv}, tail...)
	args = append(args, attnLayoutArgs(sh, "out", "q", "k", "v")...)
	if b.attnBF16(sh) {
		args = append(args, b.attnMask(op, sh, drop))
		b.launchGrid(op, b.kernel(kernels[0]), attnBF16Tiles(sh.T)*sh.Heads, attnBF16Threads, args...)
		return
	}
	grid := (sh.T + attnFwdRows - 1) / attnFwdRows * sh.Heads
	b.launchGrid(op, b.kernel(fmt.Sprintf("ember_attention_fwd_d%d", sh.D)), grid, attnFwdThreads, args...)
}

// AttentionBackward runs ember_attention_dq_dD (which also leaves each
// row's Σ dO·O in a workspace) and then ember_attention_dkv_dD, or their
// bfloat16 versions under autocast.
func (b *Backend) AttentionBackward(dq, dk, dv, q, k, v, out, lse, dout tensor.Buffer, sh tensor.AttentionShape, drop tensor.AttentionDropout) {
	const op = "attention_backward"
	tail := b.attnArgs(op, sh, drop, map[string]tensor.Buffer{"dq": dq, "dk": dk, "dv": dv, "q": q, "k": k, "v": v,
		"out": out, "lse": lse, "dout": dout})
	ws := b.workspace(op, 4*sh.Heads*sh.T)
	defer b.release(ws)
	delta := uintptr(ws.Ptr())
	pq, pk, pv, kernels := b.attnInputs(op, sh, q, k, v)
	pl, pg := b.f32(op, lse), b.f32(op, dout)
	dqArgs := append(append([]any{b.f32(op, dq), delta, pq, pk, pv, b.f32(op, out), pl, pg}, tail...),
		attnLayoutArgs(sh, "dq", "q", "k", "v", "out", "dout")...)
	dkvArgs := append(append([]any{b.f32(op, dk), b.f32(op, dv), pq, pk, pv, pl, delta, pg}, tail...),
		attnLayoutArgs(sh, "dk", "dv", "q", "k", "v", "dout")...)
	if b.attnBF16(sh) {
		// dO rounded to bfloat16 by the dQ kernel, dense, for the dK/dV
		// kernel's tiles (copied a tile ahead instead of rounded on the way).
		gb := b.workspace(op, 2*sh.Heads*sh.T*sh.D)
		defer b.release(gb)
		mask := b.attnMask(op, sh, drop)
		b.launchGrid(op, b.kernel(kernels[1]), attnBF16Tiles(sh.T)*sh.Heads, attnBF16Threads, append(dqArgs, mask, gb.Ptr())...)
		b.launchGrid(op, b.kernel(kernels[2]), attnBF16Tiles(sh.S)*sh.Heads, attnBF16Threads, append(dkvArgs, mask, gb.Ptr())...)
		return
	}
	grid := (sh.T + attnBwdRows - 1) / attnBwdRows * sh.Heads
	b.launchGrid(op, b.kernel(fmt.Sprintf("ember_attention_dq_d%d", sh.D)), grid, attnBwdThreads, dqArgs...)
	grid = (sh.S + attnBwdRows - 1) / attnBwdRows * sh.Heads
	b.launchGrid(op, b.kernel(fmt.Sprintf("ember_attention_dkv_d%d", sh.D)), grid, attnBwdThreads, dkvArgs...)
}

// AttentionTakeState copies a device generator's state into saved and
// advances it (one thread, ordered on the stream before the attention
// kernels that read saved), so that a captured graph draws new weights on
// every replay.
func (b *Backend) AttentionTakeState(saved, state tensor.Buffer, blocks uint64) {
	b.takeRandomState("attention_take_state", saved, state, blocks)
}

var (
	_ tensor.AttentionBackend           = (*Backend)(nil)
	_ tensor.AttentionBF16InputsBackend = (*Backend)(nil)
	_ tensor.AttentionMaskBackend       = (*Backend)(nil)
)
