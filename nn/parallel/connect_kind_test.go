package parallel

import (
	"context"
	"strings"
	"testing"

	"github.com/ember-ml/ember/tensor"
)

// TestConnectNamesTheKindsSource: a kind Connect cannot use is named with
// where it came from: ConnectOptions.Kind, or EMBER_COMM when that is
// empty.
func TestConnectNamesTheKindsSource(t *testing.T) {
	env := Environment{WorldSize: 1, Launcher: "none"}
	for _, c := range []struct {
		kind, envKind, want string
	}{
		{"mpi", "tcp", `ConnectOptions.Kind="mpi": want nccl or tcp`},
		{"nccl", "", "ConnectOptions.Kind=nccl needs a CUDA backend"},
		{"", "mpi", `EMBER_COMM="mpi": want nccl or tcp`},
		{"", "nccl", "EMBER_COMM=nccl needs a CUDA backend"},
	} {
		t.Setenv("EMBER_COMM", c.envKind)
		_, err := Connect(context.Background(), env, tensor.CPU, ConnectOptions{Kind: c.kind})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Kind %q, EMBER_COMM %q: error %v; want %q", c.kind, c.envKind, err, c.want)
		}
	}
}
