package main

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ember-ml/ember/data"
	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// writeTinyText writes about 3 KB of words from a small vocabulary: enough
// windows of 16 tokens for a few steps and a validation set.
func writeTinyText(t *testing.T, path string) []byte {
	t.Helper()
	words := []string{"the", "cat", "sat", "on", "a", "mat", "dog", "ran"}
	rng := rand.New(rand.NewPCG(5, 6))
	var b strings.Builder
	for range 700 {
		b.WriteString(words[rng.IntN(len(words))])
		b.WriteByte(' ')
	}
	b.WriteString("é\n") // a two-byte symbol: the vocabulary is of bytes
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return []byte(b.String())
}

// gptArgs is a quick GPT run on the CPU: 8 training windows of 16 tokens in
// batches of 4 (two steps an epoch), 4 validation windows.
func gptArgs(text, save string, extra ...string) []string {
	return append([]string{"--device", "cpu", "--model", "gpt", "--dataset", "text", "--data", text, "--context", "16",
		"--batch-size", "4", "--limit", "8", "--test-limit", "4", "--epochs", "1", "--optimizer", "adamw", "--lr", "1e-3",
		"--clip-grad-norm", "1", "--save", save}, extra...)
}

// TestTrainGPTText trains the GPT for one epoch on a tiny text, checks
// that the checkpoint records its byte vocabulary and settings, and
// resumes it for a second epoch.
func TestTrainGPTText(t *testing.T) {
	dir := t.TempDir()
	textPath, save := filepath.Join(dir, "tiny.txt"), filepath.Join(dir, "gpt.safetensors")
	raw := writeTinyText(t, textPath)
	code, out, errOut := train(t, gptArgs(textPath, save)...)
	if code != exitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	m := accuracyRE.FindStringSubmatch(out)
	if m == nil || !strings.Contains(out, "(first 4 validation windows)") {
		t.Fatalf("no epoch line with a validation accuracy:\n%s", out)
	}
	meta, err := nn.ReadSafetensorsMetadata(save)
	if err != nil {
		t.Fatal(err)
	}
	v, err := models.VocabFromMetadata(save, meta)
	if err != nil {
		t.Fatal(err)
	}
	var want []rune
	for _, c := range raw {
		if !slices.Contains(want, rune(c)) {
			want = append(want, rune(c))
		}
	}
	slices.Sort(want)
	if v.Level() != data.ByteLevel || !slices.Equal(v.Symbols(), want) {
		t.Errorf("checkpoint vocabulary %s %v; want the file's %d distinct bytes %v", v.Level(), v.Symbols(), len(want), want)
	}
	name, cfg, err := models.FromMetadata(meta)
	if err != nil || name != "gpt" || !slices.Equal(cfg.InputShape, []int{16}) || cfg.Classes != len(want) {
		t.Errorf("checkpoint model %s %+v (%v); want gpt of context 16 over %d tokens", name, cfg, err, len(want))
	}
	st, err := models.LoadCheckpoint(save, mustModel(t, name, cfg))
	if err != nil {
		t.Fatal(err)
	}
	if st.Flags["context"] != "16" || st.Flags["clip-grad-norm"] != "1" || !strings.HasPrefix(st.Flags[dataIdentityKey], "text md5 ") {
		t.Errorf("training state flags %v; want context 16, clip-grad-norm 1 and the text's MD5", st.Flags)
	}

	code, _, errOut = train(t, "--device", "cpu", "--resume", save, "--epochs", "2", "--context", "32")
	if code != exitUsage || !strings.Contains(errOut, "holds a GPT of context 16") {
		t.Errorf("resume with another --context: exit %d, %q; want exit 2 naming the checkpoint's context", code, errOut)
	}
	code, out, errOut = train(t, "--device", "cpu", "--resume", save, "--epochs", "2")
	if code != exitOK || !strings.Contains(out, "epoch 2/2: train loss") || !strings.Contains(out, "--context 16") {
		t.Fatalf("resume: exit %d\n%s%s", code, out, errOut)
	}
	// The same path holding other text is other data.
	if err := os.WriteFile(textPath, append(raw, "more"...), 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = train(t, "--device", "cpu", "--resume", save, "--epochs", "3")
	if code != exitUsage || !strings.Contains(errOut, "--allow-other-data") {
		t.Errorf("resume on a changed text: exit %d, %q; want exit 2 naming --allow-other-data", code, errOut)
	}
}

func mustModel(t *testing.T, name string, cfg models.Config) nn.Module {
	t.Helper()
	m, err := models.New(name, tensor.CPU, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestTextBadInput: each mistake is one line naming the flag or file, exit 2.
func TestTextBadInput(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.txt")
	writeTinyText(t, good)
	empty, binary := filepath.Join(dir, "empty.txt"), filepath.Join(dir, "binary.txt")
	os.WriteFile(empty, nil, 0o644)
	os.WriteFile(binary, []byte{'a', 'b', 0, 0xff, 0xfe}, 0o644)
	save := filepath.Join(dir, "out.safetensors")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--device", "cpu", "--model", "gpt", "--dataset", "text"}, "--dataset text needs --data"},
		{gptArgs(filepath.Join(dir, "missing.txt"), save), "missing.txt"},
		{gptArgs(empty, save), "empty.txt"},
		{gptArgs(binary, save), "binary.txt: a NUL byte at offset 2: not text"},
		{gptArgs(good, save, "--context", "0"), "--context 0"},
		{gptArgs(good, save, "--clip-grad-norm", "-1"), "--clip-grad-norm -1"},
		{gptArgs(good, save, "--context", "4000"), "training windows of --context 4000"},
		{gptArgs(good, save, "--model", "lenet"), "--model lenet takes images"},
		{[]string{"--device", "cpu", "--model", "gpt"}, "gpt trains on --dataset text"},
		{[]string{"--device", "cpu", "--dataset", "cifar10"}, "--dataset cifar10 needs --data"},
		{[]string{"--device", "cpu", "--context", "8"}, "--context 8 applies to --dataset text only"},
	} {
		code, out, errOut := train(t, c.args...)
		msg := strings.TrimSuffix(errOut, "\n")
		if code != exitUsage || strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "train: ") || !strings.Contains(msg, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and one line with %q\n%s", c.args, code, errOut, c.want, out)
		}
	}
	if _, err := os.Stat(save); err == nil {
		t.Errorf("a failed run wrote %s", save)
	}
}

// writeTinyCIFAR10 writes the six files of CIFAR-10's binary format, n
// records each (a label byte, then 1024 red, 1024 green and 1024 blue
// bytes); the channels have different brightness so that their statistics
// differ.
func writeTinyCIFAR10(t *testing.T, dir string, n int) {
	t.Helper()
	rng := rand.New(rand.NewPCG(9, 10))
	for _, name := range []string{"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin"} {
		var buf []byte
		for range n {
			buf = append(buf, byte(rng.IntN(10)))
			for c := range 3 {
				for range 1024 {
					buf = append(buf, byte(c*60+rng.IntN(100)))
				}
			}
		}
		if err := os.WriteFile(filepath.Join(dir, name), buf, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTrainCIFAR10ResNet9 trains ResNet-9 for one epoch on a tiny CIFAR-10
// directory with --augment.
func TestTrainCIFAR10ResNet9(t *testing.T) {
	dir := t.TempDir()
	writeTinyCIFAR10(t, dir, 4)
	save := filepath.Join(dir, "r.safetensors")
	code, out, errOut := train(t, "--device", "cpu", "--model", "resnet9", "--dataset", "cifar10", "--data", dir, "--augment",
		"--epochs", "1", "--batch-size", "4", "--limit", "8", "--test-limit", "4", "--save", save)
	if code != exitOK || accuracyRE.FindStringSubmatch(out) == nil {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	meta, err := nn.ReadSafetensorsMetadata(save)
	if err != nil {
		t.Fatal(err)
	}
	if name, cfg, err := models.FromMetadata(meta); err != nil || name != "resnet9" || !slices.Equal(cfg.InputShape, []int{3, 32, 32}) {
		t.Errorf("checkpoint model %s %+v (%v); want resnet9 of [3, 32, 32]", name, cfg, err)
	}
}

// TestChannelStats checks the per-channel statistics against a direct
// computation on a two-image, two-channel set.
func TestChannelStats(t *testing.T) {
	d := &data.Dataset{N: 2, Rows: 1, Cols: 2, Channels: 2, Classes: 2,
		// image 0: channel 0 = 0, 255; channel 1 = 51, 51; image 1: channel 0 = 255, 0; channel 1 = 102, 102
		Images: []uint8{0, 255, 51, 51, 255, 0, 102, 102}, Labels: []uint8{0, 1}}
	means, stds := channelStats(d)
	// Channel 0: values 0, 1, 1, 0: mean 0.5, unbiased variance 1/3.
	// Channel 1: 0.2, 0.2, 0.4, 0.4: mean 0.3, unbiased variance 0.04/3.
	want := [][2]float64{{0.5, math.Sqrt(1.0 / 3)}, {0.3, math.Sqrt(0.04 / 3)}}
	for c, w := range want {
		if math.Abs(float64(means[c])-w[0]) > 1e-6 || math.Abs(float64(stds[c])-w[1]) > 1e-6 {
			t.Errorf("channel %d: mean %v, std %v; want %v, %v", c, means[c], stds[c], w[0], w[1])
		}
	}
}

// TestTrainCIFAR100 trains the MLP for one epoch on a tiny CIFAR-100
// directory (records of a coarse and a fine label byte, then the pixels):
// the model gets the 100 fine classes.
func TestTrainCIFAR100(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(11, 12))
	for _, name := range []string{"train.bin", "test.bin"} {
		var buf []byte
		for range 8 {
			buf = append(buf, byte(rng.IntN(20)), byte(rng.IntN(100)))
			for range 3072 {
				buf = append(buf, byte(rng.IntN(256)))
			}
		}
		if err := os.WriteFile(filepath.Join(dir, name), buf, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	save := filepath.Join(dir, "m.safetensors")
	code, out, errOut := train(t, "--device", "cpu", "--model", "mlp", "--dataset", "cifar100", "--data", dir,
		"--epochs", "1", "--batch-size", "4", "--save", save)
	if code != exitOK || !strings.Contains(out, "CIFAR-100") {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	meta, err := nn.ReadSafetensorsMetadata(save)
	if err != nil {
		t.Fatal(err)
	}
	if name, cfg, err := models.FromMetadata(meta); err != nil || name != "mlp" || cfg.Classes != 100 || !slices.Equal(cfg.InputShape, []int{3, 32, 32}) {
		t.Errorf("checkpoint model %s %+v (%v); want an MLP of [3, 32, 32] and 100 classes", name, cfg, err)
	}
}

// TestTrainRecompute: --recompute trains the GPT to the same losses as
// without (its blocks run again in the backward pass, dropout's masks
// drawn again where they were), and is refused for a model without
// blocks.
func TestTrainRecompute(t *testing.T) {
	dir := t.TempDir()
	textPath := filepath.Join(dir, "tiny.txt")
	writeTinyText(t, textPath)
	var lines, said [2]string
	for i, extra := range [][]string{nil, {"--recompute"}} {
		code, out, errOut := train(t, gptArgs(textPath, filepath.Join(dir, fmt.Sprintf("gpt%d.safetensors", i)), extra...)...)
		if code != exitOK {
			t.Fatalf("%v: exit %d\n%s%s", extra, code, out, errOut)
		}
		said[i] = out
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "train loss") { // the losses and accuracy, not the timing
				l = l[strings.Index(l, "train loss"):]
				lines[i] = l[:strings.Index(l, ")")+1]
			}
		}
	}
	if lines[0] == "" || lines[0] != lines[1] {
		t.Errorf("epoch with --recompute %q; without %q", lines[1], lines[0])
	}
	if !strings.Contains(said[1], "recompute: 6 blocks") || strings.Contains(said[0], "recompute:") {
		t.Errorf("the runs do not say what --recompute did:\n%s\n%s", said[0], said[1])
	}
	code, _, errOut := train(t, "--device", "cpu", "--model", "mlp", "--recompute", "--limit", "64", "--test-limit", "64", "--epochs", "1", "--save", filepath.Join(dir, "mlp.safetensors"))
	if code != exitUsage || !strings.Contains(errOut, "--recompute: --model mlp has no blocks") {
		t.Errorf("--recompute with the MLP: exit %d, %q; want exit 2 saying it has no blocks", code, errOut)
	}
}
