package tensor

// The optimiser family of the Backend: fused update kernels whose per-step
// values (the learning rate, Adam's bias corrections) are read from a small
// device buffer rather than passed as launch arguments. A training step
// captured once as a CUDA graph replays the same launches with the same
// arguments; only device memory may change between replays, so the
// optimiser writes the coming step's values into that buffer (one Upload,
// queued before the replay) and the captured kernels pick them up.

// Layout of Adam's per-step device scalars (NumAdamScalars float32 per
// parameter group), written by the optimiser before every step, as
// torch.optim.Adam computes them on the host in double precision:
//
//	s[AdamStepSize]    = lr / (1 - beta1^t)
//	s[AdamBC2Sqrt]     = sqrt(1 - beta2^t)
//	s[AdamDecay]       = 1 - lr·weight_decay for AdamW (decoupled decay), 1 for Adam
//	s[AdamBeta1Weight] = 1 - beta1, the weight of the gradient in the first
//	                     moment's lerp (a device value because a one-cycle
//	                     schedule cycles beta1 as it cycles SGD's momentum)
//
// t is the 1-based number of the update.
const (
	AdamStepSize = iota
	AdamBC2Sqrt
	AdamDecay
	AdamBeta1Weight
	NumAdamScalars
)

// Layout of SGD's device scalars (NumSGDScalars float32), read by
// OptimBackend.SGDDevice instead of the matching SGDStep fields, so that a
// schedule may change any of them between replays of a captured step.
const (
	SGDLR = iota
	SGDMomentum
	SGDDampening
	SGDWeightDecay
	NumSGDScalars
)

// AdamStep holds the hyper-parameters of an Adam or AdamW update that stay
// fixed from step to step (launch arguments; the per-step values, 1 - beta1
// among them as the weight of the first moment's lerp, are in the scalars
// buffer at AdamBeta1Weight). The differences 1-beta are given as torch
// computes them (in double, then rounded once to float32), not as
// 1 - float32(beta).
type AdamStep struct {
	// Beta2 and OneMinusBeta2: v = v·beta2 + (1 - beta2)·g·g.
	Beta2, OneMinusBeta2 float32
	Eps                  float32
	// WeightDecay is Adam's L2 term, added to the gradient (g + wd·p); 0
	// for AdamW, whose decoupled decay is the scalar AdamDecay.
	WeightDecay float32
	// AMSGrad keeps the running maximum of v in vmax and divides by it.
	AMSGrad bool
	// ZeroGrad sets each gradient to zero once the update has read it.
	ZeroGrad bool
}

// SGDBackend is implemented by backends with a fused SGD update. Without
// it (Complete) the update is a few core elementwise operations with the
// same roundings as the CPU's kernel.
type SGDBackend interface {
	// SGD applies one torch.optim.SGD update to the parameters p with
	// gradients g and momentum buffers v (all the same length, so that many
	// parameters held in one buffer take one call; v may be empty without
	// momentum).
	SGD(p, g, v Buffer, h SGDStep)
}

// OptimBackend is implemented by backends with fused optimiser kernels (the
// CPU and CUDA backends). Package optim falls back to running the CPU
// backend's update on host copies for a backend without it (correct, but it
// waits for the device every step).
type OptimBackend interface {
	// Adam applies one torch.optim.Adam/AdamW update, elementwise over p,
	// its gradient g and the moments m and v (all the same length; vmax
	// too with AMSGrad, else it may be empty), with the per-step values
	// s[0:NumAdamScalars] (see AdamStepSize):
	//
	//	p = p·s[AdamDecay]
	//	d = g + wd·p                      (wd ≠ 0 only for Adam)
	//	m = lerp(m, d, s[AdamBeta1Weight])
	//	v = v·beta2 + ((1 - beta2)·d)·d
	//	vmax = max(vmax, v)               (AMSGrad; the denominator uses vmax)
	//	p = p + (-s[AdamStepSize]·m) / (√v / s[AdamBC2Sqrt] + eps)
	//
	// lerp(a, b, w) is a + w·(b - a) for |w| < 0.5 and b - (b - a)·(1 - w)
	// otherwise, as torch.lerp.
	Adam(p, g, m, v, vmax, s Buffer, h AdamStep)
	// SGDDevice is SGDBackend.SGD with the learning rate, momentum,
	// dampening and weight decay read from s[0:NumSGDScalars] (see SGDLR)
	// instead of h's fields (which are ignored): the same operations
	// otherwise. v may be empty only while s[SGDMomentum] is 0.
	SGDDevice(p, g, v, s Buffer, h SGDStep)
	// ClipCoef sets norm[0] to the Euclidean norm of g (the squares summed
	// in double precision) and coef[0] to min(maxNorm / (norm + 1e-6), 1)
	// as torch.nn.utils.clip_grad_norm_ computes it (a NaN norm gives a NaN
	// coefficient). Scaling g by coef (ScaleBy) completes the clipping
	// without the host reading the norm.
	ClipCoef(norm, coef, g Buffer, maxNorm float32)
}

// ClipEps is the term clip_grad_norm_ adds to the norm before dividing.
const ClipEps = 1e-6
