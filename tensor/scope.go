package tensor

import "sync"

// Scope owns the memory of the tensors created while it is in use and frees
// all of it at once when released, without waiting for Go's garbage
// collector (which does not see device memory). A training step creates one
// scope, puts its input batch in it, and releases it when the step ends:
// every tensor an operation derives from scoped inputs joins the same scope,
// and so do the gradients Backward computes for them.
//
// A scope made by NewNoGradScope also switches off graph recording for the
// operations on its tensors, as torch.no_grad does, so that evaluation keeps
// no activations alive for a backward pass.
type Scope struct {
	mu       sync.Mutex
	owned    []*storage
	noGrad   bool
	released bool
	autocast DType // Float32 (off) or BFloat16 (autocast.go)
	// planar turns autocast's channels-last activations off
	// (SetChannelsLast).
	planar bool
	// early: Backward gives the memory of the scope's intermediate
	// tensors back as it goes (SetReleaseInBackward, release.go).
	early bool
	// run is set on the scopes Recompute runs its function in
	// (recompute.go).
	run *recomputeRun
}

// NewScope returns an empty scope that records gradients.
func NewScope() *Scope { return &Scope{} }

// NewNoGradScope returns a scope whose operations record no graph.
func NewNoGradScope() *Scope { return &Scope{noGrad: true} }

// GradEnabled reports whether operations on this scope's tensors record a
// graph for Backward.
func (s *Scope) GradEnabled() bool { return s == nil || !s.noGrad }

func (s *Scope) own(st *storage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.released {
		panic("tensor: allocation in a released scope")
	}
	s.owned = append(s.owned, st)
}

// Len is the number of allocations the scope currently owns.
func (s *Scope) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.owned)
}

// Release frees every tensor of the scope. The scope cannot be used again;
// use Reset to reuse it.
func (s *Scope) Release() {
	s.Reset()
	s.mu.Lock()
	s.released = true
	s.mu.Unlock()
}

// Reset frees every tensor of the scope and leaves it ready for the next
// step. Freed memory goes back to the backend's allocator in reverse order of
// allocation, which lets a caching allocator hand the same blocks to the next
// step.
func (s *Scope) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(s.owned) - 1; i >= 0; i-- {
		s.owned[i].release()
		s.owned[i] = nil
	}
	s.owned = s.owned[:0]
}

// scopeOf picks the scope of an operation's output: the first scope among
// its inputs, or nil when all of them are long-lived.
func scopeOf(ts ...*Tensor) *Scope {
	for _, t := range ts {
		if t != nil && t.scope != nil {
			return t.scope
		}
	}
	return nil
}

// disown takes st out of the scope's list without freeing it, for another
// scope to own (Recompute's result); false when the scope does not own it.
func (s *Scope) disown(st *storage) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(s.owned) - 1; i >= 0; i-- {
		if s.owned[i] == st {
			s.owned = append(s.owned[:i], s.owned[i+1:]...)
			return true
		}
	}
	return false
}
