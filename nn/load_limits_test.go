package nn

import (
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// TestLoadSpecialFiles: a device or a FIFO given as a model is refused by
// kind at once, neither read to the end (/dev/zero has none) nor waited on.
func TestLoadSpecialFiles(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Skipf("no FIFOs: %v", err)
	}
	m := NewLinear(tensor.CPU, nil, 3, 2)
	for path, want := range map[string]string{
		"/dev/zero": "is a character device, not a regular file",
		fifo:        "is a named pipe (FIFO), not a regular file",
		"/tmp":      "is a directory, not a regular file",
	} {
		err := LoadFile(path, m)
		if err == nil || err.Error() != "nn: "+path+": "+want {
			t.Errorf("%s: %v, want %q", path, err, want)
		}
	}
}

// TestLoadReadsNoMoreThanTheModel: a file whose header describes tensors
// far larger than the model's is refused from its header, before its data
// is read (the file here is sparse: 8 GiB that take no disk).
func TestLoadReadsNoMoreThanTheModel(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.safetensors")
	const bias = 1 << 31 // values
	hdr := `{"weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"bias":{"dtype":"F32","shape":[2147483648],"data_offsets":[24,8589934616]}}`
	for len(hdr)%8 != 0 {
		hdr += " "
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(binary.LittleEndian.AppendUint64(nil, uint64(len(hdr))))
	f.WriteString(hdr)
	if err := f.Truncate(int64(8 + len(hdr) + 24 + 4*bias)); err != nil {
		t.Skipf("no sparse files: %v", err)
	}
	f.Close()
	if _, err := ReadSafetensorsMetadata(path); err != nil {
		t.Fatalf("the file is not well formed: %v", err)
	}
	err = LoadFile(path, NewLinear(tensor.CPU, nil, 3, 2))
	if err == nil || !strings.Contains(err.Error(), `tensor "bias" has shape [2147483648] in the file but [2] in the model`) {
		t.Fatalf("%v", err)
	}
}

func TestLoadRefusesNonFinite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nan.safetensors")
	m := NewLinear(tensor.CPU, nil, 3, 2)
	w := m.Weight.Float32s()
	w[4] = float32(math.NaN())
	m.Weight.CopyFrom(w)
	if err := SaveFile(path, m, nil); err != nil {
		t.Fatal(err)
	}
	err := LoadFile(path, NewLinear(tensor.CPU, nil, 3, 2))
	if !errors.Is(err, ErrNonFinite) || !strings.Contains(err.Error(), `tensor "weight" holds NaN at index 4`) {
		t.Errorf("%v", err)
	}
}

// TestNoBias: a layer without bias has no bias in its state dict, and saves
// and loads without it.
func TestNoBias(t *testing.T) {
	c := NewConv2d(tensor.CPU, nil, 1, 2, 3)
	c.Bias = nil
	path := filepath.Join(t.TempDir(), "c.safetensors")
	if err := SaveFile(path, c, nil); err != nil {
		t.Fatal(err)
	}
	if sd := StateDict(c); len(sd) != 1 || sd[0].Name != "weight" {
		t.Errorf("state dict %v", sd)
	}
	d := NewConv2d(tensor.CPU, nil, 1, 2, 3)
	d.Bias = nil
	if err := LoadFile(path, d); err != nil {
		t.Error(err)
	}
}
