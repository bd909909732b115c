// Command elementwise shows ember's generated elementwise kernels, the Go
// counterpart of PyCUDA's ElementwiseKernel: a C body over named tensors
// becomes one CUDA kernel (cuda.NewElementwiseKernel), and a Go expression
// with its gradient becomes one kernel forward and one backward
// (tensor.Fused). It computes a·x + y and the tanh form of GELU both ways,
// checks them against the CPU backend, and times each against the same
// computation as separate tensor operations (one kernel and one pass over
// memory per operation).
//
//	go run ./examples/elementwise            # 16M elements
//	go run ./examples/elementwise -n 1000000
//
// Exit status: 0 success, 1 wrong result or CUDA error, 2 no usable GPU.
package main

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"time"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/tensor"
)

// geluK is √(2/π), the constant of GELU's tanh approximation.
const geluK = 0.7978845608028654

// geluExpr is 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) as a Fused
// expression; its gradient is derived from it.
func geluExpr() *tensor.Expr {
	x := tensor.Var("x")
	inner := x.Add(x.Mul(x).Mul(x).Scale(0.044715)).Scale(geluK)
	return x.Scale(0.5).Mul(inner.Tanh().AddConst(1))
}

// geluComposed is the same with one tensor operation per step.
func geluComposed(x *tensor.Tensor) *tensor.Tensor {
	inner := tensor.Scale(tensor.Add(x, tensor.Scale(tensor.Mul(tensor.Mul(x, x), x), 0.044715)), geluK)
	return tensor.Mul(tensor.Scale(x, 0.5), tensor.AddScalar(tensor.Tanh(inner), 1))
}

func main() {
	n := flag.Int("n", 1<<24, "elements per tensor")
	runs := flag.Int("runs", 21, "timed runs per method (the median is reported)")
	device := flag.Int("device", 0, "CUDA device ordinal")
	flag.Parse()
	if *n <= 0 || *runs <= 0 {
		fmt.Fprintln(os.Stderr, "elementwise: -n and -runs must be positive")
		os.Exit(2)
	}
	if err := cuda.Available(); err != nil {
		fmt.Printf("elementwise: no usable GPU, nothing to do: %v\n", err)
		os.Exit(2)
	}
	ok, err := run(*device, *n, *runs)
	if err != nil {
		fmt.Fprintln(os.Stderr, "elementwise:", err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}

func run(ordinal, n, runs int) (ok bool, err error) {
	b, err := cuda.NewBackend(ordinal, cuda.BackendOptions{})
	if err != nil {
		return false, err
	}
	defer b.Close()
	fmt.Printf("device: %s, %d elements\n", b.Device(), n)
	s := tensor.NewScope()
	defer s.Release()
	rng := rand.New(rand.NewPCG(1, 2))
	xs, ys := make([]float32, n), make([]float32, n)
	for i := range xs {
		xs[i], ys[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
	}
	x, y := tensor.FromFloat32(b, s, xs, n), tensor.FromFloat32(b, s, ys, n)
	xc, yc := tensor.FromFloat32(tensor.CPU, s, xs, n), tensor.FromFloat32(tensor.CPU, s, ys, n)
	const a = 1.5
	ok = true

	// 1. a·x + y from a C body.
	axpy, err := cuda.NewElementwiseKernel(b, cuda.ElementwiseSpec{
		Name: "axpy", Inputs: "x, y", Outputs: "out", Params: "float a", Body: "out = a * x + y;"})
	if err != nil {
		return false, err
	}
	out := tensor.Empty(b, s, n)
	fused := func() error { return axpy.Launch([]*tensor.Tensor{out}, []*tensor.Tensor{x, y}, float32(a)) }
	if err := fused(); err != nil {
		return false, err
	}
	// Exact: with --fmad=false a·x + y is two roundings on both devices.
	ok = report("axpy (NewElementwiseKernel)", out.Float32s(), tensor.Add(tensor.Scale(xc, a), yc).Float32s(), 0) && ok
	err = compare(b, runs, 3*n, x,
		func(x *tensor.Tensor) error {
			return axpy.Launch([]*tensor.Tensor{tensor.Empty(b, x.Scope(), n)}, []*tensor.Tensor{x, y}, float32(a))
		},
		func(x *tensor.Tensor) error { tensor.Add(tensor.Scale(x, a), y); return nil })
	if err != nil {
		return false, err
	}

	// 2. GELU (tanh form) from a C body.
	geluK32 := float32(geluK)
	gelu, err := cuda.NewElementwiseKernel(b, cuda.ElementwiseSpec{
		Name: "gelu", Inputs: "x", Outputs: "out", Params: "float k",
		Body: "out = 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));"})
	if err != nil {
		return false, err
	}
	fusedGELU := func() error { return gelu.Launch([]*tensor.Tensor{out}, []*tensor.Tensor{x}, geluK32) }
	if err := fusedGELU(); err != nil {
		return false, err
	}
	// tanhf errs by up to 2 ulp against Go's math, and the two compute the
	// polynomial in other orders: 1e-6 of the largest output.
	want := geluComposed(xc).Float32s()
	ok = report("GELU (NewElementwiseKernel)", out.Float32s(), want, 1e-6) && ok
	err = compare(b, runs, 2*n, x,
		func(x *tensor.Tensor) error {
			return gelu.Launch([]*tensor.Tensor{tensor.Empty(b, x.Scope(), n)}, []*tensor.Tensor{x}, geluK32)
		},
		func(x *tensor.Tensor) error { geluComposed(x); return nil })
	if err != nil {
		return false, err
	}

	// 3. GELU as a Fused expression, with its symbolic gradient.
	op := tensor.MustFused(geluExpr(), "x")
	xg := tensor.FromFloat32(b, s, xs, n).SetRequiresGrad(true)
	xcg := tensor.FromFloat32(tensor.CPU, s, xs, n).SetRequiresGrad(true)
	g := op.Apply(xg)
	ok = report("GELU (tensor.Fused) forward", g.Float32s(), op.Apply(xcg).Float32s(), 1e-6) && ok
	tensor.Sum(g).Backward()
	tensor.Sum(geluComposed(xcg)).Backward()
	ok = report("GELU (tensor.Fused) gradient", xg.Grad().Float32s(), xcg.Grad().Float32s(), 1e-5) && ok
	err = compare(b, runs, 2*n, x,
		func(x *tensor.Tensor) error { op.Apply(x); return nil },
		func(x *tensor.Tensor) error { geluComposed(x); return nil })
	if err != nil {
		return false, err
	}
	return ok, nil
}

// report prints the largest difference from want relative to want's
// largest magnitude and whether it is within tol.
func report(what string, got, want []float32, tol float64) bool {
	scale, worst := 1.0, 0.0
	for _, v := range want {
		scale = math.Max(scale, math.Abs(float64(v)))
	}
	for i := range got {
		worst = math.Max(worst, math.Abs(float64(got[i])-float64(want[i])))
	}
	ok := worst/scale <= tol
	verdict := "ok"
	if !ok {
		verdict = fmt.Sprintf("WRONG (limit %.1g)", tol)
	}
	fmt.Printf("%-30s max |GPU - CPU| %.3g of the largest value: %s\n", what, worst/scale, verdict)
	return ok
}

// compare times fused against unfused on x and prints the medians, and
// the fused kernel's memory throughput for moved float32 values. Every
// operation's output joins the scope of its input, so each run works on a
// copy of x in a scope that the run then resets (which frees its
// temporaries); the copy alone is timed too and subtracted.
func compare(b *cuda.Backend, runs, moved int, x *tensor.Tensor, fused, unfused func(x *tensor.Tensor) error) error {
	s := tensor.NewNoGradScope()
	defer s.Release()
	timed := func(f func(x *tensor.Tensor) error) (time.Duration, error) {
		return median(b, runs, func() error {
			xr := tensor.Empty(b, s, x.Shape()...)
			err := tensor.Guard(func() {
				tensor.CopyTensor(xr, x)
				if f != nil {
					if err := f(xr); err != nil {
						panic(&tensor.Error{Op: "run", Err: err})
					}
				}
			})
			s.Reset()
			return err
		})
	}
	copyOnly, err := timed(nil)
	if err != nil {
		return err
	}
	tf, err := timed(fused)
	if err != nil {
		return err
	}
	tu, err := timed(unfused)
	if err != nil {
		return err
	}
	tf, tu = max(tf-copyOnly, time.Microsecond), max(tu-copyOnly, time.Microsecond)
	fmt.Printf("%-30s fused %8.3f ms (%.0f GB/s), separate operations %8.3f ms: %.1fx\n", "", ms(tf),
		float64(4*moved)/tf.Seconds()/1e9, ms(tu), tu.Seconds()/tf.Seconds())
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// median runs f once to warm up (and compile), then times runs runs between
// CUDA events on the backend's stream.
func median(b *cuda.Backend, runs int, f func() error) (time.Duration, error) {
	if err := f(); err != nil {
		return 0, err
	}
	d := b.Device()
	start, err := d.NewEvent(true)
	if err != nil {
		return 0, err
	}
	defer d.EventDestroy(start)
	end, err := d.NewEvent(true)
	if err != nil {
		return 0, err
	}
	defer d.EventDestroy(end)
	times := make([]time.Duration, 0, runs)
	for range runs {
		if err := d.RecordEvent(start, b.Stream()); err != nil {
			return 0, err
		}
		if err := f(); err != nil {
			return 0, err
		}
		if err := d.RecordEvent(end, b.Stream()); err != nil {
			return 0, err
		}
		el, err := d.EventElapsed(start, end)
		if err != nil {
			return 0, err
		}
		times = append(times, el)
	}
	slices.Sort(times)
	return times[len(times)/2], b.Synchronize()
}
