package parallel

import (
	"context"
	"fmt"
	"os"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/tensor"
)

// ConnectOptions tune Connect.
type ConnectOptions struct {
	Rendezvous RendezvousOptions
	// Kind is "nccl", "tcp" or "" (default: EMBER_COMM if set, else NCCL
	// on a CUDA backend where NCCL loads and TCP otherwise).
	Kind string
	// TCP tunes the TCP communicator.
	TCP TCPOptions
}

// Connect joins the job of env on b with the communicator that fits it:
// NCCL for a CUDA backend when libnccl loads, else the TCP communicator
// (the CPU backend, a machine without NCCL). It is a collective: every
// rank calls it, and all must pick the same kind (set EMBER_COMM the same
// on every rank to force one).
func Connect(ctx context.Context, env Environment, b tensor.Backend, opt ConnectOptions) (Communicator, error) {
	kind, source := opt.Kind, "ConnectOptions.Kind"
	if kind == "" {
		kind, source = os.Getenv("EMBER_COMM"), "EMBER_COMM"
	}
	cb, isCUDA := b.(*cuda.Backend)
	if kind == "" {
		kind = "tcp"
		if isCUDA && cuda.NCCLAvailable() == nil {
			kind = "nccl"
		}
	}
	switch kind {
	case "nccl":
		if !isCUDA {
			return nil, fmt.Errorf("parallel: %s=nccl needs a CUDA backend, not %s", source, b.Name())
		}
		return NewNCCL(ctx, env, cb, opt.Rendezvous)
	case "tcp":
		if opt.TCP.Rendezvous == (RendezvousOptions{}) {
			opt.TCP.Rendezvous = opt.Rendezvous
		}
		return NewTCP(ctx, env, b, opt.TCP)
	}
	return nil, fmt.Errorf("parallel: %s=%q: want nccl or tcp", source, kind)
}
