package nn

import (
	"fmt"
	"math/rand/v2"

	"github.com/ember-ml/ember/tensor"
)

// Embedding maps int32 ids [...] to rows of Weight [Num, Dim], giving
// [..., Dim], as nn.Embedding (without padding_idx or max_norm).
type Embedding struct{ Weight *tensor.Tensor }

// NewEmbedding returns a table of num rows of dim values on b, drawn from
// N(0, 1) as torch initialises it. A nil rng draws from a generator seeded
// with 1.
func NewEmbedding(b tensor.Backend, rng *rand.Rand, num, dim int) *Embedding {
	if num < 1 || dim < 1 {
		panic(fmt.Sprintf("nn: Embedding of %d rows of %d values; want at least one of each", num, dim))
	}
	rng = orDefault(rng)
	data := make([]float32, num*dim)
	for i := range data {
		data[i] = float32(rng.NormFloat64())
	}
	return &Embedding{Weight: tensor.FromFloat32(b, nil, data, num, dim).SetRequiresGrad(true)}
}

// Forward looks up the rows of ids, an int32 tensor of any shape.
func (e *Embedding) Forward(ids *tensor.Tensor) *tensor.Tensor {
	return tensor.Embedding(e.Weight, ids)
}
