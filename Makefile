# agentrun: build, install, demo and test.
#
#   make demo     install what is missing, build, run examples/hello.json offline
#   make test     install what is missing, build, run the whole suite (as root)
#   make install  install bin/agentrun to $(PREFIX)/bin
#   make bench    measure against bare chroot, runc and bwrap (docs/bench.md)

GO       ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
PREFIX   ?= /usr/local
TAGS     := seccomp
BIN      := bin/agentrun
IMAGES   ?= /var/cache/agentrun/images
FUZZTIME ?= 10s

export CGO_ENABLED := 1
export AGENTRUN_IMAGES := $(IMAGES)

.PHONY: all build install deps images demo test unit integration fuzz vet bench clean

all: build

build:
	$(GO) build -tags $(TAGS) -trimpath -o $(BIN) ./cmd/agentrun

install: build
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/agentrun

# deps installs the Debian packages the build and the tests need (root).
deps:
	test/deps.sh

images: deps
	test/images/build.sh all

demo: deps build images
	$(BIN) run --config examples/demo-config.json examples/hello.json

vet:
	$(GO) vet -tags $(TAGS) ./...

unit:
	$(GO) test -tags $(TAGS) -count=1 ./internal/... ./runtime/... ./image/... ./netns/... ./proxy/... ./cmd/...

integration: build images
	$(GO) test -tags $(TAGS) -count=1 -p 1 -timeout 15m ./test/...

# fuzz runs each fuzz target briefly.
fuzz:
	$(GO) test -tags $(TAGS) -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./internal/task
	$(GO) test -tags $(TAGS) -run '^$$' -fuzz '^FuzzLoadConfig$$' -fuzztime $(FUZZTIME) ./internal/config

test: deps vet unit integration fuzz

# bench compares agentrun with bare chroot, runc and bwrap; writes docs/bench.md.
bench: build images
	$(GO) run ./test/bench -n 30 -agentrun $(BIN) -out docs/bench.md

clean:
	rm -rf bin
