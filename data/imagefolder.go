package data

import (
	"image"
	_ "image/gif"  // registers GIF with image.Decode
	_ "image/jpeg" // registers JPEG with image.Decode
	_ "image/png"  // registers PNG with image.Decode
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
)

// Bounds on image folders, checked before anything is allocated or decoded.
const (
	// MaxImageFolderBytes bounds the decoded data set, N*Channels*Height*
	// Width bytes (2 GiB).
	MaxImageFolderBytes = 1 << 31
	// MaxImagePixels bounds one image, as its header states it before it
	// is decoded, and the size images are resized to (64 Mi pixels).
	MaxImagePixels = 1 << 26
	// maxImageFileBytes bounds one image file.
	maxImageFileBytes = 256 << 20
	// maxClassDirs is the most classes a Dataset's byte labels can hold.
	maxClassDirs = 256
)

// imageExtensions are the file name endings LoadImageFolder reads, in lower
// case.
var imageExtensions = []string{".png", ".jpg", ".jpeg", ".gif"}

// ImageFolderOptions configures LoadImageFolder.
type ImageFolderOptions struct {
	// Channels is 3 for red, green and blue, or 1 for grey; 0 means 3.
	// Every image is converted to it, whatever its own colour model: grey
	// from colour is the luma of ITU-R BT.601 (0.299 R + 0.587 G + 0.114 B,
	// as image/color's GrayModel computes it), colour from grey repeats the
	// grey value, and transparent pixels are composed over black.
	Channels int
	// Width and Height, when both positive, are the size every image is
	// resized to, by area averaging: each output pixel is the mean of the
	// source area it covers, each source pixel weighted by the part of it
	// inside that area (a box filter; when enlarging, this repeats pixels
	// and blends them at the seams). When both are 0 no image is resized
	// and all must have the size of the first.
	Width, Height int
	// Workers is the number of images decoded at once; 0 means
	// runtime.GOMAXPROCS(0).
	Workers int
}

// LoadImageFolder reads a data set laid out as one sub-directory of dir per
// class, each holding that class's images as PNG, JPEG or GIF files (names
// ending in .png, .jpg, .jpeg or .gif, in any case; the first frame of a
// GIF). Classes are the sub-directories' names in sorted (byte) order,
// label 0 first; within a class the images are in sorted order of their
// names, so example i is always the same file. Entries whose names start
// with "." are skipped, as are files with other endings, files directly in
// dir and directories inside class directories. A class directory without
// images is an error, as are more than 256 classes (labels are bytes).
//
// The images are decoded concurrently (opt.Workers at a time) straight into
// the Dataset's one buffer of uint8 CHW images: every size is checked from
// the file headers first, against MaxImagePixels and MaxImageFolderBytes.
// Errors are *Error naming the file; when several files are bad, the first
// in the data set's order is reported.
func LoadImageFolder(dir string, opt ImageFolderOptions) (*Dataset, error) {
	channels := opt.Channels
	if channels == 0 {
		channels = 3
	}
	if channels != 1 && channels != 3 {
		return nil, errorf(dir, nil, "ImageFolderOptions.Channels is %d, want 1 (grey) or 3 (RGB)", opt.Channels)
	}
	resize := opt.Width > 0 || opt.Height > 0
	if opt.Width < 0 || opt.Height < 0 || resize && (opt.Width == 0 || opt.Height == 0) {
		return nil, errorf(dir, nil, "ImageFolderOptions.Width and Height are %d and %d, want both positive (resize) or both 0 (no resizing)", opt.Width, opt.Height)
	}
	if resize && int64(opt.Width)*int64(opt.Height) > MaxImagePixels {
		return nil, errorf(dir, nil, "ImageFolderOptions asks for %dx%d images, more than the %d pixels supported", opt.Width, opt.Height, MaxImagePixels)
	}
	classes, files, labels, err := listImageFolder(dir)
	if err != nil {
		return nil, err
	}
	w, h := opt.Width, opt.Height
	if !resize {
		cfg, err := imageConfig(files[0])
		if err != nil {
			return nil, err
		}
		w, h = cfg.Width, cfg.Height
	}
	size := int64(channels) * int64(w) * int64(h)
	if total := size * int64(len(files)); total > MaxImageFolderBytes {
		return nil, errorf(dir, nil, "%d images of %dx%dx%d are %d bytes, more than the %d supported", len(files), channels, h, w, total, int64(MaxImageFolderBytes))
	}
	d := &Dataset{
		Images: make([]uint8, size*int64(len(files))), Labels: labels,
		N: len(files), Rows: h, Cols: w, Channels: channels,
		Classes: len(classes), ClassNames: classes,
	}
	workers := opt.Workers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	errs := make([]error, len(files))
	var (
		next   atomic.Int64
		failed atomic.Bool
		wg     sync.WaitGroup
	)
	var want *image.Point // the size every image must have, unless resized
	if !resize {
		want = &image.Point{X: w, Y: h}
	}
	for range min(workers, len(files)) {
		wg.Go(func() {
			for !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= len(files) {
					return
				}
				if errs[i] = decodeInto(d.Image(i), files[i], channels, w, h, want, files[0]); errs[i] != nil {
					failed.Store(true)
				}
			}
		})
	}
	wg.Wait()
	for _, e := range errs {
		if e != nil {
			return nil, e
		}
	}
	return d, nil
}

// listImageFolder returns the sorted class names, the image files in data
// set order and their labels.
func listImageFolder(dir string) (classes, files []string, labels []uint8, err error) {
	st, err := os.Stat(dir)
	if err != nil {
		return nil, nil, nil, openError(dir, err)
	}
	if !st.IsDir() {
		return nil, nil, nil, errorf(dir, nil, "not a directory, want one sub-directory of images per class")
	}
	entries, err := os.ReadDir(dir) // sorted by name
	if err != nil {
		return nil, nil, nil, errorf(dir, err, "read: %v", unwrapPathError(err))
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if st, err := os.Stat(p); err != nil || !st.IsDir() { // follows links
			continue
		}
		if len(classes) == maxClassDirs {
			return nil, nil, nil, errorf(dir, nil, "more than %d class directories, the most byte labels can hold", maxClassDirs)
		}
		imgs, err := os.ReadDir(p)
		if err != nil {
			return nil, nil, nil, errorf(p, err, "read: %v", unwrapPathError(err))
		}
		n := 0
		for _, f := range imgs {
			if strings.HasPrefix(f.Name(), ".") || !hasImageExtension(f.Name()) {
				continue
			}
			fp := filepath.Join(p, f.Name())
			if st, err := os.Stat(fp); err != nil || st.IsDir() {
				continue
			}
			files = append(files, fp)
			labels = append(labels, uint8(len(classes)))
			n++
		}
		if n == 0 {
			return nil, nil, nil, errorf(p, nil, "class directory holds no images (.png, .jpg, .jpeg or .gif files)")
		}
		classes = append(classes, e.Name())
	}
	if len(classes) == 0 {
		return nil, nil, nil, errorf(dir, nil, "no class directories, want one sub-directory of images per class")
	}
	return classes, files, labels, nil
}

func hasImageExtension(name string) bool {
	ext := strings.ToLower(filepath.Ext(name))
	for _, e := range imageExtensions {
		if ext == e {
			return true
		}
	}
	return false
}

// openImage opens an image file and checks that it is a regular file of at
// most maxImageFileBytes.
func openImage(path string) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, openError(path, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, openError(path, err)
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, errorf(path, nil, "not a regular file")
	}
	if st.Size() > maxImageFileBytes {
		f.Close()
		return nil, errorf(path, nil, "%d bytes, more than the %d supported for one image", st.Size(), maxImageFileBytes)
	}
	return f, nil
}

// imageConfig reads an image's header and checks its size.
func imageConfig(path string) (image.Config, error) {
	f, err := openImage(path)
	if err != nil {
		return image.Config{}, err
	}
	defer f.Close()
	return checkedConfig(f, path)
}

func checkedConfig(r io.Reader, path string) (image.Config, error) {
	cfg, format, err := image.DecodeConfig(r)
	if err != nil {
		return cfg, errorf(path, err, "not a PNG, JPEG or GIF image: %v", err)
	}
	if cfg.Width <= 0 || cfg.Height <= 0 || int64(cfg.Width)*int64(cfg.Height) > MaxImagePixels {
		return cfg, errorf(path, nil, "%s header says %dx%d, want at least 1x1 and at most %d pixels", format, cfg.Width, cfg.Height, MaxImagePixels)
	}
	return cfg, nil
}

// decodeInto decodes the image at path into dst (channels*h*w bytes, CHW),
// resizing it to w x h. When want is not nil the image must be that size
// already (first names the file that set it, for the message).
func decodeInto(dst []uint8, path string, channels, w, h int, want *image.Point, first string) error {
	f, err := openImage(path)
	if err != nil {
		return err
	}
	defer f.Close()
	cfg, err := checkedConfig(f, path)
	if err != nil {
		return err
	}
	if want != nil && (cfg.Width != want.X || cfg.Height != want.Y) {
		return errorf(path, nil, "image is %dx%d (width x height), want %dx%d like %s; set ImageFolderOptions.Width and Height to resize", cfg.Width, cfg.Height, want.X, want.Y, first)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return errorf(path, err, "seek: %v", unwrapPathError(err))
	}
	img, _, err := image.Decode(f)
	if err != nil {
		return errorf(path, err, "decode: %v", err)
	}
	b := img.Bounds()
	if b.Dx() != cfg.Width || b.Dy() != cfg.Height {
		return errorf(path, nil, "decoded to %dx%d but its header says %dx%d", b.Dx(), b.Dy(), cfg.Width, cfg.Height)
	}
	if b.Dx() == w && b.Dy() == h {
		toPlanes(dst, img, channels)
		return nil
	}
	src := make([]uint8, channels*b.Dx()*b.Dy())
	toPlanes(src, img, channels)
	resizeArea(dst, src, channels, b.Dx(), b.Dy(), w, h)
	return nil
}

// toPlanes writes img into dst as channels planes (CHW) of its own size.
func toPlanes(dst []uint8, img image.Image, channels int) {
	b := img.Bounds()
	w, h := b.Dx(), b.Dy()
	plane := w * h
	if g, ok := img.(*image.Gray); ok && channels == 1 {
		for y := range h {
			copy(dst[y*w:(y+1)*w], g.Pix[y*g.Stride:y*g.Stride+w])
		}
		return
	}
	for y := range h {
		for x := range w {
			r, g, bl, _ := img.At(b.Min.X+x, b.Min.Y+y).RGBA() // 16 bits, alpha premultiplied: over black
			i := y*w + x
			if channels == 1 {
				// image/color's GrayModel: BT.601 luma in 16.16 fixed point.
				dst[i] = uint8((19595*r + 38470*g + 7471*bl + 1<<15) >> 24)
				continue
			}
			dst[i], dst[plane+i], dst[2*plane+i] = uint8(r>>8), uint8(g>>8), uint8(bl>>8)
		}
	}
}

// areaWeights returns, for each of out output positions along an axis of in
// input positions, the first input index and the weights of the inputs from
// there on: output j covers input interval [j*s, (j+1)*s) with s = in/out,
// and input i weighs its overlap with that interval divided by s, so the
// weights of each output sum to 1.
func areaWeights(in, out int) (first []int, weights [][]float32) {
	s := float64(in) / float64(out)
	first = make([]int, out)
	weights = make([][]float32, out)
	for j := range out {
		lo, hi := float64(j)*s, float64(j+1)*s
		i0 := int(math.Floor(lo))
		i1 := min(int(math.Ceil(hi)), in)
		first[j] = i0
		for i := i0; i < i1; i++ {
			if ov := math.Min(float64(i+1), hi) - math.Max(float64(i), lo); ov > 0 {
				weights[j] = append(weights[j], float32(ov/s))
			} else {
				weights[j] = append(weights[j], 0)
			}
		}
	}
	return first, weights
}

// resizeArea resizes src (channels planes of sw x sh) to dst (channels
// planes of dw x dh) by area averaging, rows first, then columns; results
// are rounded to the nearest byte.
func resizeArea(dst, src []uint8, channels, sw, sh, dw, dh int) {
	xf, xw := areaWeights(sw, dw)
	yf, yw := areaWeights(sh, dh)
	tmp := make([]float32, sh*dw) // one channel, resized across
	for c := range channels {
		sp := src[c*sw*sh : (c+1)*sw*sh]
		for y := range sh {
			row := sp[y*sw : (y+1)*sw]
			for j := range dw {
				var v float32
				for k, wt := range xw[j] {
					v += wt * float32(row[xf[j]+k])
				}
				tmp[y*dw+j] = v
			}
		}
		dp := dst[c*dw*dh : (c+1)*dw*dh]
		for j := range dh {
			for x := range dw {
				var v float32
				for k, wt := range yw[j] {
					v += wt * tmp[(yf[j]+k)*dw+x]
				}
				dp[j*dw+x] = uint8(min(max(v+0.5, 0), 255))
			}
		}
	}
}
