package cuda

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/ember-ml/ember/tensor"
)

// Page-locked host memory and uploads that overlap compute, for data sets
// that live on the host (too large for the device, or decoded per epoch):
// the host fills a PinnedBuffer (data.Pipeline's workers, say), an
// Uploader copies it to the device on a stream of its own while the
// backend's stream computes, and the backend's stream waits for the copy,
// through an event, only where it reads the batch.
//
// Neither works inside a CUDA graph capture: the copies are queued from
// the host, batch by batch.

// PinnedBuffer is page-locked host memory (cuMemHostAlloc): the GPU's DMA
// engine reads it directly, so an asynchronous copy from it returns at
// once and runs beside kernels, where one from ordinary (pageable) memory
// is staged by the driver first.
type PinnedBuffer struct {
	drv   pinnedDriver
	p     unsafe.Pointer
	bytes int
}

// NewPinnedBuffer allocates bytes of page-locked host memory.
func (d *Device) NewPinnedBuffer(bytes int) (*PinnedBuffer, error) { return newPinnedBuffer(d, bytes) }

func newPinnedBuffer(drv pinnedDriver, bytes int) (*PinnedBuffer, error) {
	if bytes <= 0 {
		return nil, fmt.Errorf("cuda: pinned buffer of %d bytes; want a positive size", bytes)
	}
	p, err := drv.memHostAlloc(bytes)
	if err != nil {
		return nil, err
	}
	return &PinnedBuffer{drv: drv, p: p, bytes: bytes}, nil
}

// Bytes is the buffer's memory, valid until Free.
func (pb *PinnedBuffer) Bytes() []byte {
	if pb.p == nil {
		return nil
	}
	return unsafe.Slice((*byte)(pb.p), pb.bytes)
}

// Float32s is the buffer's memory as float32 values (cuMemHostAlloc's
// memory is page aligned), valid until Free.
func (pb *PinnedBuffer) Float32s() []float32 {
	if pb.p == nil {
		return nil
	}
	return unsafe.Slice((*float32)(pb.p), pb.bytes/4)
}

// Len is the size in bytes.
func (pb *PinnedBuffer) Len() int { return pb.bytes }

// Free returns the memory to the driver (cuMemFreeHost). No copy from it
// may be in flight. Free of a freed buffer does nothing.
func (pb *PinnedBuffer) Free() error {
	if pb.p == nil {
		return nil
	}
	p := pb.p
	pb.p = nil
	return pb.drv.memFreeHost(p)
}

// pinnedDriver is what pinned memory and the Uploader need of the driver:
// a *Device, or a fake in the tests.
type pinnedDriver interface {
	memHostAlloc(bytes int) (unsafe.Pointer, error)
	memFreeHost(p unsafe.Pointer) error
	NewStream() (Stream, error)
	DestroyStream(s Stream) error
	NewEvent(timing bool) (Event, error)
	RecordEvent(e Event, s Stream) error
	StreamWaitEvent(s Stream, e Event) error
	EventSynchronize(e Event) error
	EventDestroy(e Event) error
	CopyHtoD(dst uintptr, src unsafe.Pointer, bytes int, s Stream) error
}

// A *Device is a pinnedDriver through these two.
func (d *Device) memHostAlloc(bytes int) (unsafe.Pointer, error) { return d.MemHostAlloc(bytes) }
func (d *Device) memFreeHost(p unsafe.Pointer) error             { return d.MemFreeHost(p) }

// Uploader copies pinned host buffers into a ring of device slots on a
// copy stream of its own. Upload queues the copy behind the slot's last
// release and makes the backend's stream wait for the copy; the consumer
// calls Release once the work reading the slot is queued, so that the
// copy into the slot's next batch waits for that work on the device (and
// not for everything queued since). With two or more slots the copy of
// batch k+1 runs while batch k computes. One goroutine uses an Uploader.
type Uploader struct {
	drv     pinnedDriver
	compute Stream // the backend's stream
	copy    Stream // the uploader's own
	settle  func() error
	ptr     func(tensor.Buffer) uintptr
	slots   []uploadSlot
	next    int
	closed  bool
}

type uploadSlot struct {
	t        *tensor.Tensor // the device memory, owned by the Uploader
	released Event          // recorded on the compute stream by Release
	copied   Event          // recorded on the copy stream after the copy
	busy     bool           // uploaded and not yet released
	used     bool           // released at least once: copies wait for released
}

// NewUploader makes an uploader of slots device buffers of elems elements
// of dt each, on b's device.
func (b *Backend) NewUploader(slots, elems int, dt tensor.DType) (*Uploader, error) {
	if b.dev == nil {
		return nil, errors.New("cuda: NewUploader: the backend has no device")
	}
	return newUploader(b.dev, b, b.stream, slots, elems, dt, b.x.settle, func(buf tensor.Buffer) uintptr { return b.ptr("upload", buf, buf.DType) })
}

func newUploader(drv pinnedDriver, b tensor.Backend, compute Stream, slots, elems int, dt tensor.DType,
	settle func() error, ptr func(tensor.Buffer) uintptr) (u *Uploader, err error) {
	if slots < 1 || elems < 1 {
		return nil, fmt.Errorf("cuda: uploader of %d slots of %d elements; want at least one of each", slots, elems)
	}
	u = &Uploader{drv: drv, compute: compute, settle: settle, ptr: ptr}
	defer func() {
		if err != nil {
			err = errors.Join(err, u.Close())
		}
	}()
	if u.copy, err = drv.NewStream(); err != nil {
		return u, err
	}
	for range slots {
		s := uploadSlot{}
		if err = tensor.Guard(func() { s.t = tensor.EmptyOf(b, nil, dt, elems) }); err != nil {
			return u, err
		}
		u.slots = append(u.slots, s)
		sl := &u.slots[len(u.slots)-1]
		if sl.released, err = drv.NewEvent(false); err != nil {
			return u, err
		}
		if sl.copied, err = drv.NewEvent(false); err != nil {
			return u, err
		}
	}
	return u, nil
}

// Upload copies the first bytes of src into the next slot and returns the
// slot's tensor (1-D, elems elements; bytes may cover part of it): work
// queued on the backend after Upload sees the data. src must not be
// written until WaitCopied(slot) returns. Uploading into a slot that was
// not released is an error (the ring is full: Release the oldest first).
func (u *Uploader) Upload(src *PinnedBuffer, bytes int) (slot int, t *tensor.Tensor, err error) {
	if u.closed {
		return 0, nil, errors.New("cuda: Upload on a closed uploader")
	}
	s := &u.slots[u.next]
	buf := s.t.Buffer()
	if bytes <= 0 || bytes > src.Len() || bytes > buf.Len*buf.DType.Size() {
		return 0, nil, fmt.Errorf("cuda: Upload of %d bytes from a %d-byte pinned buffer into a %d-byte slot", bytes, src.Len(), buf.Len*buf.DType.Size())
	}
	if src.p == nil {
		return 0, nil, errors.New("cuda: Upload from a freed pinned buffer")
	}
	if s.busy {
		return 0, nil, fmt.Errorf("cuda: Upload into slot %d, which was not released (all %d slots in use)", u.next, len(u.slots))
	}
	if s.used {
		if err := u.drv.StreamWaitEvent(u.copy, s.released); err != nil {
			return 0, nil, err
		}
	}
	if err := u.drv.CopyHtoD(u.ptr(buf), src.p, bytes, u.copy); err != nil {
		return 0, nil, err
	}
	if err := u.drv.RecordEvent(s.copied, u.copy); err != nil {
		return 0, nil, err
	}
	if err := u.drv.StreamWaitEvent(u.compute, s.copied); err != nil {
		return 0, nil, err
	}
	s.busy = true
	slot = u.next
	u.next = (u.next + 1) % len(u.slots)
	return slot, s.t, nil
}

// WaitCopied blocks until the copy into slot has finished reading its
// pinned buffer, which may then be refilled.
func (u *Uploader) WaitCopied(slot int) error {
	if slot < 0 || slot >= len(u.slots) {
		return fmt.Errorf("cuda: WaitCopied of slot %d of %d", slot, len(u.slots))
	}
	return u.drv.EventSynchronize(u.slots[slot].copied)
}

// Release marks the end of the work that reads slot: everything queued on
// the backend so far (the side lane's tasks joined first). The slot's next
// copy waits for that work on the device.
func (u *Uploader) Release(slot int) error {
	if slot < 0 || slot >= len(u.slots) {
		return fmt.Errorf("cuda: Release of slot %d of %d", slot, len(u.slots))
	}
	s := &u.slots[slot]
	if !s.busy {
		return fmt.Errorf("cuda: Release of slot %d, which holds no upload", slot)
	}
	if err := u.settle(); err != nil {
		return err
	}
	if err := u.drv.RecordEvent(s.released, u.compute); err != nil {
		return err
	}
	s.busy, s.used = false, true
	return nil
}

// Close waits for the copies, then frees the slots, events and the copy
// stream. Work on the backend still reading a slot must be finished (or the
// backend synchronized) first.
func (u *Uploader) Close() error {
	if u.closed {
		return nil
	}
	u.closed = true
	var errs []error
	if u.copy != 0 {
		for _, s := range u.slots {
			if s.copied != 0 {
				errs = append(errs, u.drv.EventSynchronize(s.copied))
			}
		}
	}
	for _, s := range u.slots {
		if s.t != nil {
			s.t.Release()
		}
		errs = append(errs, u.drv.EventDestroy(s.released), u.drv.EventDestroy(s.copied))
	}
	if u.copy != 0 {
		errs = append(errs, u.drv.DestroyStream(u.copy))
	}
	return errors.Join(errs...)
}
