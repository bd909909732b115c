// Command kernelbundle writes the CUDA backend's kernel bundle: every
// kernel unit of this build compiled ahead of time with NVRTC, which
// package cuda embeds (cuda/kernels/bundle.zip) so that a cold start runs
// no compiler. It needs NVRTC (libnvrtc.so.13, .12 or .11), not a GPU:
//
//	kernelbundle -o cuda/kernels/bundle.zip
//
// and reports the freshness of a bundle against this build's sources
// (no NVRTC needed):
//
//	kernelbundle -check cuda/kernels/bundle.zip
//
// Flags:
//
//	-o FILE         write the bundle to FILE (atomically)
//	-targets LIST   comma-separated sm_XY (cubin) and compute_XY (PTX) targets (default sm_90,compute_90)
//	-check FILE     list the units that FILE holds no image of (stale: compiled at run time)
//	-strict         with -check: exit 1 when a unit is stale
//	-v              a line per compiled image
//
// Exit status: 0 on success, 2 for bad usage or an unreadable bundle, 1
// for a failed compile or (with -strict) a stale bundle.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ember-ml/ember/cuda"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kernelbundle", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "", "write the bundle to `FILE`")
	targets := fs.String("targets", strings.Join(cuda.BundleTargets, ","), "comma-separated sm_XY and compute_XY `targets`")
	check := fs.String("check", "", "report which units `FILE` holds no image of")
	strict := fs.Bool("strict", false, "with -check: exit 1 when a unit is stale")
	verbose := fs.Bool("v", false, "a line per compiled image")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 || (*out == "") == (*check == "") {
		fmt.Fprintln(stderr, "kernelbundle: give one of -o FILE or -check FILE (and no other arguments)")
		return 2
	}
	if *check != "" {
		return checkBundle(*check, *strict, stdout, stderr)
	}
	var ts []string
	for _, t := range strings.Split(*targets, ",") {
		if t = strings.TrimSpace(t); t != "" {
			ts = append(ts, t)
		}
	}
	var log io.Writer
	if *verbose {
		log = stderr
	}
	t0 := time.Now()
	var buf bytes.Buffer
	if err := cuda.WriteKernelBundle(&buf, ts, log); err != nil {
		fmt.Fprintf(stderr, "kernelbundle: %v\n", err)
		if strings.Contains(err.Error(), "want sm_XY") {
			return 2
		}
		return 1
	}
	if err := writeAtomic(*out, buf.Bytes()); err != nil {
		fmt.Fprintf(stderr, "kernelbundle: -o %s: %v\n", *out, err)
		return 2
	}
	kb, err := cuda.ParseKernelBundle(buf.Bytes())
	if err != nil {
		fmt.Fprintf(stderr, "kernelbundle: the bundle written does not read back: %v\n", err)
		return 1
	}
	fmt.Fprintf(stdout, "wrote %s: %d bytes, %d units for %s, NVRTC %s, in %.1f s\n",
		*out, buf.Len(), len(kb.Manifest.Units), strings.Join(ts, " "), kb.Manifest.NVRTC, time.Since(t0).Seconds())
	return 0
}

func checkBundle(path string, strict bool, stdout, stderr io.Writer) int {
	data, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(stderr, "kernelbundle: -check: %v\n", err)
		return 2
	}
	kb, err := cuda.ParseKernelBundle(data)
	if err != nil {
		fmt.Fprintf(stderr, "kernelbundle: -check %s: %v\n", path, err)
		return 2
	}
	stale, err := cuda.StaleBundleUnits(kb)
	if err != nil {
		fmt.Fprintf(stderr, "kernelbundle: %v\n", err)
		return 1
	}
	m := kb.Manifest
	fmt.Fprintf(stdout, "%s: %d bytes, NVRTC %s, targets %s, %d units\n", path, len(data), m.NVRTC, strings.Join(m.Targets, " "), len(m.Units))
	if len(stale) == 0 {
		fmt.Fprintln(stdout, "every unit of this build is in the bundle")
		return 0
	}
	fmt.Fprintf(stdout, "%d stale (compiled at run time; regenerate with kernelbundle -o):\n", len(stale))
	for _, s := range stale {
		fmt.Fprintf(stdout, "  %s\n", s)
	}
	if strict {
		return 1
	}
	return 0
}

// writeAtomic writes data to a temporary file beside path and renames it
// over path, so that a failed write leaves the old bundle in place.
func writeAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".kernelbundle-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, werr := f.Write(data)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr != nil {
		os.Remove(tmp)
	}
	return werr
}
