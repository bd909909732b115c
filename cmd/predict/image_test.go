package main

import (
	"bytes"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// drawDigit draws a "7" (a bar and a slanted stroke) of the given stroke
// width on a w×h canvas, light-on-dark or dark-on-light, as 8-bit grey.
func drawDigit(w, h int, lightOnDark bool) *image.Gray {
	img := image.NewGray(image.Rect(0, 0, w, h))
	ink, paper := uint8(255), uint8(0)
	if !lightOnDark {
		ink, paper = 0, 255
	}
	for i := range img.Pix {
		img.Pix[i] = paper
	}
	sw := max(2, w/12)
	x0, x1 := w/4, 3*w/4
	y0, y1 := h/5, 4*h/5
	for y := y0; y < y0+sw; y++ {
		for x := x0; x < x1; x++ {
			img.SetGray(x, y, color.Gray{ink})
		}
	}
	for y := y0; y < y1; y++ {
		// From the right end of the bar down to the left of the centre.
		cx := x1 - (x1-w/2+sw)*(y-y0)/(y1-y0)
		for x := cx - sw; x < cx; x++ {
			img.SetGray(x, y, color.Gray{ink})
		}
	}
	return img
}

func encodePNG(t testing.TB, img image.Image) []byte {
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func encodeJPEG(t testing.TB, img image.Image) []byte {
	var b bytes.Buffer
	if err := jpeg.Encode(&b, img, &jpeg.Options{Quality: 90}); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func writeFile(t testing.TB, dir, name string, b []byte) string {
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

var centred = prepOptions{invert: "auto", center: true}

func TestPrepareIdentityForMNISTLikeImage(t *testing.T) {
	img := drawDigit(28, 28, true)
	got := prepare(img, prepOptions{invert: "auto", center: false})
	if !bytes.Equal(got, img.Pix) {
		t.Error("a 28x28 light-on-dark image is not passed through unchanged with --no-center")
	}
}

func TestPreparePolarity(t *testing.T) {
	light := prepare(drawDigit(90, 120, true), centred)
	dark := prepare(drawDigit(90, 120, false), centred)
	if !bytes.Equal(light, dark) {
		t.Error("the same digit light-on-dark and dark-on-light prepares differently")
	}
	if bytes.Equal(light, make([]uint8, side*side)) {
		t.Fatal("blank result")
	}
	// Forcing the polarity overrides detection.
	if bytes.Equal(prepare(drawDigit(90, 120, false), prepOptions{invert: "no", center: true}), light) {
		t.Error("--invert no still inverted")
	}
	if !bytes.Equal(prepare(drawDigit(90, 120, true), prepOptions{invert: "no", center: true}), light) {
		t.Error("--invert no changed a light-on-dark image")
	}
	if !bytes.Equal(prepare(drawDigit(90, 120, false), prepOptions{invert: "yes", center: true}), light) {
		t.Error("--invert yes did not invert")
	}
}

func TestPrepareCentres(t *testing.T) {
	// A small digit in the corner of a large grey (photo-like) canvas.
	canvas := image.NewGray(image.Rect(0, 0, 400, 300))
	for i := range canvas.Pix {
		canvas.Pix[i] = 200
	}
	d := drawDigit(60, 80, false)
	for y := range 80 {
		for x := range 60 {
			if d.GrayAt(x, y).Y == 0 {
				canvas.SetGray(300+x, 20+y, color.Gray{40})
			}
		}
	}
	px := prepare(canvas, centred)
	x0, y0, x1, y1 := side, side, -1, -1
	var mass, mx, my float64
	var maxv uint8
	for y := range side {
		for x := range side {
			v := px[y*side+x]
			maxv = max(maxv, v)
			if v > 0 {
				x0, y0, x1, y1 = min(x0, x), min(y0, y), max(x1, x), max(y1, y)
			}
			mass += float64(v)
			mx += float64(v) * (float64(x) + 0.5)
			my += float64(v) * (float64(y) + 0.5)
		}
	}
	if maxv != 255 {
		t.Errorf("brightest pixel %d, want 255 after contrast stretching", maxv)
	}
	if h := y1 - y0 + 1; h < 19 || h > 21 {
		t.Errorf("digit is %d pixels high, want it fitted to a 20-pixel box", h)
	}
	if cx, cy := mx/mass, my/mass; math.Abs(cx-14) > 0.6 || math.Abs(cy-14) > 0.6 {
		t.Errorf("centre of mass at (%.2f, %.2f), want (14, 14)", cx, cy)
	}
	if px[0] != 0 || px[side*side-1] != 0 {
		t.Error("background is not black")
	}
}

func TestPrepareJPEGClosetoPNG(t *testing.T) {
	dir := t.TempDir()
	img := drawDigit(64, 64, false)
	a, err := loadImage(writeFile(t, dir, "d.png", encodePNG(t, img)), centred)
	if err != nil {
		t.Fatal(err)
	}
	b, err := loadImage(writeFile(t, dir, "d.jpg", encodeJPEG(t, img)), centred)
	if err != nil {
		t.Fatal(err)
	}
	var diff float64
	for i := range a {
		diff += math.Abs(float64(a[i]) - float64(b[i]))
	}
	if diff /= float64(len(a)); diff > 8 {
		t.Errorf("JPEG and PNG of the same digit differ by %.1f levels on average", diff)
	}
}

func TestPrepareTransparentAndColour(t *testing.T) {
	// Black ink on a transparent background (as drawing programs save it)
	// is read as dark on white.
	g := drawDigit(50, 50, false)
	rgba := image.NewNRGBA(g.Bounds())
	col := image.NewRGBA(g.Bounds())
	for y := range 50 {
		for x := range 50 {
			if g.GrayAt(x, y).Y == 0 {
				rgba.SetNRGBA(x, y, color.NRGBA{0, 0, 0, 255})
				col.Set(x, y, color.RGBA{0, 0, 90, 255}) // dark blue ink
			} else {
				col.Set(x, y, color.RGBA{255, 250, 240, 255}) // cream paper
			}
		}
	}
	want := prepare(g, centred)
	if got := prepare(rgba, centred); !bytes.Equal(got, want) {
		t.Error("transparent background is not treated as white")
	}
	got := prepare(col, centred)
	for i := range got {
		if d := int(got[i]) - int(want[i]); d < -3 || d > 3 {
			t.Fatalf("colour picture differs from the grey one at %d: %d vs %d", i, got[i], want[i])
		}
	}
}

func TestPrepareBlank(t *testing.T) {
	img := image.NewGray(image.Rect(0, 0, 10, 10))
	for i := range img.Pix {
		img.Pix[i] = 255
	}
	if px := prepare(img, centred); !bytes.Equal(px, make([]uint8, side*side)) {
		t.Error("a blank picture does not give a blank image")
	}
}

func TestTapsSumToOne(t *testing.T) {
	for _, c := range [][2]int{{100, 20}, {21, 20}, {20, 20}, {7, 20}, {1, 20}, {3000, 28}, {29, 28}} {
		for o, ts := range taps(c[0], c[1]) {
			var s float64
			for _, tp := range ts {
				if tp.i < 0 || tp.i >= c[0] {
					t.Fatalf("%v: tap %d out of range", c, tp.i)
				}
				s += tp.w
			}
			if math.Abs(s-1) > 1e-9 {
				t.Fatalf("%d→%d: output %d weights sum to %g", c[0], c[1], o, s)
			}
		}
	}
}

func TestLoadImageErrors(t *testing.T) {
	dir := t.TempDir()
	good := encodePNG(t, drawDigit(40, 40, true))
	cases := map[string][]byte{
		"text.png":  []byte("hello, not an image"),
		"trunc.png": good[:len(good)/2],
		"trunc.jpg": encodeJPEG(t, drawDigit(40, 40, true))[:200],
		"empty.png": nil,
	}
	want := map[string]string{
		"text.png":  "text.png: not a PNG, JPEG or GIF image",
		"trunc.png": "trunc.png: the PNG image is truncated",
		"trunc.jpg": "trunc.jpg: the JPEG image is truncated",
		"empty.png": "empty.png: not a PNG, JPEG or GIF image",
		"gone.png":  "gone.png: no such file or directory",
	}
	for name, b := range cases {
		writeFile(t, dir, name, b)
	}
	for name, w := range want {
		_, err := loadImage(filepath.Join(dir, name), centred)
		if err == nil || !strings.HasSuffix(err.Error(), w) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: got %v, want ...%s", name, err, w)
		}
	}
}
