package data

import (
	"compress/gzip"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// FashionMNISTDebianDir is where Debian's package dataset-fashion-mnist
// installs the four Fashion-MNIST .gz files (`apt-get install
// dataset-fashion-mnist`). LocateFashionMNIST looks there by default.
const FashionMNISTDebianDir = "/usr/share/datasets/fashion-mnist"

// OriginDebian is the Origin of a data set found where a Debian package
// installs it.
const OriginDebian = "Debian package"

// fashionMNISTDebianDir is FashionMNISTDebianDir; a variable so that tests
// can point it elsewhere.
var fashionMNISTDebianDir = FashionMNISTDebianDir

// FashionMNISTClasses names the ten Fashion-MNIST classes, by label.
var FashionMNISTClasses = []string{
	"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
	"Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
}

// fileID is one accepted identity of a file: its size in bytes (-1 when
// not recorded) and MD5 sum.
type fileID struct {
	size int64
	md5  string
	who  string // whose copy this is, for messages
}

// fashionFile is what is known of one Fashion-MNIST file: the identities
// accepted for its .gz form and the identity of its uncompressed content.
type fashionFile struct {
	gz  []fileID
	raw fileID
}

// fashionMNISTFiles lists the accepted Fashion-MNIST files, by the base
// name (without ".gz") shared with MNIST.
//
// The upstream .gz sums are those torchvision checks
// (torchvision.datasets.FashionMNIST.resources); their sizes are not
// recorded here. Debian's package recompresses the files (its gzip headers
// carry the packaging date and no file name), so its .gz files have other
// sums, measured on dataset-fashion-mnist 0.0~git20200523.55506a9-1; their
// uncompressed contents are byte for byte the upstream ones (the raw sums
// below, which torchvision's tests also list). A .gz file matching neither
// is accepted when its content has the raw size and sum.
var fashionMNISTFiles = map[string]fashionFile{
	TrainImagesFile: {
		gz: []fileID{
			{-1, "8d4fb7e6c68d591d4c3dfef9ec88bf0d", "upstream"},
			{26421856, "cf8536b0aa1a6ac5fa3f23001093305c", "Debian"},
		},
		raw: fileID{47040016, "f4a8712d7a061bf5bd6d2ca38dc4d50a", "uncompressed"},
	},
	TrainLabelsFile: {
		gz: []fileID{
			{-1, "25c81989df183df01b3e8a0aad5dffbe", "upstream"},
			{29491, "10bea18fdb374794d4bb42e356e600c9", "Debian"},
		},
		raw: fileID{60008, "9018921c3c673c538a1fc5bad174d6f9", "uncompressed"},
	},
	TestImagesFile: {
		gz: []fileID{
			{-1, "bef4ecab320f06d8554ea6380940ec79", "upstream"},
			{4422079, "f78720b4224f21cce2f2ccf2d7a94c9a", "Debian"},
		},
		raw: fileID{7840016, "8181f5470baa50b63fa0f6fddb340f0a", "uncompressed"},
	},
	TestLabelsFile: {
		gz: []fileID{
			{-1, "bb300cfdad3c16e7a12a480ee83cd310", "upstream"},
			{5125, "0d30e22e447f3c33dab9ed536400ac01", "Debian"},
		},
		raw: fileID{10008, "15d484375f8d13e6eb1aabb0c3f46965", "uncompressed"},
	},
}

// Located is a data set found on disk and verified.
type Located struct {
	// Name is the data set's name, such as "Fashion-MNIST".
	Name string
	// Dir is the directory holding its files.
	Dir string
	// Origin says how Dir was found: OriginFlag when the caller gave it,
	// OriginDebian when it is where a Debian package installs the set.
	Origin string
	// Files are the verified files, in the order train images, train
	// labels, test images, test labels for the MNIST layout.
	Files []string
}

// Describe returns a one-line description of l for logs, such as
//
//	Fashion-MNIST from the Debian package dataset-fashion-mnist (MD5 verified): /usr/share/datasets/fashion-mnist
//	Fashion-MNIST from --data /x (MD5 verified)
func (l Located) Describe() string {
	switch {
	case l.Dir == "":
		return "no data source"
	case l.Origin == OriginDebian:
		return fmt.Sprintf("%s from the Debian package dataset-%s (MD5 verified): %s", l.Name, strings.ToLower(l.Name), l.Dir)
	}
	return fmt.Sprintf("%s from %s %s (MD5 verified)", l.Name, l.Origin, l.Dir)
}

// fashionInstallHint ends the error for missing files.
const fashionInstallHint = "install it with `apt-get install dataset-fashion-mnist` (files in " + FashionMNISTDebianDir + ") or pass a directory holding the four files"

// LocateFashionMNIST finds and verifies the four Fashion-MNIST files, in dir
// when dir is not empty, else in FashionMNISTDebianDir. Each file may be
// gzip-compressed (name ending in ".gz", preferred when both exist) or raw.
// A raw file must have the exact size and MD5 sum of the canonical file; a
// .gz file the sum of the upstream or of Debian's copy, or else content of
// the canonical size and sum (so a file recompressed by any tool passes).
// Sizes are checked before anything is read.
//
// It does not fall through: a dir that lacks the files is an error, not a
// reason to look in the Debian location. Errors are *Error; missing files
// are reported with how to install them.
func LocateFashionMNIST(dir string) (Located, error) {
	origin := OriginFlag
	if dir == "" {
		dir, origin = fashionMNISTDebianDir, OriginDebian
	}
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return Located{}, errorf(dir, err, "Fashion-MNIST not found (no such directory): %s", fashionInstallHint)
	case err != nil:
		return Located{}, openError(dir, err)
	case !st.IsDir():
		return Located{}, errorf(dir, nil, "not a directory")
	}
	loc := Located{Name: "Fashion-MNIST", Dir: dir, Origin: origin}
	for _, base := range mnistFiles {
		p, err := findFile(dir, base)
		if err != nil {
			return Located{}, errorf(filepath.Join(dir, base+".gz"), err, "Fashion-MNIST file missing (nor %s without .gz): %s", base, fashionInstallHint)
		}
		if err := verifyFashionFile(p, fashionMNISTFiles[base]); err != nil {
			return Located{}, err
		}
		loc.Files = append(loc.Files, p)
	}
	return loc, nil
}

// verifyFashionFile checks one file against the identities in want.
func verifyFashionFile(path string, want fashionFile) error {
	f, err := os.Open(path)
	if err != nil {
		return openError(path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return openError(path, err)
	}
	if !st.Mode().IsRegular() {
		return errorf(path, nil, "not a regular file")
	}
	size := st.Size()
	if !strings.HasSuffix(path, ".gz") {
		if size != want.raw.size {
			return errorf(path, nil, "%d bytes, want %d (the canonical Fashion-MNIST file)", size, want.raw.size)
		}
		sum, err := readerMD5(f, path)
		if err != nil {
			return err
		}
		if sum != want.raw.md5 {
			return errorf(path, nil, "MD5 %s, want %s: not the canonical Fashion-MNIST file", sum, want.raw.md5)
		}
		return nil
	}
	// No gzip stream of this content is larger than the content itself
	// plus a small overhead; anything bigger is not the file.
	if limit := want.raw.size + want.raw.size/100 + 1024; size > limit {
		return errorf(path, nil, "%d bytes, more than a gzip file of Fashion-MNIST's %d bytes can be", size, want.raw.size)
	}
	sum, err := readerMD5(f, path)
	if err != nil {
		return err
	}
	for _, id := range want.gz {
		if sum == id.md5 && (id.size < 0 || id.size == size) {
			return nil
		}
	}
	// Not a known compressed file: check what it decompresses to.
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return errorf(path, err, "seek: %v", unwrapPathError(err))
	}
	zr, err := gzip.NewReader(f)
	if err != nil {
		return gzipError(path, err)
	}
	h := md5.New()
	n, err := io.Copy(h, io.LimitReader(zr, want.raw.size+1))
	if err != nil {
		return gzipError(path, err)
	}
	if raw := hex.EncodeToString(h.Sum(nil)); n != want.raw.size || raw != want.raw.md5 {
		return errorf(path, nil, "MD5 %s (%d bytes), want the upstream %s or Debian's %s, or content of %d bytes with MD5 %s: not the canonical Fashion-MNIST file",
			sum, size, want.gz[0].md5, want.gz[1].md5, want.raw.size, want.raw.md5)
	}
	return nil
}

func readerMD5(r io.Reader, path string) (string, error) {
	h := md5.New()
	if _, err := io.Copy(h, r); err != nil {
		return "", errorf(path, err, "read: %v", unwrapPathError(err))
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// LoadFashionMNIST reads the four Fashion-MNIST files from dir as LoadMNIST
// does (no checksums: LocateFashionMNIST checks those) and labels the sets
// with Channels 1, Classes 10 and FashionMNISTClasses.
func LoadFashionMNIST(dir string) (train, test *Dataset, err error) {
	train, test, err = LoadMNIST(dir)
	if err != nil {
		return nil, nil, err
	}
	for _, d := range []*Dataset{train, test} {
		d.Channels, d.Classes = 1, len(FashionMNISTClasses)
		d.ClassNames = slices.Clone(FashionMNISTClasses)
	}
	return train, test, nil
}
