package tensor

import "fmt"

// AugmentNorm returns the float32 [2, C] normalisation AugmentGather takes
// for bytes scaled to [0, 1] and then standardised per channel, as torch's
// ToTensor followed by Normalize(mean, std): scale[c] = 1/(255·std[c]) and
// shift[c] = -mean[c]/std[c].
func AugmentNorm(b Backend, s *Scope, mean, std []float32) *Tensor {
	if len(mean) != len(std) || len(mean) == 0 {
		panic(fmt.Sprintf("tensor: AugmentNorm of %d means and %d standard deviations", len(mean), len(std)))
	}
	c := len(mean)
	v := make([]float32, 2*c)
	for i := range mean {
		if !(std[i] > 0) {
			panic(fmt.Sprintf("tensor: AugmentNorm: std[%d] = %g; want > 0", i, std[i]))
		}
		v[i] = 1 / (255 * std[i])
		v[c+i] = -mean[i] / std[i]
	}
	return FromFloat32(b, s, v, 2, c)
}

// AugmentGather builds an augmented float32 batch [len(idx), C, H, W] from
// images, uint8 [N, C, H, W] (usually kept on the device for the whole
// run), with the samples idx (int32 [B]) cropped, flipped, normalised by
// norm (float32 [2, C]: AugmentNorm) and cut out as spec says, spec's C, H
// and W taken from images. The result depends only on (spec.Seed,
// spec.Offset, idx[i]) for each sample, and is the same bits on every
// backend. The backend must implement AugmentBackend.
func AugmentGather(s *Scope, images, idx, norm *Tensor, spec AugmentSpec) *Tensor {
	return augmentGather(s, images, idx, norm, nil, spec)
}

// AugmentGatherAt is AugmentGather with spec's Seed and Offset replaced by
// those in state (int32 [4]: NewAugmentState), read on the device when the
// gather runs: a training step captured in a CUDA graph then augments each
// epoch afresh once the host has written the epoch's offset
// (SetAugmentState) between replays.
func AugmentGatherAt(s *Scope, images, idx, norm, state *Tensor, spec AugmentSpec) *Tensor {
	if state.DType() != Int32 || state.Len() != 4 {
		panic(fmt.Sprintf("tensor: AugmentGatherAt: state is %s %v; want int32 [4] (NewAugmentState)", state.DType(), state.shape))
	}
	return augmentGather(s, images, idx, norm, state, spec)
}

// NewAugmentState returns the int32 [4] state of AugmentGatherAt holding
// seed and offset (the words: seed low, seed high, offset low, offset
// high 32 bits).
func NewAugmentState(b Backend, s *Scope, seed, offset uint64) *Tensor {
	return FromInt32(b, s, augmentStateWords(seed, offset), 4)
}

// SetAugmentState writes seed and offset into state (an upload, ordered
// after the work already queued).
func SetAugmentState(state *Tensor, seed, offset uint64) {
	if state.DType() != Int32 || state.Len() != 4 || !state.IsContiguous() {
		panic(fmt.Sprintf("tensor: SetAugmentState of %s %v; want int32 [4] (NewAugmentState)", state.DType(), state.shape))
	}
	state.st.b.Upload(state.buffer(), augmentStateWords(seed, offset))
}

func augmentStateWords(seed, offset uint64) []int32 {
	return []int32{int32(uint32(seed)), int32(uint32(seed >> 32)), int32(uint32(offset)), int32(uint32(offset >> 32))}
}

func augmentGather(s *Scope, images, idx, norm, state *Tensor, spec AugmentSpec) *Tensor {
	if images.DType() != Uint8 || len(images.shape) != 4 || idx.DType() != Int32 || len(idx.shape) != 1 {
		panic(fmt.Sprintf("tensor: AugmentGather of %s %v by %s %v; want uint8 [N, C, H, W] and int32 [B]",
			images.DType(), images.shape, idx.DType(), idx.shape))
	}
	if state != nil {
		sameBackend(images, idx, norm, state)
	} else {
		sameBackend(images, idx, norm)
	}
	spec.C, spec.H, spec.W = images.shape[1], images.shape[2], images.shape[3]
	if norm.DType() != Float32 || norm.Len() != 2*spec.C {
		panic(fmt.Sprintf("tensor: AugmentGather: norm is %s %v; want float32 [2, %d] (AugmentNorm)", norm.DType(), norm.shape, spec.C))
	}
	if err := spec.Check(); err != nil {
		panic("tensor: " + err.Error())
	}
	ab, ok := images.st.b.(AugmentBackend)
	if !ok {
		panic(fmt.Sprintf("tensor: AugmentGather: backend %s does not implement AugmentBackend", images.st.b.Name()))
	}
	images, idx, norm = images.Contiguous(), idx.Contiguous(), norm.Contiguous()
	out := Empty(images.st.b, s, idx.Len(), spec.C, spec.H, spec.W)
	if state != nil {
		ab.AugmentGatherAt(out.buffer(), images.buffer(), idx.buffer(), norm.buffer(), state.Contiguous().buffer(), spec)
	} else {
		ab.AugmentGather(out.buffer(), images.buffer(), idx.buffer(), norm.buffer(), spec)
	}
	return out
}
