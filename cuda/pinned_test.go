package cuda

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/ember-ml/ember/data"
	"github.com/ember-ml/ember/tensor"
)

// fakePinned is a pinnedDriver that records every call in order, keeps the
// bytes each copy read, and hands out host memory from Go.
type fakePinned struct {
	calls  []string
	nextID uintptr
	live   map[unsafe.Pointer][]byte
	copied [][]byte
	ptrs   map[uintptr]string // device addresses of the slots, by name
}

func newFakePinned() *fakePinned {
	return &fakePinned{nextID: 100, live: map[unsafe.Pointer][]byte{}, ptrs: map[uintptr]string{}}
}

func (f *fakePinned) log(format string, args ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

func (f *fakePinned) memHostAlloc(bytes int) (unsafe.Pointer, error) {
	m := make([]byte, bytes)
	p := unsafe.Pointer(&m[0])
	f.live[p] = m
	f.log("hostalloc %d", bytes)
	return p, nil
}

func (f *fakePinned) memFreeHost(p unsafe.Pointer) error {
	if _, ok := f.live[p]; !ok {
		return fmt.Errorf("fake: free of %p, not allocated", p)
	}
	delete(f.live, p)
	f.log("hostfree")
	return nil
}

func (f *fakePinned) id() uintptr { f.nextID++; return f.nextID }
func (f *fakePinned) NewStream() (Stream, error) {
	s := Stream(f.id())
	f.log("stream %d", s)
	return s, nil
}
func (f *fakePinned) DestroyStream(s Stream) error { f.log("destroy stream %d", s); return nil }
func (f *fakePinned) NewEvent(bool) (Event, error) { return Event(f.id()), nil }
func (f *fakePinned) RecordEvent(e Event, s Stream) error {
	f.log("record %d on %d", e, s)
	return nil
}
func (f *fakePinned) StreamWaitEvent(s Stream, e Event) error {
	f.log("wait %d for %d", s, e)
	return nil
}
func (f *fakePinned) EventSynchronize(e Event) error { f.log("sync %d", e); return nil }
func (f *fakePinned) EventDestroy(e Event) error {
	if e != 0 {
		f.log("destroy event %d", e)
	}
	return nil
}
func (f *fakePinned) CopyHtoD(dst uintptr, src unsafe.Pointer, bytes int, s Stream) error {
	f.copied = append(f.copied, slices.Clone(unsafe.Slice((*byte)(src), bytes)))
	f.log("copy %d bytes to %s on %d", bytes, f.ptrs[dst], s)
	return nil
}

// TestUploaderOrdering drives an Uploader of two slots over the fake
// driver and checks the exact sequence of driver calls: each copy on the
// copy stream, an event after it that the compute stream waits for, a
// slot's second copy waiting for the event its Release recorded on the
// compute stream (and the first copy waiting for nothing), a full ring
// refused, and Close synchronizing the copies before freeing everything.
func TestUploaderOrdering(t *testing.T) {
	b, _ := newRecordingBackend(t)
	f := newFakePinned()
	const compute = Stream(7)
	settled := 0
	u, err := newUploader(f, b, compute, 2, 16, tensor.Uint8, func() error { settled++; return nil },
		func(buf tensor.Buffer) uintptr { return b.ptr("upload", buf, buf.DType) })
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range u.slots {
		f.ptrs[b.ptr("test", s.t.Buffer(), tensor.Uint8)] = fmt.Sprintf("slot%d", i)
	}
	// Streams and events: copy stream 101, slot 0 released 102 copied 103,
	// slot 1 released 104 copied 105.
	pb, err := newPinnedBuffer(f, 16)
	if err != nil {
		t.Fatal(err)
	}
	f.calls = nil
	fill := func(v byte) {
		for i := range pb.Bytes() {
			pb.Bytes()[i] = v
		}
	}
	step := func(what string, fn func() error, want ...string) {
		t.Helper()
		f.calls = nil
		if err := fn(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if !slices.Equal(f.calls, want) {
			t.Errorf("%s: driver calls\n  %s\nwant\n  %s", what, strings.Join(f.calls, "\n  "), strings.Join(want, "\n  "))
		}
	}
	upload := func(want int, bytes int) func() error {
		return func() error {
			slot, x, err := u.Upload(pb, bytes)
			if err == nil && (slot != want || x.Len() != 16) {
				err = fmt.Errorf("slot %d of %d elements, want slot %d of 16", slot, x.Len(), want)
			}
			return err
		}
	}
	fill(1)
	step("first upload", upload(0, 16), "copy 16 bytes to slot0 on 101", "record 103 on 101", "wait 7 for 103")
	fill(2)
	step("second upload", upload(1, 5), "copy 5 bytes to slot1 on 101", "record 105 on 101", "wait 7 for 105")
	if _, _, err := u.Upload(pb, 16); err == nil || !strings.Contains(err.Error(), "not released") {
		t.Errorf("upload into a full ring: error %v, want one saying the slot was not released", err)
	}
	step("release", func() error { return u.Release(0) }, "record 102 on 7")
	if settled != 1 {
		t.Errorf("Release joined the side lane %d times, want 1", settled)
	}
	if err := u.Release(0); err == nil {
		t.Error("a second Release of the same upload: no error")
	}
	step("wait copied", func() error { return u.WaitCopied(1) }, "sync 105")
	fill(3)
	step("reuse of slot 0", upload(0, 16), "wait 101 for 102", "copy 16 bytes to slot0 on 101", "record 103 on 101", "wait 7 for 103")
	for i, want := range [][]byte{slices.Repeat([]byte{1}, 16), slices.Repeat([]byte{2}, 5), slices.Repeat([]byte{3}, 16)} {
		if !slices.Equal(f.copied[i], want) {
			t.Errorf("copy %d read %v, want %v", i, f.copied[i], want)
		}
	}
	for _, bad := range []int{0, 17} {
		if _, _, err := u.Upload(pb, bad); err == nil {
			t.Errorf("upload of %d bytes into 16-byte slots: no error", bad)
		}
	}
	step("close", u.Close, "sync 103", "sync 105", "destroy event 102", "destroy event 103", "destroy event 104", "destroy event 105", "destroy stream 101")
	if _, _, err := u.Upload(pb, 1); err == nil {
		t.Error("upload after Close: no error")
	}
	step("free", pb.Free, "hostfree")
	step("free again", pb.Free)
	if _, _, err := u.Upload(pb, 1); err == nil {
		t.Error("upload from a freed buffer: no error")
	}
	if _, err := newPinnedBuffer(f, 0); err == nil {
		t.Error("pinned buffer of 0 bytes: no error")
	}
}

// TestGPUPinnedUpload copies batches through pinned memory and the
// uploader's stream into three slots, reading each on the backend's stream
// (a gather of the slot and a download), over more rounds than slots, with
// the pinned buffers refilled as soon as their copy is done.
func TestGPUPinnedUpload(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	const n, rounds = 1 << 20, 12
	u, err := b.NewUploader(3, n, tensor.Uint8)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := b.Synchronize(); err != nil {
			t.Error(err)
		}
		if err := u.Close(); err != nil {
			t.Error(err)
		}
	}()
	var pins [2]*PinnedBuffer
	for i := range pins {
		if pins[i], err = b.Device().NewPinnedBuffer(n); err != nil {
			t.Fatal(err)
		}
		defer pins[i].Free()
	}
	want := func(round, i int) byte { return byte(round*31 + i*7 + i>>9) }
	lastSlot := [2]int{-1, -1}
	for r := 0; r < rounds; r++ {
		pin := pins[r%2]
		if s := lastSlot[r%2]; s >= 0 {
			if err := u.WaitCopied(s); err != nil {
				t.Fatal(err)
			}
		}
		for i := range pin.Bytes() {
			pin.Bytes()[i] = want(r, i)
		}
		slot, x, err := u.Upload(pin, n)
		if err != nil {
			t.Fatalf("round %d: %v", r, err)
		}
		lastSlot[r%2] = slot
		s := tensor.NewScope()
		rows := x.Reshape(n/1024, 1, 32, 32)
		idx := tensor.FromInt32(b, s, []int32{0, int32(n/1024 - 1)}, 2)
		g := tensor.GatherNormalize(s, rows, idx, 1, 0).Float32s()
		if err := u.Release(slot); err != nil {
			t.Fatal(err)
		}
		for i, v := range g {
			src := i
			if i >= 1024 {
				src = n - 2048 + i
			}
			if v != float32(want(r, src)) {
				t.Fatalf("round %d: gathered element %d is %g, want %d", r, i, v, want(r, src))
			}
		}
		s.Release()
	}
}

// cpuCopyDriver is fakePinned whose copies land in CPU-backend tensors, so
// that data goes end to end through an Uploader without a GPU (the CPU
// backend runs everything at once, so this checks data, not ordering).
type cpuCopyDriver struct {
	*fakePinned
	bufs map[uintptr]tensor.Buffer
}

func (c *cpuCopyDriver) ptr(buf tensor.Buffer) uintptr {
	for p, b := range c.bufs {
		if b == buf {
			return p
		}
	}
	p := uintptr(0x1000 * (len(c.bufs) + 1))
	c.bufs[p] = buf
	return p
}

func (c *cpuCopyDriver) CopyHtoD(dst uintptr, src unsafe.Pointer, bytes int, _ Stream) error {
	buf, ok := c.bufs[dst]
	if !ok || bytes%4 != 0 || bytes > 4*buf.Len || buf.DType != tensor.Float32 {
		return fmt.Errorf("fake: copy of %d bytes to %#x", bytes, dst)
	}
	tensor.CPU.Upload(buf.Slice(0, bytes/4), slices.Clone(unsafe.Slice((*float32)(src), bytes/4)))
	return nil
}

// TestPipelineThroughPinnedFake runs feedThroughPinned on the CPU backend
// through the fake driver.
func TestPipelineThroughPinnedFake(t *testing.T) {
	c := &cpuCopyDriver{fakePinned: newFakePinned(), bufs: map[uintptr]tensor.Buffer{}}
	u, err := newUploader(c, tensor.CPU, 1, 2, 1<<12, tensor.Float32, func() error { return nil }, c.ptr)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	feedThroughPinned(t, u, 1<<12, func(bytes int) (*PinnedBuffer, error) { return newPinnedBuffer(c, bytes) })
}

// TestGPUPipelineThroughPinned runs feedThroughPinned on the GPU.
func TestGPUPipelineThroughPinned(t *testing.T) {
	b := newGPUBackend(t, BackendOptions{})
	const elems = 1 << 16
	u, err := b.NewUploader(2, elems, tensor.Float32)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	feedThroughPinned(t, u, elems, b.Device().NewPinnedBuffer)
}

// feedThroughPinned feeds batches built on the host by a data.Pipeline
// through pinned buffers and the Uploader: the workers fill buffers taken
// from a free list, the consumer uploads each batch, computes on it (a sum
// on the backend) and hands the buffer back once its copy is done. Every
// batch's sum must be the host's.
func feedThroughPinned(t *testing.T, u *Uploader, elems int, newPinned func(bytes int) (*PinnedBuffer, error)) {
	const batches, depth = 40, 3
	free := make(chan *PinnedBuffer, depth+2) // the workers' Depth, the one uploading, the one in flight
	for range cap(free) {
		pb, err := newPinned(4 * elems)
		if err != nil {
			t.Fatal(err)
		}
		defer pb.Free()
		free <- pb
	}
	type batch struct {
		buf  *PinnedBuffer
		want float64
	}
	p, err := data.NewPipeline(context.Background(), batches, data.PipelineOptions{Workers: 2, Depth: depth},
		func(ctx context.Context, i int) (batch, error) {
			var pb *PinnedBuffer
			select {
			case pb = <-free:
			case <-ctx.Done():
				return batch{}, ctx.Err()
			}
			var sum float64
			vals := pb.Float32s()[:elems]
			for j := range vals {
				vals[j] = float32((i*7 + j) % 16) // integers: every partial sum is below 2^24, exact
				sum += float64(vals[j])
			}
			return batch{pb, sum}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	i := 0
	for bt, ok := p.Next(); ok; bt, ok = p.Next() {
		slot, x, err := u.Upload(bt.buf, 4*elems)
		if err != nil {
			t.Fatal(err)
		}
		sum := tensor.Sum(x) // x has no scope: sum is released below
		if err := u.Release(slot); err != nil {
			t.Fatal(err)
		}
		if err := u.WaitCopied(slot); err != nil {
			t.Fatal(err)
		}
		free <- bt.buf
		got := sum.Item()
		sum.Release()
		if float64(got) != bt.want {
			t.Fatalf("batch %d: sum %g on the backend, %g on the host", i, got, bt.want)
		}
		i++
	}
	if p.Err() != nil || i != batches {
		t.Fatalf("%d batches, error %v", i, p.Err())
	}
}
