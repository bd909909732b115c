package trainer_test

import (
	"bytes"
	"context"
	"math"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"testing"

	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/nn/trainer"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// TestTextWindows checks the windows a batch holds: non-overlapping, the
// targets the next tokens.
func TestTextWindows(t *testing.T) {
	tokens := make([]int32, 23)
	for i := range tokens {
		tokens[i] = int32(100 + i)
	}
	tx, err := trainer.NewText(tensor.CPU, tokens, 5, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Release()
	if tx.Len() != 4 { // (23-1)/5: the fifth window would need token 25
		t.Fatalf("Len %d; want 4", tx.Len())
	}
	tx.Load([]int32{3, 0})
	b := tx.Batch(nil)
	wantX := []int32{115, 116, 117, 118, 119, 100, 101, 102, 103, 104}
	wantY := []int32{116, 117, 118, 119, 120, 101, 102, 103, 104, 105}
	if !slices.Equal(b.Inputs.Shape(), []int{2, 5}) || !slices.Equal(b.Inputs.Int32s(), wantX) || !slices.Equal(b.Labels.Int32s(), wantY) {
		t.Errorf("batch %v %v, %v; want [2 5] %v, %v", b.Inputs.Shape(), b.Inputs.Int32s(), b.Labels.Int32s(), wantX, wantY)
	}
	if _, err := trainer.NewText(tensor.CPU, tokens, 5, 5); err == nil {
		t.Error("a batch of 5 of 4 windows was accepted")
	}
	if _, err := trainer.NewText(tensor.CPU, tokens, 0, 1); err == nil {
		t.Error("windows of 0 tokens were accepted")
	}
}

func tinyGPT(vocab int) *models.GPT {
	return models.NewGPT(tensor.CPU, 3, models.GPTConfig{Layers: 1, Heads: 2, Channels: 8, Context: 6, Vocab: vocab})
}

func randomTokens(n, vocab int) []int32 {
	tokens := make([]int32, n)
	for i := range tokens {
		tokens[i] = int32((i*7 + i*i/3) % vocab)
	}
	return tokens
}

// TestTextEvaluate compares Evaluate, in batches that do not divide the
// windows, with the GPT's own loss and an argmax per window.
func TestTextEvaluate(t *testing.T) {
	const vocab, context = 5, 6
	m := tinyGPT(vocab)
	defer m.Release()
	tokens := randomTokens(33, vocab) // 5 windows
	tx, err := trainer.NewText(tensor.CPU, tokens, context, 0)
	if err != nil {
		t.Fatal(err)
	}
	loss, acc, err := tx.Evaluate(tensor.CPU, m, 2)
	if err != nil {
		t.Fatal(err)
	}
	var wantLoss float64
	correct := 0
	for w := range 5 {
		x := tensor.FromInt32(tensor.CPU, nil, tokens[w*context:w*context+context], 1, context)
		y := tensor.FromInt32(tensor.CPU, nil, tokens[w*context+1:w*context+context+1], 1, context)
		wantLoss += float64(m.Loss(x, y).Item()) / 5
		logits := m.Forward(x).Float32s()
		for p := range context {
			row := logits[p*vocab : (p+1)*vocab]
			if int32(slices.Index(row, slices.Max(row))) == tokens[w*context+p+1] {
				correct++
			}
		}
	}
	wantAcc := 100 * float64(correct) / (5 * context)
	// float32 sums of 30 losses: 1e-5 relative.
	if math.Abs(loss-wantLoss) > 1e-5*wantLoss || math.Abs(acc-wantAcc) > 1e-9 {
		t.Errorf("Evaluate: loss %v, accuracy %v%%; want %v, %v%%", loss, acc, wantLoss, wantAcc)
	}
}

var trainLossRE = regexp.MustCompile(`train loss (\d+\.\d+)`)

// TestTextTrainsGPT runs the trainer on text windows with no Loss given:
// the GPT's own Loss (trainer.ModelLoss) is used, so the first epoch's
// loss, one step over all the windows before any update, is the model's
// loss on them; training then lowers it.
func TestTextTrainsGPT(t *testing.T) {
	const vocab = 5
	m := tinyGPT(vocab)
	defer m.Release()
	tokens := randomTokens(49, vocab) // 8 windows of 6
	tx, err := trainer.NewText(tensor.CPU, tokens, 6, 8)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Release()
	x := tensor.FromInt32(tensor.CPU, nil, tokens[:48], 8, 6)
	y := tensor.FromInt32(tensor.CPU, nil, tokens[1:49], 8, 6)
	before := float64(m.Loss(x, y).Item())
	adam, err := optim.NewAdamW(nn.Parameters(m), optim.AdamConfig{LR: 1e-2, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8})
	if err != nil {
		t.Fatal(err)
	}
	defer adam.Release()
	var log bytes.Buffer
	_, err = trainer.Run(context.Background(), trainer.Config{Model: m, Optimizer: adam, Data: tx, Epochs: 30, Seed: 1, Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	losses := trainLossRE.FindAllStringSubmatch(log.String(), -1)
	if len(losses) != 30 {
		t.Fatalf("%d epoch lines; want 30:\n%s", len(losses), log.String())
	}
	first, _ := strconv.ParseFloat(losses[0][1], 64)
	last, _ := strconv.ParseFloat(losses[29][1], 64)
	if math.Abs(first-before) > 1e-4 { // printed to 4 decimals
		t.Errorf("first epoch's loss %v; want the GPT's Loss %v", first, before)
	}
	if !(last < 0.8*first) {
		t.Errorf("loss %v after 30 steps, from %v: training does not learn", last, first)
	}
}

// TestTextRunLeavesNothingToTheCollector: a run on text windows puts every
// tensor of a step in the step's scope (the GPT's results follow its ids
// into it), so that nothing is left for the garbage collector.
func TestTextRunLeavesNothingToTheCollector(t *testing.T) {
	collect := func() {
		for range 3 {
			runtime.GC()
		}
	}
	collect()
	before := tensor.Leaks()
	func() {
		m := tinyGPT(5)
		defer m.Release()
		tx, err := trainer.NewText(tensor.CPU, randomTokens(49, 5), 6, 4)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Release()
		adam, err := optim.NewAdamW(nn.Parameters(m), optim.DefaultAdamWConfig())
		if err != nil {
			t.Fatal(err)
		}
		defer adam.Release()
		val, err := trainer.NewText(tensor.CPU, randomTokens(25, 5), 6, 0)
		if err != nil {
			t.Fatal(err)
		}
		cfg := trainer.Config{Model: m, Optimizer: adam, Data: tx, Epochs: 2, Seed: 1,
			Evaluate: func(m nn.Module) (float64, float64, error) { return val.Evaluate(tensor.CPU, m, 3) }}
		if _, err := trainer.Run(context.Background(), cfg); err != nil {
			t.Fatal(err)
		}
	}()
	collect()
	if n := tensor.Leaks() - before; n != 0 {
		t.Errorf("%d tensor storages left to the garbage collector", n)
	}
}
