package data

import (
	"fmt"
	"math"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// testDataset has n images of rows x cols; every pixel of image i is
// byte(i), and label i is i%10.
func testDataset(n, rows, cols int) *Dataset {
	sz := rows * cols
	ds := &Dataset{Images: make([]uint8, n*sz), Labels: make([]uint8, n), N: n, Rows: rows, Cols: cols}
	for i := range n {
		for p := range sz {
			ds.Images[i*sz+p] = byte(i + p)
		}
		ds.Labels[i] = byte(i % 10)
	}
	return ds
}

func allBatches(l *Loader, epoch int) []Batch {
	var out []Batch
	it := l.Epoch(epoch)
	defer it.Close()
	for b, ok := it.Next(); ok; b, ok = it.Next() {
		out = append(out, b)
	}
	return out
}

func TestNormalize(t *testing.T) {
	src := make([]uint8, 256)
	for i := range src {
		src[i] = uint8(i)
	}
	dst := make([]float32, 256)
	Normalize(dst, src)
	for i, got := range dst {
		want := (float64(i)/255 - 0.1307) / 0.3081
		if math.Abs(float64(got)-want) > 1e-6 {
			t.Fatalf("Normalize(%d) = %v, want %v", i, got, want)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("no panic for a short dst")
		}
	}()
	Normalize(make([]float32, 3), src)
}

func TestLoaderBatchSizes(t *testing.T) {
	ds := testDataset(10, 2, 2)
	for _, c := range []struct {
		bs       int
		dropLast bool
		sizes    []int
	}{
		{3, false, []int{3, 3, 3, 1}},
		{3, true, []int{3, 3, 3}},
		{5, false, []int{5, 5}},
		{5, true, []int{5, 5}},
		{10, true, []int{10}},
		{11, false, []int{10}},
		{11, true, nil},
		{1, false, []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
	} {
		for _, prefetch := range []int{0, 2} {
			l := mustLoader(t, ds, LoaderOptions{BatchSize: c.bs, DropLast: c.dropLast, Shuffle: true, Seed: 4, Prefetch: prefetch, Normalize: true})
			var sizes []int
			for i, b := range allBatches(l, 0) {
				sizes = append(sizes, b.Size())
				if b.Index != i {
					t.Errorf("batch %d has Index %d", i, b.Index)
				}
				if len(b.Labels) != b.Size() || len(b.Images) != b.Size()*4 {
					t.Errorf("batch %d: %d indices, %d labels, %d pixels", i, b.Size(), len(b.Labels), len(b.Images))
				}
			}
			if !slices.Equal(sizes, c.sizes) || l.NumBatches() != len(c.sizes) {
				t.Errorf("bs %d dropLast %v: sizes %v, NumBatches %d; want %v", c.bs, c.dropLast, sizes, l.NumBatches(), c.sizes)
			}
			l.Close()
		}
	}
}

func TestLoaderEveryIndexOnce(t *testing.T) {
	ds := testDataset(103, 3, 2)
	l := mustLoader(t, ds, LoaderOptions{BatchSize: 8, Shuffle: true, Seed: 99, Normalize: true})
	for epoch := range 3 {
		seen := make([]int, ds.N)
		for _, b := range allBatches(l, epoch) {
			for j, k := range b.Indices {
				seen[k]++
				if b.Labels[j] != int32(ds.Labels[k]) {
					t.Fatalf("label of example %d is %d, want %d", k, b.Labels[j], ds.Labels[k])
				}
				want := make([]float32, 6)
				Normalize(want, ds.Image(int(k)))
				if !slices.Equal(b.Images[j*6:(j+1)*6], want) {
					t.Fatalf("pixels of example %d differ", k)
				}
			}
		}
		for k, n := range seen {
			if n != 1 {
				t.Fatalf("epoch %d: example %d seen %d times", epoch, k, n)
			}
		}
	}
}

func TestLoaderNoShuffle(t *testing.T) {
	l := mustLoader(t, testDataset(7, 1, 1), LoaderOptions{BatchSize: 3})
	var got []int32
	for _, b := range allBatches(l, 5) {
		got = append(got, b.Indices...)
		if b.Images != nil {
			t.Error("Images set without Normalize")
		}
	}
	if !slices.Equal(got, []int32{0, 1, 2, 3, 4, 5, 6}) {
		t.Errorf("order %v", got)
	}
}

func order(l *Loader, epoch int) []int32 {
	var out []int32
	for _, b := range allBatches(l, epoch) {
		out = append(out, b.Indices...)
	}
	return out
}

func TestLoaderDeterminism(t *testing.T) {
	ds := testDataset(50, 1, 1)
	opt := LoaderOptions{BatchSize: 7, Shuffle: true, Seed: 1234}
	a, b := mustLoader(t, ds, opt), mustLoader(t, ds, opt)
	// A "resumed" loader starting at epoch 2 sees what an uninterrupted
	// one sees at epoch 2.
	order(a, 0)
	order(a, 1)
	if !slices.Equal(order(a, 2), order(b, 2)) {
		t.Error("same seed and epoch, different order")
	}
	if !slices.Equal(order(a, 2), Permutation(50, 1234, 2)) {
		t.Error("loader order differs from Permutation")
	}
	if slices.Equal(order(a, 2), order(a, 3)) {
		t.Error("epochs 2 and 3 have the same order")
	}
	opt.Seed = 1235
	if slices.Equal(order(a, 2), order(mustLoader(t, ds, opt), 2)) {
		t.Error("seeds 1234 and 1235 give the same order")
	}
}

func TestPermutationGolden(t *testing.T) {
	// The order is a documented contract (resumed runs depend on it): this
	// test must not be "fixed" by updating the values.
	got := fmt.Sprint(Permutation(10, 42, 0), Permutation(10, 42, 1), Permutation(10, 0, 0))
	const want = "[0 8 7 4 3 9 2 6 1 5] [4 8 7 9 3 0 2 1 6 5] [8 6 5 3 0 4 2 9 7 1]"
	if got != want {
		t.Errorf("Permutation changed:\n got %s\nwant %s", got, want)
	}
	if len(Permutation(0, 1, 1)) != 0 || !slices.Equal(Permutation(1, 1, 1), []int32{0}) {
		t.Error("trivial permutations wrong")
	}
}

func TestPermutationUniform(t *testing.T) {
	// All 6 orders of 3 elements should appear about equally often.
	counts := map[string]int{}
	const trials = 6000
	for s := range uint64(trials) {
		counts[fmt.Sprint(Permutation(3, s, 7))]++
	}
	if len(counts) != 6 {
		t.Fatalf("%d distinct orders, want 6", len(counts))
	}
	for p, c := range counts {
		if c < 850 || c > 1150 {
			t.Errorf("order %s appeared %d times in %d, want about 1000", p, c, trials)
		}
	}
}

func TestPrefetchEqualsSynchronous(t *testing.T) {
	ds := testDataset(77, 4, 4)
	opt := LoaderOptions{BatchSize: 10, Shuffle: true, Seed: 5, Normalize: true}
	want := allBatches(mustLoader(t, ds, opt), 3)
	for _, p := range []int{1, 2, 16} {
		opt.Prefetch = p
		l := mustLoader(t, ds, opt)
		if got := allBatches(l, 3); !reflect.DeepEqual(got, want) {
			t.Errorf("Prefetch %d: batches differ from synchronous ones", p)
		}
		l.Close()
	}
	if n := liveWorkers.Load(); n != 0 {
		t.Errorf("%d prefetch goroutines still running", n)
	}
}

// waitGoroutines waits until the process has at most n goroutines.
func waitGoroutines(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines, want <= %d:\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond)
	}
}

func TestCloseStopsGoroutines(t *testing.T) {
	ds := testDataset(100, 2, 2)
	base := runtime.NumGoroutine()
	l := mustLoader(t, ds, LoaderOptions{BatchSize: 3, Shuffle: true, Prefetch: 4})

	// EpochIter.Close part-way through.
	it := l.Epoch(0)
	if _, ok := it.Next(); !ok {
		t.Fatal("no batch")
	}
	if liveWorkers.Load() != 1 {
		t.Fatalf("%d workers, want 1", liveWorkers.Load())
	}
	it.Close()
	it.Close() // idempotent
	if n := liveWorkers.Load(); n != 0 {
		t.Fatalf("%d workers after EpochIter.Close", n)
	}
	if _, ok := it.Next(); ok {
		t.Error("Next after Close returned a batch")
	}

	// Loader.Close stops every open iterator.
	its := []*EpochIter{l.Epoch(1), l.Epoch(2), l.Epoch(3)}
	its[0].Next()
	if liveWorkers.Load() != 3 {
		t.Fatalf("%d workers, want 3", liveWorkers.Load())
	}
	l.Close()
	if n := liveWorkers.Load(); n != 0 {
		t.Fatalf("%d workers after Loader.Close", n)
	}
	for _, it := range its {
		if _, ok := it.Next(); ok {
			t.Error("Next after Loader.Close returned a batch")
		}
	}
	if _, ok := l.Epoch(4).Next(); ok {
		t.Error("Epoch of a closed Loader returned a batch")
	}
	waitGoroutines(t, base)

	// An epoch read to the end needs no Close.
	l = mustLoader(t, ds, LoaderOptions{BatchSize: 7, Prefetch: 2})
	allBatchesNoClose(l, 0)
	if n := liveWorkers.Load(); n != 0 {
		t.Fatalf("%d workers after a full epoch", n)
	}
	waitGoroutines(t, base)
}

func allBatchesNoClose(l *Loader, epoch int) {
	it := l.Epoch(epoch)
	for _, ok := it.Next(); ok; _, ok = it.Next() {
	}
}

func TestAbandonedIteratorIsCleanedUp(t *testing.T) {
	l := mustLoader(t, testDataset(100, 2, 2), LoaderOptions{BatchSize: 3, Prefetch: 2})
	func() {
		it := l.Epoch(0)
		it.Next()
	}()
	deadline := time.Now().Add(5 * time.Second)
	for liveWorkers.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("prefetch goroutine of an unreachable iterator still running")
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}

func TestNewLoaderErrors(t *testing.T) {
	bad := &Dataset{Images: make([]uint8, 3), Labels: make([]uint8, 2), N: 2, Rows: 1, Cols: 2}
	for _, c := range []struct {
		ds   *Dataset
		opt  LoaderOptions
		want string
	}{
		{testDataset(1, 1, 1), LoaderOptions{BatchSize: 0}, "batch size 0, want at least 1"},
		{testDataset(1, 1, 1), LoaderOptions{BatchSize: -3}, "batch size -3, want at least 1"},
		{testDataset(1, 1, 1), LoaderOptions{BatchSize: 1, Prefetch: -1}, "prefetch -1, want 0 or more"},
		{nil, LoaderOptions{BatchSize: 1}, "no data set"},
		{bad, LoaderOptions{BatchSize: 1}, "2 images of 1x2 holds 3 pixels"},
	} {
		l, err := NewLoader(c.ds, c.opt)
		if l != nil || err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error saying %q", c.opt, err, c.want)
		}
	}
}

// mustLoader is NewLoader for options the test knows to be valid.
func mustLoader(t testing.TB, ds *Dataset, opt LoaderOptions) *Loader {
	t.Helper()
	l, err := NewLoader(ds, opt)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func BenchmarkEpoch(b *testing.B) {
	ds := testDataset(60000, 28, 28)
	l := mustLoader(b, ds, LoaderOptions{BatchSize: 64, Shuffle: true, Normalize: true, Prefetch: 2})
	defer l.Close()
	for i := 0; b.Loop(); i++ {
		allBatchesNoClose(l, i)
	}
}
