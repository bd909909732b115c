package cuda

// Tests of the CUDA backend that need no GPU: the kernel names of the Go
// code against the embedded sources, dimension merging of CopyStrided, and a recording
// executor that runs LeNet training steps through the real backend code
// with every device call captured, checking each kernel launch against the
// kernel's C signature (argument count and kinds, non-null pointers, into
// allocated memory) and each GEMM's operands against the memory they point
// into, and counting the launches of one training step.

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/optim"
	"github.com/ember-ml/ember/tensor"
)

// kernelParam is one parameter of an extern "C" kernel.
type kernelParam struct {
	name string
	kind string // "ptr", "int32", "int64", "float32", "float64"
}

var kernelDeclRE = regexp.MustCompile(`extern "C" __global__ void\s+(?:(?:__launch_bounds__|__cluster_dims__)\([^)]*\)\s*)*(\w+)\s*\(([^)]*)\)`)

// parseKernels returns the parameters of every extern "C" kernel of the
// embedded sources.
func parseKernels(t *testing.T) map[string][]kernelParam {
	t.Helper()
	src, err := kernelSource()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]kernelParam{}
	for _, m := range kernelDeclRE.FindAllStringSubmatch(src, -1) {
		var ps []kernelParam
		for _, p := range strings.Split(m[2], ",") {
			p = strings.Join(strings.Fields(p), " ")
			if p == "" {
				continue
			}
			i := strings.LastIndexAny(p, " *")
			name, typ := p[i+1:], p[:i+1]
			var kind string
			switch {
			case strings.Contains(typ, "*"):
				kind = "ptr"
			case strings.Contains(typ, "long long"):
				kind = "int64"
			case strings.Contains(typ, "double"):
				kind = "float64"
			case strings.Contains(typ, "float"):
				kind = "float32"
			case strings.Contains(typ, "int"):
				kind = "int32"
			default:
				t.Fatalf("kernel %s: parameter %q of unknown type", m[1], p)
			}
			ps = append(ps, kernelParam{name: name, kind: kind})
		}
		if _, dup := out[m[1]]; dup {
			t.Fatalf("kernel %s declared twice", m[1])
		}
		out[m[1]] = ps
	}
	return out
}

// TestKernelNamesDefined checks the backend's kernel names against the
// kernels' sources: every "ember_..." string constant of the package's Go
// code (the names Backend.kernel looks up, directly or through a table of
// variants) must be an extern "C" kernel of the sources, or the lookup
// would fail on the GPU, and every "ember_..." format ("ember_x_d%d", for
// fmt.Sprintf) must match at least one; and every kernel of the sources
// must be named or matched by the Go code, or it is dead code that NVRTC
// compiles for nothing.
func TestKernelNamesDefined(t *testing.T) {
	sigs := parseKernels(t)
	named, formats := kernelNamesInGo(t)
	for name, at := range named {
		if _, ok := sigs[name]; !ok {
			t.Errorf("%s names kernel %s, which no kernel source defines (extern \"C\" __global__)", at, name)
		}
	}
	matched := map[string]bool{}
	for format, at := range formats {
		re := regexp.MustCompile("^" + fmtVerb.ReplaceAllString(regexp.QuoteMeta(format), "[A-Za-z0-9_]+") + "$")
		n := 0
		for name := range sigs {
			if re.MatchString(name) {
				matched[name] = true
				n++
			}
		}
		if n == 0 {
			t.Errorf("%s formats kernel names %q, which no kernel of the sources has", at, format)
		}
	}
	for name := range sigs {
		if _, ok := named[name]; !ok && !matched[name] {
			t.Errorf("kernel %s is defined but the Go code never names it", name)
		}
	}
	// Every file is embedded and listed.
	entries, err := kernelFS.ReadDir("kernels")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !slices.Contains(kernelFiles, "kernels/"+e.Name()) {
			t.Errorf("kernels/%s is embedded but not compiled (add it to kernelFiles)", e.Name())
		}
	}
	for _, f := range kernelFiles {
		in := false
		for _, u := range kernelUnits {
			in = in || slices.Contains(u.files, f)
		}
		if !in {
			t.Errorf("%s is in kernelFiles but in no kernel unit", f)
		}
	}
}

// requirePackageSources skips a test that reads the package's Go files when
// they are not in the working directory (a test binary copied elsewhere,
// such as to a GPU machine); go test runs tests in the package directory.
func requirePackageSources(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("backend.go"); err != nil {
		t.Skipf("the package's sources are not in the working directory: %v", err)
	}
}

// fmtVerb matches a fmt verb such as %d or %02x (QuoteMeta leaves % alone).
var fmtVerb = regexp.MustCompile(`%[0-9]*[a-z]`)

// kernelNamesInGo maps every string constant of the package's non-test Go
// files that looks like a kernel name ("ember_" and a C identifier) to the
// place of its first use, and likewise every one that looks like a format
// of kernel names (the same with fmt verbs). ewk.go is left out: it writes
// the C source of generated kernels, whose variables (ember_i, ember_n) and
// names (ember_ewk_%s_%012x) look the same.
func kernelNamesInGo(t *testing.T) (names, formats map[string]string) {
	t.Helper()
	requirePackageSources(t)
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	isName := regexp.MustCompile(`^ember_[A-Za-z0-9_]+$`)
	isFormat := regexp.MustCompile(`^ember_[A-Za-z0-9_]*(%[0-9]*[a-z][A-Za-z0-9_]*)+$`)
	fset := token.NewFileSet()
	names, formats = map[string]string{}, map[string]string{}
	for _, fn := range files {
		if strings.HasSuffix(fn, "_test.go") || fn == "ewk.go" {
			continue
		}
		f, err := parser.ParseFile(fset, fn, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			v, err := strconv.Unquote(lit.Value)
			var into map[string]string
			switch {
			case err != nil:
			case isName.MatchString(v):
				into = names
			case isFormat.MatchString(v):
				into = formats
			}
			if _, seen := into[v]; into != nil && !seen {
				into[v] = fset.Position(lit.Pos()).String()
			}
			return true
		})
	}
	return names, formats
}

func TestMergeDims(t *testing.T) {
	cases := []struct {
		shape, strides []int
		s, t           []int
	}{
		{[]int{2, 3, 4}, []int{12, 4, 1}, []int{24}, []int{1}},
		{[]int{7, 33}, []int{1, 7}, []int{7, 33}, []int{1, 7}},
		{[]int{1, 33, 1}, []int{999, 1, 5}, []int{33}, []int{1}},
		{[]int{1}, []int{1}, []int{1}, []int{0}},
		{[]int{5, 7}, []int{0, 1}, []int{5, 7}, []int{0, 1}},
		{[]int{2, 3, 4, 5}, []int{120, 40, 10, 2}, []int{120}, []int{2}},
		{[]int{2, 3, 4, 5}, []int{120, 40, 10, 1}, []int{24, 5}, []int{10, 1}},
		{[]int{2, 2, 2, 2, 2, 2, 2, 2}, []int{128, 64, 32, 16, 8, 4, 2, 1}, []int{256}, []int{1}},
		{[]int{4, 6, 5}, []int{5, 20, 1}, []int{4, 6, 5}, []int{5, 20, 1}},
	}
	for _, c := range cases {
		s, st := mergeDims(c.shape, c.strides)
		if !slices.Equal(s, c.s) || !slices.Equal(st, c.t) {
			t.Errorf("mergeDims(%v, %v) = %v, %v; want %v, %v", c.shape, c.strides, s, st, c.s, c.t)
		}
	}
}

func TestGridAndBlockCounts(t *testing.T) {
	for _, c := range []struct{ n, want int }{{1, 1}, {256, 1}, {257, 2}, {4096 * 256, 4096}, {1 << 40, maxGrid}} {
		if g := gridFor(c.n); g.X != c.want {
			t.Errorf("gridFor(%d) = %d blocks, want %d", c.n, g.X, c.want)
		}
	}
	for _, c := range []struct{ n, want int }{{1, 1}, {4096, 1}, {4097, 2}, {100003, 25}, {1 << 40, 1024}} {
		if got := sumBlocks(c.n); got != c.want {
			t.Errorf("sumBlocks(%d) = %d, want %d", c.n, got, c.want)
		}
	}
}

// ---- recording executor ----

// recMem is a DeviceMemory with made-up addresses, for an Allocator that
// never touches a GPU.
type recMem struct {
	mu     sync.Mutex
	next   uintptr
	segs   map[uintptr]int
	pages  map[uintptr]bool // mapped pages of reserved ranges
	allocs int
}

func newRecMem() *recMem {
	return &recMem{next: 0x7e00_0000_0000, segs: map[uintptr]int{}, pages: map[uintptr]bool{}}
}

func (m *recMem) MemAlloc(bytes int) (uintptr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.next
	m.next += uintptr(bytes) + 1<<20
	m.segs[p] = bytes
	m.allocs++
	return p, nil
}

func (m *recMem) MemFree(p uintptr) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.segs, p)
	return nil
}

const recPage = 2 << 20

func (m *recMem) PageSize() int { return recPage }
func (m *recMem) ReserveAddress(bytes int) (uintptr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.next
	m.next += uintptr(bytes) + recPage
	return p, nil
}
func (m *recMem) FreeAddress(uintptr, int) error { return nil }
func (m *recMem) MapPages(p uintptr, bytes int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for q := p; q < p+uintptr(bytes); q += recPage {
		m.pages[q] = true
	}
	m.allocs++
	return nil
}
func (m *recMem) UnmapPages(p uintptr, bytes int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for q := p; q < p+uintptr(bytes); q += recPage {
		delete(m.pages, q)
	}
	return nil
}

func (m *recMem) MemGetInfo() (int, int, error)     { return 1 << 40, 1 << 40, nil }
func (m *recMem) EventRecord(Stream) (Event, error) { return 1, nil }
func (m *recMem) EventQuery(Event) (bool, error)    { return true, nil }
func (m *recMem) EventDestroy(Event) error          { return nil }
func (m *recMem) inside(p uintptr, bytes int) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for base, n := range m.segs {
		if p >= base && p+uintptr(bytes) <= base+uintptr(n) {
			return true
		}
	}
	for q := p &^ (recPage - 1); q < p+uintptr(bytes); q += recPage {
		if !m.pages[q] {
			return false
		}
	}
	return bytes > 0
}

// nullable lists the pointer parameters a launch may pass as null, besides
// those whose names end in OrNull.
var nullable = map[string]bool{"bias": true, "dlogits": true, "partial": true, "v": true, "dyt": true, "mask": true, "dw": true, "db": true, "gOut": true, "reluY": true}

// blockSized lists the kernels that need blockDim a multiple of 32 (warp
// shuffles, block reductions).
var blockSized = map[string]bool{
	"ember_sum": true, "ember_sum_final": true, "ember_reduce_rows_sum4": true, "ember_reduce_rows_sum4_l2": true, "ember_reduce_channel_rows": true, "ember_reduce_channel_rows_l2": true, "ember_reduce_channel_rows_long": true, "ember_reduce_channel_rows_long_l2": true, "ember_bias_grad_rows": true,
	"ember_reduce_channel_whole4_u2v2": true, "ember_reduce_channel_whole4_u2v2_l2": true, "ember_reduce_channel_whole4_u1v4": true, "ember_reduce_channel_whole4_u1v4_l2": true, "ember_reduce_channel_whole4_u1v7": true, "ember_reduce_channel_whole4_u1v7_l2": true, "ember_reduce_channel_whole1_u4v2": true, "ember_reduce_channel_whole1_u4v2_l2": true, "ember_reduce_channel_whole1_u2v4": true, "ember_reduce_channel_whole1_u2v4_l2": true, "ember_reduce_channel_whole1_u1v8": true, "ember_reduce_channel_whole1_u1v8_l2": true,
	"ember_bias_grad_cols": true, "ember_bias_grad_finish": true,
	"ember_cross_entropy": true, "ember_argmax": true,
	"ember_class_loss_count": true, "ember_class_loss_rows": true, "ember_class_loss_cols": true, "ember_class_loss_final": true,
	"ember_gemm_small": true, "ember_gemm_small_t": true, "ember_unpool_t_bias": true,
	"ember_conv_pool_dw_direct": true, "ember_conv_pool_dw_finish": true,
	"ember_conv_pool_dw_5x5": true, "ember_conv_pool_dw_3x3": true,
	"ember_linear_grads_small": true, "ember_linear_xent": true, "ember_linear_xent_c16": true, "ember_linear_xent_c32": true, "ember_linear_xent_c16_v4": true, "ember_linear_xent_c32_v4": true, "ember_linear_grads_narrow_c16": true, "ember_linear_grads_narrow_c32": true,
	"ember_conv_relu_pool_rt_5x5": true, "ember_conv_relu_pool_rt_5x5_s1": true, "ember_conv_relu_pool_rt_5x5_s8": true,
	"ember_conv_relu_pool_rt_3x3": true, "ember_conv_relu_pool_rt_3x3_s1": true, "ember_conv_relu_pool_rt_3x3_s8": true,
	"ember_conv_dx_rt_5x5": true, "ember_conv_dx_rt_3x3": true, "ember_conv_dx_rt_pooled_5x5": true, "ember_conv_dx_rt_pooled_3x3": true,
	"ember_sumsq_partial": true, "ember_clip_coef": true,
}

type recExec struct {
	t        *testing.T
	sigs     map[string][]kernelParam
	mem      *recMem
	mu       sync.Mutex
	launches map[string]int
	gemms    int
	gemmsBF  int // bfloat16 GEMMs (cast_test.go)
	forks    int
	detaches int
	memsets  int
	copies   int
}

func (r *recExec) errorf(format string, args ...any) {
	r.t.Helper()
	r.t.Errorf(format, args...)
}

// parallel queues both on the recorder, side first, as a backend without a
// side stream does.
func (r *recExec) parallel(side func(x executor), main func()) error {
	r.mu.Lock()
	r.forks++
	r.mu.Unlock()
	side(r)
	main()
	return nil
}

// detach runs side at once, as outside a capture, after checking its
// memory.
func (r *recExec) detach(uses []span, side func(x executor)) error {
	r.mu.Lock()
	r.detaches++
	r.mu.Unlock()
	for _, u := range uses {
		if u.p != 0 && !r.mem.inside(u.p, u.bytes) {
			r.errorf("detached task's memory [%#x, +%d) outside allocated memory", u.p, u.bytes)
		}
	}
	side(r)
	return nil
}

func (r *recExec) beside(uses []span, main func()) error {
	main()
	return nil
}

func (r *recExec) settle() error { return nil }

func (r *recExec) launch(f *Function, grid, block Dim3, args []any) error {
	r.mu.Lock()
	r.launches[f.Name]++
	r.mu.Unlock()
	sig, ok := r.sigs[f.Name]
	if !ok {
		r.errorf("launch of unknown kernel %s", f.Name)
		return nil
	}
	if grid.X < 1 || block.X < 1 || block.X > 1024 {
		r.errorf("%s: launch with grid %v block %v", f.Name, grid, block)
	}
	if strings.HasSuffix(f.Name, "_cluster") && grid.X%ltCluster != 0 {
		r.errorf("%s: grid %v is not a whole number of %d-block clusters", f.Name, grid, ltCluster)
	}
	if blockSized[f.Name] && block.X%32 != 0 {
		r.errorf("%s: block of %d threads, not a multiple of 32", f.Name, block.X)
	}
	if len(args) != len(sig) {
		r.errorf("%s: %d arguments for %d parameters %v", f.Name, len(args), len(sig), sig)
		return nil
	}
	for i, a := range args {
		p := sig[i]
		var kind string
		switch a.(type) {
		case uintptr:
			kind = "ptr"
		case int32:
			kind = "int32"
		case int64:
			kind = "int64"
		case float32:
			kind = "float32"
		case float64:
			kind = "float64"
		default:
			kind = fmt.Sprintf("%T", a)
		}
		if kind != p.kind {
			r.errorf("%s: argument %d (%s) is %s, the parameter is %s", f.Name, i, p.name, kind, p.kind)
			continue
		}
		if kind == "ptr" {
			ptr := a.(uintptr)
			if ptr == 0 {
				if !nullable[p.name] && !strings.HasSuffix(p.name, "OrNull") {
					r.errorf("%s: null pointer for %s", f.Name, p.name)
				}
			} else if !r.mem.inside(ptr, 1) {
				r.errorf("%s: pointer %#x for %s is outside allocated memory", f.Name, ptr, p.name)
			}
		}
	}
	return nil
}

func (r *recExec) sgemm(transA, transB bool, m, n, k int, alpha float32, a uintptr, lda int, b uintptr, ldb int, beta float32, c uintptr, ldc int) error {
	r.mu.Lock()
	r.gemms++
	r.mu.Unlock()
	if _, err := rowMajorGemm(transA, transB, m, n, k, lda, ldb, ldc); err != nil {
		r.errorf("sgemm: %v", err)
	}
	// Extent of a row-major rows x cols operand with leading dimension ld.
	extent := func(rows, cols, ld int) int { return 4 * ((rows-1)*ld + cols) }
	ar, ac := m, k
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
		br, bc = n, k
	}
	for _, o := range []struct {
		name  string
		p     uintptr
		bytes int
	}{{"A", a, extent(ar, ac, lda)}, {"B", b, extent(br, bc, ldb)}, {"C", c, extent(m, n, ldc)}} {
		if !r.mem.inside(o.p, o.bytes) {
			r.errorf("sgemm m=%d n=%d k=%d transA=%v transB=%v: operand %s (%d bytes at %#x) is not inside one allocation", m, n, k, transA, transB, o.name, o.bytes, o.p)
		}
	}
	return nil
}

func (r *recExec) memset32(dst uintptr, v uint32, count int) error {
	r.mu.Lock()
	r.memsets++
	r.mu.Unlock()
	if !r.mem.inside(dst, 4*count) {
		r.errorf("memset32 of %d words at %#x outside allocated memory", count, dst)
	}
	return nil
}

func (r *recExec) copyDtoD(dst, src uintptr, bytes int) error {
	r.mu.Lock()
	r.copies++
	r.mu.Unlock()
	if !r.mem.inside(dst, bytes) || !r.mem.inside(src, bytes) {
		r.errorf("copyDtoD of %d bytes outside allocated memory", bytes)
	}
	return nil
}

func (r *recExec) copyHtoD(dst uintptr, _ unsafe.Pointer, bytes int) error {
	r.mu.Lock()
	r.copies++
	r.mu.Unlock()
	if !r.mem.inside(dst, bytes) {
		r.errorf("copyHtoD of %d bytes outside allocated memory", bytes)
	}
	return nil
}

func (r *recExec) copyDtoH(_ unsafe.Pointer, src uintptr, bytes int) error {
	r.mu.Lock()
	r.copies++
	r.mu.Unlock()
	if !r.mem.inside(src, bytes) {
		r.errorf("copyDtoH of %d bytes outside allocated memory", bytes)
	}
	return nil
}

func (r *recExec) synchronize() error { return nil }

func (r *recExec) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.launches = map[string]int{}
	r.gemms, r.gemmsBF, r.memsets, r.copies, r.forks, r.detaches = 0, 0, 0, 0, 0, 0
}

func (r *recExec) kernelLaunches() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.launches {
		n += c
	}
	return n
}

// newRecordingBackend is a Backend whose device work goes to a recExec and
// whose memory comes from an Allocator over made-up addresses.
func newRecordingBackend(t *testing.T) (*Backend, *recExec) {
	return newRecordingBackendOpts(t, AllocatorOptions{Expandable: true})
}

// newRecordingBackendOpts is newRecordingBackend with its allocator
// configured by opt.
func newRecordingBackendOpts(t *testing.T, opt AllocatorOptions) (*Backend, *recExec) {
	mem := newRecMem()
	b := &Backend{name: "cuda:rec", alloc: NewAllocator(mem, opt)}
	sigs := parseKernels(t)
	b.fns = map[string]*Function{}
	for name := range sigs {
		b.fns[name] = &Function{Name: name}
	}
	rec := &recExec{t: t, sigs: sigs, mem: mem, launches: map[string]int{}}
	b.x = rec
	// A side lane without a stream: the backend takes the paths that use
	// one, and the recorder runs their work in order.
	b.side = &sideLane{alloc: b.alloc}
	if err := b.allocTileCounters(); err != nil {
		t.Fatal(err)
	}
	return b, rec
}

// lenetTrainer runs LeNet training steps on synthetic MNIST-shaped data kept
// on the device as bytes, the way a training loop does: per step, a scope
// holding the batch and everything derived from it, reset at the end.
type lenetTrainer struct {
	b      tensor.Backend
	model  *models.LeNet
	opt    *optim.SGD
	images *tensor.Tensor // uint8 [m, 1, 28, 28]
	labels []int32
	batch  int
	rng    *rand.Rand
	scope  *tensor.Scope
}

func newLeNetTrainer(t testing.TB, b tensor.Backend, batch int) *lenetTrainer {
	t.Helper()
	const m = 512
	rng := rand.New(rand.NewPCG(3, 4))
	pix := make([]uint8, m*28*28)
	for i := range pix {
		pix[i] = uint8(rng.IntN(256))
	}
	labels := make([]int32, m)
	for i := range labels {
		labels[i] = int32(rng.IntN(10))
	}
	model := models.NewLeNet(b, 1)
	opt, err := optim.NewSGD(model.Parameters(), optim.SGDConfig{LR: 0.01, Momentum: 0.9, WeightDecay: 5e-4})
	if err != nil {
		t.Fatal(err)
	}
	return &lenetTrainer{
		b: b, model: model, opt: opt, batch: batch, rng: rng, labels: labels,
		images: tensor.FromUint8(b, nil, pix, m, 1, 28, 28),
		scope:  tensor.NewScope(),
	}
}

// step runs one forward, backward and SGD step and returns the loss.
func (l *lenetTrainer) step() float32 {
	idx := make([]int32, l.batch)
	lab := make([]int32, l.batch)
	for i := range idx {
		idx[i] = int32(l.rng.IntN(len(l.labels)))
		lab[i] = l.labels[idx[i]]
	}
	s := l.scope
	x := tensor.GatherNormalize(s, l.images, tensor.FromInt32(l.b, s, idx, l.batch), 1/(255*0.3081), -0.1307/0.3081)
	loss := l.model.Loss(x, tensor.FromInt32(l.b, s, lab, l.batch))
	loss.Backward()
	l.opt.StepAndZeroGrad() // as cmd/train does: the gradients start at zero
	v := loss.Item()
	s.Reset()
	return v
}

func (l *lenetTrainer) close() {
	l.scope.Release()
	l.images.Release()
	for _, p := range l.model.Parameters() {
		p.Tensor.Release()
		if g := p.Tensor.Grad(); g != nil {
			g.Release()
		}
	}
	if m := l.opt.MomentumBuffer(); m != nil {
		m.Release()
	}
}

// TestRecordedLeNetStep runs LeNet training steps (batch 64) through the
// backend with a recording executor: every launch must match its kernel's
// signature and point into allocated memory, every GEMM's operands must lie
// inside one allocation. It logs the device calls of one step.
func TestRecordedLeNetStep(t *testing.T) {
	// With clusters (sm_90's linear kernels) and without (their workspace
	// and counters).
	for _, noClusters := range []bool{false, true} {
		b, rec := newRecordingBackend(t)
		b.noClusters = noClusters
		tr := newLeNetTrainer(t, b, 64)
		tr.step() // the first step (momentum initialisation, gradient buffers)
		rec.reset()
		tr.step()
		names := make([]string, 0, len(rec.launches))
		for n := range rec.launches {
			names = append(names, n)
		}
		sort.Strings(names)
		var sb strings.Builder
		for _, n := range names {
			fmt.Fprintf(&sb, " %s=%d", n, rec.launches[n])
		}
		t.Logf("one LeNet training step at batch 64 (clusters %v): %d kernel launches, %d cuBLAS GEMMs, %d memsets, %d copies, %d forks to the side stream, %d tasks detached there;%s",
			!noClusters, rec.kernelLaunches(), rec.gemms, rec.memsets, rec.copies, rec.forks, rec.detaches, sb.String())
		// Nothing is filled per step: the update zeroes the gradients as it
		// reads them, and no backward function reads the loss's seed.
		if rec.memsets != 0 {
			t.Errorf("a training step issued %d memsets, want 0", rec.memsets)
		}
		// fc2's weight gradient, beside fc1's backward pass.
		if rec.detaches != 1 {
			t.Errorf("a training step detached %d side tasks, want 1", rec.detaches)
		}
		tr.close()
		if err := b.Synchronize(); err != nil {
			t.Errorf("Synchronize: %v", err)
		}
	}
}

// TestRecordedOps runs every Backend operation once on the recording backend
// (argument checks only; values are not computed).
func TestRecordedOps(t *testing.T) {
	b, rec := newRecordingBackend(t)
	alloc := func(n int, dt tensor.DType) tensor.Buffer {
		buf, err := b.Alloc(n, dt)
		if err != nil {
			t.Fatal(err)
		}
		return buf
	}
	f := func(n int) tensor.Buffer { return alloc(n, tensor.Float32) }
	i := func(n int) tensor.Buffer { return alloc(n, tensor.Int32) }
	x, y, z := f(1000), f(1000), f(1000)
	b.Fill(x, 1)
	b.Fill(i(7), 3)
	b.Copy(y, x)
	b.Copy(alloc(5, tensor.Uint8), alloc(5, tensor.Uint8))
	b.CopyStrided(f(12), x.Slice(3, 100), []int{3, 4}, []int{1, 3})
	b.CopyStrided(alloc(12, tensor.Uint8), alloc(12, tensor.Uint8), []int{3, 4}, []int{1, 3})
	b.Add(z, x, y)
	b.Mul(z, x, y)
	b.Axpy(z, 2, x)
	b.ScaleBy(z, x, y.Slice(0, 1), true)
	b.Sum(f(1), x)
	b.Sum(f(1), f(100003))
	b.Sum(f(1), f(0))
	b.Broadcast(z, x.Slice(0, 1), false)
	b.ReLU(z, x)
	b.ReLUBackward(z, x, y, true)
	b.MatMul(f(6), f(10), f(15), 2, 3, 5, true, true, 1, 0)
	b.MatMul(f(6), f(0), f(0), 2, 3, 0, false, false, 1, 0.5)
	b.AddBias(z, f(10), 10, 10, 10)
	b.BiasGrad(f(10), z, 10, 10, 10, false)
	b.BiasGrad(f(100), z, 10, 100, 1, true)
	b.AddBiasReLU(z, f(10), 100, 10)
	b.BiasReLUBackward(y, f(10), z, x, 100, 10, true)
	b.BiasReLUBackward(y, tensor.Buffer{}, z, x, 100, 10, false)
	b.BiasReLUBackward(f(2000*10), f(10), f(2000*10), f(2000*10), 2000, 10, false) // split over blocks
	g := tensor.ConvGeom{N: 2, C: 3, H: 9, W: 7, K: 5, R: 3, S: 3, StrideH: 2, StrideW: 2, PadH: 1, PadW: 1}
	xn, yn, wn := g.N*g.C*g.H*g.W, g.N*g.K*g.OutH()*g.OutW(), g.K*g.C*g.R*g.S
	b.Conv2d(f(yn), f(xn), f(wn), f(g.K), g)
	b.Conv2d(f(yn), f(xn), f(wn), tensor.Buffer{}, g)
	b.Conv2dBackward(f(xn), f(wn), f(g.K), f(yn), f(xn), f(wn), tensor.Buffer{}, g)
	b.Conv2dBackward(tensor.Buffer{}, f(wn), tensor.Buffer{}, f(yn), f(xn), f(wn), tensor.Buffer{}, g)
	b.Conv2dBackward(f(xn), tensor.Buffer{}, tensor.Buffer{}, f(yn), f(xn), f(wn), tensor.Buffer{}, g)
	b.Conv2dBackward(tensor.Buffer{}, tensor.Buffer{}, f(g.K), f(yn), f(xn), f(wn), tensor.Buffer{}, g)
	gr := g
	gr.ReLU = true
	b.Conv2d(f(yn), f(xn), f(wn), f(g.K), gr)
	b.Conv2dBackward(f(xn), f(wn), f(g.K), f(yn), f(xn), f(wn), f(yn), gr)
	b.Conv2dBackward(f(xn), f(wn), tensor.Buffer{}, f(yn), f(xn), f(wn), f(yn), gr)
	// Fused convolution + pooling: the three forward paths (tiled and
	// direct: C·R·S = 27 and 9; GEMM: 45), both backward paths, with and
	// without bias and dx.
	for _, gc := range []tensor.ConvGeom{gr, {N: 2, C: 5, H: 9, W: 7, K: 4, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 0, ReLU: true},
		{N: 2, C: 1, H: 71, W: 66, K: 3, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1, ReLU: true},
		{N: 3, C: 1, H: 13, W: 10, K: 7, R: 3, S: 3, StrideH: 1, StrideW: 1, PadH: 1, PadW: 1, ReLU: true},
		{N: 2, C: 1, H: 16, W: 15, K: 37, R: 5, S: 5, StrideH: 1, StrideW: 1, PadH: 2, PadW: 2, ReLU: true}} {
		pc := tensor.PoolGeom{N: gc.N, C: gc.K, H: gc.OutH(), W: gc.OutW(), KH: 2, KW: 2, StrideH: 2, StrideW: 2}
		cx, cw := gc.N*gc.C*gc.H*gc.W, gc.K*gc.C*gc.R*gc.S
		cy := gc.N * gc.K * pc.OutH() * pc.OutW()
		b.Conv2dReLUMaxPool(f(cy), i(cy), f(cx), f(cw), f(gc.K), gc, pc)
		b.Conv2dReLUMaxPool(f(cy), i(cy), f(cx), f(cw), tensor.Buffer{}, gc, pc)
		b.Conv2dReLUMaxPoolBackward(tensor.Buffer{}, f(cw), f(gc.K), f(cy), f(cx), f(cw), f(cy), i(cy), gc, pc)
		b.Conv2dReLUMaxPoolBackward(tensor.Buffer{}, f(cw), tensor.Buffer{}, f(cy), f(cx), f(cw), f(cy), i(cy), gc, pc)
		b.Conv2dReLUMaxPoolBackward(tensor.Buffer{}, tensor.Buffer{}, f(gc.K), f(cy), f(cx), f(cw), f(cy), i(cy), gc, pc)
		b.Conv2dReLUMaxPoolBackward(f(cx), f(cw), f(gc.K), f(cy), f(cx), f(cw), f(cy), i(cy), gc, pc)
	}
	// A channel split over several blocks of the direct backward.
	gb := tensor.ConvGeom{N: 64, C: 1, H: 28, W: 28, K: 20, R: 5, S: 5, StrideH: 1, StrideW: 1, ReLU: true}
	pb := tensor.PoolGeom{N: 64, C: 20, H: 24, W: 24, KH: 2, KW: 2, StrideH: 2, StrideW: 2}
	b.Conv2dReLUMaxPoolBackward(tensor.Buffer{}, f(500), f(20), f(64*20*144), f(64*784), f(500), f(64*20*144), i(64*20*144), gb, pb)
	pg := tensor.PoolGeom{N: 2, C: 3, H: 9, W: 7, KH: 3, KW: 3, StrideH: 2, StrideW: 2}
	pn, po := pg.N*pg.C*pg.H*pg.W, pg.N*pg.C*pg.OutH()*pg.OutW()
	b.MaxPool2d(f(po), i(po), f(pn), pg)
	b.MaxPool2dBackward(f(pn), f(po), i(po), pg, false)
	b.CrossEntropy(f(1), f(640), f(640), i(64), 64, 10)
	b.CrossEntropy(f(1), tensor.Buffer{}, f(10250), i(1025), 1025, 10)
	b.Argmax(i(64), f(640), 64, 10)
	b.SGD(x, y, z, tensor.SGDStep{LR: 0.1, Momentum: 0.9})
	b.SGD(x, y, tensor.Buffer{}, tensor.SGDStep{LR: 0.1})
	b.GatherNormalize(f(64*784), alloc(100*784, tensor.Uint8), i(64), 784, 1, 0)
	d := make([]float32, 1000)
	b.Upload(x, d)
	b.Download(d, x)
	if err := b.Synchronize(); err != nil {
		t.Errorf("Synchronize: %v", err)
	}
	if rec.kernelLaunches() == 0 {
		t.Fatal("nothing was launched")
	}
}

// TestRecordedMisuse checks the programming-error panics (strings, not
// *tensor.Error) and that Free never panics.
func TestRecordedMisuse(t *testing.T) {
	b, _ := newRecordingBackend(t)
	mustPanic := func(what string, f func()) {
		t.Helper()
		defer func() {
			r := recover()
			if r == nil {
				t.Errorf("%s: no panic", what)
			} else if _, ok := r.(*tensor.Error); ok {
				t.Errorf("%s: panicked with a device error %v, want a programming error", what, r)
			}
		}()
		f()
	}
	x, _ := b.Alloc(10, tensor.Float32)
	xi, _ := b.Alloc(10, tensor.Int32)
	cpu, _ := tensor.CPU.Alloc(10, tensor.Float32)
	mustPanic("wrong dtype", func() { b.ReLU(x, xi) })
	mustPanic("foreign buffer", func() { b.ReLU(x, cpu) })
	mustPanic("short input", func() { b.Add(x, x.Slice(0, 5), x) })
	mustPanic("upload length", func() { b.Upload(x, make([]float32, 3)) })
	mustPanic("rank 7 view", func() {
		dst, _ := b.Alloc(128, tensor.Float32)
		src, _ := b.Alloc(1<<14, tensor.Float32)
		b.CopyStrided(dst, src, []int{2, 2, 2, 2, 2, 2, 2}, []int{2, 8, 32, 128, 512, 2048, 8192})
	})
	b.Free(x)
	mustPanic("use after free", func() { b.ReLU(x, x) })
	b.Free(x) // double free: reported by Synchronize, no panic
	if err := b.Synchronize(); err == nil {
		t.Error("Synchronize did not report a double free")
	}
	if err := b.Synchronize(); err != nil {
		t.Errorf("the error was reported twice: %v", err)
	}
	// Zero-length buffers are fine everywhere.
	e, err := b.Alloc(0, tensor.Float32)
	if err != nil {
		t.Fatal(err)
	}
	b.ReLU(e, e)
	b.Upload(e, []float32{})
	b.Download([]float32{}, e)
	b.Free(e)
	b.Free(xi)
	if err := b.Synchronize(); err != nil {
		t.Error(err)
	}
}
