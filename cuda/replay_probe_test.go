package cuda

import (
	"os"
	"testing"
	"time"
	"unsafe"

	"github.com/ember-ml/ember/tensor"
)

// TestGPUReplayUploadProbe times what a training loop adds between two
// replays of a captured step: a chain of 14 small kernels replayed alone,
// each replay after a 512-byte upload on the same stream (a batch's
// indices and labels, from pageable and from page-locked memory), and the
// chain with one kernel more (what moving the copy into the graph as a
// kernel would cost). It prints µs a replay; it asserts nothing about
// time. It runs only with EMBER_REPLAY_PROBE=1.
func TestGPUReplayUploadProbe(t *testing.T) {
	if os.Getenv("EMBER_REPLAY_PROBE") != "1" {
		t.Skip("the replay probe runs with EMBER_REPLAY_PROBE=1")
	}
	b := newGPUBackend(t, BackendOptions{})
	const n, links, reps = 4096, 14, 4000
	x := tensor.Zeros(b, nil, n)
	y := tensor.Zeros(b, nil, n)
	idx := tensor.Zeros(b, nil, 128)
	defer x.Release()
	defer y.Release()
	defer idx.Release()
	host := make([]float32, 128)
	pinned, err := b.dev.NewPinnedBuffer(4 * len(host))
	if err != nil {
		t.Fatal(err)
	}
	defer pinned.Free()
	chain := func(k int) *StepGraph {
		g, err := b.Capture(func() {
			for range k {
				b.Axpy(y.Buffer(), 1e-3, x.Buffer())
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	g14, g15 := chain(links), chain(links+1)
	defer g14.Close()
	defer g15.Close()
	pidx := b.f32("probe", idx.Buffer())
	for _, c := range []struct {
		name   string
		g      *StepGraph
		before func()
	}{
		{"14 kernels, replay alone", g14, nil},
		{"14 kernels, pageable upload before each", g14, func() { b.Upload(idx.Buffer(), host) }},
		{"14 kernels, page-locked upload before each", g14, func() {
			devCheck("probe", b.dev.CopyHtoD(pidx, unsafe.Pointer(unsafe.SliceData(pinned.Bytes())), pinned.Len(), b.stream))
		}},
		{"15 kernels, replay alone", g15, nil},
	} {
		run := func(count int) time.Duration {
			t0 := time.Now()
			for range count {
				if c.before != nil {
					c.before()
				}
				if err := c.g.Replay(); err != nil {
					t.Fatal(err)
				}
			}
			if err := b.Synchronize(); err != nil {
				t.Fatal(err)
			}
			return time.Since(t0)
		}
		run(200)
		best := time.Duration(1 << 62)
		for range 3 {
			best = min(best, run(reps))
		}
		t.Logf("%-44s %6.2f µs a replay", c.name, float64(best.Microseconds())/reps)
	}
}

// TestGPUClusterLaunchProbe times the tiled linear kernels (linear.cu) from
// a captured graph of 20 launches, with their split sums through thread
// block clusters and through the workspace and counters, beside cuBLASLt,
// at one row (a 64th of the multiply-adds of the 64-row case, so that what
// is left is the launch's and the split's fixed cost) and at 64. It prints
// µs a launch; it asserts nothing about time. It runs only with
// EMBER_REPLAY_PROBE=1.
func TestGPUClusterLaunchProbe(t *testing.T) {
	if os.Getenv("EMBER_REPLAY_PROBE") != "1" {
		t.Skip("the cluster probe runs with EMBER_REPLAY_PROBE=1")
	}
	b := newGPUBackend(t, BackendOptions{})
	if !b.clusters() {
		t.Skip("no thread block clusters")
	}
	const launches, reps = 20, 200
	for _, c := range []struct{ n, in, out int }{{1, 1024, 1024}, {64, 1024, 1024}, {1, 512, 64}, {64, 512, 64}} {
		x := tensor.Zeros(b, nil, c.n*c.in)
		w := tensor.Zeros(b, nil, c.out*c.in)
		y := tensor.Zeros(b, nil, c.n*c.out)
		for _, path := range []string{"clusters", "workspace", "cuBLASLt"} {
			var g *StepGraph
			var err error
			// The tiled kernels are withPath's "lt>256" (wide layers off
			// cuBLASLt), with or without clusters; cuBLASLt is its "lt".
			mode := "lt>256"
			if path == "cuBLASLt" {
				mode = "lt"
			}
			b.noClusters = path == "workspace"
			withPath(b, mode, func() {
				g, err = b.Capture(func() {
					for range launches {
						b.Linear(y.Buffer(), x.Buffer(), w.Buffer(), tensor.Buffer{}, c.n, c.in, c.out, true)
					}
				})
			})
			b.noClusters = false
			if err != nil {
				t.Fatal(err)
			}
			best := time.Duration(1 << 62)
			for range 4 {
				t0 := time.Now()
				for range reps {
					if err := g.Replay(); err != nil {
						t.Fatal(err)
					}
				}
				if err := b.Synchronize(); err != nil {
					t.Fatal(err)
				}
				best = min(best, time.Since(t0))
			}
			g.Close()
			t.Logf("%dx%d->%d %-10s %6.2f µs a launch", c.n, c.in, c.out, path, float64(best.Nanoseconds())/1e3/(reps*launches))
		}
		x.Release()
		w.Release()
		y.Release()
	}
}
