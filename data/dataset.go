package data

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
)

// The canonical MNIST file names, without the ".gz" that the distributed
// files carry. Fashion-MNIST and other drop-in replacements use the same
// names.
const (
	TrainImagesFile = "train-images-idx3-ubyte"
	TrainLabelsFile = "train-labels-idx1-ubyte"
	TestImagesFile  = "t10k-images-idx3-ubyte"
	TestLabelsFile  = "t10k-labels-idx1-ubyte"
)

// NumClasses is the number of classes in MNIST-like data sets: labels are
// 0 to NumClasses-1.
const NumClasses = 10

// mnistFiles lists the four files in a fixed order: train images, train
// labels, test images, test labels.
var mnistFiles = [4]string{TrainImagesFile, TrainLabelsFile, TestImagesFile, TestLabelsFile}

// Dataset is a set of images with one label each, held in memory as raw
// bytes (0 = background, 255 = ink for MNIST). Images are grey-scale unless
// Channels says otherwise.
type Dataset struct {
	// Images holds N*Channels*Rows*Cols bytes, image after image; each image
	// is channel after channel (CHW), each channel row-major.
	Images []uint8
	// Labels holds N labels, each below NumClasses() (NumClasses, 10, for
	// MNIST and the data sets of its layout).
	Labels []uint8
	// N is the number of examples; Rows and Cols the size of each image.
	N, Rows, Cols int

	// The fields below were added for data sets other than MNIST. Their zero
	// values describe MNIST, so that a Dataset built before they existed
	// keeps its meaning: read them through NumChannels and NumClasses.

	// Channels is 1 (grey) or 3 (red, green, blue); 0 means 1.
	Channels int
	// Classes is the number of classes; 0 means NumClasses (10).
	Classes int
	// ClassNames, when not nil, names each class: len(ClassNames) ==
	// NumClasses().
	ClassNames []string
}

// NumChannels is the number of channels per pixel: Channels, or 1 when
// Channels is 0.
func (d *Dataset) NumChannels() int { return max(d.Channels, 1) }

// NumClasses is the number of classes: Classes, or the package's
// NumClasses (10) when Classes is 0.
func (d *Dataset) NumClasses() int {
	if d.Classes == 0 {
		return NumClasses
	}
	return d.Classes
}

// ImageSize is NumChannels()*Rows*Cols, the number of bytes in one image
// (Rows*Cols pixels for grey images).
func (d *Dataset) ImageSize() int { return d.NumChannels() * d.Rows * d.Cols }

// Image returns the bytes of image i (0 <= i < N), CHW. The slice shares
// memory with d.Images; its capacity is clipped so that appending to it
// cannot overwrite the next image.
func (d *Dataset) Image(i int) []uint8 {
	sz := d.ImageSize()
	return d.Images[i*sz : (i+1)*sz : (i+1)*sz]
}

// LoadMNIST reads the four MNIST files from dir (each may be gzip-compressed,
// named with ".gz", or raw, named without) and returns the training set
// (60000 images for MNIST) and the test set (10000). It checks each file's
// structure, that each images file has as many images as its labels file
// has labels, that labels are below NumClasses, and that both sets have
// images of the same size. It does not check checksums: use Locate for that.
// The files are read concurrently; the first error in the order train
// images, train labels, test images, test labels is returned, as an *Error.
func LoadMNIST(dir string) (train, test *Dataset, err error) {
	var paths [4]string
	for i, base := range mnistFiles {
		p, err := findFile(dir, base)
		if err != nil {
			return nil, nil, err
		}
		paths[i] = p
	}
	var (
		idx  [4]*IDX
		errs [4]error
		wg   sync.WaitGroup
	)
	for i := range paths {
		wg.Go(func() { idx[i], errs[i] = ReadIDXFile(paths[i]) })
	}
	wg.Wait()
	for _, e := range errs {
		if e != nil {
			return nil, nil, e
		}
	}
	train, err = newDataset(paths[0], idx[0], paths[1], idx[1])
	if err != nil {
		return nil, nil, err
	}
	test, err = newDataset(paths[2], idx[2], paths[3], idx[3])
	if err != nil {
		return nil, nil, err
	}
	if test.Rows != train.Rows || test.Cols != train.Cols {
		return nil, nil, errorf(paths[2], nil, "images are %dx%d but those in %s are %dx%d",
			test.Rows, test.Cols, paths[0], train.Rows, train.Cols)
	}
	return train, test, nil
}

// ReadDataset reads one images file and its labels file (each gzip or raw)
// and checks them as LoadMNIST does.
func ReadDataset(imagesPath, labelsPath string) (*Dataset, error) {
	var (
		im, lb       *IDX
		imErr, lbErr error
		wg           sync.WaitGroup
	)
	wg.Go(func() { im, imErr = ReadIDXFile(imagesPath) })
	lb, lbErr = ReadIDXFile(labelsPath)
	wg.Wait()
	if imErr != nil {
		return nil, imErr
	}
	if lbErr != nil {
		return nil, lbErr
	}
	return newDataset(imagesPath, im, labelsPath, lb)
}

func newDataset(imagesPath string, im *IDX, labelsPath string, lb *IDX) (*Dataset, error) {
	if len(im.Dims) != 3 {
		return nil, errorf(imagesPath, nil, "holds %s, want images (an IDX file of 3 dimensions, magic 0x00000803)", describeDims(im.Dims))
	}
	if len(lb.Dims) != 1 {
		return nil, errorf(labelsPath, nil, "holds %s, want labels (an IDX file of 1 dimension, magic 0x00000801)", describeDims(lb.Dims))
	}
	n := im.Dims[0]
	if lb.Dims[0] != n {
		return nil, errorf(imagesPath, nil, "has %d images but %s has %d labels", n, labelsPath, lb.Dims[0])
	}
	for i, l := range lb.Data {
		if l >= NumClasses {
			return nil, errorf(labelsPath, nil, "label %d at index %d is out of range, want 0 to %d", l, i, NumClasses-1)
		}
	}
	return &Dataset{Images: im.Data, Labels: lb.Data, N: n, Rows: im.Dims[1], Cols: im.Dims[2]}, nil
}

// findFile returns dir/base.gz if it exists, else dir/base if that exists.
func findFile(dir, base string) (string, error) {
	gz := filepath.Join(dir, base+".gz")
	if _, err := os.Stat(gz); err == nil {
		return gz, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", openError(gz, err)
	}
	raw := filepath.Join(dir, base)
	if _, err := os.Stat(raw); err == nil {
		return raw, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", openError(raw, err)
	}
	return "", errorf(gz, fs.ErrNotExist, "no such file (nor %s without .gz)", base)
}
