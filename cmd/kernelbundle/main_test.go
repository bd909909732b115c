package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func kb(args ...string) (int, string, string) {
	var out, errOut bytes.Buffer
	code := run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestUsage checks the bad invocations: each exits 2 with a line saying
// what was expected.
func TestUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"-o", "x", "-check", "y"}, {"-check", "a", "extra"}, {"-nope"}} {
		if code, _, errOut := kb(args...); code != 2 || errOut == "" {
			t.Errorf("%q: exit %d, stderr %q; want 2 and a message", args, code, errOut)
		}
	}
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.zip")
	if code, _, errOut := kb("-check", missing); code != 2 || !strings.Contains(errOut, "missing.zip") {
		t.Errorf("-check of a missing file: exit %d, %q", code, errOut)
	}
	junk := filepath.Join(dir, "junk.zip")
	if err := os.WriteFile(junk, []byte("PK\x03\x04 not really"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := kb("-check", junk); code != 2 || !strings.Contains(errOut, "junk.zip") {
		t.Errorf("-check of a damaged file: exit %d, %q", code, errOut)
	}
}

// TestCheck reports on the repository's bundle: it parses, and -strict
// exits 1 exactly when some unit is listed as stale.
func TestCheck(t *testing.T) {
	const bundle = "../../cuda/kernels/bundle.zip"
	code, out, errOut := kb("-check", bundle)
	if code != 0 || !strings.Contains(out, "units") {
		t.Fatalf("-check: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	t.Log(out)
	stale := strings.Contains(out, "stale")
	if code, _, _ := kb("-check", bundle, "-strict"); (code == 1) != stale {
		t.Errorf("-check -strict: exit %d with the report %q", code, out)
	}
}
