// Command ocipack packs a root filesystem directory into a one-layer
// linux/GOARCH image in an OCI image layout, under a tag, so that the demo
// and the tests pull it through agentrun's image store like any image:
//
//	go run ./test/images/ocipack ROOTFS LAYOUT TAG
package main

import (
	"fmt"
	"io"
	"os"
	"runtime"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/agentrun/agentrun/image/imagetest"
	"github.com/agentrun/agentrun/runtime/spec"
)

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: ocipack ROOTFS LAYOUT TAG")
		os.Exit(2)
	}
	if err := pack(os.Args[1], os.Args[2], os.Args[3]); err != nil {
		fmt.Fprintf(os.Stderr, "ocipack: %v\n", err)
		os.Exit(1)
	}
}

func pack(rootfs, dir, tag string) error {
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		r, w := io.Pipe()
		go func() { w.CloseWithError(imagetest.WriteTar(w, rootfs)) }()
		return r, nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return err
	}
	// OCI media types throughout, as an OCI layout's readers expect.
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.ConfigFile(base, &v1.ConfigFile{
		OS: "linux", Architecture: runtime.GOARCH,
		RootFS: v1.RootFS{Type: "layers"},
		Config: v1.Config{Env: []string{"PATH=" + spec.DefaultPath}},
	})
	if err != nil {
		return err
	}
	if img, err = mutate.AppendLayers(img, layer); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	return p.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": tag}))
}
