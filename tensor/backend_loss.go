package tensor

// ClassLossSpec describes a class loss (ClassLossBackend): logits viewed as
// [Outer, Classes, Inner] (torch's layout, the classes on axis 1 and Inner
// the product of the trailing axes, 1 for [N, C]) and int32 labels [Outer,
// Inner], one target per (outer, inner) position.
type ClassLossSpec struct {
	Outer, Classes, Inner int
	// Smoothing ε in [0, 1]: a target t costs (1-ε)·(-log p_t) + ε·mean
	// over the classes c of (-log p_c), as torch's label_smoothing.
	Smoothing float32
	// Ignore makes targets equal to IgnoreIndex cost nothing: no loss, a
	// zero gradient, and not counted by the mean.
	Ignore      bool
	IgnoreIndex int32
	// Sum asks for the sum over the targets instead of the mean over the
	// counted ones.
	Sum bool
}

// ClassLossBackend is implemented by backends that compute a cross entropy
// with torch's options (label smoothing, an ignore index, mean or sum, any
// number of trailing axes) as device work alone: the number of counted
// targets, which scales a mean and its gradient, is counted on the device,
// so nothing waits for the host and the operation can be captured in a CUDA
// graph. Without it CrossEntropyLoss reads the labels to the host and
// composes LogSoftmax, Mul and Sum.
//
// Its sums are deterministic (fixed orders, no atomics), so that repeated
// runs agree bit for bit and CPU and GPU agree to a few ulps.
type ClassLossBackend interface {
	// ClassLoss sets loss[0] to the loss of logits against labels as s
	// describes: the mean over the counted targets (NaN when none counts,
	// as torch) or the sum. When dlogits is not empty it is overwritten
	// with the loss's gradient with respect to the logits (zero at ignored
	// targets), so that a backward pass seeded with 1 needs no more work
	// and one seeded with g is one ScaleBy. A label outside [0, Classes)
	// that is not ignored is a programming error: the CPU panics, CUDA
	// traps (a device error, reported by the next synchronization).
	ClassLoss(loss, dlogits, logits, labels Buffer, s ClassLossSpec)
}

// CrossEntropyBackend is implemented by backends with a kernel for the
// mean cross entropy of [n, classes] logits and its gradient in one pass.
// Without it (Complete) CrossEntropy is ClassLoss where the backend has a
// ClassLossBackend, else the core's log-softmax, a one-hot gather
// (IndexSelect of an identity matrix), a product and a sum.
type CrossEntropyBackend interface {
	// CrossEntropy computes the mean over n rows of -log softmax(logits)[label]
	// into loss[0] and, when dlogits is not empty, its gradient
	// (softmax - onehot)/n into dlogits. labels is int32.
	CrossEntropy(loss, dlogits, logits, labels Buffer, n, classes int)
}
