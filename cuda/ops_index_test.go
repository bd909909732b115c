package cuda

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ember-ml/ember/tensor"
)

// sgemmStridedBatched checks a batched GEMM as sgemm checks one: every
// matrix of every operand inside one allocation.
func (r *recExec) sgemmStridedBatched(transA, transB bool, m, n, k int, alpha float32, a uintptr, lda int, strideA int64,
	b uintptr, ldb int, strideB int64, beta float32, c uintptr, ldc int, strideC int64, batch int) error {
	for i := 0; i < batch; i++ {
		if err := r.sgemm(transA, transB, m, n, k, alpha, a+uintptr(4*int64(i)*strideA), lda, b+uintptr(4*int64(i)*strideB), ldb,
			beta, c+uintptr(4*int64(i)*strideC), ldc); err != nil {
			return err
		}
	}
	return nil
}

// TestRecordedSoftmaxIndex launches softmax, its backward pass, the causal
// softmax, the gathers and the batched products on the recorder, in both
// kernel layouts and on the three IndexAdd paths: signatures, null pointers and extents are checked.
func TestRecordedSoftmaxIndex(t *testing.T) {
	b, rec := newRecordingBackend(t)
	f := func(n int) tensor.Buffer {
		buf, err := b.Alloc(n, tensor.Float32)
		if err != nil {
			t.Fatal(err)
		}
		return buf
	}
	ix := func(n int) tensor.Buffer {
		buf, err := b.Alloc(n, tensor.Int32)
		if err != nil {
			t.Fatal(err)
		}
		return buf
	}
	for _, s := range [][3]int{{7, 10, 1}, {2, 4099, 1}, {3, 5, 7}, {1, 1, 1}} {
		n := s[0] * s[1] * s[2]
		for _, log := range []bool{false, true} {
			b.Softmax(f(n), f(n), s[0], s[1], s[2], log)
			b.SoftmaxBackward(f(n), f(n), f(n), s[0], s[1], s[2], log, true)
		}
	}
	for _, s := range [][3]int{{3, 5, 6}, {2, 64, 256}, {1, 40, 600}} { // [batch, t, n]
		rows := s[0] * s[1]
		b.CausalSoftmax(f(rows*s[2]), f(rows*s[2]), rows, s[1], s[2])
	}
	if rec.launches["ember_softmax_rows_causal"] != 3 {
		t.Errorf("CausalSoftmax: %d launches, want 3", rec.launches["ember_softmax_rows_causal"])
	}
	b.IndexSelect(f(2*9*5), f(2*7*5), ix(9), 2, 7, 5)
	b.IndexAdd(f(2*7*5), f(2*9*5), ix(9), 2, 7, 5)                     // ordered: few indices
	b.IndexAdd(f(2*7*5), f(2*20*5), ix(20), 2, 7, 5)                   // scan
	b.IndexAdd(f(256*384), f(256*384), ix(256), 1, 256, 384)           // scan: the GPT's position embedding
	b.IndexAdd(f(2*(1<<15)), f(2*1100*(1<<15)), ix(1100), 2, 1, 1<<15) // scan: two tiles of indices
	b.IndexAdd(f(1<<23), f(20), ix(20), 1, 1<<23, 1)                   // ordered: too large a dst to rewrite
	b.IndexAdd(f(100*3), f(5000*3), ix(5000), 1, 100, 3)               // atomic
	b.IndexAdd(f(10*(1<<16)), f(5000*(1<<16)), ix(5000), 1, 10, 1<<16) // ordered: wide columns, too long a scan
	if rec.launches["ember_index_add_ordered"] != 3 || rec.launches["ember_index_add_atomic"] != 1 || rec.launches["ember_index_add_scan"] != 3 {
		t.Errorf("IndexAdd paths: %d ordered, %d atomic, %d scan launches; want 3, 1 and 3", rec.launches["ember_index_add_ordered"],
			rec.launches["ember_index_add_atomic"], rec.launches["ember_index_add_scan"])
	}
	gemms := rec.gemms
	b.MatMulBatched(f(4*6), f(4*10), f(15), 4, 2, 3, 5, 10, 0, 6, true, true, 1, 0)
	if rec.gemms-gemms != 4 {
		t.Errorf("a batch of 4: %d GEMMs recorded, want 4 (one batched call)", rec.gemms-gemms)
	}
	b.MatMulBatched(f(6), f(10), f(15), 1, 2, 3, 5, 0, 0, 0, false, false, 1, 0)
	b.MatMulBatched(f(3*8), f(0), f(0), 3, 2, 3, 0, 0, 0, 8, false, false, 1, 0)
	if err := b.Synchronize(); err != nil {
		t.Errorf("Synchronize: %v", err)
	}
}

// TestRecordedAttentionAndLosses runs the tensor-level operators of this
// family forward and backward on the recorder: every launch and GEMM they
// queue (the causal mask's broadcast copy, the transposed and broadcast
// operands of the batched products, the gathers) is checked against its
// signature and the allocated memory.
func TestRecordedAttentionAndLosses(t *testing.T) {
	b, _ := newRecordingBackend(t)
	s := tensor.NewScope()
	defer s.Release()
	param := func(shape ...int) *tensor.Tensor { return tensor.Zeros(b, s, shape...).SetRequiresGrad(true) }
	q, k, v := param(2, 3, 5, 4), param(2, 3, 6, 4), param(2, 3, 6, 7)
	for _, causal := range []bool{false, true} {
		tensor.Sum(tensor.ScaledDotProductAttention(q, k, v, causal, 0)).Backward()
	}
	// The fused attention (D 16), with dropout from either generator.
	fq, fk, fv := param(2, 3, 5, 16), param(2, 3, 6, 16), param(2, 3, 6, 16)
	dg := tensor.NewDeviceGenerator(b, 1)
	defer dg.Release()
	for _, gen := range []tensor.RandomSource{nil, tensor.NewGenerator(1), dg} {
		if gen == nil {
			tensor.Sum(tensor.ScaledDotProductAttention(fq, fk, fv, true, 0)).Backward()
			continue
		}
		tensor.Sum(tensor.ScaledDotProductAttentionDropout(fq, fk, fv, true, 0, 0.2, gen)).Backward()
	}
	a, w := param(2, 1, 4, 5), param(3, 5, 6)
	tensor.Sum(tensor.BatchMatMul(a, w)).Backward()
	tensor.Sum(tensor.BatchMatMul(param(5), w)).Backward()
	emb := param(10, 8)
	ids := tensor.FromInt32(b, s, make([]int32, 6), 2, 3)
	logits := tensor.Linear(tensor.Embedding(emb, ids), param(4, 8), param(4)) // [2, 3, 4]
	labels := tensor.FromInt32(b, s, make([]int32, 6), 2, 3)
	opt := tensor.CrossEntropyOptions{LabelSmoothing: 0.1, Ignore: true, IgnoreIndex: 3}
	tensor.CrossEntropyLoss(logits.Transpose(1, 2), labels, opt).Backward() // classes on axis 1
	tensor.Sum(tensor.Softmax(tensor.IndexSelect(emb, 1, tensor.FromInt32(b, s, make([]int32, 5), 5)), 0)).Backward()
	tensor.Sum(tensor.Mul(tensor.OneHot(ids, 8), tensor.Embedding(emb, ids))).Backward()
	if err := b.Synchronize(); err != nil {
		t.Errorf("Synchronize: %v", err)
	}
}

// TestGPUIndexAddMatchesCPU checks IndexAdd's deterministic paths against
// the CPU bit for bit on fresh random inputs with repeated indices: the
// scan (ember_index_add_scan: the GPT's position embedding, a list of two
// tiles, outer > 1, rows of one element) and the ordered kernel (wide
// columns, a list too long to scan), and that two runs agree.
func TestGPUIndexAddMatchesCPU(t *testing.T) {
	g := newGPUBackend(t, BackendOptions{})
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 16))
	for _, s := range [][4]int{ // outer, n, inner, m
		{1, 256, 384, 256}, {2, 1, 1 << 15, 1100}, {3, 7, 5, 1024}, {4, 50, 1, 300}, {1, 10, 1 << 16, 300},
	} {
		outer, n, inner, m := s[0], s[1], s[2], s[3]
		src, d0, ix := make([]float32, outer*m*inner), make([]float32, outer*n*inner), make([]int32, m)
		for i := range src {
			src[i] = float32(rng.NormFloat64())
		}
		for i := range d0 {
			d0[i] = float32(rng.NormFloat64())
		}
		for i := range ix {
			ix[i] = int32(rng.IntN(max(n/2, 1))) // repeats: half the rows take every index
		}
		run := func(b tensor.Backend) []float32 {
			up := func(data any, n int, dt tensor.DType) tensor.Buffer {
				buf, err := b.Alloc(n, dt)
				if err != nil {
					t.Fatal(err)
				}
				b.Upload(buf, data)
				return buf
			}
			dst, sb, ib := up(d0, len(d0), tensor.Float32), up(src, len(src), tensor.Float32), up(ix, len(ix), tensor.Int32)
			defer func() {
				b.Free(dst)
				b.Free(sb)
				b.Free(ib)
			}()
			b.IndexAdd(dst, sb, ib, outer, n, inner)
			out := make([]float32, len(d0))
			b.Download(out, dst)
			return out
		}
		got, again, want := run(g), run(g), run(tensor.CPU)
		if !sameBits(got, again) {
			t.Errorf("%v: two runs differ (seed %d)", s, seed)
		}
		if !sameBits(got, want) {
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Errorf("%v: element %d: GPU %g, CPU %g (seed %d)", s, i, got[i], want[i], seed)
					break
				}
			}
		}
	}
}
