package driver

// Virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap):
// the driver side of the allocator's expandable segments. Every page gets its
// own physical allocation, so that pages can be unmapped one at a time.

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"
)

// cuMemAllocationProp and cuMemAccessDesc mirror CUmemAllocationProp and
// CUmemAccessDesc (cuda.h) on 64-bit platforms.
type cuMemAllocationProp struct {
	typ           int32 // CUmemAllocationType
	handleTypes   int32 // CUmemAllocationHandleType
	locationType  int32 // CUmemLocation.type
	locationID    int32 // CUmemLocation.id
	win32Metadata uintptr
	allocFlags    [8]byte // compressionType, gpuDirectRDMACapable, usage, reserved
}

type cuMemAccessDesc struct {
	locationType int32
	locationID   int32
	flags        int32 // CUmemAccess_flags
}

const (
	cuMemAllocationTypePinned  = 1 // CU_MEM_ALLOCATION_TYPE_PINNED
	cuMemLocationTypeDevice    = 1 // CU_MEM_LOCATION_TYPE_DEVICE
	cuMemAccessProtReadWrite   = 3 // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
	cuMemAllocGranularityMinim = 0 // CU_MEM_ALLOC_GRANULARITY_MINIMUM
)

// pageTable remembers the physical allocation behind every mapped page.
type pageTable struct {
	mu      sync.Mutex
	page    int // granularity, once asked
	handles map[uintptr]uint64
}

func (d *Device) allocationProp() cuMemAllocationProp {
	return cuMemAllocationProp{typ: cuMemAllocationTypePinned, locationType: cuMemLocationTypeDevice, locationID: d.dev}
}

// VirtualMemorySupported says whether the device and driver offer virtual
// memory management, which the allocator's expandable segments need.
func (d *Device) VirtualMemorySupported() bool { return d.vmm }

// PageSize is the granularity of MapPages (cuMemGetAllocationGranularity,
// minimum; 2 MiB on current GPUs). It is 0 when virtual memory management is
// not supported.
func (d *Device) PageSize() int {
	if !d.vmm {
		return 0
	}
	d.pages.mu.Lock()
	defer d.pages.mu.Unlock()
	if d.pages.page == 0 {
		var g uintptr
		prop := d.allocationProp()
		err := d.Do(func() error {
			return cuCheck("cuMemGetAllocationGranularity", CCall(cuDrv.cuMemGetAllocationGranularity,
				uintptr(unsafe.Pointer(&g)), uintptr(unsafe.Pointer(&prop)), cuMemAllocGranularityMinim))
		})
		if err != nil || g == 0 || g&(g-1) != 0 {
			g = 2 << 20
		}
		d.pages.page = int(g)
	}
	return d.pages.page
}

var errNoVMM = errors.New("cuda: virtual memory management is not supported on this device")

// ReserveAddress reserves bytes (a multiple of PageSize) of device address
// space with nothing mapped (cuMemAddressReserve).
func (d *Device) ReserveAddress(bytes int) (uintptr, error) {
	if !d.vmm {
		return 0, errNoVMM
	}
	page := d.PageSize()
	if bytes <= 0 || bytes%page != 0 {
		return 0, fmt.Errorf("cuda: ReserveAddress(%d): not a positive multiple of the %d-byte page", bytes, page)
	}
	var p uintptr
	err := d.Do(func() error {
		return cuCheck("cuMemAddressReserve", CCall(cuDrv.cuMemAddressReserve, uintptr(unsafe.Pointer(&p)), uintptr(bytes), uintptr(page), 0, 0))
	})
	return p, err
}

// FreeAddress releases a range from ReserveAddress (cuMemAddressFree).
func (d *Device) FreeAddress(ptr uintptr, bytes int) error {
	if !d.vmm {
		return errNoVMM
	}
	return d.Do(func() error {
		return cuCheck("cuMemAddressFree", CCall(cuDrv.cuMemAddressFree, ptr, uintptr(bytes)))
	})
}

// MapPages backs [ptr, ptr+bytes), whole unmapped pages of a reserved
// range, with new device memory readable and writable by this device: one
// cuMemCreate and cuMemMap per page, then cuMemSetAccess. It maps all pages
// or none; when the device is out of memory the error wraps
// ErrDeviceOutOfMemory.
func (d *Device) MapPages(ptr uintptr, bytes int) error {
	if !d.vmm {
		return errNoVMM
	}
	page := d.PageSize()
	if bytes <= 0 || bytes%page != 0 || ptr%uintptr(page) != 0 {
		return fmt.Errorf("cuda: MapPages(%#x, %d): not whole %d-byte pages", ptr, bytes, page)
	}
	d.pages.mu.Lock()
	defer d.pages.mu.Unlock()
	if d.pages.handles == nil {
		d.pages.handles = make(map[uintptr]uint64)
	}
	prop := d.allocationProp()
	var mapped []uintptr
	err := d.Do(func() error {
		for q := ptr; q < ptr+uintptr(bytes); q += uintptr(page) {
			if _, ok := d.pages.handles[q]; ok {
				return fmt.Errorf("cuda: MapPages: page %#x is already mapped", q)
			}
			var h uint64
			if err := cuCheck("cuMemCreate", CCall(cuDrv.cuMemCreate, uintptr(unsafe.Pointer(&h)), uintptr(page), uintptr(unsafe.Pointer(&prop)), 0)); err != nil {
				return err
			}
			if err := cuCheck("cuMemMap", CCall(cuDrv.cuMemMap, q, uintptr(page), 0, uintptr(h), 0)); err != nil {
				CCall(cuDrv.cuMemRelease, uintptr(h))
				return err
			}
			d.pages.handles[q] = h
			mapped = append(mapped, q)
		}
		access := cuMemAccessDesc{locationType: cuMemLocationTypeDevice, locationID: d.dev, flags: cuMemAccessProtReadWrite}
		return cuCheck("cuMemSetAccess", CCall(cuDrv.cuMemSetAccess, ptr, uintptr(bytes), uintptr(unsafe.Pointer(&access)), 1))
	})
	if err != nil && len(mapped) > 0 {
		// Nothing used these pages yet: give them back at once.
		if uerr := d.unmapLocked(mapped, page); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}
	return err
}

// UnmapPages waits for the device to finish the work queued so far (the
// pages may still be in use by it) and releases the memory behind
// [ptr, ptr+bytes), mapped by MapPages.
func (d *Device) UnmapPages(ptr uintptr, bytes int) error {
	if !d.vmm {
		return errNoVMM
	}
	page := d.PageSize()
	if bytes <= 0 || bytes%page != 0 || ptr%uintptr(page) != 0 {
		return fmt.Errorf("cuda: UnmapPages(%#x, %d): not whole %d-byte pages", ptr, bytes, page)
	}
	d.pages.mu.Lock()
	defer d.pages.mu.Unlock()
	var pages []uintptr
	for q := ptr; q < ptr+uintptr(bytes); q += uintptr(page) {
		if _, ok := d.pages.handles[q]; !ok {
			return fmt.Errorf("cuda: UnmapPages: page %#x is not mapped", q)
		}
		pages = append(pages, q)
	}
	if err := d.SynchronizeDevice(); err != nil {
		return err
	}
	return d.unmapLocked(pages, page)
}

// unmapLocked unmaps and releases pages; d.pages.mu is held.
func (d *Device) unmapLocked(pages []uintptr, page int) error {
	return d.Do(func() error {
		var errs []error
		for _, q := range pages {
			h := d.pages.handles[q]
			if err := cuCheck("cuMemUnmap", CCall(cuDrv.cuMemUnmap, q, uintptr(page))); err != nil {
				errs = append(errs, err)
				continue
			}
			delete(d.pages.handles, q)
			if err := cuCheck("cuMemRelease", CCall(cuDrv.cuMemRelease, uintptr(h))); err != nil {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	})
}
