package tensor

import (
	"fmt"
	"math"
)

var _ OptimBackend = (*cpuBackend)(nil)

func (*cpuBackend) Adam(pb, gb, mb, vb, vmaxb, sb Buffer, h AdamStep) {
	p, g, m, v := f32(pb), f32(gb), f32(mb), f32(vb)
	if len(g) != len(p) || len(m) != len(p) || len(v) != len(p) {
		panic(fmt.Sprintf("tensor: cpu: Adam of %d parameters with %d gradients, %d and %d moments", len(p), len(g), len(m), len(v)))
	}
	var vmax []float32
	if h.AMSGrad {
		vmax = f32(vmaxb)
		if len(vmax) != len(p) {
			panic(fmt.Sprintf("tensor: cpu: Adam (amsgrad) of %d parameters with %d maxima", len(p), len(vmax)))
		}
	}
	s := f32(sb)
	if len(s) < NumAdamScalars {
		panic(fmt.Sprintf("tensor: cpu: Adam with %d scalars, need %d", len(s), NumAdamScalars))
	}
	stepSize, bc2Sqrt, decay, w := s[AdamStepSize], s[AdamBC2Sqrt], s[AdamDecay], s[AdamBeta1Weight]
	for i := range p {
		pi := p[i] * decay
		d := g[i]
		if h.WeightDecay != 0 {
			d += h.WeightDecay * pi
		}
		mi := m[i]
		if w < 0.5 && w > -0.5 {
			mi = mi + w*(d-mi)
		} else {
			mi = d - (d-mi)*(1-w)
		}
		vi := v[i]*h.Beta2 + (h.OneMinusBeta2*d)*d
		m[i], v[i] = mi, vi
		if h.AMSGrad {
			vi = max(vmax[i], vi)
			vmax[i] = vi
		}
		denom := float32(math.Sqrt(float64(vi)))/bc2Sqrt + h.Eps
		p[i] = pi + (-stepSize*mi)/denom
		if h.ZeroGrad {
			g[i] = 0
		}
	}
}

func (c *cpuBackend) SGDDevice(p, g, v, sb Buffer, h SGDStep) {
	s := f32(sb)
	if len(s) < NumSGDScalars {
		panic(fmt.Sprintf("tensor: cpu: SGD with %d scalars, need %d", len(s), NumSGDScalars))
	}
	h.LR, h.Momentum, h.Dampening, h.WeightDecay = s[SGDLR], s[SGDMomentum], s[SGDDampening], s[SGDWeightDecay]
	if h.Momentum != 0 && v.Len != p.Len {
		panic(fmt.Sprintf("tensor: cpu: SGD with momentum %g over %d parameters and %d momentum values", h.Momentum, p.Len, v.Len))
	}
	c.SGD(p, g, v, h)
}

func (*cpuBackend) ClipCoef(norm, coef, gb Buffer, maxNorm float32) {
	var ss float64
	for _, v := range f32(gb) {
		ss += float64(v) * float64(v)
	}
	n := float32(math.Sqrt(ss))
	c := maxNorm / (n + ClipEps)
	if c > 1 { // a NaN stays NaN, as torch.clamp(max=1)
		c = 1
	}
	f32(norm)[0], f32(coef)[0] = n, c
}
