package image_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agentrun/agentrun/image"
)

func ExampleStore_Get() {
	tmp, err := os.MkdirTemp("", "agentrun-example-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(tmp)
	store, err := image.Open(filepath.Join(tmp, "store"))
	if err != nil {
		panic(err)
	}
	// A dir: reference is used as is; registry, oci: and docker-archive:
	// references are pulled, verified and unpacked once, then shared.
	rootfs := filepath.Join(tmp, "rootfs")
	os.Mkdir(rootfs, 0o755)
	img, err := store.Get(context.Background(), "dir:"+rootfs, image.PullOptions{})
	if err != nil {
		panic(err)
	}
	fmt.Println(img.Rootfs == rootfs, img.Digest == "")
	// Output: true true
}
