package integration

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/agentrun/agentrun/internal/e2b/envd/filesystem"
	"github.com/agentrun/agentrun/internal/e2b/envd/process"
)

// envdProtos are the envd protocols the E2B door serves, from its own
// .proto files (internal/e2b/envd), registered on demand (make
// e2b-proto): a new one is a row here.
func envdProtos() []protoreflect.FileDescriptor {
	process.Register()
	filesystem.Register()
	return []protoreflect.FileDescriptor{process.File_process_process_proto, filesystem.File_filesystem_filesystem_proto}
}

// TestE2BProtoMatchesSDK: each envd .proto the door is generated from
// is, message by message and field by field (names, numbers, types,
// oneofs, streaming), the one compiled into the pinned e2b SDK
// (test/e2b-client), so the wire format is the SDK's.
func TestE2BProtoMatchesSDK(t *testing.T) {
	dir := npmPackages(t, "e2b-client", "e2b")
	js, err := os.ReadFile(filepath.Join(dir, "node_modules", "e2b", "dist", "index.mjs"))
	if err != nil {
		t.Fatal(err)
	}
	sdk := map[string]*descriptorpb.FileDescriptorProto{}
	for _, m := range regexp.MustCompile(`fileDesc\("([A-Za-z0-9+/=]+)"`).FindAllSubmatch(js, -1) {
		raw, err := base64.RawStdEncoding.DecodeString(string(m[1]))
		if err != nil {
			raw, err = base64.StdEncoding.DecodeString(string(m[1]))
		}
		var fd descriptorpb.FileDescriptorProto
		if err != nil || proto.Unmarshal(raw, &fd) != nil {
			t.Fatalf("the SDK's descriptor %.40s… does not decode", m[1])
		}
		sdk[fd.GetName()] = &fd
	}
	for _, f := range envdProtos() {
		want, ok := sdk[f.Path()]
		if !ok {
			t.Errorf("the SDK has no %s", f.Path())
			continue
		}
		got := protodesc.ToFileDescriptorProto(f)
		for _, fd := range []*descriptorpb.FileDescriptorProto{got, want} {
			// The SDK's descriptors name no imports (protobuf-es passes
			// them beside the descriptor): the fields' type names, the
			// imported ones' included, are compared.
			fd.Options, fd.SourceCodeInfo, fd.Dependency = nil, nil, nil
			stripJSONNames(fd.MessageType)
		}
		if !proto.Equal(got, want) {
			t.Errorf("%s differs from the SDK's:\nours %v\nSDK's %v", f.Path(), got, want)
		}
	}
}

// stripJSONNames drops the json_name protoc fills in and buf leaves out
// (each the default, lowerCamelCase).
func stripJSONNames(msgs []*descriptorpb.DescriptorProto) {
	for _, m := range msgs {
		for _, f := range m.Field {
			f.JsonName = nil
		}
		stripJSONNames(m.NestedType)
	}
}
