package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ember-ml/ember/data"
	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// fixture is a directory with an (untrained) LeNet checkpoint and images.
type fixture struct {
	dir, model string
	images     []string
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := t.TempDir()
	f := &fixture{dir: dir, model: filepath.Join(dir, "lenet.safetensors")}
	if err := nn.SaveFile(f.model, models.NewLeNet(tensor.CPU, 1), nil); err != nil {
		t.Fatal(err)
	}
	transparent := image.NewNRGBA(image.Rect(0, 0, 70, 50))
	d := drawDigit(70, 50, false)
	for i, v := range d.Pix {
		if v == 0 {
			transparent.Pix[4*i+3] = 255 // black, opaque ink
		}
	}
	f.images = []string{
		writeFile(t, dir, "mnist-like.png", encodePNG(t, drawDigit(28, 28, true))),
		writeFile(t, dir, "paper.png", encodePNG(t, drawDigit(120, 90, false))),
		writeFile(t, dir, "photo.jpg", encodeJPEG(t, drawDigit(64, 64, false))),
		writeFile(t, dir, "chalk.jpeg", encodeJPEG(t, drawDigit(33, 47, true))),
		writeFile(t, dir, "transparent.png", encodePNG(t, transparent)),
	}
	return f
}

func runPredict(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return code, o.String(), e.String()
}

var lineRE = regexp.MustCompile(`^(.+): ([0-9]) \(([0-9]+\.[0-9]{2})%\)$`)

func TestClassifyText(t *testing.T) {
	f := newFixture(t)
	code, out, errOut := runPredict(append([]string{"--model", f.model}, f.images...)...)
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != len(f.images) {
		t.Fatalf("%d lines for %d images:\n%s", len(lines), len(f.images), out)
	}
	for i, l := range lines {
		m := lineRE.FindStringSubmatch(l)
		if m == nil || m[1] != f.images[i] {
			t.Errorf("line %q, want %q: D (PP.PP%%)", l, f.images[i])
		}
	}
	// Classifying a file alone gives the same line as in a batch.
	for i, file := range f.images {
		if got := prepLine(t, f, file); got != lines[i] {
			t.Errorf("alone %q, in a batch %q", got, lines[i])
		}
	}
}

// prepLine classifies one file alone.
func prepLine(t *testing.T, f *fixture, file string) string {
	code, out, errOut := runPredict("--model", f.model, file)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	return strings.TrimSuffix(out, "\n")
}

func TestClassifyJSONAndFlagOrder(t *testing.T) {
	f := newFixture(t)
	// Flags after the file names, and a small batch size.
	args := append(append([]string{}, f.images...), "--json", "--batch-size", "2", "--model", f.model)
	code, out, errOut := runPredict(args...)
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	dec := json.NewDecoder(strings.NewReader(out))
	for i := range f.images {
		var r struct {
			File          string
			Digit         int
			Probability   float64
			Probabilities []float64
		}
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		var sum float64
		best := 0
		for j, p := range r.Probabilities {
			sum += p
			if p > r.Probabilities[best] {
				best = j
			}
		}
		if r.File != f.images[i] || len(r.Probabilities) != 10 || r.Digit != best ||
			r.Probability != r.Probabilities[r.Digit] || math.Abs(sum-1) > 1e-5 {
			t.Errorf("line %d: %+v", i, r)
		}
		// Same answer as the text output.
		want := fmt.Sprintf("%s: %d (%.2f%%)", r.File, r.Digit, 100*float32(r.Probability))
		if got := prepLine(t, f, r.File); got != want {
			t.Errorf("text %q, JSON %q", got, want)
		}
	}
	if dec.More() {
		t.Error("extra output")
	}
	// "--" ends the flags: a file named like a flag.
	weird := writeFile(t, f.dir, "-json", encodePNG(t, drawDigit(28, 28, true)))
	if code, out, errOut := runPredict("--model", f.model, "--", weird); code != 0 || !strings.HasPrefix(out, weird+": ") {
		t.Errorf("after --: exit %d, %q, %q", code, out, errOut)
	}
}

func TestErrors(t *testing.T) {
	f := newFixture(t)
	garbage := writeFile(t, f.dir, "garbage.safetensors", []byte("\x10\x00\x00\x00\x00\x00\x00\x00{not json}      "))
	other := filepath.Join(f.dir, "linear.safetensors")
	if err := nn.SaveFile(other, nn.NewSequential(nn.NewLinear(tensor.CPU, nil, 784, 10)), nil); err != nil {
		t.Fatal(err)
	}
	notImage := writeFile(t, f.dir, "notes.png", []byte("just text"))
	missing := filepath.Join(f.dir, "missing.safetensors")
	img := f.images[0]
	cases := []struct {
		args []string
		want []string // stderr lines, by substring
		out  int      // lines on stdout: the images that could be read
	}{
		{[]string{"--model", missing, img}, []string{"predict: " + missing + ": no such file or directory (train a model with: train --save " + missing + ")"}, 0},
		{[]string{"--model", garbage, img}, []string{"predict: " + garbage + ": header is not a JSON object"}, 0},
		{[]string{"--model", other, img}, []string{"predict: " + other + `: does not fit the model: missing tensors "conv1.weight"`}, 0},
		{[]string{"--model", f.model, img, notImage, "nowhere.png"}, []string{
			"predict: " + notImage + ": not a PNG, JPEG or GIF image",
			"predict: nowhere.png: no such file or directory"}, 1},
		{[]string{"--model", f.model, "--device", "cuda", img}, []string{"predict: --device cuda: "}, 0},
		{[]string{"--model", f.model, "--device", "tpu", img}, []string{`predict: --device tpu: unknown device "tpu"`}, 0},
		{[]string{"--bogus"}, []string{"predict: flag provided but not defined: -bogus (see predict -h)"}, 0},
		{[]string{"--batch-size", "0", img}, []string{"predict: --batch-size 0: want a positive number"}, 0},
		{[]string{"--invert", "maybe", img}, []string{`predict: --invert "maybe": want auto, yes or no`}, 0},
		{[]string{"--data", f.dir, img}, []string{"predict: --data is for evaluating on MNIST"}, 0},
		{[]string{"--model", f.model, "--data", filepath.Join(f.dir, "no-such-dir")}, []string{"predict: " + filepath.Join(f.dir, "no-such-dir") + ": directory given by --data does not exist"}, 0},
	}
	for _, c := range cases {
		code, out, errOut := runPredict(c.args...)
		lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
		if code != exitUsage || strings.Count(out, "\n") != c.out || len(lines) != len(c.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2, %d stdout and %d stderr lines", c.args, code, out, errOut, c.out, len(c.want))
			continue
		}
		for i, w := range c.want {
			if !strings.HasPrefix(lines[i], w) {
				t.Errorf("%q: stderr line %q, want %q...", c.args, lines[i], w)
			}
		}
		if strings.Contains(errOut, "goroutine") || strings.Contains(errOut, "panic") {
			t.Errorf("%q: stack trace: %s", c.args, errOut)
		}
	}
	if code, out, _ := runPredict("-h"); code != 0 || !strings.Contains(out, "usage: predict") {
		t.Errorf("-h: exit %d, %q", code, out)
	}
}

// writeFakeMNIST writes the four MNIST files (raw IDX) with n test images
// drawn from a few patterns, and returns the test images and labels.
func writeFakeMNIST(t *testing.T, dir string, n int) ([]uint8, []uint8) {
	imgs := make([]uint8, n*784)
	labels := make([]uint8, n)
	for i := range n {
		labels[i] = uint8(i % 10)
		d := drawDigit(28, 28, true)
		if i%3 == 1 {
			for j := range d.Pix {
				d.Pix[j] /= 2
			}
		}
		d.SetGray(i%28, (i*7)%28, color.Gray{255})
		copy(imgs[i*784:], d.Pix)
	}
	idx := func(magic uint32, dims []uint32, data []uint8) []byte {
		b := binary.BigEndian.AppendUint32(nil, magic)
		for _, d := range dims {
			b = binary.BigEndian.AppendUint32(b, d)
		}
		return append(b, data...)
	}
	writeFile(t, dir, "train-images-idx3-ubyte", idx(0x803, []uint32{2, 28, 28}, imgs[:2*784]))
	writeFile(t, dir, "train-labels-idx1-ubyte", idx(0x801, []uint32{2}, labels[:2]))
	writeFile(t, dir, "t10k-images-idx3-ubyte", idx(0x803, []uint32{uint32(n), 28, 28}, imgs))
	writeFile(t, dir, "t10k-labels-idx1-ubyte", idx(0x801, []uint32{uint32(n)}, labels))
	return imgs, labels
}

func TestEvaluateOnTestSet(t *testing.T) {
	f := newFixture(t)
	dataDir := filepath.Join(f.dir, "mnist")
	if err := os.Mkdir(dataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	const n = 37
	imgs, labels := writeFakeMNIST(t, dataDir, n)
	m, err := models.LoadLeNet(f.model, tensor.CPU)
	if err != nil {
		t.Fatal(err)
	}
	acc, loss, err := models.Evaluate(m, tensor.CPU, imgs, labels, n, 1000)
	if err != nil {
		t.Fatal(err)
	}

	code, out, errOut := runPredict("--model", f.model, "--data", dataDir, "--batch-size", "8")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if want := fmt.Sprintf("test accuracy %.2f%%\n", 100*acc); out != want {
		t.Errorf("stdout %q, want %q", out, want)
	}
	if !strings.Contains(errOut, fmt.Sprintf("on %d test images", n)) || !strings.Contains(errOut, "mean loss") {
		t.Errorf("stderr %q", errOut)
	}

	code, out, errOut = runPredict("--model", f.model, "--data", dataDir, "--json")
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r struct {
		Images       int
		TestAccuracy float64 `json:"test_accuracy"`
		MeanLoss     float64 `json:"mean_loss"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v: %q", err, out)
	}
	if r.Images != n || r.TestAccuracy != acc || math.Abs(r.MeanLoss-loss) > 1e-4 {
		t.Errorf("JSON %+v; want accuracy %g, loss %g", r, acc, loss)
	}
}

// TestArchOfAPyTorchStateDict: a state dict without ember's metadata (as
// PyTorch saves one) of a ResNet-9 loads with --arch resnet9 and
// classifies; without the flag it is taken for LeNet and refused, and a
// wrong --arch is refused by name.
func TestArchOfAPyTorchStateDict(t *testing.T) {
	f := newFixture(t)
	path := filepath.Join(f.dir, "resnet9.safetensors")
	m := models.NewResNet9(tensor.CPU, 1, models.DefaultResNet9Config())
	defer m.Release()
	if err := nn.SaveFile(path, m, nil); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runPredict("--model", path, "--arch", "resnet9", f.images[0])
	if code != 0 || !lineRE.MatchString(strings.TrimSuffix(out, "\n")) {
		t.Fatalf("--arch resnet9: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, _, errOut = runPredict("--model", path, f.images[0]); code != 2 || !strings.Contains(errOut, path) {
		t.Errorf("without --arch: exit %d, stderr %q; want 2 and the file named", code, errOut)
	}
	if code, _, errOut = runPredict("--model", path, "--arch", "resnet", f.images[0]); code != 2 || !strings.Contains(errOut, `--arch "resnet"`) {
		t.Errorf("--arch resnet: exit %d, stderr %q", code, errOut)
	}
}

// TestGenerateText: a GPT checkpoint (its vocabulary in the metadata)
// continues a prompt; image files or no prompt are refused, one line.
func TestGenerateText(t *testing.T) {
	dir := t.TempDir()
	v, err := data.NewVocab([]byte("abcdefgh \n"), data.ByteLevel, "corpus")
	if err != nil {
		t.Fatal(err)
	}
	cfg := models.Config{InputShape: []int{8}, Classes: v.Size()}
	m, err := models.New("gpt", tensor.CPU, cfg)
	if err != nil {
		t.Fatal(err)
	}
	meta, err := models.VocabMetadata(models.Metadata("gpt", cfg), v)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "gpt.safetensors")
	if err := nn.SaveFile(path, m, meta); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runPredict("--model", path, "--prompt", "abc", "--tokens", "6")
	if code != 0 || !strings.HasPrefix(out, "abc") || len(out) != len("abc")+6+1 {
		t.Fatalf("exit %d, stdout %q, stderr %q; want abc and 6 more bytes", code, out, errOut)
	}
	if _, again, _ := runPredict("--model", path, "--prompt", "abc", "--tokens", "6"); again != out {
		t.Errorf("greedy decoding differs between runs: %q and %q", out, again)
	}
	if code, _, errOut = runPredict("--model", path); code != 2 || !strings.Contains(errOut, "--prompt") {
		t.Errorf("no prompt: exit %d, %q", code, errOut)
	}
	if code, _, errOut = runPredict("--model", path, "--prompt", "xyz"); code != 2 || strings.Count(errOut, "\n") != 1 {
		t.Errorf("a prompt outside the vocabulary: exit %d, %q", code, errOut)
	}
}
