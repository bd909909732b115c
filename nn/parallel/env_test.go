package parallel

import (
	"strings"
	"testing"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestEnvironment(t *testing.T) {
	cases := []struct {
		name string
		vars map[string]string
		want Environment
	}{
		{"alone", nil, Environment{WorldSize: 1, LocalWorldSize: 1, Launcher: "none", MasterAddr: "127.0.0.1", MasterPort: 29500, RendezvousPort: 29500}},
		{"torchrun", map[string]string{"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "node0", "MASTER_PORT": "1234", "TORCHELASTIC_RUN_ID": "job7"},
			Environment{Rank: 3, WorldSize: 8, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "node0", MasterPort: 1234, RendezvousPort: 1235, RunToken: "job7", Launcher: "torchrun"}},
		{"torchrun, own port and token", map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1234", "EMBER_RENDEZVOUS_PORT": "4000", "EMBER_RUN_TOKEN": "t"},
			Environment{Rank: 0, WorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: 1234, RendezvousPort: 4000, RunToken: "t", Launcher: "torchrun"}},
		{"slurm", map[string]string{"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "2", "SLURM_NTASKS_PER_NODE": "3", "SLURM_JOB_ID": "99", "SLURM_STEP_ID": "0", "MASTER_ADDR": "n1"},
			Environment{Rank: 5, WorldSize: 6, LocalRank: 2, LocalWorldSize: 3, MasterAddr: "n1", MasterPort: 29500, RendezvousPort: 29500, RunToken: "99.0", Launcher: "slurm"}},
		{"slurm, uneven nodes", map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "7", "SLURM_NTASKS_PER_NODE": "4(x1),3", "MASTER_ADDR": "n1"},
			Environment{WorldSize: 7, MasterAddr: "n1", MasterPort: 29500, RendezvousPort: 29500, RunToken: "", Launcher: "slurm"}},
		{"Launch", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "5000", "EMBER_RENDEZVOUS_PORT": "5000", "EMBER_LAUNCHER": "ember", "EMBER_RUN_TOKEN": "ab"},
			Environment{Rank: 1, WorldSize: 2, LocalRank: 1, LocalWorldSize: 2, MasterAddr: "127.0.0.1", MasterPort: 5000, RendezvousPort: 5000, RunToken: "ab", Launcher: "ember"}},
		// torchrun inside srun: torchrun's ranks are the processes'.
		{"torchrun under srun", map[string]string{"RANK": "1", "WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "MASTER_ADDR": "a", "MASTER_PORT": "10"},
			Environment{Rank: 1, WorldSize: 2, MasterAddr: "a", MasterPort: 10, RendezvousPort: 11, Launcher: "torchrun"}},
	}
	for _, c := range cases {
		got, err := EnvironmentFrom(envOf(c.vars))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got != c.want {
			t.Errorf("%s:\n got %+v\nwant %+v", c.name, got, c.want)
		}
	}
}

func TestEnvironmentErrors(t *testing.T) {
	cases := []struct {
		vars map[string]string
		want string
	}{
		{map[string]string{"RANK": "1"}, `RANK="1" and WORLD_SIZE=""`},
		{map[string]string{"RANK": "x", "WORLD_SIZE": "2", "MASTER_ADDR": "a"}, `RANK="x" is not an integer`},
		{map[string]string{"RANK": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "a"}, "RANK=2 is outside WORLD_SIZE=2"},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "0", "MASTER_ADDR": "a"}, "WORLD_SIZE=0"},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "a"}, "LOCAL_RANK=2 is outside LOCAL_WORLD_SIZE=2"},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "3", "MASTER_ADDR": "a"}, "LOCAL_WORLD_SIZE=3 exceeds WORLD_SIZE=2"},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR is not set"},
		{map[string]string{"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not a TCP port"},
		{map[string]string{"SLURM_PROCID": "0"}, "SLURM_NTASKS is not"},
		{map[string]string{"SLURM_PROCID": "3", "SLURM_NTASKS": "3", "MASTER_ADDR": "a"}, "SLURM_PROCID=3 is outside SLURM_NTASKS=3"},
		{map[string]string{"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, "scontrol show hostnames"},
	}
	for _, c := range cases {
		_, err := EnvironmentFrom(envOf(c.vars))
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: error %v, want one line containing %q", c.vars, err, c.want)
		}
	}
}
