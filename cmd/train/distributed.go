package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/ember-ml/ember/cuda"
	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn/parallel"
	"github.com/ember-ml/ember/nn/trainer"
)

// Data-parallel training. train --nproc-per-node N starts N copies of
// itself on this machine (parallel.Launch), each a rank of one job, and
// supervises them; torchrun --no-python and srun start the ranks the same
// way through the environment (parallel.EnvironmentFromOS). Each rank
// takes --batch-size divided by the world size: --batch-size is the
// global batch, so that a job trains as one process with that batch, and a
// checkpoint resumes at any world size that divides it.

// launchOptions are the launcher's flags, named as torchrun's.
type launchOptions struct {
	nprocPerNode int
	nnodes       int
	nodeRank     int
	masterAddr   string
	masterPort   int
	rankEnv      rankEnvFlag
	syncBN       bool // --sync-bn
	overlap      bool // --ddp-overlap
}

// rankEnvFlag is --rank-env NAME=VALUE, repeatable.
type rankEnvFlag []string

func (f *rankEnvFlag) String() string { return strings.Join(*f, ",") }
func (f *rankEnvFlag) Set(v string) error {
	name, _, ok := strings.Cut(v, "=")
	if !ok || name == "" || strings.ContainsAny(name, " \t") {
		return fmt.Errorf("want NAME=VALUE, e.g. NCCL_HOSTID=node-{rank}")
	}
	*f = append(*f, v)
	return nil
}

func addLaunchFlags(fs *flag.FlagSet, l *launchOptions) {
	fs.IntVar(&l.nprocPerNode, "nproc-per-node", 0, "start this many training processes on this machine, one per GPU, as one data-parallel job (--batch-size is split among all ranks)")
	fs.IntVar(&l.nnodes, "nnodes", 1, "machines of the job (with --nproc-per-node; run train on each with its --node-rank)")
	fs.IntVar(&l.nodeRank, "node-rank", 0, "this machine's index, 0 to --nnodes - 1")
	fs.StringVar(&l.masterAddr, "master-addr", "", "address of node 0, where rank 0 listens (default on one machine: 127.0.0.1)")
	fs.IntVar(&l.masterPort, "master-port", 0, "port of rank 0's rendezvous (default on one machine: a free one)")
	fs.BoolVar(&l.syncBN, "sync-bn", false, "data-parallel: batch norm layers normalise by the statistics of the whole global batch (torch's SyncBatchNorm) instead of each rank's own")
	fs.BoolVar(&l.overlap, "ddp-overlap", true, "data-parallel: all-reduce each bucket of gradients as soon as the backward pass has finished it (false: after the backward pass)")
	fs.Var(&l.rankEnv, "rank-env", "NAME=VALUE set in each rank's environment, {rank} and {local_rank} replaced (repeatable), e.g. NCCL_HOSTID=h{rank}")
}

// checkLaunch validates the launcher's flags.
func (o *options) checkLaunch() error {
	l := &o.launch
	launching := l.nprocPerNode > 0
	switch {
	case l.nprocPerNode < 0:
		return fmt.Errorf("--nproc-per-node %d: want a number of processes, 1 or more", l.nprocPerNode)
	case l.nnodes < 1:
		return fmt.Errorf("--nnodes %d: want 1 or more machines", l.nnodes)
	case l.nodeRank < 0 || l.nodeRank >= l.nnodes:
		return fmt.Errorf("--node-rank %d: want 0 to %d (--nnodes %d)", l.nodeRank, l.nnodes-1, l.nnodes)
	case l.masterPort < 0 || l.masterPort > 65535:
		return fmt.Errorf("--master-port %d: not a TCP port (1 to 65535)", l.masterPort)
	case l.nnodes > 1 && (l.masterAddr == "" || l.masterPort == 0):
		return fmt.Errorf("--nnodes %d: give --master-addr and --master-port, the same on every machine", l.nnodes)
	case !launching && (o.set["nnodes"] || o.set["node-rank"] || o.set["master-addr"] || o.set["master-port"] || len(l.rankEnv) > 0):
		return errors.New("--nnodes, --node-rank, --master-addr, --master-port and --rank-env apply with --nproc-per-node")
	case launching && o.set["gpu"]:
		return fmt.Errorf("--gpu %d does not apply with --nproc-per-node (each rank takes the GPU of its local rank)", o.gpu)
	case launching && !o.batchFromResume() && o.batchSize%(l.nprocPerNode*l.nnodes) != 0:
		// A resume that does not give --batch-size takes the checkpoint's,
		// which the ranks read: they check it (checkWorldBatch).
		return fmt.Errorf("--batch-size %d is not a multiple of the %d ranks (--nproc-per-node %d × --nnodes %d; the batch size %s): each rank takes an equal part", o.batchSize, l.nprocPerNode*l.nnodes, l.nprocPerNode, l.nnodes, o.batchOrigin(false))
	}
	return nil
}

// batchFromResume reports whether --batch-size is left to the checkpoint
// that --resume names (the command line does not give it).
func (o *options) batchFromResume() bool { return o.resume != "" && !o.set["batch-size"] }

// batchOrigin says where --batch-size came from, for its errors: the
// command line, the checkpoint (recorded: it recorded the
// value), or the default.
func (o *options) batchOrigin(recorded bool) string {
	switch {
	case o.set["batch-size"]:
		return "from the command line"
	case recorded:
		return "from the checkpoint " + models.StatePath(o.resume)
	}
	return "is the default"
}

// checkWorldBatch checks that the ranks split --batch-size evenly; it runs
// after a resume has taken back the checkpoint's --batch-size.
func (t *job) checkWorldBatch() error {
	o := t.opt
	if !t.distributed() || o.batchSize%t.env.WorldSize == 0 {
		return nil
	}
	recorded := false
	if t.resumed != nil {
		_, recorded = t.resumed.Flags["batch-size"]
	}
	return usageError{fmt.Errorf("--batch-size %d is not a multiple of the world size %d (the batch size %s): each rank takes an equal part", o.batchSize, t.env.WorldSize, o.batchOrigin(recorded))}
}

// launchedByUs reports whether this process is a rank that train
// --nproc-per-node started (and so must not launch again).
func launchedByUs() bool { return os.Getenv("EMBER_LAUNCHER") == "ember" && os.Getenv("RANK") != "" }

// selfCommand is the command line of a rank: this executable with the
// same flags. Tests replace it (their executable is the test binary).
var selfCommand = func(args []string) ([]string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("--nproc-per-node: finding this executable: %v", err)
	}
	return append([]string{exe}, args...), nil
}

// launch is train --nproc-per-node: it runs the ranks of this machine and
// returns the exit status, one line on stderr when a rank failed.
func launch(ctx context.Context, o *options, args []string, stdout, stderr io.Writer) int {
	if os.Getenv("RANK") != "" || os.Getenv("SLURM_PROCID") != "" {
		fmt.Fprintln(stderr, "train: --nproc-per-node: this process is already a rank of a launcher (RANK or SLURM_PROCID is set); let that launcher start the processes")
		return exitUsage
	}
	argv, err := selfCommand(args)
	if err != nil {
		fmt.Fprintf(stderr, "train: %v\n", err)
		return exitFailure
	}
	l := o.launch
	opt := parallel.LaunchOptions{
		NProcPerNode: l.nprocPerNode, NNodes: l.nnodes, NodeRank: l.nodeRank,
		MasterAddr: l.masterAddr, MasterPort: l.masterPort,
		Stdout: stdout, Stderr: stderr,
	}
	if len(l.rankEnv) > 0 {
		opt.RankEnv = func(rank, local int) []string {
			var env []string
			for _, kv := range l.rankEnv {
				kv = strings.ReplaceAll(kv, "{rank}", strconv.Itoa(rank))
				env = append(env, strings.ReplaceAll(kv, "{local_rank}", strconv.Itoa(local)))
			}
			return env
		}
	}
	err = parallel.Launch(ctx, argv, opt)
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, parallel.ErrInterrupted):
		return exitInterrupted
	}
	fmt.Fprintf(stderr, "train: %s\n", oneLine(err))
	return exitFailure
}

// joinJob reads where this process stands from the launcher's variables.
// A rank other than 0 is quiet on stdout (rank 0 speaks for the job);
// errors still go to stderr from every rank.
func (t *job) joinJob() error {
	env, err := parallel.EnvironmentFromOS()
	if err != nil {
		return usageError{err}
	}
	t.env = env
	if env.Launcher == "none" {
		for _, f := range []string{"sync-bn", "ddp-overlap"} {
			if t.opt.set[f] && t.opt.launch.nprocPerNode == 0 {
				return usageError{fmt.Errorf("--%s applies to data-parallel training (--nproc-per-node, torchrun or srun)", f)}
			}
		}
		return nil
	}
	o := t.opt
	// The batch's split over the ranks is checked after a resume has
	// taken back the checkpoint's --batch-size (checkWorldBatch).
	if env.Rank != 0 {
		t.out = io.Discard
	}
	// One GPU per local rank, unless the launcher gave each process its
	// own (CUDA_VISIBLE_DEVICES: one visible) or --gpu picks one; ranks
	// beyond the GPUs share them round robin (two ranks on one GPU need
	// NCCL_HOSTID to differ: see --rank-env).
	if o.device != "cpu" && !o.set["gpu"] && cuda.Available() == nil {
		if n, err := cuda.DeviceCount(); err == nil && n > 0 {
			o.gpu = env.LocalRank % n
		}
	}
	return nil
}

// distributed reports whether a launcher started this process.
func (t *job) distributed() bool { return t.env.Launcher != "" && t.env.Launcher != "none" }

// isMain reports whether this process writes files and speaks for the job.
func (t *job) isMain() bool { return t.env.Rank == 0 }

// rankBatch is this rank's part of --batch-size.
func (t *job) rankBatch() int {
	if t.distributed() {
		return t.opt.batchSize / t.env.WorldSize
	}
	return t.opt.batchSize
}

// connect joins the job's communicator on the device (NCCL on a GPU where
// NCCL loads, TCP otherwise) and says so.
func (t *job) connect(ctx context.Context) error {
	if !t.distributed() {
		return nil
	}
	c, err := parallel.Connect(ctx, t.env, t.dev.backend, parallel.ConnectOptions{})
	if err != nil {
		return err
	}
	t.comm = c
	kind := "TCP"
	if _, ok := c.(*parallel.NCCL); ok {
		kind = "NCCL"
	}
	t.logf("parallel: %d ranks (%s), %s, a batch of %d per rank", t.env.WorldSize, t.env.Launcher, kind, t.rankBatch())
	return nil
}

// parallelConfig is the trainer's side of the job.
func (t *job) parallelConfig() *trainer.Parallel {
	if t.comm == nil {
		return nil
	}
	return &trainer.Parallel{Comm: t.comm, SyncBatchNorm: t.opt.launch.syncBN, NoOverlap: !t.opt.launch.overlap}
}
