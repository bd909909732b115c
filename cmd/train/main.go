// Command train trains the LeNet network on MNIST, on a GPU when one is
// usable and on the CPU otherwise, and saves a checkpoint PyTorch can load.
//
//	go run ./cmd/train --epochs 2
//
// See the README for the flags and what the output means.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
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
	tf32        bool
	bench       bool
	noGraph     bool
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("train", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.epochs, "epochs", 2, "number of passes over the training set")
	fs.IntVar(&o.batchSize, "batch-size", 64, "images per step")
	fs.Float64Var(&o.lr, "lr", 0.01, "learning rate")
	fs.Float64Var(&o.momentum, "momentum", 0.9, "SGD momentum")
	fs.Uint64Var(&o.seed, "seed", 1, "seed for initial weights and data order")
	fs.StringVar(&o.device, "device", "auto", "auto, cpu or cuda")
	fs.IntVar(&o.gpu, "gpu", 0, "GPU ordinal among the visible devices (CUDA_VISIBLE_DEVICES applies)")
	fs.StringVar(&o.dataDir, "data", "", "directory with the four MNIST files (default: $MNIST_DIR, else the copy in the Go module cache)")
	fs.BoolVar(&o.download, "download", false, "download MNIST into --data (or ./mnist) from the canonical mirrors first")
	fs.IntVar(&o.limit, "limit", 0, "train on the first N images only (0 = all)")
	fs.IntVar(&o.testLimit, "test-limit", 0, "evaluate on the first N test images only (0 = all 10,000)")
	fs.StringVar(&o.save, "save", "lenet.safetensors", "checkpoint path (safetensors; training state goes beside it)")
	fs.StringVar(&o.resume, "resume", "", "continue from this checkpoint")
	fs.IntVar(&o.logInterval, "log-interval", 100, "steps between progress lines")
	fs.StringVar(&o.metrics, "metrics", "", "write one CSV row per epoch to this file")
	fs.StringVar(&o.memoryLimit, "memory-limit", "", "cap on GPU memory the allocator may reserve, e.g. 64MiB (default: none)")
	fs.BoolVar(&o.tf32, "tf32", false, "allow TF32 tensor cores for matrix products (faster, ~1e-3 relative error)")
	fs.BoolVar(&o.bench, "bench", false, "print a benchmark table at the end")
	fs.BoolVar(&o.noGraph, "no-graph", false, "launch every kernel eagerly instead of replaying a captured CUDA graph")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	switch {
	case o.epochs < 1:
		return nil, fmt.Errorf("--epochs %d: want at least 1", o.epochs)
	case o.batchSize < 1:
		return nil, fmt.Errorf("--batch-size %d: want at least 1", o.batchSize)
	case o.lr <= 0:
		return nil, fmt.Errorf("--lr %g: want a positive learning rate", o.lr)
	case o.momentum < 0 || o.momentum >= 1:
		return nil, fmt.Errorf("--momentum %g: want 0 <= momentum < 1", o.momentum)
	case o.limit < 0:
		return nil, fmt.Errorf("--limit %d: want 0 (all) or a positive count", o.limit)
	case o.testLimit < 0:
		return nil, fmt.Errorf("--test-limit %d: want 0 (all) or a positive count", o.testLimit)
	case o.logInterval < 1:
		return nil, fmt.Errorf("--log-interval %d: want at least 1", o.logInterval)
	case o.device != "auto" && o.device != "cpu" && o.device != "cuda":
		return nil, fmt.Errorf("--device %q: want auto, cpu or cuda", o.device)
	case o.save == "":
		return nil, fmt.Errorf("--save: want a file path")
	}
	return o, nil
}

// usageError marks errors that exit with status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "train: %v\n", err)
		return exitUsage
	}
	t := &trainer{opt: o, out: stdout, errOut: stderr}
	return t.main(ctx)
}
