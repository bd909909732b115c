//go:build linux

package faults

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"hash/crc32"
	"image"
	"image/color"
	"image/png"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// Limits every case is held to: a command that runs longer is killed (a
// hang, say on a FIFO), and one whose resident memory peaks higher read
// something it should have refused (/dev/zero, a header's claim).
const (
	caseTimeout = 60 * time.Second
	maxRSS      = 1 << 30 // bytes
)

// Paths of the built commands and of the fixtures every case may use.
var (
	trainBin, predictBin string
	fixtures             string // directory of the files below
	goodData, otherData  string // fake MNIST directories (other labels in otherData)
	goodCkpt             string // a checkpoint train wrote, with its state beside it
	goodPNG              string
	bombPNG              string // 5000×5000 black pixels in a few KB
)

// TestMain builds the two commands once, into a temporary directory, and
// writes the fixtures: two tiny data sets in the MNIST layout, a checkpoint
// written by the built train, and an image.
func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "ember-faults-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		if err := setup(dir); err != nil {
			fmt.Fprintln(os.Stderr, "faults: setup:", err)
			return 1
		}
		return m.Run()
	}()
	os.RemoveAll(dir)
	os.Exit(code)
}

func setup(dir string) error {
	// go test puts its own Go's bin directory first on PATH.
	goTool, err := exec.LookPath("go")
	if err != nil {
		return err
	}
	build := exec.Command(goTool, "build", "-o", dir+string(filepath.Separator), "github.com/ember-ml/ember/cmd/train", "github.com/ember-ml/ember/cmd/predict")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	trainBin, predictBin = filepath.Join(dir, "train"), filepath.Join(dir, "predict")
	fixtures = filepath.Join(dir, "fixtures")
	goodData, otherData = filepath.Join(fixtures, "mnist"), filepath.Join(fixtures, "other")
	for _, d := range []string{goodData, otherData} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := writeMNIST(goodData, 128, 32, 28, 0); err != nil {
		return err
	}
	if err := writeMNIST(otherData, 128, 32, 28, 3); err != nil {
		return err
	}
	goodPNG = filepath.Join(fixtures, "seven.png")
	if err := os.WriteFile(goodPNG, digitPNG(), 0o644); err != nil {
		return err
	}
	bombPNG = filepath.Join(fixtures, "bomb.png")
	var bomb bytes.Buffer
	(&png.Encoder{CompressionLevel: png.BestSpeed}).Encode(&bomb, image.NewGray(image.Rect(0, 0, 5000, 5000)))
	if err := os.WriteFile(bombPNG, bomb.Bytes(), 0o644); err != nil {
		return err
	}
	goodCkpt = filepath.Join(fixtures, "ckpt.safetensors")
	cmd := exec.Command(trainBin, "--device", "cpu", "--data", goodData, "--limit", "64", "--batch-size", "64",
		"--test-limit", "32", "--epochs", "1", "--log-interval", "1000", "--lr", "0.05", "--momentum", "0.5", "--save", goodCkpt)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("train for the fixture checkpoint: %v\n%s", err, out)
	}
	return nil
}

// writeMNIST writes the four gzip-compressed files of an MNIST-layout data
// set of side×side images; shift changes the labels, so that two calls with
// different shifts give different data sets.
func writeMNIST(dir string, nTrain, nTest, side, shift int) error {
	for _, s := range []struct {
		name string
		n    int
	}{{"train", nTrain}, {"t10k", nTest}} {
		px := make([]byte, s.n*side*side)
		for i := range px {
			px[i] = byte(i * 7 % 251)
		}
		labels := make([]byte, s.n)
		for i := range labels {
			labels[i] = byte((i + shift) % 10)
		}
		if err := writeIDX(filepath.Join(dir, s.name+"-images-idx3-ubyte.gz"), 0x803, []uint32{uint32(s.n), uint32(side), uint32(side)}, px, true); err != nil {
			return err
		}
		if err := writeIDX(filepath.Join(dir, s.name+"-labels-idx1-ubyte.gz"), 0x801, []uint32{uint32(s.n)}, labels, true); err != nil {
			return err
		}
	}
	return nil
}

func writeIDX(path string, magic uint32, dims []uint32, payload []byte, gz bool) error {
	b := binary.BigEndian.AppendUint32(nil, magic)
	for _, d := range dims {
		b = binary.BigEndian.AppendUint32(b, d)
	}
	b = append(b, payload...)
	if gz {
		var z bytes.Buffer
		w := gzip.NewWriter(&z)
		w.Write(b)
		w.Close()
		b = z.Bytes()
	}
	return os.WriteFile(path, b, 0o644)
}

// digitPNG is a 28×28 "1", light on dark.
func digitPNG() []byte {
	img := image.NewGray(image.Rect(0, 0, 28, 28))
	for y := 4; y < 24; y++ {
		img.SetGray(14, y, color.Gray{255})
	}
	var b bytes.Buffer
	png.Encode(&b, img)
	return b.Bytes()
}

// hugePNG is a valid PNG header claiming side×side pixels.
func hugePNG(side uint32) []byte {
	b := digitPNG()
	binary.BigEndian.PutUint32(b[16:], side)
	binary.BigEndian.PutUint32(b[20:], side)
	binary.BigEndian.PutUint32(b[29:], crc32.ChecksumIEEE(b[12:29]))
	return b
}

// A fault is one run of a built command with a bad input.
type fault struct {
	name string
	cmd  string // "train" or "predict"
	// args, in which $D is the case's own directory (also the working
	// directory), $DATA and $OTHER the fixture data sets, $PNG the image,
	// $CKPT a copy of the fixture checkpoint in $D, $FIFO a named pipe in
	// $D.
	args []string
	// setup prepares $D further (broken copies of the fixtures, ...).
	setup func(t *testing.T, d string)
	code  int
	want  string // the error line contains this (and the command's name first); "": no error line
	// stdout is the number of lines expected on stdout, or -1 for any.
	stdout int
	// env is added to the command's environment (a launcher's variables).
	env []string
}

// trainArgs is a quick, valid training run on the fixture data with extra
// flags after it (a flag given twice takes the later value).
func trainArgs(extra ...string) []string {
	return append([]string{"--device", "cpu", "--data", "$DATA", "--limit", "64", "--batch-size", "64",
		"--test-limit", "32", "--epochs", "1", "--log-interval", "1000", "--save", "$D/out.safetensors"}, extra...)
}

// dataCopy copies the fixture data set into $D/data and returns it.
func dataCopy(t *testing.T, d string) string {
	dst := filepath.Join(d, "data")
	copyDir(t, goodData, dst)
	return dst
}

func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		copyFile(t, filepath.Join(src, e.Name()), filepath.Join(dst, e.Name()))
	}
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// replaceData sets $D/data/name to what put makes there, after removing it.
func replaceData(name string, put func(t *testing.T, path string)) func(t *testing.T, d string) {
	return func(t *testing.T, d string) {
		p := filepath.Join(dataCopy(t, d), name)
		os.Remove(p)
		put(t, p)
	}
}

func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o644); err != nil {
		t.Fatal(err)
	}
}

func symlink(target string) func(t *testing.T, path string) {
	return func(t *testing.T, path string) {
		if err := os.Symlink(target, path); err != nil {
			t.Fatal(err)
		}
	}
}

func writeBytes(b []byte) func(t *testing.T, path string) {
	return func(t *testing.T, path string) {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func idxFile(magic uint32, dims []uint32, payload []byte, gz bool) func(t *testing.T, path string) {
	return func(t *testing.T, path string) {
		if err := writeIDX(path, magic, dims, payload, gz); err != nil {
			t.Fatal(err)
		}
	}
}

// at writes put's file at $D/name.
func at(name string, put func(t *testing.T, path string)) func(t *testing.T, d string) {
	return func(t *testing.T, d string) { put(t, filepath.Join(d, name)) }
}

// editState rewrites the state file of $CKPT with change applied to its
// tensors (its metadata kept).
func editState(change func(ts []nn.NamedTensor)) func(t *testing.T, d string) {
	return func(t *testing.T, d string) {
		p := nn.StatePath(filepath.Join(d, "ckpt.safetensors"))
		f, err := nn.ReadSafetensorsFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var ts []nn.NamedTensor
		for _, ti := range f.Tensors {
			v, err := f.Float32s(ti.Name)
			if err != nil {
				t.Fatal(err)
			}
			ts = append(ts, nn.NamedTensor{Name: ti.Name, Shape: ti.Shape, Data: v})
		}
		change(ts)
		b, err := nn.EncodeSafetensors(ts, f.Metadata)
		if err != nil {
			t.Fatal(err)
		}
		writeBytes(b)(t, p)
	}
}

// editStateMeta rewrites the metadata of $CKPT's state file with change.
func editStateMeta(change func(d string, meta map[string]string)) func(t *testing.T, d string) {
	return func(t *testing.T, d string) {
		p := nn.StatePath(filepath.Join(d, "ckpt.safetensors"))
		f, err := nn.ReadSafetensorsFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var ts []nn.NamedTensor
		for _, ti := range f.Tensors {
			v, _ := f.Float32s(ti.Name)
			ts = append(ts, nn.NamedTensor{Name: ti.Name, Shape: ti.Shape, Data: v})
		}
		change(d, f.Metadata)
		b, err := nn.EncodeSafetensors(ts, f.Metadata)
		if err != nil {
			t.Fatal(err)
		}
		writeBytes(b)(t, p)
	}
}

// lenetFile writes a LeNet (seed 1) with change applied to its first
// parameter's values.
func lenetFile(change func(v []float32)) func(t *testing.T, path string) {
	return func(t *testing.T, path string) {
		m := models.NewLeNet(tensor.CPU, 1)
		p := m.Parameters()[0].Tensor
		v := p.Float32s()
		change(v)
		p.CopyFrom(v)
		if err := nn.SaveFile(path, m, nil); err != nil {
			t.Fatal(err)
		}
	}
}

func truncateHalf(t *testing.T, path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	writeBytes(b[:len(b)/2])(t, path)
}

// headerLie is a safetensors file whose length prefix claims a terabyte.
var headerLie = append(binary.LittleEndian.AppendUint64(nil, 1<<40), []byte(`{"a":`)...)

func faults() []fault {
	nan := float32(math.NaN())
	var cases []fault
	add := func(f ...fault) { cases = append(cases, f...) }

	// Flags of train.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--epochs", "0"}, "--epochs 0"},
		{[]string{"--batch-size", "-1"}, "--batch-size -1"},
		{[]string{"--lr", "NaN"}, "--lr NaN"},
		{[]string{"--lr", "inf"}, "--lr +Inf"},
		{[]string{"--lr", "-1"}, "--lr -1"},
		{[]string{"--lr", "abc"}, `invalid value "abc" for flag -lr`},
		{[]string{"--momentum", "1"}, "--momentum 1"},
		{[]string{"--momentum", "NaN"}, "--momentum NaN"},
		{[]string{"--device", "tpu"}, `--device "tpu"`},
		{[]string{"--gpu", "-1"}, "--gpu -1"},
		{[]string{"--gpu", "1"}, "--gpu 1 does not apply with --device cpu"},
		{[]string{"--memory-limit", "64MiB"}, "--memory-limit 64MiB does not apply with --device cpu"},
		{[]string{"--device", "auto", "--memory-limit", "lots"}, `--memory-limit "lots"`},
		{[]string{"--device", "auto", "--memory-limit", "NaN"}, `--memory-limit "NaN"`},
		{[]string{"--limit", "-5"}, "--limit -5"},
		{[]string{"--log-interval", "0"}, "--log-interval 0"},
		{[]string{"--save", ""}, "--save"},
		{[]string{"--bogus"}, "-bogus"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"--batch-size", "100"}, "--batch-size 100 is larger than the 64 training images"},
		{[]string{"--model", "resnet"}, `--model "resnet": want one of airbench, gpt, lenet, mlp, resnet9`},
		{[]string{"--dataset", "cifar"}, `--dataset "cifar": want mnist or fashion-mnist`},
		{[]string{"--optimizer", "lion"}, `--optimizer "lion": want sgd or adamw`},
		{[]string{"--schedule", "step"}, `--schedule "step": want none, onecycle or cosine`},
		{[]string{"--optimizer", "adamw", "--momentum", "0.5"}, "--momentum 0.5 does not apply with --optimizer adamw"},
		{[]string{"--dataset", "fashion-mnist", "--download"}, "--download fetches MNIST only"},
		{[]string{"--dataset", "fashion-mnist"}, "Fashion-MNIST"}, // $DATA holds other files than Fashion-MNIST's
		{[]string{"--resume", "$CKPT", "--model", "mlp"}, "--model mlp: the checkpoint $D/ckpt.safetensors holds the model lenet"},
	} {
		add(fault{name: "train flag " + strings.Join(c.args, " "), cmd: "train", args: trainArgs(c.args...), code: 2, want: c.want, stdout: -1})
	}

	// Data-parallel training: the launcher's flags, and the variables a
	// launcher (train --nproc-per-node, torchrun, srun) sets, when wrong.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--nproc-per-node", "-1"}, "--nproc-per-node -1: want a number of processes, 1 or more"},
		{[]string{"--nproc-per-node", "3"}, "--batch-size 64 is not a multiple of the 3 ranks"},
		{[]string{"--nproc-per-node", "2", "--nnodes", "2"}, "--nnodes 2: give --master-addr and --master-port"},
		{[]string{"--nproc-per-node", "2", "--master-port", "70000"}, "--master-port 70000: not a TCP port"},
		{[]string{"--master-addr", "node0"}, "apply with --nproc-per-node"},
		{[]string{"--nproc-per-node", "2", "--rank-env", "NCCL_HOSTID"}, "want NAME=VALUE"},
		{[]string{"--sync-bn"}, "--sync-bn applies to data-parallel training"},
	} {
		add(fault{name: "train flag " + strings.Join(c.args, " "), cmd: "train", args: trainArgs(c.args...), code: 2, want: c.want, stdout: 0})
	}
	for _, c := range []struct {
		env  []string
		args []string
		code int
		want string
	}{
		{[]string{"RANK=1", "WORLD_SIZE=2"}, nil, 2, "MASTER_ADDR is not set (world size 2 needs rank 0's address)"},
		{[]string{"RANK=one", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1"}, nil, 2, `RANK="one" is not an integer`},
		{[]string{"RANK=2", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1"}, nil, 2, "RANK=2 is outside WORLD_SIZE=2"},
		{[]string{"RANK=0"}, nil, 2, `RANK="0" and WORLD_SIZE="": a launcher sets both`},
		{[]string{"SLURM_PROCID=0"}, nil, 2, "SLURM_PROCID=0 is set but SLURM_NTASKS is not"},
		{[]string{"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=99999"}, nil, 2, "MASTER_PORT=99999 is not a TCP port"},
		{[]string{"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1"}, []string{"--batch-size", "63"}, 2, "--batch-size 63 is not a multiple of the world size 2"},
		{[]string{"RANK=0", "WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1", "EMBER_COMM=mpi"}, nil, 1, `EMBER_COMM="mpi": want nccl or tcp`},
		{[]string{"RANK=0", "WORLD_SIZE=1", "MASTER_ADDR=127.0.0.1", "EMBER_LAUNCHER=ember"}, []string{"--nproc-per-node", "2"}, 0, ""},
		{[]string{"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1"}, []string{"--nproc-per-node", "2"}, 2, "this process is already a rank of a launcher"},
		// A job of one rank (torchrun's variables, world size 1) trains.
		{[]string{"RANK=0", "WORLD_SIZE=1", "LOCAL_RANK=0", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500"}, nil, 0, ""},
	} {
		add(fault{name: "train env " + strings.Join(c.env, " ") + " " + strings.Join(c.args, " "), cmd: "train", args: trainArgs(c.args...), env: c.env, code: c.code, want: c.want, stdout: -1})
	}

	// Text for train's GPT: $D/in.txt is what setup writes there.
	gpt := func(name string, put func(t *testing.T, path string), want string, extra ...string) fault {
		args := append([]string{"--device", "cpu", "--model", "gpt", "--dataset", "text", "--data", "$D/in.txt", "--context", "8",
			"--batch-size", "2", "--epochs", "1", "--optimizer", "adamw", "--lr", "1e-3", "--save", "$D/out.safetensors"}, extra...)
		var setup func(t *testing.T, d string)
		if put != nil {
			setup = at("in.txt", put)
		}
		return fault{name: "train text " + name, cmd: "train", args: args, setup: setup, code: 2, want: want, stdout: -1}
	}
	someText := writeBytes(bytes.Repeat([]byte("to be or not to be\n"), 20))
	add(
		fault{name: "train text without --data", cmd: "train", args: []string{"--device", "cpu", "--model", "gpt", "--dataset", "text"}, code: 2, want: "--dataset text needs --data (a text file)", stdout: -1},
		gpt("missing file", nil, "$D/in.txt: no such file"),
		gpt("empty file", writeBytes(nil), "$D/in.txt: empty text"),
		gpt("binary garbage", writeBytes([]byte{0x7f, 'E', 'L', 'F', 2, 1, 1, 0, 0, 0xff, 0xfe}), "$D/in.txt: a NUL byte at offset 7: not text"),
		gpt("invalid UTF-8", writeBytes([]byte("abc\xff\xfedef")), "$D/in.txt: the bytes at offset 3 are not UTF-8"),
		gpt("is a directory", func(t *testing.T, p string) { os.Mkdir(p, 0o755) }, "$D/in.txt"),
		gpt("context 0", someText, "--context 0: want at least 1 token", "--context", "0"),
		gpt("clip-grad-norm -1", someText, "--clip-grad-norm -1: want a finite norm", "--clip-grad-norm", "-1"),
		gpt("clip-grad-norm NaN", someText, "--clip-grad-norm NaN", "--clip-grad-norm", "NaN"),
		gpt("context longer than the text", someText, "--batch-size 2 is larger than the 0 training windows of --context 1000 tokens", "--context", "1000"),
		gpt("lenet on text", someText, "--model lenet takes images", "--model", "lenet"),
		fault{name: "train gpt on images", cmd: "train", args: trainArgs("--model", "gpt"), code: 2, want: "--model gpt: --dataset mnist holds images", stdout: -1},
		fault{name: "train cifar10 without --data", cmd: "train", args: []string{"--device", "cpu", "--dataset", "cifar10"}, code: 2, want: "--dataset cifar10 needs --data", stdout: -1},
		fault{name: "train cifar10 in an MNIST directory", cmd: "train", args: trainArgs("--model", "resnet9", "--dataset", "cifar10"), code: 2, want: "data_batch_1.bin", stdout: -1},
	)

	// Data files of train.
	train := func(name string, setup func(t *testing.T, d string), want string) fault {
		return fault{name: "train data " + name, cmd: "train", args: trainArgs("--data", "$D/data"), setup: setup, code: 2, want: want, stdout: -1}
	}
	const images, labels = "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"
	add(
		train("missing directory", func(*testing.T, string) {}, "$D/data: directory given by --data does not exist"),
		train("is a file", at("data", writeBytes([]byte("x"))), "$D/data: given by --data is not a directory"),
		train("truncated gzip", func(t *testing.T, d string) { truncateHalf(t, filepath.Join(dataCopy(t, d), images)) }, images+": "),
		train("wrong magic", replaceData(labels, idxFile(0xa01, []uint32{128}, make([]byte, 128), true)), "bad magic 0x00000a01"),
		train("count mismatch", replaceData(labels, idxFile(0x801, []uint32{99}, make([]byte, 99), true)), "has 128 images but"),
		train("images file is a directory", replaceData(images, func(t *testing.T, p string) { os.Mkdir(p, 0o755) }), images+": is a directory, not a regular file"),
		train("images file is a FIFO", replaceData(images, mkfifo), images+": is a named pipe (FIFO), not a regular file"),
		train("images file is /dev/zero", replaceData(images, symlink("/dev/zero")), images+": is a character device, not a regular file"),
		train("labels file is /dev/full", replaceData(labels, symlink("/dev/full")), labels+": is a character device, not a regular file"),
		train("32x32 images", func(t *testing.T, d string) {
			os.Mkdir(filepath.Join(d, "data"), 0o755)
			if err := writeMNIST(filepath.Join(d, "data"), 64, 16, 32, 0); err != nil {
				t.Fatal(err)
			}
		}, "the images are 32x32; LeNet takes 28x28 images"),
		train("label out of range", replaceData(labels, idxFile(0x801, []uint32{128}, bytes.Repeat([]byte{10}, 128), true)), "label 10 at index 0 is out of range"),
		train("header claims 4 billion images", replaceData(images, idxFile(0x803, []uint32{0xffffffff, 28, 28}, nil, true)), "more than the 2147483648 bytes supported"),
		train("header claims 1.5 GB of a small file", func(t *testing.T, d string) {
			dir := dataCopy(t, d)
			idxFile(0x803, []uint32{2000000, 28, 28}, make([]byte, 1<<20), true)(t, filepath.Join(dir, images))
			idxFile(0x801, []uint32{2000000}, make([]byte, 128), true)(t, filepath.Join(dir, labels))
		}, "truncated: header says 2000000x28x28 images"),
		train("raw file truncated", replaceData(images, idxFile(0x803, []uint32{128, 28, 28}, make([]byte, 1000), false)), "truncated: header says 128x28x28 images (100352 bytes), file has 1000"),
		train("trailing bytes", replaceData(labels, idxFile(0x801, []uint32{128}, make([]byte, 130), true)), "2 trailing bytes"),
		train("empty file", replaceData(labels, writeBytes(nil)), "empty file, want an IDX file"),
		train("test images of another size", replaceData("t10k-images-idx3-ubyte.gz", idxFile(0x803, []uint32{32, 28, 20}, make([]byte, 32*28*20), true)), "images are 28x20 but those in"),
	)

	// Where train writes.
	out := func(name string, setup func(t *testing.T, d string), want string, args ...string) fault {
		return fault{name: "train output " + name, cmd: "train", args: trainArgs(args...), setup: setup, code: 2, want: want, stdout: 0}
	}
	add(
		out("--save /dev/full", nil, "--save /dev/full: the checkpoint cannot be written: /dev/full: is a character device", "--save", "/dev/full"),
		out("--save a directory", nil, "--save $D: the checkpoint cannot be written: $D: is a directory", "--save", "$D"),
		out("--save a FIFO", nil, "--save $FIFO: the checkpoint cannot be written: $FIFO: is a named pipe (FIFO)", "--save", "$FIFO"),
		out("--save below a file", at("file", writeBytes([]byte("x"))), "$D/file is a regular file, not a directory", "--save", "$D/file/l.safetensors"),
		out("--save in /proc", nil, "cannot create files in /proc", "--save", "/proc/l.safetensors"),
		out("--save over a user's file", at("notes.safetensors", writeBytes([]byte("my notes"))), "$D/notes.safetensors exists and is not a checkpoint written by train", "--save", "$D/notes.safetensors"),
		out("--save over a user's state file", at("l.state.safetensors", writeBytes([]byte("mine"))), "$D/l.state.safetensors exists and is not a checkpoint written by train", "--save", "$D/l.safetensors"),
		out("--save over a foreign model", at("m.safetensors", lenetFile(func([]float32) {})), "$D/m.safetensors exists and is not a checkpoint written by train", "--save", "$D/m.safetensors"),
		out("--metrics /dev/full", nil, "--metrics /dev/full: cannot be written: /dev/full: is a character device", "--metrics", "/dev/full"),
		out("--metrics a directory", nil, "--metrics $D: cannot be written: $D: is a directory", "--metrics", "$D"),
		out("--metrics a FIFO", nil, "--metrics $FIFO: cannot be written: $FIFO: is a named pipe (FIFO)", "--metrics", "$FIFO"),
		out("--metrics over a user's CSV", at("m.csv", writeBytes([]byte("a,b\n1,2\n"))), "--metrics $D/m.csv: exists and is not a metrics file written by train", "--metrics", "$D/m.csv"),
		out("--metrics is the checkpoint", nil, "--metrics $D/out.safetensors: is a checkpoint file of this run", "--metrics", "$D/out.safetensors"),
	)

	// Checkpoints given to --resume.
	resume := func(name string, setup func(t *testing.T, d string), want string, args ...string) fault {
		return fault{name: "train resume " + name, cmd: "train", args: trainArgs(append([]string{"--resume", "$CKPT"}, args...)...), setup: setup, code: 2, want: want, stdout: -1}
	}
	state := "$D/ckpt.state.safetensors"
	add(
		resume("missing file", func(t *testing.T, d string) { os.Remove(filepath.Join(d, "ckpt.safetensors")) }, "--resume $CKPT: $CKPT: no such file or directory"),
		resume("/dev/zero", nil, "--resume /dev/zero: /dev/zero: is a character device", "--resume", "/dev/zero"),
		resume("a FIFO", nil, "--resume $FIFO: $FIFO: is a named pipe (FIFO)", "--resume", "$FIFO"),
		resume("a directory", nil, "--resume $D: $D: is a directory", "--resume", "$D"),
		resume("no state beside it", func(t *testing.T, d string) { os.Remove(filepath.Join(d, "ckpt.state.safetensors")) }, state+": no such file"),
		resume("state is a FIFO", func(t *testing.T, d string) {
			os.Remove(filepath.Join(d, "ckpt.state.safetensors"))
			mkfifo(t, filepath.Join(d, "ckpt.state.safetensors"))
		}, state+": is a named pipe (FIFO)"),
		resume("truncated state", func(t *testing.T, d string) { truncateHalf(t, filepath.Join(d, "ckpt.state.safetensors")) }, state+": truncated"),
		resume("momentum holds NaN", editState(func(ts []nn.NamedTensor) { ts[len(ts)-1].Data[3] = nan }), state+`: tensor "optimizer.momentum" holds NaN at index 3`),
		resume("model file replaced", at("ckpt.safetensors", lenetFile(func([]float32) {})), "$CKPT: does not hold the weights saved with ckpt.state.safetensors"),
		resume("header length lie", at("ckpt.state.safetensors", writeBytes(headerLie)), state+": header length 1099511627776 is larger than the file"),
		resume("garbage state", at("ckpt.state.safetensors", writeBytes([]byte("just some text, not a checkpoint"))), state+": header length"),
		resume("other data", nil, "holds other data (md5:", "--data", "$OTHER"),
		resume("recorded lr overridden with NaN", nil, "--lr NaN", "--lr", "NaN"),
		resume("recorded lr is NaN", editStateMeta(func(_ string, m map[string]string) { m["flag.lr"] = "NaN" }), "--resume $CKPT: the recorded settings: --lr NaN"),
		fault{name: "train resume recorded batch size is not a number", cmd: "train", args: []string{"--device", "cpu", "--resume", "$CKPT"},
			setup: editStateMeta(func(_ string, m map[string]string) { m["flag.batch-size"] = "many" }), code: 2, stdout: -1,
			want: `records --batch-size "many", which is not a valid value`},
		fault{name: "train resume recorded data directory is gone", cmd: "train", args: []string{"--device", "cpu", "--resume", "$CKPT", "--epochs", "2"},
			setup: editStateMeta(func(d string, m map[string]string) { m["flag.data"] = filepath.Join(d, "gone") }), code: 2, stdout: -1,
			want: "$D/gone: directory given by --data does not exist (the data set $CKPT was trained on; give --data to use another)"},
	)

	// A diverging run: exit 1, and it names no checkpoint that does not exist.
	add(fault{name: "train diverges", cmd: "train", args: trainArgs("--limit", "192", "--lr", "1e30", "--log-interval", "1"), code: 1, want: "no checkpoint was saved", stdout: -1})

	// predict.
	model := func(name string, setup func(t *testing.T, d string), want string, path string) fault {
		return fault{name: "predict model " + name, cmd: "predict", args: []string{"--device", "cpu", "--model", path, "$PNG"}, setup: setup, code: 2, want: want, stdout: 0}
	}
	add(
		model("/dev/zero", nil, "/dev/zero: is a character device, not a regular file", "/dev/zero"),
		model("a FIFO", nil, "$FIFO: is a named pipe (FIFO), not a regular file", "$FIFO"),
		model("a directory", nil, "$D: is a directory, not a regular file", "$D"),
		model("missing", nil, "$D/none.safetensors: no such file or directory", "$D/none.safetensors"),
		model("garbage", at("g.safetensors", writeBytes([]byte("\x10\x00\x00\x00\x00\x00\x00\x00{not json}      "))), "$D/g.safetensors: header is not a JSON object", "$D/g.safetensors"),
		model("truncated", func(t *testing.T, d string) { truncateHalf(t, filepath.Join(d, "ckpt.safetensors")) }, "$CKPT: truncated", "$CKPT"),
		model("NaN weights", at("nan.safetensors", lenetFile(func(v []float32) { v[7] = nan })), `$D/nan.safetensors: tensor "conv1.weight" holds NaN at index 7`, "$D/nan.safetensors"),
		model("another model", at("lin.safetensors", func(t *testing.T, p string) {
			if err := nn.SaveFile(p, nn.NewLinear(tensor.CPU, nil, 784, 10), nil); err != nil {
				t.Fatal(err)
			}
		}), `$D/lin.safetensors: does not fit the model`, "$D/lin.safetensors"),
		model("header length lie", at("lie.safetensors", writeBytes(headerLie)), "$D/lie.safetensors: header length 1099511627776 is larger than the file", "$D/lie.safetensors"),
		model("an unknown architecture", at("gpt.safetensors", func(t *testing.T, p string) {
			if err := nn.SaveFile(p, nn.NewLinear(tensor.CPU, nil, 784, 10), map[string]string{"ember.model": "gpt-7"}); err != nil {
				t.Fatal(err)
			}
		}), `$D/gpt.safetensors: the model is a "gpt-7", which this program does not know`, "$D/gpt.safetensors"),
		model("a broken configuration", at("mlp.safetensors", func(t *testing.T, p string) {
			if err := nn.SaveFile(p, nn.NewLinear(tensor.CPU, nil, 784, 10), map[string]string{"ember.model": "mlp", "ember.model_config": `{"input_shape":[-1],"classes":10}`}); err != nil {
				t.Fatal(err)
			}
		}), `$D/mlp.safetensors: models: input shape [-1]: want positive sizes`, "$D/mlp.safetensors"),
	)
	img := func(name string, setup func(t *testing.T, d string), want string, path string) fault {
		return fault{name: "predict image " + name, cmd: "predict", args: []string{"--device", "cpu", "--model", "$CKPT", "$PNG", path}, setup: setup, code: 2, want: want, stdout: 1}
	}
	add(
		img("not an image", at("bad.png", writeBytes([]byte("just text"))), "$D/bad.png: not a PNG, JPEG or GIF image", "$D/bad.png"),
		img("a FIFO", nil, "$FIFO: is a named pipe (FIFO), not a regular file", "$FIFO"),
		img("/dev/zero", nil, "/dev/zero: is a character device, not a regular file", "/dev/zero"),
		img("a directory", nil, "$D: is a directory, not a regular file", "$D"),
		img("truncated PNG", at("half.png", func(t *testing.T, p string) { b := digitPNG(); writeBytes(b[:len(b)/2])(t, p) }), "$D/half.png: the PNG image is truncated", "$D/half.png"),
		img("100000x100000 pixels", at("huge.png", writeBytes(hugePNG(100000))), "$D/huge.png: the PNG image is 100000x100000, more than the limit", "$D/huge.png"),
		img("6000x6000 pixels", at("huge.png", writeBytes(hugePNG(6000))), "$D/huge.png: the PNG image is 6000x6000, more than the limit of 32 megapixels", "$D/huge.png"),
		// Within the limit a bomb is decoded, in bounded memory.
		fault{name: "predict image 25-megapixel PNG of 40 KB", cmd: "predict", args: []string{"--device", "cpu", "--model", "$CKPT", "$BOMB"}, code: 0, stdout: 1},
		img("missing", nil, "$D/none.png: no such file or directory", "$D/none.png"),
	)
	evalData := func(name string, setup func(t *testing.T, d string), want string) fault {
		return fault{name: "predict data " + name, cmd: "predict", args: []string{"--device", "cpu", "--model", "$CKPT", "--data", "$D/data"}, setup: setup, code: 2, want: want, stdout: 0}
	}
	add(
		evalData("32x32 images", func(t *testing.T, d string) {
			os.Mkdir(filepath.Join(d, "data"), 0o755)
			if err := writeMNIST(filepath.Join(d, "data"), 16, 16, 32, 0); err != nil {
				t.Fatal(err)
			}
		}, "test images are 32x32, LeNet needs 28x28"),
		evalData("test images are a FIFO", replaceData("t10k-images-idx3-ubyte.gz", mkfifo), "t10k-images-idx3-ubyte.gz: is a named pipe (FIFO), not a regular file"),
		evalData("test labels are /dev/zero", replaceData("t10k-labels-idx1-ubyte.gz", symlink("/dev/zero")), "t10k-labels-idx1-ubyte.gz: is a character device, not a regular file"),
	)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--batch-size", "0", "$PNG"}, "--batch-size 0"},
		{[]string{"--device", "tpu", "$PNG"}, "--device tpu"},
		{[]string{"--bogus"}, "-bogus"},
		{[]string{"--invert", "maybe", "$PNG"}, `--invert "maybe"`},
	} {
		add(fault{name: "predict flag " + strings.Join(c.args, " "), cmd: "predict", args: append([]string{"--model", "$CKPT"}, c.args...), code: 2, want: c.want, stdout: 0})
	}
	return cases
}

var progressLine = regexp.MustCompile(`^epoch \d+/\d+ step \d+/\d+ loss `)

// TestFaults runs every case of the table against the built commands.
func TestFaults(t *testing.T) {
	cases := faults()
	t.Logf("%d cases", len(cases))
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { runFault(t, c) })
	}
}

func runFault(t *testing.T, c fault) {
	d := t.TempDir()
	copyFile(t, goodCkpt, filepath.Join(d, "ckpt.safetensors"))
	copyFile(t, nn.StatePath(goodCkpt), filepath.Join(d, "ckpt.state.safetensors"))
	mkfifo(t, filepath.Join(d, "fifo"))
	if c.setup != nil {
		c.setup(t, d)
	}
	// Longer names first: the replacer tries them in this order.
	expand := strings.NewReplacer("$DATA", goodData, "$BOMB", bombPNG, "$OTHER", otherData, "$PNG", goodPNG,
		"$CKPT", filepath.Join(d, "ckpt.safetensors"), "$FIFO", filepath.Join(d, "fifo"), "$D", d).Replace
	args := make([]string, len(c.args))
	for i, a := range c.args {
		args[i] = expand(a)
	}
	before := snapshot(t, d, fixtures)

	bin := trainBin
	if c.cmd == "predict" {
		bin = predictBin
	}
	ctx, cancel := context.WithTimeout(context.Background(), caseTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = d
	cmd.Env = append(os.Environ(), "MNIST_DIR=")
	cmd.Env = append(cmd.Env, c.env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	elapsed := time.Since(start)
	if ctx.Err() != nil {
		t.Fatalf("killed after %v: it hangs\nstderr:\n%s", elapsed.Round(time.Millisecond), stderr.String())
	}
	if cmd.ProcessState == nil {
		t.Fatalf("did not run: %v", err)
	}
	code := cmd.ProcessState.ExitCode()
	rss := int64(cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss) * 1024 // KiB on Linux
	t.Logf("exit %d in %v, peak RSS %.1f MiB", code, elapsed.Round(time.Millisecond), float64(rss)/(1<<20))

	if code != c.code {
		t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, c.code, stdout.String(), stderr.String())
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n") {
		if l != "" && !progressLine.MatchString(l) {
			lines = append(lines, l)
		}
	}
	want := expand(c.want)
	switch {
	case c.want == "" && len(lines) != 0:
		t.Errorf("want no error line; stderr:\n%s", stderr.String())
	case c.want != "" && (len(lines) != 1 || !strings.HasPrefix(lines[0], c.cmd+": ") || !strings.Contains(lines[0], want)):
		t.Errorf("want one error line starting %q and containing %q; stderr:\n%s", c.cmd+": ", want, stderr.String())
	}
	all := stdout.String() + stderr.String()
	if strings.Contains(all, "panic") || strings.Contains(all, "goroutine ") {
		t.Errorf("stack trace in the output:\n%s", all)
	}
	if c.stdout >= 0 {
		if n := strings.Count(stdout.String(), "\n"); n != c.stdout {
			t.Errorf("%d lines on stdout, want %d:\n%s", n, c.stdout, stdout.String())
		}
	}
	if rss > maxRSS {
		t.Errorf("peak RSS %.0f MiB, more than %d MiB", float64(rss)/(1<<20), maxRSS>>20)
	}
	after := snapshot(t, d, fixtures)
	for p, b := range before {
		if a, ok := after[p]; !ok {
			t.Errorf("%s was removed", p)
		} else if !bytes.Equal(a, b) {
			t.Errorf("%s was changed", p)
		}
	}
}

// snapshot reads every regular file under dirs (not following links).
func snapshot(t *testing.T, dirs ...string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	for _, dir := range dirs {
		filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
			if err == nil && e.Type().IsRegular() {
				if b, err := os.ReadFile(p); err == nil {
					files[p] = b
				}
			}
			return nil
		})
	}
	return files
}
