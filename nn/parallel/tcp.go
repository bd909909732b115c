package parallel

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ember-ml/ember/tensor"
)

// TCP is a Communicator over plain TCP connections, for when NCCL is not
// there: the CPU backend, in CI and on machines without GPUs. Every rank
// holds one connection to rank 0; a collective sends each rank's values
// to rank 0, which reduces them in rank order (rank 0's, plus rank 1's,
// ...) in float32 and sends the result back. A star and not a ring: its
// sums are the same bits as FakeGroup's whatever the timing, which is what
// lets tests compare a job of processes with one of goroutines, and its
// speed (the whole buffer through rank 0) is no concern at the sizes it
// serves. Values go through the host (Download, Upload), so it works with
// any backend, but it cannot be captured in a CUDA graph.
//
// Faults: a peer that closes its connection (it died) or does not reach a
// collective within Timeout ends the collective on every rank: rank 0
// names the rank in an error it sends to all the others before closing,
// so every rank reports the same one line.
type TCP struct {
	b     tensor.Backend
	rank  int
	size  int
	opt   TCPOptions
	conns []net.Conn // rank 0: conns[r] for r >= 1; others: conns[0] to rank 0
	seq   uint32

	mu     sync.Mutex
	cause  error // why Abort was called
	closed atomic.Bool
}

var _ Communicator = (*TCP)(nil)

// TCPOptions tune NewTCP.
type TCPOptions struct {
	Rendezvous RendezvousOptions
	// Timeout bounds how long a collective waits for the slowest rank
	// (default 5 min): a rank that has not arrived by then is taken as
	// hung, and the job ends.
	Timeout time.Duration
}

// Wire format of a collective: the u32s and float32s little-endian (the
// hosts' own order on every machine this runs on; it is only ever between
// processes of one job), the u16 lengths of strings big-endian (network
// order, as appendString16 writes them for the rendezvous too). After a
// hello of "EMTC", u32 rank, u16 len, the run's token: request (rank r →
// rank 0) "u8 kind, u32 arg, u32 seq, u32 count, count float32s" (a
// broadcast's non-root ranks send no values); answer (rank 0 → rank r)
// "u8 0, count float32s" or "u8 1, u16 len, message" (abortAll's).
const (
	tcpAllReduce = iota + 1
	tcpBroadcast
	tcpBarrier
	tcpMagic = "EMTC"
)

// NewTCP joins the job of env: rank 0 listens on a port of its own
// choosing, hands it to the others through the rendezvous (Rendezvous, at
// env.Address) and accepts one connection from each. It is a collective:
// every rank calls it.
func NewTCP(ctx context.Context, env Environment, b tensor.Backend, opt TCPOptions) (*TCP, error) {
	if opt.Timeout <= 0 {
		opt.Timeout = 5 * time.Minute
	}
	if opt.Rendezvous.Timeout <= 0 {
		opt.Rendezvous.Timeout = 5 * time.Minute
	}
	c := &TCP{b: b, rank: env.Rank, size: env.WorldSize, opt: opt}
	if env.WorldSize == 1 {
		return c, nil
	}
	c.conns = make([]net.Conn, env.WorldSize)
	if env.Rank == 0 {
		// All interfaces (the others reach this machine by MASTER_ADDR),
		// unless MASTER_ADDR says the job is on this machine alone.
		host := ""
		if ip := net.ParseIP(env.MasterAddr); (ip != nil && ip.IsLoopback()) || env.MasterAddr == "localhost" {
			host = env.MasterAddr
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, RefuseRendezvous(ctx, env, fmt.Errorf("listening for the TCP communicator: %v", err), opt.Rendezvous)
		}
		defer ln.Close()
		port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		if _, err := Rendezvous(ctx, env, []byte(port), opt.Rendezvous); err != nil {
			return nil, err
		}
		if err := c.accept(ln, env); err != nil {
			c.closeAll()
			return nil, &RankError{Rank: 0, Err: err}
		}
		return c, nil
	}
	port, err := Rendezvous(ctx, env, nil, opt.Rendezvous)
	if err != nil {
		return nil, err
	}
	d := net.Dialer{Timeout: opt.Rendezvous.Timeout}
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(env.MasterAddr, string(port)))
	if err != nil {
		return nil, &RankError{Rank: env.Rank, Err: fmt.Errorf("connecting to rank 0's TCP communicator: %v", err)}
	}
	hello := binary.LittleEndian.AppendUint32([]byte(tcpMagic), uint32(env.Rank))
	hello = appendString16(hello, env.RunToken)
	conn.SetWriteDeadline(time.Now().Add(opt.Rendezvous.Timeout))
	if _, err := conn.Write(hello); err != nil {
		conn.Close()
		return nil, &RankError{Rank: env.Rank, Err: fmt.Errorf("greeting rank 0's TCP communicator: %v", err)}
	}
	conn.SetWriteDeadline(time.Time{})
	c.conns[0] = conn
	return c, nil
}

// accept takes the connections of ranks 1 to size-1, each naming its rank.
func (c *TCP) accept(ln net.Listener, env Environment) error {
	deadline := time.Now().Add(c.opt.Rendezvous.Timeout)
	ln.(*net.TCPListener).SetDeadline(deadline)
	for n := 1; n < c.size; n++ {
		conn, err := ln.Accept()
		if err != nil {
			return fmt.Errorf("waiting for the TCP connections of the ranks (missing: %s): %v", missingConns(c.conns), err)
		}
		conn.SetReadDeadline(deadline)
		var hello [8]byte
		_, err = io.ReadFull(conn, hello[:])
		var token string
		if err == nil {
			token, err = readString16(conn)
		}
		if err != nil || string(hello[:4]) != tcpMagic || token != env.RunToken {
			conn.Close()
			n-- // not one of this job's ranks (a port scan, another run): wait on
			continue
		}
		r := int(binary.LittleEndian.Uint32(hello[4:]))
		if r < 1 || r >= c.size || c.conns[r] != nil {
			conn.Close()
			return fmt.Errorf("a TCP connection said it is rank %d (world size %d, or a duplicate)", r, c.size)
		}
		conn.SetReadDeadline(time.Time{})
		c.conns[r] = conn
	}
	return nil
}

func missingConns(conns []net.Conn) string {
	var s string
	for r := 1; r < len(conns); r++ {
		if conns[r] == nil {
			if s != "" {
				s += ", "
			}
			s += strconv.Itoa(r)
		}
	}
	return s
}

// Rank is this process's rank.
func (c *TCP) Rank() int { return c.rank }

// Size is the world size.
func (c *TCP) Size() int { return c.size }

// Backend is where the buffers of the collectives live.
func (c *TCP) Backend() tensor.Backend { return c.b }

// AllReduce reduces buf in place over the ranks.
func (c *TCP) AllReduce(buf tensor.Buffer, op Op) error {
	if op != Sum && op != Average {
		return fmt.Errorf("parallel: AllReduce with %v", op)
	}
	host := make([]float32, buf.Len)
	c.b.Download(host, buf)
	if err := c.AllReduceValues(host, op); err != nil {
		return err
	}
	c.b.Upload(buf, host)
	return nil
}

// Broadcast copies root's buf to every rank.
func (c *TCP) Broadcast(buf tensor.Buffer, root int) error {
	if root < 0 || root >= c.size {
		return fmt.Errorf("parallel: Broadcast from root %d of %d ranks", root, c.size)
	}
	host := make([]float32, buf.Len)
	if c.rank == root {
		c.b.Download(host, buf)
	}
	if err := c.collective(tcpBroadcast, uint32(root), host); err != nil {
		return err
	}
	if c.rank != root {
		c.b.Upload(buf, host)
	}
	return nil
}

// AllReduceValues reduces host values in place.
func (c *TCP) AllReduceValues(vals []float32, op Op) error {
	if op != Sum && op != Average {
		return fmt.Errorf("parallel: AllReduce with %v", op)
	}
	return c.collective(tcpAllReduce, uint32(op), vals)
}

// Barrier returns once every rank's queued work is done and all ranks
// have reached it.
func (c *TCP) Barrier() error {
	if err := c.b.Synchronize(); err != nil {
		return err
	}
	return c.collective(tcpBarrier, 0, nil)
}

// AsyncError is nil: the TCP communicator's faults show in the collective
// that meets them.
func (c *TCP) AsyncError() error { return nil }

// Abort closes the connections at once, from any goroutine: a collective
// blocked on one returns an error wrapping cause.
func (c *TCP) Abort(cause error) {
	if cause == nil {
		cause = errors.New("aborted")
	}
	c.mu.Lock()
	if c.cause == nil {
		c.cause = cause
	}
	c.mu.Unlock()
	c.closeAll()
}

// Close closes the connections.
func (c *TCP) Close() error {
	c.closeAll()
	return nil
}

func (c *TCP) closeAll() {
	c.closed.Store(true)
	for _, conn := range c.conns {
		if conn != nil {
			conn.Close()
		}
	}
}

// fail turns err into the job's error on this rank: wrapped with the
// cause of an Abort if there was one, named by rank.
func (c *TCP) fail(err error) error {
	c.mu.Lock()
	cause := c.cause
	c.mu.Unlock()
	if cause != nil {
		err = fmt.Errorf("%v (after an abort: %w)", err, cause)
	}
	return rankError(c.rank, err)
}

// collective runs one collective of kind and arg over vals, in place.
func (c *TCP) collective(kind byte, arg uint32, vals []float32) error {
	if c.closed.Load() {
		return c.fail(errors.New("the TCP communicator is closed or aborted"))
	}
	c.seq++
	if c.size == 1 {
		return nil // a sum, average or broadcast of one rank is itself
	}
	if c.rank == 0 {
		return c.serve(kind, arg, vals)
	}
	return c.join(kind, arg, vals)
}

func tcpHeader(kind byte, arg, seq uint32, n int) []byte {
	h := make([]byte, 13)
	h[0] = kind
	binary.LittleEndian.PutUint32(h[1:], arg)
	binary.LittleEndian.PutUint32(h[5:], seq)
	binary.LittleEndian.PutUint32(h[9:], uint32(n))
	return h
}

func kindName(kind byte, arg uint32) string {
	switch kind {
	case tcpAllReduce:
		return "all-reduce (" + Op(arg).String() + ")"
	case tcpBroadcast:
		return fmt.Sprintf("broadcast from rank %d", arg)
	case tcpBarrier:
		return "barrier"
	}
	return fmt.Sprintf("collective kind %d", kind)
}

// appendFloats appends vals as little-endian float32s.
func appendFloats(b []byte, vals []float32) []byte {
	for _, v := range vals {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

func readFloats(r io.Reader, vals []float32) error {
	buf := make([]byte, 4*len(vals))
	if _, err := io.ReadFull(r, buf); err != nil {
		return err
	}
	for i := range vals {
		vals[i] = math.Float32frombits(binary.LittleEndian.Uint32(buf[4*i:]))
	}
	return nil
}

// sendsValues reports whether rank sends its values in a collective.
func sendsValues(kind byte, arg uint32, rank int) bool {
	return kind == tcpAllReduce || (kind == tcpBroadcast && int(arg) == rank)
}

// serve is rank 0's side: gather, reduce in rank order, answer.
func (c *TCP) serve(kind byte, arg uint32, vals []float32) error {
	deadline := time.Now().Add(c.opt.Timeout)
	result := vals
	if kind == tcpAllReduce {
		result = append([]float32(nil), vals...)
	}
	theirs := make([]float32, len(vals))
	for r := 1; r < c.size; r++ {
		conn := c.conns[r]
		conn.SetReadDeadline(deadline)
		var h [13]byte
		if _, err := io.ReadFull(conn, h[:]); err != nil {
			return c.abortAll(c.peerError(r, "#"+strconv.Itoa(int(c.seq))+" "+kindName(kind, arg), err))
		}
		gk, garg, gseq, gn := h[0], binary.LittleEndian.Uint32(h[1:]), binary.LittleEndian.Uint32(h[5:]), binary.LittleEndian.Uint32(h[9:])
		if gk != kind || garg != arg || gseq != c.seq || int(gn) != len(vals) {
			return c.abortAll(fmt.Errorf("collective #%d: rank %d called %s of %d values (its #%d) where rank 0 called %s of %d",
				c.seq, r, kindName(gk, garg), gn, gseq, kindName(kind, arg), len(vals)))
		}
		if !sendsValues(kind, arg, r) {
			continue
		}
		if err := readFloats(conn, theirs); err != nil {
			return c.abortAll(c.peerError(r, "#"+strconv.Itoa(int(c.seq))+" "+kindName(kind, arg), err))
		}
		if kind == tcpBroadcast {
			copy(result, theirs)
			continue
		}
		for i, v := range theirs {
			result[i] += v
		}
	}
	if kind == tcpAllReduce {
		if Op(arg) == Average {
			for i := range result {
				result[i] /= float32(c.size)
			}
		}
		copy(vals, result)
	}
	// Every rank gets the result, a broadcast's root too: the answer is
	// also what tells a rank that the collective is complete.
	answer := appendFloats([]byte{0}, vals)
	for r := 1; r < c.size; r++ {
		c.conns[r].SetWriteDeadline(deadline)
		if _, err := c.conns[r].Write(answer); err != nil {
			return c.abortAll(c.peerError(r, "answering #"+strconv.Itoa(int(c.seq)), err))
		}
	}
	return nil
}

// peerError says what a failed read or write from rank r means.
func (c *TCP) peerError(r int, what string, err error) error {
	var ne net.Error
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("rank %d closed its connection in collective %s (it exited or died)", r, what)
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("rank %d did not reach collective %s within %v (it hangs or died)", r, what, c.opt.Timeout)
	}
	return fmt.Errorf("rank %d, collective %s: %v", r, what, err)
}

// abortAll tells every other rank why the job ends, closes, and returns
// the error on rank 0.
func (c *TCP) abortAll(err error) error {
	msg := fmt.Sprintf("parallel: rank 0: %v", err)
	if len(msg) > math.MaxUint16 {
		msg = msg[:math.MaxUint16]
	}
	frame := binary.BigEndian.AppendUint16([]byte{1}, uint16(len(msg)))
	frame = append(frame, msg...)
	for r := 1; r < c.size; r++ {
		if conn := c.conns[r]; conn != nil {
			conn.SetWriteDeadline(time.Now().Add(time.Second))
			conn.Write(frame)
		}
	}
	c.closeAll()
	return c.fail(err)
}

// join is the side of a rank > 0: send, then wait for rank 0's answer.
func (c *TCP) join(kind byte, arg uint32, vals []float32) error {
	conn := c.conns[0]
	msg := tcpHeader(kind, arg, c.seq, len(vals))
	if sendsValues(kind, arg, c.rank) {
		msg = appendFloats(msg, vals)
	}
	// Rank 0 waits Timeout for the slowest rank, then answers: allow for it.
	deadline := time.Now().Add(c.opt.Timeout + 10*time.Second)
	conn.SetWriteDeadline(deadline)
	if _, err := conn.Write(msg); err != nil {
		return c.lost(err)
	}
	conn.SetReadDeadline(deadline)
	var status [1]byte
	if _, err := io.ReadFull(conn, status[:]); err != nil {
		return c.lost(err)
	}
	if status[0] != 0 {
		var n [2]byte
		if _, err := io.ReadFull(conn, n[:]); err != nil {
			return c.lost(err)
		}
		text := make([]byte, binary.BigEndian.Uint16(n[:]))
		if _, err := io.ReadFull(conn, text); err != nil {
			return c.lost(err)
		}
		c.closeAll()
		// Rank 0's line names the rank at fault: pass it on as it is.
		return &RankError{Rank: 0, Err: errors.New(trimRankPrefix(string(text)))}
	}
	if err := readFloats(conn, vals); err != nil {
		return c.lost(err)
	}
	return nil
}

func trimRankPrefix(s string) string {
	const p = "parallel: rank 0: "
	if len(s) >= len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}

func (c *TCP) lost(err error) error {
	c.closeAll()
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return c.fail(fmt.Errorf("collective #%d: no answer from rank 0 within %v (it hangs or died)", c.seq, c.opt.Timeout))
	}
	return c.fail(fmt.Errorf("collective #%d: the connection to rank 0 was lost (it exited or died): %v", c.seq, err))
}
