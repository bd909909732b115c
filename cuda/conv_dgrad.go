package cuda

// At stride 1 a convolution's data gradient is itself a convolution: dx =
// conv(dy, wt) with wt[c][k][r][s] = w[k][c][R-1-r][S-1-s] (the filter's
// channels swapped and its taps reversed) and padding R-1-pad. cuDNN's
// forward kernels run some geometries faster than its data-gradient
// kernels do: airbench's 15x15 64->256 layer took 147 µs a data gradient
// and 105 a forward pass of the same size (docs/performance.md, round 33).
// So a channels-last geometry measures both ways on its first backward
// pass outside a capture (the flipped filter's cast included) and keeps
// the faster.

// transposedGeom is the geometry of the forward pass that computes dg's
// data gradient (x = dy, y = dx), or false where dg has no such pass here:
// a stride or dilation other than 1, groups, padding past R-1, or not
// channels-last bfloat16.
func transposedGeom(dg convDescGeom) (convDescGeom, bool) {
	if !dg.nhwc || dg.groups != 1 || dg.strideH != 1 || dg.strideW != 1 || dg.dilH != 1 || dg.dilW != 1 ||
		dg.padH > dg.r-1 || dg.padW > dg.s-1 {
		return dg, false
	}
	t := dg
	t.c, t.k = dg.k, dg.c
	t.h, t.w, t.oh, t.ow = dg.oh, dg.ow, dg.h, dg.w
	t.padH, t.padW = dg.r-1-dg.padH, dg.s-1-dg.padW
	return t, true
}

// flippedFilter casts w [K][C][R][S] (float32) into a workspace as the
// transposed pass's filter [C][R][S][K] (bfloat16, taps reversed), which
// done releases.
func (b *Backend) flippedFilter(op string, pw uintptr, c convShape) (wt uintptr, done func()) {
	g := c.g
	n := g.K * g.C * g.R * g.S
	blk := b.workspace(op, 2*n)
	b.launch(op, b.kernel("ember_cl_filter_flip_bf16"), n, blk.Ptr(), pw,
		i32arg(op, g.K), i32arg(op, g.C), i32arg(op, g.R), i32arg(op, g.S), int64(n))
	return blk.Ptr(), func() { b.release(blk) }
}

// dataGradForward queues dx = conv(dy, wt) through tp, the transposed
// geometry's plan, with its algorithm a.
func (b *Backend) dataGradForward(op string, tp *convPlan, a convAlgo, pw, pdy, pdx uintptr, c convShape) {
	wt, done := b.flippedFilter(op, pw, c)
	defer done()
	b.runDNN(op, tp, dirForward, a, pdy, wt, 0, pdx)
}

// dataGradAsForward returns the transposed plan of p and its forward
// algorithm where the data gradient measured faster that way than
// through a, p's own data-gradient algorithm (nil otherwise). The first
// call outside a capture searches the transposed geometry and times both
// ways on the call's buffers (dx is overwritten); inside a capture an
// undecided plan takes its own. s.mu is held.
func (b *Backend) dataGradAsForward(op string, p *convPlan, a convAlgo, pw, wh, pdy, pdx uintptr, c convShape) (*convPlan, convAlgo) {
	switch p.dxForward {
	case altFaster:
		return p.dxPlan, p.dxPlan.algo[dirForward]
	case altSlower:
		return nil, convAlgo{}
	}
	tg, ok := transposedGeom(p.geom)
	if b.capturing.Load() && ok {
		return nil, convAlgo{}
	}
	p.dxForward = altSlower
	s := b.dnn
	if !ok || s.clock == nil {
		return nil, convAlgo{}
	}
	tp := s.plan(tg)
	if tp.failed[dirForward] != nil {
		return nil, convAlgo{}
	}
	wt, done := b.flippedFilter(op, pw, c)
	ta, ok := b.algoFor(op, tp, dirForward, pdy, wt, pdx, 0)
	done()
	if !ok {
		return nil, convAlgo{}
	}
	if !b.altFaster("data gradient as a forward pass", p,
		func() { b.runDNN(op, p, dirBackwardData, a, wh, pdy, 0, pdx) },
		func() { b.dataGradForward(op, tp, ta, pw, pdy, pdx, c) }) {
		return nil, convAlgo{}
	}
	p.dxForward, p.dxPlan = altFaster, tp
	return tp, ta
}
