package cuda

import (
	"sync"
	"sync/atomic"
)

// Products of at most 64 rows through wide layers: ember_linear_skinny
// (a layer's forward pass, its bias and ReLU in the epilogue) and
// ember_linear_skinny_kmajor (its input gradient g·w), linear.cu. On sm_90
// and later, for the layers that would go to cuBLASLt first (ltFirst: at
// most skinnyRows rows, in·out from ltWideMin), ahead of it; elsewhere, and
// where a launch cannot take the operands (their alignment, k not a
// multiple of 4), the paths of linear.go. BackendOptions.NoLinearSkinny
// (EMBER_LINEAR_SKINNY=0) turns them off, for comparisons.

const (
	// skinnyRows is the most rows the kernels take: all of a tile's.
	skinnyRows = 64
	// skinnyCols is SK_COLS, the columns of a block's tile.
	skinnyCols = 64
	// skinnyCluster is SK_CLUSTER: the blocks that split a tile's sum.
	skinnyCluster = 8
	// skinnyThreads is SK_THREADS.
	skinnyThreads = 512
	// skinnyShared is SK_SHARED_FLOATS in bytes: the dynamic shared memory
	// of a block, above the 48 KiB a kernel may take without asking.
	skinnyShared = 4 * (64*132 + 128*68)
)

// skinnyState is the kernels' shared-memory limit, set once outside a
// capture (setting a kernel's attribute while a graph is captured is left
// alone: until an eager call has set it, products take the other paths).
type skinnyState struct {
	once  sync.Once
	done  atomic.Bool // once has run
	ready bool        // both kernels take skinnyShared bytes
}

// skinnyLinear says whether an n x in x out layer's products go to the
// skinny kernels when they can take them.
func (b *Backend) skinnyLinear(n, in, out int) bool {
	return !b.noSkinny && n >= 1 && n <= skinnyRows && in*out >= ltWideMin && max(n*in, n*out, in*out) < 1<<31
}

// skinnyProduct queues c [m, n] (+ beta·c) = a [m, k] · b, b [n, k] read
// transposed or, when kMajor, [k, n], with the bias and the ReLU after the
// sum (forward only), and reports true; false, having queued nothing, when
// the kernels cannot take it.
func (b *Backend) skinnyProduct(op string, pc, pa, pb, pbias uintptr, m, n, k int, kMajor bool, beta float32, relu bool) bool {
	sl, ok := b.x.(sharedLauncher)
	if !ok || m < 1 || m > skinnyRows || n < 1 || k < 4 || k%4 != 0 || kMajor && (n%4 != 0 || pbias != 0 || relu) ||
		pa%16 != 0 || pb%16 != 0 || !b.skinnyReady() {
		return false
	}
	// Each block of a cluster takes a run of k of whole float4s.
	chunk := ((k/4 + skinnyCluster - 1) / skinnyCluster) * 4
	grid := Dim3{X: (n + skinnyCols - 1) / skinnyCols * skinnyCluster, Y: 1, Z: 1}
	block := Dim3{X: skinnyThreads, Y: 1, Z: 1}
	if kMajor {
		devCheck(op, sl.launchShared(b.kernel("ember_linear_skinny_kmajor"), grid, block, skinnyShared,
			[]any{pc, pa, pb, int32(m), int32(n), int32(k), int32(chunk), beta}))
	} else {
		devCheck(op, sl.launchShared(b.kernel("ember_linear_skinny"), grid, block, skinnyShared,
			[]any{pc, pa, pb, pbias, int32(m), int32(n), int32(k), int32(chunk), beta, flag(relu)}))
	}
	b.skinnyCalls.Add(1)
	return true
}

// skinnyReady says whether the kernels exist on this device (sm_90 and
// later, where clusters run) and take their shared memory.
func (b *Backend) skinnyReady() bool {
	st := &b.skinny
	if !st.done.Load() && b.capturing.Load() {
		return false
	}
	st.once.Do(func() {
		defer st.done.Store(true)
		f, fk := b.loaded("ember_linear_skinny"), b.loaded("ember_linear_skinny_kmajor")
		if b.noClusters || f == nil || fk == nil {
			return
		}
		st.ready = f.SetMaxDynamicSharedMemory(skinnyShared) == nil && fk.SetMaxDynamicSharedMemory(skinnyShared) == nil
	})
	return st.ready
}
