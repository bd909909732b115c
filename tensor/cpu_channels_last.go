package tensor

// The CPU's ChannelsLastBackend: each operation widens its channels-last
// operands to float32, runs the CPU's float32 operation (in the layout it
// takes) and rounds the result to bfloat16. That is the form's meaning,
// and the reference the GPU's kernels are checked against.

var _ ChannelsLastPoolNormBackend = (*cpuBackend)(nil)

// hostF32 is a float32 host buffer of n elements.
func hostF32(n int) Buffer {
	return Buffer{Mem: &cpuMem{f: make([]float32, n)}, Len: n, DType: Float32}
}

// widen is the channels-last src as float32, in its own layout.
func widen(src Buffer, n int) Buffer {
	out := hostF32(n)
	d := f32(out)
	for i, h := range bf16(src)[:n] {
		d[i] = BFloat16Float32(h)
	}
	return out
}

// narrow rounds src (float32) into dst (bfloat16), same layout.
func narrow(dst, src Buffer, n int) {
	d := bf16(dst)[:n]
	for i, v := range f32(src)[:n] {
		d[i] = BFloat16Bits(v)
	}
}

// ConvChannelsLast takes what ConvLowp takes: every geometry.
func (c *cpuBackend) ConvChannelsLast(g ConvGeom) bool { return c.ConvLowp(g) }

func (*cpuBackend) ToChannelsLast(dst, src Buffer, n, c, inner int) {
	d, s := bf16(dst)[:n*c*inner], f32(src)[:n*c*inner]
	for i := 0; i < n; i++ {
		for ch := 0; ch < c; ch++ {
			for p := 0; p < inner; p++ {
				d[(i*inner+p)*c+ch] = BFloat16Bits(s[(i*c+ch)*inner+p])
			}
		}
	}
}

func (*cpuBackend) FromChannelsLast(dst, src Buffer, n, c, inner int, accumulate bool) {
	d, s := f32(dst)[:n*c*inner], bf16(src)[:n*c*inner]
	for i := 0; i < n; i++ {
		for ch := 0; ch < c; ch++ {
			for p := 0; p < inner; p++ {
				v := BFloat16Float32(s[(i*inner+p)*c+ch])
				if accumulate {
					v += d[(i*c+ch)*inner+p]
				}
				d[(i*c+ch)*inner+p] = v
			}
		}
	}
}

// planar is the channels-last x [n, inner, c] as float32 [n, c, inner].
func (cb *cpuBackend) planar(x Buffer, n, c, inner int) Buffer {
	out := hostF32(n * c * inner)
	cb.FromChannelsLast(out, x, n, c, inner, false)
	return out
}

func (cb *cpuBackend) Conv2dChannelsLast(y, x, w, bias Buffer, g ConvGeom) {
	p := g.OutH() * g.OutW()
	yf := hostF32(g.N * g.K * p)
	cb.Conv2dLowp(yf, cb.planar(x, g.N, g.C, g.H*g.W), w, bias, g)
	cb.ToChannelsLast(y, yf, g.N, g.K, p)
}

func (cb *cpuBackend) Conv2dBackwardChannelsLast(dx, dw, db, dy, x, w Buffer, g ConvGeom) {
	p := g.OutH() * g.OutW()
	dyf := cb.planar(dy, g.N, g.K, p)
	var xf, dxf Buffer
	if !dw.Empty() {
		xf = cb.planar(x, g.N, g.C, g.H*g.W)
	}
	if !dx.Empty() {
		dxf = hostF32(g.N * g.C * g.H * g.W)
	}
	cb.Conv2dBackwardLowp(dxf, dw, db, dyf, xf, w, Buffer{}, g)
	if !dx.Empty() {
		cb.ToChannelsLast(dx, dxf, g.N, g.C, g.H*g.W)
	}
}

// A channels-last [rows, c] is a plain [rows, c, 1]: batch norm runs on
// it as it is.

func (cb *cpuBackend) BatchNormChannelsLast(y, saveMean, saveInvStd, runMean, runVar, x, weight, bias Buffer, rows, c int, training bool, momentum, eps float32, act UnaryOp) {
	yf := hostF32(rows * c)
	cb.BatchNormAct(yf, saveMean, saveInvStd, runMean, runVar, widen(x, rows*c), weight, bias, rows, c, 1, training, momentum, eps, act)
	narrow(y, yf, rows*c)
}

func (cb *cpuBackend) BatchNormBackwardChannelsLast(dx, dweight, dbias, dy, x, weight, bias, saveMean, saveInvStd Buffer, rows, c int, training bool, act UnaryOp, accW, accB bool) {
	var dxf Buffer
	if !dx.Empty() {
		dxf = hostF32(rows * c)
	}
	cb.BatchNormActBackward(dxf, dweight, dbias, widen(dy, rows*c), widen(x, rows*c), weight, bias, saveMean, saveInvStd,
		rows, c, 1, training, act, false, accW, accB)
	if !dx.Empty() {
		narrow(dx, dxf, rows*c)
	}
}

func (*cpuBackend) UnaryChannelsLast(y, x Buffer, act UnaryOp, n int) {
	checkChannelsLastAct(act)
	d := bf16(y)[:n]
	for i, h := range bf16(x)[:n] {
		d[i] = BFloat16Bits(unary32(act, BFloat16Float32(h), 0, 0))
	}
}

func (*cpuBackend) UnaryBackwardChannelsLast(dx, dy, x Buffer, act UnaryOp, n int) {
	checkChannelsLastAct(act)
	d, g := bf16(dx)[:n], bf16(dy)[:n]
	for i, h := range bf16(x)[:n] {
		d[i] = BFloat16Bits(unaryGrad32(act, BFloat16Float32(h), BFloat16Float32(g[i]), 0, 0))
	}
}

func (*cpuBackend) AddChannelsLast(y, a, b Buffer, n int) {
	d, u, v := bf16(y)[:n], bf16(a)[:n], bf16(b)[:n]
	for i := range d {
		d[i] = BFloat16Bits(BFloat16Float32(u[i]) + BFloat16Float32(v[i]))
	}
}

// MaxPoolChannelsLast runs MaxPool2d on x widened to [N, C, H, W] and
// turns each maximum's position in the plane into its position in its
// window.
func (cb *cpuBackend) MaxPoolChannelsLast(y, idx, x Buffer, p PoolGeom) {
	oh, ow := p.OutH(), p.OutW()
	o := p.N * p.C * oh * ow
	yf, at := hostF32(o), Buffer{Mem: &cpuMem{i: make([]int32, o)}, Len: o, DType: Int32}
	cb.MaxPool2d(yf, at, cb.planar(x, p.N, p.C, p.H*p.W), p)
	cb.ToChannelsLast(y, yf, p.N, p.C, oh*ow)
	pos, d := i32(at), u8(idx)
	for n := 0; n < p.N; n++ {
		for c := 0; c < p.C; c++ {
			for q := 0; q < oh*ow; q++ {
				a := int(pos[(n*p.C+c)*oh*ow+q])
				oy, ox := q/ow, q%ow
				d[(n*oh*ow+q)*p.C+c] = uint8((a/p.W-oy*p.KH)*p.KW + a%p.W - ox*p.KW)
			}
		}
	}
}

func (cb *cpuBackend) MaxPoolBackwardChannelsLast(dx, dy, idx Buffer, p PoolGeom) {
	oh, ow := p.OutH(), p.OutW()
	d, g, at := bf16(dx)[:p.N*p.H*p.W*p.C], bf16(dy), u8(idx)
	clear(d)
	for n := 0; n < p.N; n++ {
		for q := 0; q < oh*ow; q++ {
			oy, ox := q/ow, q%ow
			for c := 0; c < p.C; c++ {
				o := (n*oh*ow+q)*p.C + c
				a := int(at[o])
				h, w := oy*p.KH+a/p.KW, ox*p.KW+a%p.KW
				d[((n*p.H+h)*p.W+w)*p.C+c] = g[o]
			}
		}
	}
}

// MaxPoolBatchNormChannelsLast is the two passes.
func (cb *cpuBackend) MaxPoolBatchNormChannelsLast(y, p, idx, saveMean, saveInvStd, runMean, runVar, x, weight, bias Buffer, pool PoolGeom, training bool, momentum, eps float32, act UnaryOp) {
	cb.MaxPoolChannelsLast(p, idx, x, pool)
	cb.BatchNormChannelsLast(y, saveMean, saveInvStd, runMean, runVar, p, weight, bias, pool.N*pool.OutH()*pool.OutW(), pool.C, training, momentum, eps, act)
}

// BatchNormMaxPoolBackwardChannelsLast is the two passes, through the
// pooled gradient.
func (cb *cpuBackend) BatchNormMaxPoolBackwardChannelsLast(dx, dweight, dbias, dy, p, idx, weight, bias, saveMean, saveInvStd Buffer, pool PoolGeom, training bool, act UnaryOp, accW, accB bool) {
	rows := pool.N * pool.OutH() * pool.OutW()
	var dp Buffer
	if !dx.Empty() {
		dp = Buffer{Mem: &cpuMem{h: make([]uint16, rows*pool.C)}, Len: rows * pool.C, DType: BFloat16}
	}
	cb.BatchNormBackwardChannelsLast(dp, dweight, dbias, dy, p, weight, bias, saveMean, saveInvStd, rows, pool.C, training, act, accW, accB)
	if !dx.Empty() {
		cb.MaxPoolBackwardChannelsLast(dx, dp, idx, pool)
	}
}
