package cuda

import (
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ember-ml/ember/cuda/driver"
)

// GPU test support. Tests that need a GPU call requireGPU, which returns a
// shared Device (ordinal 0, or $EMBER_TEST_DEVICE) or skips the test when no
// GPU is usable. With EMBER_REQUIRE_GPU=1 the skip becomes a failure, so a
// run on a GPU machine in which everything skipped cannot look green.
// EMBER_KERNEL_CACHE sets the shared Device's kernel cache.

var (
	gpuOnce    sync.Once
	gpuDev     *Device
	gpuSkipErr error // no usable GPU: skip (or fail under EMBER_REQUIRE_GPU=1)
	gpuOpenErr error // a GPU is there but could not be opened: always fail
)

func requireGPU(t testing.TB) *Device {
	t.Helper()
	gpuOnce.Do(func() {
		if err := Available(); err != nil {
			gpuSkipErr = err
			return
		}
		ordinal := 0
		if v := os.Getenv("EMBER_TEST_DEVICE"); v != "" {
			for _, c := range v {
				if c < '0' || c > '9' {
					ordinal = -1
					break
				}
				ordinal = ordinal*10 + int(c-'0')
			}
		}
		gpuDev, gpuOpenErr = Open(ordinal)
		// The library reads no variable; the tests map this one as the
		// commands do (BackendOptions.KernelCache).
		if v := os.Getenv("EMBER_KERNEL_CACHE"); gpuOpenErr == nil && v != "" {
			gpuDev.SetKernelCache(KernelCacheFor(v))
		}
	})
	if gpuOpenErr != nil {
		t.Fatalf("a CUDA device is available but Open failed: %v", gpuOpenErr)
	}
	if gpuSkipErr != nil {
		if os.Getenv("EMBER_REQUIRE_GPU") == "1" {
			t.Fatalf("EMBER_REQUIRE_GPU=1 but no usable CUDA device: %v", gpuSkipErr)
		}
		t.Skipf("no CUDA device: %v", gpuSkipErr)
	}
	return gpuDev
}

func gpuCheck(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// rowMajorGemm checks a GEMM's arguments for the recording executors
// (driver.CheckRowMajorGemm).
func rowMajorGemm(transA, transB bool, m, n, k, lda, ldb, ldc int) (struct{}, error) {
	return struct{}{}, driver.CheckRowMajorGemm(transA, transB, m, n, k, lda, ldb, ldc)
}

// wallMicros is the wall time of one call of f in µs: warm calls, then
// iters timed between device synchronisations.
func wallMicros(t testing.TB, b *Backend, warm, iters int, f func()) float64 {
	t.Helper()
	for range warm {
		f()
	}
	gpuCheck(t, b.Synchronize())
	start := time.Now()
	for range iters {
		f()
	}
	gpuCheck(t, b.Synchronize())
	return float64(time.Since(start).Microseconds()) / float64(iters)
}
