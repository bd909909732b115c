package parallel

import (
	"fmt"
	"slices"
	"testing"

	"github.com/ember-ml/ember/data"
)

// torch.utils.data.DistributedSampler with shuffle=False on 10 samples and
// 3 replicas: total 12 (padded with indices 0, 1), rank r takes r::3.
//
//	>>> [list(DistributedSampler(range(10), 3, r, shuffle=False)) for r in range(3)]
//	[[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
//	>>> [list(DistributedSampler(range(10), 3, r, shuffle=False, drop_last=True)) for r in range(3)]
//	[[0, 3, 6], [1, 4, 7], [2, 5, 8]]
func TestSharderAsTorch(t *testing.T) {
	for _, c := range []struct {
		dropLast bool
		want     string
	}{
		{false, "[[0 3 6 9] [1 4 7 0] [2 5 8 1]]"},
		{true, "[[0 3 6] [1 4 7] [2 5 8]]"},
	} {
		var got [][]int
		for r := range 3 {
			s := &Sharder{N: 10, Rank: r, World: 3, DropLast: c.dropLast}
			idx, err := s.Indices(0)
			if err != nil {
				t.Fatal(err)
			}
			if len(idx) != s.Len() {
				t.Errorf("rank %d: %d indices, Len() %d", r, len(idx), s.Len())
			}
			got = append(got, idx)
		}
		if fmt.Sprint(got) != c.want {
			t.Errorf("drop_last=%v: %v, torch gives %s", c.dropLast, got, c.want)
		}
	}
	// Padding longer than the data set repeats it: 2 samples, 5 ranks.
	var got []int
	for r := range 5 {
		idx, _ := (&Sharder{N: 2, Rank: r, World: 5}).Indices(0)
		got = append(got, idx...)
	}
	if fmt.Sprint(got) != "[0 1 0 1 0]" {
		t.Errorf("2 samples on 5 ranks: %v, torch gives [0 1 0 1 0]", got)
	}
}

func TestSharderShuffled(t *testing.T) {
	const n, world = 103, 4
	// Every rank draws the same permutation (the loader's), so the shards
	// are disjoint apart from the padding and cover the data set.
	seen := map[int]int{}
	var all [][]int
	for r := range world {
		s, err := NewSharder(n, r, world, 42)
		if err != nil {
			t.Fatal(err)
		}
		idx, err := s.Indices(3)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, idx)
		for _, i := range idx {
			seen[i]++
		}
	}
	pad := world*((n+world-1)/world) - n // 1
	extra := 0
	for i := range n {
		if seen[i] == 0 {
			t.Fatalf("index %d is in no shard", i)
		}
		extra += seen[i] - 1
	}
	if extra != pad {
		t.Errorf("%d indices repeated, want the %d of padding", extra, pad)
	}
	// Interleaving the shards gives back the epoch's permutation of the
	// single-process loader: step k of N ranks is batch k of one rank.
	perm := data.Permutation(n, 42, 3)
	for j := 0; j < n; j++ {
		if got := all[j%world][j/world]; got != int(perm[j]) {
			t.Fatalf("position %d: rank %d has %d, data.Permutation %d", j, j%world, got, perm[j])
		}
	}
	// Another epoch, another order; the same epoch, the same.
	s, _ := NewSharder(n, 0, world, 42)
	a, _ := s.Indices(3)
	b, _ := s.Indices(4)
	if slices.Equal(a, b) || !slices.Equal(a, all[0]) {
		t.Error("epochs 3 and 4 give the same shard, or epoch 3 changed")
	}
}

func TestSharderErrors(t *testing.T) {
	for _, s := range []*Sharder{{N: 10, Rank: 3, World: 3}, {N: 0, World: 1}, {N: 2, World: 3, DropLast: true}, {N: -1, World: 1}} {
		if _, err := s.Indices(0); err == nil {
			t.Errorf("%+v: no error", *s)
		}
	}
}
