package parallel

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// The rendezvous: rank 0 listens on Environment.Address, every other rank
// connects (retrying until the deadline) and says who it is; once all have
// arrived rank 0 answers each with the job's handshake (world size, run
// token) and an opaque payload, the NCCL unique id. If a rank is missing at
// the deadline, or one disagrees (another world size, another run), rank 0
// tells every rank that did arrive, and every rank returns the same one
// line.
//
// Wire format, big-endian:
//
//	hello (rank r → rank 0):  "EMRV" u16 version, u32 rank, u32 world, u16 len, token
//	answer (rank 0 → rank r): "EMRV" u8 status
//	                          ok:    u32 world, u16 len, token, u32 len, payload
//	                          error: u16 len, message

// RendezvousOptions tune Rendezvous.
type RendezvousOptions struct {
	// Timeout bounds the whole rendezvous on every rank (default 5 min, as
	// torch.distributed's default timeout is 30 min for a whole collective;
	// a rank that has not started within minutes is not coming).
	Timeout time.Duration
	// RetryInterval is the pause between two connection attempts of a
	// rank > 0 while rank 0 is not listening yet (default 200 ms).
	RetryInterval time.Duration
}

const (
	rendezvousMagic   = "EMRV"
	rendezvousVersion = 1
	maxTokenLen       = 1024
	maxPayloadLen     = 1 << 20
	// answerGrace is how long a rank > 0 waits past its own deadline for
	// rank 0's verdict: rank 0's deadline started at its own start, a
	// little earlier or later.
	answerGrace = 2 * time.Second
)

// Rendezvous brings the WorldSize processes of env together and returns
// rank 0's payload on every rank (rank 0 gets its own back). At world size
// 1 it returns at once.
func Rendezvous(ctx context.Context, env Environment, payload []byte, opt RendezvousOptions) ([]byte, error) {
	if opt.Timeout <= 0 {
		opt.Timeout = 5 * time.Minute
	}
	if opt.RetryInterval <= 0 {
		opt.RetryInterval = 200 * time.Millisecond
	}
	if len(env.RunToken) > maxTokenLen {
		return nil, fmt.Errorf("parallel: rendezvous: run token of %d bytes, at most %d", len(env.RunToken), maxTokenLen)
	}
	if env.WorldSize <= 1 {
		return payload, nil
	}
	if env.Rank == 0 {
		if len(payload) > maxPayloadLen {
			return nil, fmt.Errorf("parallel: rendezvous: payload of %d bytes, at most %d", len(payload), maxPayloadLen)
		}
		ln, err := net.Listen("tcp", env.Address())
		if err != nil {
			return nil, fmt.Errorf("parallel: rendezvous: rank 0 cannot listen on %s: %v (set EMBER_RENDEZVOUS_PORT to a free port)", env.Address(), err)
		}
		defer ln.Close()
		return serveRendezvous(ctx, ln, env, payload, nil, opt)
	}
	return joinRendezvous(ctx, env, opt)
}

// RefuseRendezvous is rank 0's side when it cannot start the job (NCCL
// failed to make an id, say): every rank that arrives before the deadline
// is told cause at once, so that all fail with rank 0's reason instead of
// waiting for a rank 0 that never answers. It returns cause as rank 0's
// error once every other rank has been told, or at the deadline.
func RefuseRendezvous(ctx context.Context, env Environment, cause error, opt RendezvousOptions) error {
	if cause == nil {
		cause = errors.New("refused")
	}
	if opt.Timeout <= 0 {
		opt.Timeout = 5 * time.Minute
	}
	if env.WorldSize > 1 && env.Rank == 0 {
		if ln, err := net.Listen("tcp", env.Address()); err == nil {
			serveRendezvous(ctx, ln, env, nil, cause, opt)
			ln.Close()
		}
	}
	return &RankError{Rank: env.Rank, Err: cause}
}

// ServeRendezvous runs rank 0's side on a listener the caller opened (a
// test's port 0, say) and closes it when done; env.Rank must be 0.
func ServeRendezvous(ctx context.Context, ln net.Listener, env Environment, payload []byte, opt RendezvousOptions) ([]byte, error) {
	if env.Rank != 0 {
		return nil, fmt.Errorf("parallel: rendezvous: ServeRendezvous on rank %d", env.Rank)
	}
	if opt.Timeout <= 0 {
		opt.Timeout = 5 * time.Minute
	}
	return serveRendezvous(ctx, ln, env, payload, nil, opt)
}

type arrival struct {
	conn  net.Conn
	rank  int
	world int
	token string
	err   error // a connection that did not say hello properly
}

// serveRendezvous is rank 0's side; with refuse set, every rank is told
// refuse instead of being given the payload.
func serveRendezvous(ctx context.Context, ln net.Listener, env Environment, payload []byte, refuse error, opt RendezvousOptions) ([]byte, error) {
	start := time.Now()
	deadline := start.Add(opt.Timeout)
	arrivals := make(chan arrival)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return // the listener was closed: the rendezvous is over
			}
			go func() {
				a := readHello(conn, deadline)
				select {
				case arrivals <- a:
				case <-stop:
					conn.Close()
				}
			}()
		}
	}()
	// Closing the listener ends the accept loop once we return.
	defer ln.Close()

	conns := map[int]net.Conn{}
	told := map[int]bool{} // ranks given the refusal
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	fail := func(err error) ([]byte, error) {
		for _, c := range conns {
			writeAnswerError(c, err.Error())
		}
		return nil, err
	}
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	for len(conns) < env.WorldSize-1 {
		select {
		case <-ctx.Done():
			return fail(fmt.Errorf("parallel: rendezvous at %s: %v with %s", env.Address(), ctx.Err(), missingRanks(conns, env.WorldSize)))
		case <-timer.C:
			if refuse != nil {
				return nil, refuse
			}
			return fail(fmt.Errorf("parallel: rendezvous at %s: %s within %v", env.Address(), missingRanks(conns, env.WorldSize), opt.Timeout))
		case a := <-arrivals:
			if a.err != nil {
				a.conn.Close() // not one of ours (a port scan, a stale client)
				continue
			}
			var bad error
			switch {
			case a.token != env.RunToken:
				bad = fmt.Errorf("parallel: rendezvous at %s: rank %d belongs to run %q, rank 0 to run %q", env.Address(), a.rank, a.token, env.RunToken)
			case a.world != env.WorldSize:
				bad = fmt.Errorf("parallel: rendezvous at %s: rank %d has world size %d, rank 0 has %d", env.Address(), a.rank, a.world, env.WorldSize)
			case a.rank <= 0 || a.rank >= env.WorldSize:
				bad = fmt.Errorf("parallel: rendezvous at %s: a process says it is rank %d of world size %d", env.Address(), a.rank, env.WorldSize)
			}
			if bad == nil && refuse != nil {
				writeAnswerError(a.conn, fmt.Sprintf("parallel: rank 0 cannot start the job: %v", refuse))
				a.conn.Close()
				if told[a.rank] = true; len(told) == env.WorldSize-1 {
					return nil, refuse
				}
				continue
			}
			if bad != nil {
				writeAnswerError(a.conn, bad.Error())
				a.conn.Close()
				return fail(bad)
			}
			if old := conns[a.rank]; old != nil {
				old.Close() // the rank reconnected; its first connection is dead
			}
			conns[a.rank] = a.conn
		}
	}
	var errs []error
	for r, c := range conns {
		if err := writeAnswerOK(c, env, payload, deadline.Add(answerGrace)); err != nil {
			errs = append(errs, fmt.Errorf("rank %d: %v", r, err))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("parallel: rendezvous at %s: answering: %v", env.Address(), errors.Join(errs...))
	}
	return payload, nil
}

// missingRanks says which ranks never arrived: "ranks 2, 3 of 4 never
// arrived".
func missingRanks(conns map[int]net.Conn, world int) string {
	var missing []string
	for r := 1; r < world; r++ {
		if conns[r] == nil {
			missing = append(missing, strconv.Itoa(r))
		}
	}
	if len(missing) == 1 {
		return fmt.Sprintf("rank %s of %d never arrived", missing[0], world)
	}
	return fmt.Sprintf("ranks %s of %d never arrived", strings.Join(missing, ", "), world)
}

func readHello(conn net.Conn, deadline time.Time) arrival {
	a := arrival{conn: conn}
	conn.SetReadDeadline(deadline)
	r := bufio.NewReader(conn)
	var head struct {
		Magic   [4]byte
		Version uint16
		Rank    uint32
		World   uint32
	}
	if err := binary.Read(r, binary.BigEndian, &head); err != nil {
		a.err = err
		return a
	}
	if string(head.Magic[:]) != rendezvousMagic || head.Version != rendezvousVersion {
		a.err = fmt.Errorf("not a rendezvous hello")
		return a
	}
	token, err := readString16(r)
	if err != nil {
		a.err = err
		return a
	}
	a.rank, a.world, a.token = int(int32(head.Rank)), int(int32(head.World)), token
	conn.SetReadDeadline(time.Time{})
	return a
}

func writeAnswerOK(conn net.Conn, env Environment, payload []byte, deadline time.Time) error {
	conn.SetWriteDeadline(deadline)
	var b []byte
	b = append(b, rendezvousMagic...)
	b = append(b, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(env.WorldSize))
	b = appendString16(b, env.RunToken)
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	b = append(b, payload...)
	_, err := conn.Write(b)
	return err
}

func writeAnswerError(conn net.Conn, msg string) {
	if len(msg) > 4096 {
		msg = msg[:4096]
	}
	conn.SetWriteDeadline(time.Now().Add(time.Second))
	var b []byte
	b = append(b, rendezvousMagic...)
	b = append(b, 1)
	b = appendString16(b, msg)
	conn.Write(b) // best effort: the rank may be gone
}

func appendString16(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func readString16(r io.Reader) (string, error) {
	var n uint16
	if err := binary.Read(r, binary.BigEndian, &n); err != nil {
		return "", err
	}
	if n > 4096 {
		return "", fmt.Errorf("string of %d bytes", n)
	}
	b := make([]byte, n)
	_, err := io.ReadFull(r, b)
	return string(b), err
}

func joinRendezvous(outer context.Context, env Environment, opt RendezvousOptions) ([]byte, error) {
	deadline := time.Now().Add(opt.Timeout)
	ctx, cancel := context.WithDeadline(outer, deadline)
	defer cancel()
	var d net.Dialer
	var conn net.Conn
	var lastErr error
	for conn == nil {
		attempt, cancelAttempt := context.WithTimeout(ctx, min(time.Until(deadline), 2*time.Second))
		c, err := d.DialContext(attempt, "tcp", env.Address())
		cancelAttempt()
		if err == nil {
			conn = c
			break
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(opt.RetryInterval):
		}
	}
	if conn == nil {
		why := "never answered"
		if errors.Is(ctx.Err(), context.Canceled) {
			why = "was not reached before the rendezvous was cancelled"
		}
		return nil, fmt.Errorf("parallel: rendezvous: rank 0 at %s %s within %v (rank 0 never arrived; last error: %v)", env.Address(), why, opt.Timeout, lastErr)
	}
	defer conn.Close()
	// Rank 0's verdict may come a little after this rank's own deadline
	// (answerGrace): only a cancellation from outside cuts the wait short.
	stopWatch := context.AfterFunc(outer, func() {
		conn.SetDeadline(time.Now())
	})
	defer stopWatch()

	var hello []byte
	hello = append(hello, rendezvousMagic...)
	hello = binary.BigEndian.AppendUint16(hello, rendezvousVersion)
	hello = binary.BigEndian.AppendUint32(hello, uint32(env.Rank))
	hello = binary.BigEndian.AppendUint32(hello, uint32(env.WorldSize))
	hello = appendString16(hello, env.RunToken)
	conn.SetDeadline(deadline.Add(answerGrace))
	if _, err := conn.Write(hello); err != nil {
		return nil, fmt.Errorf("parallel: rendezvous: rank %d sending to rank 0 at %s: %v", env.Rank, env.Address(), err)
	}
	payload, err := readAnswer(bufio.NewReader(conn), env)
	if err != nil {
		var ne net.Error
		switch {
		case errors.As(err, &ne) && ne.Timeout():
			return nil, fmt.Errorf("parallel: rendezvous: rank %d heard nothing from rank 0 at %s within %v", env.Rank, env.Address(), opt.Timeout)
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			return nil, fmt.Errorf("parallel: rendezvous: rank 0 at %s closed the connection before answering rank %d (did rank 0 die?)", env.Address(), env.Rank)
		}
		return nil, err
	}
	return payload, nil
}

// rendezvousRefused is rank 0's verdict, repeated on this rank.
type rendezvousRefused struct{ msg string }

func (e *rendezvousRefused) Error() string { return e.msg }

func readAnswer(r *bufio.Reader, env Environment) ([]byte, error) {
	var head struct {
		Magic  [4]byte
		Status uint8
	}
	if err := binary.Read(r, binary.BigEndian, &head); err != nil {
		return nil, err
	}
	if string(head.Magic[:]) != rendezvousMagic {
		return nil, fmt.Errorf("parallel: rendezvous: %s is not an ember rendezvous (is MASTER_PORT another service's?)", env.Address())
	}
	if head.Status != 0 {
		msg, err := readString16(r)
		if err != nil {
			return nil, err
		}
		return nil, &rendezvousRefused{msg}
	}
	var world uint32
	if err := binary.Read(r, binary.BigEndian, &world); err != nil {
		return nil, err
	}
	token, err := readString16(r)
	if err != nil {
		return nil, err
	}
	var n uint32
	if err := binary.Read(r, binary.BigEndian, &n); err != nil {
		return nil, err
	}
	if n > maxPayloadLen {
		return nil, fmt.Errorf("parallel: rendezvous: rank 0 sent a payload of %d bytes", n)
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return nil, err
	}
	// Rank 0 checked both; checking again costs nothing and guards a rank 0
	// of another version.
	if int(world) != env.WorldSize || token != env.RunToken {
		return nil, fmt.Errorf("parallel: rendezvous: rank 0 has world size %d and run %q, rank %d has %d and %q", world, token, env.Rank, env.WorldSize, env.RunToken)
	}
	return payload, nil
}
