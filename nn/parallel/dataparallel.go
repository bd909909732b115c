package parallel

import (
	"fmt"
	"strings"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// DefaultBucketBytes is the size of a gradient bucket, PyTorch DDP's
// bucket_cap_mb default of 25 MiB.
const DefaultBucketBytes = 25 << 20

// DataParallelOptions tune NewDataParallel.
type DataParallelOptions struct {
	// BucketBytes caps the gradients all-reduced in one call (default
	// DefaultBucketBytes). A parameter larger than the cap is a bucket of
	// its own.
	BucketBytes int
	// Buffers are state tensors that are not learnt (BatchNorm's running
	// statistics, nn.Buffers): BroadcastParameters sends rank 0's too, so
	// that every replica starts the same; afterwards each rank keeps its
	// own statistics, DDP's default.
	Buffers []nn.Parameter
}

// DataParallel gives a model PyTorch DDP's semantics over a Communicator:
// every rank starts from rank 0's parameters (BroadcastParameters) and,
// after each backward pass, holds the average of all ranks' gradients
// (AllReduceGradients), so that every rank's optimiser takes the same step
// and the replicas stay identical.
//
// It works on the buffers the optimiser packed: optim.NewSGD moves the
// parameters into one allocation and the gradients into another
// (tensor.Pack), so the gradients of a model are one contiguous buffer,
// and a bucket is one window of it: no copies into and out of bucket
// buffers as DDP makes. Create the optimiser first.
//
// Buckets follow DDP: parameters in reverse order (the order backward
// produces their gradients), grouped while they are contiguous and under
// the cap. Overlap starts each bucket's all-reduce from the backward pass
// itself, as soon as its gradients are final.
type DataParallel struct {
	c       Communicator
	params  []nn.Parameter
	grads   []tensor.Buffer // the gradient windows seen at New, to detect a repack
	pruns   []tensor.Buffer // contiguous runs of parameters and buffers, for the broadcast
	buckets []Bucket

	// Overlap's state: the bucket of each parameter, the gradients ready
	// per bucket in this backward pass, the next bucket to start, and the
	// first error of a start.
	overlap  bool
	bucketOf []int
	ready    []int
	next     int
	asyncErr error
}

// Bucket is one all-reduce of gradients: the window Buffer of the packed
// gradients of the parameters Params (indices into the parameter list, in
// the order their gradients become ready).
type Bucket struct {
	Buffer tensor.Buffer
	Params []int
}

// NewDataParallel prepares the all-reduce of the gradients of params (on
// c's backend, gradients already allocated: create the optimiser first)
// and checks that every rank has the same parameter layout. It is a
// collective: every rank calls it.
func NewDataParallel(c Communicator, params []nn.Parameter, opt DataParallelOptions) (*DataParallel, error) {
	if opt.BucketBytes <= 0 {
		opt.BucketBytes = DefaultBucketBytes
	}
	if len(params) == 0 {
		return nil, fmt.Errorf("parallel: DataParallel of no parameters")
	}
	d := &DataParallel{c: c, params: params}
	var pbufs []tensor.Buffer
	for _, p := range params {
		t, g := p.Tensor, p.Tensor.Grad()
		switch {
		case t.Backend() != c.Backend():
			return nil, fmt.Errorf("parallel: parameter %s is on %s, the communicator on %s", p.Name, t.Backend().Name(), c.Backend().Name())
		case t.DType() != tensor.Float32 || !t.IsContiguous():
			return nil, fmt.Errorf("parallel: parameter %s is not a contiguous float32 tensor", p.Name)
		case g == nil:
			return nil, fmt.Errorf("parallel: parameter %s has no gradient: create the optimiser (which allocates and packs the gradients) before NewDataParallel", p.Name)
		case !g.IsContiguous() || g.Len() != t.Len():
			return nil, fmt.Errorf("parallel: the gradient of %s is not a contiguous tensor of its shape", p.Name)
		}
		pbufs = append(pbufs, t.Buffer())
		d.grads = append(d.grads, g.Buffer())
	}
	for _, b := range opt.Buffers {
		if t := b.Tensor; t.Backend() != c.Backend() || t.DType() != tensor.Float32 || !t.IsContiguous() {
			return nil, fmt.Errorf("parallel: buffer %s is not a contiguous float32 tensor on %s", b.Name, c.Backend().Name())
		}
		pbufs = append(pbufs, b.Tensor.Buffer())
	}
	d.pruns = contiguousRuns(pbufs)
	d.buckets = makeBuckets(d.grads, opt.BucketBytes/4)
	if err := d.checkSameModel(); err != nil {
		return nil, err
	}
	return d, nil
}

// contiguousRuns merges buffers that follow each other in one memory.
func contiguousRuns(bufs []tensor.Buffer) []tensor.Buffer {
	var runs []tensor.Buffer
	for _, b := range bufs {
		if n := len(runs); n > 0 && runs[n-1].Mem == b.Mem && runs[n-1].Off+runs[n-1].Len == b.Off {
			runs[n-1].Len += b.Len
			continue
		}
		runs = append(runs, b)
	}
	return runs
}

// makeBuckets groups the gradients, last parameter first, into windows of
// at most capElems elements of contiguous memory.
func makeBuckets(grads []tensor.Buffer, capElems int) []Bucket {
	var out []Bucket
	for i := len(grads) - 1; i >= 0; i-- {
		g := grads[i]
		if n := len(out); n > 0 {
			last := &out[n-1]
			// Going backwards, parameter i sits just before the bucket.
			if last.Buffer.Mem == g.Mem && g.Off+g.Len == last.Buffer.Off && last.Buffer.Len+g.Len <= capElems {
				last.Buffer.Off, last.Buffer.Len = g.Off, last.Buffer.Len+g.Len
				last.Params = append(last.Params, i)
				continue
			}
		}
		out = append(out, Bucket{Buffer: g, Params: []int{i}})
	}
	return out
}

// Buckets lists the all-reduces of AllReduceGradients, in their order.
func (d *DataParallel) Buckets() []Bucket { return d.buckets }

// Communicator is the communicator the gradients go through.
func (d *DataParallel) Communicator() Communicator { return d.c }

// checkSameModel compares the parameter layout with rank 0's: the same
// number of parameters of the same sizes. A mismatch would otherwise show
// as a hang or garbage in the first all-reduce.
func (d *DataParallel) checkSameModel() error {
	// A layout as small integers (exact in float32): count, and for each
	// parameter, its length in 12-bit digits folded into a checksum.
	var sum, total int
	for i, p := range d.params {
		sum = (sum*31 + p.Tensor.Len() + i) % 4093
		total += p.Tensor.Len()
	}
	mine := []float32{float32(len(d.params)), float32(total % 4096), float32(total / 4096 % 4096), float32(total / (1 << 24) % 4096), float32(sum)}
	theirs := append([]float32(nil), mine...)
	if d.c.Rank() != 0 {
		clear(theirs)
	}
	if err := d.c.AllReduceValues(theirs, Sum); err != nil {
		return err
	}
	// Then every rank learns who differs, so that all fail together.
	differs := make([]float32, d.c.Size())
	for i := range mine {
		if mine[i] != theirs[i] {
			differs[d.c.Rank()] = 1
		}
	}
	if err := d.c.AllReduceValues(differs, Sum); err != nil {
		return err
	}
	var bad []string
	for r, v := range differs {
		if v != 0 {
			bad = append(bad, fmt.Sprint(r))
		}
	}
	if len(bad) > 0 {
		return &RankError{Rank: d.c.Rank(), Err: fmt.Errorf("the model differs from rank 0's on rank(s) %s (this rank: %d parameters of %d values; rank 0: %d of %d)",
			strings.Join(bad, ", "), len(d.params), total, int(theirs[0]), int(theirs[1])+int(theirs[2])*4096+int(theirs[3])*(1<<24))}
	}
	return nil
}

// BroadcastParameters overwrites every rank's parameters (and the Buffers
// of the options) with rank 0's, in one broadcast per contiguous run of
// them (the parameters are one, after NewSGD). Call
// it once before training, after loading a checkpoint on rank 0 if any.
func (d *DataParallel) BroadcastParameters() error {
	for _, run := range d.pruns {
		if err := d.c.Broadcast(run, 0); err != nil {
			return err
		}
	}
	return nil
}

// AllReduceGradients replaces every rank's gradients by their average over
// the ranks, bucket by bucket. Call it after backward and before the
// optimiser step; with a mean loss over each rank's B/N samples the result
// is the gradient of the mean loss over all B samples.
func (d *DataParallel) AllReduceGradients() error {
	for i, p := range d.params {
		if g := p.Tensor.Grad(); g == nil || g.Buffer() != d.grads[i] {
			return fmt.Errorf("parallel: the gradient of %s moved since NewDataParallel (a new optimiser repacked it?): make a new DataParallel", p.Name)
		}
	}
	for _, b := range d.buckets {
		if err := d.c.AllReduce(b.Buffer, Average); err != nil {
			return err
		}
	}
	return nil
}
