package models_test

import (
	"math"
	"os"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// forwardRelease is one autocast step of a zoo model on a CountingCPU,
// in a scope that releases early or keeps everything.
func forwardRelease(t *testing.T, zc zooMemoryCase, release bool) recomputeStep {
	t.Helper()
	return runZooStep(t, zc, false, func(s *tensor.Scope) {
		s.SetAutocast(tensor.BFloat16)
		s.SetReleaseInBackward(release)
	})
}

// TestReleaseDuringForwardZoo: under autocast, in a scope that releases
// in backward, the zoo's models give back during the forward pass the
// float32 activations that no backward pass reads (tensor.ReleaseInput),
// so the forward pass ends lower than in a scope that keeps everything; every model's loss and
// gradients are the same bits either way. EMBER_MEMORY_ZOO=1 runs the
// zoo's sizes (a small batch), as TestRecomputeBlocksZoo.
func TestReleaseDuringForwardZoo(t *testing.T) {
	for _, zc := range zooMemoryCases(os.Getenv("EMBER_MEMORY_ZOO") == "1") {
		t.Run(zc.name, func(t *testing.T) {
			kept, released := forwardRelease(t, zc, false), forwardRelease(t, zc, true)
			if math.Float32bits(kept.loss) != math.Float32bits(released.loss) {
				t.Fatalf("loss %v releasing, %v keeping", released.loss, kept.loss)
			}
			for i := range kept.grads {
				for j := range kept.grads[i] {
					if math.Float32bits(kept.grads[i][j]) != math.Float32bits(released.grads[i][j]) {
						t.Fatalf("parameter %d element %d: gradient %v releasing, %v keeping", i, j, released.grads[i][j], kept.grads[i][j])
					}
				}
			}
			t.Logf("%s: after the forward pass %d -> %d B, peak %d -> %d B", zc.name, kept.forward, released.forward, kept.peak, released.peak)
			// What goes: the GPT's projections' outputs, its embeddings'
			// outputs and its last layer norm's (at the small sizes 92% of
			// what it keeps: its blocks' layer norms and GELU write their
			// products' bfloat16 operands, and its dropouts add the
			// residual in the same pass, so none of those makes a float32
			// output to keep or give back); the
			// convolution nets' pre-pooling convolution outputs (the
			// pooling reads its positions of the maxima) and batch norms'
			// outputs before a pooling.
			most := map[string]float64{"gpt": 0.93, "airbench": 0.75, "resnet9": 0.8}[zc.name]
			if most > 0 && float64(released.forward) > most*float64(kept.forward) {
				t.Errorf("the forward pass ends at %d B releasing, %d B keeping: want at most %.0f%%", released.forward, kept.forward, 100*most)
			}
			if released.peak > kept.peak {
				t.Errorf("peak %d B releasing, above the %d B keeping", released.peak, kept.peak)
			}
		})
	}
}
