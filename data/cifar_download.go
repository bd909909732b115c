package data

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Bounds on what extracting a CIFAR archive may write: the real archives
// hold under a dozen files and about 185 MB.
const (
	maxArchiveEntries     = 256
	maxArchiveMemberBytes = MaxCIFARBytes
	maxArchiveTotalBytes  = 2 << 30
)

// DownloadCIFAR makes sure that dir holds set (CIFAR10 or CIFAR100)
// unpacked, and returns the directory of its files (dir/set.Dir). When that
// already holds every record file, nothing is fetched. Otherwise it fetches
// set.Archive into dir with Download (opt as there; nil opt.Mirrors means
// CIFARMirrors and nil opt.Checksums the archive's published MD5 sum), so
// that the archive is MD5-checked and written atomically, and unpacks it.
//
// Unpacking is strict: only regular files and directories, only under
// set.Dir, with local names (no "..", no absolute paths) and no deeper
// directories, no duplicates, at most 256 entries, 1 GiB a file and 2 GiB in
// all, each size checked from its header before it is written. The files go
// to a temporary directory in dir first and are renamed into dir/set.Dir
// only once the whole archive has been read, so a bad archive leaves no
// files of it behind. The archive is kept, so a second call need not fetch
// it again.
func DownloadCIFAR(ctx context.Context, dir string, set CIFARSet, opt DownloadOptions) (string, error) {
	dst := filepath.Join(dir, set.Dir)
	if cifarReady(dst, set) {
		if opt.Log != nil {
			fmt.Fprintf(opt.Log, "data: %s: %s present\n", dst, set.Name)
		}
		return dst, nil
	}
	if opt.Mirrors == nil {
		opt.Mirrors = CIFARMirrors
	}
	if opt.Checksums == nil {
		opt.Checksums = map[string]string{set.Archive: set.MD5}
	}
	if _, ok := opt.Checksums[set.Archive]; !ok || len(opt.Checksums) != 1 {
		return "", errorf(set.Archive, nil, "download: DownloadOptions.Checksums must name the archive %s alone", set.Archive)
	}
	if err := Download(ctx, dir, opt); err != nil {
		return "", err
	}
	archive := filepath.Join(dir, set.Archive)
	if err := extractCIFAR(archive, dir, set); err != nil {
		return "", err
	}
	if !cifarReady(dst, set) {
		return "", errorf(archive, nil, "archive does not hold %s's files %s/%s and %s", set.Name, set.Dir, strings.Join(set.Train, ", "), strings.Join(set.Test, ", "))
	}
	if opt.Log != nil {
		fmt.Fprintf(opt.Log, "data: %s: unpacked %s\n", dst, set.Archive)
	}
	return dst, nil
}

// extractCIFAR unpacks the archive's files under set.Dir into dir/set.Dir
// by way of a temporary directory in dir.
func extractCIFAR(archive, dir string, set CIFARSet) error {
	f, err := os.Open(archive)
	if err != nil {
		return openError(archive, err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return gzipError(archive, err)
	}
	tmp, err := os.MkdirTemp(dir, "."+set.Dir+".part-*")
	if err != nil {
		return errorf(dir, err, "unpack: %v", unwrapPathError(err))
	}
	defer os.RemoveAll(tmp)

	tr := tar.NewReader(zr)
	seen := map[string]bool{}
	var total int64
	for entries := 0; ; entries++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return errorf(archive, err, "tar: %v", err)
		}
		if entries == maxArchiveEntries {
			return errorf(archive, nil, "more than %d entries, not a CIFAR archive", maxArchiveEntries)
		}
		name, err := cifarMemberName(hdr.Name, set.Dir)
		if err != nil {
			return errorf(archive, nil, "tar member %q: %v", hdr.Name, err)
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if name != "" {
				return errorf(archive, nil, "tar member %q: a directory inside %s/, want files only", hdr.Name, set.Dir)
			}
			continue
		case tar.TypeReg:
		case tar.TypeXGlobalHeader:
			continue
		default:
			return errorf(archive, nil, "tar member %q: type %q is not a regular file; refusing links and special files", hdr.Name, hdr.Typeflag)
		}
		if name == "" {
			return errorf(archive, nil, "tar member %q: a file where the directory %s/ should be", hdr.Name, set.Dir)
		}
		if seen[name] {
			return errorf(archive, nil, "tar member %q: appears twice", hdr.Name)
		}
		seen[name] = true
		if hdr.Size < 0 || hdr.Size > maxArchiveMemberBytes {
			return errorf(archive, nil, "tar member %q: %d bytes, more than the %d supported", hdr.Name, hdr.Size, int64(maxArchiveMemberBytes))
		}
		if total += hdr.Size; total > maxArchiveTotalBytes {
			return errorf(archive, nil, "tar member %q: more than %d bytes in all, not a CIFAR archive", hdr.Name, int64(maxArchiveTotalBytes))
		}
		if err := writeMember(filepath.Join(tmp, name), tr, hdr.Size); err != nil {
			return errorf(archive, err, "tar member %q: %v", hdr.Name, err)
		}
	}
	// The whole archive is read and sound: move the files into place.
	dst := filepath.Join(dir, set.Dir)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return errorf(dst, err, "unpack: %v", unwrapPathError(err))
	}
	for name := range seen {
		if err := os.Rename(filepath.Join(tmp, name), filepath.Join(dst, name)); err != nil {
			return errorf(filepath.Join(dst, name), err, "unpack: %v", unwrapPathError(err))
		}
	}
	syncDir(dst)
	return nil
}

// cifarMemberName returns the name of a tar member relative to the
// archive's top directory top ("" for top itself), or an error when the
// member is not a plain name inside top.
func cifarMemberName(name, top string) (string, error) {
	if strings.Contains(name, `\`) || !filepath.IsLocal(name) {
		return "", fmt.Errorf("not a relative path inside the archive")
	}
	clean := path.Clean(name)
	if clean == top {
		return "", nil
	}
	rest, ok := strings.CutPrefix(clean, top+"/")
	if !ok {
		return "", fmt.Errorf("outside %s/", top)
	}
	if strings.Contains(rest, "/") || strings.HasPrefix(rest, ".") {
		return "", fmt.Errorf("not a plain file name inside %s/", top)
	}
	return rest, nil
}

// writeMember writes exactly size bytes from r to a new file p.
func writeMember(p string, r io.Reader, size int64) error {
	out, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return unwrapPathError(err)
	}
	n, err := io.Copy(out, io.LimitReader(r, size))
	if err == nil && n != size {
		err = io.ErrUnexpectedEOF
	}
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}
