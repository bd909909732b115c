package parallel

import (
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ember-ml/ember/tensor"
)

// onTCPRanks runs f on n goroutine ranks joined by NewTCP over loopback.
func onTCPRanks(t *testing.T, n int, timeout time.Duration, f func(c *TCP) error) []error {
	t.Helper()
	port, err := freeLocalPort()
	if err != nil {
		t.Fatal(err)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			env := Environment{Rank: r, WorldSize: n, LocalRank: r, MasterAddr: "127.0.0.1", MasterPort: port, RendezvousPort: port, RunToken: "tcp-test", Launcher: "ember"}
			c, err := NewTCP(context.Background(), env, tensor.CPU, TCPOptions{Timeout: timeout, Rendezvous: RendezvousOptions{Timeout: 10 * time.Second}})
			if err != nil {
				errs[r] = err
				return
			}
			defer c.Close()
			errs[r] = f(c)
		})
	}
	wg.Wait()
	return errs
}

// Every collective gives the same bits as the FakeGroup's on random
// values (both sum in rank order in float32), on every rank.
func TestTCPMatchesFake(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		rng := rand.New(rand.NewPCG(uint64(n), 7))
		inputs := make([][]float32, n)
		for r := range inputs {
			inputs[r] = make([]float32, 1000)
			for i := range inputs[r] {
				inputs[r][i] = float32(rng.NormFloat64() * 1e3)
			}
		}
		run := func(c Communicator) ([]float32, error) {
			x := tensor.FromFloat32(tensor.CPU, nil, inputs[c.Rank()], 1000)
			defer x.Release()
			var out []float32
			for _, op := range []Op{Sum, Average} {
				x.CopyFrom(inputs[c.Rank()])
				if err := c.AllReduce(x.Buffer(), op); err != nil {
					return nil, err
				}
				out = append(out, x.Float32s()...)
			}
			x.CopyFrom(inputs[c.Rank()])
			if err := c.Broadcast(x.Buffer(), n-1); err != nil {
				return nil, err
			}
			out = append(out, x.Float32s()...)
			vals := []float32{float32(c.Rank()) + 0.5}
			if err := c.AllReduceValues(vals, Sum); err != nil {
				return nil, err
			}
			return append(out, vals...), c.Barrier()
		}
		fake := make([][]float32, n)
		for r, err := range onRanks(n, 10*time.Second, func(c *FakeComm) (err error) { fake[c.Rank()], err = run(c); return }) {
			if err != nil {
				t.Fatalf("fake rank %d: %v", r, err)
			}
		}
		got := make([][]float32, n)
		for r, err := range onTCPRanks(t, n, 10*time.Second, func(c *TCP) (err error) { got[c.Rank()], err = run(c); return }) {
			if err != nil {
				t.Fatalf("tcp rank %d of %d: %v", r, n, err)
			}
		}
		for r := range n {
			for i := range fake[0] {
				if got[r][i] != fake[0][i] {
					t.Fatalf("%d ranks: rank %d value %d is %v, the fake's %v", n, r, i, got[r][i], fake[0][i])
				}
			}
		}
	}
}

// A rank that leaves (its process died: the connection closes) ends the
// next collective on every rank with one line naming it.
func TestTCPDeadRank(t *testing.T) {
	errs := onTCPRanks(t, 3, 10*time.Second, func(c *TCP) error {
		if c.Rank() == 2 {
			c.Close()
			return nil
		}
		return c.AllReduceValues([]float32{1}, Sum)
	})
	for r := range 2 {
		if errs[r] == nil || !strings.Contains(errs[r].Error(), "rank 2 closed its connection") {
			t.Errorf("rank %d: %v; want an error naming rank 2", r, errs[r])
		}
	}
}

// A rank that hangs is named after the timeout; ranks calling different
// collectives are named too.
func TestTCPHangAndMismatch(t *testing.T) {
	release := make(chan struct{})
	errs := onTCPRanks(t, 3, 300*time.Millisecond, func(c *TCP) error {
		if c.Rank() == 1 {
			<-release
			return nil
		}
		err := c.AllReduceValues([]float32{1}, Sum)
		if c.Rank() == 0 {
			close(release)
		}
		return err
	})
	for _, r := range []int{0, 2} {
		if errs[r] == nil || !strings.Contains(errs[r].Error(), "rank 1 did not reach collective") {
			t.Errorf("hang: rank %d: %v; want an error naming rank 1", r, errs[r])
		}
	}
	errs = onTCPRanks(t, 2, 10*time.Second, func(c *TCP) error {
		return c.AllReduceValues(make([]float32, 1+c.Rank()), Sum)
	})
	for r := range 2 {
		if errs[r] == nil || !strings.Contains(errs[r].Error(), "rank 1 called all-reduce (sum) of 2 values") {
			t.Errorf("mismatch: rank %d: %v", r, errs[r])
		}
	}
}

var errTest = errors.New("test abort")

// Abort from another goroutine unblocks a collective waiting for a peer.
func TestTCPAbort(t *testing.T) {
	errs := onTCPRanks(t, 2, time.Minute, func(c *TCP) error {
		if c.Rank() == 0 {
			go func() { time.Sleep(100 * time.Millisecond); c.Abort(errTest) }()
			return c.AllReduceValues([]float32{1}, Sum) // rank 1 never comes
		}
		time.Sleep(300 * time.Millisecond)
		return nil
	})
	if errs[0] == nil || !strings.Contains(errs[0].Error(), errTest.Error()) {
		t.Errorf("rank 0 after Abort: %v; want the cause", errs[0])
	}
}

// Rank 0 takes only connections that give this job's token: one of
// another run (or a port scanner) is closed and the wait goes on.
func TestTCPAcceptChecksToken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	env := Environment{WorldSize: 2, RunToken: "ours"}
	c := &TCP{size: 2, conns: make([]net.Conn, 2), opt: TCPOptions{Rendezvous: RendezvousOptions{Timeout: 10 * time.Second}}}
	hello := func(token string) net.Conn {
		conn, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		conn.Write(appendString16(binary.LittleEndian.AppendUint32([]byte(tcpMagic), 1), token))
		return conn
	}
	stranger := hello("theirs")
	defer stranger.Close()
	ours := hello("ours")
	defer ours.Close()
	if err := c.accept(ln, env); err != nil {
		t.Fatal(err)
	}
	defer c.closeAll()
	if c.conns[1] == nil || c.conns[1].RemoteAddr().String() != ours.LocalAddr().String() {
		t.Fatalf("rank 1's connection is %v, want the one with the job's token (%v)", c.conns[1].RemoteAddr(), ours.LocalAddr())
	}
}
