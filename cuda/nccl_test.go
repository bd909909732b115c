package cuda

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/ember-ml/ember/tensor"
)

// The NCCL tests without a GPU run the bindings against a fake library:
// purego callbacks stand in for the C functions, record what they receive
// and return chosen statuses, so the argument order, the by-value id and
// the error mapping are checked on any machine. The GPU tests at the end
// use the real libnccl.so.2.

func TestNCCLMissingLibrary(t *testing.T) {
	l := &sharedLib{
		what:    "NCCL",
		names:   []string{"libnccl-ember-test-absent.so.2"},
		display: "libnccl.so.2",
		install: ncclLib.install,
	}
	_, err := openNCCL(l)
	var le *LibraryError
	if !errors.As(err, &le) {
		t.Fatalf("openNCCL of an absent library: %v (%T), want a *LibraryError", err, err)
	}
	msg := err.Error()
	for _, want := range []string{"NCCL not found", "libnccl.so.2", "install libnccl2"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("error is not one line: %q", msg)
	}
	// On a machine without NCCL the package-level entry points say the same.
	if err := NCCLAvailable(); err != nil {
		if !strings.Contains(err.Error(), "NCCL") {
			t.Errorf("NCCLAvailable: %v does not name NCCL", err)
		}
		if _, err2 := NewNCCLUniqueID(); err2 == nil || err2.Error() != err.Error() {
			t.Errorf("NewNCCLUniqueID without NCCL: %v, want %v", err2, err)
		}
	}
}

func TestNCCLUniqueIDLayout(t *testing.T) {
	// ncclUniqueId is struct { char internal[NCCL_UNIQUE_ID_BYTES]; }:
	// 128 bytes, byte aligned, so a pointer to the Go value (or to an
	// array of them, for ncclCommInitRankScalable) is a pointer to the C one.
	var id NCCLUniqueID
	if s, a := unsafe.Sizeof(id), unsafe.Alignof(id); s != 128 || a != 1 {
		t.Errorf("NCCLUniqueID: size %d, alignment %d; want 128, 1", s, a)
	}
	var ids [2]NCCLUniqueID
	if d := uintptr(unsafe.Pointer(&ids[1])) - uintptr(unsafe.Pointer(&ids[0])); d != 128 {
		t.Errorf("ids of an array are %d bytes apart, want 128", d)
	}
}

func TestNCCLVersionString(t *testing.T) {
	for code, want := range map[int]string{22805: "2.28.5", 21003: "2.10.3", 2804: "2.8.4"} {
		if got := NCCLVersionString(code); got != want {
			t.Errorf("NCCLVersionString(%d) = %q, want %q", code, got, want)
		}
	}
}

// fakeNCCL is the state behind the fake library's callbacks.
type fakeNCCL struct {
	mu       sync.Mutex
	calls    []string
	args     [][]uintptr
	result   map[string]int32 // status returned per function (default success)
	id       NCCLUniqueID     // the id an init received
	asyncErr int32
	lastErr  []byte // NUL-terminated, for ncclGetLastError
}

var (
	fakeMu      sync.Mutex // one fake at a time
	fakeCurrent *fakeNCCL
	fakeAPIOnce sync.Once
	fakeAPI     ncclAPI // callback addresses, made once (purego keeps at most 2000)
	fakeStrings = map[int32][]byte{
		4: []byte("invalid argument (run with NCCL_DEBUG=WARN for details)\x00"),
		5: []byte("invalid usage (run with NCCL_DEBUG=WARN for details)\x00"),
		6: []byte("remote process exited or there was a network error\x00"),
	}
	fakeComm = uintptr(0xc0fe)
)

func (f *fakeNCCL) record(name string, args ...uintptr) int32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, name)
	f.args = append(f.args, args)
	return f.result[name]
}

// withFakeNCCL returns an API whose functions are the fake's, and the fake.
func withFakeNCCL(t *testing.T) (*ncclAPI, *fakeNCCL) {
	t.Helper()
	fakeMu.Lock()
	f := &fakeNCCL{result: map[string]int32{}}
	fakeCurrent = f
	t.Cleanup(func() { fakeCurrent = nil; fakeMu.Unlock() })
	fakeAPIOnce.Do(func() {
		cur := func() *fakeNCCL { return fakeCurrent }
		a := &fakeAPI
		a.getUniqueID = purego.NewCallback(func(id *NCCLUniqueID) int32 {
			for i := range id.Internal {
				id.Internal[i] = byte(i*7 + 1)
			}
			return cur().record("ncclGetUniqueId")
		})
		a.commInitRankScalable = purego.NewCallback(func(comm *uintptr, nranks, rank, nID int32, ids *NCCLUniqueID, config uintptr) int32 {
			f := cur()
			f.id = *ids
			*comm = fakeComm
			return f.record("ncclCommInitRankScalable", uintptr(nranks), uintptr(rank), uintptr(nID), config)
		})
		a.commInitRank = purego.NewCallback(func(comm *uintptr, nranks int32, id NCCLUniqueID, rank int32) int32 {
			f := cur()
			f.id = id
			*comm = fakeComm
			return f.record("ncclCommInitRank", uintptr(nranks), uintptr(rank))
		})
		a.allReduce = purego.NewCallback(func(send, recv, count uintptr, dt, op int32, comm, stream uintptr) int32 {
			return cur().record("ncclAllReduce", send, recv, count, uintptr(dt), uintptr(op), comm, stream)
		})
		a.broadcast = purego.NewCallback(func(send, recv, count uintptr, dt, root int32, comm, stream uintptr) int32 {
			return cur().record("ncclBroadcast", send, recv, count, uintptr(dt), uintptr(root), comm, stream)
		})
		a.allGather = purego.NewCallback(func(send, recv, count uintptr, dt int32, comm, stream uintptr) int32 {
			return cur().record("ncclAllGather", send, recv, count, uintptr(dt), comm, stream)
		})
		a.reduceScatter = purego.NewCallback(func(send, recv, count uintptr, dt, op int32, comm, stream uintptr) int32 {
			return cur().record("ncclReduceScatter", send, recv, count, uintptr(dt), uintptr(op), comm, stream)
		})
		a.groupStart = purego.NewCallback(func() int32 { return cur().record("ncclGroupStart") })
		a.groupEnd = purego.NewCallback(func() int32 { return cur().record("ncclGroupEnd") })
		a.commAbort = purego.NewCallback(func(comm uintptr) int32 { return cur().record("ncclCommAbort", comm) })
		a.commDestroy = purego.NewCallback(func(comm uintptr) int32 { return cur().record("ncclCommDestroy", comm) })
		a.commGetAsyncError = purego.NewCallback(func(comm uintptr, r *int32) int32 {
			f := cur()
			*r = f.asyncErr
			return f.record("ncclCommGetAsyncError", comm)
		})
		a.commCount = purego.NewCallback(func(comm uintptr, n *int32) int32 { *n = 3; return cur().record("ncclCommCount", comm) })
		a.commUserRank = purego.NewCallback(func(comm uintptr, r *int32) int32 { *r = 2; return cur().record("ncclCommUserRank", comm) })
		a.getErrorString = purego.NewCallback(func(code int32) uintptr {
			if s, ok := fakeStrings[code]; ok {
				return uintptr(unsafe.Pointer(&s[0]))
			}
			return 0
		})
		a.getLastError = purego.NewCallback(func(comm uintptr) uintptr {
			f := cur()
			if len(f.lastErr) == 0 {
				return 0
			}
			return uintptr(unsafe.Pointer(&f.lastErr[0]))
		})
	})
	a := &ncclAPI{}
	*a = ncclAPI{
		getUniqueID: fakeAPI.getUniqueID, commInitRankScalable: fakeAPI.commInitRankScalable, commInitRank: fakeAPI.commInitRank,
		allReduce: fakeAPI.allReduce, broadcast: fakeAPI.broadcast, allGather: fakeAPI.allGather, reduceScatter: fakeAPI.reduceScatter,
		groupStart: fakeAPI.groupStart, groupEnd: fakeAPI.groupEnd, commAbort: fakeAPI.commAbort, commDestroy: fakeAPI.commDestroy,
		commGetAsyncError: fakeAPI.commGetAsyncError, commCount: fakeAPI.commCount, commUserRank: fakeAPI.commUserRank,
		getErrorString: fakeAPI.getErrorString, getLastError: fakeAPI.getLastError, version: 22805,
	}
	return a, f
}

func testID() NCCLUniqueID {
	var id NCCLUniqueID
	for i := range id.Internal {
		id.Internal[i] = byte(255 - i)
	}
	return id
}

func TestNCCLInitRankScalable(t *testing.T) {
	a, f := withFakeNCCL(t)
	c, err := a.initRank(nil, 4, 3, testID())
	if err != nil {
		t.Fatal(err)
	}
	if c.comm != fakeComm || c.Rank() != 3 || c.Size() != 4 {
		t.Errorf("comm %#x rank %d size %d, want %#x 3 4", c.comm, c.Rank(), c.Size(), fakeComm)
	}
	if len(f.calls) != 1 || f.calls[0] != "ncclCommInitRankScalable" {
		t.Fatalf("calls %v, want one ncclCommInitRankScalable", f.calls)
	}
	// nranks 4, myrank 3, one id, NULL config (NCCL's defaults).
	if got := f.args[0]; got[0] != 4 || got[1] != 3 || got[2] != 1 || got[3] != 0 {
		t.Errorf("ncclCommInitRankScalable(nranks, myrank, nId, config) = %v, want [4 3 1 0]", got)
	}
	if f.id != testID() {
		want := testID()
		t.Errorf("the library received id % x..., want % x...", f.id.Internal[:8], want.Internal[:8])
	}
	if _, err := a.initRank(nil, 2, 2, testID()); err == nil || !strings.Contains(err.Error(), "rank 2 of world size 2") {
		t.Errorf("rank 2 of 2: %v, want an out-of-range error", err)
	}
}

// TestNCCLUniqueIDByValue checks the fallback: ncclCommInitRank with the
// 128-byte id passed by value through purego's struct marshalling. The
// callback reads its arguments as a C function would, from the registers
// and stack the ABI assigns (two integer registers, then the id on the
// stack, then rank in the third register on amd64), so a mismatch shows
// as garbled bytes or a wrong rank.
func TestNCCLUniqueIDByValue(t *testing.T) {
	a, f := withFakeNCCL(t)
	a.commInitRankScalable = 0 // an NCCL before 2.23
	c, err := a.initRank(nil, 5, 4, testID())
	if err != nil {
		t.Fatal(err)
	}
	if len(f.calls) != 1 || f.calls[0] != "ncclCommInitRank" {
		t.Fatalf("calls %v, want one ncclCommInitRank", f.calls)
	}
	if got := f.args[0]; got[0] != 5 || got[1] != 4 {
		t.Errorf("ncclCommInitRank(nranks, rank) = %v, want [5 4]", got)
	}
	if f.id != testID() {
		t.Errorf("the library received id\n% x\nwant\n% x", f.id.Internal, testID().Internal)
	}
	if c.comm != fakeComm {
		t.Errorf("comm %#x, want %#x", c.comm, fakeComm)
	}
}

func TestNCCLCollectiveArguments(t *testing.T) {
	a, f := withFakeNCCL(t)
	c, err := a.initRank(nil, 3, 2, testID())
	if err != nil {
		t.Fatal(err)
	}
	f.calls, f.args = nil, nil
	const s = Stream(0x5151)
	if err := c.AllReduce(0x1000, 0x2000, 10, NCCLFloat32, NCCLAvg, s); err != nil {
		t.Fatal(err)
	}
	if err := c.Broadcast(0x3000, 0x3000, 11, NCCLInt32, 1, s); err != nil {
		t.Fatal(err)
	}
	if err := c.Group(func() error {
		if err := c.AllGather(0x4000, 0x5000, 12, NCCLFloat32, s); err != nil {
			return err
		}
		return c.ReduceScatter(0x6000, 0x7000, 13, NCCLFloat32, NCCLSum, s)
	}); err != nil {
		t.Fatal(err)
	}
	n, r, err := c.Count()
	if err != nil || n != 3 || r != 2 {
		t.Errorf("Count() = %d, %d, %v; want 3, 2", n, r, err)
	}
	want := []struct {
		call string
		args []uintptr
	}{
		{"ncclAllReduce", []uintptr{0x1000, 0x2000, 10, 7, 4, fakeComm, 0x5151}},
		{"ncclBroadcast", []uintptr{0x3000, 0x3000, 11, 2, 1, fakeComm, 0x5151}},
		{"ncclGroupStart", nil},
		{"ncclAllGather", []uintptr{0x4000, 0x5000, 12, 7, fakeComm, 0x5151}},
		{"ncclReduceScatter", []uintptr{0x6000, 0x7000, 13, 7, 0, fakeComm, 0x5151}},
		{"ncclGroupEnd", nil},
		{"ncclCommCount", []uintptr{fakeComm}},
		{"ncclCommUserRank", []uintptr{fakeComm}},
	}
	if len(f.calls) != len(want) {
		t.Fatalf("calls %v, want %d", f.calls, len(want))
	}
	for i, w := range want {
		if f.calls[i] != w.call || !equalWords(f.args[i], w.args) {
			t.Errorf("call %d: %s%#x, want %s%#x", i, f.calls[i], f.args[i], w.call, w.args)
		}
	}
	// Checked before the library sees them.
	if err := c.Broadcast(0, 0, 1, NCCLFloat32, 3, s); err == nil || !strings.Contains(err.Error(), "root 3") {
		t.Errorf("Broadcast from root 3 of 3: %v", err)
	}
	if err := c.AllReduce(0, 0, -1, NCCLFloat32, NCCLSum, s); err == nil {
		t.Error("AllReduce of -1 elements: no error")
	}
	c.api.version = 20903
	if err := c.AllReduce(0, 0, 1, NCCLFloat32, NCCLAvg, s); err == nil || !strings.Contains(err.Error(), "2.10") {
		t.Errorf("ncclAvg on NCCL 2.9.3: %v, want an error naming 2.10", err)
	}
}

func equalWords(a, b []uintptr) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestNCCLErrorMapping(t *testing.T) {
	a, f := withFakeNCCL(t)
	c, err := a.initRank(nil, 2, 0, testID())
	if err != nil {
		t.Fatal(err)
	}
	f.result["ncclAllReduce"] = 5
	f.lastErr = []byte("ncclAllReduce: invalid\n  count 0\x00")
	err = c.AllReduce(1, 1, 4, NCCLFloat32, NCCLSum, 0)
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("AllReduce failing with ncclInvalidUsage: %v (%T), want *Error", err, err)
	}
	if e.Call != "ncclAllReduce" || e.Code != 5 || e.Name != "ncclInvalidUsage" {
		t.Errorf("error %+v, want call ncclAllReduce, code 5, ncclInvalidUsage", e)
	}
	want := "cuda: ncclAllReduce: ncclInvalidUsage: invalid usage (run with NCCL_DEBUG=WARN for details): ncclAllReduce: invalid count 0"
	if err.Error() != want {
		t.Errorf("error\n%q\nwant\n%q", err.Error(), want)
	}
	if errors.Is(err, ErrDeviceOutOfMemory) {
		t.Error("an NCCL status matched ErrDeviceOutOfMemory")
	}
	// A code the library cannot describe keeps its number.
	f.lastErr = nil
	if got := a.check("ncclGroupEnd", 42, 0).Error(); got != "cuda: ncclGroupEnd: ncclResult_42" {
		t.Errorf("unknown status: %q", got)
	}
	// The group is ended even when its body failed.
	f.calls = nil
	body := errors.New("body failed")
	if err := c.Group(func() error { return body }); !errors.Is(err, body) {
		t.Errorf("Group: %v, want the body's error", err)
	}
	if len(f.calls) != 2 || f.calls[1] != "ncclGroupEnd" {
		t.Errorf("calls %v, want ncclGroupStart, ncclGroupEnd", f.calls)
	}
}

func TestNCCLAsyncErrorAndAbort(t *testing.T) {
	a, f := withFakeNCCL(t)
	c, err := a.initRank(nil, 2, 1, testID())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AsyncError(); err != nil {
		t.Errorf("AsyncError with none: %v", err)
	}
	f.asyncErr = ncclInProgress
	if err := c.AsyncError(); err != nil {
		t.Errorf("AsyncError while in progress: %v", err)
	}
	f.asyncErr = 6
	err = c.AsyncError()
	if err == nil || !strings.Contains(err.Error(), "ncclRemoteError") || !strings.Contains(err.Error(), "remote process exited") {
		t.Errorf("AsyncError of a dead peer: %v", err)
	}
	f.calls = nil
	if err := c.Abort(); err != nil {
		t.Fatal(err)
	}
	if err := c.Abort(); err != nil {
		t.Fatal(err)
	}
	if err := c.Destroy(); err != nil {
		t.Fatal(err)
	}
	if len(f.calls) != 1 || f.calls[0] != "ncclCommAbort" {
		t.Errorf("calls %v, want one ncclCommAbort", f.calls)
	}
	if err := c.AllReduce(1, 1, 1, NCCLFloat32, NCCLSum, 0); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Errorf("AllReduce after Abort: %v", err)
	}
}

func TestNCCLBufferChecks(t *testing.T) {
	a, _ := withFakeNCCL(t)
	c, err := a.initRank(nil, 1, 0, testID())
	if err != nil {
		t.Fatal(err)
	}
	cpu := tensor.FromFloat32(tensor.CPU, nil, []float32{1, 2}, 2)
	defer cpu.Release()
	b := &Backend{name: "cuda:9"}
	if err := c.AllReduceFloat32(b, cpu.Buffer(), NCCLSum); err == nil || !strings.Contains(err.Error(), "not allocated by a CUDA backend") {
		t.Errorf("AllReduceFloat32 of a CPU buffer: %v", err)
	}
	other := &Backend{name: "cuda:1"}
	buf := tensor.Buffer{Mem: &blockMemory{bytes: 8, owner: other}, Len: 2, DType: tensor.Float32}
	if err := c.BroadcastFloat32(b, buf, 0); err == nil || !strings.Contains(err.Error(), "belongs to cuda:1") {
		t.Errorf("BroadcastFloat32 of another backend's buffer: %v", err)
	}
	buf = tensor.Buffer{Mem: &blockMemory{bytes: 8, owner: b}, Off: 1, Len: 2, DType: tensor.Float32}
	if err := c.AllReduceFloat32(b, buf, NCCLSum); err == nil || !strings.Contains(err.Error(), "outside") {
		t.Errorf("AllReduceFloat32 past the end of its memory: %v", err)
	}
}

// --- GPU ---

func requireNCCL(t *testing.T) *Backend {
	t.Helper()
	b := newGPUBackend(t, BackendOptions{})
	if err := NCCLAvailable(); err != nil {
		t.Skipf("a GPU but no NCCL: %v", err)
	}
	return b
}

// TestGPUNCCLWorldSizeOne all-reduces and broadcasts through real NCCL at
// world size 1, eagerly and inside a captured step: with one rank a sum and
// an average leave the values as they are (exactly: x + nothing, x / 1), a
// broadcast too.
func TestGPUNCCLWorldSizeOne(t *testing.T) {
	b := requireNCCL(t)
	v, _ := NCCLVersion()
	t.Logf("NCCL %s", NCCLVersionString(v))
	id, err := NewNCCLUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	c, err := b.Device().NewNCCLComm(1, 0, id)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Destroy(); err != nil {
			t.Error(err)
		}
	}()
	if n, r, err := c.Count(); err != nil || n != 1 || r != 0 {
		t.Fatalf("Count() = %d, %d, %v", n, r, err)
	}
	data := []float32{1, -2.5, 3e-7, 4e9, 5}
	x := tensor.FromFloat32(b, nil, data, len(data))
	defer x.Release()
	for _, op := range []NCCLRedOp{NCCLSum, NCCLAvg} {
		if err := c.AllReduceFloat32(b, x.Buffer(), op); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.BroadcastFloat32(b, x.Buffer(), 0); err != nil {
		t.Fatal(err)
	}
	if got := x.Float32s(); !equalF32(got, data) {
		t.Errorf("after all-reduce and broadcast at world size 1: %v, want %v", got, data)
	}
	if err := c.AsyncError(); err != nil {
		t.Errorf("AsyncError: %v", err)
	}

	// Captured: x = 2x (a kernel), then the all-reduce, as a step would.
	two := tensor.Full(b, nil, 2, 1)
	defer two.Release()
	var capErr error
	g, err := b.Capture(func() {
		b.ScaleBy(x.Buffer(), x.Buffer(), two.Buffer(), false)
		capErr = c.AllReduceFloat32(b, x.Buffer(), NCCLAvg)
	})
	if err != nil || capErr != nil {
		t.Fatalf("capturing an all-reduce: %v, %v", err, capErr)
	}
	defer g.Close()
	for range 3 {
		if err := g.Replay(); err != nil {
			t.Fatal(err)
		}
	}
	want := make([]float32, len(data))
	for i, v := range data {
		want[i] = v * 8
	}
	if got := x.Float32s(); !equalF32(got, want) {
		t.Errorf("after 3 replays of x = avg(2x): %v, want %v", got, want)
	}
}

func equalF32(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
