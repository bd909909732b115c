package parallel

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// LaunchOptions configure Launch.
type LaunchOptions struct {
	NProcPerNode int // processes on this machine, one per GPU (required)
	NNodes       int // machines (default 1)
	NodeRank     int // this machine's index, 0 to NNodes-1

	// MasterAddr and MasterPort are where rank 0 (on node 0) listens for
	// the rendezvous. Defaults on one machine: 127.0.0.1 and a free port
	// the kernel picks; several machines must set both.
	MasterAddr string
	MasterPort int

	Env []string // extra environment for every process, "K=V"
	// RankEnv, when not nil, gives extra environment for the process of
	// rank (local: its index on this machine), after Env: a variable that
	// must differ between ranks (NCCL_HOSTID for two ranks on one GPU).
	RankEnv        func(rank, local int) []string
	Stdout, Stderr io.Writer // the processes' output (default: this process's)

	// Grace is how long processes may take to exit after the signal that
	// ends them (SIGINT forwarded, or SIGTERM after another rank failed)
	// before they are killed (default 30 s: enough to save a checkpoint).
	Grace time.Duration
}

// ErrInterrupted is returned by Launch when ctx ended the run (SIGINT) and
// every process exited cleanly or as interrupted (status 0 or 130).
var ErrInterrupted = errors.New("parallel: interrupted")

// Launch starts NProcPerNode copies of argv on this machine, one per GPU,
// with the variables torchrun would set (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, plus EMBER_RENDEZVOUS_PORT
// and a fresh EMBER_RUN_TOKEN), and supervises them: when one exits with
// an error, the others get SIGTERM (then SIGKILL after Grace) and Launch
// returns one line naming the rank; when ctx is cancelled (the caller's
// SIGINT), every process gets SIGINT, so that they stop together and rank
// 0 saves once. It is what train --nproc-per-node N is to run on; across
// machines, run it on each with NNodes, NodeRank and the same master.
func Launch(ctx context.Context, argv []string, opt LaunchOptions) error {
	if len(argv) == 0 {
		return errors.New("parallel: Launch of no command")
	}
	if opt.NNodes == 0 {
		opt.NNodes = 1
	}
	if opt.NProcPerNode < 1 || opt.NNodes < 1 || opt.NodeRank < 0 || opt.NodeRank >= opt.NNodes {
		return fmt.Errorf("parallel: Launch: %d processes per node, node %d of %d", opt.NProcPerNode, opt.NodeRank, opt.NNodes)
	}
	if opt.Grace <= 0 {
		opt.Grace = 30 * time.Second
	}
	if opt.Stdout == nil {
		opt.Stdout = os.Stdout
	}
	if opt.Stderr == nil {
		opt.Stderr = os.Stderr
	}
	// The processes write at the same time: a writer that is not a file
	// (whose writes the kernel orders) gets one lock for all of them. Files
	// are passed as they are, so that a terminal stays a terminal.
	var mu sync.Mutex
	opt.Stdout, opt.Stderr = serialized(opt.Stdout, &mu), serialized(opt.Stderr, &mu)
	if opt.MasterAddr == "" {
		if opt.NNodes > 1 {
			return errors.New("parallel: Launch on several nodes needs the master's address")
		}
		opt.MasterAddr = "127.0.0.1"
	}
	if opt.MasterPort == 0 {
		if opt.NNodes > 1 {
			return errors.New("parallel: Launch on several nodes needs the master's port")
		}
		p, err := freeLocalPort()
		if err != nil {
			return err
		}
		opt.MasterPort = p
	}
	token := make([]byte, 8)
	rand.Read(token)
	world := opt.NProcPerNode * opt.NNodes
	type exit struct {
		rank int
		err  error
	}
	exits := make(chan exit, opt.NProcPerNode)
	procs := map[int]*exec.Cmd{}
	for local := range opt.NProcPerNode {
		rank := opt.NodeRank*opt.NProcPerNode + local
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Stdout, cmd.Stderr = opt.Stdout, opt.Stderr
		cmd.Env = append(append(os.Environ(), opt.Env...),
			"RANK="+strconv.Itoa(rank), "WORLD_SIZE="+strconv.Itoa(world),
			"LOCAL_RANK="+strconv.Itoa(local), "LOCAL_WORLD_SIZE="+strconv.Itoa(opt.NProcPerNode),
			"MASTER_ADDR="+opt.MasterAddr, "MASTER_PORT="+strconv.Itoa(opt.MasterPort),
			"EMBER_RENDEZVOUS_PORT="+strconv.Itoa(opt.MasterPort),
			"EMBER_RUN_TOKEN="+hex.EncodeToString(token), "EMBER_LAUNCHER=ember",
		)
		if opt.RankEnv != nil {
			cmd.Env = append(cmd.Env, opt.RankEnv(rank, local)...)
		}
		if err := cmd.Start(); err != nil {
			for _, p := range procs {
				p.Process.Kill()
				p.Wait()
			}
			return fmt.Errorf("parallel: starting rank %d: %v", rank, err)
		}
		procs[rank] = cmd
		go func() { exits <- exit{rank, cmd.Wait()} }()
	}

	var first error // the first failure, the one reported
	interrupted := false
	var killAt <-chan time.Time
	signalAll := func(sig os.Signal) {
		for _, p := range procs {
			p.Process.Signal(sig)
		}
		if killAt == nil {
			killAt = time.After(opt.Grace)
		}
	}
	done := ctx.Done()
	for len(procs) > 0 {
		select {
		case <-done:
			done = nil
			interrupted = true
			signalAll(os.Interrupt)
		case <-killAt:
			for rank, p := range procs {
				p.Process.Kill()
				if first == nil {
					first = fmt.Errorf("parallel: rank %d did not exit within %v of the signal and was killed", rank, opt.Grace)
				}
			}
		case e := <-exits:
			delete(procs, e.rank)
			if e.err == nil || (interrupted && exitCode(e.err) == 130) {
				continue
			}
			if first == nil && !isSignalledByUs(e.err, killAt != nil) {
				first = fmt.Errorf("parallel: rank %d (of %d) failed: %v; stopping the others", e.rank, world, e.err)
				signalAll(syscall.SIGTERM)
			}
		}
	}
	if first != nil {
		return first
	}
	if interrupted {
		return ErrInterrupted
	}
	return nil
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func serialized(w io.Writer, mu *sync.Mutex) io.Writer {
	if _, ok := w.(*os.File); ok {
		return w
	}
	return lockedWriter{mu, w}
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// isSignalledByUs reports an exit caused by our SIGTERM/SIGKILL, after
// another rank failed or an interrupt: not a failure of its own.
func isSignalledByUs(err error, signalled bool) bool {
	var ee *exec.ExitError
	if !signalled || !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled()
}

func freeLocalPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("parallel: finding a free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
