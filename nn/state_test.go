package nn

import (
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func testState(m Module, step int) *TrainingState {
	mom := make([]float32, NumParameters(m))
	for i := range mom {
		mom[i] = float32(i%17) * 0.25
	}
	return &TrainingState{
		Epoch: 2, Step: 17, GlobalStep: step, Seed: 1<<63 + 5,
		Flags:    map[string]string{"lr": "0.01", "momentum": "0.9", "batch-size": "64", "device": "cpu"},
		Momentum: mom, OptimizerSteps: step, RNG: []byte{0, 1, 2, 250},
	}
}

func TestStatePath(t *testing.T) {
	for in, want := range map[string]string{
		"lenet.safetensors":     "lenet.state.safetensors",
		"/a/b/x.y.safetensors":  "/a/b/x.y.state.safetensors",
		"model.bin":             "model.bin.state.safetensors",
		"dir.safetensors/model": "dir.safetensors/model.state.safetensors",
	} {
		if got := StatePath(in); got != want {
			t.Errorf("StatePath(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCheckpointRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "net.safetensors")
	a := testNet(1)
	st := testState(a, 1234)
	if err := SaveCheckpoint(path, a, st); err != nil {
		t.Fatal(err)
	}
	b := testNet(2)
	got, err := LoadCheckpoint(path, b)
	if err != nil {
		t.Fatal(err)
	}
	if !sameValues(paramValues(a), paramValues(b)) {
		t.Error("parameters differ after LoadCheckpoint")
	}
	if got.Epoch != st.Epoch || got.Step != st.Step || got.GlobalStep != st.GlobalStep || got.Seed != st.Seed ||
		got.OptimizerSteps != st.OptimizerSteps || !slices.Equal(got.Momentum, st.Momentum) ||
		!maps.Equal(got.Flags, st.Flags) || !slices.Equal(got.RNG, st.RNG) {
		t.Errorf("state\n%+v\nwant\n%+v", got, st)
	}

	// The model file alone is a plain, strict state dict.
	c := testNet(3)
	if err := LoadFile(path, c); err != nil {
		t.Fatal(err)
	}
	if !sameValues(paramValues(a), paramValues(c)) {
		t.Error("model file holds other parameters")
	}
	f, err := ReadSafetensorsFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(f.Tensors) != 4 || f.Metadata["format"] != "pt" || f.Metadata["ember.global_step"] != "1234" {
		t.Errorf("model file: %d tensors, metadata %q", len(f.Tensors), f.Metadata)
	}
	assertNoCheckpointTemps(t, path)
}

func TestCheckpointWithoutMomentum(t *testing.T) {
	path := filepath.Join(t.TempDir(), "net.safetensors")
	a := testNet(1)
	if err := SaveCheckpoint(path, a, &TrainingState{Epoch: 1}); err != nil {
		t.Fatal(err)
	}
	st, err := LoadCheckpoint(path, testNet(2))
	if err != nil {
		t.Fatal(err)
	}
	if st.Momentum != nil || st.RNG != nil || st.Epoch != 1 || len(st.Flags) != 0 {
		t.Errorf("state %+v", st)
	}
}

func TestSaveCheckpointErrors(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "net.safetensors")
	m := testNet(1)
	bad := testState(m, 1)
	bad.Momentum = bad.Momentum[:5]
	err := SaveCheckpoint(path, m, bad)
	if err == nil || !strings.Contains(err.Error(), "5 momentum values but the model has 47 parameters") {
		t.Errorf("short momentum: %v", err)
	}
	if err := SaveCheckpoint(path, m, &TrainingState{Step: -1}); err == nil {
		t.Error("negative step saved")
	}
	if err := SaveCheckpoint(path, m, nil); err == nil {
		t.Error("nil state saved")
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Error("a failed save wrote the model file")
	}
	err = SaveCheckpoint(filepath.Join(dir, "missing", "net.safetensors"), m, testState(m, 1))
	if err == nil || !errors.Is(err, fs.ErrNotExist) || strings.ContainsAny(err.Error(), "\n") {
		t.Errorf("save into a missing directory: %v", err)
	}
	assertNoCheckpointTemps(t, path)
}

// TestCheckpointInterruptedSave reproduces what a crash between the two
// renames of SaveCheckpoint leaves (the new state beside the old model
// file), twice in a row, and checks that the checkpoint still resumes with
// the new weights.
func TestCheckpointInterruptedSave(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "net.safetensors")
	nets := []*Sequential{testNet(1), testNet(2), testNet(3)}
	if err := SaveCheckpoint(path, nets[0], testState(nets[0], 1)); err != nil {
		t.Fatal(err)
	}
	oldModel, _ := os.ReadFile(path)
	for i, m := range nets[1:] {
		if err := SaveCheckpoint(path, m, testState(m, i+2)); err != nil {
			t.Fatal(err)
		}
		// "Crash": the model rename did not happen.
		if err := os.WriteFile(path, oldModel, 0o644); err != nil {
			t.Fatal(err)
		}
		into := testNet(9)
		st, err := LoadCheckpoint(path, into)
		if err != nil {
			t.Fatalf("save %d: %v", i+2, err)
		}
		if st.GlobalStep != i+2 || !sameValues(paramValues(into), paramValues(m)) {
			t.Fatalf("save %d: resumed at step %d, or with other weights", i+2, st.GlobalStep)
		}
	}
}

func TestCheckpointMismatch(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "net.safetensors")
	a := testNet(1)
	if err := SaveCheckpoint(path, a, testState(a, 10)); err != nil {
		t.Fatal(err)
	}
	// Model file replaced by another model.
	if err := SaveFile(path, testNet(2), nil); err != nil {
		t.Fatal(err)
	}
	into := testNet(3)
	before := paramValues(into)
	_, err := LoadCheckpoint(path, into)
	if !errors.Is(err, ErrStateMismatch) || !strings.Contains(err.Error(), "nn: "+path+": does not hold the weights saved with net.state.safetensors (global step 10") {
		t.Errorf("replaced model file: %v", err)
	}
	if !sameValues(before, paramValues(into)) {
		t.Error("a failed LoadCheckpoint changed the model")
	}

	// State file from another checkpoint.
	other := filepath.Join(dir, "other.safetensors")
	b := testNet(4)
	if err := SaveCheckpoint(other, b, testState(b, 3)); err != nil {
		t.Fatal(err)
	}
	if err := SaveCheckpoint(path, a, testState(a, 11)); err != nil {
		t.Fatal(err)
	}
	st, _ := os.ReadFile(StatePath(other))
	os.WriteFile(StatePath(path), st, 0o644)
	if _, err := LoadCheckpoint(path, into); !errors.Is(err, ErrStateMismatch) {
		t.Errorf("state of another checkpoint: %v", err)
	}
}

func TestLoadCheckpointErrors(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "net.safetensors")
	m := testNet(1)

	// Only a model file (SaveFile): no state beside it.
	if err := SaveFile(path, m, nil); err != nil {
		t.Fatal(err)
	}
	_, err := LoadCheckpoint(path, testNet(2))
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), StatePath(path)+": no such file: "+path+" has no training state beside it") {
		t.Errorf("no state: %v", err)
	}
	// Nothing at all.
	_, err = LoadCheckpoint(filepath.Join(dir, "none.safetensors"), testNet(2))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("no files: %v", err)
	}
	// A plain model file where the state should be.
	if err := SaveFile(StatePath(path), m, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCheckpoint(path, testNet(2)); err == nil || !strings.Contains(err.Error(), "not a training state") {
		t.Errorf("model file as state: %v", err)
	}

	// A checkpoint of another architecture.
	if err := SaveCheckpoint(path, m, testState(m, 1)); err != nil {
		t.Fatal(err)
	}
	other := &Sequential{Layers: []Layer{{"conv1", NewConv2d(m.Layers[0].Module.(*Conv2d).Weight.Backend(), nil, 1, 2, 3)}, {"fc1", NewLinear(m.Layers[0].Module.(*Conv2d).Weight.Backend(), nil, 9, 3)}}}
	_, err = LoadCheckpoint(path, other)
	if err == nil || !strings.Contains(err.Error(), `tensor "model.fc1.weight" has shape [3 8] in the file but [3 9] in the model`) {
		t.Errorf("other architecture: %v", err)
	}

	// A state whose weights do not match its recorded fingerprint.
	f, err := ReadSafetensorsFile(StatePath(path))
	if err != nil {
		t.Fatal(err)
	}
	var ts []NamedTensor
	for _, tt := range f.Tensors {
		v, _ := f.Float32s(tt.Name)
		ts = append(ts, NamedTensor{tt.Name, tt.Shape, v})
	}
	ts[0].Data[0]++
	enc, _ := EncodeSafetensors(ts, f.Metadata)
	os.WriteFile(StatePath(path), enc, 0o644)
	if _, err := LoadCheckpoint(path, testNet(2)); err == nil || !strings.Contains(err.Error(), "the file is corrupt") {
		t.Errorf("corrupt state: %v", err)
	}

	// Bad counters in the metadata.
	meta := maps.Clone(f.Metadata)
	meta["epoch"] = "-3"
	ts[0].Data[0]--
	enc, _ = EncodeSafetensors(ts, meta)
	os.WriteFile(StatePath(path), enc, 0o644)
	if _, err := LoadCheckpoint(path, testNet(2)); err == nil || !strings.Contains(err.Error(), `metadata "epoch" is "-3"`) {
		t.Errorf("bad epoch: %v", err)
	}
}

func TestRemoveCheckpointTemps(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "net.safetensors")
	for _, n := range []string{".net.safetensors.tmp-1", ".net.state.safetensors.tmp-2"} {
		os.WriteFile(filepath.Join(dir, n), nil, 0o600)
	}
	removed, err := RemoveCheckpointTemps(path)
	if err != nil || len(removed) != 2 {
		t.Errorf("removed %v, %v", removed, err)
	}
	assertNoCheckpointTemps(t, path)
}

func assertNoCheckpointTemps(t *testing.T, path string) {
	t.Helper()
	ents, _ := os.ReadDir(filepath.Dir(path))
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("temporary file left: %s", e.Name())
		}
	}
}

// TestCheckpointModelMetadata: ModelMetadata goes into the model file's
// metadata beside the counters, and may not replace them.
func TestCheckpointModelMetadata(t *testing.T) {
	path := filepath.Join(t.TempDir(), "net.safetensors")
	a := testNet(1)
	st := testState(a, 7)
	st.ModelMetadata = map[string]string{"ember.model": "net", "ember.model_config": `{"classes":3}`}
	if err := SaveCheckpoint(path, a, st); err != nil {
		t.Fatal(err)
	}
	meta, err := ReadSafetensorsMetadata(path)
	if err != nil {
		t.Fatal(err)
	}
	if meta["ember.model"] != "net" || meta["ember.model_config"] != `{"classes":3}` || meta["ember.global_step"] != "7" || meta["format"] != "pt" {
		t.Errorf("model file metadata %q", meta)
	}
	for _, key := range []string{"format", "ember.global_step"} {
		st.ModelMetadata = map[string]string{key: "x"}
		other := filepath.Join(t.TempDir(), "other.safetensors")
		if err := SaveCheckpoint(other, a, st); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("ModelMetadata %q: %v, want an error naming it", key, err)
		}
		if _, err := os.Stat(other); err == nil {
			t.Errorf("ModelMetadata %q: a file was written", key)
		}
	}
}
