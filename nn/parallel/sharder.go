package parallel

import (
	"fmt"

	"github.com/ember-ml/ember/data"
)

// Sharder gives each rank its share of a data set's indices, as
// torch.utils.data.DistributedSampler does: one permutation of 0..N-1,
// drawn from the seed and the epoch and so the same on every rank; padded
// by repeating its start until it divides evenly among the ranks (or cut
// to a multiple of the world size with DropLast); rank r takes positions
// r, r+W, r+2W, ... So in step k, the ranks' batches of b together are
// positions kbW to (k+1)bW of the permutation: the batch of bW that one
// rank would take, which is what makes N ranks with batch B/N train as one
// rank with batch B.
//
// The permutation is data.Permutation, the order the single-process loader
// uses (not torch's generator): at world size 1 the shard is exactly the
// loader's order, and a run resumed at another world size sees the same
// epoch order, cut differently.
type Sharder struct {
	N        int    // data set size
	Rank     int    // this rank
	World    int    // number of ranks
	Seed     uint64 // the same on every rank
	Shuffle  bool   // permute (true in torch's default); false: 0..N-1 in order
	DropLast bool   // cut the tail instead of padding (torch's default: false)
}

// NewSharder is a Sharder with torch's defaults (shuffle, pad).
func NewSharder(n, rank, world int, seed uint64) (*Sharder, error) {
	s := &Sharder{N: n, Rank: rank, World: world, Seed: seed, Shuffle: true}
	return s, s.check()
}

func (s *Sharder) check() error {
	switch {
	case s.World < 1 || s.Rank < 0 || s.Rank >= s.World:
		return fmt.Errorf("parallel: sharder for rank %d of %d", s.Rank, s.World)
	case s.N < 0:
		return fmt.Errorf("parallel: sharder of %d samples", s.N)
	case s.N == 0 || (s.DropLast && s.N < s.World):
		return fmt.Errorf("parallel: %d samples cannot be shared among %d ranks", s.N, s.World)
	}
	return nil
}

// Len is the number of indices each rank gets per epoch.
func (s *Sharder) Len() int {
	if s.DropLast {
		return s.N / s.World
	}
	return (s.N + s.World - 1) / s.World
}

// Permutation is the epoch's order of the whole data set, before padding
// and sharding: the same on every rank.
func (s *Sharder) Permutation(epoch int) []int {
	if !s.Shuffle {
		p := make([]int, s.N)
		for i := range p {
			p[i] = i
		}
		return p
	}
	p := data.Permutation(s.N, s.Seed, epoch)
	out := make([]int, len(p))
	for i, v := range p {
		out[i] = int(v)
	}
	return out
}

// Indices returns this rank's indices for the epoch, in order.
func (s *Sharder) Indices(epoch int) ([]int, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	perm := s.Permutation(epoch)
	total := s.Len() * s.World
	if total > len(perm) {
		// Pad with the start of the permutation, again and again when the
		// data set is smaller than the padding (torch does the same).
		for len(perm) < total {
			perm = append(perm, perm[:min(total-len(perm), s.N)]...)
		}
	}
	perm = perm[:total]
	out := make([]int, 0, s.Len())
	for i := s.Rank; i < total; i += s.World {
		out = append(out, perm[i])
	}
	return out, nil
}
