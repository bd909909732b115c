package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// train runs the command in-process and returns its exit status and output.
func train(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

var accuracyRE = regexp.MustCompile(`test accuracy (\d+\.\d+)%`)

// TestAcceptanceCPU trains LeNet on the first 4,000 real MNIST images for one
// epoch (62 steps) on the CPU and evaluates on all 10,000 test images. A
// correct implementation reaches about 90%; chance is 10%, and a broken
// gradient, update or data pipeline stays far below 85%.
func TestAcceptanceCPU(t *testing.T) {
	if testing.Short() {
		t.Skip("trains on real MNIST; skipped with -short")
	}
	save := filepath.Join(t.TempDir(), "lenet.safetensors")
	code, out, errOut := train(t, "--device", "cpu", "--limit", "4000", "--epochs", "1", "--save", save, "--log-interval", "1000")
	if code != exitOK {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	m := accuracyRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no test accuracy in output:\n%s", out)
	}
	acc, _ := strconv.ParseFloat(m[1], 64)
	t.Logf("test accuracy after 62 steps on 4,000 images: %.2f%%", acc)
	if acc < 85 {
		t.Errorf("test accuracy %.2f%%, want at least 85%%\n%s", acc, out)
	}
	if !strings.Contains(out, "MD5 verified") {
		t.Errorf("output does not say where the data came from:\n%s", out)
	}
	for _, f := range []string{save, nn.StatePath(save)} {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("checkpoint missing: %v", err)
		}
	}
}

func readParams(t *testing.T, path string) map[string][]float32 {
	t.Helper()
	f, err := nn.ReadSafetensorsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]float32{}
	for _, ti := range f.Tensors {
		v, err := f.Float32s(ti.Name)
		if err != nil {
			t.Fatal(err)
		}
		out[ti.Name] = v
	}
	return out
}

// TestResumeIsBitwise: on the CPU, two epochs in one run and one epoch, a
// resume, and a second epoch give bit-identical weights. The data order is a
// function of (seed, epoch), the momentum and step count are restored, and
// the CPU kernels are deterministic.
func TestResumeIsBitwise(t *testing.T) {
	dir := t.TempDir()
	common := []string{"--device", "cpu", "--limit", "640", "--test-limit", "200", "--log-interval", "1000"}
	once := filepath.Join(dir, "once.safetensors")
	if code, out, errOut := train(t, append(common, "--epochs", "2", "--save", once)...); code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	split := filepath.Join(dir, "split.safetensors")
	if code, out, errOut := train(t, append(common, "--epochs", "1", "--save", split)...); code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut := train(t, append(common, "--epochs", "2", "--resume", split, "--save", split)...)
	if code != 0 {
		t.Fatalf("resume: exit %d\n%s%s", code, out, errOut)
	}
	if !strings.Contains(out, "resume:") {
		t.Errorf("resume not reported:\n%s", out)
	}
	a, b := readParams(t, once), readParams(t, split)
	if len(a) != 8 || len(a) != len(b) {
		t.Fatalf("%d and %d tensors", len(a), len(b))
	}
	for name, va := range a {
		vb := b[name]
		for i := range va {
			if va[i] != vb[i] {
				t.Fatalf("%s[%d]: %v in one run, %v after resume", name, i, va[i], vb[i])
			}
		}
	}
}

// TestInterrupt runs train in a child process, sends SIGINT during the first
// epoch, and expects exit 130, a saved checkpoint, a resume hint, and a
// successful resume.
func TestInterrupt(t *testing.T) {
	if os.Getenv("EMBER_TRAIN_CHILD") != "" {
		return
	}
	dir := t.TempDir()
	save := filepath.Join(dir, "l.safetensors")
	cmd := exec.Command(os.Args[0], "-test.run", "TestTrainChild")
	cmd.Env = append(os.Environ(), "EMBER_TRAIN_CHILD=1", "EMBER_TRAIN_ARGS="+strings.Join([]string{
		"--device", "cpu", "--limit", "6400", "--test-limit", "200", "--epochs", "1", "--log-interval", "1", "--save", save}, "\x1f"))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Progress lines go to stderr when it is not a terminal; wait for the
	// device line on stdout, then for training to be under way.
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "device:") {
			break
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(stderr.String(), "step 3/") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	for sc.Scan() {
	}
	err = cmd.Wait()
	code := cmd.ProcessState.ExitCode()
	if code != exitInterrupted {
		t.Fatalf("exit %d (%v), want %d\nstderr:\n%s", code, err, exitInterrupted, stderr.String())
	}
	if !strings.Contains(stderr.String(), "resume with: train --resume "+save) {
		t.Errorf("no resume hint:\n%s", stderr.String())
	}
	code, out, errOut := train(t, "--device", "cpu", "--limit", "6400", "--test-limit", "200", "--epochs", "1", "--log-interval", "1000", "--resume", save, "--save", save)
	if code != 0 {
		t.Fatalf("resume after interrupt: exit %d\n%s%s", code, out, errOut)
	}
	if !regexp.MustCompile(`resume: .* at epoch 1, step [1-9]`).MatchString(out) {
		t.Errorf("resume did not continue mid-epoch:\n%s", out)
	}
}

// TestTrainChild is the child process of TestInterrupt and of the
// launcher's tests (a rank).
func TestTrainChild(t *testing.T) {
	if os.Getenv("EMBER_TRAIN_CHILD") == "" {
		t.Skip("child process of TestInterrupt")
	}
	ctx, stop := signalContext()
	defer stop()
	os.Exit(run(ctx, strings.Split(os.Getenv("EMBER_TRAIN_ARGS"), "\x1f"), os.Stdout, os.Stderr))
}

// TestNonFiniteLoss: a learning rate that blows the weights up stops training
// with the epoch and step, exit 1, and no checkpoint of the broken model.
func TestNonFiniteLoss(t *testing.T) {
	save := filepath.Join(t.TempDir(), "l.safetensors")
	code, out, errOut := train(t, "--device", "cpu", "--limit", "640", "--test-limit", "100", "--epochs", "1", "--lr", "1e30", "--log-interval", "1", "--save", save)
	if code != exitFailure {
		t.Fatalf("exit %d, want %d\n%s%s", code, exitFailure, out, errOut)
	}
	if !regexp.MustCompile(`train: loss is (NaN|\+Inf|-Inf) at epoch 1, step \d+;`).MatchString(errOut) {
		t.Errorf("message does not name the epoch and step:\n%s", errOut)
	}
	if _, err := os.Stat(save); err == nil {
		t.Errorf("a checkpoint of the diverged model was written")
	}
	// Checked every 5 steps, the message gives the range the bad step is in.
	code, out, errOut = train(t, "--device", "cpu", "--limit", "640", "--test-limit", "100", "--epochs", "1", "--lr", "1e30", "--log-interval", "5", "--save", save)
	if code != exitFailure || !regexp.MustCompile(`at epoch 1, (step 1;|a step from \d+ to \d+;)`).MatchString(errOut) {
		t.Errorf("exit %d\n%s%s", code, out, errOut)
	}
}

func writeIDX(t *testing.T, path string, magic uint32, dims []uint32, data []byte, gz bool) {
	t.Helper()
	var b bytes.Buffer
	binary.Write(&b, binary.BigEndian, magic)
	for _, d := range dims {
		binary.Write(&b, binary.BigEndian, d)
	}
	b.Write(data)
	raw := b.Bytes()
	if gz {
		var z bytes.Buffer
		w := gzip.NewWriter(&z)
		w.Write(raw)
		w.Close()
		raw = z.Bytes()
	}
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
}

// fakeMNIST writes a small valid data set in the MNIST layout.
func fakeMNIST(t *testing.T, dir string, nTrain, nTest int) {
	for _, s := range []struct {
		name string
		n    int
	}{{"train", nTrain}, {"t10k", nTest}} {
		writeIDX(t, filepath.Join(dir, s.name+"-images-idx3-ubyte.gz"), 0x803, []uint32{uint32(s.n), 28, 28}, make([]byte, s.n*784), true)
		writeIDX(t, filepath.Join(dir, s.name+"-labels-idx1-ubyte.gz"), 0x801, []uint32{uint32(s.n)}, make([]byte, s.n), true)
	}
}

// TestBadInput: each input problem is one line naming the file and the
// problem, exit 2, no stack trace.
func TestBadInput(t *testing.T) {
	cases := []struct {
		name  string
		setup func(dir string)
		want  string
	}{
		{"missing dir", func(dir string) { os.RemoveAll(dir) }, "does not exist"},
		{"truncated gz", func(dir string) {
			p := filepath.Join(dir, "train-images-idx3-ubyte.gz")
			b, _ := os.ReadFile(p)
			os.WriteFile(p, b[:len(b)/2], 0o644)
		}, "train-images-idx3-ubyte.gz"},
		{"wrong magic", func(dir string) {
			writeIDX(t, filepath.Join(dir, "train-labels-idx1-ubyte.gz"), 0xa01, []uint32{100}, make([]byte, 100), true)
		}, "magic"},
		{"count mismatch", func(dir string) {
			writeIDX(t, filepath.Join(dir, "train-labels-idx1-ubyte.gz"), 0x801, []uint32{99}, make([]byte, 99), true)
		}, "99"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "mnist")
			os.Mkdir(dir, 0o755)
			fakeMNIST(t, dir, 100, 20)
			c.setup(dir)
			code, out, errOut := train(t, "--device", "cpu", "--data", dir, "--save", filepath.Join(t.TempDir(), "l.safetensors"))
			if code != exitUsage {
				t.Fatalf("exit %d, want %d\n%s%s", code, exitUsage, out, errOut)
			}
			msg := strings.TrimSuffix(errOut, "\n")
			if strings.Contains(msg, "\n") || !strings.HasPrefix(msg, "train: ") || !strings.Contains(msg, c.want) {
				t.Errorf("want one line starting with \"train: \" mentioning %q, got:\n%s", c.want, errOut)
			}
			if strings.Contains(errOut, "goroutine") {
				t.Errorf("stack trace in output:\n%s", errOut)
			}
		})
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--epochs", "0"}, {"--batch-size", "-1"}, {"--device", "tpu"}, {"--memory-limit", "lots"}, {"extra"}} {
		code, _, errOut := train(t, args...)
		if code != exitUsage || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and one line", args, code, errOut)
		}
	}
}

// TestPrecisionFlag: --precision takes fp32, tf32 or bf16 (a clear error
// naming the flag otherwise), --tf32 is --precision tf32, and the two
// together must agree.
func TestPrecisionFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		want tensor.Precision
		err  string
	}{
		{nil, tensor.FP32, ""},
		{[]string{"--precision", "bf16"}, tensor.BF16, ""},
		{[]string{"--precision", "tf32"}, tensor.TF32, ""},
		{[]string{"--tf32"}, tensor.TF32, ""},
		{[]string{"--tf32", "--precision", "tf32"}, tensor.TF32, ""},
		{[]string{"--tf32", "--precision", "bf16"}, "", "--tf32 is --precision tf32"},
		{[]string{"--precision", "fp16"}, "", `--precision "fp16": want fp32, tf32 or bf16`},
	} {
		o, err := parseFlags(c.args, io.Discard)
		switch {
		case c.err != "":
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v: error %v, want one containing %q", c.args, err, c.err)
			}
		case err != nil:
			t.Errorf("%v: %v", c.args, err)
		case o.prec != c.want || o.tf32 != (c.want == tensor.TF32):
			t.Errorf("%v: precision %q, tf32 %v; want %q", c.args, o.prec, o.tf32, c.want)
		}
	}
	code, _, errOut := train(t, "--precision", "fp8")
	if code != exitUsage || !strings.Contains(errOut, "--precision") {
		t.Errorf("--precision fp8: exit %d, stderr %q; want exit 2 naming the flag", code, errOut)
	}
}

// TestDeviceCUDAWithoutGPU: asking for the GPU on a machine without one is a
// one-line error saying why, exit 2; auto falls back to the CPU and says so.
func TestDeviceCUDAWithoutGPU(t *testing.T) {
	reason := cuda.Available()
	if reason == nil {
		t.Skip("a GPU is available here")
	}
	dir := t.TempDir()
	fakeMNIST(t, dir, 128, 20)
	code, out, errOut := train(t, "--device", "cuda", "--data", dir, "--save", filepath.Join(dir, "l.safetensors"))
	if code != exitUsage || !strings.HasPrefix(errOut, "train: --device cuda: ") || strings.Count(errOut, "\n") != 1 {
		t.Errorf("exit %d, stderr %q\n%s", code, errOut, out)
	}
	code, out, errOut = train(t, "--data", dir, "--epochs", "1", "--save", filepath.Join(dir, "l.safetensors"))
	if code != 0 || !strings.Contains(out, "device: cpu (auto: no usable GPU: ") {
		t.Errorf("auto: exit %d\n%s%s", code, out, errOut)
	}
}

// TestResumeKeepsSettings: a resume takes back every recorded setting (the
// data set, --limit, --lr, --momentum, ...) unless the command line gives
// it again, says so, and refuses other data unless --allow-other-data.
func TestResumeKeepsSettings(t *testing.T) {
	dir := t.TempDir()
	small := filepath.Join(dir, "small")
	os.Mkdir(small, 0o755)
	fakeMNIST(t, small, 256, 20)
	save := filepath.Join(dir, "l.safetensors")
	code, out, errOut := train(t, "--device", "cpu", "--data", small, "--limit", "128", "--lr", "0.05", "--momentum", "0.5",
		"--epochs", "1", "--log-interval", "1000", "--save", save)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = train(t, "--device", "cpu", "--resume", save, "--epochs", "2", "--log-interval", "1000")
	if code != 0 {
		t.Fatalf("resume: exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"--batch-size 64", "--lr 0.05", "--momentum 0.5", "--limit 128", "--data " + small} {
		if !strings.Contains(out, want) {
			t.Errorf("resume does not say it uses %q:\n%s", want, out)
		}
	}
	if !strings.Contains(out, "resume: --epochs 2 from the command line (the checkpoint has 1)") {
		t.Errorf("the override is not reported:\n%s", out)
	}
	st, err := nn.ReadSafetensorsMetadata(nn.StatePath(save))
	if err != nil {
		t.Fatal(err)
	}
	if st["flag.lr"] != "0.05" || st["flag.momentum"] != "0.5" || st["flag.limit"] != "128" || st["epoch"] != "2" {
		t.Errorf("the resumed run recorded %v", st)
	}
	// Other data is refused, and taken with --allow-other-data.
	other := filepath.Join(dir, "other")
	os.Mkdir(other, 0o755)
	fakeMNIST(t, other, 300, 20)
	args := []string{"--device", "cpu", "--resume", save, "--epochs", "3", "--log-interval", "1000", "--data", other}
	code, out, errOut = train(t, args...)
	if code != exitUsage || !strings.Contains(errOut, "--allow-other-data") || strings.Count(errOut, "\n") != 1 {
		t.Errorf("other data: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = train(t, append(args, "--allow-other-data")...)
	if code != 0 || !strings.Contains(out, "as --allow-other-data says") {
		t.Errorf("--allow-other-data: exit %d\n%s%s", code, out, errOut)
	}
}

// TestOverwrite: --save refuses a file train did not write unless
// --overwrite, and replaces its own checkpoints without being asked.
func TestOverwrite(t *testing.T) {
	dir := t.TempDir()
	fakeMNIST(t, dir, 64, 20)
	save := filepath.Join(dir, "notes.safetensors")
	os.WriteFile(save, []byte("mine"), 0o644)
	args := []string{"--device", "cpu", "--data", dir, "--epochs", "1", "--log-interval", "1000", "--save", save}
	if code, _, errOut := train(t, args...); code != exitUsage || !strings.Contains(errOut, "not replacing it") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if b, _ := os.ReadFile(save); string(b) != "mine" {
		t.Fatal("the file was replaced")
	}
	if code, out, errOut := train(t, append(args, "--overwrite")...); code != 0 {
		t.Fatalf("--overwrite: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := train(t, args...); code != 0 {
		t.Fatalf("over its own checkpoint: exit %d\n%s%s", code, out, errOut)
	}
}

// TestOtherModelAndOptimizer: --model mlp --optimizer adamw --schedule
// cosine trains, records the architecture in the model file (so that
// models.LoadModel rebuilds it) and the settings in the state, resumes
// as an MLP, and refuses to resume it as another model.
func TestOtherModelAndOptimizer(t *testing.T) {
	dir := t.TempDir()
	fakeMNIST(t, dir, 128, 20)
	save := filepath.Join(dir, "mlp.safetensors")
	common := []string{"--device", "cpu", "--data", dir, "--log-interval", "1000"}
	code, out, errOut := train(t, append(common, "--model", "mlp", "--optimizer", "adamw", "--lr", "0.001", "--schedule", "cosine", "--epochs", "1", "--save", save)...)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	meta, err := nn.ReadSafetensorsMetadata(save)
	if err != nil {
		t.Fatal(err)
	}
	if meta["ember.model"] != "mlp" || meta["ember.model_config"] != `{"input_shape":[1,28,28],"classes":10}` {
		t.Errorf("model file metadata %v", meta)
	}
	m, name, err := models.LoadModel(save, tensor.CPU)
	if err != nil || name != "mlp" || len(nn.Parameters(m)) != 6 {
		t.Fatalf("LoadModel: %s, %v", name, err)
	}
	st, err := nn.ReadSafetensorsMetadata(nn.StatePath(save))
	if err != nil {
		t.Fatal(err)
	}
	if st["flag.optimizer"] != "adamw" || st["flag.schedule"] != "cosine" || st["flag.model"] != "mlp" {
		t.Errorf("state metadata %v", st)
	}
	code, out, errOut = train(t, append(common, "--resume", save, "--epochs", "2")...)
	if code != 0 || !strings.Contains(out, "--model mlp --dataset mnist --optimizer adamw --schedule cosine") {
		t.Fatalf("resume: exit %d\n%s%s", code, out, errOut)
	}
	code, _, errOut = train(t, append(common, "--resume", save, "--epochs", "3", "--model", "lenet")...)
	if code != exitUsage || !strings.Contains(errOut, "holds the model mlp; a resume continues the same model") {
		t.Errorf("resume as lenet: exit %d, %s", code, errOut)
	}
}

// TestDefaultSavePath: without --save the checkpoint is named after the
// model (lenet.safetensors for the default), and --save still wins; an
// empty --save is a usage error naming the flag.
func TestDefaultSavePath(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "lenet.safetensors"},
		{[]string{"--model", "mlp"}, "mlp.safetensors"},
		{[]string{"--model", "resnet9", "--save", "r9/run.safetensors"}, "r9/run.safetensors"},
	} {
		o, err := parseFlags(c.args, io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", c.args, err)
		}
		if o.save != c.want {
			t.Errorf("%v: save %q, want %q", c.args, o.save, c.want)
		}
	}
	if _, err := parseFlags([]string{"--save", ""}, io.Discard); err == nil || !strings.Contains(err.Error(), "--save") {
		t.Errorf("--save \"\": error %v, want one naming --save", err)
	}
}
