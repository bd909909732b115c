package driver

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestCacheKey(t *testing.T) {
	base := cacheKey("src", []string{"-O3"}, "12.4", "sm_90")
	if len(base) != 64 || !validKey(base) {
		t.Fatalf("key %q is not 64 hex digits", base)
	}
	if cacheKey("src", []string{"-O3"}, "12.4", "sm_90") != base {
		t.Error("key is not deterministic")
	}
	differs := map[string]string{
		"source":  cacheKey("src ", []string{"-O3"}, "12.4", "sm_90"),
		"options": cacheKey("src", []string{"-O2"}, "12.4", "sm_90"),
		"no opts": cacheKey("src", nil, "12.4", "sm_90"),
		"nvrtc":   cacheKey("src", []string{"-O3"}, "12.5", "sm_90"),
		"arch":    cacheKey("src", []string{"-O3"}, "12.4", "sm_80"),
	}
	seen := map[string]string{base: "base"}
	for what, k := range differs {
		if prev, dup := seen[k]; dup {
			t.Errorf("changing the %s gives the same key as %s", what, prev)
		}
		seen[k] = what
	}
	// Field boundaries are unambiguous.
	if cacheKey("a", []string{"-x y"}, "1", "s") == cacheKey("a", []string{"-x", "y"}, "1", "s") {
		t.Error(`options {"-x y"} and {"-x", "y"} collide`)
	}
	if cacheKey("ab", nil, "c", "d") == cacheKey("a", nil, "bc", "d") {
		t.Error("source/version boundary is ambiguous")
	}
}

func TestKernelCachePutGet(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nested", "kernels") // created on first Put
	c := NewKernelCache(dir)
	key := cacheKey("k", nil, "12.4", "sm_90")
	if _, _, ok := c.Get(key); ok {
		t.Fatal("hit in an empty cache")
	}
	img := []byte("\x7fELF fake cubin \x00\x01\x02")
	if err := c.Put(key, ImageCUBIN, img); err != nil {
		t.Fatal(err)
	}
	got, kind, ok := c.Get(key)
	if !ok || kind != ImageCUBIN || !bytes.Equal(got, img) {
		t.Fatalf("Get = %q, %v, %v", got, kind, ok)
	}
	// Overwrite with PTX.
	ptx := []byte(".version 8.0\n.target sm_90\n\x00")
	if err := c.Put(key, ImagePTX, ptx); err != nil {
		t.Fatal(err)
	}
	got, kind, ok = c.Get(key)
	if !ok || kind != ImagePTX || !bytes.Equal(got, ptx) {
		t.Fatalf("after overwrite Get = %q, %v, %v", got, kind, ok)
	}
	// No temporary files are left behind.
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 || entries[0].Name() != key+".kc" {
		names := []string{}
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("cache dir holds %v, want just %s.kc", names, key)
	}
}

func TestKernelCacheCorruptEntries(t *testing.T) {
	c := NewKernelCache(t.TempDir())
	key := cacheKey("k", nil, "12.4", "sm_90")
	img := bytes.Repeat([]byte("cubin"), 100)
	good := encodeCacheEntry(ImageCUBIN, img)
	corrupt := map[string][]byte{
		"empty":       {},
		"truncated":   good[:len(good)-1],
		"header only": good[:cacheHeaderLen-3],
		"bad magic":   append([]byte("XMBERKC1"), good[8:]...),
		"bad kind":    func() []byte { b := bytes.Clone(good); b[8] = 'Z'; return b }(),
		"flipped bit": func() []byte { b := bytes.Clone(good); b[len(b)-7] ^= 0x10; return b }(),
		"bad length":  func() []byte { b := bytes.Clone(good); b[9]++; return b }(),
		"extra bytes": append(bytes.Clone(good), 0),
	}
	for what, data := range corrupt {
		before := ReadKernelStats().CacheBadEntry
		if err := os.WriteFile(c.path(key), data, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, _, ok := c.Get(key); ok {
			t.Errorf("%s entry accepted", what)
		}
		if _, err := os.Stat(c.path(key)); !os.IsNotExist(err) {
			t.Errorf("%s entry was not removed", what)
		}
		if ReadKernelStats().CacheBadEntry != before+1 {
			t.Errorf("%s entry not counted", what)
		}
	}
	// After a corrupt entry, Put restores a good one.
	if err := c.Put(key, ImageCUBIN, img); err != nil {
		t.Fatal(err)
	}
	if got, _, ok := c.Get(key); !ok || !bytes.Equal(got, img) {
		t.Error("rewritten entry not readable")
	}
	// An unreadable entry (a directory in its place) is a miss, not a crash.
	key2 := cacheKey("k2", nil, "12.4", "sm_90")
	if err := os.Mkdir(c.path(key2), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := c.Get(key2); ok {
		t.Error("directory read as an entry")
	}
}

func TestKernelCacheRejects(t *testing.T) {
	c := NewKernelCache(t.TempDir())
	key := cacheKey("k", nil, "1", "s")
	if err := c.Put("../escape", ImagePTX, []byte("x")); err == nil {
		t.Error("invalid key accepted")
	}
	if err := c.Put(key, ImageKind('Q'), []byte("x")); err == nil {
		t.Error("invalid kind accepted")
	}
	if err := c.Put(key, ImagePTX, nil); err == nil {
		t.Error("empty image accepted")
	}
	if _, _, ok := c.Get("../../etc/passwd"); ok {
		t.Error("invalid key looked up")
	}
	var nilCache *KernelCache
	if err := nilCache.Put(key, ImagePTX, []byte("x")); err != nil {
		t.Error("Put on a disabled cache must be a no-op")
	}
	if _, _, ok := nilCache.Get(key); ok || nilCache.Dir() != "" {
		t.Error("nil cache must be empty")
	}
	nilCache.Remove(key)
}

func TestKernelCacheUnwritableDir(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root ignores directory permissions")
	}
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o500); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(dir, 0o700)
	c := NewKernelCache(dir)
	if err := c.Put(cacheKey("k", nil, "1", "s"), ImagePTX, []byte("x")); err == nil {
		t.Error("write into a read-only directory reported success")
	}
}

func TestKernelCacheConcurrentPut(t *testing.T) {
	c := NewKernelCache(t.TempDir())
	key := cacheKey("k", nil, "1", "s")
	img := bytes.Repeat([]byte{0xab}, 1<<16)
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(2)
		go func() { defer wg.Done(); _ = c.Put(key, ImageCUBIN, img) }()
		go func() {
			defer wg.Done()
			// A reader sees either no entry or a complete one, never a torn one.
			if got, _, ok := c.Get(key); ok && !bytes.Equal(got, img) {
				t.Error("torn read")
			}
		}()
	}
	wg.Wait()
	if got, _, ok := c.Get(key); !ok || !bytes.Equal(got, img) {
		t.Error("final entry wrong")
	}
}

func TestKernelCacheSetting(t *testing.T) {
	for _, off := range []string{"off", "OFF", " off ", "0", "false", "none"} {
		if _, ok := kernelCacheDir(off); ok {
			t.Errorf("setting %q did not disable the cache", off)
		}
		if c := KernelCacheFor(off); c != nil {
			t.Errorf("KernelCacheFor(%q) = %v, want none", off, c.Dir())
		}
	}
	if dir, ok := kernelCacheDir("/tmp/my-kernels"); !ok || dir != "/tmp/my-kernels" {
		t.Errorf("explicit dir: %q %v", dir, ok)
	}
	if c := KernelCacheFor("/tmp/my-kernels"); c == nil || c.Dir() != "/tmp/my-kernels" {
		t.Errorf("KernelCacheFor(dir) = %v", c)
	}
	if KernelCacheFor("") != DefaultKernelCache() {
		t.Error(`KernelCacheFor("") is not the default cache`)
	}
	t.Setenv("XDG_CACHE_HOME", "/tmp/xdg-test")
	dir, ok := kernelCacheDir("")
	if !ok || dir != filepath.Join("/tmp/xdg-test", "ember", "kernels") {
		t.Errorf("default dir = %q %v", dir, ok)
	}
	if !strings.HasSuffix(dir, filepath.Join("ember", "kernels")) {
		t.Errorf("default dir %q", dir)
	}
}

func TestImageKindString(t *testing.T) {
	if ImageCUBIN.String() != "cubin" || ImagePTX.String() != "ptx" || ImageKind(1).String() == "" {
		t.Error("ImageKind.String")
	}
}
