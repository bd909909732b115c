package parallel

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// The rendezvous tests run over 127.0.0.1 only, on a port the kernel
// picks, with timeouts of about a second, so each ends within a few
// seconds even when it fails.

// listenLocal opens 127.0.0.1 on a free port.
func listenLocal(t *testing.T) (net.Listener, int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln, ln.Addr().(*net.TCPAddr).Port
}

func localEnv(rank, world, port int, token string) Environment {
	return Environment{Rank: rank, WorldSize: world, MasterAddr: "127.0.0.1", MasterPort: port, RendezvousPort: port, RunToken: token, Launcher: "test"}
}

// rendezvousAll runs the ranks given (rank 0 on ln when listed) and
// returns each one's payload and error.
func rendezvousAll(t *testing.T, ln net.Listener, port int, envs []Environment, payload []byte, timeout time.Duration) ([][]byte, []error) {
	t.Helper()
	got, errs, _ := rendezvousTimed(t, ln, envs, payload, timeout)
	return got, errs
}

// rendezvousTimed is rendezvousAll that also returns how long each rank
// took to return.
func rendezvousTimed(t *testing.T, ln net.Listener, envs []Environment, payload []byte, timeout time.Duration) ([][]byte, []error, []time.Duration) {
	t.Helper()
	got := make([][]byte, len(envs))
	errs := make([]error, len(envs))
	took := make([]time.Duration, len(envs))
	var wg sync.WaitGroup
	opt := RendezvousOptions{Timeout: timeout, RetryInterval: 20 * time.Millisecond}
	start := time.Now()
	for i, e := range envs {
		wg.Go(func() {
			if e.Rank == 0 {
				got[i], errs[i] = ServeRendezvous(context.Background(), ln, e, payload, opt)
			} else {
				got[i], errs[i] = Rendezvous(context.Background(), e, nil, opt)
			}
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	return got, errs, took
}

func TestRendezvous(t *testing.T) {
	ln, port := listenLocal(t)
	payload := bytes.Repeat([]byte{0xab, 0x01}, 64) // 128 bytes, as an NCCL id
	var envs []Environment
	for r := 3; r >= 0; r-- { // rank 0 last: the others retry until it listens
		envs = append(envs, localEnv(r, 4, port, "run-1"))
	}
	start := time.Now()
	got, errs := rendezvousAll(t, ln, port, envs, payload, 5*time.Second)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", envs[i].Rank, err)
		}
		if !bytes.Equal(got[i], payload) {
			t.Errorf("rank %d got % x, want % x", envs[i].Rank, got[i], payload)
		}
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("a rendezvous of 4 local ranks took %v", d)
	}
}

// Rank 0 listening itself on Environment.Address (the launcher's path).
func TestRendezvousListens(t *testing.T) {
	ln, port := listenLocal(t)
	ln.Close() // free it for Rendezvous; another process taking it meanwhile is unlikely
	errs := make([]error, 2)
	got := make([][]byte, 2)
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			got[r], errs[r] = Rendezvous(context.Background(), localEnv(r, 2, port, ""), []byte("id"), RendezvousOptions{Timeout: 5 * time.Second, RetryInterval: 20 * time.Millisecond})
		})
	}
	wg.Wait()
	for r := range 2 {
		if errs[r] != nil || string(got[r]) != "id" {
			t.Errorf("rank %d: %q, %v", r, got[r], errs[r])
		}
	}
}

// checkOneLine asserts that every error exists, is one line and holds want.
func checkOneLine(t *testing.T, errs []error, envs []Environment, want string) {
	t.Helper()
	for i, err := range errs {
		if err == nil {
			t.Errorf("rank %d: no error, want %q", envs[i].Rank, want)
			continue
		}
		if !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("rank %d: %q, want one line containing %q", envs[i].Rank, err, want)
		}
	}
}

func TestRendezvousMissingRank(t *testing.T) {
	ln, port := listenLocal(t)
	// Ranks 0, 1 and 3 of 4 come; rank 2 never does.
	envs := []Environment{localEnv(0, 4, port, ""), localEnv(1, 4, port, ""), localEnv(3, 4, port, "")}
	start := time.Now()
	_, errs := rendezvousAll(t, ln, port, envs, []byte("x"), time.Second)
	// Every rank that came says the same line, naming rank 2.
	checkOneLine(t, errs, envs, "rank 2 of 4 never arrived within 1s")
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("the failed rendezvous took %v with a 1 s timeout", d)
	}
}

func TestRendezvousMissingRankZero(t *testing.T) {
	_, port := listenLocal(t) // listening, never accepting: connections hang
	ln2, port2 := listenLocal(t)
	ln2.Close() // nobody listens: connections are refused
	for _, p := range []int{port, port2} {
		envs := []Environment{localEnv(1, 2, p, "")}
		start := time.Now()
		_, errs := rendezvousAll(t, nil, p, envs, nil, 500*time.Millisecond)
		if d := time.Since(start); d > 4*time.Second {
			t.Errorf("port %d: waited %v for rank 0 with a 0.5 s timeout", p, d)
		}
		for _, err := range errs {
			if err == nil || !strings.Contains(err.Error(), "rank 0") || strings.Contains(err.Error(), "\n") {
				t.Errorf("port %d: %v, want one line naming rank 0", p, err)
			}
		}
	}
}

func TestRendezvousWrongWorldSize(t *testing.T) {
	ln, port := listenLocal(t)
	envs := []Environment{localEnv(0, 3, port, ""), localEnv(1, 3, port, ""), localEnv(2, 4, port, "")}
	_, errs, took := rendezvousTimed(t, ln, envs, []byte("x"), 5*time.Second)
	// Rank 0 refuses at once (not at the deadline), and tells rank 2. Rank
	// 1 is not timed: when it comes after the refusal it finds no rank 0
	// and retries until its own deadline, as it would before rank 0 starts.
	for _, i := range []int{0, 2} {
		if took[i] > 3*time.Second {
			t.Errorf("rank %d: a wrong world size took %v to be refused", envs[i].Rank, took[i])
		}
	}
	checkOneLine(t, errs[:1], envs[:1], "rank 2 has world size 4, rank 0 has 3")
	checkOneLine(t, errs[2:], envs[2:], "rank 2 has world size 4, rank 0 has 3")
	// Rank 1 may have arrived before rank 2 (and hears the verdict) or
	// after it (and finds rank 0 gone): either way it fails, naming rank 0.
	checkOneLine(t, errs[1:2], envs[1:2], "rank")
}

func TestRendezvousWrongRun(t *testing.T) {
	ln, port := listenLocal(t)
	envs := []Environment{localEnv(0, 2, port, "job-a"), localEnv(1, 2, port, "job-b")}
	_, errs := rendezvousAll(t, ln, port, envs, []byte("x"), 5*time.Second)
	checkOneLine(t, errs, envs, `rank 1 belongs to run "job-b", rank 0 to run "job-a"`)
}

// A stray connection (a port scanner, a health check) is ignored.
func TestRendezvousIgnoresStrangers(t *testing.T) {
	ln, port := listenLocal(t)
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
	defer c.Close()
	envs := []Environment{localEnv(0, 2, port, ""), localEnv(1, 2, port, "")}
	got, errs := rendezvousAll(t, ln, port, envs, []byte("ok"), 5*time.Second)
	for i := range envs {
		if errs[i] != nil || string(got[i]) != "ok" {
			t.Errorf("rank %d: %q, %v", envs[i].Rank, got[i], errs[i])
		}
	}
}

func TestRendezvousCancelled(t *testing.T) {
	_, port := listenLocal(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := Rendezvous(ctx, localEnv(1, 2, port, ""), nil, RendezvousOptions{Timeout: time.Minute})
	if err == nil || time.Since(start) > 5*time.Second {
		t.Errorf("cancelled rendezvous: %v after %v", err, time.Since(start))
	}
}

// A rank 0 that cannot start the job (no NCCL, say) tells every rank why,
// at once, instead of leaving them to wait for the deadline.
func TestRendezvousRefused(t *testing.T) {
	ln, port := listenLocal(t)
	ln.Close()
	cause := errors.New("NCCL not found: tried libnccl.so.2")
	envs := []Environment{localEnv(0, 3, port, ""), localEnv(1, 3, port, ""), localEnv(2, 3, port, "")}
	errs := make([]error, 3)
	var wg sync.WaitGroup
	start := time.Now()
	opt := RendezvousOptions{Timeout: 5 * time.Second, RetryInterval: 20 * time.Millisecond}
	for i, e := range envs {
		wg.Go(func() {
			if e.Rank == 0 {
				errs[i] = RefuseRendezvous(context.Background(), e, cause, opt)
			} else {
				_, errs[i] = Rendezvous(context.Background(), e, nil, opt)
			}
		})
	}
	wg.Wait()
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("the refusal took %v", d)
	}
	checkOneLine(t, errs, envs, "NCCL not found: tried libnccl.so.2")
	checkOneLine(t, errs[1:], envs[1:], "rank 0 cannot start the job")
}
