package optim

import (
	"fmt"
	"math"
	"strings"

	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/tensor"
)

// ParamGroup is a set of parameters that share a learning rate and a weight
// decay, as a torch.optim param_group: typically the weights of a model with
// decay and its biases and normalisation scales without.
type ParamGroup struct {
	Params      []nn.Parameter
	LR          float64
	WeightDecay float64
}

// DecayGroups splits params into the usual two groups of AdamW training:
// parameters of rank two or more (the weights of linear and convolution
// layers) with weightDecay, and the rest (biases, normalisation weights and
// shifts: rank one or less, or a name ending in "bias") without decay,
// which would only pull them towards zero for no regularising benefit.
// Both groups get lr; an empty group is left out. Nil tensors (a layer
// built without bias) are skipped.
func DecayGroups(params []nn.Parameter, lr, weightDecay float64) []ParamGroup {
	var decay, none []nn.Parameter
	for _, p := range params {
		if p.Tensor == nil {
			continue
		}
		if len(p.Tensor.Shape()) <= 1 || p.Name == "bias" || strings.HasSuffix(p.Name, ".bias") {
			none = append(none, p)
		} else {
			decay = append(decay, p)
		}
	}
	var gs []ParamGroup
	if len(decay) > 0 {
		gs = append(gs, ParamGroup{Params: decay, LR: lr, WeightDecay: weightDecay})
	}
	if len(none) > 0 {
		gs = append(gs, ParamGroup{Params: none, LR: lr, WeightDecay: 0})
	}
	return gs
}

// span is where a group lies in the packed buffers.
type span struct{ off, n int }

// packGroups packs the parameters of all groups, in order, into one buffer,
// and their gradients (those that exist are kept, the others start at zero)
// into another, and installs the packed gradients as the parameters' Grad.
// It returns the parameters in packed order and each group's span. Nil
// tensors are skipped.
func packGroups(op string, groups []ParamGroup) (params []nn.Parameter, spans []span, flatP, flatG *tensor.Tensor, err error) {
	var ts, grads []*tensor.Tensor
	off := 0
	for i, g := range groups {
		if g.LR < 0 || math.IsNaN(g.LR) || g.WeightDecay < 0 || math.IsNaN(g.WeightDecay) {
			return nil, nil, nil, nil, fmt.Errorf("optim: %s: group %d: invalid lr %g or weight decay %g", op, i, g.LR, g.WeightDecay)
		}
		n := 0
		for _, p := range g.Params {
			if p.Tensor == nil {
				continue
			}
			params = append(params, p)
			ts = append(ts, p.Tensor)
			n += p.Tensor.Len()
		}
		spans = append(spans, span{off, n})
		off += n
	}
	if len(ts) == 0 {
		return nil, nil, nil, nil, fmt.Errorf("optim: %s with no parameters", op)
	}
	for _, t := range ts {
		g := tensor.Zeros(t.Backend(), nil, t.Shape()...)
		if old := t.Grad(); old != nil {
			tensor.CopyTensor(g, old)
		}
		grads = append(grads, g)
	}
	flatP, flatG = tensor.Pack(ts), tensor.Pack(grads)
	for i, t := range ts {
		t.SetGrad(grads[i])
	}
	return params, spans, flatP, flatG, nil
}

// onHost runs f on host copies of the float32 buffers bufs (empty ones stay
// empty) and writes the copies back: the fallback of a backend without the
// optimiser kernels, which waits for the device.
func onHost(b tensor.Backend, bufs []tensor.Buffer, f func(host []tensor.Buffer)) {
	host := make([]tensor.Buffer, len(bufs))
	data := make([][]float32, len(bufs))
	for i, buf := range bufs {
		if buf.Empty() {
			continue
		}
		data[i] = make([]float32, buf.Len)
		b.Download(data[i], buf)
		h, err := tensor.CPU.Alloc(buf.Len, tensor.Float32)
		if err != nil {
			panic(&tensor.Error{Op: "optim: host fallback", Err: err})
		}
		tensor.CPU.Upload(h, data[i])
		host[i] = h
	}
	f(host)
	for i, buf := range bufs {
		if buf.Empty() {
			continue
		}
		tensor.CPU.Download(data[i], host[i])
		b.Upload(buf, data[i])
	}
}

// cpuOptim is the CPU backend's optimiser kernels, which the fallback runs.
var cpuOptim = tensor.CPU.(tensor.OptimBackend)
