package cuda

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ember-ml/ember/tensor"
)

// TestKernelUnitNames checks the loader's map from kernel names to units,
// which decides what a first use compiles: every declared kernel is in
// some unit, the lazily compiled convolution kernels in none that
// NewBackend compiles, each register-tiled kernel in both conv_rt units
// (compiled together, the one for its size holds it), and every name
// defined once.
func TestKernelUnitNames(t *testing.T) {
	l, err := newKernelLoader(&Backend{})
	if err != nil {
		t.Fatal(err)
	}
	rt := []int{2, 3}
	if kernelUnits[2].files[1] != "kernels/conv_rt.cu" || kernelUnits[3].files[1] != "kernels/conv_rt.cu" {
		t.Fatalf("units 2 and 3 are %v and %v; the test expects conv_rt.cu's", kernelUnits[2].files, kernelUnits[3].files)
	}
	for name, units := range l.byName {
		switch {
		case slices.Equal(units, rt):
		case len(units) != 1:
			t.Errorf("kernel %s is defined by units %v", name, units)
		}
	}
	// The convolutions' units, and the gathers, casts and augmented gather
	// (unit 10), compile on first use only.
	lazy := []string{"ember_conv_relu_pool_rt_5x5", "ember_conv_dx_rt_3x3", "ember_im2col", "ember_maxpool2d", "ember_conv_relu_pool_5x5_2x2",
		"ember_index_select", "ember_cast_f32_bf16", "ember_augment_gather"}
	for _, name := range lazy {
		units := l.byName[name]
		if len(units) == 0 {
			t.Errorf("kernel %s is in no unit", name)
		}
		for _, u := range units {
			if slices.Contains(eagerUnits, u) || slices.Contains(prefetchUnits, u) {
				t.Errorf("kernel %s is in unit %d, which NewBackend compiles; its unit is meant to compile on first use", name, u)
			}
		}
	}
	for _, name := range []string{"ember_add", "ember_sgd4", "ember_linear_tiled"} {
		if u := l.byName[name]; len(u) != 1 || !slices.Contains(eagerUnits, u[0]) {
			t.Errorf("kernel %s is in units %v; want the core unit %v", name, u, eagerUnits)
		}
	}
	for _, name := range []string{"ember_adam", "ember_sgd_device", "ember_softmax_rows"} {
		if u := l.byName[name]; len(u) != 1 || !slices.Contains(prefetchUnits, u[0]) {
			t.Errorf("kernel %s is in units %v; want one of the general units %v", name, u, prefetchUnits)
		}
	}
	common, err := kernelFS.ReadFile("kernels/common.cu")
	if err != nil {
		t.Fatal(err)
	}
	src, err := kernelSource()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range kernelNames(src) {
		if len(l.byName[name]) == 0 && !slices.Contains(kernelNames(string(common)), name) {
			t.Errorf("kernel %s is declared but the loader maps it to no unit", name)
		}
	}
}

// TestLazyKernelUnitsGPU checks on the GPU which units a start loads
// (compiled, or read from the kernel cache: the same on-demand path): after
// NewBackend, the core unit and (in the background) the general one, no
// convolution unit; an elementwise operation and an optimiser step
// compile nothing more; a LeNet-shaped fused convolution compiles its
// units on first use, and computes what the CPU does. The first use of the
// register-tiled unit happens inside a graph capture, which on this
// driver (CUDA 12.4 and later) compiles there; the replay must match the
// eager result.
func TestLazyKernelUnitsGPU(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	loaded := func() []bool {
		var l []bool
		for _, u := range b.KernelUnits() {
			l = append(l, u.Loaded)
		}
		return l
	}
	if l := loaded(); !l[0] || l[1] || l[2] || l[3] {
		t.Fatalf("after NewBackend the units loaded are %v; want the core unit and no convolution unit", l)
	}
	rng := rand.New(rand.NewPCG(8, 8))
	rnd := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	x := tensor.FromFloat32(b, nil, rnd(64), 64)
	tensor.Add(x, x).Release()
	if l := loaded(); l[1] || l[2] || l[3] {
		t.Errorf("an addition compiled the units %v", l)
	}
	// LeNet's conv2 at batch 64: 20 → 50 channels, 5x5, 12x12 → pooled 4x4,
	// the register-tiled forward (unit 2, compiled with unit 3).
	const n, c, k, hw = 64, 20, 50, 12
	xs, ws, bs := rnd(n*c*hw*hw), rnd(k*c*25), rnd(k)
	conv := func(be tensor.Backend, s *tensor.Scope) *tensor.Tensor {
		return tensor.Conv2dReLUMaxPool(tensor.FromFloat32(be, s, xs, n, c, hw, hw), tensor.FromFloat32(be, s, ws, k, c, 5, 5),
			tensor.FromFloat32(be, s, bs, k), 1, 0, 2)
	}
	want := conv(tensor.CPU, nil).Float32s()
	in := tensor.FromFloat32(b, nil, xs, n, c, hw, hw)
	w, bias := tensor.FromFloat32(b, nil, ws, k, c, 5, 5), tensor.FromFloat32(b, nil, bs, k)
	scope := tensor.NewScope()
	defer scope.Release()
	var y *tensor.Tensor
	g, err := b.Capture(func() { y = tensor.Conv2dReLUMaxPool(scope.Borrow(in), w, bias, 1, 0, 2) })
	if err != nil {
		t.Fatalf("capturing the first use of the register-tiled unit: %v", err)
	}
	defer g.Close()
	if err := g.Replay(); err != nil {
		t.Fatal(err)
	}
	got := y.Float32s()
	if l := loaded(); !l[2] {
		t.Errorf("after a LeNet-shaped convolution the units loaded are %v; want the 5x5 register-tiled unit", l)
	}
	// The CPU sums 500 products per output in another order: 1e-4 of the
	// sum of magnitudes (about 500·0.8·0.8) bounds the difference.
	for i := range want {
		if math.Abs(float64(got[i]-want[i])) > 1e-4*500 {
			t.Fatalf("output %d: %v on the GPU (captured), %v on the CPU", i, got[i], want[i])
		}
	}
	for i, u := range b.KernelUnits() {
		if u.Loaded {
			t.Logf("unit %d %v %v: %.2f s", i, u.Files, u.Defines, u.Seconds)
		}
	}
}

// TestKernelLoaderScheduling checks the loader's bookkeeping with a fake
// compile, without a GPU: units asked for together compile concurrently
// (each fake waits until the other has started), a unit compiles once
// however many callers wait for it, settle waits for the compiles that
// started and for no other, and a failed compile reaches the operator
// that needed it as a device error naming the unit's sources.
func TestKernelLoaderScheduling(t *testing.T) {
	b := &Backend{}
	l, err := newKernelLoader(b)
	if err != nil {
		t.Fatal(err)
	}
	b.kl = l
	var mu sync.Mutex
	calls := map[int]int{}
	started := map[int]chan struct{}{2: make(chan struct{}), 3: make(chan struct{})}
	l.load = func(i int) (*Module, string, error) {
		mu.Lock()
		calls[i]++
		mu.Unlock()
		if ch, ok := started[i]; ok {
			close(ch)
			other := started[5-i] // 2 waits for 3 and 3 for 2: both run at once or neither finishes
			select {
			case <-other:
			case <-time.After(10 * time.Second):
				return nil, "", fmt.Errorf("unit %d compiled alone", i)
			}
		}
		if i == 1 {
			return nil, "", errors.New("no compiler today")
		}
		return nil, "fake", nil
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if err := l.wait(2, 3); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	l.settle() // units 2 and 3 only: 0, 1 and 4 never started
	mu.Lock()
	if calls[2] != 1 || calls[3] != 1 || len(calls) != 2 {
		t.Errorf("compiles per unit %v; want units 2 and 3 once each", calls)
	}
	mu.Unlock()
	if l.started(0) || l.started(1) || l.started(4) {
		t.Error("settle or wait started a unit nobody asked for")
	}
	err = tensor.Guard(func() { l.loadFor("conv", "ember_im2col") })
	var te *tensor.Error
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "conv.cu") || !strings.Contains(err.Error(), "no compiler today") {
		t.Errorf("a failed compile of unit 1: %v; want a device error naming conv.cu and the cause", err)
	}
	l.loadFor("x", "ember_not_a_kernel") // no unit: nothing to compile, the caller reports it
}
