package tensor

import "fmt"

// AugmentSpec describes the per-sample augmentation of AugmentBackend's
// gather: for images of C×H×W bytes (stored CHW), a random crop of the
// image padded by Pad on every side (a translation by -Pad..Pad pixels,
// torch's RandomCrop(padding=Pad)), a horizontal flip with probability
// FlipProb, the per-channel normalisation out = float32(v)·scale[c] +
// shift[c], and a Cutout×Cutout square set to 0 (after normalisation,
// where 0 is the data's mean). Any of them is off at its zero value.
//
// Every random decision is an integer taken from Philox4x32-10 words, so
// that every backend makes the same decisions and, with the normalisation
// done as one float32 multiply then one add, produces the same bits. The
// layout, which every backend follows exactly:
//   - a sample's counter is ctr = Offset + idx (its index in the data set,
//     not its place in the batch, so that its augmentation does not depend
//     on the batch it falls in); take Offset = epoch·N (AugmentOffset) for
//     fresh draws every epoch;
//   - block k (0 or 1) of the sample is Philox4x32-10 of the counter words
//     (uint32(ctr), uint32(ctr>>32), k, 1) under key (seed low, seed high)
//     with the constants of backend_random.go; the last word 1 keeps these
//     counters apart from Random's, whose high words are 0;
//   - an integer in [0, n) from word w is (uint64(w)·n) >> 32;
//   - block 0 gives (w0, w1, w2, w3): the crop's top ty = [0, 2·Pad+1) of
//     w0 and left tx of w1, the flip when (w2>>8)·2⁻²⁴ < FlipProb (as a
//     Bernoulli draw of Random), the cutout's centre row cy = [0, H) of
//     w3; block 1's w0 gives the centre column cx = [0, W);
//   - output pixel (c, y, x) reads source row y + ty - Pad and column
//     x' + tx - Pad, where x' = W-1-x when flipped, else x (the flip of
//     the cropped image); a source outside the image reads Fill; the
//     value is normalised, then set to 0 when y lies in [cy - Cutout/2,
//     cy - Cutout/2 + Cutout) and x in the same range around cx.
type AugmentSpec struct {
	C, H, W int // channels, rows and columns of each image
	// Pad is the crop's translation range in pixels (0: no crop).
	Pad int
	// Fill is the byte read outside the image by a translated crop
	// (torch's fill, before normalisation).
	Fill uint8
	// FlipProb is the probability of a horizontal flip, in [0, 1].
	FlipProb float32
	// Cutout is the side of the square zeroed in each sample (0: none).
	Cutout int
	// Seed keys the generator; Offset is added to each sample's index to
	// form its counter (AugmentOffset).
	Seed, Offset uint64
}

// AugmentOffset is the Offset of epoch's draws for a data set of n
// samples: every (epoch, sample) pair gets its own counter.
func AugmentOffset(epoch, n int) uint64 { return uint64(epoch) * uint64(n) }

// Check reports a spec that no backend can run, naming the field.
func (s AugmentSpec) Check() error {
	switch {
	case s.C <= 0 || s.H <= 0 || s.W <= 0:
		return fmt.Errorf("augment: image size C=%d H=%d W=%d; want positive sizes", s.C, s.H, s.W)
	case s.Pad < 0 || s.Pad > s.H || s.Pad > s.W:
		return fmt.Errorf("augment: Pad %d; want 0 to the image's smaller side (%d)", s.Pad, min(s.H, s.W))
	case !(s.FlipProb >= 0 && s.FlipProb <= 1):
		return fmt.Errorf("augment: FlipProb %g; want a probability in [0, 1]", s.FlipProb)
	case s.Cutout < 0:
		return fmt.Errorf("augment: Cutout %d; want 0 (none) or a positive side", s.Cutout)
	}
	return nil
}

// AugmentBackend is implemented by backends that gather a batch of uint8
// images and augment each sample in the same pass (the CPU and CUDA
// backends), so that a data set kept on the device as bytes needs no host
// work per batch. AugmentGather uses it.
type AugmentBackend interface {
	// AugmentGather sets dst (float32 [len(idx), C, H, W]) to the images
	// src[idx[i]] (uint8 [N, C, H, W]) augmented as spec says; norm is
	// float32 [2·C]: the scales, then the shifts. idx is int32.
	AugmentGather(dst, src, idx, norm Buffer, spec AugmentSpec)
	// AugmentGatherAt is AugmentGather with the seed and offset read from
	// state, an int32 buffer of four words (seed low, seed high, offset
	// low, offset high 32 bits), in place of spec's, so that a captured
	// CUDA graph augments by whatever the host last wrote there (each
	// epoch's offset, SetAugmentState). The values are those of
	// AugmentGather at the same seed and offset.
	AugmentGatherAt(dst, src, idx, norm, state Buffer, spec AugmentSpec)
}

// Philox counter words of the augmentation (see AugmentSpec): block k of
// sample counter ctr.
func augmentCounter(ctr uint64, k uint32) [4]uint32 {
	return [4]uint32{uint32(ctr), uint32(ctr >> 32), k, 1}
}

// below maps a Philox word to [0, n) (n >= 1) by a 32×32→64-bit product.
func below(w uint32, n int) int { return int((uint64(w) * uint64(n)) >> 32) }

// GatherBackend is implemented by backends that form a float32 batch from
// uint8 rows on the device. Without it (Complete) GatherNormalize reads
// the indices and the chosen rows to the host, converts them there and
// uploads the batch: correct, but it waits for the device every batch.
// (The core has no arithmetic on bytes.)
type GatherBackend interface {
	// GatherNormalize sets row i of dst to src row idx[i] (uint8, rowLen
	// elements) times scale plus shift. idx is int32.
	GatherNormalize(dst, src, idx Buffer, rowLen int, scale, shift float32)
}
