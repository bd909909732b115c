package models

import (
	"errors"
	"io/fs"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ember-ml/ember/data"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// syntheticDigits returns n 28×28 images (a bar at a position that depends
// on the index) and labels.
func syntheticDigits(n int) ([]uint8, []uint8) {
	imgs := make([]uint8, n*784)
	labels := make([]uint8, n)
	for i := range n {
		labels[i] = uint8(i % 10)
		col := 4 + 2*(i%10)
		for y := 4; y < 24; y++ {
			imgs[i*784+y*28+col] = 255
			imgs[i*784+y*28+col+1] = 180
		}
	}
	return imgs, labels
}

func normalised(imgs []uint8) []float32 {
	x := make([]float32, len(imgs))
	data.Normalize(x, imgs)
	return x
}

func TestLoadLeNetPredict(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lenet.safetensors")
	a := NewLeNet(tensor.CPU, 7)
	if err := nn.SaveFile(path, a, nil); err != nil {
		t.Fatal(err)
	}
	b, err := LoadLeNet(path, tensor.CPU)
	if err != nil {
		t.Fatal(err)
	}
	imgs, _ := syntheticDigits(5)
	x := tensor.FromFloat32(tensor.CPU, nil, normalised(imgs), 5, 1, 28, 28)
	defer x.Release()
	ca, pa, err := Predict(a, x)
	if err != nil {
		t.Fatal(err)
	}
	cb, pb, err := Predict(b, x)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ca, cb) || len(pa) != 5 {
		t.Fatalf("classes %v vs %v", ca, cb)
	}
	for i := range pa {
		if !slices.Equal(pa[i], pb[i]) {
			t.Fatalf("image %d: probabilities differ", i)
		}
		var sum float64
		best := 0
		for j, p := range pa[i] {
			sum += float64(p)
			if p > pa[i][best] {
				best = j
			}
		}
		if math.Abs(sum-1) > 1e-5 || best != ca[i] || len(pa[i]) != 10 {
			t.Errorf("image %d: probabilities %v sum to %g, class %d", i, pa[i], sum, ca[i])
		}
	}
	if x.Released() {
		t.Error("Predict released its input")
	}
}

func TestLoadLeNetErrors(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.safetensors")
	if _, err := LoadLeNet(missing, tensor.CPU); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing file: %v", err)
	}
	other := filepath.Join(dir, "other.safetensors")
	seq := nn.NewSequential(nn.NewLinear(tensor.CPU, nil, 784, 10))
	if err := nn.SaveFile(other, seq, nil); err != nil {
		t.Fatal(err)
	}
	_, err := LoadLeNet(other, tensor.CPU)
	if err == nil || !strings.Contains(err.Error(), other) || !strings.Contains(err.Error(), `missing tensors "conv1.weight"`) ||
		!strings.Contains(err.Error(), `unexpected tensors "0.weight", "0.bias"`) {
		t.Errorf("other model: %v", err)
	}
}

func TestEvaluate(t *testing.T) {
	m := NewLeNet(tensor.CPU, 3)
	const n = 23
	imgs, labels := syntheticDigits(n)
	acc, loss, err := Evaluate(m, tensor.CPU, imgs, labels, n, 5)
	if err != nil {
		t.Fatal(err)
	}
	acc2, loss2, err := Evaluate(m, tensor.CPU, imgs, labels, n, 0)
	if err != nil {
		t.Fatal(err)
	}
	if acc != acc2 || math.Abs(loss-loss2) > 1e-5 {
		t.Errorf("batch 5: %g, %g; one batch: %g, %g", acc, loss, acc2, loss2)
	}
	// Against Predict.
	x := tensor.FromFloat32(tensor.CPU, nil, normalised(imgs), n, 1, 28, 28)
	defer x.Release()
	classes, probs, err := Predict(m, x)
	if err != nil {
		t.Fatal(err)
	}
	correct := 0
	var want float64
	for i, c := range classes {
		if c == int(labels[i]) {
			correct++
		}
		want -= math.Log(float64(probs[i][labels[i]]))
	}
	want /= n
	if acc != float64(correct)/n || math.Abs(loss-want) > 1e-4 {
		t.Errorf("Evaluate: accuracy %g, loss %g; from Predict %g, %g", acc, loss, float64(correct)/n, want)
	}
	if a, l, err := Evaluate(m, tensor.CPU, nil, nil, 0, 10); a != 0 || l != 0 || err != nil {
		t.Error("empty evaluation")
	}
}

// TestWrongInputSize: LeNet on 32x32 images is an error saying what it
// takes, not 100 predictions for 64 images (a reshape to rows of 800).
func TestWrongInputSize(t *testing.T) {
	m := NewLeNet(tensor.CPU, 3)
	x := tensor.FromFloat32(tensor.CPU, nil, make([]float32, 64*32*32), 64, 1, 32, 32)
	defer x.Release()
	const want = "models: LeNet takes images [N, 1, 28, 28] (N >= 1, one channel, 28x28 pixels), not [64 1 32 32]"
	if c, _, err := Predict(m, x); err == nil || err.Error() != want || c != nil {
		t.Errorf("Predict: %d classes, %v", len(c), err)
	}
	if _, _, err := Evaluate(m, tensor.CPU, make([]uint8, 64*32*32), make([]uint8, 64), 64, 16); err == nil || err.Error() != want[:len(want)-len("[64 1 32 32]")]+"[16 1 32 32]" {
		t.Errorf("Evaluate: %v", err)
	}
	if _, _, err := Evaluate(m, tensor.CPU, make([]uint8, 100), make([]uint8, 3), 3, 16); err == nil || !strings.Contains(err.Error(), "want n square images") {
		t.Errorf("Evaluate of bad sizes: %v", err)
	}
	func() {
		defer func() {
			if r := recover(); r == nil || r != want {
				t.Errorf("Forward: panic %v, want %q", r, want)
			}
		}()
		m.Forward(x)
	}()
}
