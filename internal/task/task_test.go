package task

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentrun/agentrun/internal/config"
	"github.com/agentrun/agentrun/internal/errkind"
	"github.com/agentrun/agentrun/internal/netpolicy"
)

// errorCases are tasks that must be refused, with the field the error names.
// They also seed FuzzParse.
var errorCases = []struct {
	name   string
	json   string
	cfg    func(*config.Config) // optional change to the default config
	field  string
	policy bool
}{
	// Parse: syntax and shape.
	{name: "not json", json: `{"code":`, field: "code"},
	{name: "bad json", json: `{"code":"x" "y"}`, field: ""},
	{name: "null", json: `null`, field: ""},
	{name: "array", json: `[]`, field: ""},
	{name: "trailing", json: `{"code":"x"} {}`, field: ""},
	{name: "unknown", json: `{"code":"x","langauge":"python"}`, field: "langauge"},
	{name: "unknown nested", json: `{"code":"x","limits":{"mem":"1g"}}`, field: "limits.mem"},
	{name: "unknown in file", json: `{"code":"x","files":{"a":{"data":"x"}}}`, field: `files["a"].data`},
	{name: "wrong case", json: `{"Code":"x"}`, field: "Code"},
	{name: "duplicate", json: `{"code":"x","code":"y"}`, field: "code"},
	{name: "code type", json: `{"code":1}`, field: "code"},
	{name: "command type", json: `{"command":"ls -l"}`, field: "command"},
	{name: "command elem type", json: `{"command":["ls",1]}`, field: "command[1]"},
	{name: "cpus type", json: `{"code":"x","limits":{"cpus":"1"}}`, field: "limits.cpus"},
	{name: "pids fraction", json: `{"code":"x","limits":{"pids":1.5}}`, field: "limits.pids"},
	{name: "pids overflow", json: `{"code":"x","limits":{"pids":99999999999999999999}}`, field: "limits.pids"},
	{name: "env type", json: `{"code":"x","env":{"A":1}}`, field: `env["A"]`},
	{name: "files type", json: `{"code":"x","files":["a"]}`, field: "files"},

	// Program.
	{name: "no code or command", json: `{}`, field: "code"},
	{name: "empty code and command", json: `{"code":"","command":[]}`, field: "code"},
	{name: "code and command", json: `{"code":"x","command":["ls"]}`, field: "command"},
	{name: "empty command entry", json: `{"command":["ls",""]}`, field: "command[1]"},
	{name: "NUL in command", json: `{"command":["l\u0000s"]}`, field: "command[0]"},
	{name: "unknown language", json: `{"code":"x","language":"cobol"}`, field: "language"},

	// Session, image, runtime.
	{name: "session chars", json: `{"code":"x","session":"a b"}`, field: "session"},
	{name: "id chars", json: `{"code":"x","id":"a.b"}`, field: "id"},
	{name: "id long", json: `{"code":"x","id":"` + strings.Repeat("a", 129) + `"}`, field: "id"},
	{name: "session slash", json: `{"code":"x","session":"../x"}`, field: "session"},
	{name: "session long", json: `{"code":"x","session":"` + strings.Repeat("a", 129) + `"}`, field: "session"},
	{name: "image whitespace", json: `{"code":"x","image":"python :3"}`, field: "image"},
	{name: "image NUL", json: `{"code":"x","image":"py\u0000"}`, field: "image"},
	{name: "image long", json: `{"code":"x","image":"` + strings.Repeat("a", 1025) + `"}`, field: "image"},
	{name: "image missing", json: `{"code":"x"}`, cfg: func(c *config.Config) { c.Image = "" }, field: "image"},
	{name: "runtime", json: `{"code":"x","runtime":"docker"}`, field: "runtime"},

	// Files.
	{name: "file dotdot", json: `{"code":"x","files":{"../x":{"content":""}}}`, field: `files["../x"]`},
	{name: "file inner dotdot", json: `{"code":"x","files":{"a/../../x":{"content":""}}}`, field: `files["a/../../x"]`},
	{name: "file dot", json: `{"code":"x","files":{"./a":{"content":""}}}`, field: `files["./a"]`},
	{name: "file absolute", json: `{"code":"x","files":{"/etc/passwd":{"content":""}}}`, field: `files["/etc/passwd"]`},
	{name: "file empty name", json: `{"code":"x","files":{"":{"content":""}}}`, field: `files[""]`},
	{name: "file empty component", json: `{"code":"x","files":{"a//b":{"content":""}}}`, field: `files["a//b"]`},
	{name: "file trailing slash", json: `{"code":"x","files":{"a/":{"content":""}}}`, field: `files["a/"]`},
	{name: "file NUL", json: `{"code":"x","files":{"a\u0000b":{"content":""}}}`, field: "files[\"a\\x00b\"]"},
	{name: "file long component", json: `{"code":"x","files":{"` + strings.Repeat("a", 256) + `":{"content":""}}}`, field: `files["` + strings.Repeat("a", 256) + `"]`},
	{name: "file long path", json: `{"code":"x","files":{"` + strings.Repeat("a/", 2048) + `b":{"content":""}}}`, field: `files["` + strings.Repeat("a/", 2048) + `b"]`},
	{name: "file is code file", json: `{"code":"x","files":{"main.py":{"content":""}}}`, field: `files["main.py"]`},
	{name: "file under code file", json: `{"code":"x","files":{"main.py/x":{"content":""}}}`, field: `files["main.py/x"]`},
	{name: "file and dir", json: `{"code":"x","files":{"a":{"content":""},"a/b":{"content":""}}}`, field: `files["a/b"]`},
	{name: "file no content", json: `{"code":"x","files":{"a":{}}}`, field: `files["a"]`},
	{name: "file null", json: `{"code":"x","files":{"a":null}}`, field: `files["a"]`},
	{name: "file both contents", json: `{"code":"x","files":{"a":{"content":"","content_base64":""}}}`, field: `files["a"]`},
	{name: "file bad base64", json: `{"code":"x","files":{"a":{"content_base64":"%%%"}}}`, field: `files["a"].content_base64`},
	{name: "memory below minimum", json: `{"code":"x","limits":{"memory":"1"}}`, field: "limits.memory"},
	{name: "tmp below minimum", json: `{"code":"x","limits":{"tmp_size":"1k"}}`, field: "limits.tmp_size"},
	{name: "host dir image", json: `{"code":"x","image":"dir:/"}`, field: "image", policy: true},
	{name: "relative dir image", json: `{"code":"x","image":"dir:relative"}`, field: "image", policy: true},
	{name: "oci image outside policy", json: `{"code":"x","image":"oci:/etc:latest"}`, field: "image", policy: true},
	{name: "archive image outside policy", json: `{"code":"x","image":"docker-archive:/tmp/x.tar"}`, field: "image", policy: true},
	{name: "files too big", json: `{"code":"x","limits":{"workspace_size":"4"},"files":{"a":{"content":"abcd"}}}`, field: "limits.workspace_size"},
	{name: "stdin too big", json: `{"command":["cat"],"limits":{"workspace_size":"2"},"stdin":"abc"}`, field: "limits.workspace_size"},

	// Collect.
	{name: "collect dotdot", json: `{"code":"x","collect":["../*"]}`, field: "collect[0]"},
	{name: "collect absolute", json: `{"code":"x","collect":["ok","/etc/*"]}`, field: "collect[1]"},
	{name: "collect empty", json: `{"code":"x","collect":[""]}`, field: "collect[0]"},
	{name: "collect bad glob", json: `{"code":"x","collect":["out/[a"]}`, field: "collect[0]"},
	{name: "collect too many", json: `{"code":"x","collect":[` + strings.Repeat(`"a",`, 64) + `"a"]}`, field: "collect"},

	// Env.
	{name: "env name", json: `{"code":"x","env":{"A=B":"c"}}`, field: `env["A=B"]`},
	{name: "env digit", json: `{"code":"x","env":{"1A":"c"}}`, field: `env["1A"]`},
	{name: "env empty name", json: `{"code":"x","env":{"":"c"}}`, field: `env[""]`},
	{name: "env NUL", json: `{"code":"x","env":{"A":"b\u0000"}}`, field: `env["A"]`},
	{name: "env PATH", json: `{"code":"x","env":{"PATH":"/tmp"}}`, field: `env["PATH"]`},
	{name: "env HOME", json: `{"code":"x","env":{"HOME":"/root"}}`, field: `env["HOME"]`},
	{name: "env AGENTRUN_", json: `{"code":"x","env":{"AGENTRUN_TOKEN":"x"}}`, field: `env["AGENTRUN_TOKEN"]`},
	{name: "env HTTP_PROXY", json: `{"code":"x","env":{"HTTP_PROXY":"x"}}`, field: `env["HTTP_PROXY"]`},
	{name: "env HTTPS_PROXY", json: `{"code":"x","env":{"HTTPS_PROXY":"x"}}`, field: `env["HTTPS_PROXY"]`},
	{name: "env http_proxy", json: `{"code":"x","env":{"http_proxy":"x"}}`, field: `env["http_proxy"]`},
	{name: "env https_proxy", json: `{"code":"x","env":{"https_proxy":"x"}}`, field: `env["https_proxy"]`},
	{name: "env NO_PROXY", json: `{"code":"x","env":{"NO_PROXY":"x"}}`, field: `env["NO_PROXY"]`},
	{name: "env no_proxy", json: `{"code":"x","env":{"no_proxy":"x"}}`, field: `env["no_proxy"]`},

	// Limits: syntax and sign.
	{name: "timeout syntax", json: `{"code":"x","limits":{"timeout":"5"}}`, field: "limits.timeout"},
	{name: "timeout zero", json: `{"code":"x","limits":{"timeout":"0s"}}`, field: "limits.timeout"},
	{name: "timeout negative", json: `{"code":"x","limits":{"timeout":"-1s"}}`, field: "limits.timeout"},
	{name: "memory syntax", json: `{"code":"x","limits":{"memory":"lots"}}`, field: "limits.memory"},
	{name: "memory zero", json: `{"code":"x","limits":{"memory":"0"}}`, field: "limits.memory"},
	{name: "memory negative", json: `{"code":"x","limits":{"memory":"-1m"}}`, field: "limits.memory"},
	{name: "tmp_size zero", json: `{"code":"x","limits":{"tmp_size":"0m"}}`, field: "limits.tmp_size"},
	{name: "workspace_size syntax", json: `{"code":"x","limits":{"workspace_size":"1q"}}`, field: "limits.workspace_size"},
	{name: "net_bytes syntax", json: `{"code":"x","limits":{"net_bytes":"x"}}`, field: "limits.net_bytes"},
	{name: "cpus zero", json: `{"code":"x","limits":{"cpus":0}}`, field: "limits.cpus"},
	{name: "cpus negative", json: `{"code":"x","limits":{"cpus":-0.5}}`, field: "limits.cpus"},
	{name: "pids zero", json: `{"code":"x","limits":{"pids":0}}`, field: "limits.pids"},
	{name: "pids negative", json: `{"code":"x","limits":{"pids":-1}}`, field: "limits.pids"},
	{name: "output_bytes zero", json: `{"code":"x","limits":{"output_bytes":0}}`, field: "limits.output_bytes"},
	{name: "net_connections negative", json: `{"code":"x","limits":{"net_connections":-1}}`, field: "limits.net_connections"},

	// Limits: policy.
	{name: "timeout policy", json: `{"code":"x","limits":{"timeout":"61s"}}`, field: "limits.timeout", policy: true},
	{name: "memory policy", json: `{"code":"x","limits":{"memory":"4g"}}`, field: "limits.memory", policy: true},
	{name: "tmp_size policy", json: `{"code":"x","limits":{"tmp_size":"2g"}}`, field: "limits.tmp_size", policy: true},
	{name: "tmp_size above memory", json: `{"code":"x","limits":{"memory":"32m","tmp_size":"64m"}}`, field: "limits.tmp_size"},
	{name: "workspace_size policy", json: `{"code":"x","limits":{"workspace_size":"1025m"}}`, field: "limits.workspace_size", policy: true},
	{name: "net_bytes policy", json: `{"code":"x","limits":{"net_bytes":"2g"}}`, field: "limits.net_bytes", policy: true},
	{name: "cpus policy", json: `{"code":"x","limits":{"cpus":2.5}}`, field: "limits.cpus", policy: true},
	{name: "pids policy", json: `{"code":"x","limits":{"pids":513}}`, field: "limits.pids", policy: true},
	{name: "output_bytes policy", json: `{"code":"x","limits":{"output_bytes":1048577}}`, field: "limits.output_bytes", policy: true},
	{name: "net_connections policy", json: `{"code":"x","limits":{"net_connections":257}}`, field: "limits.net_connections", policy: true},

	// Network.
	{name: "network off by policy", json: `{"code":"x","network":{"allow":["pypi.org"]}}`,
		cfg: func(c *config.Config) { *c.Policy.AllowNetwork = false }, field: "network.allow", policy: true},
	{name: "allow too many", json: `{"code":"x","network":{"allow":[` + strings.Repeat(`"a.com",`, 256) + `"a.com"]}}`, field: "network.allow"},
	{name: "allow empty", json: `{"code":"x","network":{"allow":[""]}}`, field: "network.allow[0]"},
	{name: "allow scheme", json: `{"code":"x","network":{"allow":["https://pypi.org"]}}`, field: "network.allow[0]"},
	{name: "allow path", json: `{"code":"x","network":{"allow":["pypi.org/simple"]}}`, field: "network.allow[0]"},
	{name: "allow bare star", json: `{"code":"x","network":{"allow":["*"]}}`, field: "network.allow[0]"},
	{name: "allow inner star", json: `{"code":"x","network":{"allow":["a.*.com"]}}`, field: "network.allow[0]"},
	{name: "allow port zero", json: `{"code":"x","network":{"allow":["a.com:0"]}}`, field: "network.allow[0]"},
	{name: "allow port big", json: `{"code":"x","network":{"allow":["ok.com","a.com:65536"]}}`, field: "network.allow[1]"},
	{name: "allow port junk", json: `{"code":"x","network":{"allow":["a.com:http"]}}`, field: "network.allow[0]"},
	{name: "allow empty port", json: `{"code":"x","network":{"allow":["a.com:"]}}`, field: "network.allow[0]"},
	{name: "allow ip", json: `{"code":"x","network":{"allow":["169.254.169.254"]}}`, field: "network.allow[0]"},
	{name: "allow ipv6", json: `{"code":"x","network":{"allow":["[::1]:443"]}}`, field: "network.allow[0]"},
	{name: "allow label dash", json: `{"code":"x","network":{"allow":["-a.com"]}}`, field: "network.allow[0]"},
	{name: "allow trailing dot", json: `{"code":"x","network":{"allow":["a.com."]}}`, field: "network.allow[0]"},
	{name: "services none declared", json: `{"code":"x","network":{"services":["github"]}}`, field: "network.services[0]", policy: true},
	{name: "services unknown", json: `{"code":"x","network":{"services":["gh","gitlab"]}}`, field: "network.services[1]", policy: true,
		cfg: func(c *config.Config) { c.Network.Services = map[string]config.Service{"gh": {}} }},
	{name: "services off by policy", json: `{"code":"x","network":{"services":["gh"]}}`, field: "network.services", policy: true,
		cfg: func(c *config.Config) {
			c.Network.Services = map[string]config.Service{"gh": {}}
			*c.Policy.AllowNetwork = false
		}},
	{name: "services not a list", json: `{"code":"x","network":{"services":"gh"}}`, field: "network.services"},
	{name: "keep_state without a kept session", json: `{"code":"x","session":"mine","keep_state":true}`, field: "keep_state"},
	{name: "reset_state without a kept session", json: `{"code":"x","reset_state":true}`, field: "reset_state"},
	{name: "keep_state of a command", json: `{"command":["python3","-c","x"],"session":"ss-0123456789abcdef0123456789abcdef","keep_state":true}`, field: "keep_state"},
	{name: "keep_state of bash", json: `{"code":"x","language":"bash","session":"ss-0123456789abcdef0123456789abcdef","keep_state":true}`, field: "keep_state"},
}

// TestKeepStateKeepsWorkspace: keep_state (and reset_state) imply
// keep_workspace.
func TestKeepStateKeepsWorkspace(t *testing.T) {
	for _, f := range []string{"keep_state", "reset_state"} {
		p, err := Load([]byte(`{"code":"x","session":"ss-0123456789abcdef0123456789abcdef","`+f+`":true}`), config.Default())
		if err != nil {
			t.Fatal(err)
		}
		if !p.KeepWorkspace || p.KeepState != (f == "keep_state") || p.ResetState != (f == "reset_state") {
			t.Errorf("%s: plan keeps workspace %v, state %v, resets %v", f, p.KeepWorkspace, p.KeepState, p.ResetState)
		}
	}
}

func TestErrors(t *testing.T) {
	for _, tc := range errorCases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			if tc.cfg != nil {
				tc.cfg(cfg)
			}
			p, err := Load([]byte(tc.json), cfg)
			var te *Error
			if !errors.As(err, &te) {
				t.Fatalf("Load = %+v, %v; want *Error for field %q", p, err, tc.field)
			}
			if te.Field != tc.field {
				t.Errorf("Field = %q, want %q (%v)", te.Field, tc.field, err)
			}
			if errors.Is(err, errkind.ErrPolicy) != tc.policy {
				t.Errorf("errors.Is(err, errkind.ErrPolicy) = %v, want %v (%v)", !tc.policy, tc.policy, err)
			}
			if want := map[bool]errkind.Kind{true: errkind.Policy, false: errkind.Invalid}[tc.policy]; errkind.Of(err) != want {
				t.Errorf("errkind.Of(err) = %v, want %v (%v)", errkind.Of(err), want, err)
			}
			if te.Reason == "" {
				t.Errorf("empty Reason")
			}
		})
	}
}

func TestErrorText(t *testing.T) {
	_, err := Load([]byte(`{"code":"x","limits":{"memory":"4g"}}`), config.Default())
	if err == nil || err.Error() != "task: limits.memory: 4g exceeds policy maximum 2g" {
		t.Errorf("got %v", err)
	}
	_, err = Load([]byte(`{}`), config.Default())
	if err == nil || err.Error() != "task: code: one of code or command is required" {
		t.Errorf("got %v", err)
	}
	_, err = Load([]byte(`{"code":"x","language":"cobol"}`), config.Default())
	if err == nil || !strings.Contains(err.Error(), "bash, node, python, python3, sh") {
		t.Errorf("unknown language should list known ones: %v", err)
	}
	_, err = Load([]byte(`{"code":"x","limits":{"cpus":2.5}}`), config.Default())
	if err == nil || err.Error() != "task: limits.cpus: 2.5 exceeds policy maximum 2" {
		t.Errorf("got %v", err)
	}
	_, err = Load([]byte(`{"code":"x","network":{"allow":["pypi.org","https://PyPI.org/simple"]}}`), config.Default())
	if err == nil || err.Error() != `task: network.allow[1]: "https://PyPI.org/simple": a URL, not a host name: give the host name alone ("pypi.org"), with an optional ":port"` {
		t.Errorf("URL in network.allow: %v", err)
	}
	_, err = Parse(make([]byte, MaxTaskBytes+1))
	if err == nil || !strings.HasPrefix(err.Error(), "task: task is ") {
		t.Errorf("oversize: %v", err)
	}
}

func TestDefaults(t *testing.T) {
	data := []byte(`{"code":"print(1)"}`)
	p, err := Load(data, config.Default())
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	want := &Plan{
		Image:    "python:3.12-slim",
		Runtime:  "libcontainer",
		Argv:     []string{"python3", "-u", "/workspace/main.py"},
		CodeFile: "main.py",
		Code:     []byte("print(1)"),
		Files:    map[string][]byte{},
		Env:      map[string]string{},
		Limits: Limits{
			Timeout: 5 * time.Second, Memory: 256 << 20, CPUs: 0.5, Pids: 64, OutputBytes: 65536,
			TmpSize: 64 << 20, WorkspaceSize: 64 << 20, NetBytes: 64 << 20, NetConns: 32,
		},
		OwnImage: true,
		TaskHash: "sha256:" + hex.EncodeToString(sum[:]),
	}
	if !reflect.DeepEqual(p, want) {
		t.Errorf("plan\n got %+v\nwant %+v", p, want)
	}
}

func TestFullTask(t *testing.T) {
	cfg := config.Default()
	cfg.Env = map[string]string{"LANG": "C.UTF-8", "MPLBACKEND": "pdf"}
	cfg.Languages["ruby"] = []string{"ruby", "--script={file}"}
	cfg.Runtime = "runsc"
	p, err := Load([]byte(`{
		"session": "chat-42:a.b_c",
		"image": "ruby:3",
		"language": "ruby",
		"code": "puts 1",
		"command": null,
		"stdin": "in",
		"files": {"data.csv": {"content": "a,b\n"}, "d/blob.bin": {"content_base64": "AAEC"}, "d/e/f": {"content": ""}},
		"collect": ["out/*.png", "report.md"],
		"env": {"MPLBACKEND": "Agg", "_X1": ""},
		"limits": {"timeout": "1m", "memory": "2GiB", "cpus": 2, "pids": 512, "output_bytes": 1, "tmp_size": "1g",
		           "workspace_size": "64k", "net_bytes": "1.5k", "net_connections": 256},
		"network": {"allow": ["PyPI.org", "*.pythonhosted.org", "api.example.com:08443", "pypi.org"]},
		"runtime": "libcontainer"
	}`), cfg)
	if err != nil {
		t.Fatal(err)
	}
	want := &Plan{
		Session:  "chat-42:a.b_c",
		Image:    "ruby:3",
		Runtime:  "libcontainer",
		Argv:     []string{"ruby", "--script=/workspace/main"},
		CodeFile: "main",
		Code:     []byte("puts 1"),
		Stdin:    []byte("in"),
		Files:    map[string][]byte{"data.csv": []byte("a,b\n"), "d/blob.bin": {0, 1, 2}, "d/e/f": {}},
		Collect:  []string{"out/*.png", "report.md"},
		Env:      map[string]string{"LANG": "C.UTF-8", "MPLBACKEND": "Agg", "_X1": ""},
		Limits: Limits{
			Timeout: time.Minute, Memory: 2 << 30, CPUs: 2, Pids: 512, OutputBytes: 1,
			TmpSize: 1 << 30, WorkspaceSize: 64 << 10, NetBytes: 1536, NetConns: 256,
		},
		Allow:    mustAllow(t, "pypi.org", "*.pythonhosted.org", "api.example.com:8443"),
		TaskHash: p.TaskHash,
	}
	if !reflect.DeepEqual(p, want) {
		t.Errorf("plan\n got %+v\nwant %+v", p, want)
	}
	if cfg.Env["MPLBACKEND"] != "pdf" {
		t.Error("Resolve modified the config's env")
	}
}

// mustAllow parses allowlist entries.
func mustAllow(t *testing.T, entries ...string) *netpolicy.Allowlist {
	t.Helper()
	a, err := netpolicy.ParseAllow(entries)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestCommand(t *testing.T) {
	p, err := Load([]byte(`{"command":["sh","-c","echo {file}"],"language":"cobol"}`), config.Default())
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(p.Argv, []string{"sh", "-c", "echo {file}"}) || p.CodeFile != "" || p.Code != nil {
		t.Errorf("command plan: %+v", p)
	}
}

func TestCodeFileName(t *testing.T) {
	for lang, want := range map[string]string{"python": "main.py", "python3": "main.py", "node": "main.js", "bash": "main.sh", "sh": "main.sh", "ruby": "main"} {
		if got := CodeFileName(lang); got != want {
			t.Errorf("CodeFileName(%q) = %q, want %q", lang, got, want)
		}
	}
}

func TestResolveBrokenConfig(t *testing.T) {
	tk, err := Parse([]byte(`{"code":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.Policy.Memory = config.Size{} // no maximum: only a config that did not load
	_, err = tk.Resolve(cfg)
	var te *Error
	if err == nil || errors.As(err, &te) {
		t.Errorf("broken config: %v; want a plain error", err)
	}
	if _, err := tk.Resolve(nil); err == nil {
		t.Error("nil config should fail")
	}
}

// TestLocalImageUnderPolicy: a local image is refused outside
// policy.local_images, by a refusal that names the key, not its directories.
func TestLocalImageUnderPolicy(t *testing.T) {
	cfg := config.Default()
	cfg.Policy.LocalImages = []string{"/srv/images"}
	for ref, ok := range map[string]bool{
		"dir:/srv/images/py":               true,
		"oci:/srv/images/layout:latest":    true,
		"docker-archive:/srv/images/a.tar": true,
		"dir:/srv/images/../../etc":        false,
		"dir:/srv/imagesX":                 false,
		"oci:/srv/other:latest":            false,
		"python:3.12-slim":                 true,
	} {
		_, err := Load([]byte(`{"code":"x","image":"`+ref+`"}`), cfg)
		if (err == nil) != ok {
			t.Errorf("image %q: err %v; want allowed %v", ref, err, ok)
		}
		if err != nil && !errors.Is(err, errkind.ErrPolicy) {
			t.Errorf("image %q: %v is not a policy refusal", ref, err)
		}
		// The refusal names the config key, never the host's directories.
		if err != nil && strings.Contains(err.Error(), `"/srv/images"`) {
			t.Errorf("image %q: %v names the host's directories", ref, err)
		}
	}
}

// TestDefaultTmpSizeFollowsMemory: a task that lowers memory below the
// default tmp_size gets a /tmp no larger than its memory.
func TestDefaultTmpSizeFollowsMemory(t *testing.T) {
	p, err := Load([]byte(`{"code":"x","limits":{"memory":"32m"}}`), config.Default())
	if err != nil {
		t.Fatal(err)
	}
	if p.Limits.TmpSize != 32<<20 {
		t.Errorf("tmp_size %d; want the memory limit, 32 MiB", p.Limits.TmpSize)
	}
}

func TestServicesResolve(t *testing.T) {
	cfg := config.Default()
	cfg.Network.Services = map[string]config.Service{"gh": {}, "jira": {}}
	p, err := Load([]byte(`{"code":"x","network":{"services":["gh","jira","gh"]}}`), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.Services, []string{"gh", "jira"}) || p.Allow != nil {
		t.Errorf("Services = %q, Allow = %q; want [gh jira] and none", p.Services, p.Allow.Entries())
	}
}

// TestPlanHoldsItsConfigsTools: a plan holds the tool servers its task
// names and the tool_limits, as the config that resolved it has them,
// and whether its image is one the config names itself: the run takes
// them from the plan, not from a config that a reload may have replaced.
func TestPlanHoldsItsConfigsTools(t *testing.T) {
	cfg := config.Default()
	cfg.Tools = config.Tools{
		"ev": {URL: "http://127.0.0.1:1/mcp", Rules: []config.ToolRule{{Tools: []string{"echo"}, Approve: true}}},
		"gh": {URL: "http://127.0.0.1:2/mcp"},
	}
	cfg.ToolLimits = config.ToolLimits{Calls: 1}
	cfg.Server.Pool = map[string]config.PoolEntry{"pooled:1": {Count: 1}}
	p, err := Load([]byte(`{"code": "print(1)", "tools": ["ev", "ev"]}`), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(p.ToolServers, config.Tools{"ev": cfg.Tools["ev"]}) || p.ToolLimits != cfg.ToolLimits || !p.OwnImage {
		t.Errorf("plan's tool servers %+v, limits %+v, own image %v; want ev's, calls 1, true", p.ToolServers, p.ToolLimits, p.OwnImage)
	}
	for image, own := range map[string]bool{"pooled:1": true, cfg.Image: true, "other:1": false} {
		p, err := Load([]byte(`{"code": "print(1)", "image": "`+image+`"}`), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if p.OwnImage != own || p.ToolServers != nil {
			t.Errorf("image %s: own %v, tool servers %v; want own %v and none", image, p.OwnImage, p.ToolServers, own)
		}
	}
}
