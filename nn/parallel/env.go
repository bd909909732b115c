package parallel

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
)

// Environment is where this process stands in a data-parallel job, as the
// launcher told it: torchrun (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Slurm's srun (SLURM_PROCID,
// SLURM_NTASKS, SLURM_LOCALID, SLURM_NTASKS_PER_NODE, with MASTER_ADDR set
// by the job script), or nothing at all: one process, world size 1.
type Environment struct {
	Rank           int    // 0 <= Rank < WorldSize
	WorldSize      int    // number of processes in the job
	LocalRank      int    // rank among the processes of this machine: the GPU to use
	LocalWorldSize int    // processes on this machine; 0 when the launcher did not say
	MasterAddr     string // host of rank 0, where the rendezvous listens
	MasterPort     int    // its TCP port
	// RendezvousPort is the port rank 0 listens on for the rendezvous of
	// this package: EMBER_RENDEZVOUS_PORT when set; else MASTER_PORT+1
	// under torchrun, whose agent already serves its own store on
	// MASTER_PORT; else MASTER_PORT.
	RendezvousPort int
	// RunToken names the job, so that a rank of another run that reaches
	// the same port is refused: EMBER_RUN_TOKEN, else torchrun's
	// TORCHELASTIC_RUN_ID, else Slurm's SLURM_JOB_ID.SLURM_STEP_ID.
	RunToken string
	Launcher string // "torchrun", "ember" (Launch), "slurm" or "none"
}

// DefaultMasterPort is torch.distributed's default, used under Slurm when
// MASTER_PORT is not set.
const DefaultMasterPort = 29500

// Distributed reports whether there is more than one process.
func (e Environment) Distributed() bool { return e.WorldSize > 1 }

// Address is MASTER_ADDR:RendezvousPort, where the rendezvous happens.
func (e Environment) Address() string {
	return net.JoinHostPort(e.MasterAddr, strconv.Itoa(e.RendezvousPort))
}

func (e Environment) String() string {
	return fmt.Sprintf("rank %d of %d (local rank %d), rendezvous at %s, launched by %s", e.Rank, e.WorldSize, e.LocalRank, e.Address(), e.Launcher)
}

// EnvironmentFromOS reads the launcher's variables from the process
// environment (see EnvironmentFrom).
func EnvironmentFromOS() (Environment, error) { return EnvironmentFrom(os.Getenv) }

// EnvironmentFrom reads the launcher's variables through getenv. torchrun's
// variables win when RANK is set (torchrun started under srun sets its own
// ranks); otherwise Slurm's are used when SLURM_PROCID is set; otherwise the
// process is alone (rank 0 of 1). Values that are not integers, ranks out of
// range, and a RANK without WORLD_SIZE are errors naming the variables.
func EnvironmentFrom(getenv func(string) string) (Environment, error) {
	r := envReader{getenv: getenv}
	var e Environment
	switch {
	case getenv("RANK") != "" || getenv("WORLD_SIZE") != "":
		e.Launcher = "torchrun"
		if getenv("EMBER_LAUNCHER") == "ember" {
			e.Launcher = "ember" // Launch: the same variables, no torch agent
		}
		e.Rank = r.int("RANK", -1)
		e.WorldSize = r.int("WORLD_SIZE", -1)
		e.LocalRank = r.int("LOCAL_RANK", 0)
		e.LocalWorldSize = r.int("LOCAL_WORLD_SIZE", 0)
		if r.err == nil && (e.Rank < 0 || e.WorldSize < 0) {
			r.err = fmt.Errorf("parallel: RANK=%q and WORLD_SIZE=%q: a launcher sets both", getenv("RANK"), getenv("WORLD_SIZE"))
		}
	case getenv("SLURM_PROCID") != "":
		e.Launcher = "slurm"
		e.Rank = r.int("SLURM_PROCID", -1)
		e.WorldSize = r.int("SLURM_NTASKS", -1)
		e.LocalRank = r.int("SLURM_LOCALID", 0)
		// SLURM_NTASKS_PER_NODE is "4", or "4(x2),3" on uneven
		// allocations: only a plain number says how many share this node.
		if v := getenv("SLURM_NTASKS_PER_NODE"); v != "" && !strings.ContainsAny(v, "(,") {
			e.LocalWorldSize = r.int("SLURM_NTASKS_PER_NODE", 0)
		}
		if r.err == nil && e.WorldSize < 0 {
			r.err = fmt.Errorf("parallel: SLURM_PROCID=%s is set but SLURM_NTASKS is not: launch with srun --ntasks N", getenv("SLURM_PROCID"))
		}
	default:
		e = Environment{WorldSize: 1, LocalWorldSize: 1, Launcher: "none", MasterAddr: "127.0.0.1", MasterPort: DefaultMasterPort, RendezvousPort: DefaultMasterPort}
		return e, nil
	}
	e.MasterAddr = getenv("MASTER_ADDR")
	e.MasterPort = r.int("MASTER_PORT", DefaultMasterPort)
	e.RendezvousPort = e.MasterPort
	if e.Launcher == "torchrun" {
		e.RendezvousPort = e.MasterPort + 1
	}
	e.RendezvousPort = r.int("EMBER_RENDEZVOUS_PORT", e.RendezvousPort)
	switch {
	case getenv("EMBER_RUN_TOKEN") != "":
		e.RunToken = getenv("EMBER_RUN_TOKEN")
	case e.Launcher == "torchrun":
		e.RunToken = getenv("TORCHELASTIC_RUN_ID")
	case getenv("SLURM_JOB_ID") != "":
		e.RunToken = getenv("SLURM_JOB_ID") + "." + getenv("SLURM_STEP_ID")
	}
	if r.err != nil {
		return Environment{}, r.err
	}
	if err := e.check(); err != nil {
		return Environment{}, err
	}
	return e, nil
}

// check reports inconsistent values, naming the variables the launcher
// used.
func (e Environment) check() error {
	rank, world, local, localWorld := "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"
	if e.Launcher == "slurm" {
		rank, world, local, localWorld = "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"
	}
	switch {
	case e.WorldSize < 1:
		return fmt.Errorf("parallel: %s=%d: the world needs at least one process", world, e.WorldSize)
	case e.Rank < 0 || e.Rank >= e.WorldSize:
		return fmt.Errorf("parallel: %s=%d is outside %s=%d (ranks are 0 to %d)", rank, e.Rank, world, e.WorldSize, e.WorldSize-1)
	case e.LocalRank < 0:
		return fmt.Errorf("parallel: %s=%d is negative", local, e.LocalRank)
	case e.LocalWorldSize < 0:
		return fmt.Errorf("parallel: %s=%d is negative", localWorld, e.LocalWorldSize)
	case e.LocalWorldSize > 0 && e.LocalRank >= e.LocalWorldSize:
		return fmt.Errorf("parallel: %s=%d is outside %s=%d", local, e.LocalRank, localWorld, e.LocalWorldSize)
	case e.LocalWorldSize > e.WorldSize:
		return fmt.Errorf("parallel: %s=%d exceeds %s=%d", localWorld, e.LocalWorldSize, world, e.WorldSize)
	case e.LocalRank >= e.WorldSize:
		return fmt.Errorf("parallel: %s=%d is outside %s=%d", local, e.LocalRank, world, e.WorldSize)
	case e.MasterPort < 1 || e.MasterPort > 65535:
		return fmt.Errorf("parallel: MASTER_PORT=%d is not a TCP port (1 to 65535)", e.MasterPort)
	case e.RendezvousPort < 1 || e.RendezvousPort > 65535:
		return fmt.Errorf("parallel: rendezvous port %d (EMBER_RENDEZVOUS_PORT, or MASTER_PORT+1 under torchrun) is not a TCP port", e.RendezvousPort)
	case e.WorldSize > 1 && e.MasterAddr == "":
		if e.Launcher == "slurm" {
			return fmt.Errorf("parallel: MASTER_ADDR is not set: under srun export it in the job script, e.g. MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)")
		}
		return fmt.Errorf("parallel: MASTER_ADDR is not set (world size %d needs rank 0's address)", e.WorldSize)
	}
	return nil
}

// envReader parses integers, keeping the first error.
type envReader struct {
	getenv func(string) string
	err    error
}

func (r *envReader) int(name string, absent int) int {
	v := strings.TrimSpace(r.getenv(name))
	if v == "" {
		return absent
	}
	n, err := strconv.Atoi(v)
	if err != nil && r.err == nil {
		r.err = fmt.Errorf("parallel: %s=%q is not an integer", name, v)
	}
	return n
}
