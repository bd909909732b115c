package cuda

import (
	"fmt"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// TestRecordedNormRandom runs the normalisation and random-number
// operations on the recording backend in every mode (argument checks
// against the kernels' signatures, pointers inside allocated memory; values are not computed: the conformance suite checks those on a
// GPU).
func TestRecordedNormRandom(t *testing.T) {
	b, rec := newRecordingBackend(t)
	f := func(n int) tensor.Buffer {
		buf, err := b.Alloc(n, tensor.Float32)
		if err != nil {
			t.Fatal(err)
		}
		return buf
	}
	// odd is a buffer one element into its allocation: not 16-byte aligned.
	odd := func(n int) tensor.Buffer { return f(n+1).Slice(1, n) }
	var none tensor.Buffer
	for _, d := range []tensor.Distribution{tensor.Uniform, tensor.Normal, tensor.Bernoulli} {
		b.Random(f(4099), d, 1, 1<<32-3, 0, 1)
		b.Random(f(1), d, 0, 0, 0.5, 1)
	}
	b.Random(f(0), tensor.Uniform, 0, 0, 0, 1)
	state, err := b.Alloc(4, tensor.Int32)
	if err != nil {
		t.Fatal(err)
	}
	b.RandomAt(f(4099), tensor.Normal, state, 0, 1)
	b.RandomAt(f(0), tensor.Uniform, state, 0, 1)
	for _, s := range [][3]int{{2, 3, 35}, {2, 3, 1}, {8, 5000, 1}} {
		n, c, inner := s[0], s[1], s[2]
		total := n * c * inner
		for _, affine := range []bool{true, false} {
			w, bias := none, none
			if affine {
				w, bias = f(c), f(c)
			}
			b.BatchNorm(f(total), f(c), f(c), f(c), f(c), f(total), w, bias, n, c, inner, true, 0.1, 1e-5)
			b.BatchNorm(f(total), f(c), f(c), none, none, f(total), w, bias, n, c, inner, true, 0.1, 1e-5)
			b.BatchNorm(f(total), f(c), f(c), f(c), f(c), f(total), w, bias, n, c, inner, false, 0.1, 1e-5)
			b.BatchNorm(f(total), f(c), f(c), f(c), f(c), odd(total), w, bias, n, c, inner, true, 0.1, 1e-5)
			b.BatchNormBackward(odd(total), f(c), f(c), f(total), f(total), w, f(c), f(c), n, c, inner, true, true, false, true)
			for _, training := range []bool{true, false} {
				b.BatchNormBackward(f(total), f(c), f(c), f(total), f(total), w, f(c), f(c), n, c, inner, training, true, false, true)
				b.BatchNormBackward(f(total), none, none, f(total), f(total), w, f(c), f(c), n, c, inner, training, false, false, false)
				b.BatchNormBackward(none, f(c), none, f(total), f(total), w, f(c), f(c), n, c, inner, training, false, true, false)
			}
		}
	}
	for _, s := range [][2]int{{1, 35}, {257, 3}, {5000, 7}, {3, 4099}, {0, 5}} {
		rows, cols := s[0], s[1]
		for _, affine := range []bool{true, false} {
			w, bias := none, none
			if affine {
				w, bias = f(cols), f(cols)
			}
			b.LayerNorm(f(rows*cols), f(rows), f(rows), f(rows*cols), w, bias, rows, cols, 1e-5)
			b.LayerNormBackward(f(rows*cols), f(cols), f(cols), f(rows*cols), f(rows*cols), w, f(rows), f(rows), rows, cols, true, true, false)
			b.LayerNormBackward(f(rows*cols), none, none, f(rows*cols), f(rows*cols), w, f(rows), f(rows), rows, cols, false, false, false)
			b.LayerNormBackward(none, none, f(cols), f(rows*cols), f(rows*cols), w, f(rows), f(rows), rows, cols, false, false, false)
		}
	}
	if err := b.Synchronize(); err != nil {
		t.Errorf("Synchronize: %v", err)
	}
	for _, k := range []string{"ember_random", "ember_random_state", "ember_random_advance", "ember_batch_norm_stats_partial",
		"ember_batch_norm_finish", "ember_batch_norm_apply", "ember_batch_norm_apply4", "ember_batch_norm_backward_partial",
		"ember_batch_norm_backward_finish", "ember_batch_norm_backward_dx", "ember_batch_norm_backward_dx4", "ember_layer_norm", "ember_layer_norm_warp", "ember_layer_norm_backward_dx", "ember_layer_norm_backward_dx_warp",
		"ember_layer_norm_params_partial", "ember_layer_norm_params_finish"} {
		if rec.launches[k] == 0 {
			t.Errorf("%s was never launched", k)
		}
	}
}

// TestRecordedNormAutograd runs the tensor-level BatchNorm, LayerNorm and
// Dropout forward and backward on the recording backend.
func TestRecordedNormAutograd(t *testing.T) {
	b, rec := newRecordingBackend(t)
	s := tensor.NewScope()
	defer s.Release()
	x := tensor.Zeros(b, s, 2, 3, 7, 5).SetRequiresGrad(true)
	w, bias := tensor.Full(b, s, 1, 3).SetRequiresGrad(true), tensor.Zeros(b, s, 3).SetRequiresGrad(true)
	rm, rv := tensor.Zeros(b, s, 3), tensor.Full(b, s, 1, 3)
	y := tensor.BatchNorm(x, w, bias, rm, rv, true, 0.1, 1e-5)
	y = tensor.LayerNorm(y, []int{7, 5}, tensor.Full(b, s, 1, 7, 5), nil, 1e-5)
	y = tensor.Dropout(y, 0.25, true, tensor.NewGenerator(3))
	tensor.Sum(y).Backward()
	if rec.launches["ember_batch_norm_backward_dx4"] == 0 || rec.launches["ember_layer_norm_backward_dx_warp"] == 0 || rec.launches["ember_dropout"] == 0 {
		t.Errorf("backward kernels not launched: %v", rec.launches)
	}
}

// TestRecordedDeviceGenerator draws through a DeviceGenerator on the
// recording backend: taking the state, the draw and the advance are
// kernels (no host round trip, so they can be captured), and Dropout's
// backward pass draws its mask again from the saved state.
func TestRecordedDeviceGenerator(t *testing.T) {
	b, rec := newRecordingBackend(t)
	s := tensor.NewScope()
	defer s.Release()
	g := tensor.NewDeviceGenerator(b, 5)
	defer g.Release()
	copies := rec.copies
	x := tensor.Zeros(b, s, 33, 7).SetRequiresGrad(true)
	y := tensor.Dropout(x, 0.5, true, g)
	if rec.launches["ember_random_take_state"] != 1 || rec.launches["ember_dropout_state"] != 1 || rec.launches["ember_dropout"] != 0 {
		t.Errorf("launches %v; want one ember_random_take_state and one ember_dropout_state", rec.launches)
	}
	tensor.RandN(b, s, g, 5)
	if rec.launches["ember_random_state"] != 1 || rec.launches["ember_random_advance"] != 1 {
		t.Errorf("launches %v; want one ember_random_state and one ember_random_advance", rec.launches)
	}
	tensor.Sum(y).Backward()
	if rec.launches["ember_dropout_state"] != 2 || rec.launches["ember_random_take_state"] != 1 {
		t.Errorf("launches %v after the backward pass; want the mask drawn again (a second ember_dropout_state)", rec.launches)
	}
	if rec.copies != copies {
		t.Errorf("%d host copies during a device-generator draw", rec.copies-copies)
	}
}

// The normalisation kernels that reduce over a block (block sums, warp
// sums, lanes of 32 columns) need whole warps.
func init() {
	for _, k := range []string{"ember_batch_norm_stats_partial", "ember_batch_norm_backward_partial",
		"ember_batch_norm_finish", "ember_batch_norm_backward_finish", "ember_layer_norm", "ember_layer_norm_warp", "ember_layer_norm_backward_dx", "ember_layer_norm_backward_dx_warp",
		"ember_layer_norm_params_partial", "ember_layer_norm_params_finish"} {
		blockSized[k] = true
	}
}

// geometryExec records the grid and block of every launch by kernel name.
type geometryExec struct {
	executor
	grids map[string][]int
}

func (g *geometryExec) launch(f *Function, grid, block Dim3, args []any) error {
	g.grids[f.Name] = append(g.grids[f.Name], grid.X*grid.Y*grid.Z)
	return g.executor.launch(f, grid, block, args)
}

// TestRecordedNormGeometry checks that the benchmark's shapes launch grids
// that fill an H200 (132 SMs, at least four blocks each) in every pass
// over the data, where one block per channel or per column used to leave
// most of it idle.
func TestRecordedNormGeometry(t *testing.T) {
	b, _ := newRecordingBackend(t)
	g := &geometryExec{executor: b.x, grids: map[string][]int{}}
	b.x = g
	f := func(n int) tensor.Buffer {
		buf, err := b.Alloc(n, tensor.Float32)
		if err != nil {
			t.Fatal(err)
		}
		return buf
	}
	const filled = 4 * 132
	check := func(what, kernel string, least int) {
		t.Helper()
		grids := g.grids[kernel]
		if len(grids) == 0 {
			t.Errorf("%s: %s not launched", what, kernel)
			return
		}
		for _, n := range grids {
			if n < least {
				t.Errorf("%s: %s launched on %d blocks, want at least %d", what, kernel, n, least)
			}
		}
	}
	for _, s := range [][3]int{{512, 64, 28 * 28}, {512, 128, 14 * 14}, {512, 256, 7 * 7}} {
		n, c, inner := s[0], s[1], s[2]
		total := n * c * inner
		clear(g.grids)
		b.BatchNorm(f(total), f(c), f(c), f(c), f(c), f(total), f(c), f(c), n, c, inner, true, 0.1, 1e-5)
		b.BatchNormBackward(f(total), f(c), f(c), f(total), f(total), f(c), f(c), f(c), n, c, inner, true, false, false, false)
		what := fmt.Sprintf("BatchNorm [%d,%d,%d]", n, c, inner)
		for _, k := range []string{"ember_batch_norm_stats_partial", "ember_batch_norm_apply4",
			"ember_batch_norm_backward_partial", "ember_batch_norm_backward_dx4"} {
			check(what, k, filled)
		}
	}
	const rows, cols = 64 * 256, 384
	clear(g.grids)
	b.LayerNorm(f(rows*cols), f(rows), f(rows), f(rows*cols), f(cols), f(cols), rows, cols, 1e-5)
	b.LayerNormBackward(f(rows*cols), f(cols), f(cols), f(rows*cols), f(rows*cols), f(cols), f(rows), f(rows), rows, cols, false, false, false)
	for _, k := range []string{"ember_layer_norm_warp", "ember_layer_norm_backward_dx_warp", "ember_layer_norm_params_partial"} {
		check("LayerNorm [16384,384]", k, filled)
	}
	if err := b.Synchronize(); err != nil {
		t.Errorf("Synchronize: %v", err)
	}
}
