// Command predict classifies handwritten digits with a checkpoint written
// by train (or by PyTorch's safetensors.torch.save_file: then LeNet's state
// dict). The model is the one the checkpoint's metadata names (LeNet, an
// MLP, any model registered in package models), rebuilt from it.
//
// Without image files it evaluates the model on the MNIST test set and
// prints
//
//	test accuracy 99.05%
//
// With image files (PNG, JPEG or GIF, any size, dark-on-light or
// light-on-dark) it prints the predicted digit of each and its probability:
//
//	img1.png: 7 (99.12%)
//
// A file that cannot be read or decoded gets an error line instead; the
// others are still classified.
//
// Flags:
//
//	--model PATH      checkpoint (default lenet.safetensors)
//	--data DIR        MNIST directory (default: $MNIST_DIR, then the Go module cache)
//	--device NAME     auto, cpu or cuda (default auto)
//	--json            one JSON object per line instead of text
//	--batch-size N    images per forward pass (default 1000)
//	--invert MODE     auto (invert pictures with a light background), yes or no
//	--no-center       resize the whole picture instead of centring the digit
//
// Exit status: 0 on success, 2 for bad usage or an unusable input (missing
// or broken checkpoint, data or image file, a special file such as a
// directory, a device or a FIFO; the message names it), 1 for a failure
// while computing. Each error is one line on standard error.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ember-ml/ember/data"
	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// Exit statuses.
const (
	exitOK      = 0
	exitFailure = 1 // a failure while computing (a device error)
	exitUsage   = 2 // bad flags, or a missing or unusable input file
)

type options struct {
	model, data, device, invert, arch string
	prompt                            string
	tokens                            int
	norm                              models.Normalization
	json, noCenter                    bool
	batch                             int
	files                             []string
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the whole command: it parses args, writes results to stdout and
// messages to stderr, and returns the exit status. It does not panic.
func run(args []string, stdout, stderr io.Writer) (code int) {
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stderr, "predict: %s\n", oneLine(fmt.Sprintf(format, a...)))
		return code
	}
	defer func() {
		if r := recover(); r != nil {
			code = fail(exitFailure, "%v", r)
		}
	}()

	o, err := parseArgs(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		return fail(exitUsage, "%v (see predict -h)", err)
	}
	b, desc, err := openBackend(o.device)
	if err != nil {
		return fail(exitUsage, "--device %s: %v", o.device, err)
	}
	var model nn.Module
	name := o.arch
	if o.arch != "" {
		// A state dict without our metadata (one PyTorch saved): the
		// architecture comes from the flag, for 28x28 grey images.
		model, err = models.LoadModelAs(o.model, b, o.arch, models.Config{InputShape: []int{1, models.Side, models.Side}, Classes: 10})
	} else {
		model, name, err = models.LoadModel(o.model, b)
	}
	if err != nil {
		msg := describe(err)
		if errors.Is(err, fs.ErrNotExist) {
			msg += " (train a model with: train --save " + o.model + ")"
		}
		return fail(exitUsage, "%s", msg)
	}
	if gpt, ok := model.(*models.GPT); ok {
		return generate(o, gpt, stdout, fail)
	}
	// Images are normalised as the model was trained (MNIST's constants
	// unless the checkpoint records others).
	o.norm = models.MNISTNormalization
	if meta, merr := nn.ReadSafetensorsMetadata(o.model); merr == nil {
		if o.norm, err = models.NormalizationFromMetadata(o.model, meta); err != nil {
			return fail(exitUsage, "%v", err)
		}
	}
	if o.prompt != "" {
		return fail(exitUsage, "--prompt: %s holds a %s, which classifies images; --prompt is for a language model (gpt)", o.model, name)
	}
	if len(o.files) == 0 {
		return evaluate(o, model, name, b, desc, stdout, stderr, fail)
	}
	return classify(o, model, b, stdout, stderr, fail)
}

func parseArgs(args []string, stdout io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("predict", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.model, "model", "lenet.safetensors", "checkpoint `path` (safetensors)")
	fs.StringVar(&o.data, "data", "", "MNIST `dir`ectory for evaluation (default: $MNIST_DIR, then the Go module cache)")
	fs.StringVar(&o.device, "device", "auto", "`device`: auto, cpu or cuda")
	fs.StringVar(&o.prompt, "prompt", "", "for a language model (gpt): the `text` to continue")
	fs.IntVar(&o.tokens, "tokens", 200, "for a language model: how many tokens to generate")
	fs.StringVar(&o.arch, "arch", "", "the `model` a checkpoint without ember's metadata holds (a PyTorch state dict): "+strings.Join(models.Names(), ", ")+" (default: the file's metadata, else lenet)")
	fs.BoolVar(&o.json, "json", false, "print one JSON object per line")
	fs.IntVar(&o.batch, "batch-size", 1000, "images per forward `pass`")
	fs.StringVar(&o.invert, "invert", "auto", "invert pictures: `mode` auto (when the background is light), yes or no")
	fs.BoolVar(&o.noCenter, "no-center", false, "resize the whole picture instead of centring the digit as MNIST does")
	fs.Usage = func() {} // errors are reported in one line by run; -h prints usage below
	printUsage := func() {
		fmt.Fprintln(stdout, "usage: predict [flags]                evaluate on the MNIST test set")
		fmt.Fprintln(stdout, "       predict [flags] image...       classify PNG, JPEG or GIF images")
		fmt.Fprintln(stdout, "flags:")
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	// Flags and file names may come in any order; "--" ends the flags.
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				printUsage()
			}
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			break
		}
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			o.files = append(o.files, rest...)
			break
		}
		o.files = append(o.files, rest[0])
		args = rest[1:]
	}
	switch {
	case o.model == "":
		return nil, errors.New("--model is empty")
	case o.arch != "" && !slices.Contains(models.Names(), o.arch):
		return nil, fmt.Errorf("--arch %q: want one of %s", o.arch, strings.Join(models.Names(), ", "))
	case o.tokens < 0:
		return nil, fmt.Errorf("--tokens %d: want zero or more", o.tokens)
	case o.batch <= 0:
		return nil, fmt.Errorf("--batch-size %d: want a positive number", o.batch)
	case o.invert != "auto" && o.invert != "yes" && o.invert != "no":
		return nil, fmt.Errorf("--invert %q: want auto, yes or no", o.invert)
	case o.data != "" && len(o.files) > 0:
		return nil, errors.New("--data is for evaluating on MNIST; it cannot be combined with image files")
	}
	return o, nil
}

// generate continues --prompt with --tokens tokens of a language model,
// greedily, with the vocabulary its checkpoint records.
func generate(o *options, m *models.GPT, stdout io.Writer, fail func(int, string, ...any) int) int {
	meta, err := nn.ReadSafetensorsMetadata(o.model)
	if err != nil {
		return fail(exitUsage, "%s", describe(err))
	}
	vocab, err := models.VocabFromMetadata(o.model, meta)
	if err != nil {
		return fail(exitUsage, "%v", err)
	}
	if len(o.files) > 0 {
		return fail(exitUsage, "%s holds a language model: give --prompt, not image files", o.model)
	}
	if o.prompt == "" {
		return fail(exitUsage, "--prompt: %s holds a language model; give the text to continue", o.model)
	}
	ids, err := vocab.Encode([]byte(o.prompt), "--prompt")
	if err != nil {
		return fail(exitUsage, "%v", err)
	}
	var out []int32
	if err := tensor.Guard(func() { out, err = m.Generate(ids, o.tokens) }); err != nil {
		return fail(exitFailure, "generating: %v", err)
	}
	if err != nil {
		return fail(exitUsage, "%v", err)
	}
	text, err := vocab.Decode(out)
	if err != nil {
		return fail(exitFailure, "decoding: %v", err)
	}
	fmt.Fprintf(stdout, "%s%s\n", o.prompt, text)
	return exitOK
}

// evaluate runs the model over the MNIST test set.
func evaluate(o *options, m nn.Module, name string, b tensor.Backend, desc string, stdout, stderr io.Writer, fail func(int, string, ...any) int) int {
	src, err := data.Locate(o.data)
	if err != nil {
		return fail(exitUsage, "%s", describe(err))
	}
	_, test, err := data.LoadMNIST(src.Dir)
	if err != nil {
		return fail(exitUsage, "%s", describe(err))
	}
	if test.Rows != side || test.Cols != side {
		if name == "lenet" {
			name = "LeNet"
		}
		return fail(exitUsage, "%s: test images are %dx%d, %s needs %dx%d", src.Dir, test.Rows, test.Cols, name, side, side)
	}
	if !o.json {
		fmt.Fprintf(stderr, "predict: %s on %d test images, %s; device %s\n", o.model, test.N, src.Describe(), desc)
	}
	start := time.Now()
	var acc, loss float64
	var eerr error
	if err := tensor.Guard(func() {
		acc, loss, eerr = models.EvaluateNormalized(m, b, test.Images, test.Labels, test.N, o.batch, o.norm)
	}); err != nil {
		return fail(exitFailure, "evaluating on %s: %v", desc, err)
	}
	if eerr != nil {
		return fail(exitUsage, "%s: %v", src.Dir, eerr)
	}
	if o.json {
		return writeJSON(stdout, stderr, evalResult{Model: o.model, Data: src.Dir, Images: test.N, TestAccuracy: acc, MeanLoss: loss})
	}
	fmt.Fprintf(stdout, "test accuracy %.2f%%\n", 100*acc)
	fmt.Fprintf(stderr, "predict: mean loss %.4f, %.1f s\n", loss, time.Since(start).Seconds())
	return exitOK
}

// classify prints the prediction for each image file, in the order given.
// A file that cannot be read or decoded gets an error line on stderr and
// the exit status 2; the others are classified and printed all the same.
func classify(o *options, m nn.Module, b tensor.Backend, stdout, stderr io.Writer, fail func(int, string, ...any) int) int {
	prep := prepOptions{invert: o.invert, center: !o.noCenter}
	var files []string
	pixels := make([]uint8, 0, min(len(o.files), o.batch)*side*side)
	code := exitOK
	for _, f := range o.files {
		px, err := loadImage(f, prep)
		if err != nil {
			code = fail(exitUsage, "%v", err)
			continue
		}
		files = append(files, f)
		pixels = append(pixels, px...)
	}
	x := make([]float32, len(pixels))
	o.norm.Apply(x, pixels)
	for lo := 0; lo < len(files); lo += o.batch {
		hi := min(lo+o.batch, len(files))
		var classes []int
		var probs [][]float32
		var perr error
		if err := tensor.Guard(func() {
			t := tensor.FromFloat32(b, nil, x[lo*side*side:hi*side*side], hi-lo, 1, side, side)
			defer t.Release()
			classes, probs, perr = models.Predict(m, t)
		}); err != nil {
			return fail(exitFailure, "predicting: %v", err)
		}
		if perr != nil {
			return fail(exitFailure, "predicting: %v", perr)
		}
		for i, c := range classes {
			file := files[lo+i]
			if o.json {
				if code := writeJSON(stdout, stderr, imageResult{File: file, Digit: c, Probability: probs[i][c], Probabilities: probs[i]}); code != exitOK {
					return code
				}
				continue
			}
			if _, err := fmt.Fprintf(stdout, "%s: %d (%.2f%%)\n", file, c, 100*probs[i][c]); err != nil {
				return fail(exitFailure, "writing the results: %v", err)
			}
		}
	}
	return code
}

// evalResult is the --json output of an evaluation.
type evalResult struct {
	Model        string  `json:"model"`
	Data         string  `json:"data"`
	Images       int     `json:"images"`
	TestAccuracy float64 `json:"test_accuracy"`
	MeanLoss     float64 `json:"mean_loss"`
}

// imageResult is the --json output for one image.
type imageResult struct {
	File          string    `json:"file"`
	Digit         int       `json:"digit"`
	Probability   float32   `json:"probability"`
	Probabilities []float32 `json:"probabilities"`
}

func writeJSON(stdout, stderr io.Writer, v any) int {
	b, err := json.Marshal(v)
	if err == nil {
		_, err = stdout.Write(append(b, '\n'))
	}
	if err != nil {
		fmt.Fprintf(stderr, "predict: writing the results: %v\n", err)
		return exitFailure
	}
	return exitOK
}

// describe returns err as "FILE: PROBLEM" for the errors of nn and data,
// without their package prefixes, else err's message on one line.
func describe(err error) string {
	var ce *nn.CheckpointError
	var de *data.Error
	switch {
	case errors.As(err, &ce):
		return ce.File + ": " + ce.Problem
	case errors.As(err, &de):
		return de.File + ": " + de.Problem
	}
	return oneLine(err.Error())
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
