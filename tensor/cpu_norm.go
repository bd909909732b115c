package tensor

import "math"

// The CPU's normalisation: statistics in float64 over two passes, the
// normalised values x̂ = (x - mean)·invStd and y = x̂·w + b in float32 (each
// operation rounded, as the CUDA kernels with --fmad=false), gradients in
// float64 rounded once. The explicit float32 conversions keep Go from
// fusing a product and a sum into one rounding.

// meanVar returns the mean and the biased variance of the strided
// elements x[0], x[stride], ... (count of them, in runs of run contiguous
// elements every stride), as float64.
func meanVar(x []float32, count, run, stride int) (mean, variance float64) {
	var s float64
	for o := 0; o < count/run; o++ {
		for _, v := range x[o*stride : o*stride+run] {
			s += float64(v)
		}
	}
	mean = s / float64(count)
	var q float64
	for o := 0; o < count/run; o++ {
		for _, v := range x[o*stride : o*stride+run] {
			d := float64(v) - mean
			q += d * d
		}
	}
	return mean, q / float64(count)
}

func invStd(variance float64, eps float32) float32 {
	return float32(1 / math.Sqrt(variance+float64(eps)))
}

// affineAt is (w[i], b[i]), or (1, 0) where the buffers are absent.
func affineAt(w, b []float32, i int) (float32, float32) {
	wi, bi := float32(1), float32(0)
	if w != nil {
		wi = w[i]
	}
	if b != nil {
		bi = b[i]
	}
	return wi, bi
}

func f32Opt(b Buffer) []float32 {
	if b.Empty() {
		return nil
	}
	return f32(b)
}

// normalized is x̂ = (x - mean)·invStd, then x̂·w + b, each rounded to float32.
func normalized(x, mean, inv, w, b float32) float32 {
	xh := float32(x-mean) * inv
	return float32(xh*w) + b
}

// store writes v to *d, or adds it when acc (in float64, rounded once).
func store(d *float32, v float64, acc bool) {
	if acc {
		v += float64(*d)
	}
	*d = float32(v)
}

func (*cpuBackend) BatchNorm(y, saveMean, saveInvStd, runMean, runVar, x, weight, bias Buffer, n, c, inner int, training bool, momentum, eps float32) {
	xs, ys, sm, si := f32(x), f32(y), f32(saveMean), f32(saveInvStd)
	w, b := f32Opt(weight), f32Opt(bias)
	rm, rv := f32Opt(runMean), f32Opt(runVar)
	m := n * inner
	for ch := 0; ch < c; ch++ {
		var mean, inv float32
		if training {
			mu, v := meanVar(xs[ch*inner:], m, inner, c*inner)
			mean, inv = float32(mu), invStd(v, eps)
			if rm != nil {
				mom := float64(momentum)
				rm[ch] = float32((1-mom)*float64(rm[ch]) + mom*mu)
				rv[ch] = float32((1-mom)*float64(rv[ch]) + mom*v*float64(m)/float64(m-1))
			}
		} else {
			mean, inv = rm[ch], invStd(float64(rv[ch]), eps)
		}
		sm[ch], si[ch] = mean, inv
		wc, bc := affineAt(w, b, ch)
		for o := 0; o < n; o++ {
			base := (o*c + ch) * inner
			for i := base; i < base+inner; i++ {
				ys[i] = normalized(xs[i], mean, inv, wc, bc)
			}
		}
	}
}

func (*cpuBackend) BatchNormBackward(dx, dweight, dbias, dy, x, weight, saveMean, saveInvStd Buffer, n, c, inner int, training, accX, accW, accB bool) {
	xs, dys, sm, si := f32(x), f32(dy), f32(saveMean), f32(saveInvStd)
	w := f32Opt(weight)
	dxs, dws, dbs := f32Opt(dx), f32Opt(dweight), f32Opt(dbias)
	m := float64(n * inner)
	for ch := 0; ch < c; ch++ {
		mean, inv := float64(sm[ch]), float64(si[ch])
		var sdy, sdyx float64 // Σ dy, Σ dy·x̂
		for o := 0; o < n; o++ {
			base := (o*c + ch) * inner
			for i := base; i < base+inner; i++ {
				g := float64(dys[i])
				sdy += g
				sdyx += g * ((float64(xs[i]) - mean) * inv)
			}
		}
		if dws != nil {
			store(&dws[ch], sdyx, accW)
		}
		if dbs != nil {
			store(&dbs[ch], sdy, accB)
		}
		if dxs == nil {
			continue
		}
		k := inv
		if w != nil {
			k *= float64(w[ch])
		}
		for o := 0; o < n; o++ {
			base := (o*c + ch) * inner
			for i := base; i < base+inner; i++ {
				g := float64(dys[i])
				if training {
					xh := (float64(xs[i]) - mean) * inv
					g = g - sdy/m - xh*(sdyx/m)
				}
				store(&dxs[i], k*g, accX)
			}
		}
	}
}

// BatchNormAct is BatchNorm, then act on each y as the elementwise core
// computes it (tensor.BatchNormActBackend).
func (cb *cpuBackend) BatchNormAct(y, saveMean, saveInvStd, runMean, runVar, x, weight, bias Buffer, n, c, inner int, training bool, momentum, eps float32, act UnaryOp) {
	cb.BatchNorm(y, saveMean, saveInvStd, runMean, runVar, x, weight, bias, n, c, inner, training, momentum, eps)
	if act == OpIdentity {
		return
	}
	ys := f32(y)
	for i, v := range ys {
		ys[i] = unary32(act, v, 0, 0)
	}
}

// BatchNormActBackward recomputes z as BatchNorm rounds it, takes g =
// dy·act'(z) as the elementwise core's backward pass does, and runs
// BatchNormBackward on g (tensor.BatchNormActBackend).
func (cb *cpuBackend) BatchNormActBackward(dx, dweight, dbias, dy, x, weight, bias, saveMean, saveInvStd Buffer, n, c, inner int, training bool, act UnaryOp, accX, accW, accB bool) {
	g := dy
	if act != OpIdentity {
		g, _ = cb.Alloc(dy.Len, Float32)
		gs, dys, xs, sm, si := f32(g), f32(dy), f32(x), f32(saveMean), f32(saveInvStd)
		w, b := f32Opt(weight), f32Opt(bias)
		for i := range gs {
			ch := (i / max(inner, 1)) % c
			wc, bc := affineAt(w, b, ch)
			gs[i] = unaryGrad32(act, normalized(xs[i], sm[ch], si[ch], wc, bc), dys[i], 0, 0)
		}
	}
	cb.BatchNormBackward(dx, dweight, dbias, g, x, weight, saveMean, saveInvStd, n, c, inner, training, accX, accW, accB)
}

func (*cpuBackend) LayerNorm(y, saveMean, saveInvStd, x, weight, bias Buffer, rows, cols int, eps float32) {
	ys := f32(y)
	layerNormRows(saveMean, saveInvStd, x, weight, bias, rows, cols, eps, func(i int, v float32) { ys[i] = v })
}

// LayerNormCast is LayerNorm with y bfloat16: each value rounded as Cast
// rounds it (tensor.LayerNormCastBackend).
func (*cpuBackend) LayerNormCast(y, saveMean, saveInvStd, x, weight, bias Buffer, rows, cols int, eps float32) {
	ys := bf16(y)
	layerNormRows(saveMean, saveInvStd, x, weight, bias, rows, cols, eps, func(i int, v float32) { ys[i] = BFloat16Bits(v) })
}

var _ LayerNormCastBackend = (*cpuBackend)(nil)

// layerNormRows normalises each row of x, handing element i of the result
// to store.
func layerNormRows(saveMean, saveInvStd, x, weight, bias Buffer, rows, cols int, eps float32, store func(i int, v float32)) {
	xs, sm, si := f32(x), f32(saveMean), f32(saveInvStd)
	w, b := f32Opt(weight), f32Opt(bias)
	for r := 0; r < rows; r++ {
		row := xs[r*cols : (r+1)*cols]
		mu, v := meanVar(row, cols, cols, cols)
		mean, inv := float32(mu), invStd(v, eps)
		sm[r], si[r] = mean, inv
		for j, xv := range row {
			wj, bj := affineAt(w, b, j)
			store(r*cols+j, normalized(xv, mean, inv, wj, bj))
		}
	}
}

func (*cpuBackend) LayerNormBackward(dx, dweight, dbias, dy, x, weight, saveMean, saveInvStd Buffer, rows, cols int, accX, accW, accB bool) {
	xs, dys, sm, si := f32(x), f32(dy), f32(saveMean), f32(saveInvStd)
	w := f32Opt(weight)
	dxs, dws, dbs := f32Opt(dx), f32Opt(dweight), f32Opt(dbias)
	var sw, sb []float64 // Σ over rows, in row order, per column
	if dws != nil {
		sw = make([]float64, cols)
	}
	if dbs != nil {
		sb = make([]float64, cols)
	}
	for r := 0; r < rows; r++ {
		mean, inv := float64(sm[r]), float64(si[r])
		xr, gr := xs[r*cols:(r+1)*cols], dys[r*cols:(r+1)*cols]
		var sg, sgx float64 // Σ g, Σ g·x̂ with g = dy·w
		for j, xv := range xr {
			xh := (float64(xv) - mean) * inv
			d := float64(gr[j])
			if sw != nil {
				sw[j] += d * xh
			}
			if sb != nil {
				sb[j] += d
			}
			if w != nil {
				d *= float64(w[j])
			}
			sg += d
			sgx += d * xh
		}
		if dxs == nil {
			continue
		}
		nc := float64(cols)
		for j, xv := range xr {
			xh := (float64(xv) - mean) * inv
			d := float64(gr[j])
			if w != nil {
				d *= float64(w[j])
			}
			store(&dxs[r*cols+j], inv*(d-sg/nc-xh*(sgx/nc)), accX)
		}
	}
	for j := 0; j < cols; j++ {
		if sw != nil {
			store(&dws[j], sw[j], accW)
		}
		if sb != nil {
			store(&dbs[j], sb[j], accB)
		}
	}
}
