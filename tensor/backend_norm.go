package tensor

// NormBackend is implemented by backends that run batch and layer
// normalisation as single operations each way (the CPU and CUDA backends).
// BatchNorm and LayerNorm use it when the backend has it; otherwise they
// run the CPU's implementation on host copies of the operands (correct,
// slow: a fallback for a backend under development).
//
// Statistics are per channel (batch norm) or per row (layer norm), summed in
// float64 over two passes (the mean, then the squared deviations from it;
// CUDA splits a channel into parts, each summed so about its own mean, and
// combines them exactly), deterministically; the saved mean and inverse
// standard deviation 1/√(var+eps) are float32. Empty weight and bias
// buffers mean no affine transform (weight 1, bias 0). Outputs named d* are
// overwritten, or added to when their acc flag is set, and skipped when
// empty.
type NormBackend interface {
	// BatchNorm normalises x viewed as [n, c, inner] per channel:
	// y = (x - mean[c])·invStd[c]·weight[c] + bias[c]. In training it uses
	// the batch's mean and biased variance, writes them as saveMean and
	// saveInvStd [c], and, when runMean and runVar are not empty, updates
	// them as torch does: run = (1-momentum)·run + momentum·stat, with the
	// unbiased variance (× m/(m-1), m = n·inner) for runVar. Out of
	// training it uses runMean and runVar and writes them as saveMean and
	// saveInvStd (so that the backward pass needs no other form).
	BatchNorm(y, saveMean, saveInvStd, runMean, runVar, x, weight, bias Buffer, n, c, inner int, training bool, momentum, eps float32)
	// BatchNormBackward computes the gradients of BatchNorm from dy, x and
	// the forward's saveMean and saveInvStd. In training the statistics
	// depend on x: dx = weight·invStd·(dy - mean(dy) - x̂·mean(dy·x̂)) over
	// the channel's m elements, x̂ = (x-mean)·invStd; otherwise dx =
	// dy·weight·invStd. dweight = Σ dy·x̂, dbias = Σ dy.
	BatchNormBackward(dx, dweight, dbias, dy, x, weight, saveMean, saveInvStd Buffer, n, c, inner int, training, accX, accW, accB bool)
	// LayerNorm normalises each row of x viewed as [rows, cols] by its mean
	// and biased variance: y = (x - mean[r])·invStd[r]·weight[j] + bias[j],
	// writing saveMean and saveInvStd [rows].
	LayerNorm(y, saveMean, saveInvStd, x, weight, bias Buffer, rows, cols int, eps float32)
	// LayerNormBackward computes dx = invStd·(g - mean(g) - x̂·mean(g·x̂))
	// per row, g = dy·weight, and dweight[j] = Σ_rows dy·x̂, dbias[j] =
	// Σ_rows dy.
	LayerNormBackward(dx, dweight, dbias, dy, x, weight, saveMean, saveInvStd Buffer, rows, cols int, accX, accW, accB bool)
}

// BatchNormActBackend is implemented by backends that run batch norm and
// the activation after it as one operation each way (BatchNormAct): the
// activation in the pass that writes y, and its gradient folded into the
// backward pass, which recomputes batch norm's output z from x rather than
// keeping it. Without it BatchNormAct runs BatchNorm and the activation's
// own operation (ReLU, GELU), which write and read z once more each way.
type BatchNormActBackend interface {
	// BatchNormAct is NormBackend.BatchNorm with y = act(z) for z the
	// normalised value, act one of the activations BatchNormActivation
	// accepts, computed as the elementwise core computes that op.
	BatchNormAct(y, saveMean, saveInvStd, runMean, runVar, x, weight, bias Buffer, n, c, inner int, training bool, momentum, eps float32, act UnaryOp)
	// BatchNormActBackward is NormBackend.BatchNormBackward of the gradient
	// g = dy·act'(z) of z, where z = (x - saveMean)·saveInvStd·weight +
	// bias is recomputed as the forward pass rounded it (so that ReLU's
	// mask is the forward's).
	BatchNormActBackward(dx, dweight, dbias, dy, x, weight, bias, saveMean, saveInvStd Buffer, n, c, inner int, training bool, act UnaryOp, accX, accW, accB bool)
}

// BatchNormActivation reports whether BatchNormAct takes act: identity,
// ReLU and both forms of GELU.
func BatchNormActivation(act UnaryOp) bool {
	switch act {
	case OpIdentity, OpReLU, OpGELU, OpGELUTanh:
		return true
	}
	return false
}
