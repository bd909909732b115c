package cuda

import "github.com/ember-ml/ember/tensor"

func (b *Backend) Random(dst tensor.Buffer, dist tensor.Distribution, seed, offset uint64, lo, hi float32) {
	panic("cuda: Random not implemented yet")
}
