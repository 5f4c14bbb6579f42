package process_test

import (
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/agentrun/agentrun/internal/e2b/envd/filesystem"
	"github.com/agentrun/agentrun/internal/e2b/envd/process"
)

// TestRegisterOnDemand: envd's generated packages register nothing at
// init (every agentrun process, each container's init included, would
// pay for it); Register builds a file's descriptors and registers its
// types, and may be called again.
func TestRegisterOnDemand(t *testing.T) {
	for _, p := range []struct {
		path     string
		register func()
		file     *protoreflect.FileDescriptor
	}{
		{"process/process.proto", process.Register, &process.File_process_process_proto},
		{"filesystem/filesystem.proto", filesystem.Register, &filesystem.File_filesystem_filesystem_proto},
	} {
		if _, err := protoregistry.GlobalFiles.FindFileByPath(p.path); err == nil || *p.file != nil {
			t.Errorf("%s is registered before Register", p.path)
			continue
		}
		p.register()
		p.register()
		fd, err := protoregistry.GlobalFiles.FindFileByPath(p.path)
		if err != nil {
			t.Errorf("%s after Register: %v", p.path, err)
			continue
		}
		if fd != *p.file || fd.Services().Len() != 1 {
			t.Errorf("%s after Register: %v", p.path, fd)
		}
	}
}
