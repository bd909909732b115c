package cuda

import (
	"fmt"
	"testing"

	"github.com/ember-ml/ember/nn/nntest"
	"github.com/ember-ml/ember/tensor/tensortest"
)

// GPU tests of batch norm's two training paths and of batch norm with its
// activation; skipped without a GPU.

// newOnePassBackend is a backend that normalises in one launch wherever a
// channel fits in shared memory, whatever the number of channels (by
// default only from as many channels as SMs: the conformance cases have
// fewer, and take the split path).
func newOnePassBackend(t *testing.T) *Backend {
	b := newGPUBackend(t, BackendOptions{})
	b.bnOne.anyChannels = true
	if _, _, _, ok := b.bnOnePass(64, 3, 49); !ok {
		t.Fatalf("the one-pass batch norm is not available on %s (shared memory per block: %d bytes)", b.Name(), b.bnOne.bytes)
	}
	return b
}

// TestGPUBackendConformanceBNOnePass runs the conformance suite (its
// BatchNorm and BatchNormAct cases are the point) with the one-pass batch
// norm for any number of channels, in each of its forms (threads x loads
// in flight per thread).
func TestGPUBackendConformanceBNOnePass(t *testing.T) {
	for _, v := range [][2]int{{0, 8}, {512, 16}, {1024, 16}} {
		t.Run(fmt.Sprintf("%dx%d", v[0], v[1]), func(t *testing.T) {
			b := newOnePassBackend(t)
			b.bnOne.threads, b.bnOne.unroll = v[0], v[1]
			tensortest.RunBackend(t, b)
		})
	}
}

// TestGPUBatchNormOnePassShapes: the one-pass path takes the shapes it is
// for (ResNet-9's and airbench's 7x7 and 3x3 planes) and leaves those
// whose channels do not fit, or are too few, to the split path.
func TestGPUBatchNormOnePassShapes(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	for _, c := range []struct {
		n, c, inner int
		want        bool
	}{
		{512, 256, 49, true}, {1024, 256, 49, true}, {512, 512, 9, true}, {1024, 256, 9, true},
		{512, 128, 196, false}, {512, 64, 784, false}, {64, 3, 49, false},
	} {
		_, threads, shared, ok := b.bnOnePass(c.n, c.c, c.inner)
		t.Logf("[%d, %d, %d]: one pass %v (%d threads, %d bytes of %d)", c.n, c.c, c.inner, ok, threads, shared, b.bnOne.bytes)
		if ok != c.want {
			t.Errorf("[%d, %d, %d]: one pass %v, want %v", c.n, c.c, c.inner, ok, c.want)
		}
	}
}

// TestGPUBatchNormFusion: batch norm with its activation, fused against
// the layers one by one, bit for bit, on both training paths, in float32
// and under bfloat16 autocast.
func TestGPUBatchNormFusion(t *testing.T) {
	t.Run("split", func(t *testing.T) {
		nntest.RunBatchNormFusion(t, newGPUBackend(t, BackendOptions{NoBatchNormOnePass: true}))
	})
	t.Run("one pass", func(t *testing.T) { nntest.RunBatchNormFusion(t, newOnePassBackend(t)) })
}
