package data

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
)

// The CIFAR binary formats (https://www.cs.toronto.edu/~kriz/cifar.html).
// A file is a sequence of records with no header: CIFAR-10's records are a
// label byte and an image, CIFAR-100's a coarse label byte, a fine label
// byte and an image. An image is CIFARSide*CIFARSide red bytes, then as many
// green, then blue, each plane row-major: exactly the CHW layout of
// Dataset, so records are copied as they are.
const (
	CIFARSide          = 32
	CIFARImageBytes    = 3 * CIFARSide * CIFARSide // 3072
	CIFAR10RecordSize  = 1 + CIFARImageBytes       // 3073
	CIFAR100RecordSize = 2 + CIFARImageBytes       // 3074
)

// MaxCIFARBytes is the largest CIFAR file, or set of batch files read into
// one Dataset, accepted (1 GiB). The real sets are far below: CIFAR-10's
// five training batches hold 153,650,000 bytes, CIFAR-100's train.bin
// 153,700,000. The bound is checked before anything is allocated.
const MaxCIFARBytes = 1 << 30

// CIFARLabel chooses which of CIFAR-100's two labels a Dataset gets.
type CIFARLabel int

const (
	// CIFAR100Fine is the label of 100 classes (the second byte of a
	// record).
	CIFAR100Fine CIFARLabel = iota
	// CIFAR100Coarse is the label of 20 superclasses (the first byte).
	CIFAR100Coarse
)

// CIFAR10Classes names the ten CIFAR-10 classes, by label, as
// batches.meta.txt does.
var CIFAR10Classes = []string{
	"airplane", "automobile", "bird", "cat", "deer",
	"dog", "frog", "horse", "ship", "truck",
}

// cifarFormat describes one of the two record layouts.
type cifarFormat struct {
	name       string // "CIFAR-10" or "CIFAR-100"
	recordSize int
	// labelByte is the offset in a record of the label kept; classes its
	// range. The other label byte of CIFAR-100 is checked too (checkByte,
	// checkClasses), so that a file passes or fails whichever is kept.
	labelByte, classes      int
	checkByte, checkClasses int
	labelName, checkName    string
}

var cifar10Format = cifarFormat{name: "CIFAR-10", recordSize: CIFAR10RecordSize, labelByte: 0, classes: 10, checkByte: -1, labelName: "label"}

func cifar100Format(label CIFARLabel) cifarFormat {
	f := cifarFormat{name: "CIFAR-100", recordSize: CIFAR100RecordSize,
		labelByte: 1, classes: 100, labelName: "fine label",
		checkByte: 0, checkClasses: 20, checkName: "coarse label"}
	if label == CIFAR100Coarse {
		f.labelByte, f.classes, f.labelName, f.checkByte, f.checkClasses, f.checkName =
			f.checkByte, f.checkClasses, f.checkName, f.labelByte, f.classes, f.labelName
	}
	return f
}

// ReadCIFAR10File reads one CIFAR-10 binary file (data_batch_1.bin, ...,
// test_batch.bin, or a file of your own in the same format) into a Dataset
// of 3x32x32 images with 10 classes named by CIFAR10Classes. The file's size
// must be a positive whole number of 3073-byte records (the real batches
// hold 10000; any number is accepted) and at most MaxCIFARBytes, and every
// label below 10. Every error is an *Error naming path and, for a bad
// label, the record.
func ReadCIFAR10File(path string) (*Dataset, error) {
	d, err := readCIFARFiles([]string{path}, cifar10Format)
	if err != nil {
		return nil, err
	}
	d.ClassNames = slices.Clone(CIFAR10Classes)
	return d, nil
}

// ReadCIFAR10 is ReadCIFAR10File for a reader; name is used in error
// messages only. It reads at most MaxCIFARBytes+1 bytes.
func ReadCIFAR10(r io.Reader, name string) (*Dataset, error) {
	d, err := readCIFAR(r, name, cifar10Format)
	if err != nil {
		return nil, err
	}
	d.ClassNames = slices.Clone(CIFAR10Classes)
	return d, nil
}

// ReadCIFAR100File reads one CIFAR-100 binary file (train.bin, test.bin or
// one of your own) into a Dataset of 3x32x32 images whose labels are the
// fine (100 classes) or coarse (20) ones, as label says. Checks are those of
// ReadCIFAR10File with 3074-byte records; both labels of every record are
// checked (fine below 100, coarse below 20), whichever is kept. ClassNames
// is nil: LoadCIFAR100 reads the names from the data set's files.
func ReadCIFAR100File(path string, label CIFARLabel) (*Dataset, error) {
	return readCIFARFiles([]string{path}, cifar100Format(label))
}

// ReadCIFAR100 is ReadCIFAR100File for a reader; name is used in error
// messages only.
func ReadCIFAR100(r io.Reader, name string, label CIFARLabel) (*Dataset, error) {
	return readCIFAR(r, name, cifar100Format(label))
}

// readCIFAR reads a stream, bounded by MaxCIFARBytes, and parses it.
func readCIFAR(r io.Reader, name string, f cifarFormat) (*Dataset, error) {
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(r, MaxCIFARBytes+1))
	if err != nil {
		return nil, errorf(name, err, "read: %v", unwrapPathError(err))
	}
	if err := checkCIFARSize(name, n, f); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	if err := checkCIFARLabels(name, b, f); err != nil {
		return nil, err
	}
	return compactCIFAR(b, f), nil
}

// checkCIFARSize checks that a file of n bytes holds whole records.
func checkCIFARSize(name string, n int64, f cifarFormat) error {
	rs := int64(f.recordSize)
	switch {
	case n == 0:
		return errorf(name, nil, "empty file, want %s records of %d bytes", f.name, rs)
	case n > MaxCIFARBytes:
		return errorf(name, nil, "more than %d bytes, the most supported", int64(MaxCIFARBytes))
	case n%rs != 0:
		return errorf(name, nil, "%d bytes is not a whole number of %d-byte %s records (%d records and %d bytes over)", n, rs, f.name, n/rs, n%rs)
	}
	return nil
}

// checkCIFARLabels checks the label bytes of every record in b.
func checkCIFARLabels(name string, b []byte, f cifarFormat) error {
	rs := f.recordSize
	for i := 0; i*rs < len(b); i++ {
		rec := b[i*rs:]
		if l := int(rec[f.labelByte]); l >= f.classes {
			return errorf(name, nil, "record %d (byte %d): %s %d, want 0 to %d", i, i*rs+f.labelByte, f.labelName, l, f.classes-1)
		}
		if f.checkByte >= 0 {
			if l := int(rec[f.checkByte]); l >= f.checkClasses {
				return errorf(name, nil, "record %d (byte %d): %s %d, want 0 to %d", i, i*rs+f.checkByte, f.checkName, l, f.checkClasses-1)
			}
		}
	}
	return nil
}

// compactCIFAR turns records in b into a Dataset in place: the kept labels
// are copied out and the images moved down over the label bytes (copy
// handles the overlap), so no second image buffer is needed.
func compactCIFAR(b []byte, f cifarFormat) *Dataset {
	rs, lb := f.recordSize, f.recordSize-CIFARImageBytes
	n := len(b) / rs
	labels := make([]uint8, n)
	for i := range n {
		labels[i] = b[i*rs+f.labelByte]
		copy(b[i*CIFARImageBytes:(i+1)*CIFARImageBytes], b[i*rs+lb:(i+1)*rs])
	}
	return &Dataset{
		Images: b[: n*CIFARImageBytes : n*CIFARImageBytes], Labels: labels,
		N: n, Rows: CIFARSide, Cols: CIFARSide, Channels: 3, Classes: f.classes,
	}
}

// readCIFARFiles reads files of one format into a single Dataset, records
// in file order. All sizes are checked (regular files, whole records, at
// most MaxCIFARBytes in all) before the one buffer is allocated; the files
// are then read into it concurrently.
func readCIFARFiles(paths []string, f cifarFormat) (*Dataset, error) {
	files := make([]*os.File, len(paths))
	defer func() {
		for _, fl := range files {
			if fl != nil {
				fl.Close()
			}
		}
	}()
	offsets := make([]int64, len(paths)+1)
	for i, p := range paths {
		fl, err := os.Open(p)
		if err != nil {
			return nil, openError(p, err)
		}
		files[i] = fl
		st, err := fl.Stat()
		if err != nil {
			return nil, openError(p, err)
		}
		if !st.Mode().IsRegular() {
			return nil, errorf(p, nil, "not a regular file")
		}
		if err := checkCIFARSize(p, st.Size(), f); err != nil {
			return nil, err
		}
		offsets[i+1] = offsets[i] + st.Size()
		if offsets[i+1] > MaxCIFARBytes {
			return nil, errorf(p, nil, "with the %d files before it, more than %d bytes, the most supported in one data set", i, int64(MaxCIFARBytes))
		}
	}
	buf := make([]byte, offsets[len(paths)])
	errs := make([]error, len(paths))
	var wg sync.WaitGroup
	for i := range paths {
		wg.Go(func() {
			part := buf[offsets[i]:offsets[i+1]]
			if n, err := io.ReadFull(files[i], part); err != nil {
				errs[i] = errorf(paths[i], err, "read: %d of %d bytes: %v", n, len(part), unwrapPathError(err))
				return
			}
			if n, _ := files[i].Read(make([]byte, 1)); n > 0 {
				errs[i] = errorf(paths[i], nil, "grew while being read (was %d bytes)", len(part))
				return
			}
			errs[i] = checkCIFARLabels(paths[i], part, f)
		})
	}
	wg.Wait()
	for _, e := range errs {
		if e != nil {
			return nil, e // the first, in file order
		}
	}
	return compactCIFAR(buf, f), nil
}

// CIFARSet describes one of the CIFAR data sets as distributed in its
// binary version: the archive, and the directory and files it unpacks to.
type CIFARSet struct {
	// Name is "CIFAR-10" or "CIFAR-100".
	Name string
	// Archive is the name of the distributed .tar.gz file and MD5 its sum.
	Archive, MD5 string
	// Dir is the one top-level directory of the archive.
	Dir string
	// Train and Test are the record files under Dir; Meta the files of
	// class names (one name a line) that may be there too.
	Train, Test, Meta []string
}

// The two CIFAR data sets in their binary versions. The MD5 sums are those
// published with the archives (and checked by torchvision).
var (
	CIFAR10 = CIFARSet{
		Name: "CIFAR-10", Archive: "cifar-10-binary.tar.gz", MD5: "c32a1d4ab5d03f1284b67883e8d87530",
		Dir:   "cifar-10-batches-bin",
		Train: []string{"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin", "data_batch_4.bin", "data_batch_5.bin"},
		Test:  []string{"test_batch.bin"},
		Meta:  []string{"batches.meta.txt"},
	}
	CIFAR100 = CIFARSet{
		Name: "CIFAR-100", Archive: "cifar-100-binary.tar.gz", MD5: "03b5dce01913d631647c71ecec9e9cb8",
		Dir:   "cifar-100-binary",
		Train: []string{"train.bin"},
		Test:  []string{"test.bin"},
		Meta:  []string{"fine_label_names.txt", "coarse_label_names.txt"},
	}
)

// CIFARMirrors are the base URLs DownloadCIFAR tries by default: the
// archives' home page.
var CIFARMirrors = []string{"https://www.cs.toronto.edu/~kriz/"}

// cifarDir returns dir/set.Dir when that holds the set's first training
// file, else dir, so that either the unpacked directory or the one it was
// unpacked into can be given.
func cifarDir(dir string, set CIFARSet) string {
	sub := filepath.Join(dir, set.Dir)
	if _, err := os.Stat(filepath.Join(sub, set.Train[0])); err == nil {
		return sub
	}
	return dir
}

// LoadCIFAR10 reads CIFAR-10 from dir, which is either the unpacked
// cifar-10-batches-bin directory or the directory holding it: the five
// training batches as one Dataset (50000 images for the real set) and
// test_batch.bin (10000). Class names come from batches.meta.txt when it is
// there (it must then hold ten names, one a line), else from
// CIFAR10Classes. Files are checked as ReadCIFAR10File does. A missing
// file is an error that says how to get the set.
func LoadCIFAR10(dir string) (train, test *Dataset, err error) {
	return loadCIFAR(dir, CIFAR10, cifar10Format, CIFAR10Classes)
}

// LoadCIFAR100 reads CIFAR-100 from dir, the unpacked cifar-100-binary
// directory or the directory holding it: train.bin (50000 images) and
// test.bin (10000), with the fine or coarse labels. Class names come from
// fine_label_names.txt or coarse_label_names.txt when there (100 or 20
// names); else ClassNames is nil.
func LoadCIFAR100(dir string, label CIFARLabel) (train, test *Dataset, err error) {
	return loadCIFAR(dir, CIFAR100, cifar100Format(label), nil)
}

func loadCIFAR(dir string, set CIFARSet, f cifarFormat, defaultNames []string) (train, test *Dataset, err error) {
	dir = cifarDir(dir, set)
	for _, name := range append(slices.Clone(set.Train), set.Test...) {
		p := filepath.Join(dir, name)
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			return nil, nil, errorf(p, err, "no such file: want %s in its binary version (%s unpacked; data.DownloadCIFAR fetches it)", set.Name, set.Archive)
		}
	}
	names := defaultNames
	meta := set.Meta[0]
	if f.classes == 20 {
		meta = set.Meta[1]
	}
	if p := filepath.Join(dir, meta); fileExists(p) {
		if names, err = readClassNames(p, f.classes); err != nil {
			return nil, nil, err
		}
	}
	join := func(files []string) []string {
		out := make([]string, len(files))
		for i, n := range files {
			out[i] = filepath.Join(dir, n)
		}
		return out
	}
	if train, err = readCIFARFiles(join(set.Train), f); err != nil {
		return nil, nil, err
	}
	if test, err = readCIFARFiles(join(set.Test), f); err != nil {
		return nil, nil, err
	}
	if names != nil {
		train.ClassNames, test.ClassNames = slices.Clone(names), slices.Clone(names)
	}
	return train, test, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// maxClassNamesBytes bounds a file of class names.
const maxClassNamesBytes = 1 << 20

// readClassNames reads a file of class names, one a line, and checks that
// it holds exactly want non-empty names. Blank lines at the end (the CIFAR
// files have some) are ignored; leading and trailing white space of each
// line is dropped.
func readClassNames(path string, want int) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, openError(path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxClassNamesBytes+1))
	if err != nil {
		return nil, errorf(path, err, "read: %v", unwrapPathError(err))
	}
	if len(b) > maxClassNamesBytes {
		return nil, errorf(path, nil, "more than %d bytes, too long for a file of class names", maxClassNamesBytes)
	}
	lines := strings.Split(string(b), "\n")
	for len(lines) > 0 && strings.TrimSpace(lines[len(lines)-1]) == "" {
		lines = lines[:len(lines)-1]
	}
	for i, l := range lines {
		lines[i] = strings.TrimSpace(l)
		if lines[i] == "" {
			return nil, errorf(path, nil, "line %d is empty, want one class name a line", i+1)
		}
	}
	if len(lines) != want {
		return nil, errorf(path, nil, "%d class names, want %d", len(lines), want)
	}
	return lines, nil
}

// cifarReady reports whether dir holds every record file of set.
func cifarReady(dir string, set CIFARSet) bool {
	for _, name := range append(slices.Clone(set.Train), set.Test...) {
		st, err := os.Stat(filepath.Join(dir, name))
		if err != nil || !st.Mode().IsRegular() {
			return false
		}
	}
	return true
}
