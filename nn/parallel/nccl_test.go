package parallel

import (
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/tensor"
)

// The NCCL tests need a GPU and libnccl.so.2; they skip without (fail with
// EMBER_REQUIRE_GPU=1, as the cuda package's GPU tests do).
//
//	go test ./nn/parallel -run 'NCCL' -v
//
// TestNCCLTwoRanks runs two ranks on one GPU: NCCL refuses that as
// "Duplicate GPU detected" unless each rank has its own NCCL_HOSTID, which
// the test sets. It checks correctness only; do not time it (the two ranks
// then talk through sockets, not NVLink or shared memory).

func requireNCCLBackend(t *testing.T) *cuda.Backend {
	t.Helper()
	skip := func(err error) {
		if os.Getenv("EMBER_REQUIRE_GPU") == "1" {
			t.Fatalf("EMBER_REQUIRE_GPU=1 but: %v", err)
		}
		t.Skip(err)
	}
	if err := cuda.Available(); err != nil {
		skip(fmt.Errorf("no CUDA device: %v", err))
	}
	if err := cuda.NCCLAvailable(); err != nil {
		skip(err)
	}
	b, err := cuda.NewBackend(0, cuda.BackendOptions{})
	if err != nil {
		t.Fatalf("NewBackend(0): %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// gpuTolerance: the GPU's kernels (tiled and fused linear layers, cross
// entropy, other reduction trees) round differently from the CPU's, by a
// few ulps per operation, as the CPU ranks differ from one rank; 1e-4
// relative leaves room for that over six steps and stays a thousand times
// below what one step changes.
const gpuTolerance = 1e-4

func compareParams(t *testing.T, what string, got, want [][]float32, tol float64) {
	t.Helper()
	for i := range want {
		for j := range want[i] {
			if d := math.Abs(float64(got[i][j]-want[i][j])) / math.Max(1, math.Abs(float64(want[i][j]))); d > tol {
				t.Fatalf("%s: parameter %d[%d] = %.8g, one CPU rank with the whole batch gives %.8g", what, i, j, got[i][j], want[i][j])
			}
		}
	}
}

// World size 1 through real NCCL: the rendezvous is skipped, the
// communicator has one rank, DataParallel's broadcast and averages are
// identities, and training matches the CPU reference.
func TestNCCLWorldSizeOne(t *testing.T) {
	b := requireNCCLBackend(t)
	env, err := EnvironmentFrom(func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewNCCL(context.Background(), env, b, RendezvousOptions{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}()
	got, err := trainRank(c, b, 16, 6, 64)
	if err != nil {
		t.Fatal(err)
	}
	want, err := trainRank(nil, tensor.CPU, 16, 6, 0)
	if err != nil {
		t.Fatal(err)
	}
	compareParams(t, "world size 1 over NCCL", got, want, gpuTolerance)
	if err := c.AsyncError(); err != nil {
		t.Error(err)
	}
}

// TestNCCLTwoRanks re-executes the test binary as two child processes,
// ranks 0 and 1 of a world of 2 on GPU 0 with the variables torchrun would
// set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and a
// different NCCL_HOSTID each. The children meet through the rendezvous on
// 127.0.0.1, check the collectives and train the test model on half a
// batch each; the parent checks that both end with identical parameters,
// those of one CPU rank with the whole batch.
func TestNCCLTwoRanks(t *testing.T) {
	if os.Getenv("EMBER_NCCL_CHILD") == "1" {
		ncclChild(t)
		return
	}
	requireNCCLBackend(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmds := make([]*exec.Cmd, 2)
	outs := make([]*strings.Builder, 2)
	for r := range 2 {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestNCCLTwoRanks$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(),
			"EMBER_NCCL_CHILD=1",
			"RANK="+strconv.Itoa(r), "WORLD_SIZE=2", "LOCAL_RANK="+strconv.Itoa(r), "LOCAL_WORLD_SIZE=2",
			"MASTER_ADDR=127.0.0.1", "MASTER_PORT="+port, "EMBER_RENDEZVOUS_PORT="+port,
			"EMBER_RUN_TOKEN=ember-nccl-test-"+port,
			"NCCL_HOSTID=ember-test-rank-"+strconv.Itoa(r),
			"EMBER_NCCL_OUT="+filepath.Join(dir, fmt.Sprintf("rank%d.txt", r)),
		)
		// Stay on the loopback interface, through sockets: the two "hosts"
		// are one.
		if os.Getenv("NCCL_SOCKET_IFNAME") == "" {
			cmd.Env = append(cmd.Env, "NCCL_SOCKET_IFNAME=lo")
		}
		if os.Getenv("NCCL_IB_DISABLE") == "" {
			cmd.Env = append(cmd.Env, "NCCL_IB_DISABLE=1")
		}
		outs[r] = &strings.Builder{}
		cmd.Stdout, cmd.Stderr = outs[r], outs[r]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[r] = cmd
	}
	failed := false
	for r, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			failed = true
			t.Errorf("rank %d: %v\n%s", r, err, outs[r])
		}
	}
	if failed {
		return
	}
	params := make([][][]float32, 2)
	for r := range 2 {
		params[r] = readParams(t, filepath.Join(dir, fmt.Sprintf("rank%d.txt", r)))
	}
	want, err := trainRank(nil, tensor.CPU, 16, 6, 0)
	if err != nil {
		t.Fatal(err)
	}
	compareParams(t, "rank 1 against rank 0", params[1], params[0], 0) // identical replicas
	compareParams(t, "two ranks over NCCL", params[0], want, gpuTolerance)
}

// ncclChild is one rank of TestNCCLTwoRanks.
func ncclChild(t *testing.T) {
	env, err := EnvironmentFromOS()
	if err != nil {
		t.Fatal(err)
	}
	b, err := cuda.NewBackend(0, cuda.BackendOptions{}) // both ranks on GPU 0
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	c, err := NewNCCL(context.Background(), env, b, RendezvousOptions{Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}()
	w := StartWatchdog(c, WatchdogOptions{StepTimeout: time.Minute})
	defer w.Stop()
	r := float32(env.Rank + 1)
	x := tensor.FromFloat32(b, nil, []float32{r, 10 * r, -1}, 3)
	defer x.Release()
	check := func(what string, want ...float32) {
		t.Helper()
		if got := x.Float32s(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("rank %d: %s: %v, want %v", env.Rank, what, got, want)
		}
	}
	if err := AllReduceSum(c, x); err != nil {
		t.Fatal(err)
	}
	check("sum", 3, 30, -2)
	if err := AllReduceAverage(c, x); err != nil {
		t.Fatal(err)
	}
	check("average", 3, 30, -2)
	x.CopyFrom([]float32{r, r, r})
	if err := BroadcastTensor(c, x, 1); err != nil {
		t.Fatal(err)
	}
	check("broadcast from rank 1", 2, 2, 2)
	vals := []float32{r}
	if err := c.AllReduceValues(vals, Sum); err != nil || vals[0] != 3 {
		t.Fatalf("AllReduceValues: %v, %v", vals, err)
	}
	if err := c.Barrier(); err != nil {
		t.Fatal(err)
	}
	w.BeginStep(0)
	params, err := trainRank(c, b, 16, 6, 64)
	w.EndStep()
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Err(); err != nil {
		t.Fatal(err)
	}
	writeParams(t, os.Getenv("EMBER_NCCL_OUT"), params)
}

// writeParams stores parameters as exact float32 bits, one tensor a line.
func writeParams(t *testing.T, path string, ps [][]float32) {
	t.Helper()
	var b strings.Builder
	for _, p := range ps {
		for j, v := range p {
			if j > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(strconv.FormatUint(uint64(math.Float32bits(v)), 16))
		}
		b.WriteByte('\n')
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readParams(t *testing.T, path string) [][]float32 {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out [][]float32
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var p []float32
		for _, f := range strings.Fields(line) {
			u, err := strconv.ParseUint(f, 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			p = append(p, math.Float32frombits(uint32(u)))
		}
		out = append(out, p)
	}
	return out
}

func TestParamsFileRoundTrip(t *testing.T) {
	ps := [][]float32{{1, -0.1, float32(math.Inf(1))}, {3e-38}}
	path := filepath.Join(t.TempDir(), "p.txt")
	writeParams(t, path, ps)
	got := readParams(t, path)
	if fmt.Sprint(got) != fmt.Sprint(ps) {
		t.Errorf("read back %v, wrote %v", got, ps)
	}
}
