package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// TestLaunchResumeChecksCheckpointBatch: the split of the batch over the
// ranks is checked against the --batch-size a resume takes back from the
// checkpoint, not the flag's default (64): a checkpoint of batch 30
// resumes on 3 ranks, one of batch 90 is refused on 4, naming where the
// batch size came from.
func TestLaunchResumeChecksCheckpointBatch(t *testing.T) {
	dir := t.TempDir()
	data := randomMNIST(t, 180, 20)
	common := []string{"--device", "cpu", "--data", data, "--log-interval", "1000"}
	for _, c := range []struct {
		batch, ranks string
		ok           bool
	}{{"30", "3", true}, {"90", "4", false}} {
		save := filepath.Join(dir, "b"+c.batch+".safetensors")
		if code, out, errOut := train(t, append(common, "--epochs", "1", "--batch-size", c.batch, "--save", save)...); code != 0 {
			t.Fatalf("batch %s: exit %d\n%s%s", c.batch, code, out, errOut)
		}
		wait, out, errOut := launched(t, context.Background(), append(common, "--epochs", "2", "--resume", save, "--nproc-per-node", c.ranks)...)
		code := wait()
		if c.ok {
			if code != 0 || !strings.Contains(out.String(), "epoch 2/2:") {
				t.Errorf("batch %s on %s ranks: exit %d\n%s%s", c.batch, c.ranks, code, out, errOut)
			}
			continue
		}
		want := "--batch-size 90 is not a multiple of the world size 4 (the batch size from the checkpoint "
		if code == 0 || !strings.Contains(errOut.String(), want) {
			t.Errorf("batch %s on %s ranks: exit %d, want a failure saying %q\n%s%s", c.batch, c.ranks, code, want, out, errOut)
		}
	}
}
