package nn

// Training checkpoints: the model file X.safetensors, a plain state_dict
// that PyTorch loads with strict=True, and beside it the training state
// X.state.safetensors, which is self-sufficient for resuming:
//
//	tensors    "model.<name>" for every parameter (a copy of the weights),
//	           "optimizer.momentum" (the flat momentum buffer, if any),
//	           "optimizer.<name>" (the optimiser's other buffers, if any:
//	           Adam's exp_avg, exp_avg_sq)
//	metadata   format=ember.training_state, ember.state_version=1, epoch,
//	           step, global_step, optimizer_steps, seed, rng (base64, if
//	           any), model_file, model_sha256 (Fingerprint of the weights),
//	           previous_model_sha256, and flag.<name> for each flag
//
// Crash consistency. Each file is replaced atomically (temporary file,
// fsync, rename, fsync of the directory), but two files cannot be replaced
// together, so SaveCheckpoint writes and syncs both temporary files first,
// then renames the state file (the commit point of a resumable checkpoint),
// then the model file. A crash at any moment leaves one of:
//
//   - old state, old model (crash before the first rename): the previous
//     checkpoint, consistent;
//   - new state, old model (crash between the two renames, a window of
//     microseconds): the state is complete and holds the new weights; the
//     model file is the one that was there before, whose fingerprint the
//     new state records as previous_model_sha256 (SaveCheckpoint reads and
//     hashes the model file it is about to replace);
//   - new state, new model: the new checkpoint.
//
// LoadCheckpoint always takes the weights from the state file, where they
// belong with the momentum, after checking that the model file holds either
// the same weights (model_sha256) or those of the checkpoint just before
// (previous_model_sha256, the second case above). Any other model file (one
// replaced by hand, or a state file copied from another run) is refused
// with ErrStateMismatch rather than silently ignored. The cost of this
// design is a second copy of the weights on disk.

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/ember-ml/ember/internal/atomicfile"
	"github.com/ember-ml/ember/tensor"
)

// TrainingState is what a training run needs, besides the weights, to
// continue where it stopped.
type TrainingState struct {
	// Epoch and Step locate the next batch to train on: Step batches of
	// epoch Epoch are done (the caller decides whether epochs count from 0).
	Epoch, Step int
	// GlobalStep counts the optimiser updates over the whole run.
	GlobalStep int
	// Seed is the run's seed. The data order is a function of (Seed,
	// epoch) (see data.Permutation), so it is all the RNG state needed to
	// reproduce the shuffle.
	Seed uint64
	// Flags are the run's settings (lr, momentum, batch-size, ...), stored
	// as flag.<name> metadata.
	Flags map[string]string
	// Momentum is the optimiser's flat momentum buffer in parameter order
	// (optim.SGD.MomentumBuffer), nil without momentum.
	Momentum []float32
	// OptimizerSteps is the optimiser's update count (optim.SGD.Steps).
	OptimizerSteps int
	// OptimizerBuffers are the optimiser's other flat buffers by name (say,
	// Adam's "exp_avg" and "exp_avg_sq"; see optim.SaveTraining), one value
	// per parameter each, stored as tensors "optimizer.<name>".
	OptimizerBuffers map[string][]float32
	// RNG is an optional opaque generator state (say, from
	// rand.PCG.MarshalBinary) for randomness that is not a function of
	// Seed; nil when there is none.
	RNG []byte
	// ModelMetadata is written into the model file's metadata besides the
	// counters (say, which architecture the weights are for, so that a
	// program given only the model file can rebuild the model). The keys
	// SaveCheckpoint writes itself (format, ember.epoch, ember.step,
	// ember.global_step) are refused.
	ModelMetadata map[string]string
}

// ErrStateMismatch is wrapped by the error LoadCheckpoint returns when the
// model file and the training state beside it do not belong together.
var ErrStateMismatch = errors.New("model file and training state do not belong together")

// State file metadata keys and values.
const (
	stateFormat       = "ember.training_state"
	stateVersion      = "1"
	stateModelPrefix  = "model."
	stateMomentumName = "optimizer.momentum"
	// stateOptimizerPrefix starts the names of the optimiser's buffers.
	stateOptimizerPrefix = "optimizer."
	stateFlagPrefix      = "flag."
)

// StatePath returns the path of the training state saved beside the model
// file modelPath: X.safetensors → X.state.safetensors (any other name gets
// ".state.safetensors" appended).
func StatePath(modelPath string) string {
	return strings.TrimSuffix(modelPath, ".safetensors") + ".state.safetensors"
}

// Fingerprint is the SHA-256, in hex, of the tensors' names, shapes and
// values, independent of their order: two files with the same fingerprint
// hold the same state dict, however their headers are laid out.
func Fingerprint(tensors []NamedTensor) string {
	es := make([]fpEntry, len(tensors))
	for i, t := range tensors {
		es[i] = fpEntry{name: t.Name, shape: t.Shape, f32: t.Data}
	}
	return fingerprint(es)
}

// fpEntry is a tensor to fingerprint, with its values as float32s or as
// raw little-endian bytes.
type fpEntry struct {
	name  string
	shape []int
	f32   []float32
	raw   []byte
}

func fingerprint(es []fpEntry) string {
	slices.SortFunc(es, func(a, b fpEntry) int { return strings.Compare(a.name, b.name) })
	h := sha256.New()
	var buf []byte
	for _, e := range es {
		buf = binary.LittleEndian.AppendUint64(buf[:0], uint64(len(e.name)))
		buf = append(buf, e.name...)
		buf = binary.LittleEndian.AppendUint64(buf, uint64(len(e.shape)))
		for _, d := range e.shape {
			buf = binary.LittleEndian.AppendUint64(buf, uint64(d))
		}
		h.Write(buf)
		h.Write(e.raw)
		for j := 0; j < len(e.f32); {
			buf = buf[:0]
			for ; j < len(e.f32) && len(buf) < 64<<10; j++ {
				buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(e.f32[j]))
			}
			h.Write(buf)
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// fileFingerprint is the Fingerprint of the F32 tensors of the safetensors
// file at path, "" if it cannot be read or does not hold m's parameters
// (then it is not read past its header).
func fileFingerprint(path string, m Module) string {
	f, err := readSafetensorsFile(path, func(f *SafetensorsFile) error { return checkStateDict(f, m, "") })
	if err != nil {
		return ""
	}
	es := make([]fpEntry, len(f.Tensors))
	for i, t := range f.Tensors {
		switch {
		case t.DType == "F32":
			es[i] = fpEntry{name: t.Name, shape: t.Shape, raw: f.data[t.Begin:t.End]}
		case stateDType(t.Name, t.DType): // a count, fingerprinted as the float32 it loads as
			vals, err := decodeValues(path, t, f.data[t.Begin:t.End])
			if err != nil {
				return ""
			}
			es[i] = fpEntry{name: t.Name, shape: t.Shape, f32: vals}
		default:
			return ""
		}
	}
	return fingerprint(es)
}

// SaveCheckpoint writes the parameters of m to modelPath (as SaveFile does,
// with the epoch and global step in the metadata) and the training state to
// StatePath(modelPath), each atomically and in the order that keeps a
// resumable checkpoint after a crash at any moment (see the comment at the
// top of this file). The directory must exist. Weights or momentum that are
// not finite are refused (ErrNonFinite) and nothing is written.
func SaveCheckpoint(modelPath string, m Module, st *TrainingState) error {
	statePath := StatePath(modelPath)
	if st == nil {
		return ckErrorf(statePath, nil, "no training state to save")
	}
	if st.Epoch < 0 || st.Step < 0 || st.GlobalStep < 0 || st.OptimizerSteps < 0 {
		return ckErrorf(statePath, nil, "negative counter in the training state (epoch %d, step %d, global step %d, optimizer steps %d)",
			st.Epoch, st.Step, st.GlobalStep, st.OptimizerSteps)
	}
	if n := numParameters(m); len(st.Momentum) != 0 && len(st.Momentum) != n {
		return ckErrorf(statePath, nil, "the training state has %d momentum values but the model has %d parameters", len(st.Momentum), n)
	}
	for _, name := range slices.Sorted(maps.Keys(st.OptimizerBuffers)) {
		if name == "" || stateOptimizerPrefix+name == stateMomentumName {
			return ckErrorf(statePath, nil, "optimizer buffer named %q (the momentum goes in Momentum)", name)
		}
		if n := numParameters(m); len(st.OptimizerBuffers[name]) != n {
			return ckErrorf(statePath, nil, "the training state's optimizer buffer %q has %d values but the model has %d parameters", name, len(st.OptimizerBuffers[name]), n)
		}
	}
	var weights []NamedTensor
	if err := tensor.Guard(func() { weights = StateDict(m) }); err != nil {
		return ckErrorf(modelPath, err, "copying the parameters from the device: %v", err)
	}
	// A checkpoint of NaN weights would only be refused at load: refuse it
	// now, so that the previous (good) one stays in place.
	for _, w := range weights {
		if err := CheckFinite(modelPath, w.Name, w.Data); err != nil {
			return err
		}
	}
	if err := CheckFinite(statePath, stateMomentumName, st.Momentum); err != nil {
		return err
	}
	fp := Fingerprint(weights)

	meta := map[string]string{
		"format":              stateFormat,
		"ember.state_version": stateVersion,
		"epoch":               strconv.Itoa(st.Epoch),
		"step":                strconv.Itoa(st.Step),
		"global_step":         strconv.Itoa(st.GlobalStep),
		"optimizer_steps":     strconv.Itoa(st.OptimizerSteps),
		"seed":                strconv.FormatUint(st.Seed, 10),
		"model_file":          filepath.Base(modelPath),
		"model_sha256":        fp,
	}
	if prev := fileFingerprint(modelPath, m); prev != "" {
		meta["previous_model_sha256"] = prev
	}
	if st.RNG != nil {
		meta["rng"] = base64.StdEncoding.EncodeToString(st.RNG)
	}
	for k, v := range st.Flags {
		meta[stateFlagPrefix+k] = v
	}
	stateTensors := make([]NamedTensor, 0, len(weights)+1)
	for _, w := range weights {
		stateTensors = append(stateTensors, NamedTensor{Name: stateModelPrefix + w.Name, Shape: w.Shape, Data: w.Data})
	}
	if len(st.Momentum) > 0 {
		stateTensors = append(stateTensors, NamedTensor{Name: stateMomentumName, Shape: []int{len(st.Momentum)}, Data: st.Momentum})
	}
	for _, name := range slices.Sorted(maps.Keys(st.OptimizerBuffers)) {
		b := st.OptimizerBuffers[name]
		stateTensors = append(stateTensors, NamedTensor{Name: stateOptimizerPrefix + name, Shape: []int{len(b)}, Data: b})
	}
	modelMeta := map[string]string{
		"format":            "pt",
		"ember.epoch":       strconv.Itoa(st.Epoch),
		"ember.step":        strconv.Itoa(st.Step),
		"ember.global_step": strconv.Itoa(st.GlobalStep),
	}
	for k, v := range st.ModelMetadata {
		if _, taken := modelMeta[k]; taken {
			return ckErrorf(modelPath, nil, "model metadata key %q is written by SaveCheckpoint itself", k)
		}
		modelMeta[k] = v
	}

	ps, err := atomicfile.Prepare(statePath, 0o644, func(w io.Writer) error {
		return WriteSafetensors(w, stateTensors, meta)
	})
	if err != nil {
		return writeError(statePath, err)
	}
	pm, err := atomicfile.Prepare(modelPath, 0o644, func(w io.Writer) error {
		return WriteSafetensors(w, weights, modelMeta)
	})
	if err != nil {
		ps.Discard()
		return writeError(modelPath, err)
	}
	if err := atomicfile.CommitAll(ps, pm); err != nil {
		return writeError(modelPath, err)
	}
	return nil
}

// LoadCheckpoint loads a checkpoint written by SaveCheckpoint: it reads and
// checks the training state StatePath(modelPath) and the model file
// modelPath, checks that both hold m's parameters (strictly, as LoadFile)
// and that they belong together (see the comment at the top of this file),
// and only then sets m's parameters to the weights saved with the state.
// Errors are *CheckpointError naming the file at fault; a model file and
// state that do not belong together give one that wraps ErrStateMismatch,
// a missing state file one that wraps fs.ErrNotExist, and weights or
// momentum holding NaN or an infinity one that wraps ErrNonFinite. Only
// regular files are read, each header is checked against m before any
// data is read, and so memory stays bounded by m's size.
func LoadCheckpoint(modelPath string, m Module) (*TrainingState, error) {
	statePath := StatePath(modelPath)
	n := numParameters(m)
	var st *TrainingState
	var allow []string
	// Everything the header says is checked before the data is read: the
	// memory taken is bounded by the model's size.
	sf, err := readSafetensorsFile(statePath, func(sf *SafetensorsFile) error {
		var err error
		if st, err = parseStateMetadata(sf); err != nil {
			return err
		}
		// Optimiser buffers (Adam's moments, ...) are one value per
		// parameter, as the momentum.
		allow = []string{stateMomentumName}
		for _, t := range sf.Tensors {
			if strings.HasPrefix(t.Name, stateOptimizerPrefix) && t.Name != stateMomentumName {
				allow = append(allow, t.Name)
			}
		}
		if err := checkStateDict(sf, m, stateModelPrefix, allow...); err != nil {
			return err
		}
		for _, name := range allow {
			if t, ok := sf.Lookup(name); ok && (t.DType != "F32" || len(t.Shape) != 1 || t.Shape[0] != n) {
				return ckErrorf(statePath, nil, "tensor %q is %s %v, want F32 [%d] (one value per parameter of the model)", name, t.DType, t.Shape, n)
			}
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if _, merr := os.Stat(modelPath); merr == nil {
				return nil, ckErrorf(statePath, err, "no such file: %s has no training state beside it (resuming needs a checkpoint written by SaveCheckpoint)", modelPath)
			}
		}
		return nil, err
	}
	for _, name := range allow[1:] {
		if st.OptimizerBuffers == nil {
			st.OptimizerBuffers = map[string][]float32{}
		}
		vals, _ := sf.Float32s(name)
		if err := CheckFinite(statePath, name, vals); err != nil {
			return nil, err
		}
		st.OptimizerBuffers[strings.TrimPrefix(name, stateOptimizerPrefix)] = vals
	}
	vals, err := decodeStateDict(sf, m, stateModelPrefix, allow...)
	if err != nil {
		return nil, err
	}
	if _, ok := sf.Lookup(stateMomentumName); ok {
		st.Momentum, _ = sf.Float32s(stateMomentumName)
		if err := CheckFinite(statePath, stateMomentumName, st.Momentum); err != nil {
			return nil, err
		}
	}
	stateFP := fingerprintOf(m, vals)
	if want := sf.Metadata["model_sha256"]; stateFP != want {
		return nil, ckErrorf(statePath, nil, "its weights have fingerprint %s but its metadata records model_sha256 %s: the file is corrupt", short(stateFP), short(want))
	}

	mf, err := readSafetensorsFile(modelPath, func(mf *SafetensorsFile) error { return checkStateDict(mf, m, "") })
	if err != nil {
		return nil, err
	}
	mvals, err := decodeStateDict(mf, m, "")
	if err != nil {
		return nil, err
	}
	if modelFP := fingerprintOf(m, mvals); modelFP != stateFP && modelFP != sf.Metadata["previous_model_sha256"] {
		return nil, ckErrorf(modelPath, ErrStateMismatch,
			"does not hold the weights saved with %s (global step %d; fingerprints %s and %s): the model file was replaced, or the state belongs to another checkpoint",
			filepath.Base(statePath), st.GlobalStep, short(modelFP), short(stateFP))
	}
	if err := setParameters(statePath, m, vals); err != nil {
		return nil, err
	}
	return st, nil
}

// IsCheckpointFile reports whether path holds a file that SaveCheckpoint
// wrote, a model file (its metadata has ember.global_step) or a training
// state, judging by the header only. A program about to save a checkpoint
// over path can tell this way that it replaces only its own files.
func IsCheckpointFile(path string) bool {
	meta, err := ReadSafetensorsMetadata(path)
	if err != nil {
		return false
	}
	_, model := meta["ember.global_step"]
	return model || meta["format"] == stateFormat
}

// numParameters counts the learnable scalars of m, leaving out nil
// parameters (a layer without bias).
func numParameters(m Module) int {
	n := 0
	for _, p := range Parameters(m) {
		if p.Tensor != nil {
			n += p.Tensor.Len()
		}
	}
	return n
}

func short(fp string) string {
	if len(fp) > 12 {
		return fp[:12]
	}
	return fp
}

// fingerprintOf is the Fingerprint of m's state dict (parameters and
// buffers, as SaveCheckpoint fingerprints it) with the values vals, in
// StateTensors' order.
func fingerprintOf(m Module, vals [][]float32) string {
	ps := StateTensors(m)
	ts := make([]NamedTensor, 0, len(ps))
	for i, p := range ps {
		if p.Tensor != nil {
			ts = append(ts, NamedTensor{Name: p.Name, Shape: p.Tensor.Shape(), Data: vals[i]})
		}
	}
	return Fingerprint(ts)
}

// parseStateMetadata reads the counters, seed, RNG and flags of a state
// file.
func parseStateMetadata(f *SafetensorsFile) (*TrainingState, error) {
	meta := f.Metadata
	if meta["format"] != stateFormat {
		return nil, ckErrorf(f.Name, nil, "not a training state (its metadata has no \"format\": %q; a file written by SaveFile holds only a model)", stateFormat)
	}
	if v := meta["ember.state_version"]; v != stateVersion {
		return nil, ckErrorf(f.Name, nil, "training state version %q, this program reads version %s", v, stateVersion)
	}
	st := &TrainingState{}
	ints := []struct {
		key string
		dst *int
	}{{"epoch", &st.Epoch}, {"step", &st.Step}, {"global_step", &st.GlobalStep}, {"optimizer_steps", &st.OptimizerSteps}}
	for _, it := range ints {
		v, err := strconv.Atoi(meta[it.key])
		if err != nil || v < 0 {
			return nil, ckErrorf(f.Name, nil, "metadata %q is %q, want a non-negative integer", it.key, meta[it.key])
		}
		*it.dst = v
	}
	seed, err := strconv.ParseUint(meta["seed"], 10, 64)
	if err != nil {
		return nil, ckErrorf(f.Name, nil, "metadata \"seed\" is %q, want an unsigned integer", meta["seed"])
	}
	st.Seed = seed
	if s, ok := meta["rng"]; ok {
		st.RNG, err = base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, ckErrorf(f.Name, nil, "metadata \"rng\" is not base64: %v", err)
		}
	}
	if len(meta["model_sha256"]) != 64 {
		return nil, ckErrorf(f.Name, nil, "metadata \"model_sha256\" is %q, want 64 hex digits", meta["model_sha256"])
	}
	st.Flags = map[string]string{}
	for k, v := range meta {
		if name, ok := strings.CutPrefix(k, stateFlagPrefix); ok {
			st.Flags[name] = v
		}
	}
	return st, nil
}

// RemoveCheckpointTemps removes the temporary files that interrupted saves
// of the checkpoint modelPath (model and state) left behind, and returns
// their paths. Call it only when no other process may be saving to the same
// path, say when a training run starts.
func RemoveCheckpointTemps(modelPath string) ([]string, error) {
	a, err := atomicfile.RemoveTemps(modelPath)
	if err != nil {
		return a, fmt.Errorf("nn: %s: removing temporary files: %w", modelPath, err)
	}
	b, err := atomicfile.RemoveTemps(StatePath(modelPath))
	if err != nil {
		return append(a, b...), fmt.Errorf("nn: %s: removing temporary files: %w", StatePath(modelPath), err)
	}
	return append(a, b...), nil
}
