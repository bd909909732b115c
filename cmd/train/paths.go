package main

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/ember-ml/ember/internal/safefile"
	"github.com/ember-ml/ember/models"
	"github.com/ember-ml/ember/nn"
	"github.com/ember-ml/ember/nn/trainer"
)

// checkOutputs checks, before any data is read or any step is run, that
// the checkpoint and the metrics can be written where the flags say, and
// that they replace only files that train wrote: a mistake in a path must
// not cost a whole training run, nor a file of the user's.
func (t *job) checkOutputs() error {
	o := t.opt
	save, state := o.save, models.StatePath(o.save)
	if filepath.Clean(save) == filepath.Clean(state) {
		return usageError{fmt.Errorf("--save %s: want a file name that is not its own training state file", save)}
	}
	for _, p := range []struct{ path, what string }{{save, "the checkpoint"}, {state, "its training state"}} {
		exists, err := safefile.CheckWritable(p.path)
		if err != nil {
			return usageError{fmt.Errorf("--save %s: %s cannot be written: %s", save, p.what, pathProblem(err))}
		}
		if exists && !o.overwrite && !nn.IsCheckpointFile(p.path) {
			return usageError{fmt.Errorf("--save %s: %s exists and is not a checkpoint written by train; not replacing it (choose another --save, or pass --overwrite)", save, p.path)}
		}
	}
	if o.metrics != "" {
		m := filepath.Clean(o.metrics)
		if m == filepath.Clean(save) || m == filepath.Clean(state) || (o.resume != "" && (m == filepath.Clean(o.resume) || m == filepath.Clean(models.StatePath(o.resume)))) {
			return usageError{fmt.Errorf("--metrics %s: is a checkpoint file of this run; want a file of its own", o.metrics)}
		}
		exists, err := safefile.CheckWritable(o.metrics)
		if err != nil {
			return usageError{fmt.Errorf("--metrics %s: cannot be written: %s", o.metrics, pathProblem(err))}
		}
		if exists && !o.overwrite {
			ours, err := isMetricsFile(o.metrics)
			if err != nil {
				return usageError{fmt.Errorf("--metrics %s: %s", o.metrics, pathProblem(err))}
			}
			if !ours {
				return usageError{fmt.Errorf("--metrics %s: exists and is not a metrics file written by train; not replacing it (choose another --metrics, or pass --overwrite)", o.metrics)}
			}
		}
	}
	return nil
}

// isMetricsFile reports whether path is empty or starts with the header
// line that train writes.
func isMetricsFile(path string) (bool, error) {
	f, _, err := safefile.Open(path, 0)
	if err != nil {
		return false, err
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil && line == "" {
		return true, nil // empty
	}
	return strings.TrimRight(line, "\r\n") == strings.Join(trainer.MetricsHeader, ","), nil
}

// checkResumePaths checks that --resume names a checkpoint's two files,
// both regular files, before anything is read from them.
func checkResumePaths(path string) error {
	for _, p := range []string{path, models.StatePath(path)} {
		f, _, err := safefile.Open(p, 0)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p != path {
				return fmt.Errorf("--resume %s: %s: no such file: resuming needs the training state that train saves beside the model", path, p)
			}
			return fmt.Errorf("--resume %s: %s", path, pathProblem(err))
		}
		f.Close()
	}
	return nil
}

// pathProblem is the message of a file-system error without Go's "open"
// or "stat" prefix but with the path it concerns.
func pathProblem(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Path + ": " + pe.Err.Error()
	}
	return oneLine(err)
}
