package parallel

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ember-ml/ember/tensor"
)

// onRanks runs f on n goroutine ranks of a new group and returns their
// errors.
func onRanks(n int, timeout time.Duration, f func(c *FakeComm) error) []error {
	g := NewFakeGroup(n, timeout)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { errs[r] = f(g.Comm(r, tensor.CPU)) })
	}
	wg.Wait()
	return errs
}

func TestFakeCollectives(t *testing.T) {
	const n = 3
	results := make([][]float32, n)
	errs := onRanks(n, 10*time.Second, func(c *FakeComm) error {
		r := float32(c.Rank())
		x := tensor.FromFloat32(tensor.CPU, nil, []float32{r, 10 * r, 1}, 3)
		if err := AllReduceSum(c, x); err != nil {
			return err
		}
		sum := x.Float32s()
		x.CopyFrom([]float32{r, 3 * r, 1})
		if err := AllReduceAverage(c, x); err != nil {
			return err
		}
		avg := x.Float32s()
		x.CopyFrom([]float32{r, r, r})
		if err := BroadcastTensor(c, x, 2); err != nil {
			return err
		}
		vals := []float32{r + 1}
		if err := c.AllReduceValues(vals, Sum); err != nil {
			return err
		}
		if err := c.Barrier(); err != nil {
			return err
		}
		results[c.Rank()] = append(append(append(sum, avg...), x.Float32s()...), vals...)
		return nil
	})
	// sum of 0,1,2 = 3, of 0,10,20 = 30, of 1,1,1 = 3; averages 1, 3, 1;
	// rank 2's values broadcast; 1+2+3 = 6.
	want := []float32{3, 30, 3, 1, 3, 1, 2, 2, 2, 6}
	for r := range n {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		for i := range want {
			if results[r][i] != want[i] {
				t.Fatalf("rank %d: %v, want %v", r, results[r], want)
			}
		}
	}
}

// The sum is taken in rank order whatever the arrival order: values whose
// float32 sum depends on the order give the same bits every time.
func TestFakeSumIsDeterministic(t *testing.T) {
	// 1e8 + 1 + ... rounding depends on the order of the additions.
	vals := []float32{1e8, 3, -1e8, 0.5}
	want := ((vals[0] + vals[1]) + vals[2]) + vals[3]
	for trial := range 20 {
		got := make([]float32, len(vals))
		errs := onRanks(len(vals), 10*time.Second, func(c *FakeComm) error {
			if c.Rank()%2 == trial%2 {
				time.Sleep(time.Millisecond) // vary who comes last
			}
			v := []float32{vals[c.Rank()]}
			err := c.AllReduceValues(v, Sum)
			got[c.Rank()] = v[0]
			return err
		})
		for r, err := range errs {
			if err != nil || got[r] != want {
				t.Fatalf("trial %d rank %d: %v, %v; want %v", trial, r, got[r], err, want)
			}
		}
	}
}

func TestFakeMismatchFailsEveryRank(t *testing.T) {
	errs := onRanks(2, 10*time.Second, func(c *FakeComm) error {
		x := tensor.Zeros(tensor.CPU, nil, 4+c.Rank())
		return AllReduceSum(c, x)
	})
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "of 5 values where another rank called allreduce/sum of 4") && !strings.Contains(err.Error(), "of 4 values where another rank called allreduce/sum of 5") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

func TestFakeMissingRankTimesOut(t *testing.T) {
	start := time.Now()
	errs := onRanks(3, 200*time.Millisecond, func(c *FakeComm) error {
		if c.Rank() == 1 {
			return nil // never comes
		}
		return c.Barrier()
	})
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("took %v with a 200 ms timeout", d)
	}
	for _, r := range []int{0, 2} {
		if errs[r] == nil || !strings.Contains(errs[r].Error(), "for rank(s) [1]") || strings.Count(errs[r].Error(), "parallel:") != 1 {
			t.Errorf("rank %d: %v, want a timeout naming rank 1", r, errs[r])
		}
	}
	// After a fault the group stays failed.
	g := NewFakeGroup(2, time.Second)
	cause := errors.New("boom")
	g.Abort(cause)
	if err := g.Comm(0, tensor.CPU).Barrier(); !errors.Is(err, cause) {
		t.Errorf("Barrier after Abort: %v", err)
	}
}

func TestCollectiveChecksTensors(t *testing.T) {
	c := NewFakeGroup(1, time.Second).Comm(0, tensor.CPU)
	i := tensor.FromInt32(tensor.CPU, nil, []int32{1}, 1)
	if err := AllReduceSum(c, i); err == nil || !strings.Contains(err.Error(), "int32") {
		t.Errorf("AllReduceSum of int32: %v", err)
	}
	m := tensor.Zeros(tensor.CPU, nil, 2, 3)
	if err := AllReduceSum(c, m.Transpose(0, 1)); err == nil || !strings.Contains(err.Error(), "strided") {
		t.Errorf("AllReduceSum of a transposed view: %v", err)
	}
}
