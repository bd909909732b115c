package driver

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
)

// On-disk cache of compiled kernels.
//
// Device.Compile keys every compilation by SHA-256 over (source, options,
// NVRTC version, target architecture) and stores the resulting CUBIN or
// PTX under the cache directory, one file per key. A second Compile of the
// same source with the same options, compiler and GPU architecture (in this
// process or a later one) loads the stored image and runs no compiler.
//
// The directory is os.UserCacheDir()/ember/kernels (on Linux
// $XDG_CACHE_HOME/ember/kernels or ~/.cache/ember/kernels) unless the
// Device is given another (Device.SetKernelCache, KernelCacheFor: a
// directory, or "off" to disable caching; package cuda's
// BackendOptions.KernelCache, which commands set from EMBER_KERNEL_CACHE).
// The library reads no environment variable. Files are written atomically (temporary file + rename),
// so concurrent processes never see a partial entry; each file carries a
// checksum of its payload, and an entry that is unreadable, truncated,
// corrupt or rejected by the driver is ignored, recompiled and overwritten.

// ImageKind says what a compiled kernel image contains.
type ImageKind byte

const (
	ImageCUBIN ImageKind = 'C' // a cubin (ELF) for one SM architecture (or a fatbin given to LoadModule)
	ImagePTX   ImageKind = 'P' // NUL-terminated PTX text, JIT-compiled by the driver
)

func (k ImageKind) String() string {
	switch k {
	case ImageCUBIN:
		return "cubin"
	case ImagePTX:
		return "ptx"
	}
	return fmt.Sprintf("ImageKind(%d)", byte(k))
}

// KernelStats counts kernel compilations and cache traffic for the whole
// process.
type KernelStats struct {
	Compiles      int64 // NVRTC compilations run
	CacheHits     int64 // modules loaded from the disk cache
	CacheMisses   int64 // lookups that found no usable entry
	CacheBadEntry int64 // entries found but unreadable, corrupt or rejected by the driver
	CacheWriteErr int64 // entries that could not be written
	BundleHits    int64 // modules loaded from a kernel bundle (LoadBundled)
	BundleMisses  int64 // sources a bundle held no image of (changed since it was made, or another GPU)
	BundleBad     int64 // bundle images damaged or rejected by the driver
}

var kstats struct {
	compiles, hits, misses, bad, writeErr atomic.Int64
	bundleHits, bundleMisses, bundleBad   atomic.Int64
}

// ReadKernelStats returns the process-wide kernel counters.
func ReadKernelStats() KernelStats {
	return KernelStats{
		Compiles:      kstats.compiles.Load(),
		CacheHits:     kstats.hits.Load(),
		CacheMisses:   kstats.misses.Load(),
		CacheBadEntry: kstats.bad.Load(),
		CacheWriteErr: kstats.writeErr.Load(),
		BundleHits:    kstats.bundleHits.Load(),
		BundleMisses:  kstats.bundleMisses.Load(),
		BundleBad:     kstats.bundleBad.Load(),
	}
}

// KernelCache is a directory of compiled kernel images. A nil *KernelCache
// is a valid, disabled cache.
type KernelCache struct {
	dir string
}

// NewKernelCache returns a cache rooted at dir (created on first write).
func NewKernelCache(dir string) *KernelCache { return &KernelCache{dir: dir} }

var (
	defaultCacheOnce sync.Once
	defaultCache     *KernelCache
)

// DefaultKernelCache is the cache new Devices use:
// os.UserCacheDir()/ember/kernels; nil when no cache directory can be
// determined.
func DefaultKernelCache() *KernelCache {
	defaultCacheOnce.Do(func() {
		if dir, ok := kernelCacheDir(""); ok {
			defaultCache = NewKernelCache(dir)
		}
	})
	return defaultCache
}

// KernelCacheFor is the cache that a setting (a command's flag or
// environment variable) names: "" the default (DefaultKernelCache); "off",
// "0", "false", "none" or "disabled" none (nil); anything else a directory.
func KernelCacheFor(setting string) *KernelCache {
	if strings.TrimSpace(setting) == "" {
		return DefaultKernelCache()
	}
	if dir, ok := kernelCacheDir(setting); ok {
		return NewKernelCache(dir)
	}
	return nil
}

// kernelCacheDir interprets a cache setting (KernelCacheFor).
func kernelCacheDir(v string) (dir string, enabled bool) {
	v = strings.TrimSpace(v)
	switch strings.ToLower(v) {
	case "off", "0", "false", "none", "disabled":
		return "", false
	case "":
		ucd, err := os.UserCacheDir()
		if err != nil || ucd == "" {
			return "", false
		}
		return filepath.Join(ucd, "ember", "kernels"), true
	}
	return v, true
}

// Dir is the cache directory ("" for a nil cache).
func (c *KernelCache) Dir() string {
	if c == nil {
		return ""
	}
	return c.dir
}

// cacheKey is the hex SHA-256 of the compile inputs (sourceKey).
func cacheKey(src string, opts []string, nvrtcVersion, arch string) string {
	return sourceKey("ember-kernel-cache-v1", src, opts, nvrtcVersion, arch)
}

// sourceKey is the hex SHA-256 of a kind tag, a source, its compile
// options and more fields. Each field is length prefixed (the options
// after their count) so that no two different inputs encode alike (e.g.
// options {"-a b"} and {"-a", "b"}).
func sourceKey(tag, src string, opts []string, more ...string) string {
	h := sha256.New()
	var n [8]byte
	put := func(s string) {
		binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	put(tag)
	put(src)
	binary.LittleEndian.PutUint64(n[:], uint64(len(opts)))
	h.Write(n[:])
	for _, o := range opts {
		put(o)
	}
	for _, m := range more {
		put(m)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Entry file layout:
//
//	magic   "EMBERKC1"  8 bytes
//	kind    1 byte      'C' or 'P'
//	length  8 bytes     payload length, little endian
//	sum     32 bytes    SHA-256 of the payload
//	payload
const (
	cacheMagic     = "EMBERKC1"
	cacheHeaderLen = 8 + 1 + 8 + 32
	maxCacheEntry  = 1 << 30
)

func (c *KernelCache) path(key string) string { return filepath.Join(c.dir, key+".kc") }

func validKey(key string) bool {
	if len(key) != 64 {
		return false
	}
	_, err := hex.DecodeString(key)
	return err == nil
}

// Get returns the image stored under key. ok is false when there is no
// entry or the entry is unreadable or corrupt (a corrupt file is removed).
func (c *KernelCache) Get(key string) (image []byte, kind ImageKind, ok bool) {
	if c == nil || c.dir == "" || !validKey(key) {
		return nil, 0, false
	}
	p := c.path(key)
	data, err := os.ReadFile(p)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			kstats.bad.Add(1)
		}
		return nil, 0, false
	}
	img, k, err := decodeCacheEntry(data)
	if err != nil {
		kstats.bad.Add(1)
		_ = os.Remove(p)
		return nil, 0, false
	}
	return img, k, true
}

func decodeCacheEntry(data []byte) ([]byte, ImageKind, error) {
	if len(data) < cacheHeaderLen || string(data[:8]) != cacheMagic {
		return nil, 0, errors.New("bad header")
	}
	k := ImageKind(data[8])
	if k != ImageCUBIN && k != ImagePTX {
		return nil, 0, errors.New("bad kind")
	}
	n := binary.LittleEndian.Uint64(data[9:17])
	payload := data[cacheHeaderLen:]
	if uint64(len(payload)) != n {
		return nil, 0, errors.New("bad length")
	}
	sum := sha256.Sum256(payload)
	if !bytes.Equal(sum[:], data[17:49]) {
		return nil, 0, errors.New("bad checksum")
	}
	return payload, k, nil
}

func encodeCacheEntry(kind ImageKind, image []byte) []byte {
	out := make([]byte, cacheHeaderLen+len(image))
	copy(out, cacheMagic)
	out[8] = byte(kind)
	binary.LittleEndian.PutUint64(out[9:17], uint64(len(image)))
	sum := sha256.Sum256(image)
	copy(out[17:49], sum[:])
	copy(out[cacheHeaderLen:], image)
	return out
}

// Put stores image under key atomically: it writes a temporary file in the
// cache directory and renames it over the entry.
func (c *KernelCache) Put(key string, kind ImageKind, image []byte) error {
	if c == nil || c.dir == "" {
		return nil
	}
	if !validKey(key) {
		return fmt.Errorf("cuda: kernel cache: invalid key %q", key)
	}
	if kind != ImageCUBIN && kind != ImagePTX {
		return fmt.Errorf("cuda: kernel cache: invalid image kind %v", kind)
	}
	if len(image) == 0 || len(image) > maxCacheEntry {
		return fmt.Errorf("cuda: kernel cache: image size %d out of range", len(image))
	}
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return fmt.Errorf("cuda: kernel cache: %w", err)
	}
	f, err := os.CreateTemp(c.dir, ".tmp-"+key[:16]+"-*")
	if err != nil {
		return fmt.Errorf("cuda: kernel cache: %w", err)
	}
	tmp := f.Name()
	_, werr := f.Write(encodeCacheEntry(kind, image))
	cerr := f.Close()
	if werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, c.path(key))
	}
	if werr != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("cuda: kernel cache: %w", werr)
	}
	return nil
}

// Remove deletes the entry for key, if any.
func (c *KernelCache) Remove(key string) {
	if c == nil || c.dir == "" || !validKey(key) {
		return
	}
	_ = os.Remove(c.path(key))
}
