package parallel

import (
	"context"
	"errors"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The launcher tests re-execute the test binary as the ranks: each child
// runs TestLaunchChild, which reads its environment, meets the others
// through the rendezvous on 127.0.0.1 and then does what EMBER_LAUNCH_CHILD
// says.

func TestLaunchChild(t *testing.T) {
	mode := os.Getenv("EMBER_LAUNCH_CHILD")
	if mode == "" {
		t.Skip("only a child of the launcher tests")
	}
	env, err := EnvironmentFromOS()
	if err != nil {
		t.Fatal(err)
	}
	if mode == "fail" && env.Rank == 1 {
		os.Exit(3) // dies before the rendezvous: the others would wait for it
	}
	var interrupt chan os.Signal
	if mode == "interrupt" {
		interrupt = make(chan os.Signal, 1)
		signal.Notify(interrupt, os.Interrupt)
	}
	if _, err := Rendezvous(context.Background(), env, []byte("id"), RendezvousOptions{Timeout: time.Minute, RetryInterval: 20 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if mode == "interrupt" {
		os.WriteFile(os.Getenv("EMBER_LAUNCH_READY")+"."+strconv.Itoa(env.Rank), nil, 0o644)
		<-interrupt
		os.Exit(130) // as train does after saving
	}
}

func launchChildren(t *testing.T, ctx context.Context, mode string, n int, extra ...string) (string, error) {
	t.Helper()
	var out strings.Builder
	err := Launch(ctx, []string{os.Args[0], "-test.run=^TestLaunchChild$", "-test.count=1"}, LaunchOptions{
		NProcPerNode: n,
		Env:          append([]string{"EMBER_LAUNCH_CHILD=" + mode}, extra...),
		Stdout:       &out, Stderr: &out,
		Grace: 5 * time.Second,
	})
	return out.String(), err
}

func TestLaunch(t *testing.T) {
	start := time.Now()
	if out, err := launchChildren(t, context.Background(), "ok", 3); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("3 local ranks took %v", d)
	}
}

// Rank 1 dies; ranks 0 and 2 wait for it in the rendezvous (timeout a
// minute) until the launcher stops them: Launch returns at once with one
// line naming rank 1.
func TestLaunchRankFails(t *testing.T) {
	start := time.Now()
	out, err := launchChildren(t, context.Background(), "fail", 3)
	if err == nil || !strings.Contains(err.Error(), "rank 1 (of 3) failed: exit status 3") || strings.Contains(err.Error(), "\n") {
		t.Errorf("Launch: %v, want one line naming rank 1\n%s", err, out)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("took %v to stop the job", d)
	}
}

// Cancelling the context (the launcher's SIGINT) reaches every rank, which
// exit as interrupted.
func TestLaunchInterrupt(t *testing.T) {
	ready := t.TempDir() + "/ready"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		// Interrupt once both ranks are past the rendezvous.
		for {
			_, e0 := os.Stat(ready + ".0")
			_, e1 := os.Stat(ready + ".1")
			if e0 == nil && e1 == nil {
				cancel()
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	timer := time.AfterFunc(60*time.Second, cancel) // bound the test even if readiness never comes
	defer timer.Stop()
	out, err := launchChildren(t, ctx, "interrupt", 2, "EMBER_LAUNCH_READY="+ready)
	if !errors.Is(err, ErrInterrupted) {
		t.Errorf("Launch: %v, want ErrInterrupted\n%s", err, out)
	}
}
