package main

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// A setting is a flag whose value the training state records and a resume
// takes back, unless the command line gives it again. The others (device,
// logging, metrics, benchmark) belong to one run and are not taken back.
type setting struct {
	name string
	get  func(o *options) string
	set  func(o *options, v string) error
}

var settings = []setting{
	{"epochs", func(o *options) string { return strconv.Itoa(o.epochs) }, func(o *options, v string) (err error) { o.epochs, err = strconv.Atoi(v); return }},
	{"batch-size", func(o *options) string { return strconv.Itoa(o.batchSize) }, func(o *options, v string) (err error) { o.batchSize, err = strconv.Atoi(v); return }},
	{"lr", func(o *options) string { return fmt.Sprint(o.lr) }, func(o *options, v string) (err error) { o.lr, err = strconv.ParseFloat(v, 64); return }},
	{"momentum", func(o *options) string { return fmt.Sprint(o.momentum) }, func(o *options, v string) (err error) { o.momentum, err = strconv.ParseFloat(v, 64); return }},
	{"seed", func(o *options) string { return strconv.FormatUint(o.seed, 10) }, func(o *options, v string) (err error) { o.seed, err = strconv.ParseUint(v, 10, 64); return }},
	{"limit", func(o *options) string { return strconv.Itoa(o.limit) }, func(o *options, v string) (err error) { o.limit, err = strconv.Atoi(v); return }},
	{"test-limit", func(o *options) string { return strconv.Itoa(o.testLimit) }, func(o *options, v string) (err error) { o.testLimit, err = strconv.Atoi(v); return }},
	{"tf32", func(o *options) string { return strconv.FormatBool(o.tf32) }, func(o *options, v string) (err error) { o.tf32, err = strconv.ParseBool(v); return }},
	{"precision", func(o *options) string { return string(o.prec) }, func(o *options, v string) error { o.precision = v; return nil }},
	{"data", func(o *options) string { return dataFlag(o.dataDir) }, func(o *options, v string) error { o.dataDir = v; return nil }},
	{"model", func(o *options) string { return o.model }, func(o *options, v string) error { o.model = v; return nil }},
	{"dataset", func(o *options) string { return o.dataset }, func(o *options, v string) error { o.dataset = v; return nil }},
	{"optimizer", func(o *options) string { return o.optimizer }, func(o *options, v string) error { o.optimizer = v; return nil }},
	{"schedule", func(o *options) string { return o.schedule }, func(o *options, v string) error { o.schedule = v; return nil }},
	{"augment", func(o *options) string { return strconv.FormatBool(o.augment) }, func(o *options, v string) (err error) { o.augment, err = strconv.ParseBool(v); return }},
	{"nesterov", func(o *options) string { return strconv.FormatBool(o.nesterov) }, func(o *options, v string) (err error) { o.nesterov, err = strconv.ParseBool(v); return }},
	{"weight-decay", func(o *options) string { return fmt.Sprint(o.weightDecay) }, func(o *options, v string) (err error) { o.weightDecay, err = strconv.ParseFloat(v, 64); return }},
	{"context", func(o *options) string { return strconv.Itoa(o.context) }, func(o *options, v string) (err error) { o.context, err = strconv.Atoi(v); return }},
	{"clip-grad-norm", func(o *options) string { return fmt.Sprint(o.clipNorm) }, func(o *options, v string) (err error) { o.clipNorm, err = strconv.ParseFloat(v, 64); return }},
}

// dataFlag is how --data is recorded: as an absolute path, so that a resume
// from another directory finds the same files ("" for the default search).
func dataFlag(dir string) string {
	if dir == "" {
		return ""
	}
	if abs, err := filepath.Abs(dir); err == nil {
		return abs
	}
	return dir
}

// Keys of the training state's flags besides the settings.
const dataIdentityKey = "data-identity"

// loadResume reads the checkpoint --resume names, before any data is
// loaded: it checks the files (regular files, the header against the model
// the file's metadata names, finite values), loads the weights into that
// model on the CPU to be copied to the device later, and takes back the
// recorded settings that the command line does not give, printing each one
// it overrides.
func (t *job) loadResume() error {
	o := t.opt
	if err := checkResumePaths(o.resume); err != nil {
		return usageError{err}
	}
	meta, err := nn.ReadSafetensorsMetadata(o.resume)
	if err != nil {
		return usageError{err}
	}
	name, cfg, err := models.FromMetadata(meta)
	if err != nil {
		return usageError{fmt.Errorf("--resume %s: %v", o.resume, err)}
	}
	if o.set["model"] && o.model != name {
		return usageError{fmt.Errorf("--model %s: the checkpoint %s holds the model %s; a resume continues the same model", o.model, o.resume, name)}
	}
	m, err := models.New(name, tensor.CPU, cfg)
	if err != nil {
		return usageError{fmt.Errorf("--resume %s: %v", o.resume, err)}
	}
	st, err := models.LoadCheckpoint(o.resume, m)
	if err != nil {
		return usageError{err}
	}
	t.resumed, t.resumeModel, t.resumeMeta = st, m, meta

	var recorded, overridden, missing []string
	for _, s := range settings {
		v, ok := st.Flags[s.name]
		if s.name == "seed" && !ok {
			v, ok = strconv.FormatUint(st.Seed, 10), true // older states: the seed field
		}
		if !ok {
			missing = append(missing, "--"+s.name)
			continue
		}
		if o.set[s.name] {
			if cur := s.get(o); cur != v {
				overridden = append(overridden, fmt.Sprintf("--%s %s from the command line (the checkpoint has %s)", s.name, orDefault(cur), orDefault(v)))
			}
			continue
		}
		if s.name == "data" {
			t.dataFromCheckpoint = true
		}
		if err := s.set(o, v); err != nil {
			return usageError{fmt.Errorf("--resume %s: %s records --%s %q, which is not a valid value", o.resume, models.StatePath(o.resume), s.name, v)}
		}
		recorded = append(recorded, "--"+s.name+" "+orDefault(v))
	}
	o.model = name // the architecture the weights are for
	o.resumeLoaded = true
	if name == "gpt" && len(cfg.InputShape) == 1 && o.context != cfg.InputShape[0] {
		return usageError{fmt.Errorf("--context %d: the checkpoint %s holds a GPT of context %d; a resume continues the same model", o.context, o.resume, cfg.InputShape[0])}
	}
	if err := o.check(); err != nil {
		return usageError{fmt.Errorf("--resume %s: the recorded settings: %v", o.resume, err)}
	}
	if !o.set["save"] {
		o.save = o.resume // continue the same checkpoint
	}
	t.logf("resume: %s at epoch %d, step %d", o.resume, st.Epoch+1, st.Step)
	if len(recorded) > 0 {
		t.logf("resume: the checkpoint's settings: %s", strings.Join(recorded, " "))
	}
	for _, d := range overridden {
		t.logf("resume: %s", d)
	}
	if len(missing) > 0 {
		t.logf("resume: the checkpoint does not record %s; using the command line's", strings.Join(missing, ", "))
	}
	return nil
}

// orDefault shows an empty --data as what it means.
func orDefault(v string) string {
	if v == "" {
		return `"" (the default search)`
	}
	return v
}

// checkResumeData refuses to continue on data other than the checkpoint's
// (got, in dir), unless --allow-other-data says so.
func (t *job) checkResumeData(got, dir string) error {
	if t.resumed == nil {
		return nil
	}
	want, ok := t.resumed.Flags[dataIdentityKey]
	switch {
	case !ok:
		t.logf("resume: the checkpoint does not record its data set; continuing on %s", got)
	case want == got:
	case t.opt.allowOtherData:
		t.logf("resume: continuing on other data than the checkpoint's (%s, was %s), as --allow-other-data says", got, want)
	default:
		return usageError{fmt.Errorf("%s: holds other data (%s) than the checkpoint %s was trained on (%s); pass --allow-other-data to continue on it anyway", dir, got, t.opt.resume, want)}
	}
	return nil
}

// applyResume puts the checkpoint's weights into the model on the device
// and returns the training state the trainer continues from (its
// optimiser state, epoch and step).
func (t *job) applyResume() *nn.TrainingState {
	st, o := *t.resumed, t.opt
	src := nn.Parameters(t.resumeModel)
	for i, p := range nn.Parameters(t.model) {
		p.Tensor.CopyFrom(src[i].Tensor.Float32s())
	}
	for _, p := range src {
		p.Tensor.Release()
	}
	t.resumeModel = nil
	// A different batch size mid-epoch: continue after the same number of
	// images of the epoch's order (rounded down to a whole batch).
	if bs, err := strconv.Atoi(st.Flags["batch-size"]); err == nil && bs != o.batchSize && st.Step > 0 {
		step := st.Step * bs / o.batchSize
		t.logf("resume: %d steps of batch %d are %d steps of batch %d", st.Step, bs, step, o.batchSize)
		st.Step = step
	}
	return &st
}
