package e2e

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/e2e/netns"
)

// ociArchive is an unpacked OCI image archive: blob contents by digest and
// the image index.
type ociArchive struct {
	blobs map[string][]byte
	index []byte
}

func readOCIArchive(file string) (*ociArchive, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	a := &ociArchive{blobs: map[string][]byte{}}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", file, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, fmt.Errorf("read %s: %s: %w", file, h.Name, err)
		}
		name := path.Clean(h.Name)
		switch {
		case name == "index.json":
			a.index = data
		case strings.HasPrefix(name, "blobs/"):
			parts := strings.Split(name, "/") // blobs/sha256/HEX
			if len(parts) == 3 {
				a.blobs[parts[1]+":"+parts[2]] = data
			}
		}
	}
	if a.index == nil {
		return nil, fmt.Errorf("read %s: no index.json: not an OCI layout", file)
	}
	return a, nil
}

type descriptor struct {
	MediaType string `json:"mediaType"`
	Digest    string `json:"digest"`
	Size      int64  `json:"size"`
}

func (a *ociArchive) blob(d descriptor) ([]byte, error) {
	b, ok := a.blobs[d.Digest]
	if !ok {
		return nil, fmt.Errorf("blob %s missing", d.Digest)
	}
	if int64(len(b)) != d.Size {
		return nil, fmt.Errorf("blob %s: %d bytes, descriptor says %d", d.Digest, len(b), d.Size)
	}
	return b, nil
}

// imageConfig is the part of an OCI image configuration the test checks.
type imageConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Config       struct {
		User       string            `json:"User"`
		Entrypoint []string          `json:"Entrypoint"`
		Cmd        []string          `json:"Cmd"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
}

// image reads the only manifest of the archive: its configuration, and its
// layers unpacked in order into root.
func (a *ociArchive) image(root string) (*imageConfig, error) {
	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	if err := json.Unmarshal(a.index, &index); err != nil || len(index.Manifests) != 1 {
		return nil, fmt.Errorf("index.json: %d manifests, error %v; want one", len(index.Manifests), err)
	}
	mb, err := a.blob(index.Manifests[0])
	if err != nil {
		return nil, err
	}
	var manifest struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	if err := json.Unmarshal(mb, &manifest); err != nil {
		return nil, fmt.Errorf("parse manifest: %w", err)
	}
	cb, err := a.blob(manifest.Config)
	if err != nil {
		return nil, err
	}
	var cfg imageConfig
	if err := json.Unmarshal(cb, &cfg); err != nil {
		return nil, fmt.Errorf("parse image config: %w", err)
	}
	for _, l := range manifest.Layers {
		b, err := a.blob(l)
		if err != nil {
			return nil, err
		}
		if err := unpackLayer(root, l.MediaType, b); err != nil {
			return nil, err
		}
	}
	return &cfg, nil
}

// unpackLayer writes a layer's directories and regular files under root
// (the image has nothing else).
func unpackLayer(root, mediaType string, b []byte) error {
	var r io.Reader = strings.NewReader(string(b))
	if strings.HasSuffix(mediaType, "+gzip") {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return fmt.Errorf("unpack layer: %w", err)
		}
		r = zr
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("unpack layer: %w", err)
		}
		name := filepath.Join(root, filepath.FromSlash(path.Clean("/"+h.Name)))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(name, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode).Perm())
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("unpack layer: %s: unexpected entry type %c", h.Name, h.Typeflag)
		}
	}
}

// TestImage builds the image with `make image` (buildah, an OCI archive),
// unpacks the archive with nothing but archive/tar, checks the entrypoint is
// a static binary, and runs `nftproxy run --manifests --cleanup-kube-proxy`
// from the unpacked root, with no iptables tool on its PATH, in a test
// namespace holding kube-proxy's iptables-nft chains: they are gone after
// the first sync, kubelet's and another program's stay, and packets to a
// ClusterIP reach every pod (kube-proxy's rules sent them to one).
func TestImage(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: building the image takes a while; -short leaves it out")
	}
	if _, err := exec.LookPath("buildah"); err != nil {
		t.Skip("skipping: buildah not installed (make image installs it: apt-get install buildah)")
	}
	if binary == "" {
		t.Skip("needs root and network namespaces: " + netns.Usable())
	}
	start := time.Now()
	archive, err := BuildImage(t.TempDir(), "VERSION=v0.0.0-test", "COMMIT=0123abcd")
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(archive)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("make image: %s, archive %.1f MiB", time.Since(start).Round(time.Second), float64(st.Size())/(1<<20))

	a, err := readOCIArchive(archive)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	cfg, err := a.image(root)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture != runtime.GOARCH {
		t.Errorf("image for %s/%s, want linux/%s", cfg.OS, cfg.Architecture, runtime.GOARCH)
	}
	for k, want := range map[string]string{"org.opencontainers.image.version": "v0.0.0-test", "org.opencontainers.image.revision": "0123abcd"} {
		if got := cfg.Config.Labels[k]; got != want {
			t.Errorf("label %s = %q, want %q", k, got, want)
		}
	}
	if len(cfg.Config.Entrypoint) != 1 || strings.Join(cfg.Config.Cmd, " ") != "run" {
		t.Fatalf("entrypoint %q, cmd %q; want one binary and run", cfg.Config.Entrypoint, cfg.Config.Cmd)
	}
	entry := filepath.Join(root, cfg.Config.Entrypoint[0])
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("image root holds %q; want only the binary", names)
	}

	f, err := elf.Open(entry)
	if err != nil {
		t.Fatalf("entrypoint: %v", err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("entrypoint %s has a program interpreter: not static", cfg.Config.Entrypoint[0])
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("entrypoint needs shared libraries %q", libs)
	}
	f.Close()
	fi, err := os.Stat(entry)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm()&0o005 != 0o005 {
		t.Errorf("entrypoint mode %v: others can't run it (a non-root user must be able to)", fi.Mode())
	}
	if v, err := exec.Command(entry, "version").Output(); err != nil || strings.TrimSpace(string(v)) != "v0.0.0-test 0123abcd" {
		t.Errorf("nftproxy version = %q, %v; want the build's", v, err)
	}

	// The unpacked binary serves a ClusterIP in a namespace topology.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	topo := netns.NewTopology(t, netns.TopologyOptions{Prefix: "img", Pods: 2})
	var names []string
	var eps []string
	for _, p := range topo.Pods {
		if _, err := p.ServeName("tcp", 8080); err != nil {
			t.Fatal(err)
		}
		names = append(names, p.Name)
		eps = append(eps, p.Addr.String())
	}
	dir := t.TempDir()
	svc := svcSpec{name: "web", clusterIP: "10.96.0.10", port: 80, endpoints: eps}
	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(svc.yaml()), 0o644); err != nil {
		t.Fatal(err)
	}
	// kube-proxy's iptables-nft chains, left by a stopped kube-proxy in
	// iptables mode, send the ClusterIP to the first pod only; kubelet's
	// chains and another program's beside them. The image has no iptables
	// tools: --cleanup-kube-proxy removes kube-proxy's over netlink.
	_, haveIPTablesNFT := exec.LookPath("iptables-nft-restore")
	if haveIPTablesNFT == nil {
		restore := exec.Command("ip", "netns", "exec", topo.Node.Name(), "iptables-nft-restore")
		restore.Stdin = strings.NewReader(fmt.Sprintf(imageKubeProxyRules, eps[0]))
		if out, err := restore.CombinedOutput(); err != nil {
			t.Fatalf("iptables-nft-restore: %v: %s", err, out)
		}
	}
	d, err := StartWithEnv(topo.Node, []string{"PATH=" + t.TempDir()}, entry, "--manifests", dir, "--hostname-override", "node-1",
		"--cluster-cidr", "10.244.0.0/16", "--healthz-bind-address", "", "--metrics-bind-address", "", "--cleanup-kube-proxy")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := d.Stop(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("nftproxy log:\n%s", d.Log())
		}
	}()
	if err := d.WaitSynced(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if haveIPTablesNFT == nil {
		saved, err := topo.Node.Exec("iptables-nft-save")
		if err != nil {
			t.Fatal(err)
		}
		for _, chain := range []string{":KUBE-SERVICES", ":KUBE-SVC-", ":KUBE-SEP-", ":KUBE-PROXY-CANARY", "-j KUBE-SERVICES"} {
			if strings.Contains(saved, chain) {
				t.Errorf("kube-proxy's %s left after the image's first sync:\n%s", chain, saved)
			}
		}
		for _, chain := range []string{":KUBE-FIREWALL", ":KUBE-KUBELET-CANARY", ":OTHER", "-A INPUT -j KUBE-FIREWALL", "-A PREROUTING -j OTHER"} {
			if !strings.Contains(saved, chain) {
				t.Errorf("%s went with kube-proxy's chains:\n%s", chain, saved)
			}
		}
	}
	seen := map[string]bool{}
	for range 20 {
		name, err := topo.Client.AskTCP(ctx, netip.MustParseAddrPort("10.96.0.10:80"))
		if err != nil {
			t.Fatalf("ClusterIP through the image's nftproxy: %v", err)
		}
		seen[name] = true
	}
	for _, n := range names {
		if !seen[n] {
			t.Errorf("pod %s never answered in 20 connections (answered: %v)", n, seen)
		}
	}
}

// imageKubeProxyRules is what kube-proxy's iptables mode and kubelet leave
// for a ClusterIP 10.96.0.10:80 with one endpoint (%s, port 8080), beside
// another program's chain.
const imageKubeProxyRules = `*mangle
:KUBE-KUBELET-CANARY - [0:0]
:KUBE-PROXY-CANARY - [0:0]
COMMIT
*filter
:KUBE-FIREWALL - [0:0]
:KUBE-SERVICES - [0:0]
-A INPUT -j KUBE-FIREWALL
-A OUTPUT -m conntrack --ctstate NEW -j KUBE-SERVICES
COMMIT
*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-LOLE4ISW44XBNF3G - [0:0]
:KUBE-SEP-7GB5MCKFYLQ4EWGB - [0:0]
:OTHER - [0:0]
-A PREROUTING -j KUBE-SERVICES
-A PREROUTING -j OTHER
-A OUTPUT -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-LOLE4ISW44XBNF3G
-A KUBE-SVC-LOLE4ISW44XBNF3G -j KUBE-SEP-7GB5MCKFYLQ4EWGB
-A KUBE-SEP-7GB5MCKFYLQ4EWGB -p tcp -m tcp -j DNAT --to-destination %[1]s:8080
-A OTHER -s 192.0.2.0/24 -j RETURN
COMMIT
`
