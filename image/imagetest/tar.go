package imagetest

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"testing"
	"time"
)

// Tar writes a layer entry by entry, including entries no honest tool
// would write (absolute or ".." names, escaping links, device nodes).
type Tar struct {
	t   testing.TB
	buf bytes.Buffer
	tw  *tar.Writer
}

// NewTar starts an empty layer.
func NewTar(t testing.TB) *Tar {
	b := &Tar{t: t}
	b.tw = tar.NewWriter(&b.buf)
	return b
}

var epoch = time.Unix(1_700_000_000, 0)

// Header writes hdr as is, followed by content (hdr.Size is set from it
// for regular files when zero).
func (b *Tar) Header(hdr *tar.Header, content []byte) *Tar {
	b.t.Helper()
	if hdr.ModTime.IsZero() {
		hdr.ModTime = epoch
	}
	if hdr.Typeflag == tar.TypeReg && hdr.Size == 0 {
		hdr.Size = int64(len(content))
	}
	if hdr.Format == tar.FormatUnknown {
		hdr.Format = tar.FormatPAX
	}
	if err := b.tw.WriteHeader(hdr); err != nil {
		b.t.Fatalf("tar header %q: %v", hdr.Name, err)
	}
	if len(content) > 0 {
		if _, err := b.tw.Write(content); err != nil {
			b.t.Fatalf("tar content %q: %v", hdr.Name, err)
		}
	}
	return b
}

// Dir adds a directory.
func (b *Tar) Dir(name string, mode int64) *Tar {
	return b.Header(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode}, nil)
}

// File adds a regular file.
func (b *Tar) File(name, content string, mode int64) *Tar {
	return b.Header(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode}, []byte(content))
}

// Owned adds a regular file owned by uid:gid.
func (b *Tar) Owned(name, content string, mode int64, uid, gid int) *Tar {
	return b.Header(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Uid: uid, Gid: gid}, []byte(content))
}

// Symlink adds name -> target.
func (b *Tar) Symlink(name, target string) *Tar {
	return b.Header(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}, nil)
}

// Link adds a hardlink name to target.
func (b *Tar) Link(name, target string) *Tar {
	return b.Header(&tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, Mode: 0o644}, nil)
}

// Device adds a character device node.
func (b *Tar) Device(name string, major, minor int64) *Tar {
	return b.Header(&tar.Header{Typeflag: tar.TypeChar, Name: name, Mode: 0o666, Devmajor: major, Devminor: minor}, nil)
}

// Fifo adds a named pipe.
func (b *Tar) Fifo(name string) *Tar {
	return b.Header(&tar.Header{Typeflag: tar.TypeFifo, Name: name, Mode: 0o666}, nil)
}

// Whiteout adds the whiteout file ".wh."+victim in dir ("" for the top).
func (b *Tar) Whiteout(dir, victim string) *Tar {
	n := ".wh." + victim
	if dir != "" {
		n = dir + "/" + n
	}
	return b.File(n, "", 0o644)
}

// Bytes ends the layer and returns the uncompressed tar.
func (b *Tar) Bytes() []byte {
	b.t.Helper()
	if err := b.tw.Close(); err != nil {
		b.t.Fatalf("closing tar: %v", err)
	}
	return b.buf.Bytes()
}

// Gzip compresses data.
func Gzip(t testing.TB, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if _, err := zw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// GzipBomb returns a gzip-compressed tar holding one file of size zero
// bytes; it is about a thousand times smaller than what it expands to.
func GzipBomb(t testing.TB, size int64) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bomb", Mode: 0o644, Size: size, ModTime: epoch}); err != nil {
		t.Fatal(err)
	}
	zero := make([]byte, 1<<20)
	for left := size; left > 0; {
		n := int64(len(zero))
		if left < n {
			n = left
		}
		if _, err := tw.Write(zero[:n]); err != nil {
			t.Fatal(err)
		}
		left -= n
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
