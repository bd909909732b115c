package data_test

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"os"

	"github.com/ember-ml/ember/data"
)

// Reading CIFAR-10 records: here two records made in memory, in the format
// of data_batch_1.bin (a label byte, then 1024 red, 1024 green and 1024 blue
// bytes). The images come out as uint8 CHW, [N, 3, 32, 32].
func ExampleReadCIFAR10() {
	var file bytes.Buffer
	for i, label := range []byte{3, 8} {
		file.WriteByte(label)
		for c := range 3 {
			file.Write(bytes.Repeat([]byte{byte(100*c + i)}, 32*32)) // a flat colour
		}
	}
	ds, err := data.ReadCIFAR10(&file, "two-records.bin")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d images of %dx%dx%d, %d classes\n", ds.N, ds.NumChannels(), ds.Rows, ds.Cols, ds.NumClasses())
	for i := range ds.N {
		img := ds.Image(i) // 3072 bytes: red plane, green plane, blue plane
		fmt.Printf("image %d: %s, first pixel RGB %d %d %d\n", i, ds.ClassNames[ds.Labels[i]], img[0], img[1024], img[2048])
	}

	// A file that is not a whole number of records is refused, in one line.
	_, err = data.ReadCIFAR10(bytes.NewReader(make([]byte, 5000)), "short.bin")
	fmt.Println(err)
	// Output:
	// 2 images of 3x32x32, 10 classes
	// image 0: cat, first pixel RGB 0 100 200
	// image 1: ship, first pixel RGB 1 101 201
	// data: short.bin: 5000 bytes is not a whole number of 3073-byte CIFAR-10 records (1 records and 1927 bytes over)
}

// Getting CIFAR-10: fetch and unpack the archive once (MD5-checked), then
// load the five training batches and the test batch. (Not run as a test: it
// needs the network.)
func ExampleDownloadCIFAR() {
	dir, err := data.DownloadCIFAR(context.Background(), "datasets", data.CIFAR10, data.DownloadOptions{Log: os.Stderr})
	if err != nil {
		log.Fatal(err)
	}
	train, test, err := data.LoadCIFAR10(dir)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(train.N, test.N, train.ClassNames)
}
