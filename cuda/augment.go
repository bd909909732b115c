package cuda

import (
	"fmt"
	"math"

	"github.com/ember-ml/ember/tensor"
)

// AugmentGather gathers and augments a batch of uint8 images
// (tensor.AugmentBackend): one block of threads per sample, each thread
// drawing the sample's Philox words itself and writing a share of its
// pixels, with the CPU backend's integer decisions and float32 operations,
// so that the two produce the same bits. An index outside the source gives
// a sample of NaN.
func (b *Backend) AugmentGather(dst, src, idx, norm tensor.Buffer, spec tensor.AugmentSpec) {
	b.augmentGather("augment_gather", dst, src, idx, norm, tensor.Buffer{}, spec)
}

// AugmentGatherAt is AugmentGather with the seed and offset read from
// state by the kernel (tensor.AugmentBackend), for captured graphs.
func (b *Backend) AugmentGatherAt(dst, src, idx, norm, state tensor.Buffer, spec tensor.AugmentSpec) {
	b.augmentGather("augment_gather_at", dst, src, idx, norm, state, spec)
}

func (b *Backend) augmentGather(op string, dst, src, idx, norm, state tensor.Buffer, spec tensor.AugmentSpec) {
	if err := spec.Check(); err != nil {
		panic("cuda: " + op + ": " + err.Error())
	}
	image := spec.C * spec.H * spec.W
	if image > math.MaxInt32/2 {
		panic(fmt.Sprintf("cuda: %s: images of %d elements do not fit the kernel's 32-bit pixel index", op, image))
	}
	batch := idx.Len
	need(op, "dst", dst, batch*image)
	need(op, "norm", norm, 2*spec.C)
	if src.Len%image != 0 {
		panic(fmt.Sprintf("cuda: %s: source of %d bytes is not a whole number of %dx%dx%d images", op, src.Len, spec.C, spec.H, spec.W))
	}
	pd, ps, pi, pn := b.f32(op, dst), b.ptr(op, src, tensor.Uint8), b.i32(op, idx), b.f32(op, norm)
	var pst uintptr
	if !state.Empty() {
		need(op, "state", state, 4)
		pst = b.i32(op, state)
	}
	if batch == 0 {
		return
	}
	threads := min(blockSize, (image+31)/32*32)
	args := []any{pd, ps, pi, pn, int64(batch), int64(src.Len / image), int32(spec.C), int32(spec.H), int32(spec.W),
		int32(spec.Pad), int32(spec.Fill), spec.FlipProb, int32(spec.Cutout)}
	if pst != 0 {
		b.launchGrid(op, b.kernel("ember_augment_gather_state"), min(batch, maxGrid), threads, append(args, pst)...)
		return
	}
	b.launchGrid(op, b.kernel("ember_augment_gather"), min(batch, maxGrid), threads, append(args, int64(spec.Seed), int64(spec.Offset))...)
}
