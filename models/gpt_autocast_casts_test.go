package models_test

import (
	"math/rand/v2"
	"testing"

	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// castCountingCPU is the CPU backend counting its float32 → bfloat16
// casts (autocast's copies of the products' operands).
type castCountingCPU struct {
	tensor.CompleteBackend
	tensor.LowPrecisionBackend
	casts int
}

func (c *castCountingCPU) Cast(dst, src tensor.Buffer) {
	c.casts++
	c.LowPrecisionBackend.Cast(dst, src)
}

// TestGPTAutocastCastsPerStep: a bf16 training step of the GPT casts each
// operand of each product once, 3 casts per Linear (x and w forward, the
// incoming gradient backward; 6 when every product cast its own
// operands): 4 Linears per block and the head. The attention's products
// are the CPU's composed ones, BatchMatMuls of 3 casts each.
func TestGPTAutocastCastsPerStep(t *testing.T) {
	be := &castCountingCPU{CompleteBackend: tensor.CPU.(tensor.CompleteBackend), LowPrecisionBackend: tensor.CPU.(tensor.LowPrecisionBackend)}
	cfg := smallGPTConfig()
	cfg.Dropout = 0
	m := models.NewGPT(be, 1, cfg)
	defer m.Release()
	rng := rand.New(rand.NewPCG(3, 4))
	const b, tt = 2, 8
	ids, targets := gptBatch(rng, b, tt, cfg.Vocab)
	for step := range 2 {
		s := tensor.NewScope()
		s.SetAutocast(tensor.BFloat16)
		nn.ZeroGrad(m)
		be.casts = 0
		m.Loss(tensor.FromInt32(be, s, ids, b, tt), tensor.FromInt32(be, s, targets, b, tt)).Backward()
		// Linears 4 per block + head; the attention's two BatchMatMuls.
		want := 3*(4*cfg.Layers+1) + 3*2*cfg.Layers
		if be.casts != want {
			t.Errorf("step %d: %d casts, want %d", step, be.casts, want)
		}
		s.Release()
	}
}
