package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/ember-ml/ember/tensor"
)

// NCCL bindings (libnccl.so.2), opened at run time like the other NVIDIA
// libraries. A communicator (NCCLComm) joins one process per GPU; its
// collectives are queued on a CUDA stream like kernels, so they order with
// the work around them and can be captured into a CUDA graph.
//
// The ABI trap. ncclCommInitRank takes the 128-byte ncclUniqueId BY VALUE.
// On x86-64 System V an aggregate larger than 16 bytes passed by value is
// copied into the caller's stack frame, a thing cCall (integer registers
// and word-sized stack slots only) cannot express on purpose. Two ways
// round it, in order of preference:
//
//  1. ncclCommInitRankScalable (NCCL >= 2.23) takes a POINTER to an array
//     of ids: every argument is a word, so cCall passes it exactly as it
//     passes any other call. This is the robust choice and the one used
//     whenever the library exports it (NCCL 2.28 on the GPU machines).
//  2. Older libraries: ncclCommInitRank bound with purego.RegisterFunc to a
//     Go function whose third parameter is the NCCLUniqueID struct.
//     purego v0.11 lays such a struct out as the ABI requires (amd64: more
//     than 64 bytes goes to the stack as 16 eightbytes, struct_amd64.go
//     placeStack; arm64: more than 16 bytes is copied and passed by
//     reference, struct_arm64.go). TestNCCLUniqueIDByValue checks the
//     marshalling against a purego callback that reads the id back.

var ncclLib = &sharedLib{
	what:    "NCCL",
	names:   []string{"libnccl.so.2", "libnccl.so"},
	display: "libnccl.so.2",
	install: "libnccl2, e.g. apt-get install libnccl2, or pip install nvidia-nccl-cu12 and put its lib directory on LD_LIBRARY_PATH",
	dirs:    ncclLibDirs,
}

// ncclLibDirs adds NCCL_HOME (a tarball install) to the CUDA directories.
func ncclLibDirs() []string {
	var dirs []string
	if v := os.Getenv("NCCL_HOME"); v != "" {
		dirs = append(dirs, filepath.Join(v, "lib"), filepath.Join(v, "lib64"))
	}
	return append(dirs, extraLibDirs()...)
}

// ncclAPI holds the addresses of the NCCL functions (nccl.h). Every
// ncclResult_t is a C enum (32 bits): results are truncated with uint32().
type ncclAPI struct {
	getVersion           uintptr // ncclResult_t ncclGetVersion(int *version)
	getUniqueID          uintptr // ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
	commInitRankScalable uintptr // ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId, ncclUniqueId *commIds, ncclConfig_t *config); optional (>= 2.23)
	commInitRank         uintptr // ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank): the id BY VALUE (see above)
	allReduce            uintptr // ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
	broadcast            uintptr // ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
	allGather            uintptr // ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
	reduceScatter        uintptr // ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
	groupStart           uintptr // ncclResult_t ncclGroupStart(void)
	groupEnd             uintptr // ncclResult_t ncclGroupEnd(void)
	commAbort            uintptr // ncclResult_t ncclCommAbort(ncclComm_t comm)
	commDestroy          uintptr // ncclResult_t ncclCommDestroy(ncclComm_t comm)
	commGetAsyncError    uintptr // ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
	commCount            uintptr // ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
	commUserRank         uintptr // ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
	getErrorString       uintptr // const char *ncclGetErrorString(ncclResult_t result)
	getLastError         uintptr // const char *ncclGetLastError(ncclComm_t comm); optional (>= 2.13)

	// initRankByValue calls commInitRank through purego's struct marshalling;
	// nil until needed (fallback 2 above).
	initRankByValue func(comm *uintptr, nranks int32, id NCCLUniqueID, rank int32) int32
	byValueOnce     sync.Once
	byValueErr      error

	version int // NCCL_VERSION_CODE of the library: 22805 for 2.28.5
}

var (
	ncclOnce sync.Once
	ncclFn   *ncclAPI
	ncclErr  error
)

// loadNCCL opens libnccl.so.2 once and resolves its symbols.
func loadNCCL() (*ncclAPI, error) {
	ncclOnce.Do(func() { ncclFn, ncclErr = openNCCL(ncclLib) })
	return ncclFn, ncclErr
}

func openNCCL(l *sharedLib) (*ncclAPI, error) {
	h, err := l.open()
	if err != nil {
		return nil, err
	}
	a := &ncclAPI{}
	if err := l.resolve(h, []libSymbol{
		reqSym(&a.getVersion, "ncclGetVersion"),
		reqSym(&a.getUniqueID, "ncclGetUniqueId"),
		optSym(&a.commInitRankScalable, "ncclCommInitRankScalable"),
		reqSym(&a.commInitRank, "ncclCommInitRank"),
		reqSym(&a.allReduce, "ncclAllReduce"),
		reqSym(&a.broadcast, "ncclBroadcast"),
		reqSym(&a.allGather, "ncclAllGather"),
		reqSym(&a.reduceScatter, "ncclReduceScatter"),
		reqSym(&a.groupStart, "ncclGroupStart"),
		reqSym(&a.groupEnd, "ncclGroupEnd"),
		reqSym(&a.commAbort, "ncclCommAbort"),
		reqSym(&a.commDestroy, "ncclCommDestroy"),
		reqSym(&a.commGetAsyncError, "ncclCommGetAsyncError"),
		reqSym(&a.commCount, "ncclCommCount"),
		reqSym(&a.commUserRank, "ncclCommUserRank"),
		reqSym(&a.getErrorString, "ncclGetErrorString"),
		optSym(&a.getLastError, "ncclGetLastError"),
	}); err != nil {
		return nil, err
	}
	var v int32
	if err := a.check("ncclGetVersion", cCall(a.getVersion, uintptr(unsafe.Pointer(&v))), 0); err != nil {
		return nil, err
	}
	a.version = int(v)
	return a, nil
}

// NCCLAvailable reports why NCCL cannot be used (nil when it can): the
// library is missing or lacks a function.
func NCCLAvailable() error {
	_, err := loadNCCL()
	return err
}

// NCCLVersion returns the library's NCCL_VERSION_CODE, major*10000 +
// minor*100 + patch since 2.9 (22805 is 2.28.5).
func NCCLVersion() (int, error) {
	a, err := loadNCCL()
	if err != nil {
		return 0, err
	}
	return a.version, nil
}

// NCCLVersionString formats a version code as "2.28.5" (codes of NCCL
// before 2.9, major*1000 + minor*100 + patch, as "2.8.4").
func NCCLVersionString(code int) string {
	if code < 10000 {
		return fmt.Sprintf("%d.%d.%d", code/1000, code%1000/100, code%100)
	}
	return fmt.Sprintf("%d.%d.%d", code/10000, code%10000/100, code%100)
}

// NCCLUniqueIDBytes is NCCL_UNIQUE_ID_BYTES.
const NCCLUniqueIDBytes = 128

// NCCLUniqueID is ncclUniqueId: 128 opaque bytes made by one rank
// (NewNCCLUniqueID) and handed to every rank out of band (the rendezvous
// of package nn/parallel) before NewNCCLComm. Its Go layout is the C one:
// one char array, no padding.
type NCCLUniqueID struct {
	Internal [NCCLUniqueIDBytes]byte
}

// NewNCCLUniqueID creates the id of a new communicator (ncclGetUniqueId).
// NCCL opens a bootstrap socket on this host that the ranks' NewNCCLComm
// calls reach; set NCCL_SOCKET_IFNAME to choose its interface.
func NewNCCLUniqueID() (NCCLUniqueID, error) {
	var id NCCLUniqueID
	a, err := loadNCCL()
	if err != nil {
		return id, err
	}
	err = a.check("ncclGetUniqueId", cCall(a.getUniqueID, uintptr(unsafe.Pointer(&id))), 0)
	return id, err
}

// NCCLDataType is ncclDataType_t.
type NCCLDataType int32

// The ncclDataType_t values (nccl.h).
const (
	NCCLInt8     NCCLDataType = 0
	NCCLUint8    NCCLDataType = 1
	NCCLInt32    NCCLDataType = 2
	NCCLUint32   NCCLDataType = 3
	NCCLInt64    NCCLDataType = 4
	NCCLUint64   NCCLDataType = 5
	NCCLFloat16  NCCLDataType = 6
	NCCLFloat32  NCCLDataType = 7
	NCCLFloat64  NCCLDataType = 8
	NCCLBfloat16 NCCLDataType = 9
)

// Size is the width of one element in bytes.
func (t NCCLDataType) Size() int {
	switch t {
	case NCCLInt8, NCCLUint8:
		return 1
	case NCCLFloat16, NCCLBfloat16:
		return 2
	case NCCLInt32, NCCLUint32, NCCLFloat32:
		return 4
	case NCCLInt64, NCCLUint64, NCCLFloat64:
		return 8
	}
	return 0
}

// NCCLRedOp is ncclRedOp_t (the built-in operations).
type NCCLRedOp int32

// The ncclRedOp_t values (nccl.h). NCCLAvg (NCCL >= 2.10) divides the sum
// by the number of ranks on the device, in the reduction itself.
const (
	NCCLSum  NCCLRedOp = 0
	NCCLProd NCCLRedOp = 1
	NCCLMax  NCCLRedOp = 2
	NCCLMin  NCCLRedOp = 3
	NCCLAvg  NCCLRedOp = 4
)

// ncclResult_t values (nccl.h).
const (
	ncclSuccess    = 0
	ncclInProgress = 7
)

// ncclResultNames are the enumerators of ncclResult_t, the library's own
// names for its statuses.
var ncclResultNames = map[int]string{
	0: "ncclSuccess",
	1: "ncclUnhandledCudaError",
	2: "ncclSystemError",
	3: "ncclInternalError",
	4: "ncclInvalidArgument",
	5: "ncclInvalidUsage",
	6: "ncclRemoteError",
	7: "ncclInProgress",
}

// NCCLResultName returns the ncclResult_t enumerator for code.
func NCCLResultName(code int) string {
	if n, ok := ncclResultNames[code]; ok {
		return n
	}
	return fmt.Sprintf("ncclResult_%d", code)
}

// check converts an ncclResult_t into an *Error (nil for ncclSuccess):
// Name is the enumerator, Message ncclGetErrorString's description and,
// when comm is known and the library has it, ncclGetLastError's account
// of what went wrong ("Duplicate GPU detected: rank 0 and rank 1 both on
// CUDA device 1b000", say).
func (a *ncclAPI) check(call string, r uintptr, comm uintptr) error {
	code := int(int32(uint32(r)))
	if code == ncclSuccess {
		return nil
	}
	e := &Error{Call: call, Code: code, Name: NCCLResultName(code)}
	if a.getErrorString != 0 {
		e.Message = goString(cCall(a.getErrorString, uintptr(uint32(code))))
	}
	if a.getLastError != 0 {
		if last := oneLineText(goString(cCall(a.getLastError, comm))); last != "" && last != e.Message {
			if e.Message != "" {
				e.Message += ": "
			}
			e.Message += last
		}
	}
	return e
}

// oneLineText joins the lines of a library message, so that an error stays
// one line.
func oneLineText(s string) string {
	b := []byte(s)
	n := 0
	space := false
	for _, c := range b {
		if c == '\n' || c == '\r' || c == '\t' || c == ' ' {
			space = n > 0
			continue
		}
		if space {
			b[n] = ' '
			n++
			space = false
		}
		b[n] = c
		n++
	}
	return string(b[:n])
}

// NCCLComm is one rank of an NCCL communicator on one Device. The
// collectives take device addresses and the stream to queue them on; the
// Backend forms take float32 tensor buffers of one Backend and use its
// stream. A communicator's collectives must be issued in the same order on
// every rank. Abort may be called from any goroutine (a watchdog) while
// another is blocked in a collective's stream; the other methods are not
// meant to race with Abort or Destroy.
type NCCLComm struct {
	api    *ncclAPI
	dev    *Device // nil only in the fake-library tests
	comm   uintptr // ncclComm_t
	rank   int
	nranks int
	closed atomic.Bool
}

// NewNCCLComm joins rank (0 <= rank < nranks) to the communicator of id on
// d: every rank must call it with the same id and nranks, and it returns
// when all have (ncclCommInitRankScalable, or ncclCommInitRank on NCCL
// before 2.23; see the top of this file). NCCL refuses two ranks on one GPU
// ("Duplicate GPU detected") unless each has its own NCCL_HOSTID.
func (d *Device) NewNCCLComm(nranks, rank int, id NCCLUniqueID) (*NCCLComm, error) {
	if d == nil {
		return nil, errNilDevice
	}
	a, err := loadNCCL()
	if err != nil {
		return nil, err
	}
	return a.initRank(d, nranks, rank, id)
}

func (a *ncclAPI) initRank(d *Device, nranks, rank int, id NCCLUniqueID) (*NCCLComm, error) {
	if nranks < 1 || rank < 0 || rank >= nranks || nranks > 1<<30 {
		return nil, fmt.Errorf("cuda: NCCL communicator: rank %d of world size %d is out of range", rank, nranks)
	}
	c := &NCCLComm{api: a, dev: d, rank: rank, nranks: nranks}
	err := c.do(func() error {
		if a.commInitRankScalable != 0 {
			ids := [1]NCCLUniqueID{id}
			return a.check("ncclCommInitRankScalable", cCall(a.commInitRankScalable,
				uintptr(unsafe.Pointer(&c.comm)), uintptr(nranks), uintptr(rank), 1, uintptr(unsafe.Pointer(&ids[0])), 0), 0)
		}
		fn, err := a.byValue()
		if err != nil {
			return err
		}
		return a.check("ncclCommInitRank", uintptr(uint32(fn(&c.comm, int32(nranks), id, int32(rank)))), 0)
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

// byValue binds ncclCommInitRank with the id as a struct argument.
func (a *ncclAPI) byValue() (func(*uintptr, int32, NCCLUniqueID, int32) int32, error) {
	a.byValueOnce.Do(func() {
		if a.initRankByValue != nil {
			return
		}
		switch runtime.GOARCH {
		case "amd64", "arm64":
		default:
			a.byValueErr = fmt.Errorf("cuda: NCCL %s lacks ncclCommInitRankScalable and its ncclCommInitRank (a 128-byte struct by value) is not bound on %s: install NCCL >= 2.23", NCCLVersionString(a.version), runtime.GOARCH)
			return
		}
		defer func() {
			if r := recover(); r != nil {
				a.byValueErr = fmt.Errorf("cuda: binding ncclCommInitRank: %v", r)
			}
		}()
		purego.RegisterFunc(&a.initRankByValue, a.commInitRank)
	})
	return a.initRankByValue, a.byValueErr
}

// do runs fn with the device's context current on a locked OS thread
// (NCCL finds its device through the CUDA runtime's current device).
func (c *NCCLComm) do(fn func() error) error {
	if c.dev == nil {
		return fn()
	}
	return c.dev.Do(fn)
}

func (c *NCCLComm) live(call string) error {
	if c == nil || c.closed.Load() {
		return fmt.Errorf("cuda: %s on a closed or nil NCCL communicator", call)
	}
	return nil
}

// Rank is this process's rank in the communicator.
func (c *NCCLComm) Rank() int { return c.rank }

// Size is the number of ranks.
func (c *NCCLComm) Size() int { return c.nranks }

// Device is the GPU of this rank.
func (c *NCCLComm) Device() *Device { return c.dev }

// Count asks NCCL for the number of ranks (ncclCommCount) and the rank of
// this one (ncclCommUserRank), as a check of the communicator.
func (c *NCCLComm) Count() (nranks, rank int, err error) {
	if err := c.live("ncclCommCount"); err != nil {
		return 0, 0, err
	}
	var n, r int32
	if err := c.api.check("ncclCommCount", cCall(c.api.commCount, c.comm, uintptr(unsafe.Pointer(&n))), c.comm); err != nil {
		return 0, 0, err
	}
	if err := c.api.check("ncclCommUserRank", cCall(c.api.commUserRank, c.comm, uintptr(unsafe.Pointer(&r))), c.comm); err != nil {
		return 0, 0, err
	}
	return int(n), int(r), nil
}

func checkCount(call string, count int, dt NCCLDataType) error {
	if count < 0 || dt.Size() == 0 {
		return fmt.Errorf("cuda: %s: %d elements of data type %d", call, count, dt)
	}
	return nil
}

// AllReduce reduces count elements of send over all ranks with op and
// leaves the result in recv on every rank (ncclAllReduce). send may equal
// recv (in place).
func (c *NCCLComm) AllReduce(send, recv uintptr, count int, dt NCCLDataType, op NCCLRedOp, s Stream) error {
	const call = "ncclAllReduce"
	if err := c.live(call); err != nil {
		return err
	}
	if err := checkCount(call, count, dt); err != nil {
		return err
	}
	if op == NCCLAvg && c.api.version < 21000 {
		return fmt.Errorf("cuda: %s: ncclAvg needs NCCL >= 2.10, have %s", call, NCCLVersionString(c.api.version))
	}
	return c.do(func() error {
		return c.api.check(call, cCall(c.api.allReduce, send, recv, uintptr(count), uintptr(dt), uintptr(op), c.comm, uintptr(s)), c.comm)
	})
}

// Broadcast copies count elements of send on rank root to recv on every
// rank (ncclBroadcast); send is read on the root only.
func (c *NCCLComm) Broadcast(send, recv uintptr, count int, dt NCCLDataType, root int, s Stream) error {
	const call = "ncclBroadcast"
	if err := c.live(call); err != nil {
		return err
	}
	if err := checkCount(call, count, dt); err != nil {
		return err
	}
	if root < 0 || root >= c.nranks {
		return fmt.Errorf("cuda: %s: root %d outside world size %d", call, root, c.nranks)
	}
	return c.do(func() error {
		return c.api.check(call, cCall(c.api.broadcast, send, recv, uintptr(count), uintptr(dt), uintptr(root), c.comm, uintptr(s)), c.comm)
	})
}

// AllGather concatenates sendCount elements of every rank, in rank order,
// into recv (Size()*sendCount elements) on every rank (ncclAllGather).
func (c *NCCLComm) AllGather(send, recv uintptr, sendCount int, dt NCCLDataType, s Stream) error {
	const call = "ncclAllGather"
	if err := c.live(call); err != nil {
		return err
	}
	if err := checkCount(call, sendCount, dt); err != nil {
		return err
	}
	return c.do(func() error {
		return c.api.check(call, cCall(c.api.allGather, send, recv, uintptr(sendCount), uintptr(dt), c.comm, uintptr(s)), c.comm)
	})
}

// ReduceScatter reduces Size()*recvCount elements of send over all ranks
// with op and leaves block r of the result (recvCount elements) in recv of
// rank r (ncclReduceScatter).
func (c *NCCLComm) ReduceScatter(send, recv uintptr, recvCount int, dt NCCLDataType, op NCCLRedOp, s Stream) error {
	const call = "ncclReduceScatter"
	if err := c.live(call); err != nil {
		return err
	}
	if err := checkCount(call, recvCount, dt); err != nil {
		return err
	}
	return c.do(func() error {
		return c.api.check(call, cCall(c.api.reduceScatter, send, recv, uintptr(recvCount), uintptr(dt), uintptr(op), c.comm, uintptr(s)), c.comm)
	})
}

// Group issues the collectives fn queues as one NCCL group (ncclGroupStart
// ... ncclGroupEnd), which NCCL may fuse into one launch: the buckets of a
// gradient all-reduce, say. The group state of NCCL belongs to the OS
// thread, so fn runs on the calling goroutine's locked thread; it must not
// hand its collectives to other goroutines.
func (c *NCCLComm) Group(fn func() error) error {
	if err := c.live("ncclGroupStart"); err != nil {
		return err
	}
	return c.do(func() error {
		if err := c.api.check("ncclGroupStart", cCall(c.api.groupStart), 0); err != nil {
			return err
		}
		ferr := fn()
		// ncclGroupEnd must follow every successful ncclGroupStart, even when
		// fn failed, or the thread stays inside the group.
		return errors.Join(ferr, c.api.check("ncclGroupEnd", cCall(c.api.groupEnd), c.comm))
	})
}

// AsyncError returns the communicator's asynchronous error, nil while it
// has none (ncclCommGetAsyncError): a peer that died or a network failure
// shows here while this rank's stream waits in a collective. A watchdog
// polls it and calls Abort.
func (c *NCCLComm) AsyncError() error {
	if err := c.live("ncclCommGetAsyncError"); err != nil {
		return err
	}
	var r int32
	if err := c.api.check("ncclCommGetAsyncError", cCall(c.api.commGetAsyncError, c.comm, uintptr(unsafe.Pointer(&r))), c.comm); err != nil {
		return err
	}
	if r == ncclInProgress {
		return nil
	}
	return c.api.check("ncclCommGetAsyncError", uintptr(uint32(r)), c.comm)
}

// Abort frees the communicator at once, cancelling the collectives in
// flight so that streams waiting in them can finish (ncclCommAbort). It may
// be called from any goroutine; after it (or Destroy) every method fails,
// and a second Abort or Destroy does nothing.
func (c *NCCLComm) Abort() error {
	if c == nil || !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	return c.do(func() error { return c.api.check("ncclCommAbort", cCall(c.api.commAbort, c.comm), 0) })
}

// Destroy frees the communicator after the collectives queued on it have
// finished (ncclCommDestroy).
func (c *NCCLComm) Destroy() error {
	if c == nil || !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	return c.do(func() error { return c.api.check("ncclCommDestroy", cCall(c.api.commDestroy, c.comm), 0) })
}

// float32Ptr returns the device address of a float32 buffer of b, or an
// error (never a panic) for a buffer that is not one.
func (b *Backend) float32Ptr(call string, buf tensor.Buffer) (uintptr, error) {
	m, ok := buf.Mem.(*blockMemory)
	switch {
	case !ok || m == nil:
		return 0, fmt.Errorf("cuda: %s: buffer not allocated by a CUDA backend (memory %T)", call, buf.Mem)
	case m.owner != b:
		return 0, fmt.Errorf("cuda: %s: buffer belongs to %s, not %s", call, m.owner.name, b.name)
	case buf.DType != tensor.Float32:
		return 0, fmt.Errorf("cuda: %s: want a float32 buffer, have %v", call, buf.DType)
	case m.freed.Load():
		return 0, fmt.Errorf("cuda: %s: use of a freed buffer", call)
	case buf.Off < 0 || buf.Len < 0 || (buf.Off+buf.Len)*4 > m.bytes:
		return 0, fmt.Errorf("cuda: %s: buffer window [%d, %d) outside its %d-byte memory", call, buf.Off, buf.Off+buf.Len, m.bytes)
	}
	return m.blk.Ptr() + uintptr(buf.Off*4), nil
}

// backendStream checks that b is on the communicator's device, joins the
// backend's detached side-stream work (so the collective sees every
// gradient written so far) and returns the stream to queue on.
func (c *NCCLComm) backendStream(call string, b *Backend) (Stream, error) {
	if b == nil || b.closed.Load() {
		return 0, fmt.Errorf("cuda: %s: nil or closed Backend", call)
	}
	if c.dev != nil && b.dev != c.dev && b.dev.Ordinal() != c.dev.Ordinal() {
		return 0, fmt.Errorf("cuda: %s: backend %s is not on the communicator's device %d", call, b.name, c.dev.Ordinal())
	}
	if err := b.x.settle(); err != nil {
		return 0, err
	}
	return b.stream, nil
}

// AllReduceFloat32 reduces the float32 buffer buf of b in place over all
// ranks with op (NCCLSum or NCCLAvg, say), queued on b's stream after
// everything b has queued; inside a capture of b's stream it becomes a
// node of the graph.
func (c *NCCLComm) AllReduceFloat32(b *Backend, buf tensor.Buffer, op NCCLRedOp) error {
	const call = "ncclAllReduce"
	p, err := b.float32Ptr(call, buf)
	if err != nil {
		return err
	}
	s, err := c.backendStream(call, b)
	if err != nil {
		return err
	}
	return c.AllReduce(p, p, buf.Len, NCCLFloat32, op, s)
}

// BroadcastFloat32 overwrites the float32 buffer buf of b on every rank
// with its values on root, queued on b's stream.
func (c *NCCLComm) BroadcastFloat32(b *Backend, buf tensor.Buffer, root int) error {
	const call = "ncclBroadcast"
	p, err := b.float32Ptr(call, buf)
	if err != nil {
		return err
	}
	s, err := c.backendStream(call, b)
	if err != nil {
		return err
	}
	return c.Broadcast(p, p, buf.Len, NCCLFloat32, root, s)
}

// AllReduceFloat32On is AllReduceFloat32 queued on the stream side instead
// of b's, so that it overlaps b's later work (the rest of a backward
// pass): fork is recorded on b's stream after everything b has queued and
// side waits for it before the all-reduce. Make b's stream wait for side
// (an event recorded on side) before it reads buf again. Inside a capture
// of b's stream, side joins the capture through fork, and the all-reduce
// becomes a node of the graph on a branch of its own.
func (c *NCCLComm) AllReduceFloat32On(b *Backend, buf tensor.Buffer, op NCCLRedOp, side Stream, fork Event) error {
	const call = "ncclAllReduce"
	p, err := b.float32Ptr(call, buf)
	if err != nil {
		return err
	}
	s, err := c.backendStream(call, b)
	if err != nil {
		return err
	}
	if err := b.dev.RecordEvent(fork, s); err != nil {
		return err
	}
	if err := b.dev.StreamWaitEvent(side, fork); err != nil {
		return err
	}
	return c.AllReduce(p, p, buf.Len, NCCLFloat32, op, side)
}
