package data

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ember-ml/ember/internal/safefile"
)

// DefaultMirrors are the MNIST mirrors that torchvision uses, tried in order.
var DefaultMirrors = []string{
	"https://ossci-datasets.s3.amazonaws.com/mnist/",
	"https://storage.googleapis.com/cvdf-datasets/mnist/",
}

// maxDownloadBytes bounds one downloaded file, so that a misbehaving mirror
// cannot fill the disk. The largest MNIST file is under 10 MB.
const maxDownloadBytes = 1 << 30

// DownloadOptions configures Download. The zero value downloads the four
// canonical MNIST files from DefaultMirrors.
type DownloadOptions struct {
	// Mirrors are base URLs tried in order; the file name is appended (a
	// '/' is added if missing). Nil means DefaultMirrors.
	Mirrors []string
	// Client makes the requests. Nil means a client with a 10-minute
	// timeout per request.
	Client *http.Client
	// Log receives one line per attempt and per failure. Nil discards.
	Log io.Writer
	// Checksums maps each file name to fetch to its MD5 sum in hex. Nil
	// means the four canonical MNIST .gz files; another data set in the
	// same layout (Fashion-MNIST, say) can be fetched by giving its names
	// and sums, and its mirrors.
	Checksums map[string]string
}

// Download fetches into dir (created if needed) each file that is not
// already there with the right MD5 sum. For each file it tries the mirrors
// in order: the file is written to a temporary file in dir, its MD5 sum
// checked, synced to disk, and renamed into place, so that dir never holds
// a partial or unverified file under the real name. A failure (HTTP error,
// refused connection, wrong checksum) is reported on Log and the next
// mirror tried; if every mirror fails, Download returns an *Error naming the
// file and each mirror's failure. Files already fetched stay in place. A
// cancelled ctx stops Download at once with an error that wraps ctx.Err().
func Download(ctx context.Context, dir string, opt DownloadOptions) error {
	mirrors := opt.Mirrors
	if mirrors == nil {
		mirrors = DefaultMirrors
	}
	if len(mirrors) == 0 {
		return errorf(dir, nil, "download: no mirrors given")
	}
	client := opt.Client
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Minute}
	}
	log := opt.Log
	if log == nil {
		log = io.Discard
	}
	sums := opt.Checksums
	if sums == nil {
		sums = map[string]string{}
		for _, base := range mnistFiles {
			sums[base+".gz"] = canonicalMD5[base+".gz"]
		}
	}
	names := make([]string, 0, len(sums))
	for name := range sums {
		if name == "" || name != filepath.Base(name) || strings.HasPrefix(name, ".") {
			return errorf(name, nil, "download: not a plain file name")
		}
		names = append(names, name)
	}
	// Canonical order for MNIST (train before test), else sorted.
	slices.SortFunc(names, func(a, b string) int {
		return strings.Compare(downloadOrderKey(a), downloadOrderKey(b))
	})
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return errorf(dir, err, "download: %v", unwrapPathError(err))
	}
	for _, name := range names {
		want := strings.ToLower(sums[name])
		dst := filepath.Join(dir, name)
		if st, err := os.Stat(dst); err == nil {
			// Never rename over a directory, a device or a FIFO.
			if !st.Mode().IsRegular() {
				return errorf(dst, nil, "download: is %s, not a regular file; not replacing it", safefile.Kind(st.Mode()))
			}
			sum, err := fileMD5(dst)
			if err != nil {
				return err
			}
			if sum == want {
				fmt.Fprintf(log, "data: %s: present, MD5 verified\n", dst)
				continue
			}
			// A damaged copy (truncated, a broken stream) is fetched again;
			// a sound file of another data set is the user's, and stays.
			if _, err := ReadIDXFile(dst); err == nil {
				return errorf(dst, nil, "download: present with MD5 %s, want %s: a sound IDX file of another data set; not replacing it (download into another directory)", sum, want)
			}
			fmt.Fprintf(log, "data: %s: present but damaged (MD5 %s, want %s); downloading it again\n", dst, sum, want)
		}
		var failures []string
		ok := false
		for mi, m := range mirrors {
			u := m
			if !strings.HasSuffix(u, "/") {
				u += "/"
			}
			u += name
			fmt.Fprintf(log, "data: downloading %s\n", u)
			n, err := fetch(ctx, client, u, dir, name, want)
			if ctxErr := ctx.Err(); ctxErr != nil {
				return errorf(dst, ctxErr, "download: %v", ctxErr)
			}
			if err != nil {
				next := "trying the next mirror"
				if mi == len(mirrors)-1 {
					next = "no mirror left"
				}
				fmt.Fprintf(log, "data: %s: %v; %s\n", u, err, next)
				failures = append(failures, fmt.Sprintf("%s: %v", m, err))
				continue
			}
			fmt.Fprintf(log, "data: %s: %d bytes, MD5 verified\n", dst, n)
			ok = true
			break
		}
		if !ok {
			return errorf(dst, nil, "download failed from every mirror: %s", strings.Join(failures, "; "))
		}
	}
	return nil
}

func downloadOrderKey(name string) string {
	for i, base := range mnistFiles {
		if strings.HasPrefix(name, base) {
			return fmt.Sprintf("%d%s", i, name)
		}
	}
	return "9" + name
}

// fetch downloads u into dir/name via a temporary file, checking its MD5
// sum against want. It returns the number of bytes written.
func fetch(ctx context.Context, client *http.Client, u, dir, name, want string) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, unwrapURLError(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("HTTP %s", resp.Status)
	}
	tmp, err := os.CreateTemp(dir, "."+name+".part-*")
	if err != nil {
		return 0, unwrapPathError(err)
	}
	tmpName := tmp.Name()
	committed := false
	defer func() {
		if !committed {
			tmp.Close()
			os.Remove(tmpName)
		}
	}()
	h := md5.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(resp.Body, maxDownloadBytes+1))
	if err != nil {
		return n, fmt.Errorf("after %d bytes: %v", n, unwrapURLError(err))
	}
	if n > maxDownloadBytes {
		return n, fmt.Errorf("more than %d bytes", maxDownloadBytes)
	}
	if resp.ContentLength >= 0 && n != resp.ContentLength {
		return n, fmt.Errorf("got %d bytes, want %d", n, resp.ContentLength)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != want {
		return n, fmt.Errorf("MD5 %s, want %s (%d bytes)", sum, want, n)
	}
	if err := tmp.Chmod(0o644); err != nil {
		return n, unwrapPathError(err)
	}
	if err := tmp.Sync(); err != nil {
		return n, unwrapPathError(err)
	}
	if err := tmp.Close(); err != nil {
		return n, unwrapPathError(err)
	}
	if err := os.Rename(tmpName, filepath.Join(dir, name)); err != nil {
		return n, unwrapPathError(err)
	}
	committed = true
	syncDir(dir)
	return n, nil
}

// syncDir makes a rename durable where the system supports syncing a
// directory; elsewhere it does nothing.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
}

// unwrapURLError drops the "Get \"url\": " prefix: the URL is reported
// already.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
