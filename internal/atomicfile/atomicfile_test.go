package atomicfile

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

func TestWriteFileReplaces(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "x.bin")
	for i, s := range []string{"first", "second, longer", "3"} {
		if err := WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(p)
		if err != nil || string(got) != s {
			t.Fatalf("write %d: read %q, %v; want %q", i, got, err, s)
		}
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if runtime.GOOS != "windows" && fi.Mode().Perm() != 0o644 {
		t.Errorf("mode %v, want 0644", fi.Mode().Perm())
	}
	assertNoTemps(t, p)
}

func TestWriteErrorLeavesTarget(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "x.bin")
	if err := WriteFile(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := Write(p, 0o644, func(w io.Writer) error {
		w.Write([]byte("partial new content"))
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Write returned %v, want boom", err)
	}
	if got, _ := os.ReadFile(p); string(got) != "old" {
		t.Errorf("target holds %q after a failed write, want \"old\"", got)
	}
	assertNoTemps(t, p)
}

func TestPrepareDiscardAndCommitAll(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	pa, err := Prepare(a, 0o600, func(w io.Writer) error { _, err := io.WriteString(w, "A"); return err })
	if err != nil {
		t.Fatal(err)
	}
	pb, err := Prepare(b, 0o600, func(w io.Writer) error { _, err := io.WriteString(w, "B"); return err })
	if err != nil {
		t.Fatal(err)
	}
	if ts, _ := Temps(a); len(ts) != 1 || ts[0] != pa.TempPath() {
		t.Errorf("Temps(a) = %v, want [%s]", ts, pa.TempPath())
	}
	if _, err := os.Stat(a); err == nil {
		t.Fatal("target exists before Commit")
	}
	if err := CommitAll(pa, pb); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{a: "A", b: "B"} {
		if got, _ := os.ReadFile(p); string(got) != want {
			t.Errorf("%s holds %q, want %q", p, got, want)
		}
		assertNoTemps(t, p)
	}
	if err := pa.Commit(); err == nil {
		t.Error("second Commit succeeded")
	}
	pc, err := Prepare(a, 0o600, func(w io.Writer) error { _, err := io.WriteString(w, "C"); return err })
	if err != nil {
		t.Fatal(err)
	}
	pc.Discard()
	pc.Discard()
	if got, _ := os.ReadFile(a); string(got) != "A" {
		t.Errorf("after Discard the target holds %q, want \"A\"", got)
	}
	assertNoTemps(t, a)
}

func TestWriteMissingDir(t *testing.T) {
	err := WriteFile(filepath.Join(t.TempDir(), "no", "such", "x"), []byte("x"), 0o644)
	if err == nil {
		t.Fatal("write into a missing directory succeeded")
	}
}

func TestRemoveTemps(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "m.safetensors")
	for _, n := range []string{".m.safetensors.tmp-1", ".m.safetensors.tmp-2", ".other.tmp-3", "m.safetensors"} {
		os.WriteFile(filepath.Join(dir, n), nil, 0o644)
	}
	removed, err := RemoveTemps(p)
	if err != nil || len(removed) != 2 {
		t.Fatalf("RemoveTemps = %v, %v; want 2 files", removed, err)
	}
	assertNoTemps(t, p)
	if _, err := os.Stat(filepath.Join(dir, ".other.tmp-3")); err != nil {
		t.Error("RemoveTemps removed another target's temporary file")
	}
}

func assertNoTemps(t *testing.T, path string) {
	t.Helper()
	ts, err := Temps(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 0 {
		t.Errorf("temporary files left: %v", ts)
	}
}

// payload is a self-checking file body: 8-byte sequence number, 8-byte
// length, random bytes of that length, SHA-256 of all that.
func payload(seq uint64, rng *rand.Rand) []byte {
	n := 1 + rng.IntN(512<<10)
	b := binary.LittleEndian.AppendUint64(nil, seq)
	b = binary.LittleEndian.AppendUint64(b, uint64(n))
	body := make([]byte, n)
	for i := range body {
		body[i] = byte(rng.Uint32())
	}
	b = append(b, body...)
	sum := sha256.Sum256(b)
	return append(b, sum[:]...)
}

func checkPayload(b []byte) (uint64, error) {
	if len(b) < 16+32 {
		return 0, fmt.Errorf("%d bytes, too short", len(b))
	}
	seq, n := binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:])
	if uint64(len(b)) != 16+n+32 {
		return 0, fmt.Errorf("%d bytes, header says %d", len(b), 16+n+32)
	}
	sum := sha256.Sum256(b[:16+n])
	if !bytes.Equal(sum[:], b[16+n:]) {
		return 0, errors.New("checksum mismatch")
	}
	return seq, nil
}

const killEnv = "ATOMICFILE_KILL_TEST_TARGET"

// TestKillChild is the child of TestKillDuringWrites: it rewrites the
// target in a loop until it is killed.
func TestKillChild(t *testing.T) {
	target := os.Getenv(killEnv)
	if target == "" {
		t.Skip("only runs as the child of TestKillDuringWrites")
	}
	var seq uint64
	if b, err := os.ReadFile(target); err == nil {
		seq, _ = checkPayload(b)
	}
	rng := rand.New(rand.NewPCG(uint64(os.Getpid()), uint64(time.Now().UnixNano())))
	for {
		seq++
		if err := WriteFile(target, payload(seq, rng), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(3)
		}
	}
}

// TestKillDuringWrites SIGKILLs a process that atomically rewrites a file in
// a loop, at random moments, and checks after each kill that the file is
// complete (one of the versions written, never a torn one) and that at most
// one temporary file (that of the write in flight) is left.
func TestKillDuringWrites(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	target := filepath.Join(t.TempDir(), "state.bin")
	rng := rand.New(rand.NewPCG(1, 2))
	var last uint64
	for round := range 8 {
		seq := killChildAtRandom(t, target, rng, killEnv, "^TestKillChild$", func() bool {
			b, err := os.ReadFile(target)
			if err != nil {
				return false
			}
			v, err := checkPayload(b)
			return err == nil && v > last
		})
		b, err := os.ReadFile(target)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		got, err := checkPayload(b)
		if err != nil {
			t.Fatalf("round %d: torn file after kill: %v", round, err)
		}
		if got < last {
			t.Fatalf("round %d: file went back from version %d to %d", round, last, got)
		}
		last = got
		ts, _ := Temps(target)
		if len(ts) > 1 {
			t.Fatalf("round %d: %d temporary files left after a kill, want at most 1: %v", round, len(ts), ts)
		}
		t.Logf("round %d: killed %v after start; version %d intact; %d temporary file(s) left", round, seq, got, len(ts))
		RemoveTemps(target)
	}
}

// killChildAtRandom starts the test binary running only childTest with
// env=target, waits until started() (the child has written something),
// lets it run a random 0-40 ms more, and kills it.
func killChildAtRandom(t *testing.T, target string, rng *rand.Rand, env, childTest string, started func() bool) time.Duration {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run="+childTest, "-test.count=1")
	cmd.Env = append(os.Environ(), env+"="+target)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if started() {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("child exited early: %v: %s", err, stderr.Bytes())
		case <-time.After(time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("child wrote nothing in 20 s")
		}
	}
	time.Sleep(time.Duration(rng.IntN(40_000)) * time.Microsecond)
	select {
	case err := <-exited:
		t.Fatalf("child exited: %v: %s", err, stderr.Bytes())
	default:
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-exited
	return time.Since(start).Round(time.Millisecond)
}
