# nftproxy: see README.md. Kernel tests need root; they skip without it.
GO        ?= go
BIN       := bin
GOBIN     := $(shell $(GO) env GOPATH)/bin
STATICCHECK_VERSION := v0.7.0

.PHONY: all build deps demo test unit race fuzz lint staticcheck k8s-bins conformance-bins conformance bench soak image clean

all: build

build:
	$(GO) build -o $(BIN)/nftproxy ./cmd/nftproxy
	$(GO) build -o $(BIN)/demo ./cmd/demo

# Root, and the system packages the kernel tiers use (installed when
# missing; see e2e/deps.sh). Says in one line why when it can't.
deps:
	@bash e2e/deps.sh $(if $(filter demo,$(MAKECMDGOALS)),demo,test)

# A sandbox of network namespaces, nftproxy serving deploy/examples in it.
demo: deps build
	$(BIN)/demo --nftproxy $(BIN)/nftproxy --manifests deploy/examples

# Everything: lint, the unit tier under the race detector, unit tests, kernel
# tests (as root, with the fuzz targets' seed corpora) and the API-server tests.
test: deps lint race k8s-bins
	$(GO) test -count=1 -timeout 40m ./...

# The unit tier (no root, no API server) under the race detector.
race:
	$(GO) test -count=1 -race -short -timeout 20m ./...

# Each fuzz target for FUZZTIME (plain go test runs their seed corpora only);
# FuzzCompileKernel needs root. Crashers land in the package's testdata/fuzz.
FUZZTIME ?= 1m
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzTracker$$' -fuzztime $(FUZZTIME) ./k8s/
	$(GO) test -run '^$$' -fuzz '^FuzzManifests$$' -fuzztime $(FUZZTIME) ./k8s/
	$(GO) test -run '^$$' -fuzz '^FuzzReplies$$' -fuzztime $(FUZZTIME) ./nftmodel/nftnl/
	$(GO) test -run '^$$' -fuzz '^FuzzCompileKernel$$' -fuzztime $(FUZZTIME) ./proxier/

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

# kubelet, kube-scheduler, kubectl, e2e.test, agnhost, CoreDNS and the images
# the Services e2e suite runs, built offline (e2e/conformance/build.sh).
conformance-bins: k8s-bins
	bash e2e/conformance/build.sh

# Root. Kubernetes' own [sig-network] Services e2e tests on real nodes
# (network namespaces running containerd, kubelet and the proxy), with
# nftproxy and then with kube-proxy --proxy-mode=nftables; writes
# docs/conformance.md (e2e/conformance). CONFORMANCE_FOCUS narrows the run.
conformance: deps conformance-bins
	@command -v containerd >/dev/null && command -v runc >/dev/null && test -x /usr/lib/cni/bridge || { apt-get update && apt-get install -y --no-install-recommends containerd runc containernetworking-plugins; }
	NFTPROXY_CONFORMANCE=1 $(GO) test -count=1 -v -timeout 70m -run 'TestConformance$$' ./e2e/conformance

# Root; only inside network namespaces it makes. Writes docs/benchmarks.md.
# The peers phase runs kube-proxy from k8s-bins beside nftproxy; BENCH_FLAGS
# runs a piece, e.g. BENCH_FLAGS="--phases peers --workloads 10kx3".
bench: build k8s-bins
	@command -v iptables-legacy-restore >/dev/null && command -v iptables-nft-restore >/dev/null || apt-get install -y iptables
	$(GO) run ./cmd/bench $(if $(QUICK),--quick,) $(BENCH_FLAGS)

# Root; only inside network namespaces it makes. nftproxy under endpoint churn
# (10,000 services, 200 replacements/s) with clients connecting throughout,
# through a real kube-apiserver; prints its figures and writes the Soak section
# of docs/benchmarks.md. SOAK_FLAGS adds flags, e.g. --soak-source manifests.
SOAK_DURATION ?= 10m
soak: build k8s-bins
	$(GO) run ./cmd/bench --phases soak --soak-duration $(SOAK_DURATION) $(SOAK_FLAGS)

# An OCI archive of the image (Containerfile) in bin/nftproxy-image.tar, built
# offline with Debian's buildah; its storage stays under bin/image.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# The image's name in the archive (e2e/conformance gives the full name its
# nodes' runtime is asked for).
IMAGE_NAME ?= nftproxy
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
BUILDAH := buildah --storage-driver vfs --root $(abspath $(BIN))/image/storage --runroot $(abspath $(BIN))/image/run
image:
	@command -v buildah >/dev/null || { apt-get update && apt-get install -y --no-install-recommends buildah; }
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)" -o $(BIN)/image/context/nftproxy ./cmd/nftproxy
	$(BUILDAH) bud --isolation chroot --layers=false -f Containerfile --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t localhost/nftproxy:$(VERSION) $(BIN)/image/context
	rm -f $(BIN)/nftproxy-image.tar
	$(BUILDAH) push localhost/nftproxy:$(VERSION) oci-archive:$(BIN)/nftproxy-image.tar:$(IMAGE_NAME):$(VERSION)
	$(BUILDAH) rmi localhost/nftproxy:$(VERSION) >/dev/null
	@ls -l $(BIN)/nftproxy-image.tar

clean:
	rm -rf $(BIN)

# A 3-node cluster in network namespaces (real kube-apiserver, one nftproxy per
# node, a load balancer, deploy/examples applied); Ctrl-C removes it. Root.
.PHONY: cluster
cluster: build k8s-bins
	$(GO) build -o $(BIN)/cluster ./cmd/cluster
	$(BIN)/cluster --nftproxy $(BIN)/nftproxy --manifests deploy/examples
