package data

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"image"
	"image/color"
	"image/color/palette"
	"image/gif"
	"image/jpeg"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// rgbImage returns a w x h image whose pixel (x, y) is (10x+y, 20y+x, 7(x+y)).
func rgbImage(w, h int) *image.RGBA {
	m := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			m.Set(x, y, color.RGBA{uint8(10*x + y), uint8(20*y + x), uint8(7 * (x + y)), 255})
		}
	}
	return m
}

func pngBytes(t testing.TB, m image.Image) []byte {
	var b bytes.Buffer
	if err := png.Encode(&b, m); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func mkdir(t testing.TB, dirs ...string) string {
	p := filepath.Join(dirs...)
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// luma is image/color's GrayModel on 8-bit opaque values.
func luma(r, g, b uint8) uint8 {
	return color.GrayModel.Convert(color.RGBA{r, g, b, 255}).(color.Gray).Y
}

func TestLoadImageFolder(t *testing.T) {
	root := t.TempDir()
	// Classes "b" and "a" (sorted: a is 0), a hidden directory, a stray
	// file at the top, non-image and hidden files inside.
	a, b := mkdir(t, root, "a"), mkdir(t, root, "b")
	mkdir(t, root, ".cache", "x")
	writeFile(t, mkdir(t, root, ".cache"), "z.png", pngBytes(t, rgbImage(3, 2)))
	writeFile(t, root, "top.png", pngBytes(t, rgbImage(3, 2)))
	writeFile(t, a, "README.txt", []byte("not an image"))
	writeFile(t, a, ".hidden.png", []byte("not an image"))
	mkdir(t, a, "nested.png") // a directory with an image's name

	writeFile(t, b, "1.PNG", pngBytes(t, rgbImage(3, 2)))
	grey := image.NewGray(image.Rect(0, 0, 3, 2))
	for i := range grey.Pix {
		grey.Pix[i] = uint8(40 * i)
	}
	writeFile(t, b, "0.png", pngBytes(t, grey))
	pal := image.NewPaletted(image.Rect(0, 0, 3, 2), palette.Plan9)
	for i := range pal.Pix {
		pal.Pix[i] = uint8(50 * i)
	}
	var gb bytes.Buffer
	if err := gif.Encode(&gb, pal, nil); err != nil {
		t.Fatal(err)
	}
	writeFile(t, a, "x.gif", gb.Bytes())
	uniform := image.NewRGBA(image.Rect(0, 0, 3, 2))
	for i := 0; i < len(uniform.Pix); i += 4 {
		copy(uniform.Pix[i:], []uint8{200, 100, 50, 255})
	}
	var jb bytes.Buffer
	if err := jpeg.Encode(&jb, uniform, &jpeg.Options{Quality: 100}); err != nil {
		t.Fatal(err)
	}
	writeFile(t, a, "y.jpeg", jb.Bytes())

	for _, workers := range []int{1, 3} {
		d, err := LoadImageFolder(root, ImageFolderOptions{Workers: workers})
		if err != nil {
			t.Fatal(err)
		}
		if d.N != 4 || d.Rows != 2 || d.Cols != 3 || d.NumChannels() != 3 || d.NumClasses() != 2 || !slices.Equal(d.ClassNames, []string{"a", "b"}) || !slices.Equal(d.Labels, []uint8{0, 0, 1, 1}) {
			t.Fatalf("N %d %dx%dx%d classes %d %v labels %v", d.N, d.Channels, d.Rows, d.Cols, d.NumClasses(), d.ClassNames, d.Labels)
		}
		// a/x.gif: the palette's colours, CHW.
		img := d.Image(0)
		for i, p := range pal.Pix {
			r, g, bl, _ := palette.Plan9[p].RGBA()
			if img[i] != uint8(r>>8) || img[6+i] != uint8(g>>8) || img[12+i] != uint8(bl>>8) {
				t.Fatalf("gif pixel %d: %d %d %d, want %d %d %d", i, img[i], img[6+i], img[12+i], r>>8, g>>8, bl>>8)
			}
		}
		// a/y.jpeg: close to the uniform colour (JPEG is lossy).
		img = d.Image(1)
		for i := range 6 {
			for c, want := range []int{200, 100, 50} {
				if got := int(img[c*6+i]); got < want-4 || got > want+4 {
					t.Fatalf("jpeg pixel %d channel %d = %d, want about %d", i, c, got, want)
				}
			}
		}
		// b/0.png: grey repeated in each channel.
		img = d.Image(2)
		for i, g := range grey.Pix {
			if img[i] != g || img[6+i] != g || img[12+i] != g {
				t.Fatalf("grey pixel %d: %v", i, []uint8{img[i], img[6+i], img[12+i]})
			}
		}
		// b/1.PNG: exact RGB, CHW.
		img = d.Image(3)
		for y := range 2 {
			for x := range 3 {
				i := y*3 + x
				if img[i] != uint8(10*x+y) || img[6+i] != uint8(20*y+x) || img[12+i] != uint8(7*(x+y)) {
					t.Fatalf("rgb pixel (%d,%d): %d %d %d", x, y, img[i], img[6+i], img[12+i])
				}
			}
		}
	}

	// Grey: BT.601 luma of colour images, grey images as they are.
	d, err := LoadImageFolder(root, ImageFolderOptions{Channels: 1})
	if err != nil {
		t.Fatal(err)
	}
	if d.ImageSize() != 6 || !bytes.Equal(d.Image(2), grey.Pix) {
		t.Errorf("grey: size %d, image %v", d.ImageSize(), d.Image(2))
	}
	for y := range 2 {
		for x := range 3 {
			if got, want := d.Image(3)[y*3+x], luma(uint8(10*x+y), uint8(20*y+x), uint8(7*(x+y))); got != want {
				t.Errorf("luma (%d,%d) = %d, want %d", x, y, got, want)
			}
		}
	}

	// A different size is refused unless resizing.
	odd := writeFile(t, b, "2.png", pngBytes(t, rgbImage(4, 2)))
	_, err = LoadImageFolder(root, ImageFolderOptions{})
	wantError(t, err, odd, "image is 4x2 (width x height), want 3x2 like "+filepath.Join(a, "x.gif"), "ImageFolderOptions.Width and Height")
	d, err = LoadImageFolder(root, ImageFolderOptions{Width: 2, Height: 2, Channels: 1})
	if err != nil {
		t.Fatal(err)
	}
	if d.N != 5 || d.Rows != 2 || d.Cols != 2 || len(d.Images) != 5*4 {
		t.Errorf("resized: N %d, %dx%d, %d bytes", d.N, d.Rows, d.Cols, len(d.Images))
	}

	// A broken file is named.
	bad := writeFile(t, b, "3.jpg", []byte("\xff\xd8 truncated"))
	_, err = LoadImageFolder(root, ImageFolderOptions{Width: 2, Height: 2})
	wantError(t, err, bad, "not a PNG, JPEG or GIF image")
	os.Remove(bad)
	trunc := pngBytes(t, rgbImage(3, 2))
	bad = writeFile(t, b, "3.png", trunc[:len(trunc)-20])
	_, err = LoadImageFolder(root, ImageFolderOptions{Width: 2, Height: 2})
	wantError(t, err, bad, "decode: ")
}

func TestResizeArea(t *testing.T) {
	for _, c := range []struct {
		src            []uint8
		sw, sh, dw, dh int
		want           []uint8
	}{
		// 3 -> 2: output 0 covers [0, 1.5): (0 + 90/2)/1.5 = 30; output 1
		// covers [1.5, 3): (90/2 + 180)/1.5 = 150.
		{[]uint8{0, 90, 180}, 3, 1, 2, 1, []uint8{30, 150}},
		// 4x2 -> 2x1: means of 2x2 blocks.
		{[]uint8{0, 10, 100, 200, 20, 30, 100, 0}, 4, 2, 2, 1, []uint8{15, 100}},
		// 2 -> 4: each pixel repeated.
		{[]uint8{10, 200}, 2, 1, 4, 1, []uint8{10, 10, 200, 200}},
		// 2 -> 3: the middle output is half of each: (10 + 200)/2 = 105.
		{[]uint8{10, 200}, 1, 2, 1, 3, []uint8{10, 105, 200}},
		// 1x1 -> 2x2 and identity.
		{[]uint8{77}, 1, 1, 2, 2, []uint8{77, 77, 77, 77}},
		{[]uint8{1, 2, 3, 4, 5, 6}, 3, 2, 3, 2, []uint8{1, 2, 3, 4, 5, 6}},
		// Extremes stay in range.
		{[]uint8{255, 255, 255}, 3, 1, 2, 1, []uint8{255, 255}},
	} {
		got := make([]uint8, c.dw*c.dh)
		resizeArea(got, c.src, 1, c.sw, c.sh, c.dw, c.dh)
		if !bytes.Equal(got, c.want) {
			t.Errorf("%v %dx%d -> %dx%d: got %v, want %v", c.src, c.sw, c.sh, c.dw, c.dh, got, c.want)
		}
	}
	// Channels are resized independently.
	got := make([]uint8, 4)
	resizeArea(got, []uint8{0, 90, 180, 30, 30, 30}, 2, 3, 1, 2, 1)
	if !bytes.Equal(got, []uint8{30, 150, 30, 30}) {
		t.Errorf("two channels: %v", got)
	}
}

// hugePNG returns a PNG whose header claims w x h pixels (with a valid
// CRC), followed by the tiny image's data.
func hugePNG(t *testing.T, w, h uint32) []byte {
	b := pngBytes(t, rgbImage(1, 1))
	// Signature (8), IHDR length (4), "IHDR" (4), width, height at 16, 20.
	binary.BigEndian.PutUint32(b[16:], w)
	binary.BigEndian.PutUint32(b[20:], h)
	binary.BigEndian.PutUint32(b[29:], crc32.ChecksumIEEE(b[12:29]))
	return b
}

func TestLoadImageFolderBad(t *testing.T) {
	root := t.TempDir()
	_, err := LoadImageFolder(root, ImageFolderOptions{})
	wantError(t, err, root, "no class directories")
	_, err = LoadImageFolder(filepath.Join(root, "missing"), ImageFolderOptions{})
	wantError(t, err, filepath.Join(root, "missing"), "no such file")
	f := writeFile(t, root, "f", nil)
	_, err = LoadImageFolder(f, ImageFolderOptions{})
	wantError(t, err, f, "not a directory")
	os.Remove(f)

	empty := mkdir(t, root, "empty")
	writeFile(t, empty, "notes.txt", []byte("x"))
	_, err = LoadImageFolder(root, ImageFolderOptions{})
	wantError(t, err, empty, "class directory holds no images")
	os.RemoveAll(empty)

	cls := mkdir(t, root, "c")
	writeFile(t, cls, "ok.png", pngBytes(t, rgbImage(2, 2)))
	for _, c := range []struct {
		opt      ImageFolderOptions
		fragment string
	}{
		{ImageFolderOptions{Channels: 2}, "Channels is 2"},
		{ImageFolderOptions{Width: 5}, "want both positive"},
		{ImageFolderOptions{Width: -1, Height: -1}, "want both positive"},
		{ImageFolderOptions{Width: 1 << 14, Height: 1 << 14}, "more than the 67108864 pixels"},
	} {
		_, err = LoadImageFolder(root, c.opt)
		wantError(t, err, root, c.fragment)
	}
	// The data set's size is checked before allocating: 12 images resized
	// to 3x8192x8192 (each 192 MiB, the most pixels allowed) are more than
	// the 2 GiB supported.
	for i := range 11 {
		writeFile(t, cls, string(rune('p'+i))+".png", pngBytes(t, rgbImage(2, 2)))
	}
	_, err = LoadImageFolder(root, ImageFolderOptions{Width: 8192, Height: 8192})
	wantError(t, err, root, "12 images of 3x8192x8192 are 2415919104 bytes, more than the 2147483648 supported")

	// A header claiming too many pixels is refused before decoding.
	huge := writeFile(t, cls, "huge.png", hugePNG(t, 1<<20, 1<<20))
	_, err = LoadImageFolder(root, ImageFolderOptions{Width: 2, Height: 2})
	wantError(t, err, huge, "png header says 1048576x1048576, want at least 1x1 and at most 67108864 pixels")
}
