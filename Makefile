# nftproxy: see README.md. Kernel tests need root; they skip without it.
GO        ?= go
BIN       := bin
GOBIN     := $(shell $(GO) env GOPATH)/bin
STATICCHECK_VERSION := v0.7.0

.PHONY: all build demo test unit lint staticcheck k8s-bins bench clean

all: build

build:
	$(GO) build -o $(BIN)/nftproxy ./cmd/nftproxy
	$(GO) build -o $(BIN)/demo ./cmd/demo

# A sandbox of network namespaces, nftproxy serving deploy/examples in it.
demo: build
	$(BIN)/demo --nftproxy $(BIN)/nftproxy --manifests deploy/examples

# Everything: lint, unit tests, kernel tests (as root) and the API-server tests.
test: lint k8s-bins
	$(GO) test -count=1 -timeout 40m ./...

# Only what needs neither root nor a built API server.
unit:
	$(GO) test -count=1 -short ./...

lint: staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GOBIN)/staticcheck ./...

staticcheck:
	@test -x $(GOBIN)/staticcheck || GOFLAGS= $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

# etcd and kube-apiserver built from Go modules, cached under ~/.cache/nftproxy.
k8s-bins:
	bash e2e/apiserver/build.sh

# Root; only inside network namespaces it makes. Writes docs/benchmarks.md.
bench: build
	@command -v iptables-legacy-restore >/dev/null && command -v iptables-nft-restore >/dev/null || apt-get install -y iptables
	$(GO) run ./cmd/bench $(if $(QUICK),--quick,)

clean:
	rm -rf $(BIN)

# A 3-node cluster in network namespaces (real kube-apiserver, one nftproxy per
# node, a load balancer, deploy/examples applied); Ctrl-C removes it. Root.
.PHONY: cluster
cluster: build k8s-bins
	$(GO) build -o $(BIN)/cluster ./cmd/cluster
	$(BIN)/cluster --nftproxy $(BIN)/nftproxy --manifests deploy/examples
