// Command train trains a model (LeNet by default, an MLP, ResNet-9,
// airbench or a GPT) on MNIST, Fashion-MNIST, CIFAR-10, CIFAR-100 or a
// text file, on a GPU when one is usable and on the CPU otherwise, and
// saves a checkpoint PyTorch can load. The training itself is package
// nn/trainer; this command reads the flags, finds the data, picks the
// device and prints.
//
//	go run ./cmd/train --epochs 2
//	go run ./cmd/train --model mlp --dataset fashion-mnist --optimizer adamw --lr 1e-3 --schedule onecycle
//	go run ./cmd/train --model gpt --dataset text --data input.txt --optimizer adamw --lr 1e-3 --clip-grad-norm 1
//
// See the README for the flags and what the output means.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/tensor"
)

// Exit statuses.
const (
	exitOK          = 0
	exitFailure     = 1 // training failed (non-finite loss, device error)
	exitUsage       = 2 // bad flags or input, out of memory
	exitInterrupted = 130
)

func main() {
	ctx, stop := signalContext()
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// signalContext is cancelled by SIGINT or SIGTERM: training finishes the
// step in flight, saves, and exits 130.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// options are the command-line flags.
type options struct {
	epochs      int
	batchSize   int
	lr          float64
	momentum    float64
	seed        uint64
	device      string
	gpu         int
	dataDir     string
	download    bool
	limit       int
	testLimit   int
	save        string
	resume      string
	logInterval int
	metrics     string
	memoryLimit string
	tf32        bool   // --tf32: the same as --precision tf32
	precision   string // --precision
	bench       bool
	augment     bool
	nesterov    bool
	weightDecay float64
	noGraph     bool
	recompute   bool // --recompute: the model's blocks recomputed in the backward pass
	model       string
	dataset     string
	optimizer   string
	schedule    string
	context     int     // --context: tokens per window of --dataset text
	clipNorm    float64 // --clip-grad-norm, 0 = off

	overwrite      bool // --save and --metrics may replace files train did not write
	allowOtherData bool // a resume may continue on other data than it was trained on

	launch launchOptions // --nproc-per-node and its companions

	memoryLimitBytes int              // --memory-limit parsed
	prec             tensor.Precision // --precision parsed (--tf32 folded in)
	resumeLoaded     bool             // the checkpoint's settings are in: the checks between flags apply
	set              map[string]bool  // the flags given on the command line
}

func parseFlags(args []string, stdout io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("train", flag.ContinueOnError)
	// Errors are one line, printed by run; -h prints the usage on stdout.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.IntVar(&o.epochs, "epochs", 2, "number of passes over the training set")
	fs.IntVar(&o.batchSize, "batch-size", 64, "images (or text windows) per step")
	fs.Float64Var(&o.lr, "lr", 0.01, "learning rate")
	fs.Float64Var(&o.momentum, "momentum", 0.9, "SGD momentum")
	fs.Uint64Var(&o.seed, "seed", 1, "seed for initial weights and data order")
	fs.StringVar(&o.device, "device", "auto", "auto, cpu or cuda")
	fs.IntVar(&o.gpu, "gpu", 0, "GPU ordinal among the visible devices (CUDA_VISIBLE_DEVICES applies)")
	fs.StringVar(&o.dataDir, "data", "", "directory with the four MNIST files (default: $MNIST_DIR, else the copy in the Go module cache)")
	fs.BoolVar(&o.download, "download", false, "download MNIST into --data (or ./mnist) from the canonical mirrors first")
	fs.IntVar(&o.limit, "limit", 0, "train on the first N images (or text windows) only (0 = all)")
	fs.IntVar(&o.testLimit, "test-limit", 0, "evaluate on the first N test images (or validation windows) only (0 = all)")
	fs.StringVar(&o.save, "save", "", "checkpoint path (safetensors; training state goes beside it; default MODEL.safetensors, lenet.safetensors for LeNet)")
	fs.StringVar(&o.resume, "resume", "", "continue from this checkpoint")
	fs.IntVar(&o.logInterval, "log-interval", 100, "steps between progress lines")
	fs.StringVar(&o.metrics, "metrics", "", "write one CSV row per epoch to this file")
	fs.StringVar(&o.memoryLimit, "memory-limit", "", "cap on GPU memory the allocator may reserve, e.g. 64MiB (default: none)")
	fs.StringVar(&o.precision, "precision", "fp32", "arithmetic: fp32 (full float32), tf32 (float32 products and convolutions on TF32 tensor cores, ~1e-3 relative error) or bf16 (bfloat16 products and convolutions with float32 sums, weights and optimiser state)")
	fs.BoolVar(&o.tf32, "tf32", false, "the same as --precision tf32")
	fs.BoolVar(&o.bench, "bench", false, "print a benchmark table at the end")
	fs.BoolVar(&o.noGraph, "no-graph", false, "launch every kernel eagerly instead of replaying a captured CUDA graph")
	fs.BoolVar(&o.recompute, "recompute", false, "keep each block's input and output only, and compute its activations again in the backward pass: less GPU memory for about one more forward pass (models made of blocks: resnet9, airbench, gpt)")
	fs.StringVar(&o.model, "model", "lenet", "model to train: "+strings.Join(models.Names(), ", "))
	fs.StringVar(&o.dataset, "dataset", "mnist", "data set: mnist or fashion-mnist (--data, else the default search), cifar10 or cifar100 (--data: the directory of the binary version; CIFAR-100 with its 100 fine labels) or text (--data: a text file, byte-level vocabulary, the last 10% for validation)")
	fs.IntVar(&o.context, "context", 256, "tokens per training window with --dataset text")
	fs.Float64Var(&o.clipNorm, "clip-grad-norm", 0, "clip the gradients to this global norm before each update (0 = off)")
	fs.StringVar(&o.optimizer, "optimizer", "sgd", "optimiser: sgd (with --momentum) or adamw (torch's defaults besides --lr)")
	fs.StringVar(&o.schedule, "schedule", "none", "learning-rate schedule over the whole run: none, onecycle (peak --lr; cycles the momentum between 0.95 and 0.85 as torch does) or cosine (from --lr)")
	fs.BoolVar(&o.augment, "augment", false, "augment on the device: translate by up to 2 pixels and flip horizontally, normalised by the training set's per-channel mean and deviation")
	fs.BoolVar(&o.nesterov, "nesterov", false, "Nesterov momentum for --optimizer sgd")
	fs.Float64Var(&o.weightDecay, "weight-decay", 0, "SGD's L2 weight decay (AdamW keeps torch's 0.01, decoupled)")
	fs.BoolVar(&o.overwrite, "overwrite", false, "let --save and --metrics replace an existing file that train did not write")
	fs.BoolVar(&o.allowOtherData, "allow-other-data", false, "let --resume continue on a data set other than the checkpoint's")
	addLaunchFlags(fs, &o.launch)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(stdout, "usage: train [flags]   train a model (LeNet) on MNIST and save a checkpoint")
			fs.SetOutput(stdout)
			fs.PrintDefaults()
		}
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (train takes flags only)", fs.Arg(0))
	}
	o.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	if !o.set["save"] {
		o.save = o.model + ".safetensors" // a resume replaces it with the checkpoint it continues
	}
	if err := o.check(); err != nil {
		return nil, err
	}
	if err := o.checkLaunch(); err != nil {
		return nil, err
	}
	return o, nil
}

// check validates the values of the flags, the ones a resume takes from
// the checkpoint included.
func (o *options) check() error {
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case o.epochs < 1:
		return fmt.Errorf("--epochs %d: want at least 1", o.epochs)
	case o.batchSize < 1:
		return fmt.Errorf("--batch-size %d: want at least 1", o.batchSize)
	case !finite(o.lr) || o.lr <= 0:
		return fmt.Errorf("--lr %g: want a finite, positive learning rate", o.lr)
	case !finite(o.momentum) || o.momentum < 0 || o.momentum >= 1:
		return fmt.Errorf("--momentum %g: want 0 <= momentum < 1", o.momentum)
	case o.limit < 0:
		return fmt.Errorf("--limit %d: want 0 (all) or a positive count", o.limit)
	case o.testLimit < 0:
		return fmt.Errorf("--test-limit %d: want 0 (all) or a positive count", o.testLimit)
	case o.logInterval < 1:
		return fmt.Errorf("--log-interval %d: want at least 1", o.logInterval)
	case o.device != "auto" && o.device != "cpu" && o.device != "cuda":
		return fmt.Errorf("--device %q: want auto, cpu or cuda", o.device)
	case o.gpu < 0:
		return fmt.Errorf("--gpu %d: want a GPU ordinal, 0 or more", o.gpu)
	case o.save == "":
		return fmt.Errorf("--save: want a file path")
	case !slices.Contains(models.Names(), o.model):
		return fmt.Errorf("--model %q: want one of %s", o.model, strings.Join(models.Names(), ", "))
	case !slices.Contains(datasets, o.dataset):
		return fmt.Errorf("--dataset %q: want mnist or fashion-mnist (found by the default search), cifar10, cifar100 or text (with --data)", o.dataset)
	case o.context < 1:
		return fmt.Errorf("--context %d: want at least 1 token", o.context)
	case !finite(o.clipNorm) || o.clipNorm < 0:
		return fmt.Errorf("--clip-grad-norm %g: want a finite norm, 0 (off) or more", o.clipNorm)
	case o.optimizer != "sgd" && o.optimizer != "adamw":
		return fmt.Errorf("--optimizer %q: want sgd or adamw", o.optimizer)
	case o.schedule != "none" && o.schedule != "onecycle" && o.schedule != "cosine":
		return fmt.Errorf("--schedule %q: want none, onecycle or cosine", o.schedule)
	case o.optimizer == "adamw" && o.set["momentum"]:
		return fmt.Errorf("--momentum %g does not apply with --optimizer adamw (its betas are torch's defaults)", o.momentum)
	case o.download && o.dataset != "mnist":
		return fmt.Errorf("--download fetches MNIST only; for --dataset %s, install it or give --data", o.dataset)
	case o.device == "cpu" && o.set["gpu"]:
		return fmt.Errorf("--gpu %d does not apply with --device cpu (it picks a GPU)", o.gpu)
	case o.device == "cpu" && o.memoryLimit != "":
		return fmt.Errorf("--memory-limit %s does not apply with --device cpu (it caps GPU memory)", o.memoryLimit)
	}
	if err := o.checkPrecision(); err != nil {
		return err
	}
	// A resume takes the model, the data set and --data from the
	// checkpoint: what they must agree on is checked once they are in.
	if o.resume != "" && !o.resumeLoaded {
		return o.checkMemoryLimit()
	}
	switch {
	case (o.dataset == "text" || o.dataset == "cifar10" || o.dataset == "cifar100") && o.dataDir == "":
		return fmt.Errorf("--dataset %s needs --data (%s)", o.dataset, map[string]string{"text": "a text file", "cifar10": "the directory of CIFAR-10's binary batches", "cifar100": "the directory of CIFAR-100's train.bin and test.bin"}[o.dataset])
	case o.dataset == "text" && o.model != "gpt":
		return fmt.Errorf("--dataset text: --model %s takes images; the text model is gpt", o.model)
	case o.model == "gpt" && o.dataset != "text":
		return fmt.Errorf("--model gpt: --dataset %s holds images; gpt trains on --dataset text", o.dataset)
	case o.dataset != "text" && o.set["context"]:
		return fmt.Errorf("--context %d applies to --dataset text only", o.context)
	case o.dataset == "text" && o.augment:
		return fmt.Errorf("--augment applies to image sets, not --dataset text")
	}
	return o.checkMemoryLimit()
}

// checkPrecision parses --precision into o.prec, folding --tf32 in: --tf32
// alone is --precision tf32, and so is a checkpoint's tf32 setting from
// before --precision existed.
func (o *options) checkPrecision() error {
	if o.tf32 && (o.set["tf32"] || !o.set["precision"]) {
		if o.set["precision"] && o.precision != string(tensor.TF32) {
			return fmt.Errorf("--tf32 is --precision tf32; it does not go with --precision %s", o.precision)
		}
		o.precision = string(tensor.TF32)
	}
	p, err := tensor.ParsePrecision(o.precision)
	if err != nil {
		return fmt.Errorf("--precision %q: want fp32, tf32 or bf16", o.precision)
	}
	o.prec, o.tf32 = p, p.AllowTF32()
	return nil
}

func (o *options) checkMemoryLimit() error {
	limit, err := parseBytes(o.memoryLimit)
	if err != nil {
		return fmt.Errorf("--memory-limit %q: %v", o.memoryLimit, err)
	}
	o.memoryLimitBytes = limit
	return nil
}

// datasets are the --dataset names.
var datasets = []string{"mnist", "fashion-mnist", "cifar10", "cifar100", "text"}

// usageError marks errors that exit with status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) (code int) {
	// Every failure is one line: a panic here is a bug, but even then the
	// user gets a line, not a stack trace.
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(stderr, "train: internal error: %s\n", oneLine(fmt.Errorf("%v", r)))
			code = exitFailure
		}
	}()
	o, err := parseFlags(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "train: %s\n", oneLine(err))
		return exitUsage
	}
	if o.launch.nprocPerNode > 0 && !launchedByUs() {
		return launch(ctx, o, args, stdout, stderr)
	}
	t := &job{opt: o, out: stdout, errOut: stderr}
	return t.main(ctx)
}
