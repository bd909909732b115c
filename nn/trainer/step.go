package trainer

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// Replayer is the part of an optimiser that a captured step needs: whether
// its next Step issues the same device work as every later one, how to
// write the coming step's device scalars before a replay, and how to count
// (or take back) steps that ran as replays or never ran. optim.SGD and
// optim.Adam satisfy it.
type Replayer interface {
	Replayable() bool
	Prepare()
	Replayed()
	Rewind()
	Steps() int
}

// StepOptions configure CaptureStep.
type StepOptions struct {
	// Optimizer is the optimiser the step updates (nil: the step counts
	// nothing that a replay must count).
	Optimizer Replayer
	// Eager turns capture off: every step runs eagerly and nothing is
	// printed (a --no-graph flag, or a backend where the caller knows
	// capture is pointless).
	Eager bool
	// Logf, when not nil, receives the one line that says whether the step
	// is replayed or why it runs eagerly, the first time it runs.
	Logf func(format string, args ...any)
	// Hint ends the line that says the step is replayed (say, how to turn
	// capture off).
	Hint string
	// Autocast is the element type of the step's matrix products and
	// convolutions (tensor.Scope.SetAutocast): BFloat16 for mixed
	// precision; the zero value and Float32 leave them float32.
	Autocast tensor.DType
	// KeepIntermediates keeps every tensor of a step until the next one,
	// for a step function that reads an intermediate result after
	// Backward without marking it with Retain. By default the step's
	// scope gives the activations back during Backward
	// (tensor.Scope.SetReleaseInBackward), which lowers the step's peak
	// memory; the loss the step returns stays readable.
	KeepIntermediates bool
	// ZeroesGrads says that the step ends with the optimiser's
	// StepAndZeroGrad, so that each begins from zero gradients (the
	// trainer's do). A planned capture then clears them (the optimiser's
	// ClearGrad, where its rehearsal's backward pass wrote every gradient
	// whole), and so does the first eager step, so that the later steps
	// write each gradient over its buffer instead of zeroing it and adding
	// to the zeros (optim's grads.go).
	ZeroesGrads bool
	// NoMemoryPlan captures the step with its memory placed as it comes,
	// without the rehearsal that plans it (a step with collective
	// communication: the rehearsal's collectives would never run).
	NoMemoryPlan bool
}

// Step runs a training step, on a GPU by replaying a CUDA graph of it
// captured the first time it runs with a given batch shape, and eagerly
// where that is impossible: on the CPU, when the step waits for the host
// (an Item or a download inside it), or when the optimiser's next step
// differs from the later ones.
type Step struct {
	b       tensor.Backend
	step    func(s *tensor.Scope) *tensor.Tensor
	opt     StepOptions
	shapes  map[string]*shapeStep
	reason  string // why the step runs eagerly, "" while it is replayed
	said    bool
	attempt bool // capture may still be tried
	cleared bool // an eager step has cleared the gradients (ZeroesGrads)
}

// shapeStep is the step of one batch shape: its scope, and its graph and
// the loss tensor the graph writes, once captured.
type shapeStep struct {
	scope    *tensor.Scope
	graph    *cuda.StepGraph
	loss     *tensor.Tensor
	replayed bool // the graph ran at least once
	warmed   bool // an eager step ran first (cuDNN's algorithm searches)
}

// CaptureStep prepares step to be run by (*Step).Run: step queues one
// training step (forward, backward, optimiser update) building its tensors
// in s, and returns the loss without reading it back. s gives the memory
// of the graph's intermediate tensors back during Backward: an
// intermediate the step or its caller reads after Backward must be marked
// with Retain first (or StepOptions.KeepIntermediates set). It must read its
// inputs from device tensors that stay the same between steps (upload the
// next batch into them before Run), so that a replay of the captured work
// computes on the new batch.
//
// Where the GPU's allocator maps pages, the capture places the step's
// memory by a plan made from a rehearsal of it (cuda.Backend.
// CapturePlanned): step then runs twice while it is captured, and its
// host side (an optimiser's step count) is undone in between.
//
// Nothing runs until Run. The returned Step owns a scope per batch shape;
// Close releases them and the graphs.
func CaptureStep(b tensor.Backend, step func(s *tensor.Scope) *tensor.Tensor, o StepOptions) (*Step, error) {
	if b == nil || step == nil {
		return nil, errors.New("trainer: CaptureStep needs a backend and a step function")
	}
	s := &Step{b: b, step: step, opt: o, shapes: map[string]*shapeStep{}, attempt: !o.Eager}
	if _, ok := b.(*cuda.Backend); !ok && !o.Eager {
		s.attempt = false
		s.reason = fmt.Sprintf("the %s backend cannot capture a graph", b.Name())
	}
	if o.Eager {
		s.reason = "capture is off"
		s.said = true // the caller chose it: nothing to explain
	}
	return s, nil
}

// Reason says why the step runs eagerly, "" when it is replayed (or has
// not run yet on a backend that can capture).
func (s *Step) Reason() string { return s.reason }

// Captured reports whether a graph of the step for this batch shape is
// being replayed.
func (s *Step) Captured(shape ...int) bool {
	st := s.shapes[shapeKey(shape)]
	return st != nil && st.graph != nil
}

func shapeKey(shape []int) string { return fmt.Sprint(shape) }

func (s *Step) say(format string, args ...any) {
	if s.said || s.opt.Logf == nil {
		s.said = true
		return
	}
	s.said = true
	s.opt.Logf(format, args...)
}

// Run queues one step for a batch of the given shape (the key of the
// graph cache: a step of another shape is captured apart) and returns its
// loss, not read back. The first Run of a shape on a GPU captures the step
// and replays it; a capture that fails is said once (StepOptions.Logf) and
// the step runs eagerly from then on. An error is a replay the driver
// refused, or a device error of an eager step.
func (s *Step) Run(shape ...int) (loss *tensor.Tensor, err error) {
	key := shapeKey(shape)
	st := s.shapes[key]
	if st == nil {
		st = &shapeStep{scope: tensor.NewScope()}
		if s.opt.Autocast == tensor.BFloat16 {
			st.scope.SetAutocast(tensor.BFloat16)
		}
		st.scope.SetReleaseInBackward(!s.opt.KeepIntermediates)
		s.shapes[key] = st
	}
	opt := s.opt.Optimizer
	if st.graph != nil {
		// The first replay runs the captured step, whose host side already
		// prepared and counted it.
		if st.replayed && opt != nil {
			opt.Prepare()
		}
		if err := st.graph.Replay(); err != nil {
			return nil, fmt.Errorf("trainer: replaying the captured step: %w", err)
		}
		if st.replayed && opt != nil {
			opt.Replayed()
		}
		st.replayed = true
		return st.loss, nil
	}
	if s.attempt {
		if opt != nil && !opt.Replayable() {
			// Not now; the optimiser's later steps may be.
			st.warmed = true
			return s.eager(st)
		}
		if !st.warmed && searchesConvolutions(s.b) && !s.plans() {
			// cuDNN times the algorithms of each convolution the first
			// time it runs, which it cannot do inside a capture: one eager
			// step of this shape first, so that the graph gets the
			// measured ones. (A planned capture finds out in its
			// rehearsal whether the step has convolutions.)
			st.warmed = true
			return s.eager(st)
		}
		s.attempt = false
		if l, ok, err := s.capture(st); ok || err != nil {
			return l, err
		}
	} else if s.reason != "" {
		s.say("cuda graph: launching eagerly: %s", s.reason)
	}
	return s.eager(st)
}

// capture records the step of st and replays it once; false when the
// capture failed (then nothing of the step ran).
func (s *Step) capture(st *shapeStep) (*tensor.Tensor, bool, error) {
	g := s.b.(*cuda.Backend)
	opt := s.opt.Optimizer
	before := 0
	if opt != nil {
		opt.Prepare() // an upload cannot be captured
		before = opt.Steps()
	}
	var loss *tensor.Tensor
	marks := clearedMarks(opt)
	// The eager step's tensors go first, so that Capture gives their
	// memory back before the graph's pool takes its own.
	st.scope.Reset()
	record := func() {
		st.scope.Reset()
		loss = s.step(st.scope)
	}
	var graph *cuda.StepGraph
	var err error
	if s.plans() {
		graph, err = g.CapturePlanned(record, func() {
			// The rehearsal's tensors hold no memory, and its update
			// never ran.
			st.scope.Reset()
			for opt != nil && opt.Steps() > before {
				opt.Rewind()
			}
			s.restoreGrads(marks)
		})
	} else {
		graph, err = g.Capture(record)
	}
	if err != nil {
		if opt != nil && opt.Steps() > before {
			opt.Rewind() // counted on the host, never ran
		}
		s.restoreGrads(marks)
		if errors.Is(err, cuda.ErrSearchFirst) {
			// Convolutions: this eager step times their algorithms, the
			// next one is captured.
			st.warmed = true
			s.attempt = true
			return nil, false, nil
		}
		if errors.Is(err, cuda.ErrLoadDuringCapture) {
			// An older driver: this eager step compiles the kernels, the
			// next one is captured.
			s.attempt = true
			return nil, false, nil
		}
		s.reason = "capture failed: " + firstLine(err.Error())
		s.say("cuda graph: capture failed, launching eagerly: %s", firstLine(err.Error()))
		return nil, false, nil
	}
	planned := ""
	if span, misses, err := graph.Planned(); err == nil {
		planned = fmt.Sprintf(", its memory placed by plan (%.1f MiB, %d requests off the plan)", float64(span)/(1<<20), misses)
	} else if s.plans() {
		planned = fmt.Sprintf(", its memory placed as it came (%s)", firstLine(err.Error()))
	}
	s.say("cuda graph: the training step is captured once and replayed%s%s", planned, s.opt.Hint)
	st.graph, st.loss = graph, loss
	if err := graph.Replay(); err != nil {
		return nil, false, fmt.Errorf("trainer: replaying the captured step: %w", err)
	}
	st.replayed = true
	return loss, true, nil
}

// gradMarks are the cleared marks of an optimiser's gradients
// (tensor.Tensor.ClearGrad) before a capture: a step recorded but never
// run (a failed capture, a planned capture's rehearsal) has written none
// of the gradients its backward pass marked as written, nor cleared those
// its update marked, so the marks go back to these.
type gradMarks struct {
	params  []nn.Parameter
	cleared []bool
}

// clearedMarks records the marks of opt's parameters (none when opt does
// not list them).
func clearedMarks(opt Replayer) gradMarks {
	lister, ok := opt.(interface{ Parameters() []nn.Parameter })
	if !ok {
		return gradMarks{}
	}
	m := gradMarks{params: lister.Parameters()}
	m.cleared = make([]bool, len(m.params))
	for i, p := range m.params {
		m.cleared[i] = p.Tensor.GradCleared()
	}
	return m
}

// restoreGrads puts the recorded marks back after a step recorded but
// never run; with ZeroesGrads, the gradients are then cleared where the
// step's backward pass showed that it writes them whole (they were zero
// before the step).
func (s *Step) restoreGrads(m gradMarks) {
	for i, p := range m.params {
		p.Tensor.RestoreGradCleared(m.cleared[i])
	}
	if s.opt.ZeroesGrads {
		s.clearGrads()
	}
}

// Lend runs f, work queued between steps (an evaluation between epochs),
// with the memory of the step's captured graphs open to its allocations
// (cuda.Backend.Lend): between replays their transient tensors hold
// nothing, so f fits in memory the step already reserved instead of
// reserving its own on top. f must free what it allocates (reset its
// scopes) before it returns. Should it keep some of that memory, the
// graphs it came from are dropped and their shapes captured again at
// their next Run (said through StepOptions.Logf); the new capture takes
// memory of its own, and the dropped graph's goes back only once f's
// kept tensors are freed. Where no graph is replayed it just runs f.
func (s *Step) Lend(f func() error) error {
	g, ok := s.b.(*cuda.Backend)
	if !ok || !s.replaying() {
		return f()
	}
	var err error
	if g.Lend(func() { err = f() }) == 0 {
		return err
	}
	// Some lent blocks are held: the graphs they came from cannot replay.
	errs := []error{err}
	kept := 0
	for _, st := range s.shapes {
		if st.graph == nil || st.graph.Lent() == 0 {
			continue
		}
		kept += st.graph.Lent()
		errs = append(errs, st.graph.Close())
		st.graph, st.loss, st.replayed = nil, nil, false
		s.attempt = true // warmed already: the next Run captures
	}
	if kept > 0 && s.opt.Logf != nil {
		s.opt.Logf("cuda graph: captured again: work between steps kept %d blocks of the step's memory", kept)
	}
	return errors.Join(errs...)
}

// replaying reports whether a graph of some shape is replayed.
func (s *Step) replaying() bool {
	for _, st := range s.shapes {
		if st.graph != nil {
			return true
		}
	}
	return false
}

// warmedUp reports whether a shape's first step ran eagerly before its
// capture.
func (s *Step) warmedUp() bool {
	for _, st := range s.shapes {
		if st.warmed {
			return true
		}
	}
	return false
}

// plans reports whether the step's capture places its memory by a plan
// made from a rehearsal of the capture.
func (s *Step) plans() bool {
	g, ok := s.b.(*cuda.Backend)
	return ok && g.PlansGraphMemory() && !s.opt.NoMemoryPlan
}

// searchesConvolutions reports whether b chooses convolution algorithms by
// timing them (a GPU backend with cuDNN).
func searchesConvolutions(b tensor.Backend) bool {
	g, ok := b.(*cuda.Backend)
	if !ok {
		return false
	}
	_, err := g.CuDNN()
	return err == nil
}

func (s *Step) eager(st *shapeStep) (loss *tensor.Tensor, err error) {
	err = tensor.Guard(func() {
		st.scope.Reset()
		loss = s.step(st.scope)
		if s.opt.ZeroesGrads && !s.cleared {
			// Its backward pass has shown which gradients are written
			// whole; the later updates keep them cleared.
			s.cleared = true
			s.clearGrads()
		}
	})
	return loss, err
}

// clearGrads clears the optimiser's gradients (its ClearGrad: where the
// last backward pass wrote each of them whole, else zeros written).
func (s *Step) clearGrads() {
	if c, ok := s.opt.Optimizer.(interface{ ClearGrad() }); ok {
		c.ClearGrad()
	}
}

// Close releases the scopes and graphs of every batch shape. The Step must
// not be used afterwards.
func (s *Step) Close() error {
	var errs []error
	for k, st := range s.shapes {
		st.scope.Release()
		if st.graph != nil {
			errs = append(errs, st.graph.Close())
		}
		delete(s.shapes, k)
	}
	return errors.Join(errs...)
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
