package main

import (
	"bufio"
	"errors"
	"fmt"
	"image"
	_ "image/gif" // registered for image.Decode
	"image/jpeg"
	"image/png"
	"io"
	"io/fs"
	"math"
	"os"
	"strings"

	"github.com/ember-ml/ember/internal/safefile"
)

// Side is the width and height of an MNIST image; box is the side of the
// box MNIST's digits were scaled to fit, centred by centre of mass.
const (
	side = 28
	box  = 20
)

// maxPixels bounds the images predict decodes: a decompression bomb in a
// small PNG would otherwise take gigabytes. Decoding takes up to 8 bytes a
// pixel (16-bit RGBA) and the grey levels 8 more, so 32 Mi pixels stay
// near half a GiB; a photo of a digit needs far fewer.
const maxPixels = 32 << 20

// prepOptions says how to turn a picture into an MNIST-like image.
type prepOptions struct {
	// invert is "auto" (invert when the border is light: dark ink on
	// light paper), "yes" or "no".
	invert string
	// center scales the digit to fit a 20×20 box and puts its centre of
	// mass at the centre of the 28×28 image, as MNIST was prepared;
	// without it the whole picture is padded to a square and resized.
	center bool
}

// loadImage decodes a PNG, JPEG or GIF file and prepares it as a 28×28
// MNIST-like image (light ink on a dark background, 0-255). Errors name
// the file and are one line.
//
// Only regular files are read: a directory, a device or a named pipe is
// refused by kind at once, and so is a file of more than maxImageFileBytes.
func loadImage(path string, o prepOptions) ([]uint8, error) {
	f, _, err := safefile.Open(path, maxImageFileBytes)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	defer f.Close()
	r := bufio.NewReader(f)
	cfg, format, err := image.DecodeConfig(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %s", path, decodeProblem(err, sniff(f)))
	}
	if cfg.Width <= 0 || cfg.Height <= 0 {
		return nil, fmt.Errorf("%s: the %s image is empty (%dx%d)", path, strings.ToUpper(format), cfg.Width, cfg.Height)
	}
	if int64(cfg.Width)*int64(cfg.Height) > maxPixels {
		return nil, fmt.Errorf("%s: the %s image is %dx%d, more than the limit of %d megapixels (scale it down)", path, strings.ToUpper(format), cfg.Width, cfg.Height, maxPixels>>20)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	img, _, err := image.Decode(bufio.NewReader(f))
	if err != nil {
		return nil, fmt.Errorf("%s: %s", path, decodeProblem(err, format))
	}
	return prepare(img, o), nil
}

// maxImageFileBytes bounds the size of an image file (far above any photo
// of a digit; the decoded size is bounded by maxPixels).
const maxImageFileBytes = 256 << 20

// sniff names the image format by the file's first bytes, "" if unknown.
func sniff(f *os.File) string {
	var b [8]byte
	n, _ := f.ReadAt(b[:], 0)
	s := string(b[:n])
	switch {
	case strings.HasPrefix(s, "\x89PNG"):
		return "png"
	case strings.HasPrefix(s, "\xff\xd8"):
		return "jpeg"
	case strings.HasPrefix(s, "GIF8"):
		return "gif"
	}
	return ""
}

// decodeProblem describes a decoding error in words, without the
// decoders' package prefixes.
func decodeProblem(err error, format string) string {
	if format == "" {
		format = "image"
	} else {
		format = strings.ToUpper(format) + " image"
	}
	var fe jpeg.FormatError
	var ue jpeg.UnsupportedError
	var pfe png.FormatError
	var pue png.UnsupportedError
	switch {
	case errors.Is(err, image.ErrFormat):
		return "not a PNG, JPEG or GIF image"
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF),
		strings.Contains(err.Error(), "not enough pixel data"): // png's word for it
		return fmt.Sprintf("the %s is truncated", format)
	case errors.As(err, &fe), errors.As(err, &pfe):
		return fmt.Sprintf("not a valid %s: %s", format, strings.TrimPrefix(strings.TrimPrefix(err.Error(), "png: "), "invalid JPEG format: "))
	case errors.As(err, &ue), errors.As(err, &pue):
		return fmt.Sprintf("unsupported %s: %s", format, err)
	}
	return strings.Join(strings.Fields(err.Error()), " ")
}

// prepare turns a picture into a 28×28 MNIST-like image:
//
//  1. grey levels in [0, 1] (luma, transparent pixels over white);
//  2. inverted when the border is light (MNIST has light ink on black);
//  3. contrast stretched: the border's mean level becomes 0, the
//     brightest pixel 1 (a photo of grey paper becomes black);
//  4. with center, cropped to the ink's bounding box, resized (area
//     averaging when shrinking, bilinear when enlarging) so that its
//     longer side is 20 pixels, and placed in the 28×28 image with its
//     centre of mass in the middle; otherwise padded to a square and
//     resized to 28×28.
func prepare(img image.Image, o prepOptions) []uint8 {
	g, w, h := grayLevels(img)
	border := borderMean(g, w, h)
	inv := o.invert == "yes" || (o.invert == "auto" && border > 0.5)
	if inv {
		for i, v := range g {
			g[i] = 1 - v
		}
		border = 1 - border
	}
	maxv := 0.0
	for _, v := range g {
		maxv = max(maxv, v)
	}
	if maxv-border < 1.0/255 {
		return make([]uint8, side*side) // blank
	}
	for i, v := range g {
		g[i] = min(1, max(0, (v-border)/(maxv-border)))
	}

	var out []float64
	if o.center {
		out = centre(g, w, h)
	} else {
		n := max(w, h)
		sq := make([]float64, n*n)
		x0, y0 := (n-w)/2, (n-h)/2
		for y := range h {
			copy(sq[(y0+y)*n+x0:], g[y*w:(y+1)*w])
		}
		out = resize(sq, n, n, side, side)
	}
	px := make([]uint8, side*side)
	for i, v := range out {
		px[i] = uint8(math.Round(255 * min(1, max(0, v))))
	}
	return px
}

// grayLevels returns the luma of every pixel in [0, 1], row-major,
// compositing transparent pixels over white.
func grayLevels(img image.Image) ([]float64, int, int) {
	b := img.Bounds()
	w, h := b.Dx(), b.Dy()
	g := make([]float64, w*h)
	switch im := img.(type) {
	case *image.Gray:
		for y := range h {
			row := im.Pix[y*im.Stride : y*im.Stride+w]
			for x, v := range row {
				g[y*w+x] = float64(v) / 255
			}
		}
	case *image.YCbCr:
		for y := range h {
			for x := range w {
				g[y*w+x] = float64(im.Y[im.YOffset(b.Min.X+x, b.Min.Y+y)]) / 255
			}
		}
	default:
		for y := range h {
			for x := range w {
				r, gg, bb, a := img.At(b.Min.X+x, b.Min.Y+y).RGBA()
				// Premultiplied: over white adds (1 - alpha) to each channel.
				bg := float64(0xffff - a)
				l := 0.299*(float64(r)+bg) + 0.587*(float64(gg)+bg) + 0.114*(float64(bb)+bg)
				g[y*w+x] = l / 0xffff
			}
		}
	}
	return g, w, h
}

// borderMean is the mean level of a frame about 4% of the image wide (at
// least one pixel) along its edges: the background, in a picture of a
// digit.
func borderMean(g []float64, w, h int) float64 {
	bw := max(1, min(w, h)/25)
	var sum float64
	n := 0
	for y := range h {
		for x := range w {
			if x < bw || x >= w-bw || y < bw || y >= h-bw {
				sum += g[y*w+x]
				n++
			}
		}
	}
	return sum / float64(n)
}

// inkThreshold is the level above which a pixel counts as ink for the
// bounding box (fainter pixels are noise or anti-aliasing).
const inkThreshold = 0.2

// centre crops g to its ink, fits it in a box×box square and places it in a
// side×side image by centre of mass, as MNIST's digits were.
func centre(g []float64, w, h int) []float64 {
	x0, y0, x1, y1 := w, h, -1, -1
	for y := range h {
		for x := range w {
			if g[y*w+x] > inkThreshold {
				x0, y0, x1, y1 = min(x0, x), min(y0, y), max(x1, x), max(y1, y)
			}
		}
	}
	out := make([]float64, side*side)
	if x1 < 0 {
		return out
	}
	cw, ch := x1-x0+1, y1-y0+1
	crop := make([]float64, cw*ch)
	for y := range ch {
		copy(crop[y*cw:], g[(y0+y)*w+x0:(y0+y)*w+x0+cw])
	}
	scale := float64(box) / float64(max(cw, ch))
	dw := max(1, int(math.Round(float64(cw)*scale)))
	dh := max(1, int(math.Round(float64(ch)*scale)))
	digit := resize(crop, cw, ch, dw, dh)

	var mass, mx, my float64
	for y := range dh {
		for x := range dw {
			v := digit[y*dw+x]
			mass += v
			mx += v * (float64(x) + 0.5)
			my += v * (float64(y) + 0.5)
		}
	}
	ox, oy := (side-dw)/2, (side-dh)/2
	if mass > 0 {
		ox = int(math.Round(side/2 - mx/mass))
		oy = int(math.Round(side/2 - my/mass))
	}
	for y := range dh {
		for x := range dw {
			tx, ty := ox+x, oy+y
			if tx >= 0 && tx < side && ty >= 0 && ty < side {
				out[ty*side+tx] = digit[y*dw+x]
			}
		}
	}
	return out
}

// tap is one input sample's weight in an output sample.
type tap struct {
	i int
	w float64
}

// taps returns the weights that resample n inputs to m outputs along one
// axis: the area each output pixel covers when shrinking (a box filter,
// exact for fractional coverage), bilinear interpolation between pixel
// centres when enlarging.
func taps(n, m int) [][]tap {
	out := make([][]tap, m)
	scale := float64(n) / float64(m)
	for o := range m {
		if scale >= 1 {
			a, b := float64(o)*scale, float64(o+1)*scale
			for i := int(a); i < n && float64(i) < b; i++ {
				if cov := min(b, float64(i+1)) - max(a, float64(i)); cov > 1e-12 {
					out[o] = append(out[o], tap{i, cov / scale})
				}
			}
			continue
		}
		x := (float64(o)+0.5)*scale - 0.5
		i := int(math.Floor(x))
		f := x - float64(i)
		lo, hi := min(max(i, 0), n-1), min(max(i+1, 0), n-1)
		out[o] = []tap{{lo, 1 - f}, {hi, f}}
	}
	return out
}

// resize resamples a w×h image to dw×dh, one axis at a time.
func resize(src []float64, w, h, dw, dh int) []float64 {
	tx, ty := taps(w, dw), taps(h, dh)
	tmp := make([]float64, dw*h)
	for y := range h {
		row := src[y*w : (y+1)*w]
		for x, ts := range tx {
			var s float64
			for _, t := range ts {
				s += t.w * row[t.i]
			}
			tmp[y*dw+x] = s
		}
	}
	out := make([]float64, dw*dh)
	for y, ts := range ty {
		for x := range dw {
			var s float64
			for _, t := range ts {
				s += t.w * tmp[t.i*dw+x]
			}
			out[y*dw+x] = s
		}
	}
	return out
}
