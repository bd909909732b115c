package driver

import (
	"errors"
	"unsafe"
)

// Page-locked host memory (cuMemHostAlloc): the GPU's DMA engine reads it
// directly, so an asynchronous copy from it returns at once and runs beside
// kernels, where one from ordinary (pageable) memory is staged by the
// driver first. Package cuda's PinnedBuffer and Uploader build on it.

// ErrNoPinned is returned by MemHostAlloc when the driver lacks the calls.
var ErrNoPinned = errors.New("cuda: the driver has no cuMemHostAlloc/cuMemFreeHost")

// MemHostAlloc allocates bytes of page-locked host memory (cuMemHostAlloc),
// to be freed with MemFreeHost.
func (d *Device) MemHostAlloc(bytes int) (unsafe.Pointer, error) {
	if cuDrv.cuMemHostAlloc == 0 || cuDrv.cuMemFreeHost == 0 {
		return nil, ErrNoPinned
	}
	if err := d.enter(); err != nil {
		return nil, err
	}
	var p unsafe.Pointer
	r := CCall(cuDrv.cuMemHostAlloc, uintptr(unsafe.Pointer(&p)), uintptr(bytes), 0)
	d.leave()
	if err := cuCheck("cuMemHostAlloc", r); err != nil {
		return nil, err
	}
	return p, nil
}

// MemFreeHost frees memory from MemHostAlloc (cuMemFreeHost).
func (d *Device) MemFreeHost(p unsafe.Pointer) error {
	if err := d.enter(); err != nil {
		return err
	}
	r := CCall(cuDrv.cuMemFreeHost, uintptr(p))
	d.leave()
	return cuCheck("cuMemFreeHost", r)
}
