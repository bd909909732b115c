package tensor

// The operations that keep autocast's channels-last form
// (channels_last.go): each is chosen by the operation of the same name
// when its operands are held that way, and gives a result held that way.
// Their backward passes take the incoming gradient in either form and
// write their inputs' gradients channels-last where they can
// (engine.sinkChannelsLast).

// convolveChannelsLast is convolveLowp with its output held channels-last
// (x may be held either way). A fused ReLU is applied before the output
// is rounded, which gives what ReLU of the unfused output gives.
func convolveChannelsLast(cl ChannelsLastBackend, s *Scope, x, w, b *Tensor, g ConvGeom) *Tensor {
	be := x.st.b
	out := newChannelsLast(be, s, g.N, g.K, g.OutH(), g.OutW())
	// The plain operands first: reading one that shares x's storage
	// turns x plain, which would free a form's buffer already taken.
	wb, bb := w.buffer(), optBuffer(b)
	xb, tmp := channelsLastInput(cl, s, x)
	// The filter in the form, cast once for both passes where the backend
	// reads one (ChannelsLastFilterBackend).
	fb, _ := cl.(ChannelsLastFilterBackend)
	var wf *Tensor
	if fb != nil {
		if n := fb.FilterFormLen(g); n > 0 {
			wf = newTensor(be, BFloat16, s, n)
			fb.ToFilterForm(wf.buffer(), wb, g)
		}
	}
	if wf != nil {
		fb.Conv2dChannelsLastFilter(out.st.buf, xb, wb, wf.buffer(), bb, g)
	} else {
		cl.Conv2dChannelsLast(out.st.buf, xb, wb, bb, g)
	}
	// A plain x's copy in the form (a first layer's input) is kept for the
	// filter gradient rather than made again there.
	var xForm *Tensor
	relu := g.ReLU
	g.ReLU = false // the backward pass masks dy itself
	record(out, "conv2d_channels_last", func(dy *Tensor, e *engine) {
		ts := e.scopeFor(x)
		wb := w.buffer() // before any form's buffer is taken, as above
		var db Buffer
		if b != nil {
			db = e.sinkZeroed(b)
		}
		dw := e.sinkZeroed(w)
		dyb, dyTmp := channelsLastInput(cl, ts, dy)
		if relu { // dy·ReLU'(y), from the output, as ReLU's backward pass
			masked := newTensor(be, BFloat16, ts, dyb.Len)
			yb, yTmp := channelsLastInput(cl, ts, out)
			cl.UnaryBackwardChannelsLast(masked.buffer(), dyb, yb, OpReLU, dyb.Len)
			releaseTemp(yTmp)
			releaseTemp(dyTmp)
			dyb, dyTmp = masked.buffer(), masked
		}
		var xb Buffer
		var xTmp *Tensor
		switch {
		case xForm != nil:
			xb = xForm.buffer()
		case w.requiresGrad:
			xb, xTmp = channelsLastInput(cl, ts, x)
		}
		dx, finish := e.sinkChannelsLast(cl, x)
		if wf != nil {
			fb.Conv2dBackwardChannelsLastFilter(dx, dw, db, dyb, xb, wb, wf.buffer(), g)
		} else {
			cl.Conv2dBackwardChannelsLast(dx, dw, db, dyb, xb, wb, g)
		}
		finish()
		releaseTemp(dyTmp)
		releaseTemp(xTmp)
	}, x, w, b)
	if tmp != nil && out.node != nil && w.requiresGrad {
		xForm = tmp
		saveFor(out, tmp)
	} else {
		releaseTemp(tmp)
	}
	if wf != nil && out.node != nil && x.requiresGrad {
		saveFor(out, wf) // for dx
	} else {
		releaseTemp(wf)
		wf = nil
	}
	if !relu {
		readsNot(out, true) // x and w are what it reads
	}
	return out
}

// batchNormChannelsLast is batchNorm of x [N, C, H, W] held channels-last.
func batchNormChannelsLast(cl ChannelsLastBackend, s *Scope, x, weight, bias, runningMean, runningVar *Tensor, training bool, momentum, eps float32, act UnaryOp) *Tensor {
	be := x.st.b
	n, c, h, w := x.shape[0], x.shape[1], x.shape[2], x.shape[3]
	rows := n * h * w
	out := newChannelsLast(be, s, n, c, h, w)
	mean, inv := Empty(be, s, c), Empty(be, s, c)
	rm, rv, wb, bb := optBuffer(runningMean), optBuffer(runningVar), optBuffer(weight), optBuffer(bias)
	xb, tmp := channelsLastInput(cl, s, x) // after the plain operands (convolveChannelsLast says why)
	cl.BatchNormChannelsLast(out.st.buf, mean.buffer(), inv.buffer(), rm, rv, xb, wb, bb, rows, c, training, momentum, eps, act)
	releaseTemp(tmp)
	record(out, "batch_norm_channels_last", func(dy *Tensor, e *engine) {
		ts := e.scopeFor(x)
		wb, bb := optBuffer(weight), optBuffer(bias)
		dw, db, accW, accB := affineSinks(e, weight, bias)
		dyb, dyTmp := channelsLastInput(cl, ts, dy)
		xb, xTmp := channelsLastInput(cl, ts, x)
		dx, finish := e.sinkChannelsLast(cl, x)
		cl.BatchNormBackwardChannelsLast(dx, dw, db, dyb, xb, wb, bb, mean.buffer(), inv.buffer(),
			rows, c, training, act, accW, accB)
		finish()
		releaseTemp(dyTmp)
		releaseTemp(xTmp)
	}, x, weight, bias)
	saveFor(out, mean, inv)
	readsNot(out, true) // x and the statistics are what it reads
	return out
}

// maxPoolBatchNormChannelsLast is MaxPoolBatchNormAct of x held
// channels-last, on a backend with ChannelsLastPoolNormBackend: the
// pooling's and batch norm's forward passes as apart, one backward pass
// (nil where x or the backend is not so, or the windows are too large).
func maxPoolBatchNormChannelsLast(x *Tensor, k int, weight, bias, runningMean, runningVar *Tensor, training bool, momentum, eps float32, act UnaryOp) *Tensor {
	if k < 1 || k*k > 256 || len(x.shape) != 4 || x.shape[2] < k || x.shape[3] < k {
		return nil
	}
	cl, xb, ok := heldOn(x)
	if !ok {
		return nil
	}
	pn, ok := cl.(ChannelsLastPoolNormBackend)
	if !ok {
		return nil
	}
	_, g := poolGeomOf("MaxPoolBatchNormAct", x, PoolOptions{Kernel: [2]int{k, k}})
	oh, ow := g.OutH(), g.OutW()
	checkBatchNorm([]int{g.N, g.C, oh, ow}, x, weight, bias, runningMean, runningVar, training)
	if weight != nil {
		weight = weight.Contiguous()
	}
	if bias != nil {
		bias = bias.Contiguous()
	}
	s := scopeOf(x, weight, bias)
	if training && s.replaying() {
		// Recompute's second run: the first updated the statistics.
		runningMean, runningVar = nil, nil
	}
	be := x.st.b
	c := g.C
	p := newChannelsLast(be, s, g.N, c, oh, ow)
	idx := EmptyOf(be, s, Uint8, p.Len())
	out := newChannelsLast(be, s, g.N, c, oh, ow)
	mean, inv := Empty(be, s, c), Empty(be, s, c)
	pn.MaxPoolBatchNormChannelsLast(out.st.buf, p.st.buf, idx.buffer(), mean.buffer(), inv.buffer(), optBuffer(runningMean),
		optBuffer(runningVar), xb, optBuffer(weight), optBuffer(bias), g, training, momentum, eps, act)
	record(out, "maxpool_batch_norm_channels_last", func(dy *Tensor, e *engine) {
		dw, db, accW, accB := affineSinks(e, weight, bias)
		dyb, dyTmp := channelsLastInput(cl, e.scopeFor(x), dy)
		dx, finish := e.sinkChannelsLast(cl, x)
		pn.BatchNormMaxPoolBackwardChannelsLast(dx, dw, db, dyb, p.st.buf, idx.buffer(), optBuffer(weight), optBuffer(bias),
			mean.buffer(), inv.buffer(), g, training, act, accW, accB)
		finish()
		releaseTemp(dyTmp)
	}, x, weight, bias)
	saveFor(out, p, idx, mean, inv)
	readsNot(out, true, x) // the pooled values and positions are what it reads
	return out
}

// heldOn is x's memory in the form and its backend's ChannelsLastBackend,
// when x is held that way in a scope whose autocast keeps the form.
func heldOn(x *Tensor) (ChannelsLastBackend, Buffer, bool) {
	cl, ok := channelsLastOf(x.st.b, x.scope)
	if !ok {
		return nil, Buffer{}, false
	}
	xb, ok := x.channelsLast()
	return cl, xb, ok
}

// unaryChannelsLast is act(x) for x held channels-last and act one the
// form runs (ReLU, GELU); nil, having done nothing, otherwise.
func unaryChannelsLast(x *Tensor, act UnaryOp) *Tensor {
	if act != OpReLU && act != OpGELU && act != OpGELUTanh {
		return nil
	}
	cl, xb, ok := heldOn(x)
	if !ok {
		return nil
	}
	out := newChannelsLast(x.st.b, x.scope, x.shape[0], x.shape[1], x.shape[2], x.shape[3])
	n := x.Len()
	cl.UnaryChannelsLast(out.st.buf, xb, act, n)
	record(out, "unary_channels_last", func(dy *Tensor, e *engine) {
		ts := e.scopeFor(x)
		dyb, dyTmp := channelsLastInput(cl, ts, dy)
		xb, xTmp := channelsLastInput(cl, ts, x)
		dx, finish := e.sinkChannelsLast(cl, x)
		if !dx.Empty() {
			cl.UnaryBackwardChannelsLast(dx, dyb, xb, act, n)
		}
		finish()
		releaseTemp(dyTmp)
		releaseTemp(xTmp)
	}, x)
	readsNot(out, true) // x is what it reads
	return out
}

// addChannelsLast is a + b for a and b held channels-last (same shape);
// nil, having done nothing, otherwise.
func addChannelsLast(a, b *Tensor) *Tensor {
	s := scopeOf(a, b)
	cl, ok := channelsLastOf(a.st.b, s)
	if !ok || a.st.b != b.st.b {
		return nil
	}
	ab, okA := a.channelsLast()
	bb, okB := b.channelsLast()
	if !okA || !okB {
		return nil
	}
	out := newChannelsLast(a.st.b, s, a.shape[0], a.shape[1], a.shape[2], a.shape[3])
	cl.AddChannelsLast(out.st.buf, ab, bb, a.Len())
	record(out, "add_channels_last", func(g *Tensor, e *engine) {
		passChannelsLast(cl, e, b, g)
		if _, held := g.channelsLast(); held && a.requiresGrad && a.node != nil && e.grads[a] == nil {
			e.give(a, g) // a adopts g, as Add's a does
			return
		}
		passChannelsLast(cl, e, a, g)
	}, a, b)
	readsNot(out, true, a, b)
	return out
}

// passChannelsLast adds g, in either form, into the gradient of t
// [N, C, H, W], channels-last where t's gradient is or may be.
func passChannelsLast(cl ChannelsLastBackend, e *engine, t, g *Tensor) {
	dst, finish := e.sinkChannelsLast(cl, t)
	if dst.Empty() {
		return
	}
	gb, tmp := channelsLastInput(cl, e.scopeFor(t), g)
	t.st.b.Copy(dst, gb)
	releaseTemp(tmp)
	finish()
}

// maxPoolChannelsLast is MaxPool2d of x held channels-last over windows
// that do not overlap; nil, having done nothing, for any other x or
// windows.
func maxPoolChannelsLast(x *Tensor, g PoolGeom) *Tensor {
	if g.StrideH != g.KH || g.StrideW != g.KW || g.PadH != 0 || g.PadW != 0 || g.KH*g.KW > 256 {
		return nil
	}
	cl, xb, ok := heldOn(x)
	if !ok {
		return nil
	}
	out := newChannelsLast(x.st.b, x.scope, g.N, g.C, g.OutH(), g.OutW())
	idx := EmptyOf(x.st.b, x.scope, Uint8, out.Len())
	cl.MaxPoolChannelsLast(out.st.buf, idx.buffer(), xb, g)
	record(out, "maxpool2d_channels_last", func(dy *Tensor, e *engine) {
		dyb, dyTmp := channelsLastInput(cl, e.scopeFor(x), dy)
		dx, finish := e.sinkChannelsLast(cl, x)
		if !dx.Empty() {
			cl.MaxPoolBackwardChannelsLast(dx, dyb, idx.buffer(), g)
		}
		finish()
		releaseTemp(dyTmp)
	}, x)
	saveFor(out, idx)
	readsNot(out, true, x) // the maxima's positions are what it reads
	return out
}
