package models_test

import (
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/ember-ml/ember/data"
	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/nn/trainer"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// writeCIFAR10 writes a CIFAR-10 directory in the real binary format:
// each record is a label byte and 3072 pixel bytes (1024 red, 1024 green,
// 1024 blue, row-major 32x32). The images are noise with a bright square
// whose corner depends on the class, so that a network can learn them.
func writeCIFAR10(t *testing.T, dir string, perFile int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(7, 8))
	record := func() []byte {
		r := make([]byte, 1+3072)
		y := rng.IntN(10)
		r[0] = byte(y)
		for i := 1; i < len(r); i++ {
			r[i] = byte(rng.IntN(64))
		}
		oy, ox := 4+(y/5)*14, 2+(y%5)*6
		for c := 0; c < 3; c++ {
			for dy := 0; dy < 8; dy++ {
				for dx := 0; dx < 5; dx++ {
					r[1+c*1024+(oy+dy)*32+ox+dx] = 250
				}
			}
		}
		return r
	}
	for _, name := range []string{"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin"} {
		var buf []byte
		for range perFile {
			buf = append(buf, record()...)
		}
		if err := os.WriteFile(filepath.Join(dir, name), buf, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCIFAR10EndToEnd: a CIFAR-10 directory in the binary format is read by
// data.LoadCIFAR10 and trains a (narrow) ResNet-9 with augmentation in the
// batch gather through trainer.Run, on the CPU; the test loss falls and
// the checkpoint loads back.
func TestCIFAR10EndToEnd(t *testing.T) {
	dir := t.TempDir()
	writeCIFAR10(t, dir, 32)
	train, test, err := data.LoadCIFAR10(dir)
	if err != nil {
		t.Fatal(err)
	}
	if train.N != 160 || test.N != 32 || train.NumChannels() != 3 || train.Rows != 32 {
		t.Fatalf("LoadCIFAR10: %d and %d images of %dx%dx%d", train.N, test.N, train.NumChannels(), train.Rows, train.Cols)
	}
	b := tensor.CPU
	cfg := models.DefaultResNet9Config()
	cfg.InChannels, cfg.Width = 3, 4
	m := models.NewResNet9(b, 1, cfg)
	defer m.Release()
	sgd, err := optim.NewSGD(nn.Parameters(m), optim.SGDConfig{LR: 0.05, Momentum: 0.9, Nesterov: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sgd.Release()
	src, err := trainer.NewImages(b, train, 16, 1/(255*0.25), -0.2/0.25)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Release()
	if err := src.SetAugmentation(&trainer.Augmentation{Pad: 2, FlipProb: 0.5, Mean: []float32{0.2, 0.2, 0.2}, Std: []float32{0.25, 0.25, 0.25}, Seed: 3}); err != nil {
		t.Fatal(err)
	}
	evalSet, err := trainer.NewImages(b, test, 0, 1/(255*0.25), -0.2/0.25)
	if err != nil {
		t.Fatal(err)
	}
	defer evalSet.Release()
	var losses []float64
	save := filepath.Join(t.TempDir(), "r9.safetensors")
	_, err = trainer.Run(context.Background(), trainer.Config{
		Model: m, Optimizer: sgd, Data: src, Epochs: 3, Seed: 1, LogInterval: 10,
		Evaluate: func(mm nn.Module) (float64, float64, error) {
			l, a, err := evalSet.Evaluate(mm, 16)
			losses = append(losses, l)
			return l, a, err
		},
		Checkpoint: save, ModelMetadata: models.Metadata("resnet9", models.Config{InputShape: []int{3, 32, 32}, Classes: 10}),
		Eager: true, Log: io.Discard, Progress: io.Discard,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(losses) != 3 || !(losses[2] < losses[0]) {
		t.Errorf("test losses per epoch %v: want a fall", losses)
	}
	// The checkpoint loads strictly into a fresh network of the same
	// shape, which then computes the trained one's logits.
	m2 := models.NewResNet9(b, 9, cfg)
	defer m2.Release()
	if err := nn.LoadFile(save, m2); err != nil {
		t.Fatal(err)
	}
	nn.SetTraining(m, false)
	nn.SetTraining(m2, false)
	s := tensor.NewNoGradScope()
	defer s.Release()
	x := tensor.FromFloat32(b, s, make([]float32, 2*3*32*32), 2, 3, 32, 32)
	want, got := m.Logits(x).Float32s(), m2.Logits(x).Float32s()
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("logit %d of the loaded network: %v, want %v", i, got[i], want[i])
		}
	}
}
