# agentrun: build, install, demo and test.
#
#   make demo     install what is missing, build, run examples/hello.json offline
#   make test     install what is missing, build, run the whole suite (as root)
#   make install  install bin/agentrun to $(PREFIX)/bin, the systemd units and a config
#   make deb      build the Debian package (bin/agentrun_VERSION_ARCH.deb)
#   make bench    measure against bare chroot, the kernel floor, runc and bwrap (docs/bench.md)
#   make soak     1,000 mixed runs, checking nothing accumulates
#   make vm-test  the cgroup suites in a QEMU machine on pure cgroup v2 (test/vm/run.sh)

GO       ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
PREFIX   ?= /usr/local
UNITDIR  ?= $(PREFIX)/lib/systemd/system
VERSION  ?= 0.1.0
# seccomp: libcontainer's seccomp through libseccomp. runc_nocriu: no
# checkpoint/restore (agentrun never uses it), so go-criu and its protobuf
# tables are not in the binary, whose package inits every container's init
# runs again (about 1 ms of the 3.7 ms they took).
TAGS     := seccomp,runc_nocriu
BIN      := bin/agentrun
# The first program of every libcontainer sandbox: it loads the seccomp
# filter agentrun compiled once (runtime/runc/seccomp.go). Static, to run
# in any image, and against musl (musl-tools) where it is installed: a
# 47 KB program whose start does nothing glibc's does (its tunables, CPU
# features and relocations), 0.25 ms of CPU an exec against 0.8 for the
# glibc build (perf stat -r 300); gcc's static glibc build otherwise.
HELPER   := bin/agentrun-seccomp
CC       ?= cc
HELPER_CC ?= $(if $(shell command -v musl-gcc),musl-gcc -idirafter /usr/include -idirafter /usr/include/$(shell $(CC) -print-multiarch),$(CC))
IMAGES   ?= /var/cache/agentrun/images
# Debian's python3 runs the Python client's tests (clients/python), with
# no site packages: the client needs none.
PYTHON   ?= /usr/bin/python3
# FUZZTIME, if set (say 60s), fuzzes each target that long instead of for
# its count of inputs below.
FUZZTIME ?=

export CGO_ENABLED := 1
export AGENTRUN_IMAGES := $(IMAGES)
# The tests that need root fail without it here instead of skipping, as
# they do under a plain go test (test/testenv.RequireRoot).
export AGENTRUN_TEST_ROOT := 1
# libseccomp is linked statically from its archive (libseccomp-dev ships
# it), as everything else is (STATIC below): the binary needs no library
# on the host. Expanded when used, so after `deps` has installed it.
export CGO_LDFLAGS = $(wildcard $(shell pkg-config --variable=libdir libseccomp 2>/dev/null)/libseccomp.a)

# Stamped into the binary (agentrun version): the release, the commit (for
# builds where Go's own VCS stamping is off), and the gVisor release
# test/runsc.sh installs.
RUNSC_VERSION := $(shell sed -n 's/^version=//p' test/runsc.sh)
COMMIT        := $(shell git rev-parse HEAD 2>/dev/null)$(shell git status --porcelain 2>/dev/null | grep -q . && echo ' (modified)')
LDFLAGS       := -X main.version=$(VERSION) -X 'main.commit=$(COMMIT)' -X main.runscVersion=$(RUNSC_VERSION)
# The binary is linked statically, glibc's archive included (libc6-dev
# ships it): a cold run executes it twice, as the CLI and again as its
# container's init, and each exec of the dynamically linked binary paid
# for the dynamic loader, libc's own relocation and its per-thread malloc
# arenas, some 300 page faults more a process (docs/bench.md, "A cold
# run's wall time"). osusergo and netgo: the standard library's own user
# and DNS lookups, as a static glibc cannot load NSS modules.
BUILD_TAGS    := $(TAGS),osusergo,netgo
STATIC        := -linkmode external -extldflags -static
UNITS         := agentrun.socket agentrun.service agentrun@.service agentrun-worker.service

.PHONY: all build install deb deps images runsc mcp-client mcp-servers approvals-page openapi-validator ts-client e2b-client e2b-proto demo test unit lint-launcher lint-python-client python-client integration fuzz vet bench soak vm-test clean

all: build

build: $(HELPER)
	$(GO) build -tags $(BUILD_TAGS) -trimpath -ldflags "$(LDFLAGS) $(STATIC)" -o $(BIN) ./cmd/agentrun

$(HELPER): runtime/runc/seccompexec/seccompexec.c
	@mkdir -p $(@D)
	$(HELPER_CC) -static -O2 -Wall -Wextra -Werror -o $@ $<

# install: the binary, its seccomp helper, the systemd units (pointing at it) and, when there
# is none, the default config. The agentrun group is the admin's (or the
# package's) to create.
install: build
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/agentrun
	install -D -m 0755 $(HELPER) $(DESTDIR)$(PREFIX)/lib/agentrun/agentrun-seccomp
	install -d -m 0755 $(DESTDIR)$(UNITDIR) $(DESTDIR)/etc/agentrun/tasks
	for u in $(UNITS); do \
		sed 's|/usr/bin/agentrun|$(PREFIX)/bin/agentrun|g' packaging/systemd/$$u >$(DESTDIR)$(UNITDIR)/$$u && \
		chmod 0644 $(DESTDIR)$(UNITDIR)/$$u || exit 1; \
	done
	test -e $(DESTDIR)/etc/agentrun/config.json || install -m 0644 packaging/config.json $(DESTDIR)/etc/agentrun/config.json
	if [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi

# deb: the Debian package, built with nfpm (packaging/nfpm.yaml).
deb: build
	GO=$(GO) packaging/deb.sh $(BIN) $(HELPER) bin $(VERSION)

# deps installs the Debian packages the build and the tests need (root).
deps:
	test/deps.sh

images: deps
	GO=$(GO) test/images/build.sh all

# runsc installs gVisor's runsc (built from source, cached) for runtime runsc.
runsc:
	GO=$(GO) test/runsc.sh >/dev/null

demo: deps build images
	$(BIN) run --config examples/demo-config.json examples/hello.json

# vet: go vet, then staticcheck (built from the module proxy at a pinned
# release, outside this module's dependencies).
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
vet:
	$(GO) vet -tags $(TAGS) ./...
	$(GO) run $(STATICCHECK) -tags $(TAGS) ./...

# unit: every package's own tests (those of netns, proxy, image, runtime/cgroup and the
# workspace make namespaces, veths, mounts and cgroups: root), and test/docs:
# every relative link and #anchor of README.md and docs/*.md resolves,
# docs/architecture.md's layout names every Go package, and docs/config.md's
# limits are config.LimitTable's; the Python launcher's lint; and the
# Python client's own tests.
unit: lint-launcher lint-python-client
	$(GO) test -tags $(TAGS) -count=1 ./internal/... ./runtime/spec/ ./runtime/backend/ ./runtime/cgroup/ ./runtime/runc/... ./image/... ./netns/... ./proxy/... ./cmd/... ./test/bench/ ./test/docs/
	cd clients/python && PYTHONPATH=. $(PYTHON) -S -B -m unittest discover -s tests

# lint-python-client: the Python client (its package, build backend and
# type generator) passes mypy --strict as Python 3.9 reads it (Debian's
# python3-mypy; no cache left behind) and pyflakes.
PYCLIENT_PY := clients/python/agentrun clients/python/build_backend.py clients/python/gen_types.py
lint-python-client:
	$(PYTHON) -m mypy --strict --python-version 3.9 --no-incremental --cache-dir=/dev/null $(PYCLIENT_PY)
	pyflakes3 $(PYCLIENT_PY) clients/python/tests

# python-client: the Python client's wheel and sdist in bin/python, built
# by its own backend with the standard library alone (what pip install
# ./clients/python builds).
python-client:
	cd clients/python && PYTHONDONTWRITEBYTECODE=1 $(PYTHON) build_backend.py $(CURDIR)/bin/python

# lint-launcher: agentrun's Python launcher (internal/launcher's .py files,
# which run in every sandbox's interpreter) compiles with Debian's python3
# (its bytecode written to a directory removed after) and passes pyflakes
# (Debian's pyflakes3: no undefined, unused or shadowed name).
LAUNCHER_PY := $(wildcard internal/launcher/*.py internal/launcher/testdata/*.py)
lint-launcher:
	tmp=$$(mktemp -d) && PYTHONPYCACHEPREFIX=$$tmp $(PYTHON) -m py_compile $(LAUNCHER_PY); rc=$$?; rm -rf "$$tmp"; exit $$rc
	pyflakes3 $(LAUNCHER_PY)

# mcp-client installs the TypeScript MCP SDK the integration suite drives
# agentrun mcp with (test/mcp-client, from its package-lock.json).
mcp-client: deps
	cd test/mcp-client && npm ci --no-audit --no-fund

# mcp-servers installs the third-party MCP tool servers the integration
# suite brokers calls to (test/mcp-servers: npm's server-everything, from
# its package-lock.json).
mcp-servers: deps
	cd test/mcp-servers && npm ci --no-audit --no-fund

# approvals-page installs playwright-core, with which the integration
# suite drives Debian's chromium on serve's approvals page
# (test/approvals-page, from its package-lock.json; no browser download).
approvals-page: deps
	cd test/approvals-page && npm ci --no-audit --no-fund

# openapi-validator installs the outside OpenAPI validator the suite
# checks serve's document with (test/openapi-validator, from its
# package-lock.json).
openapi-validator: deps
	cd test/openapi-validator && npm ci --no-audit --no-fund

# e2b-client installs E2B's own SDKs (npm e2b and @e2b/code-interpreter,
# pinned) that the integration suite drives serve's E2B door with
# (test/e2b-client, from its package-lock.json).
e2b-client: deps
	cd test/e2b-client && npm ci --no-audit --no-fund

# e2b-proto regenerates the Go code of envd's protocol (the .proto files
# under internal/e2b/envd) with protoc, protoc-gen-go and
# protoc-gen-connect-go (go install google.golang.org/protobuf/cmd/protoc-gen-go
# connectrpc.com/connect/cmd/protoc-gen-connect-go). The generated code
# is committed: a build needs no protoc. protoc-gen-go's init, which builds
# a file's descriptors and registers its types (about 0.4 ms of every
# agentrun process's start, each container's init included, where only
# serve's E2B door uses them), is made the package's Register, which the
# door calls before it serves (and any other user before it uses the
# package); the step fails when the generated code no longer has it.
e2b-proto:
	cd internal/e2b/envd && for f in */*.proto; do \
		protoc -I . --go_out=. --go_opt=paths=source_relative \
			--connect-go_out=. --connect-go_opt=paths=source_relative "$$f" || exit 1; \
		g=$${f%.proto}.pb.go; \
		sed -i -E 's|^func init\(\) \{ (file_[a-z0-9_]+_proto_init)\(\) \}$$|// Register builds this file'"'"'s descriptors and registers its types, once;\n// it is protoc-gen-go'"'"'s init, made a function by make e2b-proto so that\n// a process that does not use the package does not pay for it: call it\n// before anything else of the package (File_*, messages, enums).\nfunc Register() { \1_once.Do(\1) }\n\nvar \1_once sync.Once\n|' "$$g" && \
			grep -q '^func Register() {' "$$g" && ! grep -q '^func init()' "$$g" || \
			{ echo "e2b-proto: $$g: no init to make Register of"; exit 1; }; \
	done

# ts-client installs the TypeScript client's compiler, openapi-typescript
# and the frameworks its adapters are tested against (clients/typescript,
# from its package-lock.json), and builds it.
ts-client: deps
	cd clients/typescript && npm ci --no-audit --no-fund && npm run build

# integration: real sandboxes on both runtimes, one package at a time (each
# checks that the host is left clean, which a concurrent package would spoil).
# The timeout is a guard against a hung test, not a bound on the suite's
# time: test/integration alone takes 16 to 21 minutes on a shared 2-core VM.
integration: build images runsc mcp-client mcp-servers approvals-page openapi-validator ts-client e2b-client
	AGENTRUN_BIN=$(abspath $(BIN)) $(GO) test -tags $(TAGS) -count=1 -p 1 -timeout 30m ./runtime/runsc/ ./test/...

# fuzz runs each fuzz target briefly: a count of inputs, about 10 s of
# each here, and a count for minimizing an input it finds. A wall-clock
# -fuzztime can fail a target that found nothing: Go 1.26's coordinator
# reports its own deadline as an error when it races a busy worker
# (golang/go#75804, fixed in Go 1.27).
fuzztime = $(or $(FUZZTIME),$(1))
fuzz:
	$(GO) test -tags $(TAGS) -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(call fuzztime,150000x) -fuzzminimizetime 200x ./internal/task
	$(GO) test -tags $(TAGS) -run '^$$' -fuzz '^FuzzLoadConfig$$' -fuzztime $(call fuzztime,120000x) -fuzzminimizetime 200x ./internal/config
	$(GO) test -tags $(TAGS) -run '^$$' -fuzz '^FuzzUnpack$$' -fuzztime $(call fuzztime,6000x) -fuzzminimizetime 100x ./image/unpack
	$(GO) test -tags $(TAGS) -run '^$$' -fuzz '^FuzzParseRequest$$' -fuzztime $(call fuzztime,100000x) -fuzzminimizetime 200x ./proxy
	$(GO) test -tags $(TAGS) -run '^$$' -fuzz '^FuzzFrames$$' -fuzztime $(call fuzztime,200000x) -fuzzminimizetime 200x ./internal/e2b/interp

test: deps vet images unit integration fuzz

# vm-test runs runtime/cgroup's tests, the integration tests on limits,
# pools and tear-down, and the escape battery, on libcontainer, in a
# virtual machine whose only cgroup hierarchy is v2 (about 10 minutes on
# 2 cores; AGENTRUN_VM_CGROUP=v1 for the same machine on v1).
vm-test: deps images
	GO=$(GO) test/vm/run.sh

# bench compares agentrun with bare chroot, the kernel floor (test/bench/floor/floor.c,
# built by the bench with $$CC or cc), runc (Debian's, and one built
# at the libcontainer version agentrun links: test/runc.sh) and bwrap, and measures
# throughput under load, and warm interpreters on the python-data image;
# writes docs/bench.md. BENCH_FLAGS adds flags (-baseline OLD_BINARY,
# -load-runs N, -warm-only; go run ./test/bench -h lists them).
bench: build images
	GO=$(GO) test/images/build.sh python-data
	$(GO) run -tags $(TAGS) ./test/bench -n 30 -agentrun $(BIN) -runc-libcontainer "$$(GO=$(GO) test/runc.sh)" -out docs/bench.md $(BENCH_FLAGS)

# soak: 1,000 mixed runs at concurrency 8 on one runner; nothing may accumulate.
SOAK_RUNS ?= 1000
soak: build images runsc
	AGENTRUN_SOAK_RUNS=$(SOAK_RUNS) $(GO) test -tags $(TAGS) -count=1 -p 1 -timeout 30m -run '^TestSoak$$' -v ./test/integration/

clean:
	rm -rf bin
